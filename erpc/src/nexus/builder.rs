//! [`NexusBuilder`]: what a Nexus is made of (URI, handlers, workers, SM
//! link, clock), checked and started by [`NexusBuilder::build`].

use std::any::Any;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::liveness;
use super::workers::{
    self, BgHandler, BgResponse, PoolConfig, WorkerDispatch, WorkerIdle, WorkerPool,
};
use super::{Nexus, NexusError, Orphans, SmLink, SmRouter, UdpSmLink, Uri};
use crate::clock::Clock;
use crate::consts::FAILURE_TIMEOUT_MS;
use crate::rng::Rng;

/// A registered handler, type-erased until an Rpc of the matching
/// transport and context types copies it.
pub(crate) enum HandlerEntry {
    /// Runs in the dispatch thread: a `crate::ReqHandler<T, C>` fn pointer.
    Dispatch {
        func: Box<dyn Any + Send + Sync>,
        type_name: &'static str,
    },
    /// Runs on a worker thread.
    Background(BgHandler),
    /// Runs in the dispatch thread with a burst of requests: a
    /// `crate::BurstHandler<T, C>` fn pointer.
    Burst {
        func: Box<dyn Any + Send + Sync>,
        type_name: &'static str,
    },
}

impl fmt::Debug for HandlerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerEntry::Dispatch { type_name, .. } => write!(f, "Dispatch({type_name})"),
            HandlerEntry::Background(_) => write!(f, "Background"),
            HandlerEntry::Burst { type_name, .. } => write!(f, "Burst({type_name})"),
        }
    }
}

/// Builds a [`Nexus`]: URI, handlers, workers, SM link, clock.
#[derive(Debug)]
pub struct NexusBuilder {
    uri: Uri,
    handlers: Vec<(u8, HandlerEntry)>,
    workers: Option<usize>,
    dispatch: WorkerDispatch,
    idle: WorkerIdle,
    drop_wait: Duration,
    stepped: bool,
    link: Option<Arc<dyn SmLink>>,
    clock: Option<Clock>,
    seed: Option<u64>,
    failure_timeout_ms: u64,
    sm_extensions: bool,
    inspect: bool,
    error: Option<NexusError>,
}

impl NexusBuilder {
    /// A builder for a Nexus on `uri` (`host:port`); a bad URI is reported
    /// by [`NexusBuilder::build`].
    pub(super) fn new(uri: &str) -> NexusBuilder {
        let (uri, error) = match Uri::parse(uri) {
            Ok(u) => (u, None),
            Err(e) => (Uri::new("invalid", 0), Some(e)),
        };
        NexusBuilder {
            uri,
            handlers: Vec::new(),
            workers: None,
            dispatch: WorkerDispatch::default(),
            idle: WorkerIdle::default(),
            drop_wait: workers::DEFAULT_DROP_WAIT,
            stepped: false,
            link: None,
            clock: None,
            seed: None,
            failure_timeout_ms: FAILURE_TIMEOUT_MS,
            sm_extensions: true,
            inspect: false,
            error,
        }
    }

    /// Registers a dispatch-mode handler for `req_type`: it runs in the
    /// Rpc's event loop and may read its request in place (zero copy).
    pub fn handler<T, C>(mut self, req_type: u8, func: crate::ReqHandler<T, C>) -> Self
    where
        T: transport::Transport + 'static,
        C: 'static,
    {
        self.add(
            req_type,
            HandlerEntry::Dispatch {
                func: Box::new(func),
                type_name: std::any::type_name::<crate::ReqHandler<T, C>>(),
            },
        );
        self
    }

    /// Registers a burst handler for `req_type`: it runs in the Rpc's
    /// event loop, once per RX burst that brought requests of the type,
    /// with all of them ([`crate::Burst`], at most [`crate::MAX_BURST`]
    /// per call), each read in place (zero copy), and responds to each
    /// (now, or later for a deferred response). At-most-once, loss
    /// recovery and session resets are as for [`NexusBuilder::handler`];
    /// multi-packet requests still arrive one by one (a burst of one).
    /// Request types without a burst handler pay nothing for it.
    pub fn burst_handler<T, C>(mut self, req_type: u8, func: crate::BurstHandler<T, C>) -> Self
    where
        T: transport::Transport + 'static,
        C: 'static,
    {
        self.add(
            req_type,
            HandlerEntry::Burst {
                func: Box::new(func),
                type_name: std::any::type_name::<crate::BurstHandler<T, C>>(),
            },
        );
        self
    }

    /// Registers a background handler for `req_type`: it runs on a worker
    /// thread with a copy of the request and writes its response into a
    /// [`BgResponse`].
    pub fn bg_handler<F>(mut self, req_type: u8, func: F) -> Self
    where
        F: Fn(&[u8], &mut BgResponse<'_>) + Send + Sync + 'static,
    {
        self.add(req_type, HandlerEntry::Background(Arc::new(func)));
        self
    }

    fn add(&mut self, req_type: u8, e: HandlerEntry) {
        if self.handlers.iter().any(|(t, _)| *t == req_type) {
            self.error
                .get_or_insert(NexusError::DuplicateHandler(req_type));
        }
        self.handlers.push((req_type, e));
    }

    /// Number of worker threads for background handlers (default 1 with
    /// the TSC clock). 0 (the default with a virtual clock) runs background
    /// handlers inline in the owning Rpc's next event-loop iteration,
    /// through the same queues, deterministically.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self.stepped = false;
        self
    }

    /// How background requests are handed to the worker threads (default
    /// [`WorkerDispatch::RoundRobin`]). [`WorkerDispatch::SingleQueue`]
    /// keeps a job that no worker may take yet in the Rpc's FIFO backlog,
    /// so that a long request never holds up a short one while another
    /// worker is idle (depth 1), or at most behind one running job (depth
    /// 2). No effect with 0 workers.
    pub fn worker_dispatch(mut self, policy: WorkerDispatch) -> Self {
        self.dispatch = policy;
        self
    }

    /// What an idle worker does (default [`WorkerIdle::SpinThenPark`]
    /// after 1 ms): [`WorkerIdle::Spin`] for the shortest hand-off with a
    /// core per worker, or park after an idle time so that idle workers
    /// give their cores back (the first job after a park pays an OS
    /// wake-up). See the `nexus::workers` module documentation.
    pub fn worker_idle(mut self, idle: WorkerIdle) -> Self {
        self.idle = idle;
        self
    }

    /// How long dropping an Rpc waits at most for its background jobs
    /// still running on workers (default 1 s). Jobs not yet started are
    /// handed back unrun at once; a handler that runs longer is abandoned
    /// (its buffers are never reused, and the Rpc's allocator keeps its
    /// memory), so a handler that never returns cannot block the drop.
    /// Dropping the Nexus waits as long at most for its worker threads to
    /// end, then leaves a thread still in a handler running.
    pub fn worker_drop_wait(mut self, wait: Duration) -> Self {
        self.drop_wait = wait;
        self
    }

    /// `n` workers without threads, run by the caller with
    /// [`Nexus::take_job`] and [`Nexus::finish_job`] (or
    /// [`Nexus::step_workers`]): the same hand-off (links, rings, policy)
    /// as worker threads, deterministic, for simulations in virtual time
    /// with modelled service times and for instruction counts. Overrides
    /// [`NexusBuilder::workers`].
    #[cfg(feature = "testing")]
    pub fn stepped_workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self.stepped = true;
        self
    }

    /// The SM link (default: kernel UDP on the URI's port).
    pub fn sm_link(mut self, link: Arc<dyn SmLink>) -> Self {
        self.link = Some(link);
        self
    }

    /// The clock (default: the calibrated TSC).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Seed for session tokens and the Nexus incarnation (default: OS
    /// randomness). Simulations set it so that a run replays exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The machine-failure timeout (default 500 ms): a remote Nexus that
    /// answers no keep-alive ping for this long is declared failed and
    /// every session to it is reset (its requests complete with
    /// [`crate::RpcError::SessionEnded`], [`crate::SessionEnd::PeerFailed`]). Pings go out ten times per
    /// timeout. Values below 10 ms are raised to 10 ms.
    pub fn failure_timeout_ms(mut self, ms: u64) -> Self {
        self.failure_timeout_ms = ms.max(10);
        self
    }

    /// Whether this Nexus's SM endpoints carry the erpc-rs extensions
    /// (incarnation, request-number base; see
    /// [`crate::sm_types::EXT_INCARNATION`]), default on. Off, the Nexus
    /// presents itself in session management exactly as a C++ eRPC process
    /// does: its peers cannot ping it and number requests from 0. For
    /// interoperability tests.
    pub fn sm_extensions(mut self, on: bool) -> Self {
        self.sm_extensions = on;
        self
    }

    /// Exposes this Nexus and its Rpcs on the process's debug endpoint
    /// (`erpc-inspect`; see [`crate::inspect`]). Off by default;
    /// `ERPC_INSPECT=1` in the environment turns it on too. Each Rpc's
    /// event loop then checks one atomic per iteration. If the endpoint
    /// cannot start (no writable socket directory), the Nexus logs a
    /// warning and works without it.
    pub fn inspect(mut self, on: bool) -> Self {
        self.inspect = on;
        self
    }

    /// Starts the Nexus: spawns workers and starts the SM link.
    pub fn build(self) -> Result<Arc<Nexus>, NexusError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut handlers: Vec<Option<HandlerEntry>> = (0..256).map(|_| None).collect();
        let mut bg: Vec<Option<BgHandler>> = (0..256).map(|_| None).collect();
        for (t, e) in self.handlers {
            if let HandlerEntry::Background(f) = &e {
                bg[usize::from(t)] = Some(f.clone());
            }
            handlers[usize::from(t)] = Some(e);
        }
        let clock = self.clock.unwrap_or_else(Clock::tsc);
        let n_workers = self
            .workers
            .unwrap_or(if clock.is_virtual() { 0 } else { 1 });
        let workers = WorkerPool::new(
            PoolConfig {
                workers: n_workers,
                policy: self.dispatch,
                idle: self.idle,
                drop_wait: self.drop_wait,
                stepped: self.stepped,
            },
            bg,
        )?;
        let link: Arc<dyn SmLink> = match self.link {
            Some(l) => l,
            None => Arc::new(UdpSmLink::new()),
        };
        let mut rng = match self.seed {
            Some(s) => Rng::new(s),
            None => Rng::from_entropy(),
        };
        // Ordered by creation time (see `nexus::liveness`): wall-clock
        // milliseconds, or virtual microseconds in a simulation.
        let created = if clock.is_virtual() {
            clock.now_ns() / 1_000
        } else {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        };
        let incarnation = liveness::incarnation_at(created, rng.next_u64());
        let router = Arc::new(SmRouter::new(
            self.uri.clone(),
            clock.clone(),
            incarnation,
            self.failure_timeout_ms * 1_000_000,
            rng.next_u64(),
        ));
        link.start(&self.uri, router.clone())?;
        let inspect = (self.inspect || debug_endpoint::env_enabled())
            .then(|| {
                crate::inspect::NexusInspect::register(
                    &self.uri,
                    router.clone(),
                    self.sm_extensions,
                    self.failure_timeout_ms,
                    workers.threads(),
                )
            })
            .flatten();
        Ok(Arc::new(Nexus {
            inspect,
            sm_extensions: self.sm_extensions,
            uri: self.uri,
            handlers,
            workers,
            router,
            link,
            clock,
            rng: Mutex::new(rng),
            orphans: Mutex::new(Orphans::default()),
            orphans_pending: AtomicBool::new(false),
        }))
    }
}
