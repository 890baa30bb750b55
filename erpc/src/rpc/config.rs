//! An Rpc's settings ([`RpcConfig`]) and their defaults.

use crate::consts::{
    CONNECTS_PER_SEC_PER_SOURCE, FAILURE_TIMEOUT_MS, IDLE_SESSION_RECLAIM_MS, MIN_SESSION_CREDITS,
    PKT_LOSS_SCAN_US, RTO_US, SESSION_CREDITS, SM_RETRY_MS, STALL_TIMEOUT_MS,
    UNUSED_SESSION_RECLAIM_MS,
};
use crate::sm_types::TransportType;

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
    /// [`SessionEnd::ConnectTimedOut`](crate::SessionEnd::ConnectTimedOut); an unanswered disconnect
    /// request frees the session locally (default 500 ms, the failure
    /// timeout). Peers are declared failed by the Nexus's own failure
    /// timeout ([`NexusBuilder::failure_timeout_ms`](crate::NexusBuilder::failure_timeout_ms)),
    /// not by this one; raise both on a shared machine (see "On a busy
    /// machine" above).
    pub failure_timeout_ms: u64,
    /// The stall bound (default 10 s, `consts::STALL_TIMEOUT_MS`): a
    /// request that got nothing back for this long (no credit return, no
    /// response packet, no "in progress" notice) fails with its session,
    /// [`SessionEnd::Stalled`](crate::SessionEnd::Stalled). Time in which this Rpc's event loop did not
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
    /// told ([`SessionEnd::ServerReclaimed`](crate::SessionEnd::ServerReclaimed)); a C++ client cannot
    /// be, and its next request on that session goes unanswered.
    pub unused_session_reclaim_ms: Option<u64>,
    /// When a new session finds the RX ring short and no unused session
    /// can be reclaimed, server sessions of erpc-rs clients that served
    /// requests but received none for this long, and run none, are
    /// reclaimed, least recently used first (default 60 s; `None`:
    /// never). The client, if it is alive, is told
    /// ([`SessionEnd::ServerReclaimed`](crate::SessionEnd::ServerReclaimed)); its next request would not
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
