//! One worker: its shared state (load, the park protocol of the module
//! documentation), its ends of the links, and the thread's loop.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::pool::PoolShared;
use super::{BgHandler, Job, Outcome, POLLS_PER_CLOCK_READ, WorkerIdle, run_job};
use crate::nexus::spsc;

/// A worker's shared state, on its own cache line: the submitting Rpcs
/// read `load` and `sleeping`, the worker writes its counters.
#[derive(Default)]
pub(super) struct Hot {
    /// Jobs submitted to this worker whose handler has not returned.
    pub(super) load: AtomicUsize,
    /// The worker is parked or about to park.
    pub(super) sleeping: AtomicBool,
    pub(super) jobs: AtomicU64,
    pub(super) panics: AtomicU64,
    pub(super) parks: AtomicU64,
}

/// One worker as everyone sees it.
#[derive(Default)]
pub(super) struct Worker {
    pub(super) hot: CachePadded<Hot>,
    /// Links made since the worker last looked.
    pub(super) inbox: Mutex<Vec<WorkerEnd>>,
    /// The inbox has links, or a link was retired: the worker should look.
    pub(super) changed: AtomicBool,
    /// The worker's thread, once it runs (whom to unpark).
    pub(super) thread: OnceLock<Thread>,
}

impl Worker {
    /// Worker side: announce sleep. True if the worker may park now (no
    /// job submitted, nothing changed, no shutdown): a submitter that comes
    /// later sees `sleeping` and wakes it.
    pub(super) fn announce_sleep(&self, shutdown: &AtomicBool) -> bool {
        self.hot.sleeping.store(true, Ordering::SeqCst);
        // Paired with the submitter's SeqCst raise of `load` and read of
        // `sleeping` (and `changed`/`shutdown` with `wake`'s): see the
        // module documentation.
        if self.hot.load.load(Ordering::SeqCst) != 0
            || self.changed.load(Ordering::SeqCst)
            || shutdown.load(Ordering::SeqCst)
        {
            self.hot.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Worker side: sleeps until a waker clears `sleeping` (a spurious
    /// return from `park` sleeps again).
    pub(super) fn sleep(&self) {
        self.hot.parks.fetch_add(1, Ordering::Relaxed);
        while self.hot.sleeping.load(Ordering::SeqCst) {
            std::thread::park();
        }
    }

    /// Wakes the worker if it announced sleep. Call after the write that
    /// it must see (the load's raise, `changed`, `shutdown`), with SeqCst.
    #[inline]
    pub(super) fn wake(&self) {
        if self.hot.sleeping.load(Ordering::SeqCst) {
            self.wake_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self) {
        // One waker wins the swap and unparks; the others see `false`.
        if self.hot.sleeping.swap(false, Ordering::SeqCst)
            && let Some(t) = self.thread.get()
        {
            t.unpark();
        }
    }
}

/// A link's state both ends see.
#[derive(Default)]
pub(super) struct LinkState {
    /// The Rpc is gone (or going): hand its queued jobs back unrun.
    pub(super) retired: AtomicBool,
}

/// The worker's end of a link.
pub(super) struct WorkerEnd {
    pub(super) ring: spsc::Worker<Job>,
    pub(super) state: Arc<LinkState>,
}

/// A worker's own state: its links. Owned by the worker thread (or, for
/// stepped workers, behind a mutex).
#[derive(Default)]
pub(super) struct WorkerLocal {
    pub(super) ends: Vec<WorkerEnd>,
    /// The link polled first next time (the links take turns).
    pub(super) next: usize,
    /// Stepped workers: the link whose next job the caller took.
    #[cfg(feature = "testing")]
    pub(super) taken: Option<Arc<LinkState>>,
}

/// Runs `job` (on worker `me`) and counts it; the caller then hands it
/// back to its Rpc.
#[inline]
pub(super) fn work(me: &Worker, handlers: &[Option<BgHandler>], job: &mut Job) {
    run_job(job, handlers);
    let hot = &*me.hot;
    // Only this worker writes its counters: no read-modify-write.
    hot.jobs
        .store(hot.jobs.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    if job.outcome == Outcome::Panicked {
        hot.panics
            .store(hot.panics.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    // The room is released before the job goes back, so the Rpc that
    // sees the job back also sees the room.
    hot.load.fetch_sub(1, Ordering::Release);
}

impl WorkerLocal {
    /// Takes new links from the inbox and hands back the queued jobs of
    /// retired links, then forgets those.
    #[cold]
    #[inline(never)]
    pub(super) fn refresh(&mut self, me: &Worker) {
        // Cleared before looking, so a change after the look sets it again.
        me.changed.store(false, Ordering::SeqCst);
        self.ends
            .append(&mut me.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        self.ends.retain_mut(|e| {
            if !e.state.retired.load(Ordering::Acquire) {
                return true;
            }
            while e.ring.process(|j| {
                j.outcome = Outcome::Skipped;
                me.hot.load.fetch_sub(1, Ordering::Release);
            }) {}
            false
        });
        self.next = 0;
    }

    /// Runs the next job, the links taking turns, and hands it back.
    /// False if no link had one.
    #[inline]
    pub(super) fn run_next(&mut self, me: &Worker, handlers: &[Option<BgHandler>]) -> bool {
        let n = self.ends.len();
        for k in 0..n {
            let mut i = self.next + k;
            if i >= n {
                i -= n;
            }
            if self.ends[i].ring.process(|job| work(me, handlers, job)) {
                self.next = if i + 1 == n { 0 } else { i + 1 };
                return true;
            }
        }
        false
    }
}

pub(super) fn worker_main(shared: Arc<PoolShared>, index: usize) {
    let me = &shared.workers[index];
    let _ = me.thread.set(std::thread::current());
    let mut local = WorkerLocal::default();
    let mut empty_polls = 0u32;
    let mut idle_since: Option<Instant> = None;
    loop {
        if me.changed.load(Ordering::Acquire) {
            local.refresh(me);
        }
        if local.run_next(me, &shared.handlers) {
            idle_since = None;
            continue;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            break;
        }
        std::hint::spin_loop();
        if let WorkerIdle::SpinThenPark { after } = shared.idle {
            empty_polls = empty_polls.wrapping_add(1);
            if empty_polls.is_multiple_of(POLLS_PER_CLOCK_READ) {
                let now = Instant::now();
                let since = *idle_since.get_or_insert(now);
                if now.duration_since(since) >= after {
                    if me.announce_sleep(&shared.shutdown) {
                        me.sleep();
                    }
                    idle_since = None;
                }
            }
        }
    }
}
