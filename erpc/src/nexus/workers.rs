//! Worker threads for background request handlers.
//!
//! The owning Rpc sends a [`Job`] (the request copied into a msgbuf, the
//! slot's preallocated response msgbuf, and the Rpc's reply queue) to a
//! worker through a bounded queue; the worker runs the handler and sends a
//! [`BgDone`] back through the Rpc's bounded reply queue, which the event
//! loop polls without blocking. Both queues are `std::sync::mpsc` bounded
//! channels (lock-free array queues, no allocation per message).
//!
//! Which worker gets a job is the [`WorkerDispatch`] policy:
//!
//! * [`WorkerDispatch::RoundRobin`] — the next worker in turn whose queue
//!   (1024 jobs) has room. Cheap, but a short job can wait behind a long
//!   one on its worker while another worker sits idle.
//! * [`WorkerDispatch::SingleQueue`] — join-bounded-shortest-queue
//!   (JBSQ(d), from RPCValet): each worker holds at most `depth` jobs
//!   (the running one included); a job goes to the worker holding the
//!   fewest, and when every worker holds `depth` it stays in the owning
//!   Rpc's FIFO backlog (the shared queue) until one drops below. With
//!   depth 1 a job starts only on an idle worker, so it never waits behind
//!   another job while a worker is free; depth 2 keeps a job ready at each
//!   worker so that it never sleeps between jobs, at the price of a short
//!   job possibly waiting behind one running job.
//!
//! A worker's load (jobs queued or running there) is an atomic counter of
//! its own cache line: the Rpc reserves a place with a compare-and-swap
//! before sending, the worker releases it when the handler returns.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use transport::MAX_DATA_PER_PKT;

use super::NexusError;
use crate::consts::MAX_MSG_BYTES;
use crate::msgbuf::MsgBuf;

/// A background handler: reads the request, writes the response.
pub type BgHandler = Arc<dyn Fn(&[u8], &mut BgResponse<'_>) + Send + Sync>;

/// Jobs queued per worker before the Rpc keeps them in its own backlog.
pub(crate) const WORKER_QUEUE_JOBS: usize = 1024;
/// Completions queued per Rpc before workers wait.
pub(crate) const BG_REPLY_QUEUE: usize = 4096;

/// How a Nexus hands background requests to its worker threads (see the
/// module documentation and [`super::NexusBuilder::worker_dispatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerDispatch {
    /// The next worker in turn whose queue has room (the default).
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

    /// Per-worker queue capacity under this policy.
    fn queue_jobs(self) -> usize {
        match self {
            WorkerDispatch::RoundRobin => WORKER_QUEUE_JOBS,
            WorkerDispatch::SingleQueue { depth } => depth,
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

/// One worker's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs this worker has finished.
    pub jobs: u64,
    /// Jobs at this worker now, queued or running.
    pub load: usize,
}

/// A worker's shared counters, alone on their cache line: the submitting
/// Rpcs read every worker's load, the worker writes its own.
#[repr(align(64))]
#[derive(Default)]
struct WorkerLoad {
    /// Jobs sent to this worker whose handler has not returned.
    load: AtomicUsize,
    /// Jobs finished.
    jobs: AtomicU64,
}

const _: () = assert!(std::mem::align_of::<WorkerLoad>() == 64);
const _: () = assert!(WorkerDispatch::MAX_DEPTH <= WORKER_QUEUE_JOBS);

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
    /// If `len` exceeds the largest message.
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

/// Work for a worker thread.
pub(crate) struct Job {
    pub req_type: u8,
    pub req: MsgBuf,
    pub resp: MsgBuf,
    pub session: u16,
    pub slot: u8,
    pub req_num: u64,
    pub reply: Option<SyncSender<BgDone>>,
    /// Heap buffer for a large response, recycled by the Rpc (empty, with
    /// capacity from earlier jobs).
    pub large: Vec<u8>,
}

/// A finished background request, on its way back to the owning Rpc.
pub(crate) struct BgDone {
    pub session: u16,
    pub slot: u8,
    pub req_num: u64,
    pub req: MsgBuf,
    pub resp: MsgBuf,
    pub large: Vec<u8>,
    pub use_large: bool,
    pub len: usize,
}

pub(crate) fn run_job(
    mut job: Job,
    handlers: &[Option<BgHandler>],
) -> (BgDone, Option<SyncSender<BgDone>>) {
    let mut large = std::mem::take(&mut job.large);
    let mut r = BgResponse {
        small: &mut job.resp,
        large: &mut large,
        len: 0,
        use_large: false,
    };
    if let Some(h) = &handlers[usize::from(job.req_type)] {
        h(job.req.data(), &mut r);
    }
    let (len, use_large) = (r.len, r.use_large);
    if !use_large {
        job.resp.resize(len).expect("within capacity");
    }
    (
        BgDone {
            session: job.session,
            slot: job.slot,
            req_num: job.req_num,
            req: job.req,
            resp: job.resp,
            large,
            use_large,
            len,
        },
        job.reply,
    )
}

/// The Nexus's worker threads.
pub(crate) struct WorkerPool {
    senders: Vec<SyncSender<Job>>,
    loads: Arc<[WorkerLoad]>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
    policy: WorkerDispatch,
    handlers: Arc<Vec<Option<BgHandler>>>,
}

impl fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WorkerPool({} threads, {})",
            self.senders.len(),
            self.policy
        )
    }
}

impl WorkerPool {
    pub(crate) fn new(
        n: usize,
        handlers: Vec<Option<BgHandler>>,
        policy: WorkerDispatch,
    ) -> Result<WorkerPool, NexusError> {
        if let WorkerDispatch::SingleQueue { depth } = policy {
            if !(1..=WorkerDispatch::MAX_DEPTH).contains(&depth) {
                return Err(NexusError::WorkerDispatch { depth });
            }
        }
        let handlers = Arc::new(handlers);
        let loads: Arc<[WorkerLoad]> = (0..n).map(|_| WorkerLoad::default()).collect();
        let mut senders = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let (tx, rx): (SyncSender<Job>, Receiver<Job>) = sync_channel(policy.queue_jobs());
            let h = handlers.clone();
            let loads = loads.clone();
            let t = std::thread::Builder::new()
                .name(format!("erpc-worker-{index}"))
                .spawn(move || {
                    let me = &loads[index];
                    while let Ok(job) = rx.recv() {
                        let (done, reply) = run_job(job, &h);
                        me.jobs.fetch_add(1, Ordering::Relaxed);
                        // Release the place before the reply goes out, so
                        // the Rpc that sees the reply also sees the room.
                        me.load.fetch_sub(1, Ordering::Release);
                        if let Some(reply) = reply {
                            // The Rpc may be gone; its buffers then leak
                            // (never unsafe, see mempool::Buffer).
                            let _ = reply.send(done);
                        }
                    }
                })
                .map_err(|source| NexusError::Spawn { index, source })?;
            senders.push(tx);
            threads.push(t);
        }
        Ok(WorkerPool {
            senders,
            loads,
            threads: Mutex::new(threads),
            next: AtomicUsize::new(0),
            policy,
            handlers,
        })
    }

    pub(crate) fn threads(&self) -> usize {
        self.senders.len()
    }

    pub(crate) fn policy(&self) -> WorkerDispatch {
        self.policy
    }

    pub(crate) fn stats(&self) -> Vec<WorkerStats> {
        self.loads
            .iter()
            .map(|l| WorkerStats {
                jobs: l.jobs.load(Ordering::Relaxed),
                load: l.load.load(Ordering::Relaxed),
            })
            .collect()
    }

    pub(crate) fn handlers(&self) -> &[Option<BgHandler>] {
        &self.handlers
    }

    /// Queues a job on a worker chosen by the policy, without blocking;
    /// gives it back if no worker may take it now (every queue full, or
    /// under single-queue dispatch every worker at its depth).
    #[allow(clippy::result_large_err)] // the job comes back to be queued locally
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        match self.policy {
            WorkerDispatch::RoundRobin => self.submit_round_robin(job),
            WorkerDispatch::SingleQueue { depth } => self.submit_jbsq(job, depth),
        }
    }

    #[allow(clippy::result_large_err)]
    fn submit_round_robin(&self, mut job: Job) -> Result<(), Job> {
        let n = self.senders.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let w = (start + i) % n;
            self.loads[w].load.fetch_add(1, Ordering::Relaxed);
            match self.senders[w].try_send(job) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(j)) | Err(TrySendError::Disconnected(j)) => {
                    self.loads[w].load.fetch_sub(1, Ordering::Relaxed);
                    job = j;
                }
            }
        }
        Err(job)
    }

    /// Join-bounded-shortest-queue: the least-loaded worker below `depth`,
    /// ties broken by a rotating start so that idle workers share the work.
    /// The place is reserved by compare-and-swap (other Rpcs of the Nexus
    /// submit concurrently); a lost race moves on to the next choice.
    #[allow(clippy::result_large_err)]
    fn submit_jbsq(&self, job: Job, depth: usize) -> Result<(), Job> {
        let n = self.senders.len();
        if n == 0 {
            return Err(job);
        }
        let start = self.next.load(Ordering::Relaxed);
        // Each pass either reserves a place or sees a load rise (another
        // submitter won it); n + 1 passes bound the work per call.
        for _ in 0..=n {
            let mut best: Option<(usize, usize)> = None;
            for i in 0..n {
                let w = (start + i) % n;
                let load = self.loads[w].load.load(Ordering::Acquire);
                if load < depth && best.is_none_or(|(_, l)| load < l) {
                    best = Some((w, load));
                    if load == 0 {
                        break;
                    }
                }
            }
            let Some((w, load)) = best else {
                return Err(job);
            };
            if self.loads[w]
                .load
                .compare_exchange(load, load + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.next.store(w + 1, Ordering::Relaxed);
            // Never full: the queue holds `depth` and the reservation
            // keeps this worker's jobs (running one included) at most that.
            return match self.senders[w].try_send(job) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(j)) | Err(TrySendError::Disconnected(j)) => {
                    self.loads[w].load.fetch_sub(1, Ordering::Release);
                    Err(j)
                }
            };
        }
        Err(job)
    }

    pub(crate) fn shutdown(&mut self) {
        self.senders.clear();
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = t.join();
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    //! The dispatch decision, on real worker threads: handlers that hold
    //! their worker until the test opens a gate, and report which worker
    //! ran them in the response. Every wait is for an event the test
    //! causes (no timeouts, no sleeps).

    use std::sync::mpsc::{Receiver, sync_channel};
    use std::sync::{Arc, Condvar, Mutex};

    use super::*;
    use crate::msgbuf::Origin;

    /// Request types of the test handlers.
    const HOLD: u8 = 1;
    const QUICK: u8 = 2;

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
        gate: Arc<Gate>,
        alloc: mempool::Allocator,
        reply_tx: SyncSender<BgDone>,
        reply_rx: Receiver<BgDone>,
        next_req: u64,
    }

    /// The worker that ran a finished job, from its response.
    fn worker_of(done: &BgDone) -> usize {
        let name = std::str::from_utf8(&done.resp.data()[..done.len]).unwrap();
        name.trim_start_matches("erpc-worker-").parse().unwrap()
    }

    impl Fixture {
        fn new(workers: usize, policy: WorkerDispatch) -> Fixture {
            let gate = Arc::new(Gate::default());
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
            let (reply_tx, reply_rx) = sync_channel(BG_REPLY_QUEUE);
            Fixture {
                pool: WorkerPool::new(workers, handlers, policy).unwrap(),
                gate,
                alloc: crate::sim::test_allocator(1 << 20),
                reply_tx,
                reply_rx,
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
                reply: Some(self.reply_tx.clone()),
                large: Vec::new(),
            }
        }

        fn submit(&mut self, req_type: u8) -> bool {
            let j = self.job(req_type);
            match self.pool.submit(j) {
                Ok(()) => true,
                Err(j) => {
                    self.alloc.free(j.req.into_buffer());
                    self.alloc.free(j.resp.into_buffer());
                    false
                }
            }
        }

        fn loads(&self) -> Vec<usize> {
            self.pool.stats().iter().map(|s| s.load).collect()
        }

        /// Waits for the next finished job; returns the worker that ran it.
        fn next_done(&mut self) -> usize {
            let d = self.reply_rx.recv().unwrap();
            let w = worker_of(&d);
            self.alloc.free(d.req.into_buffer());
            self.alloc.free(d.resp.into_buffer());
            w
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.gate.open();
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
    fn a_depth_outside_the_range_is_refused() {
        for depth in [0, WorkerDispatch::MAX_DEPTH + 1] {
            let e = WorkerPool::new(1, Vec::new(), WorkerDispatch::single_queue(depth))
                .map(|_| ())
                .unwrap_err();
            assert!(matches!(e, NexusError::WorkerDispatch { depth: d } if d == depth));
            assert!(e.to_string().contains("must be 1 to 64"), "{e}");
        }
        assert!(WorkerPool::new(0, Vec::new(), WorkerDispatch::single_queue(1)).is_ok());
    }

    #[test]
    fn the_builder_takes_the_policy_and_refuses_a_bad_depth() {
        let net = crate::sim::SimNet::new(crate::sim::SimConfig::default());
        let build = |uri: &str, policy| {
            crate::Nexus::builder(uri)
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .workers(2)
                .worker_dispatch(policy)
                .build()
        };
        let n = build("a:1", WorkerDispatch::single_queue(2)).unwrap();
        assert_eq!(n.worker_dispatch(), WorkerDispatch::single_queue(2));
        assert_eq!(n.worker_stats(), vec![WorkerStats::default(); 2]);
        let d = build("b:1", WorkerDispatch::RoundRobin).unwrap();
        assert_eq!(d.worker_dispatch(), WorkerDispatch::RoundRobin);
        assert!(matches!(
            build("c:1", WorkerDispatch::single_queue(0)),
            Err(NexusError::WorkerDispatch { depth: 0 })
        ));
    }

    #[test]
    fn policies_print_their_names() {
        assert_eq!(WorkerDispatch::RoundRobin.to_string(), "round-robin");
        assert_eq!(
            WorkerDispatch::single_queue(2).to_string(),
            "single-queue (JBSQ(2))"
        );
    }
}
