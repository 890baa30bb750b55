//! How SM packets travel between Nexuses, and how a Nexus hands them to
//! its Rpcs.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::liveness::{self, Liveness, LivenessStats, PeerFailure};
use super::{NexusError, Uri};
use crate::clock::Clock;
use crate::consts::SM_QUEUE_MAX;
use crate::sm_types::{EXT_RPC_BITMAP_BYTES, SM_PKT_BYTES, SmErr, SmPkt, SmPktType};

/// Carries SM packets between Nexuses.
///
/// `start` is called once by the Nexus; from then on the link hands every
/// packet that arrives for `local` to the router and sends back the
/// router's reply, if any (an error response for an unknown Rpc id).
/// Sending is best effort (UDP semantics); the Rpc retries requests.
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
    /// An SM packet for this Rpc.
    Pkt(SmPkt),
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
pub struct SmQueue {
    pending: AtomicUsize,
    q: Mutex<VecDeque<SmItem>>,
    /// An [`SmItem::Inspect`] is queued (at most one is).
    inspect_queued: AtomicBool,
}

impl SmQueue {
    /// Packets waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// True if nothing waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&self, p: SmItem) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        // Failure notices are never dropped: they are rare and each one
        // frees sessions.
        if q.len() >= SM_QUEUE_MAX && matches!(p, SmItem::Pkt(_) | SmItem::Unresolved(_)) {
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
}

impl SmRouter {
    pub(crate) fn new(
        uri: Uri,
        clock: Clock,
        incarnation: u64,
        failure_timeout_ns: u64,
    ) -> SmRouter {
        SmRouter {
            live: Mutex::new(Liveness::new(uri.clone(), incarnation, failure_timeout_ns)),
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

    /// This Nexus's incarnation (random, non-zero).
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

    /// The SM link found no address for `uri`'s host: every Rpc fails
    /// its sessions still connecting to it
    /// ([`crate::SessionEventKind::HostNotFound`]). Called by links that
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
    /// `inc`) is live: ping it from now on.
    pub(crate) fn track(&self, uri: &Uri, rpc_id: u8, inc: u64) {
        let now = self.clock.now_ns();
        let f = self.live().track(uri, rpc_id, inc, now);
        self.broadcast(f.into_iter().collect());
    }

    /// A session tracked with [`SmRouter::track`] is gone.
    pub(crate) fn untrack(&self, uri: &Uri, rpc_id: u8, inc: u64) {
        self.live().untrack(uri, rpc_id, inc);
    }

    /// Fault injection: declare the Nexus at `uri` failed now.
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

    /// Handles one received packet. Returns the reply to send, if any,
    /// with its destination.
    pub fn deliver(&self, bytes: &[u8]) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let pkt = match SmPkt::decode(bytes) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(uri = %self.uri, error = %e, "dropping malformed SM packet");
                self.malformed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        use crate::sm_types::SmPktType as T;
        let is_req = match pkt.pkt_type {
            T::ConnectReq | T::DisconnectReq => true,
            T::ConnectResp | T::DisconnectResp => false,
            T::PingReq => return self.answer_ping(&pkt),
            T::PingResp => {
                let now = self.clock.now_ns();
                let bitmap = pkt.server.rpc_bitmap();
                let mut failed = Vec::new();
                self.live().heard(
                    &pkt.server,
                    Some(pkt.uniq_token),
                    Some(&bitmap),
                    now,
                    &mut failed,
                );
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
                if q.push(SmItem::Pkt(pkt)) {
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

    /// Answers a keep-alive ping (any Nexus may ping us; a ping from a peer
    /// we track also proves it alive).
    fn answer_ping(&self, pkt: &SmPkt) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let Some(to) = pkt.client.uri() else {
            self.unsupported_type.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let bitmap = self.rpc_bitmap();
        let now = self.clock.now_ns();
        let mut failed = Vec::new();
        let inc = {
            let mut l = self.live();
            l.answered_ping();
            l.heard(&pkt.client, None, None, now, &mut failed);
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
}
