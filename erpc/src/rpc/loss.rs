//! Loss recovery, client-driven as in the paper (§5.2.2 and the appendix).
//!
//! eRPC treats reordering as loss: every receiver accepts packets of a
//! request only in order and drops (and counts) the rest. The client owns
//! recovery. Each client slot counts the packets it sent (`num_tx`:
//! request packets, then requests-for-response) and the acknowledgements
//! it got back in order (`num_rx`: credit returns, then response
//! packets). Every `pkt_loss_scan_us` the event loop scans the client
//! sessions with unacknowledged packets; a slot with packets in flight
//! (`num_tx > num_rx`) that got no acknowledgement for the retransmission
//! timeout, counted from the later of its last acknowledgement and the
//! moment it went from nothing in flight to something (`in_flight_ns`:
//! a request that waited for credits behind another slot of its session
//! has not been waiting for the network), is rolled back to its last
//! acknowledged packet (go-back-N): the credits of the packets presumed
//! lost come back, `num_tx = num_rx`, and the slot is kicked through the
//! normal TX path, which resends request packets or RFRs from there. The
//! server answers duplicates without running the handler again
//! (`req.rs`, `rfr.rs`). The event loop first drains the transport and
//! puts off a scan that is more than an interval late, once
//! (`ev_loop.rs`: `drain_rx`, `defer_late_scan`).
//!
//! The NIC may still hold a transmission of the packets being resent
//! (sends are unsignaled), and once a retransmission is queued, a
//! response that was merely late can complete the request and hand its
//! buffer back to the application while the resent copy is still queued.
//! So a scan that retransmits drains the TX queue twice, as the C++ code
//! and the paper's appendix do: before the rollback (no old transmission
//! is held when a retransmission references the buffer) and after queuing
//! the retransmissions (none is held when the request completes). Both
//! are counted (`RpcStats::tx_flushes`); they happen only on loss.
//!
//! The stall bound (`RpcConfig::stall_timeout_ms`): a slot with packets
//! in flight that got nothing back for the bound (`progress_ns`: its
//! enqueue or first send, a credit return, a response packet, an "in
//! progress" notice) fails with its session, [`SessionEnd::Stalled`](crate::SessionEnd::Stalled).
//! It is what ends a request whose server's Nexus answers pings while its
//! Rpc does not run, or whose data path alone is cut, and the only failure
//! detection toward a C++ eRPC peer, which cannot be pinged. An erpc-rs
//! server answers a retransmission of a request whose handler still runs
//! with an "in progress" notice (`rpc/status.rs`), so a slow handler there
//! never stalls its request. A slot waiting for credits (nothing in
//! flight) is not judged: the slots holding the credits are.
//!
//! Time in which the event loop did not run is evidence against nobody:
//! a scan that comes late by more than a scan interval (the thread was
//! descheduled, a handler ran long, the application stopped polling)
//! moves every active slot's clocks forward by the lateness, so neither
//! the retransmission timeout nor the stall bound counts the pause, and
//! is put off by one interval so that what arrived meanwhile is read
//! first (`ev_loop.rs`, `defer_late_scan`). Only a late scan that follows
//! a scan on time is treated so: a loop that is slow at every iteration
//! still gets every other scan judged on the wall clock, so loss recovery
//! and the stall bound are never starved (at worst about twice as slow).

use transport::Transport;

use super::Rpc;
use super::reset::ResetCause;
use crate::consts::SESSION_REQ_WINDOW;
use crate::session::SessionState;

impl<T: Transport, C> Rpc<T, C> {
    /// Runs the loss scan, the SM timers and the debug endpoint's check,
    /// if a scan interval has passed. Called once per event-loop
    /// iteration: one compare and a branch otherwise.
    #[inline]
    pub(crate) fn maybe_pkt_loss_scan(&mut self) {
        if !self.pkt_loss_scan_due() {
            return;
        }
        self.next_loss_scan_ns = self.now_ns + self.loss_scan_ns;
        self.pkt_loss_scan();
        // Drops, rate-limited, at debug level: nothing per packet.
        if tracing::enabled!(tracing::Level::DEBUG) {
            self.log_drops();
        }
        self.sweep_quiet_state();
        // The SM timers (request retries, connect timeouts, expiry of
        // abandoned connects) count in units of 100 ms: checking them at
        // the scan interval instead of every iteration keeps them off the
        // idle path.
        if !self.sm_pending.is_empty() || !self.abandoned.is_empty() {
            self.process_sm();
        }
        // Disconnects of this Nexus's dropped Rpcs (one atomic load when
        // there are none).
        self.nexus
            .resend_orphans(self.now_ns, self.config.sm_retry_ms * 1_000_000);
        // The debug endpoint, at the same cadence (a request also wakes
        // the Rpc through its SM queue, `SmItem::Inspect`, which a
        // virtual clock that stands still needs): the iterations between
        // scans do not look.
        self.maybe_publish_inspect();
    }

    /// Whether the loss-scan interval has passed.
    #[inline]
    pub(crate) fn pkt_loss_scan_due(&self) -> bool {
        self.now_ns >= self.next_loss_scan_ns
    }

    /// Sends everything queued and waits until the transport holds no
    /// reference to any buffer (the C++ `drain_tx_batch_and_dma_queue`).
    /// The rare path: loss recovery, duplicate answers, resets.
    pub(crate) fn drain_tx(&mut self) {
        self.flush_tx();
        self.transport.tx_flush();
        self.stats.tx_flushes += 1;
    }

    /// The event loop did not run for about `late` ns (the loss scan is
    /// that late): none of it counts against any request. Every active
    /// client slot's clocks move forward by it (never past now).
    #[cold]
    #[inline(never)]
    pub(crate) fn discount_pause(&mut self, late: u64) {
        let now = self.now_ns;
        self.stats.pauses_discounted += 1;
        for k in 0..self.active.len() {
            let sn = self.active.get(k);
            let Some(s) = self.sessions.session_mut(sn) else {
                continue;
            };
            let Some(cs) = s.half.as_client_mut() else {
                continue;
            };
            for c in cs.iter_mut() {
                c.progress_ns = (c.progress_ns + late).min(now);
                if c.in_flight_ns != 0 {
                    c.in_flight_ns = (c.in_flight_ns + late).min(now);
                }
            }
        }
    }

    #[inline(never)]
    fn pkt_loss_scan(&mut self) {
        let now = self.now_ns;
        let rto = self.rto_ns;
        let stall_ns = self
            .config
            .stall_timeout_ms
            .map_or(u64::MAX, |ms| ms.saturating_mul(1_000_000));
        // Slots due for a rollback, as (session, slot bitmask); sessions
        // with a slot past the stall bound.
        let mut due: Vec<(u16, u8)> = Vec::new();
        let mut stalled: Vec<u16> = Vec::new();
        let cc = self.pacing.cc_on();
        self.trim_active();
        // The active client sessions (`active.rs`): those with requests.
        let mut k = 0;
        while k < self.active.len() {
            let sn = self.active.get(k);
            let retire = match self.sessions.session(sn) {
                Some(s) if s.state == SessionState::Connected => {
                    // With every credit home, no slot has unacknowledged
                    // packets (credits + sum(num_tx - num_rx) is the
                    // session's credits); with no request either, the
                    // session is idle.
                    s.credits == s.credits_max && s.slots.iter().all(|sl| sl.tx_msgbuf.is_none())
                }
                _ => true,
            };
            if retire {
                self.retire_active(k);
                continue;
            }
            k += 1;
            let s = self.sessions.session(sn).expect("checked above");
            if s.credits == s.credits_max {
                continue;
            }
            let mut mask = 0u8;
            let mut stall = false;
            for (i, (slot, c)) in s.slots.iter().zip(s.half.client().iter()).enumerate() {
                if slot.tx_msgbuf.is_none() {
                    continue;
                }
                if c.num_tx == c.num_rx {
                    // Waiting for credits, not for the network.
                    continue;
                }
                if now.saturating_sub(c.progress_ns) >= stall_ns {
                    stall = true;
                }
                let mut since = c.progress_ns.max(c.in_flight_ns);
                if cc {
                    // Congestion control paces the slot's packets: the
                    // last `wheel_count` it queued are still in the wheel.
                    // If the oldest unacknowledged one is among them it
                    // was never sent; otherwise its timeout runs from when
                    // it left.
                    if c.num_tx - u32::from(c.wheel_count) <= c.num_rx {
                        continue;
                    }
                    let sent = &s.tx_ts[super::cc::ts_index(self.tx_ts_cap, i, c.num_rx)];
                    since = since.max(sent.get());
                }
                if now.saturating_sub(since) >= rto {
                    mask |= 1 << i;
                }
            }
            if stall {
                stalled.push(sn);
            } else if mask != 0 {
                due.push((sn, mask));
            }
        }
        if !due.is_empty() {
            // No earlier transmission of what we resend is still held.
            self.drain_tx();
            for &(sn, mask) in &due {
                for i in 0..SESSION_REQ_WINDOW {
                    if mask & (1 << i) != 0 {
                        self.retransmit(sn, i);
                    }
                }
            }
            // Nothing resent is held once the request can complete.
            self.drain_tx();
        }
        for sn in stalled {
            self.stall_session(sn);
        }
    }

    /// Go-back-N on client slot `i` of session `sn`: roll back to the last
    /// acknowledged packet and resend from there.
    fn retransmit(&mut self, sn: u16, i: usize) {
        let now = self.now_ns;
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        if let Some(cc) = s.cc.as_mut() {
            cc.on_timeout(now);
        }
        let max_credits = s.credits_max;
        let c = &mut s.half.client_mut()[i];
        let delta = c.num_tx - c.num_rx;
        debug_assert!(delta > 0);
        debug_assert!(s.credits + delta <= max_credits);
        s.credits += delta;
        // Nothing in flight now: the resend (`kick`) restarts the timeout.
        c.num_tx = c.num_rx;
        // Packets of this request still in the timing wheel are presumed
        // lost with the rest: drop them when they come out, resend from
        // num_rx (never twice).
        c.wheel_gen = c.wheel_gen.wrapping_add(1);
        c.wheel_count = 0;
        c.resent = true;
        s.retransmits += 1;
        debug_assert_eq!(
            super::cr::credit_balance(s),
            Ok(()),
            "session {sn} after a rollback"
        );
        self.stats.retransmissions += 1;
        self.stats.retransmitted_pkts += u64::from(delta);
        if self.stats.retransmissions.is_power_of_two() {
            self.log_retransmission(sn, i, delta);
        }
        self.kick(sn, i as u8);
    }

    /// Drops since the last scan, at debug level: a reason is logged when
    /// its count passed a power of two since it was last logged (1, 2, 4,
    /// 8, ...), so a steady drop rate logs fewer and fewer lines.
    #[cold]
    #[inline(never)]
    fn log_drops(&mut self) {
        let rpc = self.rpc_id();
        for r in crate::stats::DropReason::ALL {
            let n = self.stats.drops(r);
            let logged = &mut self.drops_logged.0[r as usize];
            if n > *logged && (*logged == 0 || n.ilog2() > logged.ilog2()) {
                tracing::debug!(
                    rpc,
                    reason = ?r,
                    total = n,
                    "eRPC dropped packets: {r:?}, {n} at this Rpc so far (logged when the count \
                     passes a power of two)"
                );
                *logged = n;
            }
        }
    }

    /// A retransmission, at debug level: the 1st, 2nd, 4th, 8th, ... of
    /// the Rpc (a rate limit that costs one test per retransmission).
    #[cold]
    #[inline(never)]
    fn log_retransmission(&self, sn: u16, i: usize, pkts: u32) {
        let Some(s) = self.session(sn) else { return };
        let total = self.stats.retransmissions;
        tracing::debug!(
            rpc = self.rpc_id(),
            session = sn,
            slot = i,
            peer = %s.remote_uri,
            pkts,
            total,
            "retransmission {total} of this Rpc (logged at powers of two): session {sn} to {}, \
             slot {i}, {pkts} packet(s) rolled back after the timeout",
            s.remote_uri
        );
    }

    /// A request of client session `sn` got no answer for the stall
    /// bound: the session fails ([`SessionEnd::Stalled`](crate::SessionEnd::Stalled)). An erpc-rs
    /// server is told (it frees its end once its handlers respond); a C++
    /// eRPC server is not, since it cannot take a disconnect while a
    /// request of the session is unfinished (README, "Talking to C++
    /// eRPC").
    #[cold]
    #[inline(never)]
    fn stall_session(&mut self, sn: u16) {
        tracing::info!(
            session = sn,
            peer = %self.session(sn).map_or_else(String::new, |s| s.remote_uri.to_string()),
            "a request got no answer for the stall bound; failing its session"
        );
        self.stats.sessions_stalled += 1;
        if self.session(sn).is_some_and(|s| s.remote_incarnation != 0) {
            self.send_disconnect_retried(sn);
        }
        self.reset_client_session(sn, ResetCause::Stalled);
    }
}
