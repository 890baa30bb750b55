//! Every error an Rpc's methods and completions return.

use super::SessionNum;
use crate::consts::MAX_RPC_ID;
use crate::msgbuf::MsgBuf;
use crate::sm_types::SmErr;

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
    /// The session ended, or never connected, without the application
    /// destroying it; `why` says how, and whether the request ran.
    #[error("session {session}: {why}")]
    SessionEnded {
        /// Session number.
        session: SessionNum,
        /// How it ended (what its [`SessionEventKind::Ended`](crate::SessionEventKind::Ended)
        /// event reports too).
        why: SessionEnd,
    },
    /// [`Rpc::destroy_session`](crate::Rpc::destroy_session) was called
    /// with the request outstanding. The request may or may not have run.
    #[error("session {session} was destroyed")]
    SessionDestroyed {
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

/// How a session ended, or never connected, without the application
/// destroying it: what its session event reports
/// ([`SessionEventKind::Ended`](crate::SessionEventKind::Ended)) and what
/// every request still on it completes with ([`RpcError::SessionEnded`]).
/// Each says whether those requests ran. The session is gone; a new one
/// may be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The server refused the connect request. Requests waiting for the
    /// session did not run.
    #[error("failed to connect: {0}")]
    ConnectFailed(SmErr),
    /// The connect request went unanswered for the connect timeout.
    /// Requests waiting for the session did not run.
    #[error("timed out connecting")]
    ConnectTimedOut,
    /// The server's host name does not resolve (the SM link's lookup
    /// found no IPv4 address), so the session could not connect. Reported
    /// as soon as the lookup answers, not after the connect timeout.
    /// Requests waiting for the session did not run.
    #[error("failed to connect: the server's host name does not resolve")]
    HostNotFound,
    /// The remote process (or its Rpc) was declared failed: it answered
    /// no keep-alive ping for the failure timeout, restarted, or dropped
    /// the Rpc. A request may or may not have run. A new session to the
    /// same URI may be created (e.g. when the process restarts).
    #[error("the peer failed")]
    PeerFailed,
    /// The session was reset locally ([`Rpc::reset_session`](crate::Rpc::reset_session)
    /// or fault injection). A request may or may not have run.
    #[error("reset")]
    Reset,
    /// The session, to a C++ eRPC peer, used up its 44-bit request
    /// numbers (2^44 requests; a C++ server cannot follow a wrap) and was
    /// reset. The request that found no number was not sent; requests in
    /// flight on the session at that moment may or may not have run.
    /// Create a new session. Sessions between erpc-rs peers wrap instead
    /// and never end this way.
    #[error("ran out of request numbers; create a new session")]
    ReqNumsExhausted,
    /// The server reclaimed the session: it had received no request on it
    /// (`unused_session_reclaim_ms`), or none for a long time
    /// (`idle_session_reclaim_ms`), and needed its RX ring entries for
    /// another session. No request ran. Create a new session.
    #[error("reclaimed by the server, unused; create a new session")]
    ServerReclaimed,
    /// The server ended the session without being asked: its application
    /// reset it, or it declared this client failed (e.g. after losing
    /// session-management packets one way). A request may or may not have
    /// run. Create a new session.
    #[error("ended by the server; create a new session")]
    ServerEnded,
    /// A request of the session got nothing back from the server for
    /// [`RpcConfig::stall_timeout_ms`](crate::RpcConfig::stall_timeout_ms)
    /// although the server was not declared failed: the server's Rpc
    /// stopped running, only the data path to it is cut, or (toward a C++
    /// eRPC server, which cannot say "in progress") its handler ran longer
    /// than the bound. A request may or may not have run. Create a new
    /// session.
    #[error("a request got no answer for the stall bound")]
    Stalled,
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
    /// No such session: none with this number, one being reset, or (for
    /// [`Rpc::destroy_session`](crate::Rpc::destroy_session), which takes
    /// client sessions only) a server session.
    #[error("no session {0} (or not a client session, where one is needed)")]
    NoSuchSession(SessionNum),
    /// The session is not connected.
    #[error("session {session} is {state:?}, not connected")]
    NotConnected {
        /// Session.
        session: SessionNum,
        /// Its state.
        state: crate::SessionState,
    },
}
