//! How SM packets travel between Nexuses, and how a Nexus hands them to
//! its Rpcs.

use std::collections::VecDeque;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{NexusError, Uri};
use crate::consts::SM_QUEUE_MAX;
use crate::sm_types::{SM_PKT_BYTES, SmErr, SmPkt};

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

/// An Rpc's inbox of SM packets. The event loop checks [`SmQueue::len`]
/// (one atomic load) and takes the lock only when something is there.
#[derive(Debug, Default)]
pub struct SmQueue {
    pending: AtomicUsize,
    q: Mutex<VecDeque<SmPkt>>,
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

    fn push(&self, p: SmPkt) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= SM_QUEUE_MAX {
            return false;
        }
        q.push_back(p);
        self.pending.store(q.len(), Ordering::Release);
        true
    }

    /// Takes one packet.
    pub(crate) fn pop(&self) -> Option<SmPkt> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let p = q.pop_front();
        self.pending.store(q.len(), Ordering::Release);
        p
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
    /// Types we never route (unblock, pings).
    pub unsupported_type: u64,
    /// The Rpc's inbox was full.
    pub queue_full: u64,
}

/// Routes SM packets to Rpcs by Rpc id: the server's for requests, the
/// client's for responses.
#[derive(Debug)]
pub struct SmRouter {
    uri: Uri,
    rpcs: Mutex<Vec<Option<Arc<SmQueue>>>>,
    delivered: AtomicU64,
    malformed: AtomicU64,
    invalid_rpc_id_req: AtomicU64,
    invalid_rpc_id_resp: AtomicU64,
    unsupported_type: AtomicU64,
    queue_full: AtomicU64,
}

impl SmRouter {
    pub(crate) fn new(uri: Uri) -> SmRouter {
        SmRouter {
            uri,
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
            T::Unblock | T::PingReq | T::PingResp => {
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
                if q.push(pkt) {
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

/// Session management over kernel UDP: the Nexus's SM thread receives on
/// the URI's port; Rpcs send from the same socket.
#[derive(Debug, Default)]
pub struct UdpSmLink {
    socket: Mutex<Option<Arc<UdpSocket>>>,
    /// Peer addresses, resolved once (a hostname lookup may block).
    resolved: Mutex<std::collections::HashMap<Uri, SocketAddr>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    send_errors: AtomicU64,
}

/// How often the SM thread wakes to check for shutdown.
const SM_THREAD_POLL_MS: u64 = 20;

impl UdpSmLink {
    /// An unstarted link.
    pub fn new() -> UdpSmLink {
        UdpSmLink::default()
    }

    /// Sends that failed (unresolvable host, OS error).
    pub fn send_errors(&self) -> u64 {
        self.send_errors.load(Ordering::Relaxed)
    }
}

fn resolve(uri: &Uri) -> Option<SocketAddr> {
    (uri.host.as_str(), uri.port)
        .to_socket_addrs()
        .ok()?
        .find(|a| a.is_ipv4())
}

impl SmLink for UdpSmLink {
    fn start(&self, local: &Uri, router: Arc<SmRouter>) -> Result<(), NexusError> {
        let io = |what, source| NexusError::SmIo {
            uri: local.clone(),
            what,
            source,
        };
        let addr = resolve(local).ok_or_else(|| NexusError::SmBind {
            uri: local.clone(),
            why: "host does not resolve to an IPv4 address".into(),
        })?;
        let sock = UdpSocket::bind(addr).map_err(|e| io("bind", e))?;
        sock.set_read_timeout(Some(Duration::from_millis(SM_THREAD_POLL_MS)))
            .map_err(|e| io("set_read_timeout", e))?;
        let sock = Arc::new(sock);
        *self.socket.lock().unwrap_or_else(|e| e.into_inner()) = Some(sock.clone());
        let stop = self.stop.clone();
        let name = format!("erpc-sm-{}", local.port);
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let n = match sock.recv_from(&mut buf) {
                        Ok((n, _)) => n,
                        Err(_) => continue, // timeout or transient error
                    };
                    if let Some((to, reply)) = router.deliver(&buf[..n])
                        && let Some(a) = resolve(&to)
                    {
                        let _ = sock.send_to(&reply, a);
                    }
                }
            })
            .map_err(|e| io("spawn SM thread", e))?;
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(())
    }

    fn send(&self, _from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let sock = self
            .socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let addr = {
            let mut cache = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
            match cache.get(to) {
                Some(a) => Some(*a),
                None => {
                    let a = resolve(to);
                    if let Some(a) = a {
                        cache.insert(to.clone(), a);
                    }
                    a
                }
            }
        };
        let ok = match (sock, addr) {
            (Some(s), Some(a)) => s.send_to(pkt, a).is_ok(),
            _ => false,
        };
        if !ok {
            self.send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn stop(&self, _local: &Uri) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}
