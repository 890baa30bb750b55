//! The Rpc's public vocabulary: handler and continuation types, session
//! numbers, the request a handler gets and the completion a continuation
//! gets, session events and the snapshots tools read.

use std::fmt;

use super::{Rpc, RpcError, SessionEnd};
use transport::Transport;

use crate::msgbuf::MsgBuf;
use crate::session::{Role, Session, SrvState};

/// A dispatch-mode request handler. Runs in the event loop; `req.data`
/// is the request (in the RX ring for single-packet requests: zero copy).
/// Respond now with [`Rpc::enqueue_response`], or keep `req.handle` and
/// respond later (e.g. from a continuation of a nested RPC).
pub type ReqHandler<T, C> = fn(&mut Rpc<T, C>, &mut C, Request<'_>);

/// A continuation: invoked from the event loop when a request completes,
/// with the request and response buffers moved back to the application.
pub type Continuation<T, C> = fn(&mut Rpc<T, C>, &mut C, Completion);

/// Session-event callback.
pub type SessionHandler<T, C> = fn(&mut Rpc<T, C>, &mut C, SessionEvent);

/// Session number at this Rpc.
pub type SessionNum = u16;

/// A request given to a dispatch handler.
#[derive(Debug)]
pub struct Request<'a> {
    /// The handle to respond with (move-only: one response per request).
    pub handle: ReqHandle,
    /// Request type.
    pub req_type: u8,
    /// The request data. For a deferred response, read it again later with
    /// [`Rpc::request_data`].
    pub data: &'a [u8],
}

/// Identifies a request being handled at the server. Not `Clone`: it is
/// consumed by the response.
#[derive(Debug, PartialEq, Eq)]
pub struct ReqHandle {
    pub(super) session: u16,
    pub(super) slot: u8,
    pub(super) req_num: u64,
}

impl ReqHandle {
    /// Server session the request arrived on.
    pub fn session(&self) -> SessionNum {
        self.session
    }

    /// Request number (for logs).
    pub fn req_num(&self) -> u64 {
        self.req_num
    }
}

/// A finished request, handed to its continuation.
#[derive(Debug)]
pub struct Completion {
    /// The tag given to `enqueue_request`.
    pub tag: usize,
    /// Session the request was sent on.
    pub session: SessionNum,
    /// The request buffer, back to the application.
    pub req: MsgBuf,
    /// The response buffer; its data is the response if `result` is `Ok`.
    pub resp: MsgBuf,
    /// Outcome.
    pub result: Result<(), RpcError>,
}

/// What happened to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEventKind {
    /// The server accepted the session.
    Connected,
    /// The session was disconnected ([`Rpc::destroy_session`]) and is
    /// gone.
    Disconnected,
    /// The session ended, or never connected, without the application
    /// destroying it, and is gone; its requests completed with
    /// [`RpcError::SessionEnded`] and the same [`SessionEnd`].
    Ended(SessionEnd),
}

impl fmt::Display for SessionEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionEventKind::Connected => f.write_str("connected"),
            SessionEventKind::Disconnected => f.write_str("disconnected"),
            SessionEventKind::Ended(why) => why.fmt(f),
        }
    }
}

/// A session event for the application's callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionEvent {
    /// Session number.
    pub session: SessionNum,
    /// What happened.
    pub kind: SessionEventKind,
}

/// A snapshot of one session, for tools and diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    /// Local session number.
    pub session: SessionNum,
    /// True at the client end.
    pub is_client: bool,
    /// Connection state.
    pub state: crate::SessionState,
    /// The remote Nexus.
    pub remote_uri: String,
    /// The remote Rpc id.
    pub remote_rpc_id: u8,
    /// The remote end's session number.
    pub remote_session: SessionNum,
    /// The remote Nexus's incarnation (0: a C++ peer, not pinged).
    pub remote_incarnation: u64,
    /// Client: credits available now.
    pub credits: u32,
    /// Client: slots with a request in flight; server: slots whose
    /// handler has not responded yet.
    pub busy_slots: usize,
    /// Client: requests waiting for a slot.
    pub backlog: usize,
    /// Current request number of each slot.
    pub req_nums: [u64; crate::consts::SESSION_REQ_WINDOW],
    /// Client: go-back-N rollbacks so far.
    pub retransmits: u64,
    /// Client: the congestion controller's current rate in Gbit/s —
    /// Timely's, or the delay-target controller's with
    /// [`crate::cc::CcConfig::swift`] (`None` with congestion control
    /// off).
    pub cc_rate_gbps: Option<f64>,
    /// Client: the last RTT sample in µs, from a packet's TX timestamp to
    /// its acknowledgement (`None` with congestion control off or before
    /// the first acknowledgement).
    pub rtt_us: Option<f64>,
    /// Each slot, in slot order.
    pub slots: [SlotInfo; crate::consts::SESSION_REQ_WINDOW],
    /// Nanoseconds since the session last made progress: the newest of
    /// its slots' progress clocks, which a packet received for a request
    /// sets (at a client also a request enqueued). For a session whose
    /// requests are stuck, the time since the last packet from the peer.
    /// `None` before any. The clocks of a client's active slots are moved
    /// forward over pauses of this Rpc's own event loop (see `rpc/loss.rs`),
    /// so such a pause does not count.
    pub quiet_ns: Option<u64>,
}

/// One slot of a session, as [`SessionInfo`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotInfo {
    /// Request number of the current (or last) request on the slot.
    pub req_num: u64,
    /// Client: `idle` (no request), `in_flight` (packets unacknowledged),
    /// `waiting` (a request with nothing in flight: waiting for credits or
    /// for the next packet of the response to be asked for). Server: the
    /// slot's handling state (`idle`, `receiving`, `in_handler`,
    /// `deferred`, `background`, `responded`, `failed`).
    pub state: &'static str,
    /// Client: request packets and RFRs sent for the request (`None` when
    /// idle and at a server).
    pub tx_pkts: Option<u32>,
    /// Client: credit returns and response packets received for it; server:
    /// request packets received in order (`None` when idle).
    pub rx_pkts: Option<u32>,
    /// A busy slot (client: a request; server: a handler that has not
    /// responded): nanoseconds since it last made progress (the request's
    /// enqueue or its last packet in; at a server, the request's last
    /// packet, so how long its handler has had it). `None` when not busy.
    pub waited_ns: Option<u64>,
}

/// What an Rpc keeps for its active client sessions, those with requests
/// ([`Rpc::active_pools`]). An idle session holds none of it; the pools
/// grow with the most sessions active at once and shrink back (a few
/// dozen spare arrays a scan; the wheel's buckets once it is empty).
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivePools {
    /// Client sessions with requests (what the loss scan visits).
    pub active_sessions: usize,
    /// Spare TX timestamp arrays (congestion control on), 2 KiB each at
    /// 32 credits.
    pub spare_ts_arrays: usize,
    /// Active sessions the timing wheel has room for.
    pub wheel_sessions: usize,
    /// Buckets in the timing wheel's pool.
    pub wheel_pool_buckets: usize,
}

impl SessionInfo {
    /// The snapshot of session `s` at time `now` (ns).
    pub(super) fn of<T: Transport, C>(s: &Session<T, C>, now: u64) -> SessionInfo {
        let is_client = s.role == Role::Client;
        SessionInfo {
            session: s.local_num,
            is_client,
            state: s.state,
            remote_uri: s.remote_uri.to_string(),
            remote_rpc_id: s.remote_rpc_id(),
            remote_session: s.remote_num,
            remote_incarnation: s.remote_incarnation,
            credits: s.credits,
            busy_slots: if is_client {
                s.busy_slots()
            } else {
                s.busy_handlers()
            },
            backlog: s.backlog.len(),
            req_nums: std::array::from_fn(|i| s.slots[i].cur_req_num),
            retransmits: s.retransmits,
            cc_rate_gbps: s.cc.as_ref().map(|c| c.ctl().rate() * 8.0 / 1e9),
            rtt_us: s
                .cc
                .as_ref()
                .and_then(|c| c.last_rtt_ns)
                .map(|ns| ns as f64 / 1e3),
            slots: std::array::from_fn(|i| {
                let req_num = s.slots[i].cur_req_num;
                if is_client {
                    let c = &s.half.client()[i];
                    let busy = s.slots[i].tx_msgbuf.is_some();
                    SlotInfo {
                        req_num,
                        state: match (busy, c.num_tx > c.num_rx) {
                            (false, _) => "idle",
                            (true, true) => "in_flight",
                            (true, false) => "waiting",
                        },
                        tx_pkts: busy.then_some(c.num_tx),
                        rx_pkts: busy.then_some(c.num_rx),
                        waited_ns: busy.then(|| now.saturating_sub(c.progress_ns)),
                    }
                } else {
                    let sv = &s.half.server()[i];
                    SlotInfo {
                        req_num,
                        state: sv.state.name(),
                        tx_pkts: None,
                        rx_pkts: (sv.state != SrvState::Idle).then_some(sv.num_rx),
                        waited_ns: sv.busy().then(|| now.saturating_sub(sv.progress_ns)),
                    }
                }
            }),
            quiet_ns: {
                let newest = if is_client {
                    s.half.client().iter().map(|c| c.progress_ns).max()
                } else {
                    s.half.server().iter().map(|sv| sv.progress_ns).max()
                };
                newest.filter(|&t| t != 0).map(|t| now.saturating_sub(t))
            },
        }
    }
}
