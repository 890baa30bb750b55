//! Session reset: what happens to a session whose peer failed, that the
//! application resets or destroys with requests outstanding, and what an
//! Rpc gives back when it is dropped.
//!
//! Client side: every outstanding request (in a slot or in the backlog)
//! completes with an error continuation, its buffers back to the caller.
//! Before any buffer goes back, the TX queue is drained so the transport
//! holds no reference to it. The requests are taken out of the session at
//! once; their continuations (and the session event) run at the start of
//! the next event-loop iteration, in order, so that the reset can be
//! called from anywhere (a continuation, a handler, outside the loop). The session's credits, RX ring reservation
//! and keep-alive tracking are released; its number is quarantined before
//! reuse, so stray packets of the old session are dropped (and counted),
//! never delivered to a new one.
//!
//! Server side: slots whose request a worker still runs, or whose
//! dispatch handler kept the handle to respond later, keep the session
//! alive in [`SessionState::Resetting`] until they respond (the response
//! is discarded with [`RespondError::SessionReset`]); then the session is
//! freed. Everything else is released at once. No buffer is freed while a
//! handler or worker can still use it, and none is leaked.

use transport::Transport;

use super::{
    Completion, RespondError, Rpc, RpcError, SessionEnd, SessionError, SessionEventKind, SessionNum,
};
use crate::msgbuf::{MsgBuf, Origin};
use crate::nexus::PeerFailure;
use crate::session::{Role, SessionState, SrvState};

/// Why a client session's requests fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetCause {
    /// The peer was declared failed.
    PeerFailed,
    /// The application (or fault injection) reset the session.
    Requested,
    /// The connect request went unanswered.
    ConnectTimedOut,
    /// The 44-bit request numbers of a session to a C++ eRPC peer ran out.
    ReqNumsExhausted,
    /// The server reclaimed the session (it had received no request).
    ServerReclaimed,
    /// The server ended the session without being asked.
    ServerEnded,
    /// A request got no answer for the stall bound.
    Stalled,
}

impl ResetCause {
    /// How the session ended, as its event and its requests report it.
    fn end(self) -> SessionEnd {
        match self {
            ResetCause::PeerFailed => SessionEnd::PeerFailed,
            ResetCause::Requested => SessionEnd::Reset,
            ResetCause::ConnectTimedOut => SessionEnd::ConnectTimedOut,
            ResetCause::ReqNumsExhausted => SessionEnd::ReqNumsExhausted,
            ResetCause::ServerReclaimed => SessionEnd::ServerReclaimed,
            ResetCause::ServerEnded => SessionEnd::ServerEnded,
            ResetCause::Stalled => SessionEnd::Stalled,
        }
    }

    fn error(self, session: SessionNum) -> RpcError {
        RpcError::SessionEnded {
            session,
            why: self.end(),
        }
    }

    fn event(self) -> SessionEventKind {
        SessionEventKind::Ended(self.end())
    }
}

/// A request taken out of a client session, waiting for its error
/// continuation to run.
pub(crate) struct FailedReq<T: Transport, C> {
    pub session: SessionNum,
    pub req: MsgBuf,
    pub resp: MsgBuf,
    pub cont: super::Continuation<T, C>,
    pub tag: usize,
    pub err: RpcError,
}

/// Something the event loop owes the application.
pub(crate) enum Owed<T: Transport, C> {
    /// A session event.
    Event(super::SessionEvent),
    /// An error continuation.
    Failed(FailedReq<T, C>),
}

impl<T: Transport, C> Rpc<T, C> {
    /// [`Rpc::reset_session`]: the application resets a session.
    pub(crate) fn reset_by_application(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        let role = match self.session(sn) {
            Some(s) if s.state != SessionState::Resetting => s.role,
            _ => return Err(SessionError::NoSuchSession(sn)),
        };
        match role {
            Role::Client => {
                // Not to a C++ server with requests of the session
                // unfinished: it cannot take a disconnect then.
                let (state, tell) = self.session(sn).map_or((None, false), |s| {
                    let tell = matches!(
                        s.state,
                        SessionState::Connected | SessionState::DisconnectInProgress
                    ) && !s.closing
                        && (s.remote_incarnation != 0 || s.busy_slots() == 0);
                    (Some(s.state), tell)
                });
                if tell {
                    // (A disconnect already under way goes on being
                    // retried from the record.)
                    self.send_disconnect_retried(sn);
                } else if state == Some(SessionState::ConnectInProgress) {
                    // The server may have made the session already: a
                    // late answer gets a disconnect.
                    let now = self.clock.now_ns();
                    self.abandon_connect(sn, now);
                }
                self.reset_client_session(sn, ResetCause::Requested);
            }
            Role::Server => {
                self.log_server_event(sn, "reset by the application");
                self.stats.sessions_reset += 1;
                self.notify_server_end(sn);
                self.retire_server_session(sn)
            }
        }
        Ok(())
    }

    /// The Nexus declared a remote failed: reset every session it matches.
    pub(crate) fn handle_peer_failed(&mut self, f: &PeerFailure) {
        let hit: Vec<(SessionNum, Role)> = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| {
                s.remote_uri == f.uri
                    && s.state != SessionState::Resetting
                    && f.rpc_id.is_none_or(|id| s.remote_rpc_id() == id)
                    && (f.incarnation == 0 || s.remote_incarnation == f.incarnation)
            })
            .map(|s| (s.local_num, s.role))
            .collect();
        for (sn, role) in hit {
            self.stats.sessions_peer_failed += 1;
            match role {
                Role::Client => {
                    // Perhaps a one-sided verdict too: a server that is
                    // alive frees its end. (An erpc-rs one: a C++ server
                    // cannot take a disconnect with requests unfinished.)
                    let tell = self.session(sn).is_some_and(|s| {
                        matches!(
                            s.state,
                            SessionState::Connected | SessionState::DisconnectInProgress
                        ) && s.remote_incarnation != 0
                    });
                    if tell {
                        self.send_disconnect_retried(sn);
                    }
                    self.reset_client_session(sn, ResetCause::PeerFailed)
                }
                Role::Server => {
                    self.log_server_event(sn, "reset: its client's Nexus was declared failed");
                    self.stats.sessions_reset += 1;
                    // Perhaps a one-sided verdict (SM lost one way): a
                    // client that is alive must hear of it.
                    self.notify_server_end(sn);
                    self.retire_server_session(sn)
                }
            }
        }
    }

    /// Takes every outstanding request out of client session `sn` (slots
    /// and backlog) into the owed queue with `err`, returning their
    /// credits. The caller drains TX before the continuations can run.
    fn take_outstanding(&mut self, sn: SessionNum, err: RpcError) -> usize {
        // The requests leave their slots: none of their packets (nor the
        // session's RFRs) may stay queued.
        self.tx.forget_session(sn, &mut self.stats.tx_stale);
        let Some(s) = self.sessions.session_mut(sn) else {
            return 0;
        };
        let out = &mut self.owed;
        let before = out.len();
        for (slot, c) in s.slots.iter_mut().zip(s.half.client_mut().iter_mut()) {
            let Some(req) = slot.tx_msgbuf.take() else {
                continue;
            };
            s.credits += c.num_tx - c.num_rx;
            c.num_tx = 0;
            c.num_rx = 0;
            c.abandoned_req_num = slot.cur_req_num;
            c.in_stallq = false;
            out.push_back(Owed::Failed(FailedReq {
                session: sn,
                req,
                resp: c
                    .resp_msgbuf
                    .take()
                    .expect("in flight implies a response buffer"),
                cont: c.cont.take().expect("in flight implies a continuation"),
                tag: c.tag,
                err,
            }));
        }
        for p in std::mem::take(&mut s.backlog) {
            out.push_back(Owed::Failed(FailedReq {
                session: sn,
                req: p.req,
                resp: p.resp,
                cont: p.cont,
                tag: p.tag,
                err,
            }));
        }
        self.stallq.retain(|&(s, _)| s != sn);
        self.gate |= super::ev_loop::GATE_OWED;
        self.owed.len() - before
    }

    /// Runs what the event loop owes the application: session events and
    /// error continuations, in the order they arose. Bounded by what was
    /// owed on entry (continuations may owe more, for the next iteration).
    #[inline(never)]
    pub(crate) fn pay_owed(&mut self, ctx: &mut C) {
        for _ in 0..self.owed.len() {
            let Some(o) = self.owed.pop_front() else {
                break;
            };
            match o {
                Owed::Event(ev) => {
                    if let Some(h) = self.sm_handler {
                        h(self, ctx, ev);
                    }
                }
                Owed::Failed(f) => {
                    self.stats.reqs_completed += 1;
                    self.stats.reqs_failed += 1;
                    (f.cont)(
                        self,
                        ctx,
                        Completion {
                            tag: f.tag,
                            session: f.session,
                            req: f.req,
                            resp: f.resp,
                            result: Err(f.err),
                        },
                    );
                }
            }
        }
        if self.owed.is_empty() {
            self.gate &= !super::ev_loop::GATE_OWED;
        }
    }

    /// Owes the application a session event (and logs it at debug level
    /// with the peer, while the session still exists).
    pub(crate) fn owe_event(&mut self, session: SessionNum, kind: SessionEventKind) {
        self.log_client_event(session, &kind);
        self.owed
            .push_back(Owed::Event(super::SessionEvent { session, kind }));
        self.gate |= super::ev_loop::GATE_OWED;
    }

    /// A client session's event, at debug level: the session, its peer
    /// (URI, Rpc id, session number) and what happened.
    #[cold]
    fn log_client_event(&self, sn: SessionNum, kind: &SessionEventKind) {
        // An ending by its name alone (`PeerFailed`, not `Ended(PeerFailed)`).
        let kind: &dyn std::fmt::Debug = match kind {
            SessionEventKind::Ended(why) => why,
            other => other,
        };
        match self.session(sn) {
            Some(s) => tracing::debug!(
                rpc = self.rpc_id(),
                session = sn,
                peer = %s.remote_uri,
                remote_rpc = s.remote_rpc_id(),
                remote_session = s.remote_num,
                event = ?kind,
                "client session {sn} to {}: {kind:?}",
                s.remote_uri
            ),
            None => tracing::debug!(
                rpc = self.rpc_id(),
                session = sn,
                event = ?kind,
                "client session {sn}: {kind:?}"
            ),
        }
    }

    /// A server session's end, at debug level, with its peer.
    #[cold]
    pub(crate) fn log_server_event(&self, sn: SessionNum, what: &str) {
        if let Some(s) = self.session(sn) {
            tracing::debug!(
                rpc = self.rpc_id(),
                session = sn,
                peer = %s.remote_uri,
                remote_rpc = s.remote_rpc_id(),
                remote_session = s.remote_num,
                "server session {sn} of {}: {what}",
                s.remote_uri
            );
        }
    }

    /// `destroy_session` of client session `sn`, to a C++ eRPC server,
    /// with requests in its slots. A C++ server takes a disconnect only
    /// when every slot of the session is finished (its request handled
    /// and buried, its response fully pulled; it asserts this), so the
    /// slots run to the end first: each request fails to the application
    /// now with `err`, as any destroyed request does, handed back in
    /// copies (the request's bytes, an empty response buffer of the same
    /// capacity), while the slot keeps the originals and goes on with a
    /// continuation of the Rpc's own (`drain_sink`). The backlog fails
    /// as usual. Once the last slot completes (or fails: a stall ends it
    /// like any session), the disconnect request goes out and the session
    /// ends as a destroyed one does. False, with nothing changed, if the
    /// copies cannot be allocated: then the session is destroyed at once.
    pub(crate) fn begin_drain(&mut self, sn: SessionNum, err: RpcError) -> bool {
        let mut copies: Vec<(usize, MsgBuf, MsgBuf)> = Vec::new();
        let mut short = false;
        if let Some(s) = self.sessions.session(sn) {
            for (i, (slot, c)) in s.slots.iter().zip(s.half.client().iter()).enumerate() {
                let (Some(req), Some(resp)) = (&slot.tx_msgbuf, &c.resp_msgbuf) else {
                    continue;
                };
                let rq = MsgBuf::alloc(&mut self.alloc, req.len(), Origin::Dynamic);
                let rs = MsgBuf::alloc(&mut self.alloc, resp.max_len(), Origin::Dynamic);
                match (rq, rs) {
                    (Ok(mut rq), Ok(rs)) => {
                        rq.data_mut().copy_from_slice(req.data());
                        copies.push((i, rq, rs));
                    }
                    (a, b) => {
                        short = true;
                        for m in [a, b].into_iter().flatten() {
                            self.alloc.free(m.into_buffer());
                        }
                        break;
                    }
                }
            }
        }
        if short || copies.is_empty() {
            for (_, a, b) in copies {
                self.alloc.free(a.into_buffer());
                self.alloc.free(b.into_buffer());
            }
            return false;
        }
        let s = self.sessions.session_mut(sn).expect("looked up above");
        for (i, req, resp) in copies {
            let c = &mut s.half.client_mut()[i];
            let cont = c.cont.replace(drain_sink::<T, C>).expect("in flight");
            self.owed.push_back(Owed::Failed(FailedReq {
                session: sn,
                req,
                resp,
                cont,
                tag: c.tag,
                err,
            }));
        }
        for p in std::mem::take(&mut s.backlog) {
            self.owed.push_back(Owed::Failed(FailedReq {
                session: sn,
                req: p.req,
                resp: p.resp,
                cont: p.cont,
                tag: p.tag,
                err,
            }));
        }
        s.closing = true;
        self.gate |= super::ev_loop::GATE_OWED;
        self.stats.sessions_drained += 1;
        true
    }

    /// A slot of a draining session (`begin_drain`) completed: once none
    /// is left, the disconnect request goes out.
    fn drained_slot(&mut self, sn: SessionNum) {
        let now = self.clock.now_ns();
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        if !s.closing || s.busy_slots() != 0 {
            return;
        }
        s.closing = false;
        self.start_disconnect(sn, now);
    }

    /// Fails every outstanding request of client session `sn` with `err`,
    /// keeping the session (`destroy_session` with requests in flight).
    pub(crate) fn fail_outstanding(&mut self, sn: SessionNum, err: RpcError) {
        if self.take_outstanding(sn, err) > 0 {
            self.drain_tx();
        }
    }

    /// Frees client session `sn` now and fails its requests (the
    /// continuations run in the next event-loop iteration).
    pub(crate) fn reset_client_session(&mut self, sn: SessionNum, cause: ResetCause) {
        self.owe_event(sn, cause.event());
        self.take_outstanding(sn, cause.error(sn));
        self.stats.sessions_reset += 1;
        self.free_session(sn);
        // Queued packets of the session were forgotten with it;
        // the transport must also let go of those already handed to it.
        self.drain_tx();
    }

    /// Ends server session `sn` (its client disconnected, failed or was
    /// reset): frees it, or parks it in `Resetting` until its running
    /// handlers respond.
    pub(crate) fn retire_server_session(&mut self, sn: SessionNum) {
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        let credits = s.credits_max as usize;
        debug_assert_eq!(s.role, Role::Server);
        if s.state == SessionState::Resetting {
            // Already retired; waiting for its handlers.
            return;
        }
        if s.busy_handlers() == 0 {
            return self.free_session(sn);
        }
        // Release what no handler uses; keep the session number (and the
        // slots of running handlers) until they respond. Queued packets of
        // the session go first (they point into those buffers).
        s.state = SessionState::Resetting;
        self.tx.forget_session(sn, &mut self.stats.tx_stale);
        let s = self.sessions.session_mut(sn).expect("looked up above");
        let token = s.uniq_token;
        let mut bufs = Vec::new();
        for (sl, sv) in s.slots.iter_mut().zip(s.half.server_mut().iter_mut()) {
            if !sv.busy() {
                bufs.extend(sl.tx_msgbuf.take());
                bufs.extend(sv.req_msgbuf.take());
                sv.state = SrvState::Idle;
            }
        }
        let (uri, rpc_id, inc, tracked) = (
            s.remote_uri.clone(),
            s.remote_rpc_id(),
            s.remote_incarnation,
            s.tracked,
        );
        s.tracked = false;
        if tracked {
            self.nexus.router().untrack(&uri, rpc_id, inc);
        }
        if self.token_map.get(&token) == Some(&sn) {
            self.token_map.remove(&token);
            let now = self.clock.now_ns();
            self.retired_tokens.retire(token, now);
        }
        self.open_sessions -= 1;
        self.ring_entries_available += credits;
        // The transport lets go of the session's packets it already has.
        self.drain_tx();
        for m in bufs {
            self.recycle(m);
        }
    }

    /// A handler of a `Resetting` session finished on slot `i`: discard
    /// its response, and free the session once no handler remains.
    pub(crate) fn resetting_slot_done(&mut self, sn: SessionNum, i: usize, resp: Option<MsgBuf>) {
        let mut bufs: Vec<MsgBuf> = resp.into_iter().collect();
        let Some(s) = self.session_mut(sn) else {
            for m in bufs {
                self.recycle(m);
            }
            return;
        };
        debug_assert_eq!(s.state, SessionState::Resetting);
        let sv = &mut s.half.server_mut()[i];
        sv.state = SrvState::Idle;
        bufs.extend(sv.req_msgbuf.take());
        let done = s.busy_handlers() == 0;
        self.stats.resps_discarded += 1;
        for m in bufs {
            self.recycle(m);
        }
        if done {
            self.free_session(sn);
        }
    }

    /// The error for a response to a `Resetting` session.
    pub(crate) fn reset_respond_error(sn: SessionNum, req_num: u64) -> RespondError {
        RespondError::SessionReset {
            session: sn,
            req_num,
        }
    }
}

/// The continuation of a draining session's slots (`Rpc::begin_drain`):
/// their requests already failed to the application, so the outcome is
/// not reported (nor counted as a completion again); the buffers are the
/// Rpc's own copies' originals, freed.
fn drain_sink<T: Transport, C>(rpc: &mut Rpc<T, C>, _ctx: &mut C, c: Completion) {
    rpc.stats.reqs_completed -= 1;
    if c.result.is_err() {
        rpc.stats.reqs_failed -= 1;
    }
    rpc.stats.drained_reqs += 1;
    let sn = c.session;
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
    rpc.drained_slot(sn);
}
