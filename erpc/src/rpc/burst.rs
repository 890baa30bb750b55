//! Burst handlers: a request type whose handler receives every request of
//! the type from one RX burst at once ([`Burst`]), so that an application
//! can batch what it does for them (prefetch every hash bucket of a burst
//! before reading any, add N to a counter once), as in the RDMA design
//! guidelines' systems (Kalia et al., ATC'16). eRPC already batches TX and
//! doorbells; this lets the handler batch too.
//!
//! How: a complete single-packet request of a burst type (read in place in
//! the RX ring, zero copy) goes through the same checks as any request
//! (`rpc/req.rs`: request numbers, at-most-once, the slot becomes the
//! request's), its slot moves to `SrvState::InHandler` at once, exactly as
//! for a dispatch handler, and it is queued in the Rpc's pending list as
//! (session, slot, request number, the address of its data). After the
//! RX burst's loop, before its ring slots are given back, `process_rx`
//! calls [`Rpc::run_bursts`] if anything is queued (one test per RX burst):
//! each type's requests are handed to its handler in pieces of at most
//! [`MAX_BURST`]. The data slices are found again in the ring by address
//! (a forward walk over the burst's slots), so nothing is stored that
//! borrows the ring and no unsafe code is needed.
//!
//! Because a queued request's slot is `InHandler` from the moment it is
//! queued, everything else sees it exactly as a request whose dispatch
//! handler runs: a duplicate or retransmission (even one later in the same
//! RX burst) is answered "in progress" and never queued again, a new
//! request on the slot is refused, a session reset keeps the session in
//! `Resetting` until the slot is done, and the debug endpoint shows the
//! slot busy. A request whose session was reset before its burst ran (an
//! ordinary handler earlier in the RX burst reset it) does not run.
//!
//! Multi-packet requests (reassembled into a msgbuf), and single-packet
//! ones with zero-copy RX off, are complete only when their last packet is
//! processed: they go to the handler at once, as a burst of one, and so do
//! requests beyond the pending list's capacity ([`MAX_BURST_PENDING`]).
//!
//! After the handler returns, each request is what the handler made of it:
//! responded; taken ([`Burst::take`]) and not responded, so deferred, as a
//! dispatch handler's (a request in the RX ring is copied first, as
//! `invoke_handler` does); or not taken, which fails it with
//! [`ServerError::Declined`] (`rpc/status.rs`: an erpc-rs client is told;
//! toward a C++ client the slot is failed silently, as `rpc/bg.rs`
//! explains for a panicking worker).

use arrayvec::ArrayVec;
use transport::{ERPC_HDR_BYTES, RxRing, Transport};

use super::{HandlerSlot, ReqHandle, Rpc, ServerError, SessionNum};
use crate::consts::MAX_BURST;
#[cfg(doc)]
use crate::consts::MAX_BURST_PENDING;
use crate::msgbuf::MsgBuf;
use crate::session::{SessionState, SrvState};

/// A burst handler ([`crate::NexusBuilder::burst_handler`]): runs in the
/// event loop with every request of its type from one RX burst (at most
/// [`MAX_BURST`] per call), each read in place in the RX ring (zero copy).
/// Take each request's handle ([`Burst::take`]) and respond with
/// [`Rpc::respond`] or [`Rpc::enqueue_response`], now or later (a handle
/// kept is a deferred response, as with a [`crate::ReqHandler`]). See
/// [`Burst`] for what happens to a request not taken.
pub type BurstHandler<T, C> = fn(&mut Rpc<T, C>, &mut C, &mut Burst<'_>);

/// One request of a burst: what its handle is made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BurstEntry {
    session: SessionNum,
    slot: u8,
    req_num: u64,
}

/// A queued single-packet request of a burst type, until the RX burst's
/// loop ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// Where its data starts in the RX ring (compared, never read).
    addr: usize,
    entry: BurstEntry,
    req_type: u8,
}

/// The requests of one type from one RX burst, handed to a
/// [`BurstHandler`]: request `i`'s data ([`Burst::data`], in the RX ring:
/// valid until the handler returns) and its handle ([`Burst::take`]).
///
/// * A burst holds at most [`MAX_BURST`] requests; an RX burst with more
///   requests of the type calls the handler again for the rest.
/// * Multi-packet requests of a burst type still arrive one by one: each
///   is complete only when its last packet arrives, and goes to the
///   handler then, as a burst of one (as does a single-packet request when
///   [`crate::RpcConfig::zero_copy_rx`] is off).
/// * At-most-once, loss recovery and session resets are exactly as for a
///   [`crate::ReqHandler`]: a request enters a burst once, however often
///   the client sends it; a retransmission that arrives while its burst is
///   pending or its handle is kept is answered "in progress".
/// * Every request should be taken. A request the handler took and
///   neither responded to nor kept is, as with a dispatch handler's
///   dropped handle, never answered (its client waits until it resets
///   the session). A request the handler did not take at all is failed
///   when the handler returns: an erpc-rs client's request completes with
///   [`crate::RpcError::Server`] and [`ServerError::Declined`]; a C++
///   eRPC client cannot be told, and its request stays outstanding. It
///   is counted in [`crate::RpcStats::burst_not_taken`].
/// * A handle taken and not responded to before the handler returns is a
///   deferred response: its data is copied out of the RX ring then (read
///   it again with [`Rpc::request_data`]).
///
/// ```
/// use erpc_sim::SimTransport;
/// use erpc::{Burst, Rpc};
///
/// /// Hands out sequence numbers: one addition per burst.
/// fn next_numbers(rpc: &mut Rpc<SimTransport, u64>, counter: &mut u64, burst: &mut Burst<'_>) {
///     let first = *counter;
///     *counter += burst.len() as u64;
///     for i in 0..burst.len() {
///         let h = burst.take(i);
///         let _ = rpc.respond(h, &(first + i as u64).to_le_bytes());
///     }
/// }
/// # let _: erpc::BurstHandler<SimTransport, u64> = next_numbers;
/// ```
#[derive(Debug)]
pub struct Burst<'a> {
    req_type: u8,
    data: &'a [&'a [u8]],
    entries: &'a [BurstEntry],
    /// Bit `i`: request `i`'s handle was taken.
    taken: u64,
}

const _: () = assert!(MAX_BURST <= u64::BITS as usize, "one bit of `taken` each");

impl<'a> Burst<'a> {
    /// The request type.
    pub fn req_type(&self) -> u8 {
        self.req_type
    }

    /// Requests in the burst (1 to [`MAX_BURST`]).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Never true for a burst handed to a handler.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Request `i`'s data, in place in the RX ring for a single-packet
    /// request (zero copy), valid until the handler returns.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn data(&self, i: usize) -> &'a [u8] {
        self.data[i]
    }

    /// The data of every request, in order (borrows the ring, not the
    /// burst: the handler may take handles while it iterates).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
        self.data.iter().copied()
    }

    /// The server session request `i` arrived on.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn session(&self, i: usize) -> SessionNum {
        self.entries[i].session
    }

    /// Takes request `i`'s handle, to respond with (now, or later for a
    /// deferred response).
    ///
    /// # Panics
    /// If `i >= self.len()`, or if request `i`'s handle was taken before.
    pub fn take(&mut self, i: usize) -> ReqHandle {
        let e = self.entries[i];
        let bit = 1u64 << i;
        assert!(
            self.taken & bit == 0,
            "request {i} of the burst was taken twice"
        );
        self.taken |= bit;
        ReqHandle {
            session: e.session,
            slot: e.slot,
            req_num: e.req_num,
        }
    }

    /// Whether request `i`'s handle was taken.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn is_taken(&self, i: usize) -> bool {
        assert!(i < self.len(), "request {i} of a burst of {}", self.len());
        self.taken & (1u64 << i) != 0
    }

    /// Takes every handle not taken yet, in order, each with its request's
    /// data.
    pub fn take_all(&mut self) -> impl Iterator<Item = (ReqHandle, &'a [u8])> + '_ {
        (0..self.len()).filter_map(move |i| {
            if self.taken & (1u64 << i) != 0 {
                return None;
            }
            let d = self.data[i];
            Some((self.take(i), d))
        })
    }
}

/// Walks an RX burst's ring slots forward, finding queued requests' data
/// by address.
struct RingCursor {
    idx: usize,
    left: usize,
}

impl RingCursor {
    /// The data that starts at `addr`, in a slot at or after the cursor.
    fn find<'r, R: RxRing>(&mut self, ring: &'r R, entries: usize, addr: usize) -> &'r [u8] {
        while self.left != 0 {
            let idx = self.idx;
            self.idx = if idx + 1 == entries { 0 } else { idx + 1 };
            self.left -= 1;
            if let Some(d) = ring.packet(idx).and_then(|p| p.get(ERPC_HDR_BYTES..))
                && d.as_ptr() as usize == addr
            {
                return d;
            }
        }
        unreachable!("a queued burst request is in its RX burst")
    }
}

impl<T: Transport, C> Rpc<T, C> {
    /// The request on slot `i` of server session `sn` is complete and of a
    /// burst type whose handler is `func` (`invoke_handler`'s match, which
    /// counted it handled): queued for the end of the RX burst if it is in
    /// the RX ring (`Err`), else handed to the handler at once, alone.
    #[inline(never)]
    pub(crate) fn queue_burst(
        &mut self,
        ctx: &mut C,
        sn: SessionNum,
        i: usize,
        req_type: u8,
        func: BurstHandler<T, C>,
        req: Result<MsgBuf, &[u8]>,
    ) {
        let s = self.session_mut(sn).expect("exists");
        s.half.server_mut()[i].state = SrvState::InHandler;
        let entry = BurstEntry {
            session: sn,
            slot: i as u8,
            req_num: s.slots[i].cur_req_num,
        };
        match req {
            Err(d) if self.burst_pending.len() < self.burst_pending.capacity() => {
                self.burst_pending.push(Pending {
                    addr: d.as_ptr() as usize,
                    entry,
                    req_type,
                });
            }
            req => {
                let taken = {
                    let data = [match &req {
                        Ok(m) => m.data(),
                        Err(d) => *d,
                    }];
                    let entries = [entry];
                    let mut b = Burst {
                        req_type,
                        data: &data,
                        entries: &entries,
                        taken: 0,
                    };
                    self.stats.burst_calls += 1;
                    func(self, ctx, &mut b);
                    b.taken
                };
                self.burst_finish(entry, taken != 0, req);
            }
        }
    }

    /// Hands the requests queued during the RX burst of `n` packets from
    /// ring slot `start` to their burst handlers, type by type, in pieces
    /// of at most [`MAX_BURST`]. Called by `process_rx` before it gives
    /// the slots back.
    #[inline(never)]
    pub(crate) fn run_bursts(&mut self, ctx: &mut C, ring: &T::Ring, start: usize, n: usize) {
        // Out of the Rpc while handlers run (they get `&mut Rpc`); its
        // capacity comes back with it.
        let mut pending = std::mem::take(&mut self.burst_pending);
        while let Some(first) = pending.first() {
            let req_type = first.req_type;
            let HandlerSlot::Burst(func) = self.handlers[usize::from(req_type)] else {
                unreachable!("only a burst type's requests are queued")
            };
            // Not initialised beyond what is pushed (a burst is usually a
            // few requests).
            let mut data: ArrayVec<&[u8], MAX_BURST> = ArrayVec::new();
            let mut entries: ArrayVec<BurstEntry, MAX_BURST> = ArrayVec::new();
            // This piece's requests leave the list; the rest move up, in
            // order (so one forward walk of the ring finds each piece).
            let mut kept = 0;
            let mut cursor = RingCursor {
                idx: start,
                left: n,
            };
            for r in 0..pending.len() {
                let p = pending[r];
                if p.req_type != req_type || data.is_full() {
                    pending[kept] = p;
                    kept += 1;
                    continue;
                }
                let d = cursor.find(ring, self.ring_entries, p.addr);
                if self.burst_live(p.entry) {
                    data.push(d);
                    entries.push(p.entry);
                }
            }
            pending.truncate(kept);
            if data.is_empty() {
                continue;
            }
            let mut b = Burst {
                req_type,
                data: &data,
                entries: &entries,
                taken: 0,
            };
            self.stats.burst_calls += 1;
            func(self, ctx, &mut b);
            let taken = b.taken;
            for (k, (e, d)) in entries.iter().zip(&data).enumerate() {
                self.burst_finish(*e, taken & (1u64 << k) != 0, Err(*d));
            }
        }
        self.burst_pending = pending;
    }

    /// Whether a queued request still runs: not if its session was reset
    /// since (by a handler earlier in the RX burst), in which case its
    /// slot is done now (as a handler's that responded would be).
    fn burst_live(&mut self, e: BurstEntry) -> bool {
        match self.session(e.session) {
            Some(s) if s.state == SessionState::Resetting => {
                self.resetting_slot_done(e.session, usize::from(e.slot), None);
                false
            }
            Some(s) => {
                debug_assert!(
                    s.slots[usize::from(e.slot)].cur_req_num == e.req_num
                        && s.half.server()[usize::from(e.slot)].state == SrvState::InHandler,
                    "a queued request's slot is in its handler"
                );
                true
            }
            None => false,
        }
    }

    /// A burst handler returned: request `e` was taken or not, and its
    /// data is `req` (a msgbuf, or in the RX ring). As `invoke_handler`
    /// after a dispatch handler, and a request not taken is failed.
    fn burst_finish(&mut self, e: BurstEntry, taken: bool, req: Result<MsgBuf, &[u8]>) {
        let (sn, i) = (e.session, usize::from(e.slot));
        let Some(s) = self.sessions.session_mut(sn) else {
            if let Ok(m) = req {
                self.recycle(m);
            }
            return;
        };
        let sv = &mut s.half.server_mut()[i];
        if s.slots[i].cur_req_num != e.req_num || sv.state != SrvState::InHandler {
            // Responded (or its response discarded: the session was reset).
            if let Ok(m) = req {
                self.recycle(m);
            }
            return;
        }
        if !taken {
            self.stats.burst_not_taken += 1;
            if s.state == SessionState::Resetting {
                return self.resetting_slot_done(sn, i, req.ok());
            }
            sv.state = SrvState::Idle;
            if let Ok(m) = req {
                // Released by `fail_request`.
                sv.req_msgbuf = Some(m);
            }
            return self.fail_request(sn, i, ServerError::Declined);
        }
        sv.state = SrvState::Deferred;
        match req {
            Ok(m) => sv.req_msgbuf = Some(m),
            Err(d) => self.keep_deferred_copy(sn, i, d),
        }
    }
}
