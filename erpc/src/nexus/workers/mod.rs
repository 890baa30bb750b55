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

mod links;
mod pool;
#[cfg(feature = "testing")]
mod stepped;
#[cfg(all(test, feature = "testing"))]
mod tests;
mod worker;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use transport::MAX_DATA_PER_PKT;

use crate::consts::MAX_MSG_BYTES;
use crate::msgbuf::MsgBuf;

pub(crate) use links::BgLinks;
pub(crate) use pool::{PoolConfig, WorkerPool};
#[cfg(feature = "testing")]
pub use stepped::SteppedJob;

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
