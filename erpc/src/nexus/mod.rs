//! The Nexus: one per process. It owns the process's session-management
//! endpoint (its URI: host + SM UDP port), the request-handler table, the
//! worker threads for background handlers, and the SM link that carries
//! 392-byte SM packets between Nexuses.
//!
//! The SM link is pluggable ([`SmLink`]): in production a kernel-UDP
//! socket served by the Nexus's SM thread ([`UdpSmLink`]); in simulation an
//! in-memory hub stepped by the virtual clock (`sim::SimSmHub`), with no
//! thread and no socket. Either way packets reach an Rpc through the same
//! router ([`SmRouter`]) and the same handlers in the Rpc's event loop.
//!
//! Handlers are registered on a [`NexusBuilder`], so by construction the
//! table is complete before any Rpc exists (each Rpc copies it).

mod builder;
mod liveness;
mod sm_link;
mod spsc;
mod udp_sm;
mod workers;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use builder::HandlerEntry;
pub use builder::NexusBuilder;
pub(crate) use liveness::PeerFailure;
pub use liveness::{LivenessStats, PeerLiveness};
pub(crate) use sm_link::PktFrom;
pub(crate) use sm_link::SmItem;
pub(crate) use sm_link::SmQueue;
pub use sm_link::{SmLink, SmRouter, SmRouterStats, SmSource};
pub use udp_sm::{Resolver, UdpSmLink, UdpSmStats, system_resolver};
#[cfg(feature = "testing")]
pub use workers::SteppedJob;
pub use workers::{BgHandler, BgResponse, WorkerDispatch, WorkerIdle, WorkerStats};
pub(crate) use workers::{BgLinks, Job, Outcome, WorkerPool, run_job};

use crate::clock::Clock;
use crate::consts::{MAX_RPC_ID, SM_UDP_PORT_BASE};
use crate::rng::Rng;
use crate::sm_types::SM_PKT_BYTES;

/// Where a Nexus listens for session management: host and SM UDP port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uri {
    /// Hostname or IPv4 address.
    pub host: String,
    /// SM UDP port.
    pub port: u16,
}

impl Uri {
    /// A URI from parts.
    pub fn new(host: &str, port: u16) -> Uri {
        Uri {
            host: host.to_owned(),
            port,
        }
    }

    /// Parses `host:port`, or `host` alone for the default port 31850.
    pub fn parse(s: &str) -> Result<Uri, NexusError> {
        let bad = || NexusError::BadUri(s.to_owned());
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
            None => (s, SM_UDP_PORT_BASE),
        };
        if host.is_empty() || host.len() >= crate::sm_types::HOSTNAME_BYTES || host.contains('\0') {
            return Err(bad());
        }
        Ok(Uri::new(host, port))
    }

    /// Parses the URI of a remote Nexus, `host:port`, strictly: the port
    /// must be given (and not 0), and the host must be an IPv4 address or
    /// a hostname (dot-separated labels of ASCII letters, digits, `-` and
    /// `_`, each 1 to 63 bytes, not starting or ending with `-`), at most
    /// 127 bytes. `Err` says what is wrong. [`Rpc::create_session`]
    /// checks its URI with this, so a typo fails at once instead of as a
    /// connect timeout.
    ///
    /// [`Rpc::create_session`]: crate::Rpc::create_session
    pub fn parse_remote(s: &str) -> Result<Uri, &'static str> {
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err("expected host:port (the port is missing)");
        };
        let port: u16 = port
            .parse()
            .map_err(|_| "the port is not a number from 1 to 65535")?;
        if port == 0 {
            return Err("the port is not a number from 1 to 65535");
        }
        if host.is_empty() {
            return Err("the host is missing");
        }
        if host.len() >= crate::sm_types::HOSTNAME_BYTES {
            return Err("the host is longer than 127 bytes");
        }
        if host.parse::<std::net::Ipv4Addr>().is_err() {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            };
            if !host.trim_end_matches('.').split('.').all(label_ok) {
                return Err(
                    "the host is neither an IPv4 address nor a hostname (letters, digits, \
                     '-' and '_' in dot-separated labels)",
                );
            }
        }
        Ok(Uri::new(host, port))
    }
}

impl fmt::Display for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Errors of Nexus setup.
#[derive(Debug, thiserror::Error)]
pub enum NexusError {
    /// Not `host:port` (host at most 127 bytes).
    #[error("bad URI {0:?}: expected host:port with a host of at most 127 bytes")]
    BadUri(String),
    /// A request type got two handlers.
    #[error("request type {0} has two handlers")]
    DuplicateHandler(u8),
    /// The SM link could not start (e.g. the UDP port is taken).
    #[error("session management on {uri}: {what}: {source}")]
    SmIo {
        /// Our URI.
        uri: Uri,
        /// What failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The SM link refused to bind the URI.
    #[error("session management on {uri}: {why}")]
    SmBind {
        /// Our URI.
        uri: Uri,
        /// Why.
        why: String,
    },
    /// [`WorkerDispatch::SingleQueue`] with a depth outside 1 to
    /// [`WorkerDispatch::MAX_DEPTH`].
    #[error(
        "single-queue worker dispatch with depth {depth}: the depth (jobs a worker holds, the running one included) must be 1 to {max}; 1 or 2 is the useful range",
        max = WorkerDispatch::MAX_DEPTH
    )]
    WorkerDispatch {
        /// The depth given.
        depth: usize,
    },
    /// A worker thread could not be spawned.
    #[error("cannot spawn worker thread {index}: {source}")]
    Spawn {
        /// Worker index.
        index: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The per-process eRPC object. Shared (`Arc`) by the process's Rpcs.
pub struct Nexus {
    uri: Uri,
    sm_extensions: bool,
    handlers: Vec<Option<HandlerEntry>>,
    workers: WorkerPool,
    router: Arc<SmRouter>,
    link: Arc<dyn SmLink>,
    clock: Clock,
    rng: Mutex<Rng>,
    inspect: Option<crate::inspect::NexusInspect>,
    /// Disconnect requests of dropped Rpcs, resent a few times by the
    /// Nexus's Rpcs that live on (`resend_orphans`).
    orphans: Mutex<Orphans>,
    /// `orphans` is not empty (read without the lock).
    orphans_pending: AtomicBool,
}

/// What dropped Rpcs left to the Nexus.
#[derive(Default)]
struct Orphans {
    /// SM requests to send again.
    resend: Vec<Orphan>,
}

/// A disconnect request an Rpc sent as it was dropped, to send again.
struct Orphan {
    to: Uri,
    pkt: [u8; SM_PKT_BYTES],
    /// Sends left.
    left: u32,
    next_ns: u64,
}

/// Sends of a dropped Rpc's disconnect request after its first, one SM
/// retry interval apart.
const ORPHAN_RESENDS: u32 = 4;

impl fmt::Debug for Nexus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nexus")
            .field("uri", &self.uri)
            .field("workers", &self.workers.threads())
            .field("link", &self.link)
            .finish()
    }
}

impl Nexus {
    /// Starts building a Nexus listening on `uri` (`host:port`).
    pub fn builder(uri: &str) -> NexusBuilder {
        NexusBuilder::new(uri)
    }

    /// This Nexus's URI.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The clock every Rpc of this Nexus uses.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// SM routing counters.
    pub fn sm_stats(&self) -> SmRouterStats {
        self.router.stats()
    }

    /// Keep-alive (failure detection) counters.
    pub fn liveness_stats(&self) -> LivenessStats {
        self.router.liveness_stats()
    }

    /// This Nexus's incarnation: non-zero, new for every Nexus, and larger
    /// for a Nexus created later (its creation time in milliseconds since
    /// the Unix epoch, or in microseconds of virtual time, above 20 random
    /// bits), so that a restarted process is told apart from its
    /// predecessor and a packet of the predecessor is recognised as
    /// stale.
    pub fn incarnation(&self) -> u64 {
        self.router.incarnation()
    }

    /// True if SM endpoints carry the erpc-rs extensions.
    pub fn sm_extensions(&self) -> bool {
        self.sm_extensions
    }

    /// The machine-failure timeout in nanoseconds.
    pub fn failure_timeout_ns(&self) -> u64 {
        self.router.failure_timeout_ns()
    }

    /// Fault injection: declares the Nexus at `uri` failed now, as if it
    /// had stopped answering pings. Every Rpc of this Nexus resets its
    /// sessions to it at its next event-loop iteration.
    #[cfg(feature = "testing")]
    pub fn fault_fail_remote(&self, uri: &Uri) {
        self.router.inject_failure(uri);
    }

    pub(crate) fn router(&self) -> &SmRouter {
        &self.router
    }

    /// Number of worker threads (0: background handlers run inline).
    pub fn worker_threads(&self) -> usize {
        self.workers.threads()
    }

    /// The worker-dispatch policy.
    pub fn worker_dispatch(&self) -> WorkerDispatch {
        self.workers.policy()
    }

    /// What idle workers do.
    pub fn worker_idle(&self) -> WorkerIdle {
        self.workers.idle()
    }

    /// Per-worker counters (jobs finished, jobs held now, panics, parks),
    /// in worker order.
    pub fn worker_stats(&self) -> Vec<WorkerStats> {
        self.workers.stats()
    }

    /// Stepped workers ([`NexusBuilder::stepped_workers`]): takes worker
    /// `worker`'s next job, if it has one (its Rpcs' links take turns). The
    /// job counts as held by the worker until [`Nexus::finish_job`].
    /// `None` too if the workers are threads.
    ///
    /// # Panics
    /// If there is no worker `worker`.
    #[cfg(feature = "testing")]
    pub fn take_job(&self, worker: usize) -> Option<SteppedJob> {
        self.workers.take_job(worker)
    }

    /// Stepped workers: runs the handler of a job [`Nexus::take_job`]
    /// took and hands the result back to its Rpc, which sends the response
    /// in its next event-loop iteration.
    #[cfg(feature = "testing")]
    pub fn finish_job(&self, job: SteppedJob) {
        self.workers.finish_job(job)
    }

    /// Stepped workers: each worker runs every job it holds now, at once
    /// (under one lock: the per-job work is the worker threads'). Returns
    /// the number of jobs run (0 if the workers are threads).
    #[cfg(feature = "testing")]
    pub fn step_workers(&self) -> usize {
        (0..self.workers.threads())
            .map(|w| self.workers.run_stepped(w, usize::MAX))
            .sum()
    }

    pub(crate) fn handler(&self, req_type: u8) -> Option<&HandlerEntry> {
        self.handlers[usize::from(req_type)].as_ref()
    }

    pub(crate) fn workers(&self) -> &WorkerPool {
        &self.workers
    }

    pub(crate) fn register_rpc(&self, rpc_id: u8) -> Option<Arc<SmQueue>> {
        if rpc_id > MAX_RPC_ID {
            return None;
        }
        self.router.register(rpc_id)
    }

    pub(crate) fn unregister_rpc(&self, rpc_id: u8) {
        self.router.unregister(rpc_id);
    }

    pub(crate) fn sm_send(&self, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        self.link.send(&self.uri, to, pkt);
    }

    /// An Rpc being dropped sent these disconnect requests (and connect
    /// requests still unanswered, whose answers then reach the next Rpc
    /// with its id, which disowns what they made) once and can retry
    /// none: the Nexus sends each again [`ORPHAN_RESENDS`] times,
    /// `interval_ns` apart, from the event loops of its other Rpcs (or of
    /// the next one with the same id), so that one lost packet does not
    /// leave the server holding the session. The server answers
    /// duplicates; the answers reach no session and are counted stale.
    pub(crate) fn adopt_disconnects(
        &self,
        pkts: Vec<(Uri, [u8; SM_PKT_BYTES])>,
        now_ns: u64,
        interval_ns: u64,
    ) {
        if pkts.is_empty() {
            return;
        }
        let mut g = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        g.resend.extend(pkts.into_iter().map(|(to, pkt)| Orphan {
            to,
            pkt,
            left: ORPHAN_RESENDS,
            next_ns: now_ns + interval_ns,
        }));
        self.orphans_pending.store(true, Ordering::Release);
    }

    /// Sends the adopted disconnect requests that are due (one atomic load
    /// when there are none).
    pub(crate) fn resend_orphans(&self, now_ns: u64, interval_ns: u64) {
        if !self.orphans_pending.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut g) = self.orphans.try_lock() else {
            // Another Rpc is at it.
            return;
        };
        for o in g.resend.iter_mut().filter(|o| o.next_ns <= now_ns) {
            self.link.send(&self.uri, &o.to, &o.pkt);
            o.left -= 1;
            o.next_ns = now_ns + interval_ns;
        }
        g.resend.retain(|o| o.left > 0);
        self.orphans_pending
            .store(!g.resend.is_empty(), Ordering::Release);
    }

    /// A debug-endpoint publisher for a new Rpc, if this Nexus is exposed.
    pub(crate) fn inspect_publisher(
        &self,
        rpc_id: u8,
    ) -> Option<debug_endpoint::Publisher<crate::inspect::RpcRaw>> {
        self.inspect.as_ref().map(|i| i.add_rpc(rpc_id))
    }

    /// True if this Nexus is exposed on the debug endpoint.
    pub fn inspected(&self) -> bool {
        self.inspect.is_some()
    }

    pub(crate) fn random_u64(&self) -> u64 {
        self.rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_u64()
    }
}

impl Drop for Nexus {
    fn drop(&mut self) {
        self.link.stop(&self.uri);
        self.workers.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_parsing() {
        assert_eq!(
            Uri::parse("10.0.0.1:31851").unwrap(),
            Uri::new("10.0.0.1", 31851)
        );
        assert_eq!(Uri::parse("host").unwrap(), Uri::new("host", 31850));
        assert!(Uri::parse("host:99999").is_err());
        assert!(Uri::parse(":1").is_err());
        assert!(Uri::parse(&"h".repeat(128)).is_err());
        assert_eq!(Uri::new("a", 1).to_string(), "a:1");
    }

    #[test]
    fn remote_uri_parsing_is_strict() {
        for ok in [
            "10.0.0.1:31851",
            "server:31850",
            "node-1.example.com:1",
            "a_b:2",
            "no-such-host.invalid:31850",
        ] {
            let u = Uri::parse_remote(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(u.to_string(), ok);
        }
        for (bad, why) in [
            ("garbage", "port is missing"),
            ("host:", "port is not a number"),
            ("host:0", "port is not a number"),
            ("host:99999", "port is not a number"),
            (":31850", "host is missing"),
            ("bad host:1", "neither an IPv4"),
            ("-host:1", "neither an IPv4"),
            ("a..b:1", "neither an IPv4"),
            ("[::1]:1", "neither an IPv4"),
            ("h\0st:1", "neither an IPv4"),
        ] {
            let e = Uri::parse_remote(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(Uri::parse_remote(&format!("{}:1", "h".repeat(128))).is_err());
        assert!(Uri::parse_remote(&format!("{}:1", "h".repeat(64))).is_err());
    }
}
