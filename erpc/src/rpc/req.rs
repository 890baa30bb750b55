//! Requests. Client: `enqueue_request`, slot assignment and backlog,
//! sending request packets within session credits. Server: receiving
//! request packets (single-packet requests handled in place in the RX
//! ring; multi-packet requests reassembled into a msgbuf with an explicit
//! credit return per packet but the last), at-most-once execution, and
//! invoking handlers.

use transport::Transport;

use super::reset::{FailedReq, Owed, ResetCause};
use super::tx::write_msg_hdrs;
use super::{
    Continuation, EnqueueError, EnqueueErrorKind, HandlerSlot, ReqHandle, Request, Rpc, RpcError,
    ServerError, SessionEnd, SessionNum,
};
use crate::consts::{MAX_MSG_BYTES, SESSION_REQ_WINDOW};
use crate::msgbuf::{MsgBuf, Origin, data_size_to_num_pkts, pkt_data_bytes};
use crate::pkthdr::{PktHdr, PktType, RxHdr, next_req_num, prev_req_num, req_num_delta};
use crate::session::{PendingReq, Role, SessionState, SrvState};
use crate::stats::DropReason;

/// What [`Rpc::begin_req`] made of a request packet.
enum Begin {
    /// A new request, now the slot's current one.
    New,
    /// The slot's current request (a later packet, or a duplicate).
    Same,
    /// Dropped (counted).
    Dropped,
}

/// Pushes `p` onto a full backlog (which grows).
#[cold]
#[inline(never)]
fn grow_and_push<T: Transport, C>(
    backlog: &mut std::collections::VecDeque<PendingReq<T, C>>,
    p: PendingReq<T, C>,
) {
    backlog.push_back(p);
}

impl<T: Transport, C> Rpc<T, C> {
    /// Client: [`Rpc::enqueue_request`]. The request goes into a free
    /// slot of a connected session at once, else into its backlog. Always
    /// inlined into its one caller, so that the public method is this
    /// function, as it was before the API moved to `api.rs`.
    #[inline(always)]
    pub(crate) fn submit_request(
        &mut self,
        session: SessionNum,
        req_type: u8,
        req: MsgBuf,
        resp: MsgBuf,
        cont: Continuation<T, C>,
        tag: usize,
    ) -> Result<(), EnqueueError> {
        let err = |kind, req, resp| {
            Err(EnqueueError {
                kind,
                session,
                req,
                resp,
            })
        };
        // The table field itself, not `session_mut`: the backlog push below
        // keeps this borrow across the stats update (one lookup, not two).
        let Some(s) = self.sessions.session_mut(session) else {
            return err(EnqueueErrorKind::NoSuchSession, req, resp);
        };
        if s.role != Role::Client {
            return err(EnqueueErrorKind::NotClient, req, resp);
        }
        let slot = match s.state {
            SessionState::DisconnectInProgress | SessionState::Resetting => {
                return err(EnqueueErrorKind::Disconnecting, req, resp);
            }
            SessionState::ConnectInProgress => None,
            SessionState::Connected if s.closing => {
                return err(EnqueueErrorKind::Disconnecting, req, resp);
            }
            SessionState::Connected if !s.backlog.is_empty() => None,
            SessionState::Connected => s.free_slot(),
        };
        self.stats.reqs_enqueued += 1;
        match slot {
            Some(i) => self.start_request_now(session, i, req_type, req, resp, cont, tag),
            None => {
                self.stats.reqs_backlogged += 1;
                let p = || PendingReq {
                    req_type,
                    req,
                    resp,
                    cont,
                    tag,
                };
                if s.backlog.len() == s.backlog.capacity() {
                    // Growing the backlog is the one call on this path: out
                    // of line, so the common push needs no stack frame.
                    grow_and_push(&mut s.backlog, p());
                } else {
                    s.backlog.push_back(p());
                }
            }
        }
        Ok(())
    }

    /// [`Rpc::start_request`] out of line, for `enqueue_request`: with the
    /// backlog path alone inline it needs fewer registers saved. A session
    /// that was idle becomes active first (`rpc/active.rs`).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn start_request_now(
        &mut self,
        session: SessionNum,
        i: usize,
        req_type: u8,
        req: MsgBuf,
        resp: MsgBuf,
        cont: Continuation<T, C>,
        tag: usize,
    ) {
        if self.session(session).is_some_and(|s| !s.active) {
            // The session's first request since it went idle.
            self.activate(session);
        }
        self.start_request(session, i, req_type, req, resp, cont, tag);
    }

    /// Puts a request into free slot `i` of a connected client session and
    /// sends what credits allow.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn start_request(
        &mut self,
        session: SessionNum,
        i: usize,
        req_type: u8,
        mut req: MsgBuf,
        resp: MsgBuf,
        cont: Continuation<T, C>,
        tag: usize,
    ) {
        let now = self.now_ns;
        let Some(s) = self.sessions.session_mut(session) else {
            unreachable!("caller checked the session");
        };
        debug_assert!(s.active, "a request starts only on an active session");
        debug_assert!(
            s.role == Role::Client && s.state == SessionState::Connected,
            "a request starts only on a connected client session"
        );
        let route = s.route.as_ref().expect("connected session has a route");
        let slot = &mut s.slots[i];
        debug_assert!(slot.tx_msgbuf.is_none());
        let req_num = next_req_num(slot.cur_req_num);
        if req_num < slot.cur_req_num && s.remote_incarnation == 0 {
            // The 44-bit request number would wrap. An erpc-rs server
            // compares request numbers on the circle; a C++ eRPC server
            // does not (it would drop every later request as stale), so
            // the session ends here, with a clear error, instead of going
            // silent.
            return self.req_nums_exhausted(session, req, resp, cont, tag);
        }
        slot.cur_req_num = req_num;
        let msg_size = req.len();
        let num_pkts = req.num_pkts();
        let c = &mut s.half.client_mut()[i];
        // The slot first, the headers after: fewer values live across the
        // transport's `fill_headroom` call.
        c.resp_msgbuf = Some(resp);
        c.cont = Some(cont);
        c.tag = tag;
        c.req_type = req_type;
        c.req_pkts = num_pkts as u32;
        c.resp_pkts = 0;
        c.resp_bytes = 0;
        c.num_tx = 0;
        c.num_rx = 0;
        c.progress_ns = now;
        c.in_flight_ns = 0;
        c.req_bytes = msg_size as u32;
        c.wheel_count = 0;
        c.resent = false;
        write_msg_hdrs(
            &self.transport,
            route,
            &mut req,
            PktHdr {
                req_type,
                msg_size: 0,
                dest_session_num: s.remote_num,
                pkt_type: PktType::Req,
                pkt_num: 0,
                req_num,
            },
        );
        slot.tx_msgbuf = Some(req);
        // The common case, decided here without `kick`'s general loop: a
        // one-packet request with a credit and room in the TX batch, not
        // paced (congestion control off, or the wheel bypass: an
        // uncongested session; `wheel_count` is 0 for a new request).
        // Exactly what `kick` would do for it.
        if num_pkts == 1
            && s.credits != 0
            && self.tx.room() != 0
            && !super::cc::burst_paced(self.pacing, 0, s.cc.as_ref())
        {
            c.num_tx = 1;
            c.in_flight_ns = now;
            s.credits -= 1;
            debug_assert_eq!(
                super::cr::credit_balance(s),
                Ok(()),
                "session {session} after a request packet went out"
            );
            let ts_at = if self.pacing.cc_on() {
                self.stats.wheel_bypassed += 1;
                Some(super::cc::ts_index(self.tx_ts_cap, i, 0))
            } else {
                None
            };
            Self::tx_push_msg(&mut self.tx, &mut self.stats, s, i as u8, 0, ts_at);
            return;
        }
        self.kick(session, i as u8);
    }

    /// A request cannot be numbered on a session to a C++ eRPC server (see
    /// `start_request`): it fails, and so does the session, with
    /// [`SessionEnd::ReqNumsExhausted`](crate::SessionEnd::ReqNumsExhausted) (the continuations run in the next
    /// event-loop iteration). A new session starts from request number 8
    /// again.
    #[cold]
    fn req_nums_exhausted(
        &mut self,
        session: SessionNum,
        req: MsgBuf,
        resp: MsgBuf,
        cont: Continuation<T, C>,
        tag: usize,
    ) {
        tracing::warn!(
            session,
            "request numbers exhausted on a session to a C++ eRPC peer; resetting it"
        );
        self.owed.push_back(Owed::Failed(FailedReq {
            session,
            req,
            resp,
            cont,
            tag,
            err: RpcError::SessionEnded {
                session,
                why: SessionEnd::ReqNumsExhausted,
            },
        }));
        self.gate |= super::ev_loop::GATE_OWED;
        self.reset_client_session(session, ResetCause::ReqNumsExhausted);
    }

    /// [`Rpc::kick`] for the steady state of a large message, decided with
    /// the session in hand: an acknowledgement just returned the session's
    /// only credit, and client slot `i`'s next packet (a request packet, or
    /// with `rfr` an RFR) takes it, not paced. Then this does to the slot,
    /// the session and the stall queue exactly what `kick` would (one
    /// packet granted; the slot stalled if more remains) and returns the
    /// packet's number for the caller to queue; otherwise it changes
    /// nothing and returns `None` (the caller kicks).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn take_only_credit(
        s: &mut crate::session::Session<T, C>,
        sn: SessionNum,
        i: usize,
        rfr: bool,
        room: usize,
        pacing: super::cc::Pacing,
        pace_window: u16,
        now: u64,
        stallq: &mut Vec<(SessionNum, u8)>,
        pending: &mut u8,
    ) -> Option<u32> {
        let c = &mut s.half.client_mut()[i];
        let wire = c.wire_pkts();
        let pkt = c.num_tx;
        let grant = s.credits == 1
            && pkt < wire
            && (pkt >= c.req_pkts) == rfr
            && room != 0
            && !super::cc::burst_paced(pacing, c.wheel_count, s.cc.as_ref())
            && (pace_window == 0
                || s.cc.is_none()
                || super::cc::pace_room(c.wheel_count, pace_window) != 0);
        if !grant {
            return None;
        }
        if pkt == c.num_rx {
            // As in `kick`: nothing was in flight.
            c.in_flight_ns = now;
            if !c.resent {
                c.progress_ns = now;
            }
        }
        c.num_tx = pkt + 1;
        s.credits = 0;
        if pkt + 1 < wire && !c.in_stallq {
            c.in_stallq = true;
            stallq.push((sn, i as u8));
            *pending |= super::ev_loop::PENDING_STALLQ;
        }
        debug_assert_eq!(
            super::cr::credit_balance(s),
            Ok(()),
            "session {sn} after its only credit went out"
        );
        Some(pkt)
    }

    /// Sends what the slot may send now (request packets, then RFRs) and
    /// parks it in the credit-stall queue if more remains. Returns true if
    /// the slot still has packets to send. Out of line: a one-packet
    /// request never needs it (`start_request` decides that case itself),
    /// nor does the steady state of a large one (`take_only_credit`).
    #[inline(never)]
    pub(crate) fn kick(&mut self, session: SessionNum, i: u8) -> bool {
        loop {
            self.tx_make_room();
            let room = self.tx.room();
            let pacing = self.pacing;
            let now = self.now_ns;
            let pace_window = self.config.cc.pace_window;
            let Some(s) = self.sessions.session_mut(session) else {
                return false;
            };
            let slot = &s.slots[usize::from(i)];
            if slot.tx_msgbuf.is_none() {
                return false;
            }
            let req_num = slot.cur_req_num;
            let c = &mut s.half.client_mut()[usize::from(i)];
            let wire = c.wire_pkts();
            if c.num_tx >= wire {
                return false;
            }
            let mut n = (wire - c.num_tx).min(s.credits).min(room as u32);
            if pace_window != 0 && s.cc.is_some() {
                n = n.min(super::cc::pace_room(c.wheel_count, pace_window));
            }
            if n == 0 {
                if !c.in_stallq {
                    c.in_stallq = true;
                    self.stallq.push((session, i));
                    self.pending |= super::ev_loop::PENDING_STALLQ;
                }
                return true;
            }
            let first = c.num_tx;
            if first == c.num_rx {
                // Nothing was in flight: the retransmission timeout starts
                // now, not when the request was enqueued or last acked.
                c.in_flight_ns = now;
                if !c.resent {
                    // Nor does the stall bound: the slot waited for its
                    // session's credits or the TX queue, not for the
                    // server. (After a rollback it does: a resend is
                    // no answer.)
                    c.progress_ns = now;
                }
            }
            c.num_tx += n;
            s.credits -= n;
            // Everything the slot may send is queued now (the usual case):
            // no second look at the session after the loop below.
            let all_sent = c.num_tx == wire;
            // Or the credits ran out first (a large message): the next
            // pass would find none and stall the slot, so it stalls now.
            // Queuing the packets below returns no credit and leaves the
            // stall queue alone, so this is the same, without that pass.
            let stalls = !all_sent && s.credits == 0;
            if stalls && !c.in_stallq {
                c.in_stallq = true;
                self.stallq.push((session, i));
                self.pending |= super::ev_loop::PENDING_STALLQ;
            }
            let req_pkts = c.req_pkts;
            let req_type = c.req_type;
            // Congestion control: a paced packet waits in the wheel. The
            // wheel bypass holds for the whole batch or for none of it (an
            // uncongested session with nothing in the wheel; queuing does
            // not change either), so it is decided once — unless only a
            // slot's first unacknowledged packet may bypass, which
            // `cc_pace` decides packet by packet.
            let paced = super::cc::burst_paced(pacing, c.wheel_count, s.cc.as_ref());
            debug_assert_eq!(
                super::cr::credit_balance(s),
                Ok(()),
                "session {session} after {n} packets went out"
            );
            if pacing.cc_on() && !paced {
                self.stats.wheel_bypassed += u64::from(n);
            }
            for pkt in first..first + n {
                if paced && self.cc_pace(session, i, pkt, req_num) {
                    continue;
                }
                if pkt < req_pkts {
                    self.enqueue_msg_pkt(session, i, pkt, req_num);
                } else {
                    self.enqueue_ctrl(session, i, PktType::Rfr, req_type, pkt as u16, req_num);
                }
            }
            if all_sent {
                return false;
            }
            if stalls {
                return true;
            }
        }
    }

    /// Client slot `i` was just freed: the oldest backlogged request, if
    /// any, takes it. A connected session with a backlog has every other
    /// slot busy (requests wait only when no slot is free, a connecting
    /// session's backlog is drained when it connects, and every slot that
    /// frees up comes here), so this is all `drain_backlog` would do.
    pub(crate) fn refill_slot(&mut self, session: SessionNum, i: usize) {
        let Some(s) = self.session_mut(session) else {
            return;
        };
        if s.state != SessionState::Connected || s.slots[i].tx_msgbuf.is_some() {
            return;
        }
        let Some(p) = s.backlog.pop_front() else {
            return;
        };
        debug_assert!(
            s.backlog.is_empty() || s.free_slot() == Some(i),
            "a backlog waits only while every other slot is busy"
        );
        self.start_request(session, i, p.req_type, p.req, p.resp, p.cont, p.tag);
    }

    /// Moves backlogged requests of a connected session into free slots.
    pub(crate) fn drain_backlog(&mut self, session: SessionNum) {
        for _ in 0..SESSION_REQ_WINDOW {
            let Some(s) = self.session_mut(session) else {
                return;
            };
            if s.state != SessionState::Connected || s.backlog.is_empty() {
                return;
            }
            let Some(i) = s.free_slot() else { return };
            let p = s.backlog.pop_front().expect("non-empty");
            if !s.active {
                self.activate(session);
            }
            self.start_request(session, i, p.req_type, p.req, p.resp, p.cont, p.tag);
        }
    }

    /// A request packet at a server session.
    pub(crate) fn process_req_pkt(&mut self, ctx: &mut C, hdr: RxHdr, data: &[u8]) {
        let msg_size = hdr.msg_size() as usize;
        if msg_size > MAX_MSG_BYTES {
            return self.stats.drop(DropReason::MsgTooLarge);
        }
        let req_pkts = data_size_to_num_pkts(msg_size);
        let pkt_num = usize::from(hdr.pkt_num());
        if pkt_num >= req_pkts {
            return self.stats.drop(DropReason::PktNumOutOfRange);
        }
        if data.len() != pkt_data_bytes(msg_size, pkt_num) {
            return self.stats.drop(DropReason::SizeMismatch);
        }
        if matches!(
            self.handlers[usize::from(hdr.req_type())],
            HandlerSlot::None
        ) {
            return self.req_without_handler(ctx, hdr, data, req_pkts);
        }
        let sn = hdr.dest_session_num();
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        match self.begin_req(hdr, i, req_pkts) {
            Begin::New => {}
            Begin::Same => return self.process_req_same_num(ctx, hdr, data, i),
            Begin::Dropped => return,
        }
        if req_pkts == 1 && self.config.zero_copy_rx {
            self.stats.rx_accepted += 1;
            return self.invoke_handler(ctx, sn, i, hdr.req_type(), Err(data));
        }
        let mut m = match MsgBuf::alloc(&mut self.alloc, msg_size, Origin::Dynamic) {
            Ok(m) => m,
            Err(_) => {
                self.stats.drop(DropReason::OutOfMemory);
                if self.reads_status(sn) {
                    return self.fail_request(sn, i, ServerError::OutOfMemory);
                }
                // A C++ client: roll back so a retransmission can try again.
                let s = self.session_mut(sn).expect("exists");
                s.slots[i].cur_req_num = prev_req_num(s.slots[i].cur_req_num);
                return;
            }
        };
        m.write_pkt_data(0, data);
        self.stats.rx_accepted += 1;
        if req_pkts == 1 {
            // Zero-copy RX off: the handler reads the copy.
            self.stats.rx_copied += 1;
            return self.invoke_handler(ctx, sn, i, hdr.req_type(), Ok(m));
        }
        let s = self.session_mut(sn).expect("exists");
        let sv = &mut s.half.server_mut()[i];
        sv.req_msgbuf = Some(m);
        sv.state = SrvState::Receiving;
        self.reassembling.push((sn, i as u8, hdr.req_num()));
        self.enqueue_cr(sn, i as u8, hdr);
    }

    /// Frees the reassembly of every multi-packet request whose packets
    /// stopped coming for the stall bound (`RpcConfig::stall_timeout_ms`,
    /// its default if none), and fails it ([`ServerError::Incomplete`]):
    /// a client that went away mid-request no longer pins up to 7.9 MB per
    /// slot. Entries of requests that completed are dropped. Called by the
    /// periodic sweep, only when a multi-packet request began.
    #[cold]
    #[inline(never)]
    pub(crate) fn expire_reassembly(&mut self) {
        let now = self.now_ns;
        let bound_ns = self
            .config
            .stall_timeout_ms
            .unwrap_or(crate::consts::STALL_TIMEOUT_MS)
            .saturating_mul(1_000_000);
        let mut k = 0;
        while k < self.reassembling.len() {
            let (sn, i, req_num) = self.reassembling[k];
            let state = self.session(sn).and_then(|s| {
                let sv = s.half.as_server()?.get(usize::from(i))?;
                let live = sv.state == SrvState::Receiving
                    && s.slots[usize::from(i)].cur_req_num == req_num;
                Some((live, sv.progress_ns))
            });
            match state {
                Some((true, progress)) if now.saturating_sub(progress) < bound_ns => k += 1,
                Some((true, _)) => {
                    self.reassembling.swap_remove(k);
                    self.stats.reassemblies_expired += 1;
                    self.fail_request(sn, usize::from(i), ServerError::Incomplete);
                }
                _ => {
                    self.reassembling.swap_remove(k);
                }
            }
        }
        // Kept at its high-water mark (the multi-packet requests begun in
        // one sweep interval, usually a few dozen entries), so that the
        // steady state allocates nothing; given back only when a burst
        // left it large and nearly empty.
        if self.reassembling.capacity() > 4096 {
            super::tokens::shrink_if_sparse(&mut self.reassembling);
        }
    }

    /// A request packet of a type with no handler here. A C++ client
    /// cannot be told (`rpc/status.rs`): dropped, as the C++ eRPC does.
    /// An erpc-rs client's request becomes the slot's current one, as any
    /// request does, and fails with a status packet.
    #[cold]
    #[inline(never)]
    fn req_without_handler(&mut self, ctx: &mut C, hdr: RxHdr, data: &[u8], req_pkts: usize) {
        let sn = hdr.dest_session_num();
        if !self.reads_status(sn) {
            return self.stats.drop(DropReason::NoHandler);
        }
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        match self.begin_req(hdr, i, req_pkts) {
            Begin::New => {
                self.stats.drop(DropReason::NoHandler);
                self.fail_request(sn, i, ServerError::NoHandler);
            }
            // A duplicate of the failed request: its status again.
            Begin::Same => self.process_req_same_num(ctx, hdr, data, i),
            Begin::Dropped => {}
        }
    }

    /// Server: the request-number checks of a request packet (`hdr`, on
    /// slot `i` of a connected server session, a request of `req_pkts`
    /// packets). A new request becomes the slot's current one: the
    /// previous request and its response are buried. Inlined into its
    /// two callers (the hot one and the handler-less one).
    #[inline(always)]
    fn begin_req(&mut self, hdr: RxHdr, i: usize, req_pkts: usize) -> Begin {
        let sn = hdr.dest_session_num();
        let now = self.now_ns;
        let s = self
            .sessions
            .session_mut(sn)
            .expect("dispatch checked the session");
        let slot = &mut s.slots[i];
        // Request numbers wrap at 2^44: compare on the circle.
        let ahead = match req_num_delta(hdr.req_num(), slot.cur_req_num) {
            Err(_) => {
                self.stats.drop(DropReason::StaleReqNum);
                return Begin::Dropped;
            }
            // A slot that never had a request holds the number before its
            // first one: a packet with it duplicates nothing (and finds no
            // request to compare with). Only a forged packet carries it.
            Ok(0) if s.half.server()[i].state == SrvState::Idle => {
                self.stats.drop(DropReason::StaleReqNum);
                return Begin::Dropped;
            }
            Ok(0) => return Begin::Same,
            Ok(d) => d,
        };
        let sv = &mut s.half.server_mut()[i];
        // A new request on this slot.
        if sv.busy() {
            // The client sends the next request on a slot only after the
            // response to the previous one.
            self.stats.drop(DropReason::ServerSlotBusy);
            return Begin::Dropped;
        }
        // A client moves a slot exactly one window ahead per request; a
        // first packet of anything else is out of order (or forged).
        if hdr.pkt_num() != 0 || ahead != SESSION_REQ_WINDOW as u64 {
            self.stats.drop(DropReason::OutOfOrder);
            return Begin::Dropped;
        }
        // Bury the previous request: its response was received by the
        // client, which is why it sent this one.
        s.served_any = true;
        // The previous response leaves the slot: none of its packets may
        // stay queued (a duplicate's answer may be).
        self.tx
            .forget_slot(slot.tx_epoch, sn, i as u8, &mut self.stats.tx_stale);
        // Usually the slot's own preallocated response: it is swapped
        // into the empty `pre_resp` (what `recycle` would do, without
        // looking the session up or copying it through the stack).
        let own = Origin::PreallocResp {
            session: sn,
            slot: i as u8,
        };
        let old_resp = match &slot.tx_msgbuf {
            Some(m) if sv.pre_resp.is_none() && m.origin() == own => {
                std::mem::swap(&mut sv.pre_resp, &mut slot.tx_msgbuf);
                None
            }
            _ => slot.tx_msgbuf.take(),
        };
        // Usually none (single-packet requests are handled in the RX ring):
        // test before taking, which would copy the empty value.
        let old_req = if sv.req_msgbuf.is_some() {
            sv.req_msgbuf.take()
        } else {
            None
        };
        slot.cur_req_num = hdr.req_num();
        sv.req_type = hdr.req_type();
        sv.req_bytes = hdr.msg_size();
        sv.req_pkts = req_pkts as u32;
        sv.num_rx = 1;
        sv.next_rfr = req_pkts as u32;
        sv.progress_ns = now;
        sv.state = SrvState::Idle;
        if let Some(m) = old_resp {
            // A response buffer that goes back to the allocator (not the
            // slot's own, which only this slot's next response rewrites):
            // the NIC may still hold a send of it if this request came
            // early (a forged or broken client; an honest one sends it
            // only after the whole response arrived). It could otherwise
            // read another session's data in that memory onto this wire.
            // Multi-packet responses only, so one drain per large message.
            self.drain_tx();
            self.recycle(m);
        }
        if let Some(m) = old_req {
            self.recycle(m);
        }
        Begin::New
    }

    /// A request packet whose request number is the slot's current one:
    /// the next packet of a multi-packet request, or a duplicate.
    fn process_req_same_num(&mut self, ctx: &mut C, hdr: RxHdr, data: &[u8], i: usize) {
        let sn = hdr.dest_session_num();
        let now = self.now_ns;
        let s = self
            .sessions
            .session_mut(sn)
            .expect("dispatch checked the session");
        let sv = &mut s.half.server_mut()[i];
        if hdr.msg_size() != sv.req_bytes || hdr.req_type() != sv.req_type {
            return self.stats.drop(DropReason::SizeMismatch);
        }
        let pkt_num = u32::from(hdr.pkt_num());
        let last = sv.req_pkts - 1;
        if sv.state == SrvState::Failed && pkt_num <= sv.num_rx {
            // The request was failed (`rpc/status.rs`): a duplicate of a
            // packet it had, or the next one (the client resuming a
            // request whose reassembly expired, go-back-N from its last
            // acknowledged packet), gets the status again. Later packets
            // of a multi-packet request are out of order, below.
            self.stats.rx_accepted += 1;
            return self.send_status(sn, i);
        }
        if pkt_num < sv.num_rx {
            // Duplicate (or a go-back-N retransmission). Never run the
            // handler again: re-send what the client may have missed.
            if pkt_num < last {
                self.stats.rx_accepted += 1;
                self.stats.dup_req_cr_resent += 1;
                return self.enqueue_cr(sn, i as u8, hdr);
            }
            if sv.state == SrvState::Responded {
                self.stats.rx_accepted += 1;
                self.stats.dup_req_resp_resent += 1;
                self.enqueue_msg_pkt(sn, i as u8, 0, hdr.req_num());
                // The response buffer is recycled when the client's next
                // request shows it arrived: by then the NIC must not still
                // hold this extra copy.
                return self.drain_tx();
            }
            // The handler still runs: an erpc-rs client is told, so the
            // request is not taken for stalled (`rpc/status.rs`).
            self.stats.drop(DropReason::DupReqInProgress);
            return self.send_in_progress(sn, i);
        }
        if pkt_num > sv.num_rx || sv.state != SrvState::Receiving {
            return self.stats.drop(DropReason::OutOfOrder);
        }
        let m = sv
            .req_msgbuf
            .as_mut()
            .expect("receiving implies a reassembly buffer");
        m.write_pkt_data(pkt_num as usize, data);
        sv.num_rx += 1;
        sv.progress_ns = now;
        self.stats.rx_accepted += 1;
        if pkt_num < last {
            return self.enqueue_cr(sn, i as u8, hdr);
        }
        let m = sv.req_msgbuf.take().expect("checked above");
        self.invoke_handler(ctx, sn, i, hdr.req_type(), Ok(m));
    }

    /// Runs the handler for the complete request on slot `i`: `req` is the
    /// reassembled msgbuf, or (`Err`) the data in the RX ring.
    #[inline(always)]
    fn invoke_handler(
        &mut self,
        ctx: &mut C,
        sn: SessionNum,
        i: usize,
        req_type: u8,
        req: Result<MsgBuf, &[u8]>,
    ) {
        self.stats.reqs_handled += 1;
        let func = match self.handlers[usize::from(req_type)] {
            HandlerSlot::Dispatch(f) => f,
            HandlerSlot::Background => return self.submit_bg(sn, i, req_type, req),
            HandlerSlot::Burst(f) => return self.queue_burst(ctx, sn, i, req_type, f, req),
            HandlerSlot::None => unreachable!("checked before"),
        };
        // One lookup for the request number and the state change.
        let s = self.session_mut(sn).expect("exists");
        s.half.server_mut()[i].state = SrvState::InHandler;
        let req_num = s.slots[i].cur_req_num;
        let handle = ReqHandle {
            session: sn,
            slot: i as u8,
            req_num,
        };
        let data: &[u8] = match &req {
            Ok(m) => m.data(),
            Err(d) => d,
        };
        func(
            self,
            ctx,
            Request {
                handle,
                req_type,
                data,
            },
        );
        // The handler either responded or kept the handle for later.
        let Some(s) = self.session_mut(sn) else {
            if let Ok(m) = req {
                self.recycle(m);
            }
            return;
        };
        let sv = &mut s.half.server_mut()[i];
        let deferred = s.slots[i].cur_req_num == req_num && sv.state == SrvState::InHandler;
        if !deferred {
            if let Ok(m) = req {
                self.recycle(m);
            }
            return;
        }
        sv.state = SrvState::Deferred;
        match req {
            Ok(m) => sv.req_msgbuf = Some(m),
            Err(d) => self.keep_deferred_copy(sn, i, d),
        }
    }

    /// The deferred request on slot `i` of session `sn` is `d`, in the RX
    /// ring: the ring slot is reposted after this burst, so a copy is kept
    /// until the response (the nested-RPC path).
    #[inline(never)]
    pub(crate) fn keep_deferred_copy(&mut self, sn: SessionNum, i: usize, d: &[u8]) {
        self.stats.deferred_copies += 1;
        match MsgBuf::alloc(&mut self.alloc, d.len(), Origin::Dynamic) {
            Ok(mut m) => {
                m.data_mut().copy_from_slice(d);
                let s = self.session_mut(sn).expect("exists");
                s.half.server_mut()[i].req_msgbuf = Some(m);
            }
            Err(e) => {
                tracing::warn!(error = %e, "no memory to keep a deferred request");
            }
        }
    }
}
