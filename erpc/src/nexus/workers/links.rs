//! An Rpc's side of the hand-off: choosing a worker by the dispatch
//! policy, queueing jobs on its links, collecting finished ones.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::pool::WorkerPool;
use super::worker::{LinkState, Worker};
use super::{Job, WorkerDispatch};
use crate::nexus::spsc;

/// The Rpc's end of a link to one worker.
pub(super) struct RpcEnd {
    /// Jobs out on the link: `ring.len()` (at most its capacity).
    pub(super) ring: spsc::Owner<Job>,
    pub(super) state: Arc<LinkState>,
    /// The worker (its load and sleep flag), without going through the pool.
    pub(super) worker: Arc<Worker>,
}

/// An Rpc's links to the workers: where it submits jobs and collects them.
pub(crate) struct BgLinks {
    pub(super) ends: Vec<RpcEnd>,
    pub(super) policy: WorkerDispatch,
    /// Jobs one link holds.
    pub(super) cap: usize,
    /// Round robin: the worker tried first next.
    pub(super) next: usize,
    /// Jobs out on all links.
    pub(super) outstanding: usize,
}

impl fmt::Debug for BgLinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BgLinks({} links, {} jobs out)",
            self.ends.len(),
            self.outstanding
        )
    }
}

impl BgLinks {
    /// Jobs at workers (queued, running, or back but not collected).
    #[inline]
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Workers linked (0: background handlers run inline).
    #[inline]
    pub(crate) fn workers(&self) -> usize {
        self.ends.len()
    }

    /// Queues `job` on a worker chosen by the policy, without blocking;
    /// gives it back if no worker may take it now (every link full, or
    /// under single-queue dispatch every worker at its depth).
    #[allow(clippy::result_large_err)] // the job comes back to be queued locally
    #[inline]
    pub(crate) fn submit(&mut self, job: Job) -> Result<(), Job> {
        match self.reserve() {
            Some(w) => {
                self.push(w, job);
                Ok(())
            }
            None => Err(job),
        }
    }

    /// Chooses a worker by the policy and counts a job in its load (the
    /// caller then [`BgLinks::push`]es the job there); `None` if no worker
    /// may take one now (every link full, or under single-queue dispatch
    /// every worker at its depth). Choosing before the job is made lets
    /// the caller build it right in the link's ring.
    #[inline]
    pub(crate) fn reserve(&mut self) -> Option<usize> {
        match self.policy {
            WorkerDispatch::RoundRobin => self.reserve_round_robin(),
            WorkerDispatch::SingleQueue { depth } => self.reserve_jbsq(depth),
        }
    }

    /// Pushes `job` on link `w`, reserved by [`BgLinks::reserve`].
    #[inline(always)]
    pub(crate) fn push(&mut self, w: usize, job: Job) {
        let e = &mut self.ends[w];
        if e.ring.push(job).is_err() {
            // Never: the callers checked that the link has room.
            unreachable!("link full");
        }
        e.worker.wake();
        self.outstanding += 1;
    }

    #[inline]
    fn reserve_round_robin(&mut self) -> Option<usize> {
        let n = self.ends.len();
        let mut w = self.next;
        for _ in 0..n {
            if w >= n {
                w = 0;
            }
            let e = &self.ends[w];
            if e.ring.len() != self.cap {
                // Raised before the push and read with `sleeping` after
                // it: the parking protocol (module documentation).
                e.worker.hot.load.fetch_add(1, Ordering::SeqCst);
                self.next = w + 1;
                return Some(w);
            }
            w += 1;
        }
        None
    }

    /// Join-bounded-shortest-queue: the least-loaded worker below `depth`,
    /// ties broken by a rotating start so that idle workers share the work.
    /// The place is reserved by compare-and-swap (other Rpcs of the Nexus
    /// submit concurrently); a lost race moves on to the next choice.
    fn reserve_jbsq(&mut self, depth: usize) -> Option<usize> {
        let n = self.ends.len();
        // Each pass either reserves a place or sees a load rise (another
        // submitter won it); n + 1 passes bound the work per call.
        for _ in 0..=n {
            let mut best: Option<(usize, usize)> = None;
            for k in 0..n {
                let mut w = self.next + k;
                if w >= n {
                    w -= n;
                }
                if self.ends[w].ring.len() == self.cap {
                    continue;
                }
                let load = self.ends[w].worker.hot.load.load(Ordering::Acquire);
                if load < depth && best.is_none_or(|(_, l)| load < l) {
                    best = Some((w, load));
                    if load == 0 {
                        break;
                    }
                }
            }
            let (w, load) = best?;
            if self.ends[w]
                .worker
                .hot
                .load
                .compare_exchange(load, load + 1, Ordering::SeqCst, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.next = if w + 1 == n { 0 } else { w + 1 };
            return Some(w);
        }
        None
    }

    /// The next finished job, if any.
    #[inline]
    pub(crate) fn pop_done(&mut self) -> Option<Job> {
        for e in self.ends.iter_mut() {
            if let Some(j) = e.ring.pop() {
                self.outstanding -= 1;
                return Some(j);
            }
        }
        None
    }

    /// Hands finished jobs to `f`, at most `max`; returns how many.
    #[inline]
    pub(crate) fn collect(&mut self, max: usize, mut f: impl FnMut(Job)) -> usize {
        let mut got = 0;
        for e in self.ends.iter_mut() {
            while got < max {
                let Some(j) = e.ring.pop() else {
                    break;
                };
                self.outstanding -= 1;
                got += 1;
                f(j);
            }
        }
        got
    }

    /// The Rpc is going away: retires its links (workers hand queued jobs
    /// back unrun) and collects every job into `f`, waiting at most the
    /// pool's drop wait for running handlers. Returns the jobs still out.
    pub(crate) fn retire(&mut self, pool: &WorkerPool, mut f: impl FnMut(Job)) -> usize {
        for e in self.ends.iter() {
            e.state.retired.store(true, Ordering::Release);
            e.worker.changed.store(true, Ordering::SeqCst);
            e.worker.wake();
        }
        pool.refresh_stepped();
        let deadline = Instant::now() + pool.drop_wait;
        loop {
            self.collect(usize::MAX, &mut f);
            if self.outstanding == 0 || Instant::now() >= deadline {
                return self.outstanding;
            }
            std::thread::yield_now();
        }
    }
}
