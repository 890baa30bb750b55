//! The event loop: RX, credit-stall queue, background completions,
//! session management, the packet-loss scan (receive before timers: the
//! transport is drained first), TX flush. Continuations and
//! dispatch handlers run inside it; so do the error continuations and
//! session events that resets and failures owe the application.

use transport::Transport;

use super::Rpc;

/// Stall-queue entries examined per iteration (bounded work).
const MAX_STALLQ_PER_LOOP: usize = 1024;

/// [`Rpc`]'s `pending` bit: the credit-stall queue may be non-empty.
pub(crate) const PENDING_STALLQ: u8 = 1;
/// `pending` bit: background jobs may be queued or running.
pub(crate) const PENDING_BG: u8 = 2;
/// `pending` bit: the timing wheel may hold packets.
pub(crate) const PENDING_WHEEL: u8 = 4;

/// [`Rpc`]'s `gate` bit: an event-loop iteration is running (handlers and
/// continuations must not start another).
pub(crate) const GATE_IN_LOOP: u8 = 1;
/// `gate` bit: the owed queue may hold events or failed requests (set
/// where they are queued, cleared by `pay_owed` when it empties the queue).
pub(crate) const GATE_OWED: u8 = 2;

impl<T: Transport, C> Rpc<T, C> {
    /// One iteration of the event loop ([`Rpc::run_event_loop_once`]).
    #[inline(always)]
    pub(crate) fn event_loop_once(&mut self, ctx: &mut C) {
        // Always inlined into the caller's loop (it is called in one): no
        // call and no frame per iteration. The common iteration finds
        // nothing to do: every step below is an inline check, and the work
        // itself is out of line, so an idle iteration costs a few dozen
        // instructions and no stack frame of the receive or transmit paths.
        // One byte says both "not re-entered" and "nothing owed": the
        // common iteration tests it once (`gated_entry` is the rest).
        debug_assert_eq!(
            self.pending_now() & !self.pending,
            0,
            "work queued without its `pending` bit"
        );
        debug_assert!(
            self.owed.is_empty() || self.gate & GATE_OWED != 0,
            "owed without the gate's bit"
        );
        debug_assert_eq!(self.pacing.cc_on(), self.wheel.is_some());
        self.now_ns = self.clock.now_ns();
        if self.gate == 0 {
            self.gate = GATE_IN_LOOP;
        } else {
            self.gated_entry(ctx);
        }
        let n = self.transport.rx_burst();
        if n != 0 {
            self.process_rx(ctx, n);
        }
        // The stall queue, background jobs, SM packets and timers, the
        // wheel, in that order (`process_pending`); with none of the
        // queues marked, only the SM queue and the timers are looked at.
        // (`n`: whether the transport may hold more; see `drain_rx`.)
        if self.pending != 0 {
            self.process_pending(ctx, n);
        } else if self.sm_or_timers_due() {
            self.process_sm_and_timers(ctx, n);
        }
        self.flush_tx();
        self.gate &= !GATE_IN_LOOP;
    }

    /// The start of an iteration whose gate byte was not clear: a
    /// re-entrance (a panic), or what earlier iterations owe the
    /// application (paid now, before RX).
    #[cold]
    #[inline(never)]
    fn gated_entry(&mut self, ctx: &mut C) {
        assert!(
            self.gate & GATE_IN_LOOP == 0,
            "run_event_loop_once must not be called from a handler or continuation"
        );
        self.gate |= GATE_IN_LOOP;
        if self.gate & GATE_OWED != 0 {
            self.pay_owed(ctx);
        }
    }

    /// The queues `pending` marks, the SM queue and the timers, in the
    /// event loop's order; then `pending` is recomputed from the queues.
    #[inline(never)]
    fn process_pending(&mut self, ctx: &mut C, rx: usize) {
        if !self.stallq.is_empty() {
            self.process_stallq();
        }
        if self.bg_busy() {
            self.process_bg();
        }
        if self.sm_or_timers_due() {
            self.process_sm_and_timers(ctx, rx);
        }
        if self.wheel_busy() {
            self.process_wheel();
        }
        self.pending = self.pending_now();
    }

    /// The `pending` bits of the queues as they are.
    fn pending_now(&self) -> u8 {
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        bit(!self.stallq.is_empty(), PENDING_STALLQ)
            | bit(self.bg_busy(), PENDING_BG)
            | bit(self.wheel_busy(), PENDING_WHEEL)
    }

    /// Background jobs queued here or running on a worker.
    #[inline]
    fn bg_busy(&self) -> bool {
        !self.bg.backlog.is_empty() || self.bg.links.outstanding() != 0
    }

    /// Packets in the timing wheel (scheduled or ready).
    #[inline]
    fn wheel_busy(&self) -> bool {
        self.wheel.as_ref().is_some_and(|w| !w.is_empty())
    }

    /// SM packets and failure notices, and the periodic work (the loss
    /// scan, with the SM retry timers): what they owe the application
    /// (failed requests, session events) is paid before the iteration
    /// returns. What the RX path, the stall queue, background
    /// completions or a continuation owe is paid at the next iteration's
    /// start (as the docs promise: "in the next event-loop iteration").
    #[inline]
    fn sm_or_timers_due(&self) -> bool {
        !self.sm_queue.is_empty() || self.pkt_loss_scan_due()
    }

    /// SM packets, the periodic loss scan, and what they owe. `rx` is what
    /// this iteration's `rx_burst` returned: 0 says the transport held
    /// nothing a moment ago, so a loss scan need not drain it first.
    #[inline(never)]
    fn process_sm_and_timers(&mut self, ctx: &mut C, rx: usize) {
        if !self.sm_queue.is_empty() {
            self.process_sm();
        }
        if self.pkt_loss_scan_due() {
            if rx != 0 && self.transport.rx_may_hold_more() {
                self.drain_rx(ctx);
            }
            self.defer_late_scan();
        }
        self.maybe_pkt_loss_scan();
        if !self.owed.is_empty() {
            self.pay_owed(ctx);
        }
    }

    /// Receive before timers: processes what the transport already holds,
    /// burst after burst, until it reports nothing (or [`Rpc`]'s RX ring
    /// has been gone through once), so that the loss scan that follows
    /// never rolls back a request whose answer is waiting to be read. A
    /// transport may hand out less than it holds per `rx_burst` (the UDP
    /// transport reads one datagram per call while datagrams come one at
    /// a time), and after a stall longer than the retransmission timeout
    /// (a descheduled thread, a long handler) the answers to every request
    /// in flight can be queued there. Runs only when a scan is due and the
    /// iteration's own burst found packets and may have left some
    /// ([`Transport::rx_may_hold_more`]; a busy Rpc would otherwise pay an
    /// empty poll per scan), so the common iteration pays nothing for it.
    #[inline(never)]
    fn drain_rx(&mut self, ctx: &mut C) {
        let mut budget = self.ring_entries;
        while budget != 0 {
            let n = self.transport.rx_burst();
            if n == 0 {
                break;
            }
            self.process_rx(ctx, n);
            budget = budget.saturating_sub(n);
            // A burst that came back short emptied the transport: no
            // empty poll (a system call over UDP) to learn it.
            if !self.transport.rx_may_hold_more() {
                break;
            }
        }
    }

    /// A loss scan more than a scan interval late means that the event
    /// loop did not run for that long (the thread was descheduled, or a
    /// handler ran long): the requests it would find overdue may have
    /// waited on this host, not on the network, and so may their answers,
    /// still on their way through a peer that was stalled with it (both
    /// nodes of a one-thread benchmark, a peer process on the same loaded
    /// machine). Such a scan is put off by one interval, once: the next
    /// runs when due, however late, so loss recovery is delayed by at most
    /// one interval and never starved by a slow loop.
    /// The pause itself counts against no request: the slots' clocks move
    /// forward by it first (`loss.rs`, `discount_pause`).
    #[inline]
    fn defer_late_scan(&mut self) {
        let late_ns = self.now_ns - self.next_loss_scan_ns;
        let late = late_ns > self.loss_scan_ns;
        if late && !self.loss_scan_deferred {
            self.discount_pause(late_ns);
            self.next_loss_scan_ns = self.now_ns + self.loss_scan_ns;
            self.loss_scan_deferred = true;
        } else {
            self.loss_scan_deferred = false;
        }
    }

    /// Gives stalled slots the credits that came back.
    #[inline(never)]
    fn process_stallq(&mut self) {
        let len = self.stallq.len();
        // The common pass while a large message waits (its session's
        // credits all out, another slot taking each one that returns):
        // no stalled slot can send, and the queue stays as it is.
        if len <= MAX_STALLQ_PER_LOOP
            && self
                .stallq
                .iter()
                .all(|&(sn, i)| self.stalled_without_credit(sn, i))
        {
            return;
        }
        let n = len.min(MAX_STALLQ_PER_LOOP);
        for idx in 0..n {
            let (sn, i) = self.stallq[idx];
            if self.stalled_without_credit(sn, i) {
                // Exactly what `kick` would do (the slot stays stalled,
                // at the back), without the call.
                self.stallq.push((sn, i));
                continue;
            }
            if let Some(s) = self.session_mut(sn) {
                s.half.client_mut()[usize::from(i)].in_stallq = false;
            }
            // `kick` re-queues the slot at the back if it still stalls;
            // those re-queued entries are past `n` and wait for next time.
            let _ = self.kick(sn, i);
        }
        self.stallq.drain(..n);
    }

    /// Client slot `i` of session `sn` has packets to send and its session
    /// no credit: `kick` would send nothing and leave it stalled.
    #[inline]
    fn stalled_without_credit(&self, sn: u16, i: u8) -> bool {
        self.session(sn).is_some_and(|s| {
            let i = usize::from(i);
            s.credits == 0
                && s.slots[i].tx_msgbuf.is_some()
                && super::cr::slot_has_more(&s.half.client()[i])
        })
    }
}
