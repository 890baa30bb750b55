//! The Rpc endpoint: one per thread, generic over the transport `T` and
//! the application context `C`.
//!
//! One file per mechanism, as in the C++ eRPC: `req` (requests, both
//! sides), `resp` (responses), `cr` (explicit credit returns), `rfr`
//! (requests for response), `tx` (the single TX path), `rx` (packet
//! dispatch and validation), `ev_loop`, `loss` (retransmission timeout and
//! go-back-N), `reset` (failed peers, session reset and teardown with
//! requests outstanding), fault injection (at the end of this file), `sm_handlers`
//! (session management), `bg` (worker-thread handlers), `burst` (burst
//! handlers), `status` (the server's error answers).

// Rustdoc lists an Rpc's methods module by module, child modules first in
// the order they are declared, then this file's: the application's API
// (sessions, requests, the event loop, responses) comes first, then
// `Rpc::new` and the Rpc's state (this file), then the test hooks (at the
// end of this file) and `inspect_view` (crate::inspect).
// (One group each: rustfmt would sort a group.)
mod sm_handlers;

mod req;

mod ev_loop;

mod resp;

mod reset;

mod active;
mod admission;
mod bg;
mod burst;
mod cc;
mod cr;
mod loss;
mod resolve;
mod rfr;
mod rx;
mod status;
mod tokens;
mod tx;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use mempool::{Allocator, Buffer};
use transport::{MAX_DATA_PER_PKT, RxRing, Transport};

use crate::clock::Clock;
use crate::consts::{
    CONNECT_BURST_PER_SOURCE, CONNECTS_PER_SEC_PER_SOURCE, CTRL_BUFS, FAILURE_TIMEOUT_MS,
    IDLE_SESSION_RECLAIM_MS, MAX_RPC_ID, MIN_SESSION_CREDITS, PKT_LOSS_SCAN_US, RTO_US,
    SESSION_CREDITS, SM_RETRY_MS, STALL_TIMEOUT_MS, UNUSED_SESSION_RECLAIM_MS,
};
use crate::msgbuf::{MsgBuf, MsgBufError, Origin};
use crate::nexus::{BgLinks, HandlerEntry, Job, Nexus, SmQueue};
use crate::session::{self, Session, SessionState};
use crate::sm_types::{SmErr, TransportType};
use crate::stats::RpcStats;

pub use burst::{Burst, BurstHandler};
pub(crate) use tx::TxBatch;

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
    session: u16,
    slot: u8,
    req_num: u64,
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

/// Why a request did not complete normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The response is larger than the response buffer given with the request.
    #[error("response of {size} bytes does not fit the {capacity}-byte response buffer")]
    ResponseTooLarge {
        /// Response size.
        size: usize,
        /// Response buffer capacity.
        capacity: usize,
    },
    /// The session never connected (the request was waiting for it).
    #[error("session {session} failed to connect: {err}")]
    ConnectFailed {
        /// Session number.
        session: SessionNum,
        /// The SM error.
        err: SmErr,
    },
    /// The session's connect request went unanswered for the connect
    /// timeout (the request was waiting for it).
    #[error("session {session} timed out connecting")]
    TimedOut {
        /// Session number.
        session: SessionNum,
    },
    /// The server's host name does not resolve (the SM link's lookup
    /// found no IPv4 address), so the session could not connect (the
    /// request was waiting for it) and is gone. The request did not run.
    #[error("session {session} failed to connect: the server's host name does not resolve")]
    HostNotFound {
        /// Session number.
        session: SessionNum,
    },
    /// The remote process (or its Rpc) was declared failed: it answered
    /// no keep-alive ping for the failure timeout, restarted, or dropped
    /// the Rpc. The session is gone. The request may or may not have run.
    #[error("the peer of session {session} failed")]
    PeerFailed {
        /// Session number.
        session: SessionNum,
    },
    /// The session was reset ([`Rpc::reset_session`] or fault injection).
    /// The request may or may not have run.
    #[error("session {session} was reset")]
    SessionReset {
        /// Session number.
        session: SessionNum,
    },
    /// [`Rpc::destroy_session`] was called with the request outstanding.
    /// The request may or may not have run.
    #[error("session {session} was destroyed")]
    SessionDestroyed {
        /// Session number.
        session: SessionNum,
    },
    /// The session, to a C++ eRPC peer, used up its 44-bit request
    /// numbers (2^44 requests; a C++ server cannot follow a wrap) and was
    /// reset. The request that found no number was not sent; requests in
    /// flight on the session at that moment may or may not have run.
    /// Create a new session. Sessions between erpc-rs peers wrap instead
    /// and never end this way.
    #[error("session {session} ran out of request numbers; create a new session")]
    ReqNumsExhausted {
        /// Session number.
        session: SessionNum,
    },
    /// The server reclaimed the session: it had received no request on it
    /// (`unused_session_reclaim_ms`), or none for a long time
    /// (`idle_session_reclaim_ms`), and needed its RX ring entries for
    /// another session. The request did not run. Create a new session.
    #[error("the server reclaimed session {session}, unused; create a new session")]
    ServerReclaimed {
        /// Session number.
        session: SessionNum,
    },
    /// The server ended the session without being asked: its application
    /// reset it, or it declared this client failed (e.g. after losing
    /// session-management packets one way). The session is gone; the
    /// request may or may not have run. Create a new session.
    #[error("the server ended session {session}; create a new session")]
    ServerEnded {
        /// Session number.
        session: SessionNum,
    },
    /// A request of the session got nothing back from the server for
    /// [`RpcConfig::stall_timeout_ms`] although the server was not declared
    /// failed: the server's Rpc stopped running, only the data path to it
    /// is cut, or (toward a C++ eRPC server, which cannot say "in
    /// progress") its handler ran longer than the bound. The session is
    /// gone; the request may or may not have run. Create a new session.
    #[error(
        "a request of session {session} got no answer for the stall bound; the session is gone"
    )]
    Stalled {
        /// Session number.
        session: SessionNum,
    },
    /// The server answered the request with an error instead of a
    /// response (erpc-rs servers only; see [`ServerError`] for whether the
    /// request ran).
    #[error("the server of session {session} failed the request: {err}")]
    Server {
        /// Session number.
        session: SessionNum,
        /// What the server said.
        err: ServerError,
    },
}

/// Why a server failed a request, as its status packet says (see
/// [`RpcError::Server`]). An erpc-rs server sends one where a C++ eRPC
/// server drops the request and its client retries forever; it sends it
/// only to erpc-rs clients (a C++ client would read the packet as a
/// response). A duplicate of the request gets the same answer again: the
/// handler never runs twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// No handler is registered for the request type at the server. The
    /// request did not run.
    #[error("no handler for the request type")]
    NoHandler,
    /// The server had no memory for the request (reassembly, or the copy
    /// handed to a worker thread). The request did not run; it may succeed
    /// if sent again later.
    #[error("the server had no memory for the request")]
    OutOfMemory,
    /// The request's background handler panicked. It may have done part
    /// of its work. The worker thread lives on.
    #[error("the handler panicked")]
    HandlerPanicked,
    /// The request's packets stopped arriving before it was whole, for
    /// the server's stall bound; the server freed what it had received.
    /// The request did not run.
    #[error("the request's packets stopped arriving before it was whole")]
    Incomplete,
    /// The request's burst handler ([`crate::BurstHandler`]) returned
    /// without taking it ([`crate::Burst::take`]). The request did not
    /// run.
    #[error("the burst handler did not take the request")]
    Declined,
    /// A status this version does not know (a newer server's).
    #[error("unknown status {0}")]
    Other(u8),
}

impl ServerError {
    /// The status code on the wire (`pkthdr::STATUS_SIZE_BASE` + code).
    /// Code 0 is reserved for "in progress", never an error.
    pub(crate) fn code(self) -> u8 {
        match self {
            ServerError::NoHandler => 1,
            ServerError::OutOfMemory => 2,
            ServerError::HandlerPanicked => 3,
            ServerError::Incomplete => 4,
            ServerError::Declined => 5,
            ServerError::Other(c) => c,
        }
    }

    /// The error a status code names (`None` for code 0, "in progress").
    pub(crate) fn from_code(code: u8) -> Option<ServerError> {
        Some(match code {
            0 => return None,
            1 => ServerError::NoHandler,
            2 => ServerError::OutOfMemory,
            3 => ServerError::HandlerPanicked,
            4 => ServerError::Incomplete,
            5 => ServerError::Declined,
            c => ServerError::Other(c),
        })
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
    /// The session could not be connected (and is gone).
    ConnectFailed(SmErr),
    /// The connect request went unanswered for the connect timeout (the
    /// session is gone).
    ConnectTimedOut,
    /// The server's host name does not resolve: the SM link's lookup
    /// found no IPv4 address (the session is gone, and requests waiting
    /// for it completed with [`RpcError::HostNotFound`]). Reported as soon
    /// as the lookup answers, not after the connect timeout.
    HostNotFound,
    /// The session was disconnected (and is gone).
    Disconnected,
    /// The remote end was declared failed; the session is gone and its
    /// requests completed with [`RpcError::PeerFailed`]. A new session to
    /// the same URI may be created (e.g. when the process restarts).
    PeerFailed,
    /// The session was reset locally ([`Rpc::reset_session`], fault
    /// injection) and is gone.
    Reset,
    /// The session, to a C++ eRPC peer, ran out of request numbers and is
    /// gone (see [`RpcError::ReqNumsExhausted`]).
    ReqNumsExhausted,
    /// The server reclaimed the session, which had sent it no request,
    /// because it needed the RX ring entries (see
    /// [`RpcError::ServerReclaimed`]). The session is gone.
    ServerReclaimed,
    /// The server ended the session without being asked (see
    /// [`RpcError::ServerEnded`]). The session is gone.
    ServerEnded,
    /// A request of the session got no answer for the stall bound (see
    /// [`RpcError::Stalled`]). The session is gone.
    Stalled,
}

impl fmt::Display for SessionEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionEventKind::Connected => f.write_str("connected"),
            SessionEventKind::ConnectFailed(e) => write!(f, "connect failed: {e}"),
            SessionEventKind::ConnectTimedOut => f.write_str("connect timed out"),
            SessionEventKind::HostNotFound => {
                f.write_str("connect failed: the server's host name does not resolve")
            }
            SessionEventKind::Disconnected => f.write_str("disconnected"),
            SessionEventKind::PeerFailed => f.write_str("peer failed"),
            SessionEventKind::Reset => f.write_str("reset"),
            SessionEventKind::ReqNumsExhausted => f.write_str("request numbers exhausted"),
            SessionEventKind::ServerReclaimed => f.write_str("reclaimed by the server"),
            SessionEventKind::ServerEnded => f.write_str("ended by the server"),
            SessionEventKind::Stalled => f.write_str("stalled"),
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
    /// [`crate::cc::CcConfig::swift`] (the name predates the second
    /// controller; `None` with congestion control off).
    pub timely_gbps: Option<f64>,
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

/// Rpc settings.
///
/// # On a busy machine
///
/// The timeouts below are wall time, and eRPC polls: an Rpc whose thread
/// is descheduled neither sends, receives nor answers. The defaults (a
/// 5 ms retransmission timeout, a 500 ms failure timeout) assume a
/// dedicated core per polling thread, as the paper's did; give each
/// polling thread one (`taskset`, `isolcpus`, or no more busy threads
/// than cores) and nothing needs changing. On a shared machine a thread
/// can be off its core for hundreds of milliseconds (436 ms was seen on a
/// loaded 2-core VM): the client then retransmits requests that were not
/// lost (about one per request in that run, with no packet dropped) and a
/// healthy peer can be declared failed. There, raise
/// [`rto_us`](Self::rto_us) well above the scheduling delays (tens of
/// milliseconds) and the Nexus's failure timeout
/// ([`NexusBuilder::failure_timeout_ms`](crate::NexusBuilder::failure_timeout_ms))
/// to a few seconds, knowing that a lost packet and a failed peer are
/// then noticed that much later.
#[derive(Debug, Clone, Copy)]
pub struct RpcConfig {
    /// Packet credits per session (default 32).
    pub session_credits: usize,
    /// Transport type this Rpc presents in session management (default
    /// Raw, the C++ raw-Ethernet transport's). A C++ eRPC peer needs its
    /// own type here: `Dpdk` toward a C++ DPDK process (over our UDP or
    /// mlx5 transport), `Raw` toward a C++ raw-transport process (mlx5
    /// only). A server refuses C++ clients of another type, as C++ does;
    /// erpc-rs peers accept each other's `Raw` and `Dpdk` (see the
    /// README's "Talking to C++ eRPC").
    pub transport_type: TransportType,
    /// SM request retry interval (default 100 ms).
    pub sm_retry_ms: u64,
    /// Retransmission timeout of a client slot (default 5 ms): a request
    /// with packets unacknowledged that made no progress for this long is
    /// rolled back to the last acknowledged packet and retransmitted. It
    /// is wall time: a descheduled client or server makes requests look
    /// lost, so on a shared machine raise it above the scheduling delays
    /// (see "On a busy machine" above).
    pub rto_us: u64,
    /// How often the event loop scans client slots for the retransmission
    /// timeout (default 0.5 ms); also the granularity of the SM timers
    /// (retries, connect and disconnect timeouts).
    pub pkt_loss_scan_us: u64,
    /// A connect request unanswered for this long fails the session with
    /// [`SessionEventKind::ConnectTimedOut`]; an unanswered disconnect
    /// request frees the session locally (default 500 ms, the failure
    /// timeout). Peers are declared failed by the Nexus's own failure
    /// timeout ([`NexusBuilder::failure_timeout_ms`](crate::NexusBuilder::failure_timeout_ms)),
    /// not by this one; raise both on a shared machine (see "On a busy
    /// machine" above).
    pub failure_timeout_ms: u64,
    /// The stall bound (default 10 s, `consts::STALL_TIMEOUT_MS`): a
    /// request that got nothing back for this long (no credit return, no
    /// response packet, no "in progress" notice) fails with its session,
    /// [`RpcError::Stalled`]. Time in which this Rpc's event loop did not
    /// run (the thread was descheduled, or the application did not poll)
    /// is not counted. It is the bound on how long any continuation waits
    /// when the peer's Nexus still answers pings but its Rpc does not run,
    /// or only the data path is cut, and the only failure detection toward
    /// a C++ eRPC peer, which cannot be pinged: an erpc-rs server answers
    /// a retransmission of a request its handler still runs with an "in
    /// progress" notice, so a slow handler there never stalls a request; a
    /// C++ server cannot, so toward one this is also the longest a handler
    /// may take. `None`: no bound (a request waits as long as the peer is
    /// not declared failed). Descheduled time is not counted, so a busy
    /// machine does not need a larger one.
    pub stall_timeout_ms: Option<u64>,
    /// Congestion control: Timely, the timing wheel and their bypasses
    /// (all on by default).
    pub cc: crate::cc::CcConfig,
    /// Hand dispatch handlers their single-packet requests in place in the
    /// RX ring (default on). Off, each is first copied into a msgbuf (for
    /// measuring what zero-copy RX saves).
    pub zero_copy_rx: bool,
    /// Answer single-packet responses from each server slot's preallocated
    /// MTU-size buffer (default on). Off, `response_buffer` allocates every
    /// response (for measuring what preallocation saves).
    pub prealloc_responses: bool,
    /// Connect requests that would create a session, per source (the host
    /// they came from, whatever client URI they name): a burst of this many (`None`, the default:
    /// as many sessions as the RX ring holds at `session_credits`, at
    /// least 256, so one client may always fill an empty Rpc at once;
    /// `Some(0)`: no limit) ...
    pub connect_burst_per_source: Option<u32>,
    /// ... refilled at this many a second (default 128). Requests over the
    /// limit are dropped unanswered (the client retries). See
    /// `rpc/admission.rs` and the README's "Session management and
    /// hostile networks".
    pub connects_per_sec_per_source: u32,
    /// The RX ring entries the server sessions of one source host may hold
    /// at once (`None`, the default: no limit, so one client host may use
    /// the whole Rpc; `Some(n)`: so that one host always leaves room for
    /// others, e.g. the ring less a few sessions' worth). A connect request
    /// beyond it is refused with "RX ring exhausted".
    pub ring_entries_per_source: Option<usize>,
    /// The least credits (RX ring entries) a server reserves for an
    /// erpc-rs client's session, whatever fewer it asks for (default 8;
    /// never more than `session_credits`): a host cannot hold thousands of
    /// sessions by asking for one credit each. The client still uses no
    /// more credits than it asked for.
    pub min_session_credits: usize,
    /// When a new session finds the RX ring short, server sessions that
    /// never received a request and are at least this old are reclaimed,
    /// oldest first (default 10 s; `None`: never). An erpc-rs client is
    /// told ([`SessionEventKind::ServerReclaimed`]); a C++ client cannot
    /// be, and its next request on that session goes unanswered.
    pub unused_session_reclaim_ms: Option<u64>,
    /// When a new session finds the RX ring short and no unused session
    /// can be reclaimed, server sessions of erpc-rs clients that served
    /// requests but received none for this long, and run none, are
    /// reclaimed, least recently used first (default 60 s; `None`:
    /// never). The client, if it is alive, is told
    /// ([`SessionEventKind::ServerReclaimed`]); its next request would not
    /// have run. A C++ client's sessions are never reclaimed this way.
    pub idle_session_reclaim_ms: Option<u64>,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            session_credits: SESSION_CREDITS,
            transport_type: TransportType::Raw,
            sm_retry_ms: SM_RETRY_MS,
            rto_us: RTO_US,
            pkt_loss_scan_us: PKT_LOSS_SCAN_US,
            failure_timeout_ms: FAILURE_TIMEOUT_MS,
            stall_timeout_ms: Some(STALL_TIMEOUT_MS),
            cc: crate::cc::CcConfig::default(),
            zero_copy_rx: true,
            prealloc_responses: true,
            connect_burst_per_source: None,
            connects_per_sec_per_source: CONNECTS_PER_SEC_PER_SOURCE,
            ring_entries_per_source: None,
            min_session_credits: MIN_SESSION_CREDITS,
            unused_session_reclaim_ms: Some(UNUSED_SESSION_RECLAIM_MS),
            idle_session_reclaim_ms: Some(IDLE_SESSION_RECLAIM_MS),
        }
    }
}

/// Rpc creation failed.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Rpc id above 254, or already used in this Nexus.
    #[error("Rpc id {0} is invalid (max {MAX_RPC_ID}) or already in use in this Nexus")]
    RpcId(u8),
    /// A dispatch handler was registered for another transport/context type.
    #[error(
        "the handler for request type {req_type} was registered as {registered}, \
         but this Rpc needs {expected}"
    )]
    HandlerType {
        /// Request type.
        req_type: u8,
        /// Type the handler was registered with.
        registered: &'static str,
        /// Type this Rpc needs.
        expected: &'static str,
    },
    /// Credits outside `1..=ring entries`.
    #[error("session credits {credits} must be in 1..={ring_entries} (RX ring entries)")]
    Credits {
        /// Configured credits.
        credits: usize,
        /// RX ring entries.
        ring_entries: usize,
    },
    /// The transport's TX burst limit is zero or too large.
    #[error("transport tx_burst_max {0} must be in 1..={max}", max = crate::consts::MAX_TX_BATCH)]
    TxBurst(usize),
    /// Loss-recovery timing out of range.
    #[error(
        "retransmission timeout {rto_us} us and loss scan interval {scan_us} us must be \
         non-zero with the scan shorter than the timeout"
    )]
    LossTiming {
        /// Configured retransmission timeout.
        rto_us: u64,
        /// Configured scan interval.
        scan_us: u64,
    },
    /// A retransmission timeout so short that a slot could roll back 255
    /// times while a stale packet of it waits in the timing wheel.
    #[error(
        "retransmission timeout {rto_us} us: with congestion control on it must be at least \
         {min_us} us (the timing wheel's horizon / 255)"
    )]
    RtoBelowWheel {
        /// Configured retransmission timeout.
        rto_us: u64,
        /// The least it may be.
        min_us: u64,
    },
    /// Congestion-control settings out of range.
    #[error(
        "congestion control: link rate {link_gbps} Gbit/s must be at least Timely's minimum \
         rate {min_rate_mbps} MB/s (the timing wheel's horizon is sized for it)"
    )]
    CcConfig {
        /// Configured link rate.
        link_gbps: f64,
        /// Timely's minimum rate.
        min_rate_mbps: f64,
    },
    /// The transport's RX ring handle was taken before the Rpc got it.
    #[error("the transport's RX ring handle was already taken: give the Rpc a fresh transport")]
    RingTaken,
    /// Hugepage memory for control packets.
    #[error(transparent)]
    Alloc(#[from] mempool::AllocError),
}

/// `enqueue_request` refused; the buffers come back.
#[derive(Debug, thiserror::Error)]
#[error("cannot enqueue request on session {session}: {kind}")]
pub struct EnqueueError {
    /// Why.
    pub kind: EnqueueErrorKind,
    /// The session number given.
    pub session: SessionNum,
    /// The request buffer, returned.
    pub req: MsgBuf,
    /// The response buffer, returned.
    pub resp: MsgBuf,
}

/// Why `enqueue_request` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueErrorKind {
    /// No such session.
    #[error("no such session")]
    NoSuchSession,
    /// A server session (requests go out on client sessions).
    #[error("it is a server session")]
    NotClient,
    /// The session is being disconnected.
    #[error("the session is disconnecting")]
    Disconnecting,
}

/// `enqueue_response` refused (the response buffer is recycled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RespondError {
    /// The session is gone or the slot moved on to another request.
    #[error("request {req_num} on session {session} is no longer awaiting a response")]
    Stale {
        /// Session.
        session: SessionNum,
        /// Request number.
        req_num: u64,
    },
    /// No memory for the response.
    #[error("no memory for a {0}-byte response")]
    OutOfMemory(usize),
    /// The session was reset (its client failed or went away) while the
    /// handler ran: there is nobody to respond to. The response buffer is
    /// recycled.
    #[error("session {session} was reset; the response to request {req_num} is discarded")]
    SessionReset {
        /// Session.
        session: SessionNum,
        /// Request number.
        req_num: u64,
    },
}

/// Session creation or destruction failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Bad URI.
    #[error(transparent)]
    Uri(#[from] crate::nexus::NexusError),
    /// The remote URI is malformed (see [`crate::Uri::parse_remote`]).
    #[error("bad remote URI {uri:?}: {why}")]
    BadUri {
        /// The URI given.
        uri: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A session to ourselves.
    #[error("cannot create a session from Rpc {rpc_id} at {uri} to itself")]
    SelfConnect {
        /// Our URI.
        uri: crate::Uri,
        /// Our Rpc id.
        rpc_id: u8,
    },
    /// Remote Rpc id out of range.
    #[error("remote Rpc id {0} is invalid (max {MAX_RPC_ID})")]
    RemoteRpcId(u8),
    /// Each session reserves credits' worth of RX ring entries.
    #[error(
        "RX ring exhausted: {ring_entries} entries, {available} unreserved, a session needs \
         {credits} ({sessions} sessions open); at most ring entries / credits sessions per Rpc"
    )]
    RingExhausted {
        /// Ring entries.
        ring_entries: usize,
        /// Entries not reserved.
        available: usize,
        /// Credits per session.
        credits: usize,
        /// Open sessions.
        sessions: usize,
    },
    /// All 65535 session numbers are in use.
    #[error("no free session number")]
    NoSessionNum,
    /// No such client session.
    #[error("no client session {0}")]
    NoSuchSession(SessionNum),
    /// The session is not connected.
    #[error("session {session} is {state:?}, not connected")]
    NotConnected {
        /// Session.
        session: SessionNum,
        /// Its state.
        state: crate::SessionState,
    },
    /// No such session (client or server).
    #[error("no session {0}")]
    NoSession(SessionNum),
}

enum HandlerSlot<T: Transport, C> {
    None,
    Dispatch(ReqHandler<T, C>),
    Background,
    /// Requests gathered per RX burst (`burst.rs`).
    Burst(BurstHandler<T, C>),
}

// Manual impls: a fn pointer is `Copy` whatever `T` and `C` are.
impl<T: Transport, C> Clone for HandlerSlot<T, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Transport, C> Copy for HandlerSlot<T, C> {}

/// State for background handlers.
struct BgState {
    /// This Rpc's links to the Nexus's workers (`nexus::workers`): where
    /// jobs go and come back, and how many are out.
    links: BgLinks,
    /// Jobs no worker could take yet (or inline jobs to run).
    backlog: VecDeque<Job>,
    /// Recycled heap buffers for large background responses (boxed as
    /// they travel in jobs, see `nexus::Job::large`).
    #[allow(clippy::vec_box)]
    scratch: Vec<Box<Vec<u8>>>,
}

/// An eRPC endpoint: one per thread, made with [`Rpc::new`]. See the crate
/// documentation.
///
/// Its methods, in the order below: sessions ([`Rpc::create_session`]),
/// requests ([`Rpc::enqueue_request`], completed in continuations), the
/// event loop ([`Rpc::run_event_loop_once`]), responses
/// ([`Rpc::respond`], [`Rpc::enqueue_response`]) and session resets; then
/// creation, settings, counters and session state, and message buffers
/// ([`Rpc::alloc_msg_buffer`]); last the test hooks (`fault_*`) and the
/// debug endpoint's view.
pub struct Rpc<T: Transport, C> {
    transport: T,
    /// The RX ring reader; taken out while the RX loop runs.
    ring: Option<T::Ring>,
    ring_entries: usize,
    rx_head: usize,
    alloc: Allocator,
    nexus: Arc<Nexus>,
    rpc_id: u8,
    clock: Clock,
    now_ns: u64,
    config: RpcConfig,
    sessions: session::SessionTable<Session<T, C>>,
    free_session_nums: VecDeque<(u16, u64)>,
    open_sessions: usize,
    ring_entries_available: usize,
    /// One entry per request type: indexed by a `u8`, no bounds check.
    handlers: Box<[HandlerSlot<T, C>; 256]>,
    /// Single-packet requests of burst types queued during the current RX
    /// burst (`burst.rs`); its capacity, allocated once, is fixed (none
    /// without a burst handler).
    burst_pending: Vec<burst::Pending>,
    sm_handler: Option<SessionHandler<T, C>>,
    sm_queue: Arc<SmQueue>,
    /// Client sessions with an SM request outstanding.
    sm_pending: Vec<u16>,
    /// Server sessions by the client's unique token.
    token_map: HashMap<u64, u16>,
    /// Tokens of server sessions freed recently.
    retired_tokens: tokens::RetiredTokens,
    /// Client connects that timed out, cleaned up at the server if it
    /// answers late.
    abandoned: Vec<sm_handlers::AbandonedConnect>,
    tx: TxBatch<T::Route>,
    /// Header slots of control packets (always `Some` until drop).
    ctrl: Option<Buffer>,
    ctrl_next: usize,
    /// Control header slots (a power of two; see `Rpc::new`).
    ctrl_bufs: usize,
    tx_burst_max: usize,
    /// Client slots waiting for credits: (session, slot).
    stallq: Vec<(u16, u8)>,
    /// Client sessions with requests (what the loss scan visits), and
    /// what only they need (`active.rs`).
    active: active::Active,
    /// Session events and error continuations owed to the application,
    /// paid at the next event-loop iteration.
    owed: VecDeque<reset::Owed<T, C>>,
    /// Connect requests per source (`admission.rs`).
    connect_limiter: admission::ConnectLimiter,
    /// The burst of that limiter (0: no limit; see
    /// `RpcConfig::connect_burst_per_source`).
    connect_burst: u32,
    /// The server sessions of each source host (admission).
    source_shares: admission::SourceShares,
    /// Ring entries one source's server sessions may hold (0: no limit).
    ring_share_per_source: usize,
    /// Server sessions ended without their erpc-rs client's disconnect
    /// (reclaimed ones with their numbers reserved for a while): the
    /// notices their clients get again (`admission.rs`).
    notices: VecDeque<admission::Notice>,
    /// Server slots that began a multi-packet request, as (session, slot,
    /// request number): the sweep frees a reassembly whose packets
    /// stopped coming (`req.rs`, `expire_reassembly`).
    reassembling: Vec<(SessionNum, u8, u64)>,
    /// Idle served sessions that may be reclaimed, as (last request,
    /// session, token), least recently used last (`admission.rs`).
    idle_candidates: Vec<(u64, SessionNum, u64)>,
    /// When the sessions were last walked for those (0: never).
    last_idle_walk_ns: u64,
    /// Server sessions that may not have served a request yet, in
    /// creation order, as (session, client token, probes sent)
    /// (`admission.rs`).
    unserved: VecDeque<(SessionNum, u64, u8)>,
    /// When `probe_unserved` looks at them next.
    next_probe_round_ns: u64,
    /// Test hook: request-number base of sessions made from now on
    /// (`Rpc::fault_set_req_base`).
    req_base_override: Option<u64>,
    /// When the loss scan runs next (a scan interval after the last one:
    /// a deadline is one compare per iteration).
    next_loss_scan_ns: u64,
    /// The drop counts last logged (`rpc/loss.rs`, `log_drops`).
    drops_logged: crate::stats::DropCounts,
    rto_ns: u64,
    loss_scan_ns: u64,
    /// The last loss scan was put off because the event loop had not run
    /// for a scan interval (`ev_loop.rs`, `defer_late_scan`): the next one
    /// runs whenever it is due.
    loss_scan_deferred: bool,
    /// The timing wheel (congestion control on).
    wheel: Option<crate::cc::TimingWheel>,
    /// The controller parameters every session shares.
    cc_shared: crate::cc::CcShared,
    /// How bursts are paced (from the configuration; `cc_on` exactly when
    /// `wheel` is `Some`): one byte for the hot paths to test.
    pacing: cc::Pacing,
    /// TX timestamps per client slot (a power of two ≥ the credits).
    tx_ts_cap: usize,
    bg: BgState,
    /// Which of the credit-stall queue, background jobs and the timing
    /// wheel may have work ([`ev_loop::PENDING_STALLQ`] and co.): set
    /// where work is queued, recomputed from the queues after the event
    /// loop has looked at them, so that an idle iteration tests one byte
    /// instead of each queue. A bit may be set with nothing to do (one
    /// wasted call), never clear with something to do (debug builds
    /// check it at every iteration).
    pending: u8,
    /// [`ev_loop::GATE_IN_LOOP`] and [`ev_loop::GATE_OWED`]: what an
    /// iteration's start must look at besides RX (one byte tested).
    gate: u8,
    stats: RpcStats,
    /// Debug-endpoint publication (`crate::inspect`), if the Nexus is exposed.
    pub(crate) inspect: Option<debug_endpoint::Publisher<crate::inspect::RpcRaw>>,
    _not_send: PhantomData<*const ()>,
}

impl<T: Transport, C> fmt::Debug for Rpc<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Rpc {{ id {}, uri {}, {} sessions, {} }}",
            self.rpc_id,
            self.nexus.uri(),
            self.open_sessions,
            self.stats
        )
    }
}

/// Bytes per control-packet header slot in the control buffer.
const CTRL_SLOT_BYTES: usize = 64;
const _: () = assert!(CTRL_SLOT_BYTES >= transport::PKTHDR_BYTES);

impl<T: Transport + 'static, C: 'static> Rpc<T, C> {
    /// Creates an Rpc with id `rpc_id` on `nexus`, owning `transport` and
    /// the hugepage allocator `alloc` (registered with the transport's DMA
    /// mapper). Copies the Nexus's handler table.
    pub fn new(
        nexus: &Arc<Nexus>,
        rpc_id: u8,
        mut transport: T,
        mut alloc: Allocator,
        mut config: RpcConfig,
        sm_handler: Option<SessionHandler<T, C>>,
    ) -> Result<Rpc<T, C>, CreateError> {
        if config.cc.enabled && !transport.rtt_is_network() && !config.cc.on_software_stack {
            // See `CcConfig::on_software_stack`.
            tracing::info!(
                rpc_id,
                "congestion control off: this transport's round trips are a host software \
                 stack's (set cc.on_software_stack to run it anyway)"
            );
            config.cc.enabled = false;
        }
        let ring = transport.take_rx_ring().ok_or(CreateError::RingTaken)?;
        let ring_entries = ring.entries();
        if config.session_credits == 0 || config.session_credits > ring_entries {
            return Err(CreateError::Credits {
                credits: config.session_credits,
                ring_entries,
            });
        }
        let tx_burst_max = transport.tx_burst_max();
        if tx_burst_max == 0 || tx_burst_max > crate::consts::MAX_TX_BATCH {
            return Err(CreateError::TxBurst(tx_burst_max));
        }
        let cc = &config.cc;
        if cc.enabled
            && !(cc.link_rate().is_finite()
                && cc.timely.min_rate > 0.0
                && cc.link_rate() >= cc.timely.min_rate)
        {
            return Err(CreateError::CcConfig {
                link_gbps: cc.link_gbps,
                min_rate_mbps: cc.timely.min_rate / 1e6,
            });
        }
        if config.rto_us == 0
            || config.pkt_loss_scan_us == 0
            || config.pkt_loss_scan_us >= config.rto_us
        {
            return Err(CreateError::LossTiming {
                rto_us: config.rto_us,
                scan_us: config.pkt_loss_scan_us,
            });
        }
        // A slot's wheel entries carry an 8-bit rollback generation: a
        // stale entry must leave the wheel (within its horizon) before the
        // slot's generation comes round again, at most one rollback per
        // retransmission timeout.
        if cc.enabled {
            let horizon_us = cc.wheel().horizon_ns.div_ceil(1000);
            let min_us = horizon_us.div_ceil(u64::from(u8::MAX)) + 1;
            if config.rto_us < min_us {
                return Err(CreateError::RtoBelowWheel {
                    rto_us: config.rto_us,
                    min_us,
                });
            }
        }
        let mut handlers = Box::new([HandlerSlot::None; 256]);
        for (t, slot) in handlers.iter_mut().enumerate() {
            match nexus.handler(t as u8) {
                None => {}
                Some(HandlerEntry::Background(_)) => *slot = HandlerSlot::Background,
                Some(HandlerEntry::Burst { func, type_name }) => {
                    match func.downcast_ref::<BurstHandler<T, C>>() {
                        Some(f) => *slot = HandlerSlot::Burst(*f),
                        None => {
                            return Err(CreateError::HandlerType {
                                req_type: t as u8,
                                registered: type_name,
                                expected: std::any::type_name::<BurstHandler<T, C>>(),
                            });
                        }
                    }
                }
                Some(HandlerEntry::Dispatch { func, type_name }) => {
                    match func.downcast_ref::<ReqHandler<T, C>>() {
                        Some(f) => *slot = HandlerSlot::Dispatch(*f),
                        None => {
                            return Err(CreateError::HandlerType {
                                req_type: t as u8,
                                registered: type_name,
                                expected: std::any::type_name::<ReqHandler<T, C>>(),
                            });
                        }
                    }
                }
            }
        }
        let burst_pending = if handlers.iter().any(|h| matches!(h, HandlerSlot::Burst(_))) {
            Vec::with_capacity(ring_entries.min(crate::consts::MAX_BURST_PENDING))
        } else {
            Vec::new()
        };
        let sm_queue = nexus
            .register_rpc(rpc_id)
            .ok_or(CreateError::RpcId(rpc_id))?;
        // Control headers are rewritten only after `ctrl_bufs` later
        // control packets: at least twice what the transport may still
        // hold unread (its send queue), so none is rewritten under the NIC.
        let ctrl_bufs = (2 * transport.tx_depth())
            .max(CTRL_BUFS)
            .next_power_of_two();
        let ctrl = match alloc.alloc(ctrl_bufs * CTRL_SLOT_BYTES) {
            Ok(c) => c,
            Err(e) => {
                nexus.unregister_rpc(rpc_id);
                return Err(e.into());
            }
        };
        let clock = nexus.clock().clone();
        let now_ns = clock.now_ns();
        Ok(Rpc {
            transport,
            ring: Some(ring),
            ring_entries,
            rx_head: 0,
            alloc,
            nexus: nexus.clone(),
            rpc_id,
            clock,
            now_ns,
            config,
            sessions: session::SessionTable::new(),
            free_session_nums: VecDeque::new(),
            open_sessions: 0,
            ring_entries_available: ring_entries,
            handlers,
            burst_pending,
            sm_handler,
            sm_queue,
            sm_pending: Vec::new(),
            token_map: HashMap::new(),
            retired_tokens: tokens::RetiredTokens::default(),
            abandoned: Vec::new(),
            tx: TxBatch::new(),
            ctrl: Some(ctrl),
            ctrl_next: 0,
            ctrl_bufs,
            tx_burst_max,
            stallq: Vec::with_capacity(64),
            active: active::Active::new(config.session_credits.next_power_of_two()),
            owed: VecDeque::new(),
            req_base_override: None,
            connect_limiter: admission::ConnectLimiter::default(),
            source_shares: admission::SourceShares::default(),
            ring_share_per_source: config.ring_entries_per_source.unwrap_or(0),
            connect_burst: config.connect_burst_per_source.unwrap_or_else(|| {
                u32::try_from(ring_entries / config.session_credits)
                    .unwrap_or(u32::MAX)
                    .max(CONNECT_BURST_PER_SOURCE)
            }),
            notices: VecDeque::new(),
            reassembling: Vec::new(),
            idle_candidates: Vec::new(),
            last_idle_walk_ns: 0,
            unserved: VecDeque::new(),
            next_probe_round_ns: 0,
            next_loss_scan_ns: now_ns + config.pkt_loss_scan_us * 1000,
            drops_logged: Default::default(),
            rto_ns: config.rto_us * 1000,
            loss_scan_ns: config.pkt_loss_scan_us * 1000,
            loss_scan_deferred: false,
            wheel: config
                .cc
                .enabled
                .then(|| crate::cc::TimingWheel::new(config.cc.wheel(), now_ns)),
            pacing: cc::Pacing::new(&config.cc),
            cc_shared: crate::cc::CcShared::new(&config.cc),
            tx_ts_cap: config.session_credits.next_power_of_two(),
            bg: BgState {
                links: nexus.workers().connect(rpc_id),
                backlog: VecDeque::new(),
                scratch: Vec::new(),
            },
            pending: 0,
            gate: 0,
            stats: RpcStats::default(),
            inspect: nexus.inspect_publisher(rpc_id),
            _not_send: PhantomData,
        })
    }
}

/// The Rpc's identity, settings, counters and sessions, and its message
/// buffers.
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

    /// Counters.
    pub fn stats(&self) -> &RpcStats {
        &self.stats
    }

    /// The transport (for its counters).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The hugepage allocator's counters.
    pub fn alloc_stats(&self) -> mempool::AllocStats {
        self.alloc.stats()
    }

    /// Current time on this Rpc's clock.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Sessions open (client and server).
    pub fn num_sessions(&self) -> usize {
        self.open_sessions
    }

    /// Largest data per packet.
    pub fn max_data_per_pkt(&self) -> usize {
        MAX_DATA_PER_PKT
    }

    /// State of a session, if it exists.
    pub fn session_state(&self, sn: SessionNum) -> Option<crate::SessionState> {
        self.session(sn).map(|s| {
            if s.closing {
                SessionState::DisconnectInProgress
            } else {
                s.state
            }
        })
    }

    /// A snapshot of session `sn`.
    pub fn session_info(&self, sn: SessionNum) -> Option<SessionInfo> {
        let s = self.session(sn)?;
        let is_client = s.role == session::Role::Client;
        let now = self.clock.now_ns();
        Some(SessionInfo {
            session: sn,
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
            timely_gbps: s.cc.as_ref().map(|c| c.ctl().rate() * 8.0 / 1e9),
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
                        rx_pkts: (sv.state != session::SrvState::Idle).then_some(sv.num_rx),
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
        })
    }

    /// True for a client session, false for a server session, `None` if no
    /// such session.
    pub fn session_is_client(&self, sn: SessionNum) -> Option<bool> {
        self.session(sn).map(|s| s.role == session::Role::Client)
    }

    /// True if the client session is connected.
    pub fn is_connected(&self, sn: SessionNum) -> bool {
        self.session_state(sn) == Some(crate::SessionState::Connected)
    }

    /// Credits the client session has right now.
    pub fn session_credits(&self, sn: SessionNum) -> Option<usize> {
        self.session(sn).map(|s| s.credits as usize)
    }

    /// Requests in flight (in slots) plus queued in the backlog.
    pub fn outstanding_requests(&self, sn: SessionNum) -> Option<usize> {
        self.session(sn).map(|s| s.busy_slots() + s.backlog.len())
    }

    /// What the Rpc keeps for its active client sessions (see
    /// [`ActivePools`]): follows the sessions with requests, not the
    /// sessions open.
    pub fn active_pools(&self) -> ActivePools {
        let (spare_ts_arrays, wheel_sessions) = self.active.pooled();
        ActivePools {
            active_sessions: self.active.len(),
            spare_ts_arrays,
            wheel_sessions,
            wheel_pool_buckets: self.wheel.as_ref().map_or(0, |w| w.pool_buckets()),
        }
    }

    /// The timing wheel's counters (`None` with congestion control off).
    pub fn wheel_stats(&self) -> Option<crate::cc::WheelStats> {
        self.wheel.as_ref().map(|w| w.stats())
    }

    /// Go-back-N rollbacks on a session so far.
    pub fn session_retransmits(&self, sn: SessionNum) -> Option<u64> {
        self.session(sn).map(|s| s.retransmits)
    }

    /// Checks the credit invariant of every connected client session:
    /// credits plus unacknowledged packets of its slots equal the
    /// session's credits. For tests (deterministic simulation); returns a
    /// description of the first violation.
    pub fn check_credit_invariant(&self) -> Result<(), String> {
        for s in self.sessions.iter().flatten() {
            if s.role != session::Role::Client {
                continue;
            }
            let max = s.credits_max;
            let out: u32 = s
                .slots
                .iter()
                .zip(s.half.client().iter())
                .filter(|(sl, _)| sl.tx_msgbuf.is_some())
                .map(|(_, c)| c.num_tx - c.num_rx)
                .sum();
            if s.credits + out != max {
                return Err(format!(
                    "session {}: {} credits + {} unacknowledged != {}",
                    s.local_num, s.credits, out, max
                ));
            }
        }
        Ok(())
    }

    /// RX ring entries not reserved by sessions, and the ring's size (each
    /// open session reserves its credits' worth).
    pub fn rx_ring_unreserved(&self) -> (usize, usize) {
        (self.ring_entries_available, self.ring_entries)
    }

    /// Session numbers of every session (client and server, any state).
    pub fn session_nums(&self) -> Vec<SessionNum> {
        self.sessions
            .iter()
            .flatten()
            .map(|s| s.local_num)
            .collect()
    }

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

    pub(crate) fn recycle(&mut self, m: MsgBuf) {
        if let Origin::PreallocResp { session, slot } = m.origin()
            && let Some(s) = self.sessions.session_mut(session)
            && let Some(sv) = s
                .half
                .as_server_mut()
                .and_then(|a| a.get_mut(usize::from(slot)))
            && sv.pre_resp.is_none()
        {
            sv.pre_resp = Some(m);
            return;
        }
        self.alloc.free(m.into_buffer());
    }

    /// Test hook (`testing` feature): the fuzz harness's view of live
    /// state: each session's number, its SM token, and its slots' current
    /// request numbers.
    #[cfg(feature = "testing")]
    pub fn live_sessions(
        &self,
    ) -> impl Iterator<Item = (SessionNum, u64, [u64; crate::consts::SESSION_REQ_WINDOW])> + '_
    {
        self.sessions.iter().flatten().map(|s| {
            (
                s.local_num,
                s.uniq_token,
                std::array::from_fn(|i| s.slots[i].cur_req_num),
            )
        })
    }

    #[inline]
    pub(crate) fn session(&self, sn: SessionNum) -> Option<&Session<T, C>> {
        self.sessions.session(sn)
    }

    #[inline]
    pub(crate) fn session_mut(&mut self, sn: SessionNum) -> Option<&mut Session<T, C>> {
        self.sessions.session_mut(sn)
    }
}

impl<T: Transport, C> Drop for Rpc<T, C> {
    /// Gives everything back: sessions stop being pinged, connected (or
    /// disconnecting) client sessions get one best-effort disconnect
    /// request, which the Nexus repeats a few times (the server frees
    /// its end if it arrives; otherwise its keep-alive notices this Rpc is
    /// gone), background jobs still at workers are waited for (those not
    /// started come back unrun; a running handler is waited for at most
    /// [`crate::NexusBuilder::worker_drop_wait`], then abandoned with its
    /// buffers), and every other buffer returns to the allocator. Owed continuations do not run (there
    /// is no context); their buffers are freed.
    fn drop(&mut self) {
        let connected: Vec<u16> = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| {
                // A disconnect under way too: its request (or the answer)
                // may have been lost, and this Rpc retries it no more.
                s.role == session::Role::Client
                    && matches!(
                        s.state,
                        SessionState::Connected | SessionState::DisconnectInProgress
                    )
            })
            .filter(|s| s.remote_incarnation != 0 || s.busy_slots() == 0)
            .map(|s| s.local_num)
            .collect();
        // (Not to a C++ server with requests of the session unfinished:
        // it cannot take one then. Its own failure detection frees them.)
        // The Nexus sends each again a few times (this Rpc cannot).
        let mut orphans = Vec::with_capacity(connected.len());
        for sn in connected {
            if let Some(p) = self.disconnect_pkt(sn) {
                self.stats.sm_tx += 1;
                self.nexus.sm_send(&p.0, &p.1);
                orphans.push(p);
            }
        }
        // A connect still unanswered may have made a server session: its
        // request goes again, and the answer, reaching the next Rpc with
        // this id, gets that session disowned (`disown_server_session`;
        // erpc-rs servers only).
        if self.nexus.sm_extensions() {
            let connecting: Vec<u16> = self
                .sessions
                .iter()
                .flatten()
                .filter(|s| s.state == SessionState::ConnectInProgress)
                .map(|s| s.local_num)
                .collect();
            orphans.extend(connecting.into_iter().filter_map(|sn| self.sm_req_pkt(sn)));
        }
        // The SM requests this Rpc was still repeating for sessions it
        // already freed (disconnects unanswered, connects given up): the
        // Nexus takes them over too, or a lost one would leave a server
        // session behind.
        orphans.extend(self.abandoned_pkts());
        let now = self.clock.now_ns();
        self.nexus
            .adopt_disconnects(orphans, now, self.config.sm_retry_ms * 1_000_000);
        self.nexus.unregister_rpc(self.rpc_id);
        // Let the transport let go of every buffer before they are freed.
        self.tx.clear();
        self.transport.tx_flush();
        let sessions = self.sessions.take_all();
        for s in sessions {
            let s = *s;
            if s.tracked {
                self.nexus
                    .router()
                    .untrack(&s.remote_uri, s.remote_rpc_id(), s.remote_incarnation);
            }
            let alloc = &mut self.alloc;
            s.into_buffers(|m| alloc.free(m.into_buffer()));
        }
        for o in std::mem::take(&mut self.owed) {
            if let reset::Owed::Failed(f) = o {
                self.alloc.free(f.req.into_buffer());
                self.alloc.free(f.resp.into_buffer());
            }
        }
        for j in std::mem::take(&mut self.bg.backlog) {
            self.alloc.free(j.req.into_buffer());
            self.alloc.free(j.resp.into_buffer());
        }
        // Jobs at workers come back (unrun if not started); a handler
        // still running after the Nexus's drop wait is abandoned, so this
        // never blocks forever.
        let alloc = &mut self.alloc;
        let left = self.bg.links.retire(self.nexus.workers(), |j| {
            alloc.free(j.req.into_buffer());
            alloc.free(j.resp.into_buffer());
        });
        if left != 0 {
            tracing::error!(
                jobs = left,
                "background handlers still running after the drop wait; abandoning their buffers"
            );
        }
        if let Some(ctrl) = self.ctrl.take() {
            self.alloc.free(ctrl);
        }
    }
}

// Fault injection for tests and benchmarks, compiled in always (as in the
// C++ `rpc_fault_inject.cc`, but never behind a build flag that CI does not
// build). When unused it costs one predictable branch per packet sent
// (`Session::fault_drop_tx`). Here, after every other method, because
// rustdoc lists a type's methods in source order (a child module's before
// this file's): the test hooks come last on the Rpc page.
/// Fault injection (test hooks): packets dropped on purpose, peers
/// declared failed, sessions reset, request numbers chosen.
impl<T: Transport, C> Rpc<T, C> {
    /// Drops the next `n` packets this Rpc sends on session `sn` (data,
    /// credit returns, requests for response) as if the network lost
    /// them: the transport counts them in `tx_dropped_on_purpose` and does
    /// not send them. Loss recovery has to repair the damage.
    pub fn fault_drop_tx(&mut self, sn: SessionNum, n: u32) -> Result<(), SessionError> {
        match self.session(sn) {
            Some(s) if s.state != SessionState::Resetting => {
                s.fault_drop_tx.set(n);
                Ok(())
            }
            _ => Err(SessionError::NoSession(sn)),
        }
    }

    /// Declares the remote Nexus at `uri` (`host:port`) failed in this
    /// process, as if it had stopped answering keep-alive pings: every Rpc
    /// of this Nexus resets its sessions to it (here at the next event-loop
    /// iteration).
    pub fn fault_fail_remote(&mut self, uri: &str) -> Result<(), SessionError> {
        let uri = crate::nexus::Uri::parse(uri)?;
        self.nexus.fault_fail_remote(&uri);
        Ok(())
    }

    /// Test hook: sessions this Rpc creates or accepts from now on number
    /// their requests from `base` (rounded down to a multiple of the 8
    /// slots, within 44 bits): slot `i` starts at `base + i`, whatever the
    /// handshake said. With `base` near 2^44 a test reaches the request-
    /// number wrap in a few requests. Both ends of a session must use the
    /// same base: an erpc-rs server adopts the base an erpc-rs client
    /// proposes, so setting it at the client is enough between erpc-rs
    /// peers; a peer presenting itself as C++ (no SM extensions) numbers
    /// from 0 unless it is set there too. `None` goes back to the
    /// handshake's base.
    pub fn fault_set_req_base(&mut self, base: Option<u64>) {
        self.req_base_override = base.map(|b| {
            b & crate::pkthdr::MAX_REQ_NUM & !(crate::consts::SESSION_REQ_WINDOW as u64 - 1)
        });
    }

    /// Resets session `sn` as [`Rpc::reset_session`] does.
    pub fn fault_reset_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        self.reset_session(sn)
    }
}
