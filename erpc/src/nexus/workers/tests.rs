//! The dispatch decision and the idle policy, on real worker threads:
//! handlers that hold their worker until the test opens a gate, and
//! report which worker ran them in the response. Every wait is for an
//! event the test causes (no timeouts, no sleeps).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::worker::Worker;
use super::*;
use crate::msgbuf::Origin;
use crate::nexus::NexusError;

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
    let name =
        |r: &mut BgResponse<'_>| r.write(std::thread::current().name().unwrap_or("?").as_bytes());
    handlers[usize::from(HOLD)] = Some(Arc::new(move |_req, r| {
        g.pass();
        name(r);
    }));
    handlers[usize::from(QUICK)] = Some(Arc::new(move |_req, r| name(r)));
    handlers[usize::from(PANIC)] = Some(Arc::new(|_req, _r| panic!("handler panics on purpose")));
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
            alloc: crate::test_allocator(1 << 20),
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
    let mut alloc = crate::test_allocator(1 << 20);
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
    let mut alloc = crate::test_allocator(1 << 20);
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
    let mut f_alloc = crate::test_allocator(1 << 20);
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

/// An SM link that carries nothing: these Nexuses never connect.
#[derive(Debug)]
struct NullSmLink;

impl crate::sm::SmLink for NullSmLink {
    fn start(&self, _: &crate::Uri, _: Arc<crate::sm::SmRouter>) -> Result<(), NexusError> {
        Ok(())
    }
    fn send(&self, _: &crate::Uri, _: &crate::Uri, _: &[u8; crate::wire::SM_PKT_BYTES]) {}
    fn stop(&self, _: &crate::Uri) {}
}

#[test]
fn the_builder_takes_the_policies_and_refuses_a_bad_depth() {
    let build = |uri: &str, policy| {
        crate::Nexus::builder(uri)
            .sm_link(Arc::new(NullSmLink))
            .clock(crate::Clock::Virtual(crate::VirtualClock::new()))
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
        .sm_link(Arc::new(NullSmLink))
        .clock(crate::Clock::Virtual(crate::VirtualClock::new()))
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
