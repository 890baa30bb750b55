//! Stepped workers (the `sim` feature): workers without threads that
//! the caller runs, one job at a time or a batch at a time.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::pool::WorkerPool;
use super::worker::{LinkState, work};

/// A job taken by the caller from a stepped worker
/// ([`crate::nexus::Nexus::take_job`]); give it back with
/// [`crate::nexus::Nexus::finish_job`], which runs its handler.
pub struct SteppedJob {
    worker: usize,
    link: Arc<LinkState>,
    /// A copy of the request (the job itself stays in its ring).
    req: Vec<u8>,
    req_type: u8,
}

impl fmt::Debug for SteppedJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SteppedJob {{ worker {}, type {}, {} request bytes }}",
            self.worker,
            self.req_type,
            self.req.len()
        )
    }
}

impl SteppedJob {
    /// The request's data.
    pub fn request(&self) -> &[u8] {
        &self.req
    }

    /// The request type.
    pub fn req_type(&self) -> u8 {
        self.req_type
    }

    /// The worker it was taken from.
    pub fn worker(&self) -> usize {
        self.worker
    }
}

impl WorkerPool {
    /// Stepped workers: a worker's next job, if any (its links take
    /// turns); none while the caller holds one of this worker's jobs.
    pub(crate) fn take_job(&self, worker: usize) -> Option<SteppedJob> {
        let me = &self.shared.workers[worker];
        let mut l = self
            .stepped
            .get(worker)?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if me.changed.load(Ordering::Acquire) {
            l.refresh(me);
        }
        if l.taken.is_some() {
            return None;
        }
        let n = l.ends.len();
        for k in 0..n {
            let i = (l.next + k) % n;
            let e = &mut l.ends[i];
            let Some(job) = e.ring.peek() else {
                continue;
            };
            let taken = SteppedJob {
                worker,
                link: e.state.clone(),
                req: job.req.data().to_vec(),
                req_type: job.req_type,
            };
            l.taken = Some(taken.link.clone());
            l.next = (i + 1) % n;
            return Some(taken);
        }
        None
    }

    /// Stepped workers: runs the handler of a taken job and hands it back
    /// to its Rpc (nothing to run if the Rpc retired the link meanwhile:
    /// the job went back unrun).
    pub(crate) fn finish_job(&self, job: SteppedJob) {
        let me = &self.shared.workers[job.worker];
        let mut l = self.stepped[job.worker]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        l.taken = None;
        if let Some(e) = l.ends.iter_mut().find(|e| Arc::ptr_eq(&e.state, &job.link)) {
            let handlers = &self.shared.handlers;
            let ran = e.ring.process(|j| work(me, handlers, j));
            debug_assert!(ran, "the taken job is the link's next");
        }
    }

    /// Stepped workers: worker `worker` runs every job it has now, at most
    /// `max` (none while the caller holds one of its jobs); returns how
    /// many it ran.
    pub(crate) fn run_stepped(&self, worker: usize, max: usize) -> usize {
        let me = &self.shared.workers[worker];
        let Some(l) = self.stepped.get(worker) else {
            return 0;
        };
        // What a worker thread's empty poll finds out, without the lock:
        // nothing submitted, nothing changed.
        if me.hot.load.load(Ordering::Acquire) == 0 && !me.changed.load(Ordering::Acquire) {
            return 0;
        }
        let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
        if me.changed.load(Ordering::Acquire) {
            l.refresh(me);
        }
        if l.taken.is_some() {
            return 0;
        }
        let mut n = 0;
        while n < max && l.run_next(me, &self.shared.handlers) {
            n += 1;
        }
        n
    }
}
