//! eRPC's side of the debug endpoint (`erpc-inspect`; the endpoint itself
//! is the `debug-endpoint` crate).
//!
//! A [`Nexus`](crate::Nexus) built with
//! [`NexusBuilder::inspect`](crate::NexusBuilder::inspect) (or with
//! `ERPC_INSPECT=1`) registers itself with the process's endpoint, and
//! each of its Rpcs gets a publisher. The event loop looks at it when the
//! endpoint wakes the Rpc for a request (an `SmItem::Inspect` in its SM
//! queue, which the loop polls anyway) and once per packet-loss scan
//! interval — one relaxed atomic load; nothing per iteration — and when a
//! client asks, copies its counters and sessions as they are (`RpcRaw`)
//! and hands them over without waiting; the endpoint thread turns them
//! into an [`RpcView`] (names, maps), so the datapath pays only for the
//! copy. The Nexus's own counters (session management, keep-alive) are
//! read by the endpoint thread.
//!
//! The JSON keys are the field names of [`NexusView`] and the types it
//! holds; `erpc-inspect --json` prints them and a test pins them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

pub use debug_endpoint::remove_socket_on_termination;
use debug_endpoint::{PublishInfo, Publisher, Query, Registration, Slot, Source};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use transport::{RoutingInfo, Transport, TransportStats};

use crate::nexus::{LivenessStats, PeerLiveness, SmRouter, SmRouterStats, Uri};
use crate::rpc::{Rpc, SessionInfo, SessionNum};
use crate::stats::{DropReason, RpcStats};

/// `CamelCase` → `snake_case` (stable JSON names from enum variants).
fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The JSON name of a drop reason (`unknown_session`, ...).
pub fn drop_reason_name(r: DropReason) -> String {
    snake(&format!("{r:?}"))
}

/// An Rpc's transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportView {
    /// The transport's Rust type.
    pub kind: String,
    /// The routing info peers use (MAC, IPv4, UDP port, RX queue, RSS size).
    pub mac: String,
    /// IPv4 address.
    pub ipv4: String,
    /// UDP port of the Rpc's RX queue (on the mlx5 transport, the port its
    /// queue set is steered by: `devices[].queue_sets[].udp_port`).
    pub udp_port: u16,
    /// RX queue id advertised.
    pub rxq_id: u16,
    /// RSS table size advertised.
    pub rss_table_size: u16,
    /// Counters, drops by reason included (the transport's own names).
    pub stats: BTreeMap<String, u64>,
}

fn transport_stats(s: &TransportStats) -> BTreeMap<String, u64> {
    let TransportStats {
        tx_pkts,
        tx_bytes,
        tx_dropped_on_purpose,
        tx_errors,
        tx_refused,
        tx_doorbells,
        rx_pkts,
        rx_bytes,
        rx_short,
        rx_bad_ethertype,
        rx_bad_ip,
        rx_bad_udp,
        rx_not_for_us,
        rx_oversize,
        rx_errors,
        rx_ip_csum_zero,
        rx_ip_csum_hw,
    } = *s;
    [
        ("tx_pkts", tx_pkts),
        ("tx_bytes", tx_bytes),
        ("tx_dropped_on_purpose", tx_dropped_on_purpose),
        ("tx_errors", tx_errors),
        ("tx_refused", tx_refused),
        ("tx_doorbells", tx_doorbells),
        ("rx_pkts", rx_pkts),
        ("rx_bytes", rx_bytes),
        ("rx_short", rx_short),
        ("rx_bad_ethertype", rx_bad_ethertype),
        ("rx_bad_ip", rx_bad_ip),
        ("rx_bad_udp", rx_bad_udp),
        ("rx_not_for_us", rx_not_for_us),
        ("rx_oversize", rx_oversize),
        ("rx_errors", rx_errors),
        ("rx_ip_csum_zero", rx_ip_csum_zero),
        ("rx_ip_csum_hw", rx_ip_csum_hw),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The transport counters that count packets dropped, by reason.
pub const TRANSPORT_DROP_KEYS: &[&str] = &[
    "tx_dropped_on_purpose",
    "tx_errors",
    "rx_short",
    "rx_bad_ethertype",
    "rx_bad_ip",
    "rx_bad_udp",
    "rx_not_for_us",
    "rx_oversize",
    "rx_errors",
];

/// An Rpc's counters ([`RpcStats`]): every counter under its field name,
/// and `drops` with every reason (zeros included) under
/// [`drop_reason_name`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcStatsView {
    /// Counters other than drops, by [`RpcStats`] field name.
    pub counters: BTreeMap<String, u64>,
    /// Drops by reason.
    pub drops: BTreeMap<String, u64>,
}

fn rpc_stats(s: &RpcStats) -> RpcStatsView {
    let RpcStats {
        drops: _,
        rx_pkts,
        rx_accepted,
        tx_pkts,
        tx_bursts,
        tx_refused,
        tx_given_up,
        tx_flushes,
        tx_fault_dropped,
        retransmissions,
        retransmitted_pkts,
        timely_updates,
        timely_bypassed,
        wheel_bypassed,
        wheel_stale,
        tx_stale,
        reqs_enqueued,
        reqs_backlogged,
        reqs_completed,
        reqs_failed,
        reqs_handled,
        resps_enqueued,
        reqs_failed_at_server,
        status_sent,
        status_received,
        in_progress_sent,
        in_progress_received,
        dup_req_cr_resent,
        dup_req_resp_resent,
        dup_rfr_resent,
        bg_jobs,
        bg_backlogged,
        bg_panics,
        deferred_copies,
        rx_copied,
        sm_tx,
        sm_retries,
        sm_dup_connect,
        sm_stale_connect,
        sm_abandoned_cleanups,
        sm_connect_rate_limited,
        sm_connect_source_full,
        sm_connect_stale_incarnation,
        sm_disowned,
        sm_unserved_probes,
        sessions_reclaimed,
        sessions_reclaimed_idle,
        sm_reclaim_notices_resent,
        sm_end_notices,
        sm_unresolved,
        sm_timeouts,
        sessions_reset,
        sessions_peer_failed,
        sessions_stalled,
        pauses_discounted,
        reassemblies_expired,
        resps_discarded,
        sessions_drained,
        drained_reqs,
        burst_calls,
        burst_not_taken,
    } = s.clone();
    let counters = [
        ("rx_pkts", rx_pkts),
        ("rx_accepted", rx_accepted),
        ("tx_pkts", tx_pkts),
        ("tx_bursts", tx_bursts),
        ("tx_refused", tx_refused),
        ("tx_given_up", tx_given_up),
        ("tx_flushes", tx_flushes),
        ("tx_fault_dropped", tx_fault_dropped),
        ("retransmissions", retransmissions),
        ("retransmitted_pkts", retransmitted_pkts),
        ("timely_updates", timely_updates),
        ("timely_bypassed", timely_bypassed),
        ("wheel_bypassed", wheel_bypassed),
        ("wheel_stale", wheel_stale),
        ("tx_stale", tx_stale),
        ("reqs_enqueued", reqs_enqueued),
        ("reqs_backlogged", reqs_backlogged),
        ("reqs_completed", reqs_completed),
        ("reqs_failed", reqs_failed),
        ("reqs_handled", reqs_handled),
        ("resps_enqueued", resps_enqueued),
        ("reqs_failed_at_server", reqs_failed_at_server),
        ("status_sent", status_sent),
        ("status_received", status_received),
        ("in_progress_sent", in_progress_sent),
        ("in_progress_received", in_progress_received),
        ("dup_req_cr_resent", dup_req_cr_resent),
        ("dup_req_resp_resent", dup_req_resp_resent),
        ("dup_rfr_resent", dup_rfr_resent),
        ("bg_jobs", bg_jobs),
        ("bg_backlogged", bg_backlogged),
        ("bg_panics", bg_panics),
        ("deferred_copies", deferred_copies),
        ("rx_copied", rx_copied),
        ("sm_tx", sm_tx),
        ("sm_retries", sm_retries),
        ("sm_dup_connect", sm_dup_connect),
        ("sm_stale_connect", sm_stale_connect),
        ("sm_abandoned_cleanups", sm_abandoned_cleanups),
        ("sm_connect_rate_limited", sm_connect_rate_limited),
        ("sm_connect_source_full", sm_connect_source_full),
        ("sm_connect_stale_incarnation", sm_connect_stale_incarnation),
        ("sm_disowned", sm_disowned),
        ("sm_unserved_probes", sm_unserved_probes),
        ("sessions_reclaimed", sessions_reclaimed),
        ("sessions_reclaimed_idle", sessions_reclaimed_idle),
        ("sm_reclaim_notices_resent", sm_reclaim_notices_resent),
        ("sm_end_notices", sm_end_notices),
        ("sm_unresolved", sm_unresolved),
        ("sm_timeouts", sm_timeouts),
        ("sessions_reset", sessions_reset),
        ("sessions_peer_failed", sessions_peer_failed),
        ("sessions_stalled", sessions_stalled),
        ("pauses_discounted", pauses_discounted),
        ("reassemblies_expired", reassemblies_expired),
        ("resps_discarded", resps_discarded),
        ("sessions_drained", sessions_drained),
        ("drained_reqs", drained_reqs),
        ("burst_calls", burst_calls),
        ("burst_not_taken", burst_not_taken),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let drops = DropReason::ALL
        .iter()
        .map(|&r| (drop_reason_name(r), s.drops(r)))
        .collect();
    RpcStatsView { counters, drops }
}

/// One session at an Rpc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionView {
    /// Local session number.
    pub session: SessionNum,
    /// `client` or `server`.
    pub role: String,
    /// `connect_in_progress`, `connected`, `disconnect_in_progress`,
    /// `resetting`.
    pub state: String,
    /// The remote Nexus.
    pub remote_uri: String,
    /// The remote Rpc id.
    pub remote_rpc_id: u8,
    /// The remote session number.
    pub remote_session: SessionNum,
    /// The remote Nexus's incarnation (0: a C++ peer).
    pub remote_incarnation: u64,
    /// Client: credits available.
    pub credits: u32,
    /// Slots in use (client: requests in flight; server: handlers that
    /// have not responded).
    pub slots_in_use: usize,
    /// Client: requests waiting for a slot.
    pub backlog: usize,
    /// Current request number of each of the 8 slots.
    pub req_nums: Vec<u64>,
    /// Client: go-back-N rollbacks.
    pub retransmits: u64,
    /// Every slot (see [`SlotView`]).
    pub slots: Vec<SlotView>,
    /// Milliseconds since the session last made progress: the newest of
    /// its slots' progress clocks (a packet received for a request; at a
    /// client also a request enqueued). For a session whose requests are
    /// stuck, the time since the last packet from the peer (`null`:
    /// none yet). See [`crate::SessionInfo::quiet_ns`].
    pub quiet_ms: Option<f64>,
    /// Client: the last RTT sample in µs, from a packet's TX timestamp
    /// to its acknowledgement (`null` at a server, with congestion control
    /// off, or before the first acknowledgement).
    pub rtt_us: Option<f64>,
    /// Client: the congestion controller's sending rate in Gbit/s
    /// (Timely's, or the delay-target controller's when the Rpc runs
    /// that one; the key keeps its name); equal to the Rpc's
    /// `cc.link_gbps` while the session is not rate limited (`null` at a
    /// server or with congestion control off).
    pub timely_rate_gbps: Option<f64>,
}

/// One slot of a session ([`crate::SlotInfo`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotView {
    /// The slot's index (0 to 7).
    pub slot: usize,
    /// Request number of its current (or last) request.
    pub req_num: u64,
    /// Client: `idle`, `in_flight`, `waiting`; server: `idle`,
    /// `receiving`, `in_handler`, `deferred`, `background`, `responded`,
    /// `failed`.
    pub state: String,
    /// Client: request packets and RFRs sent for the request (`null` when
    /// idle and at a server).
    pub tx_pkts: Option<u32>,
    /// Client: credit returns and response packets received; server:
    /// request packets received in order (`null` when idle).
    pub rx_pkts: Option<u32>,
    /// A busy slot: milliseconds since it last made progress (its
    /// request's enqueue or last packet in; at a server, how long its
    /// handler has had the request). `null` when not busy.
    pub waited_ms: Option<f64>,
}

/// An Rpc's congestion control: settings and timing-wheel counters
/// ([`crate::cc::CcConfig`], [`crate::cc::WheelStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CcView {
    /// The link rate sessions start at and never exceed, Gbit/s.
    pub link_gbps: f64,
    /// Timely's minimum rate, Gbit/s.
    pub min_gbps: f64,
    /// Timely's bypass at link rate is on.
    pub timely_bypass: bool,
    /// The wheel bypass is on.
    pub wheel_bypass: bool,
    /// Packets waiting in the timing wheel now.
    pub wheel_queued: usize,
    /// Packets ever put into the wheel.
    pub wheel_inserted: u64,
    /// Packets the wheel released.
    pub wheel_reaped: u64,
    /// Inserts beyond the horizon (placed in the last slot).
    pub wheel_clamped: u64,
    /// Inserts refused for lack of buckets (sent at once).
    pub wheel_overflow: u64,
}

/// What an Rpc's thread publishes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcView {
    /// The Rpc id.
    pub rpc_id: u8,
    /// The Rpc's clock when it published (virtual in simulation).
    pub now_ns: u64,
    /// Its transport.
    pub transport: TransportView,
    /// Its counters.
    pub stats: RpcStatsView,
    /// RX ring entries and how many are not reserved by sessions.
    pub rx_ring_entries: usize,
    /// RX ring entries not reserved by sessions.
    pub rx_ring_unreserved: usize,
    /// Message-buffer memory in use and reserved, bytes.
    pub alloc_in_use_bytes: usize,
    /// Bytes reserved from the OS for message buffers.
    pub alloc_reserved_bytes: usize,
    /// Congestion control (`null` when it is off).
    pub cc: Option<CcView>,
    /// Every session, by number.
    pub sessions: Vec<SessionView>,
}

/// One Rpc in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcSlotView {
    /// The Rpc id.
    pub rpc_id: u8,
    /// When its view was published (`None`: not yet).
    pub published: Option<PublishInfo>,
    /// What it published.
    pub rpc: Option<RpcView>,
}

/// Session-management routing counters ([`SmRouterStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmView {
    /// SM packets handed to an Rpc.
    pub delivered: u64,
    /// Not a valid SM packet.
    pub malformed: u64,
    /// Requests for an Rpc id that does not exist.
    pub invalid_rpc_id_req: u64,
    /// Responses for an Rpc id that does not exist.
    pub invalid_rpc_id_resp: u64,
    /// Types never routed.
    pub unsupported_type: u64,
    /// The Rpc's SM inbox was full.
    pub queue_full: u64,
}

/// Keep-alive counters ([`LivenessStats`]) and peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessView {
    /// Pings sent.
    pub pings_sent: u64,
    /// Pings answered.
    pub pings_answered: u64,
    /// Ping responses received.
    pub pongs_received: u64,
    /// Remotes declared failed for silence.
    pub failed_silent: u64,
    /// Remotes found restarted.
    pub failed_restarted: u64,
    /// Remote Rpcs found gone.
    pub failed_rpc_gone: u64,
    /// Failures injected.
    pub failed_injected: u64,
    /// Ticks of the keep-alive that came more than a ping interval late
    /// (the Nexus's SM thread did not run), whose gap was not counted as
    /// any peer's silence.
    #[serde(default)]
    pub pauses_discounted: u64,
    /// Remote Nexuses tracked now.
    pub tracked: u64,
    /// Each of them.
    pub peers: Vec<PeerView>,
}

/// A remote Nexus the keep-alive tracks ([`crate::nexus::PeerLiveness`]),
/// as of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    /// Its URI.
    pub uri: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// Milliseconds since its last ping response arrived (`null`: none yet).
    pub last_pong_ago_ms: Option<u64>,
    /// Milliseconds since it was last proven alive (the send time of the
    /// newest ping it answered, or when tracking began); past the failure
    /// timeout it is declared failed.
    pub alive_ago_ms: u64,
    /// Milliseconds since the last ping sent to it (`null`: none yet).
    pub last_ping_ago_ms: Option<u64>,
    /// Pings not answered yet (the last 12 at most).
    pub pings_outstanding: usize,
    /// Its Rpcs this Nexus has live sessions with.
    pub rpcs: Vec<u8>,
}

/// One Nexus in a snapshot (`nexuses[i]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NexusView {
    /// Its URI (host:SM port).
    pub uri: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// Whether its SM packets carry the erpc-rs extensions.
    pub sm_extensions: bool,
    /// The failure timeout, ms.
    pub failure_timeout_ms: u64,
    /// Worker threads for background handlers.
    pub worker_threads: usize,
    /// Session-management routing.
    pub sm: SmView,
    /// Keep-alive.
    pub liveness: LivenessView,
    /// Every Rpc, by registration.
    pub rpcs: Vec<RpcSlotView>,
}

fn sm_view(s: SmRouterStats) -> SmView {
    SmView {
        delivered: s.delivered,
        malformed: s.malformed,
        invalid_rpc_id_req: s.invalid_rpc_id_req,
        invalid_rpc_id_resp: s.invalid_rpc_id_resp,
        unsupported_type: s.unsupported_type,
        queue_full: s.queue_full,
    }
}

fn liveness_view(s: LivenessStats, peers: Vec<PeerLiveness>) -> LivenessView {
    let ms = |ns: u64| ns / 1_000_000;
    LivenessView {
        pings_sent: s.pings_sent,
        pings_answered: s.pings_answered,
        pongs_received: s.pongs_received,
        failed_silent: s.failed_silent,
        failed_restarted: s.failed_restarted,
        failed_rpc_gone: s.failed_rpc_gone,
        failed_injected: s.failed_injected,
        pauses_discounted: s.pauses_discounted,
        tracked: s.tracked,
        peers: peers
            .into_iter()
            .map(|p| PeerView {
                uri: p.uri.to_string(),
                incarnation: p.incarnation,
                last_pong_ago_ms: p.last_pong_ago_ns.map(ms),
                alive_ago_ms: ms(p.alive_ago_ns),
                last_ping_ago_ms: p.last_ping_ago_ns.map(ms),
                pings_outstanding: p.pings_outstanding,
                rpcs: p.rpcs,
            })
            .collect(),
    }
}

/// What an Rpc's thread copies when asked: its state as is, converted
/// into an [`RpcView`] by the endpoint thread.
#[derive(Debug, Clone)]
pub(crate) struct RpcRaw {
    rpc_id: u8,
    now_ns: u64,
    kind: &'static str,
    routing: RoutingInfo,
    transport: TransportStats,
    stats: RpcStats,
    rx_ring_entries: usize,
    rx_ring_unreserved: usize,
    alloc_in_use_bytes: usize,
    alloc_reserved_bytes: usize,
    cc: Option<CcView>,
    sessions: Vec<SessionInfo>,
}

impl RpcRaw {
    /// The view, with names and maps.
    pub(crate) fn view(&self) -> RpcView {
        let ri = &self.routing;
        RpcView {
            rpc_id: self.rpc_id,
            now_ns: self.now_ns,
            transport: TransportView {
                kind: self.kind.to_string(),
                mac: ri
                    .mac
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
                ipv4: ri.ipv4.to_string(),
                udp_port: ri.udp_port,
                rxq_id: ri.rxq_id,
                rss_table_size: ri.rss_table_size,
                stats: transport_stats(&self.transport),
            },
            stats: rpc_stats(&self.stats),
            rx_ring_entries: self.rx_ring_entries,
            rx_ring_unreserved: self.rx_ring_unreserved,
            alloc_in_use_bytes: self.alloc_in_use_bytes,
            alloc_reserved_bytes: self.alloc_reserved_bytes,
            cc: self.cc,
            sessions: self
                .sessions
                .iter()
                .map(|s| SessionView {
                    session: s.session,
                    role: if s.is_client { "client" } else { "server" }.into(),
                    state: snake(&format!("{:?}", s.state)),
                    remote_uri: s.remote_uri.clone(),
                    remote_rpc_id: s.remote_rpc_id,
                    remote_session: s.remote_session,
                    remote_incarnation: s.remote_incarnation,
                    credits: s.credits,
                    slots_in_use: s.busy_slots,
                    backlog: s.backlog,
                    req_nums: s.req_nums.to_vec(),
                    retransmits: s.retransmits,
                    slots: s
                        .slots
                        .iter()
                        .enumerate()
                        .map(|(i, sl)| SlotView {
                            slot: i,
                            req_num: sl.req_num,
                            state: sl.state.to_string(),
                            tx_pkts: sl.tx_pkts,
                            rx_pkts: sl.rx_pkts,
                            waited_ms: sl.waited_ns.map(|ns| ns as f64 / 1e6),
                        })
                        .collect(),
                    quiet_ms: s.quiet_ns.map(|ns| ns as f64 / 1e6),
                    rtt_us: s.rtt_us,
                    timely_rate_gbps: s.cc_rate_gbps,
                })
                .collect(),
        }
    }
}

struct RpcEntry {
    rpc_id: u8,
    slot: Arc<Slot<RpcRaw>>,
}

struct NexusSource {
    uri: Uri,
    incarnation: u64,
    sm_extensions: bool,
    failure_timeout_ms: u64,
    worker_threads: usize,
    router: Arc<SmRouter>,
    rpcs: Mutex<Vec<RpcEntry>>,
}

impl NexusSource {
    fn entries(&self) -> Vec<(u8, Arc<Slot<RpcRaw>>)> {
        let mut r = self.rpcs.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|e| !e.slot.is_closed());
        r.iter().map(|e| (e.rpc_id, e.slot.clone())).collect()
    }
}

impl Source for NexusSource {
    fn kind(&self) -> &'static str {
        "nexuses"
    }

    fn summary(&self) -> Value {
        let ids: Vec<u8> = self.entries().iter().map(|(id, _)| *id).collect();
        serde_json::json!({ "uri": self.uri.to_string(), "rpcs": ids })
    }

    fn pending(&self, generation: u64) -> bool {
        self.entries().iter().any(|(_, s)| s.pending(generation))
    }

    fn requested(&self, _generation: u64) {
        self.router.wake_for_inspect();
    }

    fn render(&self, q: &Query) -> Value {
        let rpcs = self
            .entries()
            .into_iter()
            .map(|(rpc_id, slot)| {
                let latest = slot.latest();
                RpcSlotView {
                    rpc_id,
                    published: latest.as_ref().map(|l| l.info(q.generation)),
                    rpc: latest.map(|l| l.value.view()),
                }
            })
            .collect();
        let v = NexusView {
            uri: self.uri.to_string(),
            incarnation: self.incarnation,
            sm_extensions: self.sm_extensions,
            failure_timeout_ms: self.failure_timeout_ms,
            worker_threads: self.worker_threads,
            sm: sm_view(self.router.stats()),
            liveness: liveness_view(self.router.liveness_stats(), self.router.liveness_peers()),
            rpcs,
        };
        serde_json::to_value(v).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

/// A Nexus's registration with the endpoint (kept in the Nexus).
pub(crate) struct NexusInspect {
    source: Arc<NexusSource>,
    _registration: Registration,
}

impl fmt::Debug for NexusInspect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NexusInspect({})", self.source.uri)
    }
}

impl NexusInspect {
    /// Registers a Nexus. A failure to start the endpoint is logged, not
    /// fatal: the Nexus works without it.
    pub(crate) fn register(
        uri: &Uri,
        router: Arc<SmRouter>,
        sm_extensions: bool,
        failure_timeout_ms: u64,
        worker_threads: usize,
    ) -> Option<NexusInspect> {
        let source = Arc::new(NexusSource {
            uri: uri.clone(),
            incarnation: router.incarnation(),
            sm_extensions,
            failure_timeout_ms,
            worker_threads,
            router,
            rpcs: Mutex::new(Vec::new()),
        });
        match debug_endpoint::register(source.clone()) {
            Ok(r) => {
                tracing::debug!(%uri, socket = %r.socket().display(), "Nexus exposed on the debug endpoint");
                Some(NexusInspect {
                    source,
                    _registration: r,
                })
            }
            Err(e) => {
                tracing::warn!(%uri, error = %e, "debug endpoint not available");
                None
            }
        }
    }

    /// A publisher for a new Rpc.
    pub(crate) fn add_rpc(&self, rpc_id: u8) -> Publisher<RpcRaw> {
        let (p, slot) = Publisher::new();
        let mut r = self.source.rpcs.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|e| !e.slot.is_closed());
        r.push(RpcEntry { rpc_id, slot });
        p
    }
}

/// Inspection: what `erpc-inspect` shows of the Rpc.
impl<T: Transport, C> Rpc<T, C> {
    /// The copy the event loop publishes: counters and sessions as they
    /// are, no formatting.
    pub(crate) fn inspect_raw(&self) -> RpcRaw {
        let (unreserved, entries) = self.ring_reservation();
        let alloc = self.alloc_stats();
        RpcRaw {
            rpc_id: self.rpc_id(),
            now_ns: self.now_ns(),
            kind: std::any::type_name::<T>(),
            routing: self.transport().local_routing_info(),
            transport: self.transport().stats(),
            stats: self.stats().clone(),
            rx_ring_entries: entries,
            rx_ring_unreserved: unreserved,
            alloc_in_use_bytes: alloc.in_use_bytes,
            alloc_reserved_bytes: alloc.reserved_bytes,
            cc: self.cc_view(),
            sessions: self
                .session_nums()
                .into_iter()
                .filter_map(|sn| self.session_info(sn))
                .collect(),
        }
    }

    /// Publishes a snapshot if a client asked for one this Rpc has not
    /// answered: one relaxed load while nobody is attached.
    #[inline]
    pub(crate) fn maybe_publish_inspect(&mut self) {
        if let Some(p) = &self.inspect
            && p.wanted()
        {
            self.publish_inspect();
        }
    }

    /// Publishes [`Rpc::inspect_raw`] for the endpoint (the event loop
    /// calls it when a client asked).
    #[cold]
    pub(crate) fn publish_inspect(&mut self) {
        let Some(p) = self.inspect.as_ref() else {
            return;
        };
        let pending = p.begin();
        let v = self.inspect_raw();
        if let Some(p) = self.inspect.as_mut() {
            p.publish(pending, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_snake_case() {
        assert_eq!(
            drop_reason_name(DropReason::UnknownSession),
            "unknown_session"
        );
        assert_eq!(drop_reason_name(DropReason::SmStale), "sm_stale");
        assert_eq!(snake("ConnectInProgress"), "connect_in_progress");
        let v = rpc_stats(&RpcStats::default());
        assert_eq!(v.drops.len(), DropReason::ALL.len());
        assert!(
            TRANSPORT_DROP_KEYS
                .iter()
                .all(|k| transport_stats(&TransportStats::default()).contains_key(*k))
        );
    }
}
