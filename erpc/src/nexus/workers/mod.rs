//! Worker threads for background request handlers.
//!
//! # Hand-off
//!
//! Every (Rpc, worker) pair has a *link*: a bounded single-producer
//! single-consumer ring (`spsc`) that carries [`Job`]s from the Rpc to the
//! worker, which runs each where it lies in the ring and hands it back
//! through the same ring, in order. A link is
//! made when an Rpc is created (`WorkerPool::connect`, one per worker of
//! the Nexus), so the Rpcs of one Nexus share the workers without sharing
//! a queue: each ring has exactly one writer and one reader. The worker
//! side of a new link goes through the worker's inbox (a mutex and a flag,
//! touched only when Rpcs come and go); the worker polls its links in
//! turn. The Rpc polls the links that have jobs out for finished ones, in
//! its event loop, only while it has jobs out (the `pending` bit of
//! `rpc/ev_loop.rs`), so an idle event-loop iteration costs what it did.
//! A job is moved into the ring once and out once; the worker works on it
//! in place: no allocation, lock or system call per job (a parked
//! worker's wake-up is the exception, see below). A finished job keeps its
//! slot until the Rpc takes it out, so the worker never waits to hand one
//! back.
//!
//! When an Rpc is dropped it *retires* its links: it marks them, and each
//! worker hands the jobs of a retired link that it has not started back
//! unrun and forgets the link. `Rpc::drop` then waits for its jobs to come
//! back, but at most [`super::NexusBuilder::worker_drop_wait`]: a handler
//! that never returns cannot hold the dropping thread forever (its buffers
//! are then left to the worker, which frees nothing: the Rpc's allocator
//! keeps its memory mapped while buffers are out, see `mempool`). Dropping
//! the Nexus likewise waits at most that long for its worker threads.
//!
//! # Idle policy
//!
//! A worker with nothing to do polls its rings. With [`WorkerIdle::Spin`]
//! it never stops (the C++ eRPC's background threads do this): the
//! hand-off costs a cache-line transfer each way, and the worker holds its
//! core. With [`WorkerIdle::SpinThenPark`] (the default, after 1 ms) it
//! parks once it has found nothing for the idle time, and a submitter that
//! sees it parked wakes it (a system call, only then). No wake-up is lost:
//! the worker announces that it is going to sleep (`sleeping`) and then
//! reads its load; a submitter raises the load and then reads `sleeping`;
//! all four accesses are sequentially consistent, so at least one of the
//! two sees the other's write (the worker does not sleep, or the submitter
//! wakes it), and `std::thread::park` keeps a wake-up that arrives before
//! it is called.
//!
//! # Dispatch policy
//!
//! Which worker gets a job is the [`WorkerDispatch`] policy:
//!
//! * [`WorkerDispatch::RoundRobin`] — the next worker in this Rpc's turn
//!   (each Rpc starts at a different worker) whose link has room
//!   ([`RR_LINK_JOBS`] jobs). Cheap, but a short job can wait behind a long
//!   one on its worker while another worker sits idle.
//! * [`WorkerDispatch::SingleQueue`] — join-bounded-shortest-queue
//!   (JBSQ(d), from RPCValet): each worker holds at most `depth` jobs
//!   (the running one included) from all Rpcs together; a job goes to the
//!   worker holding the fewest, and when every worker holds `depth` it
//!   stays in the owning Rpc's FIFO backlog (the shared queue) until one
//!   drops below. With depth 1 a job starts only on an idle worker, so it
//!   never waits behind another job while a worker is free; depth 2 keeps
//!   a job ready at each worker so that it never idles between jobs, at
//!   the price of a short job possibly waiting behind one running job.
//!
//! A worker's load (jobs queued at it or running, from every Rpc) is an
//! atomic counter on the worker's own cache line: the submitting Rpc
//! raises it before pushing (under JBSQ reserving the place with a
//! compare-and-swap), the worker lowers it when the handler returns and
//! before the job goes back, so an Rpc that sees the job back also sees the
//! room.
//!
//! # Panics
//!
//! A handler runs under `catch_unwind`. A panic does not end the worker:
//! the job goes back marked as panicked, the worker's and the Rpc's panic
//! counters go up, and the Rpc fails the request with
//! [`crate::ServerError::HandlerPanicked`] (`rpc/bg.rs`).
//!
//! # Stepped workers
//!
//! With the `sim` feature, [`super::NexusBuilder::stepped_workers`] makes
//! workers without threads that the caller runs ([`super::Nexus::take_job`],
//! [`super::Nexus::finish_job`]): the same links, rings and policies,
//! deterministic, on virtual time; used for instruction counts and for
//! simulated service times.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use transport::MAX_DATA_PER_PKT;

use super::NexusError;
use super::spsc;
use crate::consts::MAX_MSG_BYTES;
use crate::msgbuf::MsgBuf;

/// A background handler: reads the request, writes the response.
pub type BgHandler = Arc<dyn Fn(&[u8], &mut BgResponse<'_>) + Send + Sync>;

/// Jobs a link holds under round robin (per Rpc and worker); further jobs
/// wait in the Rpc's backlog.
pub(crate) const RR_LINK_JOBS: usize = 256;
/// Jobs a link holds under single-queue dispatch, at least: a worker
/// holds at most `depth` queued or running, but its finished jobs keep
/// their slots until the Rpc's next poll.
const SQ_LINK_JOBS: usize = 64;
/// Empty polls between two reads of the clock while spinning before a park.
const POLLS_PER_CLOCK_READ: u32 = 64;
/// Default idle time before a worker parks.
pub(crate) const DEFAULT_PARK_AFTER: Duration = Duration::from_millis(1);
/// Default longest wait of `Rpc::drop` for its jobs at workers.
pub(crate) const DEFAULT_DROP_WAIT: Duration = Duration::from_secs(1);

/// How a Nexus hands background requests to its worker threads (see the
/// module documentation and [`super::NexusBuilder::worker_dispatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerDispatch {
    /// The next worker in turn whose link has room (the default).
    #[default]
    RoundRobin,
    /// Join-bounded-shortest-queue: at most `depth` jobs per worker (the
    /// running one included), to the worker holding the fewest; the rest
    /// wait in the Rpc's FIFO backlog. `depth` is 1 to
    /// [`WorkerDispatch::MAX_DEPTH`]; 1 or 2 is the useful range.
    SingleQueue {
        /// Jobs a worker may hold, running or queued.
        depth: usize,
    },
}

impl WorkerDispatch {
    /// The deepest per-worker queue [`WorkerDispatch::SingleQueue`] takes.
    pub const MAX_DEPTH: usize = 64;

    /// Single-queue dispatch with per-worker depth `depth`.
    pub fn single_queue(depth: usize) -> WorkerDispatch {
        WorkerDispatch::SingleQueue { depth }
    }

    /// Jobs one link's ring holds under this policy.
    fn link_jobs(self) -> usize {
        match self {
            WorkerDispatch::RoundRobin => RR_LINK_JOBS,
            WorkerDispatch::SingleQueue { depth } => depth.max(SQ_LINK_JOBS),
        }
    }
}

impl fmt::Display for WorkerDispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerDispatch::RoundRobin => f.write_str("round-robin"),
            WorkerDispatch::SingleQueue { depth } => write!(f, "single-queue (JBSQ({depth}))"),
        }
    }
}

/// What a worker does when it finds no job (see the module documentation
/// and [`super::NexusBuilder::worker_idle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerIdle {
    /// Poll forever: the shortest hand-off, and a core per worker spent
    /// whether there is work or not.
    Spin,
    /// Poll for `after` with nothing to do, then sleep until a job comes
    /// (the submitting Rpc wakes it: a system call and an OS wake-up,
    /// microseconds, paid by the first job after an idle period).
    SpinThenPark {
        /// Idle time before parking.
        after: Duration,
    },
}

impl Default for WorkerIdle {
    /// Spin for 1 ms, then park: on a machine with a core per worker a
    /// busy server's workers never park (a job comes well within 1 ms), so
    /// every hand-off is a poll, while an idle server gives its cores back
    /// after a millisecond.
    fn default() -> WorkerIdle {
        WorkerIdle::SpinThenPark {
            after: DEFAULT_PARK_AFTER,
        }
    }
}

impl fmt::Display for WorkerIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerIdle::Spin => f.write_str("spin"),
            WorkerIdle::SpinThenPark { after } => write!(f, "spin, park after {after:?}"),
        }
    }
}

/// One worker's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs this worker has finished (panicked ones included).
    pub jobs: u64,
    /// Jobs at this worker now, queued or running.
    pub load: usize,
    /// Handlers that panicked on this worker.
    pub panics: u64,
    /// Times this worker parked (slept until woken).
    pub parks: u64,
}

/// A worker's shared state, on its own cache line: the submitting Rpcs
/// read `load` and `sleeping`, the worker writes its counters.
#[derive(Default)]
struct Hot {
    /// Jobs submitted to this worker whose handler has not returned.
    load: AtomicUsize,
    /// The worker is parked or about to park.
    sleeping: AtomicBool,
    jobs: AtomicU64,
    panics: AtomicU64,
    parks: AtomicU64,
}

/// One worker as everyone sees it.
#[derive(Default)]
struct Worker {
    hot: CachePadded<Hot>,
    /// Links made since the worker last looked.
    inbox: Mutex<Vec<WorkerEnd>>,
    /// The inbox has links, or a link was retired: the worker should look.
    changed: AtomicBool,
    /// The worker's thread, once it runs (whom to unpark).
    thread: OnceLock<Thread>,
}

impl Worker {
    /// Worker side: announce sleep. True if the worker may park now (no
    /// job submitted, nothing changed, no shutdown): a submitter that comes
    /// later sees `sleeping` and wakes it.
    fn announce_sleep(&self, shutdown: &AtomicBool) -> bool {
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
    fn sleep(&self) {
        self.hot.parks.fetch_add(1, Ordering::Relaxed);
        while self.hot.sleeping.load(Ordering::SeqCst) {
            std::thread::park();
        }
    }

    /// Wakes the worker if it announced sleep. Call after the write that
    /// it must see (the load's raise, `changed`, `shutdown`), with SeqCst.
    #[inline]
    fn wake(&self) {
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

/// What became of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not run yet.
    Queued,
    /// The response (`len` bytes) is in `resp`.
    Small,
    /// The response (`len` bytes) is in `large`.
    Large,
    /// The handler panicked.
    Panicked,
    /// Not run: its Rpc retired the link first.
    Skipped,
}

/// A background request on its way to a worker and back: the request
/// copied into a msgbuf, the slot's preallocated response msgbuf, and
/// where it came from. The same value goes both ways (no copy into
/// another type).
pub(crate) struct Job {
    pub req: MsgBuf,
    pub resp: MsgBuf,
    pub req_num: u64,
    /// Heap buffer for a large response, recycled by the Rpc (empty, with
    /// capacity from earlier jobs). Boxed: 8 bytes in every job instead of
    /// 24 (jobs are moved into and out of the ring), for a buffer most
    /// jobs never use.
    #[allow(clippy::box_collection)]
    pub large: Box<Vec<u8>>,
    /// Response length (set by the worker).
    pub len: u32,
    pub session: u16,
    pub slot: u8,
    pub req_type: u8,
    pub outcome: Outcome,
}

/// Where a background handler writes its response.
///
/// Responses up to one packet's data (968 B) are written straight into the
/// server slot's preallocated DMA buffer; larger ones go to a heap buffer
/// that the Rpc copies into a msgbuf (one copy; the heap buffers are
/// recycled between jobs, so only growth allocates).
pub struct BgResponse<'a> {
    small: &'a mut MsgBuf,
    large: &'a mut Vec<u8>,
    len: usize,
    use_large: bool,
}

impl fmt::Debug for BgResponse<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BgResponse {{ len {}, large {} }}",
            self.len, self.use_large
        )
    }
}

impl BgResponse<'_> {
    /// A writable response of `len` bytes (zeroed only if it is large).
    ///
    /// # Panics
    /// If `len` exceeds the largest message (the request then fails with
    /// [`crate::ServerError::HandlerPanicked`], like any handler panic).
    pub fn buf(&mut self, len: usize) -> &mut [u8] {
        assert!(
            len <= MAX_MSG_BYTES,
            "response of {len} bytes exceeds {MAX_MSG_BYTES}"
        );
        self.len = len;
        if len <= MAX_DATA_PER_PKT.min(self.small.max_len()) {
            self.use_large = false;
            self.small.resize(len).expect("checked against capacity");
            self.small.data_mut()
        } else {
            self.use_large = true;
            self.large.clear();
            self.large.resize(len, 0);
            &mut self.large[..]
        }
    }

    /// Sets the response to a copy of `data`.
    pub fn write(&mut self, data: &[u8]) {
        self.buf(data.len()).copy_from_slice(data);
    }
}

/// Runs `job`'s handler in place, catching a panic; sets its outcome.
pub(crate) fn run_job(job: &mut Job, handlers: &[Option<BgHandler>]) {
    let Some(h) = &handlers[usize::from(job.req_type)] else {
        // The Rpc submits only types with a background handler.
        debug_assert!(false, "no background handler for type {}", job.req_type);
        job.outcome = Outcome::Panicked;
        return;
    };
    let mut r = BgResponse {
        small: &mut job.resp,
        large: &mut job.large,
        len: 0,
        use_large: false,
    };
    let req = job.req.data();
    // The handler sees only the request bytes and `r`; whatever it left
    // half-written there is discarded below, so no broken invariant
    // outlives the panic.
    let ran = catch_unwind(AssertUnwindSafe(|| h(req, &mut r)));
    let (len, use_large) = (r.len, r.use_large);
    job.len = len as u32;
    job.outcome = match ran {
        Err(_) => Outcome::Panicked,
        Ok(()) if use_large => Outcome::Large,
        Ok(()) => {
            job.resp.resize(len).expect("within capacity");
            Outcome::Small
        }
    };
}

/// Shared by the pool handle, the worker threads and the Rpcs' links.
struct PoolShared {
    workers: Box<[Arc<Worker>]>,
    handlers: Box<[Option<BgHandler>]>,
    idle: WorkerIdle,
    shutdown: AtomicBool,
}

/// A link's state both ends see.
#[derive(Default)]
struct LinkState {
    /// The Rpc is gone (or going): hand its queued jobs back unrun.
    retired: AtomicBool,
}

/// The worker's end of a link.
struct WorkerEnd {
    ring: spsc::Worker<Job>,
    state: Arc<LinkState>,
}

/// The Rpc's end of a link to one worker.
struct RpcEnd {
    /// Jobs out on the link: `ring.len()` (at most its capacity).
    ring: spsc::Owner<Job>,
    state: Arc<LinkState>,
    /// The worker (its load and sleep flag), without going through the pool.
    worker: Arc<Worker>,
}

/// A worker's own state: its links. Owned by the worker thread (or, for
/// stepped workers, behind a mutex).
#[derive(Default)]
struct WorkerLocal {
    ends: Vec<WorkerEnd>,
    /// The link polled first next time (the links take turns).
    next: usize,
    /// Stepped workers: the link whose next job the caller took.
    #[cfg(feature = "sim")]
    taken: Option<Arc<LinkState>>,
}

/// Runs `job` (on worker `me`) and counts it; the caller then hands it
/// back to its Rpc.
#[inline]
fn work(me: &Worker, handlers: &[Option<BgHandler>], job: &mut Job) {
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
    fn refresh(&mut self, me: &Worker) {
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
    fn run_next(&mut self, me: &Worker, handlers: &[Option<BgHandler>]) -> bool {
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

fn worker_main(shared: Arc<PoolShared>, index: usize) {
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

/// A job taken by the caller from a stepped worker
/// ([`super::Nexus::take_job`]); give it back with
/// [`super::Nexus::finish_job`], which runs its handler.
#[cfg(feature = "sim")]
pub struct SteppedJob {
    worker: usize,
    link: Arc<LinkState>,
    /// A copy of the request (the job itself stays in its ring).
    req: Vec<u8>,
    req_type: u8,
}

#[cfg(feature = "sim")]
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

#[cfg(feature = "sim")]
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

/// The Nexus's workers.
pub(crate) struct WorkerPool {
    shared: Arc<PoolShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    policy: WorkerDispatch,
    drop_wait: Duration,
    /// Workers without threads, run by the caller.
    #[cfg(feature = "sim")]
    stepped: Box<[Mutex<WorkerLocal>]>,
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
            #[cfg(feature = "sim")]
            stepped: Box::new([]),
        };
        if cfg.stepped {
            #[cfg(feature = "sim")]
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

    /// Stepped workers: a worker's next job, if any (its links take
    /// turns); none while the caller holds one of this worker's jobs.
    #[cfg(feature = "sim")]
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
    #[cfg(feature = "sim")]
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
    #[cfg(feature = "sim")]
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

    /// Stepped workers: lets each look at its inbox and retired links.
    fn refresh_stepped(&self) {
        #[cfg(feature = "sim")]
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

/// An Rpc's links to the workers: where it submits jobs and collects them.
pub(crate) struct BgLinks {
    ends: Vec<RpcEnd>,
    policy: WorkerDispatch,
    /// Jobs one link holds.
    cap: usize,
    /// Round robin: the worker tried first next.
    next: usize,
    /// Jobs out on all links.
    outstanding: usize,
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

#[cfg(all(test, feature = "sim"))]
mod tests {
    //! The dispatch decision and the idle policy, on real worker threads:
    //! handlers that hold their worker until the test opens a gate, and
    //! report which worker ran them in the response. Every wait is for an
    //! event the test causes (no timeouts, no sleeps).

    use std::sync::{Arc, Condvar, Mutex};

    use super::*;
    use crate::msgbuf::Origin;

    /// Request types of the test handlers.
    const HOLD: u8 = 1;
    const QUICK: u8 = 2;
    const PANIC: u8 = 3;

    /// A gate each `HOLD` job waits at until the test opens it.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
        /// `HOLD` jobs that reached the gate.
        waiting: Mutex<usize>,
        arrived: Condvar,
    }

    impl Gate {
        fn pass(&self) {
            *self.waiting.lock().unwrap() += 1;
            self.arrived.notify_all();
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
        }
        fn wait_for(&self, n: usize) {
            let mut w = self.waiting.lock().unwrap();
            while *w < n {
                w = self.arrived.wait(w).unwrap();
            }
        }
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }
    }

    struct Fixture {
        pool: WorkerPool,
        links: BgLinks,
        gate: Arc<Gate>,
        alloc: mempool::Allocator,
        next_req: u64,
    }

    /// The worker that ran a finished job, from its response.
    fn worker_of(done: &Job) -> usize {
        let name = std::str::from_utf8(&done.resp.data()[..done.len as usize]).unwrap();
        name.trim_start_matches("erpc-worker-").parse().unwrap()
    }

    fn handlers(gate: &Arc<Gate>) -> Vec<Option<BgHandler>> {
        let mut handlers: Vec<Option<BgHandler>> = (0..256).map(|_| None).collect();
        let g = gate.clone();
        let name = |r: &mut BgResponse<'_>| {
            r.write(std::thread::current().name().unwrap_or("?").as_bytes())
        };
        handlers[usize::from(HOLD)] = Some(Arc::new(move |_req, r| {
            g.pass();
            name(r);
        }));
        handlers[usize::from(QUICK)] = Some(Arc::new(move |_req, r| name(r)));
        handlers[usize::from(PANIC)] =
            Some(Arc::new(|_req, _r| panic!("handler panics on purpose")));
        handlers
    }

    fn config(workers: usize, policy: WorkerDispatch, idle: WorkerIdle) -> PoolConfig {
        PoolConfig {
            workers,
            policy,
            idle,
            drop_wait: DEFAULT_DROP_WAIT,
            stepped: false,
        }
    }

    impl Fixture {
        fn new(workers: usize, policy: WorkerDispatch) -> Fixture {
            Fixture::with_idle(workers, policy, WorkerIdle::default())
        }

        fn with_idle(workers: usize, policy: WorkerDispatch, idle: WorkerIdle) -> Fixture {
            let gate = Arc::new(Gate::default());
            let pool = WorkerPool::new(config(workers, policy, idle), handlers(&gate)).unwrap();
            let links = pool.connect(0);
            Fixture {
                pool,
                links,
                gate,
                alloc: crate::sim::test_allocator(1 << 20),
                next_req: 0,
            }
        }

        fn job(&mut self, req_type: u8) -> Job {
            self.next_req += 1;
            Job {
                req_type,
                req: MsgBuf::alloc(&mut self.alloc, 8, Origin::Dynamic).unwrap(),
                resp: MsgBuf::alloc(&mut self.alloc, 64, Origin::Dynamic).unwrap(),
                session: 0,
                slot: 0,
                req_num: self.next_req,
                large: Box::default(),
                len: 0,
                outcome: Outcome::Queued,
            }
        }

        fn free(&mut self, j: Job) {
            self.alloc.free(j.req.into_buffer());
            self.alloc.free(j.resp.into_buffer());
        }

        fn submit(&mut self, req_type: u8) -> bool {
            let j = self.job(req_type);
            match self.links.submit(j) {
                Ok(()) => true,
                Err(j) => {
                    self.free(j);
                    false
                }
            }
        }

        fn loads(&self) -> Vec<usize> {
            self.pool.stats().iter().map(|s| s.load).collect()
        }

        /// Waits for the next finished job (polling, as an Rpc does).
        fn next_job(&mut self) -> Job {
            loop {
                let mut got = None;
                self.links.collect(1, |j| got = Some(j));
                if let Some(j) = got {
                    return j;
                }
                std::thread::yield_now();
            }
        }

        /// Waits for the next finished job; returns the worker that ran it.
        fn next_done(&mut self) -> usize {
            let d = self.next_job();
            assert_eq!(d.outcome, Outcome::Small);
            let w = worker_of(&d);
            self.free(d);
            w
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.gate.open();
            let alloc = &mut self.alloc;
            let left = self.links.retire(&self.pool, |j| {
                alloc.free(j.req.into_buffer());
                alloc.free(j.resp.into_buffer());
            });
            assert_eq!(left, 0);
            self.pool.shutdown();
        }
    }

    #[test]
    fn single_queue_depth_1_never_queues_behind_a_busy_worker() {
        let mut f = Fixture::new(2, WorkerDispatch::single_queue(1));
        assert!(f.submit(HOLD));
        f.gate.wait_for(1);
        let held = (0..2).find(|&w| f.loads()[w] == 1).unwrap();
        // Quick jobs, one at a time: every one goes to the idle worker and
        // finishes while the other worker is held.
        for _ in 0..20 {
            assert!(f.submit(QUICK));
            assert_eq!(f.next_done(), 1 - held);
        }
        // Both workers busy: the pool refuses (the job waits in the Rpc's
        // backlog), and takes jobs again once one is free.
        assert!(f.submit(HOLD));
        f.gate.wait_for(2);
        assert_eq!(f.loads(), vec![1, 1]);
        assert!(!f.submit(QUICK));
        f.gate.open();
        f.next_done();
        assert!(f.submit(QUICK));
        f.next_done();
        f.next_done();
        let jobs: u64 = f.pool.stats().iter().map(|s| s.jobs).sum();
        assert_eq!(jobs, 23);
        assert_eq!(f.loads(), vec![0, 0]);
    }

    #[test]
    fn single_queue_depth_2_fills_the_shortest_queue_first() {
        let mut f = Fixture::new(3, WorkerDispatch::single_queue(2));
        // Three held jobs: one per worker (the shortest queue is an idle one).
        for n in 1..=3 {
            assert!(f.submit(HOLD));
            f.gate.wait_for(n);
        }
        assert_eq!(f.loads(), vec![1, 1, 1]);
        // Three more: one queued behind each, then nothing fits.
        for _ in 0..3 {
            assert!(f.submit(QUICK));
        }
        assert_eq!(f.loads(), vec![2, 2, 2]);
        assert!(!f.submit(QUICK));
        f.gate.open();
        let mut ran = [0usize; 3];
        for _ in 0..6 {
            ran[f.next_done()] += 1;
        }
        assert_eq!(ran, [2, 2, 2]);
    }

    #[test]
    fn single_queue_counts_the_jobs_of_every_rpc() {
        // Two Rpcs' links to one worker at depth 1: while one Rpc's job
        // holds the worker, the other Rpc's job is refused.
        let mut f = Fixture::new(1, WorkerDispatch::single_queue(1));
        let mut other = f.pool.connect(1);
        assert!(f.submit(HOLD));
        f.gate.wait_for(1);
        let j = f.job(QUICK);
        let j = other.submit(j).unwrap_err();
        f.free(j);
        f.gate.open();
        f.next_done();
        let j = f.job(QUICK);
        assert!(other.submit(j).is_ok());
        let alloc = &mut f.alloc;
        let mut back = 0;
        while back == 0 {
            back += other.collect(usize::MAX, |j| {
                assert_eq!(j.outcome, Outcome::Small);
                alloc.free(j.req.into_buffer());
                alloc.free(j.resp.into_buffer());
            });
            std::thread::yield_now();
        }
        assert_eq!(other.retire(&f.pool, |_| unreachable!()), 0);
    }

    #[test]
    fn round_robin_queues_behind_a_held_worker() {
        // The contrast: round robin sends every other job to the held
        // worker, where it waits although the other worker is idle.
        let mut f = Fixture::new(2, WorkerDispatch::RoundRobin);
        assert!(f.submit(HOLD)); // worker 0
        f.gate.wait_for(1);
        assert!(f.submit(QUICK)); // worker 1
        assert_eq!(f.next_done(), 1);
        assert!(f.submit(QUICK)); // worker 0, behind the held job
        assert_eq!(f.loads(), vec![2, 0]);
        f.gate.open();
        let mut ran = [f.next_done(), f.next_done()];
        ran.sort_unstable();
        assert_eq!(ran, [0, 0]);
    }

    #[test]
    fn round_robin_keeps_jobs_in_the_backlog_when_a_link_is_full() {
        let mut f = Fixture::new(1, WorkerDispatch::RoundRobin);
        assert!(f.submit(HOLD));
        f.gate.wait_for(1);
        for _ in 1..RR_LINK_JOBS {
            assert!(f.submit(QUICK));
        }
        assert!(!f.submit(QUICK));
        f.gate.open();
        for _ in 0..RR_LINK_JOBS {
            f.next_done();
        }
        assert!(f.submit(QUICK));
        f.next_done();
    }

    #[test]
    fn a_panicking_handler_keeps_its_worker() {
        let mut f = Fixture::new(1, WorkerDispatch::single_queue(1));
        for _ in 0..3 {
            assert!(f.submit(PANIC));
            let j = f.next_job();
            assert_eq!(j.outcome, Outcome::Panicked);
            f.free(j);
            // The same worker serves the next job.
            assert!(f.submit(QUICK));
            assert_eq!(f.next_done(), 0);
        }
        let s = f.pool.stats()[0];
        assert_eq!((s.jobs, s.panics, s.load), (6, 3, 0));
    }

    #[test]
    fn retiring_hands_queued_jobs_back_unrun() {
        let mut f = Fixture::new(1, WorkerDispatch::RoundRobin);
        let mut other = f.pool.connect(1);
        // The worker holds `f`'s job; `other`'s jobs queue behind it.
        assert!(f.submit(HOLD));
        f.gate.wait_for(1);
        for _ in 0..3 {
            let j = f.job(QUICK);
            assert!(other.submit(j).is_ok());
        }
        let mut outcomes = Vec::new();
        // Retiring waits for the worker to hand the jobs back, which it
        // does only once the gate opens: another thread opens it once the
        // link is marked retired.
        let g = f.gate.clone();
        let st = other.ends[0].state.clone();
        let opener = std::thread::spawn(move || {
            while !st.retired.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            g.open()
        });
        let alloc = &mut f.alloc;
        let left = other.retire(&f.pool, |j| {
            outcomes.push(j.outcome);
            alloc.free(j.req.into_buffer());
            alloc.free(j.resp.into_buffer());
        });
        opener.join().unwrap();
        assert_eq!(left, 0);
        assert_eq!(outcomes, vec![Outcome::Skipped; 3]);
        f.next_done();
        assert_eq!(f.pool.stats()[0].jobs, 1);
        assert_eq!(f.loads(), vec![0]);
    }

    #[test]
    fn retiring_gives_up_on_a_handler_that_does_not_return() {
        let gate = Arc::new(Gate::default());
        let mut cfg = config(1, WorkerDispatch::RoundRobin, WorkerIdle::Spin);
        cfg.drop_wait = Duration::from_millis(1);
        let mut pool = WorkerPool::new(cfg, handlers(&gate)).unwrap();
        let mut links = pool.connect(0);
        let mut alloc = crate::sim::test_allocator(1 << 20);
        let job = |alloc: &mut mempool::Allocator, t| Job {
            req_type: t,
            req: MsgBuf::alloc(alloc, 8, Origin::Dynamic).unwrap(),
            resp: MsgBuf::alloc(alloc, 64, Origin::Dynamic).unwrap(),
            session: 0,
            slot: 0,
            req_num: 1,
            large: Box::default(),
            len: 0,
            outcome: Outcome::Queued,
        };
        assert!(links.submit(job(&mut alloc, HOLD)).is_ok());
        gate.wait_for(1);
        // The handler is held until after `retire` returns, so `retire`
        // can only return by giving up: it must, and say one job is out.
        assert_eq!(links.retire(&pool, |_| unreachable!()), 1);
        gate.open();
        // The worker lives on and serves another Rpc.
        let mut links = pool.connect(1);
        assert!(links.submit(job(&mut alloc, QUICK)).is_ok());
        let mut got = None;
        while got.is_none() {
            links.collect(1, |j| got = Some(j));
            std::thread::yield_now();
        }
        let j = got.unwrap();
        assert_eq!(j.outcome, Outcome::Small);
        alloc.free(j.req.into_buffer());
        alloc.free(j.resp.into_buffer());
        assert_eq!(links.retire(&pool, |_| unreachable!()), 0);
        pool.shutdown();
        // The abandoned job's buffers went with the worker's link: the
        // allocator keeps its memory (logged), never a dangling buffer.
        std::mem::forget(alloc);
    }

    #[test]
    fn shutting_down_gives_up_on_a_handler_that_does_not_return() {
        let gate = Arc::new(Gate::default());
        let mut cfg = config(1, WorkerDispatch::RoundRobin, WorkerIdle::Spin);
        cfg.drop_wait = Duration::from_millis(1);
        let mut pool = WorkerPool::new(cfg, handlers(&gate)).unwrap();
        let mut links = pool.connect(0);
        let mut alloc = crate::sim::test_allocator(1 << 20);
        let job = Job {
            req_type: HOLD,
            req: MsgBuf::alloc(&mut alloc, 8, Origin::Dynamic).unwrap(),
            resp: MsgBuf::alloc(&mut alloc, 64, Origin::Dynamic).unwrap(),
            session: 0,
            slot: 0,
            req_num: 1,
            large: Box::default(),
            len: 0,
            outcome: Outcome::Queued,
        };
        assert!(links.submit(job).is_ok());
        gate.wait_for(1);
        // Held until both return: they can only return by giving up.
        assert_eq!(links.retire(&pool, |_| unreachable!()), 1);
        pool.shutdown();
        gate.open();
        std::mem::forget(alloc);
    }

    #[test]
    fn the_park_protocol_loses_no_wake_up_in_either_order() {
        // The two interleavings of "worker announces sleep" and
        // "submitter raises the load", on one thread (the test plays the
        // worker; its own thread is the one unparked).
        let shutdown = AtomicBool::new(false);
        let w = Worker::default();
        w.thread.set(std::thread::current()).unwrap();
        // Submit first: the worker sees the load and does not sleep.
        w.hot.load.fetch_add(1, Ordering::SeqCst);
        w.wake();
        assert!(!w.announce_sleep(&shutdown));
        assert!(!w.hot.sleeping.load(Ordering::SeqCst));
        w.hot.load.fetch_sub(1, Ordering::SeqCst);
        // Announce first: the submitter sees `sleeping` and wakes the
        // worker, whose sleep then returns at once (the unpark token).
        assert!(w.announce_sleep(&shutdown));
        w.hot.load.fetch_add(1, Ordering::SeqCst);
        w.wake();
        assert!(!w.hot.sleeping.load(Ordering::SeqCst));
        w.sleep();
        assert_eq!(w.hot.parks.load(Ordering::Relaxed), 1);
        // A change of links and the shutdown count as work too.
        w.hot.load.fetch_sub(1, Ordering::SeqCst);
        w.changed.store(true, Ordering::SeqCst);
        assert!(!w.announce_sleep(&shutdown));
        w.changed.store(false, Ordering::SeqCst);
        shutdown.store(true, Ordering::SeqCst);
        assert!(!w.announce_sleep(&shutdown));
    }

    #[test]
    fn parking_workers_serve_every_job() {
        // Workers that park as soon as they find nothing (idle time 0):
        // every job races a worker going to sleep. A lost wake-up would
        // leave a job unserved and the test waiting for it.
        let mut f = Fixture::with_idle(
            2,
            WorkerDispatch::single_queue(1),
            WorkerIdle::SpinThenPark {
                after: Duration::ZERO,
            },
        );
        // Each job to a worker that went to sleep: the test waits until
        // both workers say so before submitting (no timing).
        for _ in 0..200 {
            while !f
                .pool
                .shared
                .workers
                .iter()
                .all(|w| w.hot.sleeping.load(Ordering::SeqCst))
            {
                std::thread::yield_now();
            }
            assert!(f.submit(QUICK));
            f.next_done();
        }
        // And racing the worker's way to sleep.
        for _ in 0..2_000 {
            assert!(f.submit(QUICK));
            f.next_done();
        }
        // Two at once, too.
        for _ in 0..500 {
            assert!(f.submit(QUICK));
            assert!(f.submit(QUICK));
            f.next_done();
            f.next_done();
        }
        let s = f.pool.stats();
        assert_eq!(s.iter().map(|s| s.jobs).sum::<u64>(), 3_200);
        assert!(s.iter().map(|s| s.parks).sum::<u64>() >= 200, "{s:?}");
    }

    #[test]
    fn stepped_workers_run_on_the_callers_thread() {
        let gate = Arc::new(Gate::default());
        let mut cfg = config(2, WorkerDispatch::single_queue(1), WorkerIdle::Spin);
        cfg.stepped = true;
        let pool = WorkerPool::new(cfg, handlers(&gate)).unwrap();
        let mut links = pool.connect(0);
        let mut f_alloc = crate::sim::test_allocator(1 << 20);
        let job = |alloc: &mut mempool::Allocator| Job {
            req_type: QUICK,
            req: MsgBuf::alloc(alloc, 8, Origin::Dynamic).unwrap(),
            resp: MsgBuf::alloc(alloc, 64, Origin::Dynamic).unwrap(),
            session: 0,
            slot: 0,
            req_num: 1,
            large: Box::default(),
            len: 0,
            outcome: Outcome::Queued,
        };
        for _ in 0..2 {
            assert!(links.submit(job(&mut f_alloc)).is_ok());
        }
        // JBSQ(1) with two workers: one job each, the third waits.
        let j = job(&mut f_alloc);
        let j = links.submit(j).unwrap_err();
        f_alloc.free(j.req.into_buffer());
        f_alloc.free(j.resp.into_buffer());
        let a = pool.take_job(0).unwrap();
        let b = pool.take_job(1).unwrap();
        assert!(pool.take_job(0).is_none());
        assert_eq!(a.request().len(), 8);
        pool.finish_job(b);
        pool.finish_job(a);
        let mut names = Vec::new();
        links.collect(usize::MAX, |j| {
            names.push(String::from_utf8(j.resp.data().to_vec()).unwrap());
            f_alloc.free(j.req.into_buffer());
            f_alloc.free(j.resp.into_buffer());
        });
        // The handler ran on this thread (the test's).
        let me = std::thread::current().name().unwrap_or("?").to_owned();
        assert_eq!(names, vec![me.clone(), me]);
        assert_eq!(links.outstanding(), 0);
        assert_eq!(links.retire(&pool, |_| unreachable!()), 0);
    }

    #[test]
    fn a_depth_outside_the_range_is_refused() {
        for depth in [0, WorkerDispatch::MAX_DEPTH + 1] {
            let cfg = config(1, WorkerDispatch::single_queue(depth), WorkerIdle::Spin);
            let e = WorkerPool::new(cfg, Vec::new()).map(|_| ()).unwrap_err();
            assert!(matches!(e, NexusError::WorkerDispatch { depth: d } if d == depth));
            assert!(e.to_string().contains("must be 1 to 64"), "{e}");
        }
        let cfg = config(0, WorkerDispatch::single_queue(1), WorkerIdle::Spin);
        assert!(WorkerPool::new(cfg, Vec::new()).is_ok());
    }

    #[test]
    fn the_builder_takes_the_policies_and_refuses_a_bad_depth() {
        let net = crate::sim::SimNet::new(crate::sim::SimConfig::default());
        let build = |uri: &str, policy| {
            crate::Nexus::builder(uri)
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .workers(2)
                .worker_dispatch(policy)
                .worker_idle(WorkerIdle::Spin)
                .build()
        };
        let n = build("a:1", WorkerDispatch::single_queue(2)).unwrap();
        assert_eq!(n.worker_dispatch(), WorkerDispatch::single_queue(2));
        assert_eq!(n.worker_idle(), WorkerIdle::Spin);
        assert_eq!(n.worker_stats(), vec![WorkerStats::default(); 2]);
        let d = build("b:1", WorkerDispatch::RoundRobin).unwrap();
        assert_eq!(d.worker_dispatch(), WorkerDispatch::RoundRobin);
        assert!(matches!(
            build("c:1", WorkerDispatch::single_queue(0)),
            Err(NexusError::WorkerDispatch { depth: 0 })
        ));
        let e = crate::Nexus::builder("d:1")
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .build()
            .unwrap();
        assert_eq!(e.worker_idle(), WorkerIdle::default());
    }

    #[test]
    fn policies_print_their_names() {
        assert_eq!(WorkerDispatch::RoundRobin.to_string(), "round-robin");
        assert_eq!(
            WorkerDispatch::single_queue(2).to_string(),
            "single-queue (JBSQ(2))"
        );
        assert_eq!(WorkerIdle::Spin.to_string(), "spin");
        assert_eq!(WorkerIdle::default().to_string(), "spin, park after 1ms");
    }
}
