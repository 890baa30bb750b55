//! The Rpc's public API, in the order an application uses it (as the C++
//! eRPC's `rpc.h` lists it): making an Rpc, message buffers, sessions,
//! requests and responses, the event loop, then accessors, counters and
//! probes. Each method is its short body here or calls the mechanism that
//! does the work, one file per mechanism (`req.rs`, `resp.rs`,
//! `sm_handlers.rs`, `ev_loop.rs`, ...). Rustdoc lists the methods in this
//! order; the test hooks (`testing.rs`) come after them.

use std::sync::Arc;
use std::time::Duration;

use mempool::Allocator;
use transport::{MAX_DATA_PER_PKT, Transport};

use super::{
    Continuation, EnqueueError, ReqHandle, RespondError, Rpc, RpcBuilder, RpcConfig, SessionError,
    SessionInfo, SessionNum,
};
use crate::msgbuf::{MsgBuf, MsgBufError, Origin};
use crate::nexus::Nexus;
use crate::session::{Role, SessionState};
use crate::stats::RpcStats;

/// Making an Rpc.
impl<T: Transport + 'static, C: 'static> Rpc<T, C> {
    /// Starts building an Rpc on `nexus` that owns `transport` and the
    /// hugepage allocator `alloc` (registered with the transport's DMA
    /// mapper). The builder's settings have defaults: Rpc id 0,
    /// [`RpcConfig::default`], no session-event callback (see
    /// [`RpcBuilder`]).
    pub fn builder(nexus: &Arc<Nexus>, transport: T, alloc: Allocator) -> RpcBuilder<T, C> {
        RpcBuilder::new(nexus, transport, alloc)
    }
}

/// Message buffers, sessions, requests, responses and the event loop.
impl<T: Transport, C> Rpc<T, C> {
    /// Allocates a msgbuf of capacity `max_data_bytes` (up to
    /// [`crate::MAX_MSG_BYTES`]); its size starts at the capacity.
    pub fn alloc_msg_buffer(&mut self, max_data_bytes: usize) -> Result<MsgBuf, MsgBufError> {
        MsgBuf::alloc(&mut self.alloc, max_data_bytes, Origin::Dynamic)
    }

    /// Changes a msgbuf's data size (at most its capacity).
    pub fn resize_msg_buffer(
        &mut self,
        m: &mut MsgBuf,
        data_bytes: usize,
    ) -> Result<(), MsgBufError> {
        m.resize(data_bytes)
    }

    /// Frees a msgbuf. A server slot's preallocated response buffer goes
    /// back to its slot.
    pub fn free_msg_buffer(&mut self, m: MsgBuf) {
        self.recycle(m);
    }

    /// Starts connecting a client session to Rpc `remote_rpc_id` of the
    /// Nexus at `remote_uri` (`host:port`). Returns the session number at
    /// once; the session-event callback reports the outcome. Requests may
    /// be enqueued right away: they wait until the session connects.
    ///
    /// A malformed URI (no port, a host that is no IPv4 address or
    /// hostname) fails here, with [`SessionError::BadUri`]. A host name
    /// that does not resolve fails the session as soon as the SM link's
    /// lookup answers (its event and its requests report
    /// [`SessionEnd::HostNotFound`](crate::SessionEnd::HostNotFound)); a host that resolves but does not
    /// answer times out after the failure timeout
    /// ([`SessionEnd::ConnectTimedOut`](crate::SessionEnd::ConnectTimedOut)).
    pub fn create_session(
        &mut self,
        remote_uri: &str,
        remote_rpc_id: u8,
    ) -> Result<SessionNum, SessionError> {
        self.connect_session(remote_uri, remote_rpc_id)
    }

    /// Starts disconnecting client session `sn`, which must be connected.
    /// Requests still in flight or queued on it complete with
    /// [`RpcError::SessionDestroyed`](crate::RpcError::SessionDestroyed) (their continuations run in the next
    /// event-loop iteration). The session-event callback reports
    /// `Disconnected` when the server answers (or after the failure
    /// timeout if it never does).
    pub fn destroy_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        self.disconnect_session(sn)
    }

    /// Resets session `sn` (client or server) at once, as if its peer had
    /// failed, without telling the peer beyond a best-effort disconnect
    /// request from a client session. Client: outstanding requests
    /// complete with, and the session-event callback reports,
    /// [`SessionEnd::Reset`](crate::SessionEnd::Reset). Server: the session is
    /// freed once its running handlers respond.
    ///
    /// The continuations and the event run in the next event-loop iteration.
    pub fn reset_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        self.reset_by_application(sn)
    }

    /// State of a session, if it exists.
    pub fn session_state(&self, sn: SessionNum) -> Option<SessionState> {
        self.session(sn).map(|s| {
            if s.closing {
                SessionState::DisconnectInProgress
            } else {
                s.state
            }
        })
    }

    /// True if the client session is connected.
    pub fn is_connected(&self, sn: SessionNum) -> bool {
        self.session_state(sn) == Some(SessionState::Connected)
    }

    /// A snapshot of session `sn`.
    pub fn session_info(&self, sn: SessionNum) -> Option<SessionInfo> {
        let s = self.session(sn)?;
        Some(SessionInfo::of(s, self.clock.now_ns()))
    }

    /// Sends `req` on client session `session` with request type
    /// `req_type`; the response goes into `resp`. When the request
    /// completes, `cont` runs in the event loop with both buffers and
    /// `tag`. Requests beyond the session's 8 slots, or enqueued before the
    /// session is connected, wait in the session's backlog.
    ///
    /// Packets leave at the next event-loop iteration (or earlier, when a
    /// TX batch fills up).
    pub fn enqueue_request(
        &mut self,
        session: SessionNum,
        req_type: u8,
        req: MsgBuf,
        resp: MsgBuf,
        cont: Continuation<T, C>,
        tag: usize,
    ) -> Result<(), EnqueueError> {
        self.submit_request(session, req_type, req, resp, cont, tag)
    }

    /// The request data of a request whose handler returned without
    /// responding; valid until [`Rpc::enqueue_response`].
    pub fn request_data(&self, h: &ReqHandle) -> Option<&[u8]> {
        let s = self.session(h.session)?;
        let i = usize::from(h.slot);
        if s.slots[i].cur_req_num != h.req_num {
            return None;
        }
        s.half
            .as_server()
            .and_then(|a| a.get(i))?
            .req_msgbuf
            .as_ref()
            .map(|m| m.data())
    }

    /// A buffer for the response to `h` of `len` bytes: the slot's
    /// preallocated MTU-size buffer when `len` fits one packet (no
    /// allocation), a new msgbuf otherwise.
    pub fn response_buffer(&mut self, h: &ReqHandle, len: usize) -> Result<MsgBuf, MsgBufError> {
        if len <= MAX_DATA_PER_PKT
            && self.config.prealloc_responses
            && let Some(s) = self.session_mut(h.session)
            && let Some(mut m) = s
                .half
                .as_server_mut()
                .and_then(|a| a.get_mut(usize::from(h.slot)))
                .and_then(|sv| sv.pre_resp.take())
        {
            // An MTU-size buffer holds one packet.
            m.resize_checked(len);
            return Ok(m);
        }
        MsgBuf::alloc(&mut self.alloc, len, Origin::Dynamic)
    }

    /// Responds to `h` with a copy of `data` (through
    /// [`Rpc::response_buffer`], so small responses use the preallocated
    /// buffer).
    pub fn respond(&mut self, h: ReqHandle, data: &[u8]) -> Result<(), RespondError> {
        let mut m = self
            .response_buffer(&h, data.len())
            .map_err(|_| RespondError::OutOfMemory(data.len()))?;
        m.data_mut().copy_from_slice(data);
        self.enqueue_response(h, m)
    }

    /// Sends `resp` as the response to the request `h`. The request
    /// buffer of `h` is released. The Rpc keeps `resp` until the client's
    /// next request on the slot proves it arrived, then recycles it.
    #[inline]
    pub fn enqueue_response(&mut self, h: ReqHandle, resp: MsgBuf) -> Result<(), RespondError> {
        self.send_response(h, resp)
    }

    /// One iteration of the event loop. Handlers and continuations run in
    /// it and receive `ctx`.
    ///
    /// # Panics
    /// If called from a handler or continuation (re-entrance).
    #[inline(always)]
    pub fn run_event_loop_once(&mut self, ctx: &mut C) {
        self.event_loop_once(ctx);
    }

    /// Runs the event loop for `dur` on this Rpc's clock. With a virtual
    /// clock this returns only once something else advances the clock.
    pub fn run_event_loop(&mut self, ctx: &mut C, dur: Duration) {
        let deadline = self.clock.now_ns() + dur.as_nanos() as u64;
        while self.clock.now_ns() < deadline {
            self.run_event_loop_once(ctx);
        }
    }
}

/// The Rpc's identity, settings, counters and sessions.
impl<T: Transport, C> Rpc<T, C> {
    /// This Rpc's id in its Nexus.
    pub fn rpc_id(&self) -> u8 {
        self.rpc_id
    }

    /// The Nexus.
    pub fn nexus(&self) -> &Arc<Nexus> {
        &self.nexus
    }

    /// The settings this Rpc runs with: those it was created with, except
    /// that congestion control is off on a transport whose round trips
    /// are a host software stack's unless `cc.on_software_stack` asked for
    /// it (see [`crate::cc::CcConfig::on_software_stack`]).
    pub fn config(&self) -> &RpcConfig {
        &self.config
    }

    /// The transport (for its counters).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Current time on this Rpc's clock.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Largest data per packet.
    pub fn max_data_per_pkt(&self) -> usize {
        MAX_DATA_PER_PKT
    }

    /// Sessions open (client and server).
    pub fn num_sessions(&self) -> usize {
        self.open_sessions
    }

    /// Session numbers of every session (client and server, any state).
    pub fn session_nums(&self) -> Vec<SessionNum> {
        self.sessions
            .iter()
            .flatten()
            .map(|s| s.local_num)
            .collect()
    }

    /// True for a client session, false for a server session, `None` if no
    /// such session.
    pub fn session_is_client(&self, sn: SessionNum) -> Option<bool> {
        self.session(sn).map(|s| s.role == Role::Client)
    }

    /// Credits the client session has right now.
    pub fn session_credits(&self, sn: SessionNum) -> Option<usize> {
        self.session(sn).map(|s| s.credits as usize)
    }

    /// Requests in flight (in slots) plus queued in the backlog.
    pub fn outstanding_requests(&self, sn: SessionNum) -> Option<usize> {
        self.session(sn).map(|s| s.busy_slots() + s.backlog.len())
    }

    /// Go-back-N rollbacks on a session so far.
    pub fn session_retransmits(&self, sn: SessionNum) -> Option<u64> {
        self.session(sn).map(|s| s.retransmits)
    }

    /// Counters.
    pub fn stats(&self) -> &RpcStats {
        &self.stats
    }

    /// The hugepage allocator's counters.
    pub fn alloc_stats(&self) -> mempool::AllocStats {
        self.alloc.stats()
    }

    /// The timing wheel's counters (`None` with congestion control off).
    pub fn wheel_stats(&self) -> Option<crate::cc::WheelStats> {
        self.wheel.as_ref().map(|w| w.stats())
    }

    /// What the debug endpoint shows of this Rpc (also usable directly,
    /// e.g. by tests and tools in the same process).
    pub fn inspect_view(&self) -> crate::inspect::RpcView {
        self.inspect_raw().view()
    }
}
