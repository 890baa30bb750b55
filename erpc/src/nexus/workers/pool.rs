//! The Nexus's workers as one pool: made from the builder's settings,
//! linked to each new Rpc, shut down with the Nexus.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::links::{BgLinks, RpcEnd};
#[cfg(feature = "testing")]
use super::worker::WorkerLocal;
use super::worker::{LinkState, Worker, WorkerEnd, worker_main};
use super::{BgHandler, WorkerDispatch, WorkerIdle, WorkerStats};
use crate::nexus::{NexusError, spsc};

/// Shared by the pool handle, the worker threads and the Rpcs' links.
pub(super) struct PoolShared {
    pub(super) workers: Box<[Arc<Worker>]>,
    pub(super) handlers: Box<[Option<BgHandler>]>,
    pub(super) idle: WorkerIdle,
    pub(super) shutdown: AtomicBool,
}

/// The Nexus's workers.
pub(crate) struct WorkerPool {
    pub(super) shared: Arc<PoolShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    policy: WorkerDispatch,
    pub(super) drop_wait: Duration,
    /// Workers without threads, run by the caller.
    #[cfg(feature = "testing")]
    pub(super) stepped: Box<[Mutex<WorkerLocal>]>,
}

impl fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WorkerPool({} workers, {}, {})",
            self.threads(),
            self.policy,
            self.shared.idle
        )
    }
}

/// How a pool is made (from the Nexus builder).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolConfig {
    pub workers: usize,
    pub policy: WorkerDispatch,
    pub idle: WorkerIdle,
    pub drop_wait: Duration,
    /// Workers without threads (the `sim` feature's stepped workers).
    pub stepped: bool,
}

impl WorkerPool {
    pub(crate) fn new(
        cfg: PoolConfig,
        handlers: Vec<Option<BgHandler>>,
    ) -> Result<WorkerPool, NexusError> {
        if let WorkerDispatch::SingleQueue { depth } = cfg.policy
            && !(1..=WorkerDispatch::MAX_DEPTH).contains(&depth)
        {
            return Err(NexusError::WorkerDispatch { depth });
        }
        let shared = Arc::new(PoolShared {
            workers: (0..cfg.workers).map(|_| Arc::default()).collect(),
            handlers: handlers.into_boxed_slice(),
            idle: cfg.idle,
            shutdown: AtomicBool::new(false),
        });
        let mut pool = WorkerPool {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
            policy: cfg.policy,
            drop_wait: cfg.drop_wait,
            #[cfg(feature = "testing")]
            stepped: Box::new([]),
        };
        if cfg.stepped {
            #[cfg(feature = "testing")]
            {
                pool.stepped = (0..cfg.workers)
                    .map(|_| Mutex::new(WorkerLocal::default()))
                    .collect();
                return Ok(pool);
            }
        }
        for index in 0..cfg.workers {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("erpc-worker-{index}"))
                .spawn(move || worker_main(s, index))
                .map_err(|source| NexusError::Spawn { index, source });
            match t {
                Ok(t) => pool.threads.get_mut().expect("not shared yet").push(t),
                Err(e) => {
                    pool.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// Number of workers (threads, or stepped workers).
    pub(crate) fn threads(&self) -> usize {
        self.shared.workers.len()
    }

    pub(crate) fn policy(&self) -> WorkerDispatch {
        self.policy
    }

    pub(crate) fn idle(&self) -> WorkerIdle {
        self.shared.idle
    }

    pub(crate) fn stats(&self) -> Vec<WorkerStats> {
        self.shared
            .workers
            .iter()
            .map(|w| WorkerStats {
                jobs: w.hot.jobs.load(Ordering::Relaxed),
                load: w.hot.load.load(Ordering::Relaxed),
                panics: w.hot.panics.load(Ordering::Relaxed),
                parks: w.hot.parks.load(Ordering::Relaxed),
            })
            .collect()
    }

    pub(crate) fn handlers(&self) -> &[Option<BgHandler>] {
        &self.shared.handlers
    }

    /// Links a new Rpc to every worker (no links without workers).
    pub(crate) fn connect(&self, rpc_id: u8) -> BgLinks {
        let cap = self.policy.link_jobs();
        let mut ends = Vec::with_capacity(self.threads());
        for w in self.shared.workers.iter() {
            let (owner, worker) = spsc::ring(cap);
            let state = Arc::new(LinkState::default());
            w.inbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(WorkerEnd {
                    ring: worker,
                    state: state.clone(),
                });
            w.changed.store(true, Ordering::SeqCst);
            w.wake();
            ends.push(RpcEnd {
                ring: owner,
                state,
                worker: w.clone(),
            });
        }
        let n = ends.len().max(1);
        BgLinks {
            policy: self.policy,
            cap: ends.first().map_or(0, |e| e.ring.capacity()),
            ends,
            next: usize::from(rpc_id) % n,
            outstanding: 0,
        }
    }

    /// Stepped workers: lets each look at its inbox and retired links.
    pub(super) fn refresh_stepped(&self) {
        #[cfg(feature = "testing")]
        for (me, l) in self.shared.workers.iter().zip(self.stepped.iter()) {
            if me.changed.load(Ordering::Acquire) {
                l.lock().unwrap_or_else(|e| e.into_inner()).refresh(me);
            }
        }
    }

    pub(crate) fn shutdown(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for w in self.shared.workers.iter() {
            w.wake();
        }
        // Each worker ends once it finds no job; one still in a handler
        // is waited for at most the drop wait, then left to finish on its
        // own (detached), so dropping the Nexus never blocks forever.
        let threads: Vec<JoinHandle<()>> = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let deadline = Instant::now() + self.drop_wait;
        while !threads.iter().all(|t| t.is_finished()) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::error!(
                    "a worker thread is still in a handler after the drop wait; leaving it running"
                );
            }
        }
    }
}
