//! How SM packets travel between Nexuses, and how a Nexus hands them to
//! its Rpcs.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::liveness::{self, Liveness, LivenessStats, PeerFailure, PeerLiveness, Track};
use super::{NexusError, Uri};
use crate::clock::Clock;
use crate::consts::MAX_SM_QUEUE;
use crate::sm_types::{EXT_RPC_BITMAP_BYTES, SM_PKT_BYTES, SmErr, SmPkt, SmPktType};

/// Where an SM packet came from, as the SM link saw it: never what the
/// packet claims about its sender.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SmSource {
    /// A UDP datagram's source address.
    Udp(SocketAddr),
    /// In the simulated SM hub: the URI of the Nexus that sent it (or the
    /// source a test gives bytes it injects).
    Sim(Uri),
}

impl SmSource {
    /// The sending host, port left out: what admission limits are keyed
    /// on (a host may send from any port; the C++ eRPC sends session
    /// management from an ephemeral one).
    pub fn host(&self) -> SmSource {
        match self {
            SmSource::Udp(a) => SmSource::Udp(SocketAddr::new(a.ip(), 0)),
            SmSource::Sim(u) => SmSource::Sim(Uri::new(&u.host, 0)),
        }
    }
}

impl fmt::Display for SmSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmSource::Udp(a) => write!(f, "{a}"),
            SmSource::Sim(u) => write!(f, "{u}"),
        }
    }
}

/// What an Rpc learns of where an SM packet came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PktFrom {
    /// The sending host ([`SmSource::host`]).
    pub host: SmSource,
    /// The packet came from the address of the Nexus it names as its
    /// sender (the client endpoint of a request, the server endpoint of a
    /// response).
    pub verified: bool,
}

/// Carries SM packets between Nexuses.
///
/// `start` is called once by the Nexus; from then on the link hands every
/// packet that arrives for `local` to the router, with where it came from
/// and how to tell whether that is a given Nexus's address, and sends
/// back the router's reply, if any (an error response for an unknown Rpc
/// id). Sending is best effort (UDP semantics); the Rpc retries requests.
/// `send` is called on Rpc threads: it must neither block nor wait for a
/// lock.
pub trait SmLink: Send + Sync + fmt::Debug {
    /// Binds `local` and starts delivering to `router`.
    fn start(&self, local: &Uri, router: Arc<SmRouter>) -> Result<(), NexusError>;
    /// Sends one packet from `from` to the Nexus at `to`.
    fn send(&self, from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]);
    /// Stops delivering to `local` (the Nexus is going away).
    fn stop(&self, local: &Uri);
}

/// What the Nexus hands an Rpc. (Packets are the common item and are kept
/// inline; failure notices are rare.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum SmItem {
    /// An SM packet for this Rpc, and where it came from.
    Pkt(SmPkt, PktFrom),
    /// A remote Nexus (or one of its Rpcs) failed: reset the sessions to it.
    PeerFailed(PeerFailure),
    /// The SM link found no address for this URI's host: fail the
    /// sessions connecting to it.
    Unresolved(Uri),
    /// `erpc-inspect` asked for a snapshot: publish one if still wanted.
    /// (The event loop reads the request flag itself only once per
    /// loss-scan interval, which a virtual clock may never reach.)
    Inspect,
}

/// An Rpc's inbox of SM packets. The event loop checks [`SmQueue::len`]
/// (one atomic load) and takes the lock only when something is there.
#[derive(Debug, Default)]
pub(crate) struct SmQueue {
    pending: AtomicUsize,
    q: Mutex<VecDeque<SmItem>>,
    /// An [`SmItem::Inspect`] is queued (at most one is).
    inspect_queued: AtomicBool,
}

impl SmQueue {
    /// Packets waiting.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// True if nothing waits.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&self, p: SmItem) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        // Failure notices are never dropped: they are rare and each one
        // frees sessions.
        if q.len() >= MAX_SM_QUEUE && matches!(p, SmItem::Pkt(..) | SmItem::Unresolved(_)) {
            return false;
        }
        q.push_back(p);
        self.pending.store(q.len(), Ordering::Release);
        true
    }

    /// Takes one item.
    pub(crate) fn pop(&self) -> Option<SmItem> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let p = q.pop_front();
        self.pending.store(q.len(), Ordering::Release);
        if matches!(p, Some(SmItem::Inspect)) {
            self.inspect_queued.store(false, Ordering::Relaxed);
        }
        p
    }

    /// Queues an [`SmItem::Inspect`] unless one is already queued (an
    /// Rpc that does not run its event loop collects one, not one per
    /// request).
    fn push_inspect(&self) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if self.inspect_queued.swap(true, Ordering::Relaxed) {
            return;
        }
        q.push_back(SmItem::Inspect);
        self.pending.store(q.len(), Ordering::Release);
    }
}

/// Counters of the SM router: every packet a Nexus did not pass to an Rpc
/// is counted by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmRouterStats {
    /// Packets handed to an Rpc.
    pub delivered: u64,
    /// Not a valid 392-byte SM packet.
    pub malformed: u64,
    /// Request for an Rpc id that does not exist (answered with
    /// "invalid remote Rpc id").
    pub invalid_rpc_id_req: u64,
    /// Response for an Rpc id that does not exist (dropped).
    pub invalid_rpc_id_resp: u64,
    /// Types we never route (unblock), and pings from or to Nexuses we
    /// cannot answer (no hostname).
    pub unsupported_type: u64,
    /// The Rpc's inbox was full.
    pub queue_full: u64,
    /// Ping responses that answered no ping of ours (no tracked peer
    /// behind the URI they name, a token we never sent or already saw, or
    /// from another address): ignored.
    pub pongs_ignored: u64,
}

/// Routes SM packets to Rpcs by Rpc id: the server's for requests, the
/// client's for responses; answers keep-alive pings itself and runs the
/// Nexus's failure detection ([`SmRouter::tick`]).
#[derive(Debug)]
pub struct SmRouter {
    uri: Uri,
    clock: Clock,
    rpcs: Mutex<Vec<Option<Arc<SmQueue>>>>,
    live: Mutex<Liveness>,
    delivered: AtomicU64,
    malformed: AtomicU64,
    invalid_rpc_id_req: AtomicU64,
    invalid_rpc_id_resp: AtomicU64,
    unsupported_type: AtomicU64,
    queue_full: AtomicU64,
    pongs_ignored: AtomicU64,
}

impl SmRouter {
    pub(crate) fn new(
        uri: Uri,
        clock: Clock,
        incarnation: u64,
        failure_timeout_ns: u64,
        token_seed: u64,
    ) -> SmRouter {
        SmRouter {
            pongs_ignored: AtomicU64::new(0),
            live: Mutex::new(Liveness::new(
                uri.clone(),
                incarnation,
                failure_timeout_ns,
                token_seed,
            )),
            uri,
            clock,
            rpcs: Mutex::new((0..256).map(|_| None).collect()),
            delivered: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            invalid_rpc_id_req: AtomicU64::new(0),
            invalid_rpc_id_resp: AtomicU64::new(0),
            unsupported_type: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
        }
    }

    /// The URI this router serves.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    pub(crate) fn register(&self, rpc_id: u8) -> Option<Arc<SmQueue>> {
        let mut r = self.rpcs.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut r[usize::from(rpc_id)];
        if slot.is_some() {
            return None;
        }
        let q = Arc::new(SmQueue::default());
        *slot = Some(q.clone());
        Some(q)
    }

    pub(crate) fn unregister(&self, rpc_id: u8) {
        self.rpcs.lock().unwrap_or_else(|e| e.into_inner())[usize::from(rpc_id)] = None;
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Liveness> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This Nexus's incarnation (its creation time and random bits,
    /// non-zero; see `nexus::liveness`).
    pub fn incarnation(&self) -> u64 {
        self.live().incarnation()
    }

    /// The failure timeout in nanoseconds.
    pub fn failure_timeout_ns(&self) -> u64 {
        self.live().failure_timeout_ns()
    }

    /// How often [`SmRouter::tick`] should be called (the ping interval).
    pub fn tick_interval_ns(&self) -> u64 {
        self.live().tick_interval_ns()
    }

    /// Keep-alive counters.
    pub fn liveness_stats(&self) -> LivenessStats {
        self.live().stats()
    }

    /// Every peer the keep-alive tracks, as of now on this Nexus's clock.
    pub fn liveness_peers(&self) -> Vec<PeerLiveness> {
        let now = self.clock.now_ns();
        self.live().peers(now)
    }

    fn rpc_bitmap(&self) -> [u8; EXT_RPC_BITMAP_BYTES] {
        let mut b = [0u8; EXT_RPC_BITMAP_BYTES];
        let r = self.rpcs.lock().unwrap_or_else(|e| e.into_inner());
        for (id, q) in r.iter().enumerate() {
            if q.is_some() {
                liveness::set_bit(&mut b, id as u8);
            }
        }
        b
    }

    /// Wakes every Rpc of this Nexus for a debug-endpoint snapshot request
    /// (each publishes at its next event-loop iteration).
    pub(crate) fn wake_for_inspect(&self) {
        let r = self.rpcs.lock().unwrap_or_else(|e| e.into_inner());
        for q in r.iter().flatten() {
            q.push_inspect();
        }
    }

    /// Tells every Rpc of this Nexus about failed peers.
    fn broadcast(&self, failed: Vec<PeerFailure>) {
        if failed.is_empty() {
            return;
        }
        let qs: Vec<Arc<SmQueue>> = self
            .rpcs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect();
        for f in failed {
            tracing::info!(uri = %self.uri, peer = %f.uri, rpc = ?f.rpc_id, "remote declared failed");
            for q in &qs {
                q.push(SmItem::PeerFailed(f.clone()));
            }
        }
    }

    /// Whether a new session to the erpc-rs Nexus at `uri` with
    /// incarnation `inc` would be tracked (see `Liveness::may_track`):
    /// false if `inc` is older than the one tracked, or newer and not
    /// `verified` (the packet naming it did not come from `uri`'s address).
    pub(crate) fn may_track(&self, uri: &Uri, inc: u64, verified: bool) -> bool {
        self.live().may_track(uri, inc, verified)
    }

    /// The SM link found no address for `uri`'s host: every Rpc fails
    /// its sessions still connecting to it
    /// ([`SessionEnd::HostNotFound`](crate::SessionEnd::HostNotFound)). Called by links that
    /// resolve names; a full inbox drops the notice (the session then
    /// times out connecting, as before).
    pub fn host_unresolved(&self, uri: &Uri) {
        let qs: Vec<Arc<SmQueue>> = self
            .rpcs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect();
        for q in &qs {
            if !q.push(SmItem::Unresolved(uri.clone())) {
                self.queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A session to Rpc `rpc_id` of the erpc-rs Nexus at `uri` (incarnation
    /// `inc`) is live: ping it from now on. `verified`: the packet that
    /// named `inc` came from `uri`'s address or answered a token only that
    /// Nexus could know. A newer incarnation fails the sessions to the
    /// older one; a session whose incarnation is stale (older than the
    /// one tracked, or newer but not verified) is failed alone, through a
    /// failure notice for its incarnation.
    pub(crate) fn track(&self, uri: &Uri, rpc_id: u8, inc: u64, verified: bool) {
        let now = self.clock.now_ns();
        let t = self.live().track(uri, rpc_id, inc, verified, now);
        match t {
            Track::Tracked(f) => self.broadcast(f.into_iter().collect()),
            Track::Stale => self.broadcast(vec![PeerFailure {
                uri: uri.clone(),
                incarnation: inc,
                rpc_id: None,
            }]),
        }
    }

    /// A session tracked with [`SmRouter::track`] is gone.
    pub(crate) fn untrack(&self, uri: &Uri, rpc_id: u8, inc: u64) {
        self.live().untrack(uri, rpc_id, inc);
    }

    /// Fault injection: declare the Nexus at `uri` failed now.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn inject_failure(&self, uri: &Uri) {
        let f = self.live().inject_failure(uri);
        self.broadcast(vec![f]);
    }

    /// Failure detection: returns the keep-alive pings due now (to send to
    /// their URIs) and tells the Rpcs about peers that stayed silent for
    /// the failure timeout. The SM link calls it at least every
    /// [`SmRouter::tick_interval_ns`].
    ///
    /// Pings are appended to `pings` (a buffer the caller reuses: nothing
    /// is allocated unless a ping is due or a peer failed).
    pub fn tick(&self, pings: &mut Vec<(Uri, [u8; SM_PKT_BYTES])>) {
        let now = self.clock.now_ns();
        let bitmap = self.rpc_bitmap();
        let mut failed = Vec::new();
        self.live().tick(now, &bitmap, pings, &mut failed);
        self.broadcast(failed);
    }

    /// Handles one received packet from `source`; `resolve` tells where
    /// packets of the Nexus at a URI come from (its resolved address, as
    /// far as the link knows it without waiting), so that what a packet
    /// claims about its sender is believed only when it came from there.
    /// Returns the reply to send, if any, with its destination.
    pub fn deliver(
        &self,
        bytes: &[u8],
        source: &SmSource,
        resolve: &dyn Fn(&Uri) -> Option<SmSource>,
    ) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let pkt = match SmPkt::decode(bytes) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(uri = %self.uri, error = %e, "dropping malformed SM packet");
                self.malformed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let claimed = if pkt.pkt_type.is_req() {
            &pkt.client
        } else {
            &pkt.server
        };
        let verified = claimed
            .uri()
            .and_then(|u| resolve(&u))
            .is_some_and(|s| s == *source);
        use crate::sm_types::SmPktType as T;
        let is_req = match pkt.pkt_type {
            T::ConnectReq | T::DisconnectReq => true,
            T::ConnectResp | T::DisconnectResp => false,
            T::PingReq => return self.answer_ping(&pkt, verified),
            T::PingResp => {
                let now = self.clock.now_ns();
                let bitmap = pkt.server.rpc_bitmap();
                let mut failed = Vec::new();
                let taken = {
                    let mut l = self.live();
                    let before = l.stats().pongs_received;
                    l.heard_pong(
                        &pkt.server,
                        pkt.uniq_token,
                        &bitmap,
                        verified,
                        now,
                        &mut failed,
                    );
                    l.stats().pongs_received > before || !failed.is_empty()
                };
                if !taken {
                    self.pongs_ignored.fetch_add(1, Ordering::Relaxed);
                }
                self.broadcast(failed);
                return None;
            }
            T::Unblock => {
                self.unsupported_type.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let rpc_id = if is_req {
            pkt.server.rpc_id
        } else {
            pkt.client.rpc_id
        };
        let q = self.rpcs.lock().unwrap_or_else(|e| e.into_inner())[usize::from(rpc_id)].clone();
        match q {
            Some(q) => {
                let from = PktFrom {
                    host: source.host(),
                    verified,
                };
                if q.push(SmItem::Pkt(pkt, from)) {
                    self.delivered.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.queue_full.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
            None if is_req => {
                self.invalid_rpc_id_req.fetch_add(1, Ordering::Relaxed);
                let to = pkt.client.uri()?;
                Some((to, pkt.response(SmErr::InvalidRemoteRpcId).encode()))
            }
            None => {
                self.invalid_rpc_id_resp.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Answers a keep-alive ping (any Nexus may ping us). A ping from the
    /// address of a peer we track reveals a restart if it carries a newer
    /// incarnation; one that only claims to be from it proves nothing
    /// (`verified` false).
    fn answer_ping(&self, pkt: &SmPkt, verified: bool) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let Some(to) = pkt.client.uri() else {
            self.unsupported_type.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let bitmap = self.rpc_bitmap();
        let mut failed = Vec::new();
        let inc = {
            let mut l = self.live();
            l.answered_ping();
            l.heard_ping(&pkt.client, verified, &mut failed);
            l.incarnation()
        };
        self.broadcast(failed);
        debug_assert_eq!(pkt.pkt_type, SmPktType::PingReq);
        Some((to, liveness::ping_resp(pkt, inc, &bitmap).encode()))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SmRouterStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SmRouterStats {
            delivered: l(&self.delivered),
            malformed: l(&self.malformed),
            invalid_rpc_id_req: l(&self.invalid_rpc_id_req),
            invalid_rpc_id_resp: l(&self.invalid_rpc_id_resp),
            unsupported_type: l(&self.unsupported_type),
            queue_full: l(&self.queue_full),
            pongs_ignored: l(&self.pongs_ignored),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many snapshot requests arrive while an Rpc does not run its
    /// event loop, its queue holds one wake-up; the next request after it
    /// is taken queues a new one.
    #[test]
    fn inspect_wakeups_do_not_pile_up() {
        let q = SmQueue::default();
        for _ in 0..5 {
            q.push_inspect();
        }
        assert_eq!(q.len(), 1);
        assert!(matches!(q.pop(), Some(SmItem::Inspect)));
        assert!(q.is_empty());
        q.push_inspect();
        assert_eq!(q.len(), 1);
    }

    /// A ping request naming a tracked peer with a newer incarnation fails
    /// the sessions to it only if it came from the peer's address: the
    /// router takes the source from the link, never from the packet.
    #[test]
    fn a_restart_is_believed_only_from_the_peers_address() {
        use crate::sm_types::SmEndpoint;
        let router = SmRouter::new(Uri::new("10.0.0.1", 31850), Clock::tsc(), 7, 1 << 40, 1);
        let q = router.register(0).unwrap();
        let peer = Uri::new("10.0.0.2", 31850);
        router.track(&peer, 3, 99, true);
        let mut client = SmEndpoint {
            sm_udp_port: peer.port,
            rpc_id: u8::MAX,
            ..SmEndpoint::default()
        };
        client.set_hostname(&peer.host).unwrap();
        client.set_incarnation(100);
        let mut server = SmEndpoint::default();
        server.set_hostname("10.0.0.1").unwrap();
        let ping = SmPkt {
            pkt_type: SmPktType::PingReq,
            err: SmErr::NoError,
            uniq_token: 1,
            client,
            server,
        }
        .encode();
        let resolve = |u: &Uri| -> Option<SmSource> {
            Some(SmSource::Udp(SocketAddr::new(u.host.parse().ok()?, u.port)))
        };
        for forged in ["10.0.0.3:31850", "10.0.0.2:40000"] {
            let src = SmSource::Udp(forged.parse().unwrap());
            assert!(router.deliver(&ping, &src, &resolve).is_some(), "answered");
            assert!(q.is_empty(), "from {forged}: nothing failed");
        }
        assert_eq!(router.liveness_stats().unverified_source, 2);
        let src = SmSource::Udp("10.0.0.2:31850".parse().unwrap());
        router.deliver(&ping, &src, &resolve);
        assert!(matches!(q.pop(), Some(SmItem::PeerFailed(f)) if f.incarnation == 99));
        assert_eq!(router.liveness_stats().failed_restarted, 1);
    }
}
