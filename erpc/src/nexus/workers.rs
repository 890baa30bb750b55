//! Worker threads for background request handlers.
//!
//! The owning Rpc sends a [`Job`] (the request copied into a msgbuf, the
//! slot's preallocated response msgbuf, and the Rpc's reply queue) to a
//! worker through a bounded queue; the worker runs the handler and sends a
//! [`BgDone`] back through the Rpc's bounded reply queue, which the event
//! loop polls without blocking. Both queues are `std::sync::mpsc` bounded
//! channels (lock-free array queues, no allocation per message).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
    handlers: Arc<Vec<Option<BgHandler>>>,
}

impl fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerPool({} threads)", self.senders.len())
    }
}

impl WorkerPool {
    pub(crate) fn new(
        n: usize,
        handlers: Vec<Option<BgHandler>>,
    ) -> Result<WorkerPool, NexusError> {
        let handlers = Arc::new(handlers);
        let mut senders = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let (tx, rx): (SyncSender<Job>, Receiver<Job>) = sync_channel(WORKER_QUEUE_JOBS);
            let h = handlers.clone();
            let t = std::thread::Builder::new()
                .name(format!("erpc-worker-{index}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let (done, reply) = run_job(job, &h);
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
            threads: Mutex::new(threads),
            next: AtomicUsize::new(0),
            handlers,
        })
    }

    pub(crate) fn threads(&self) -> usize {
        self.senders.len()
    }

    pub(crate) fn handlers(&self) -> &[Option<BgHandler>] {
        &self.handlers
    }

    /// Queues a job on some worker without blocking; gives it back if every
    /// worker queue is full.
    #[allow(clippy::result_large_err)] // the job comes back to be queued locally
    pub(crate) fn submit(&self, mut job: Job) -> Result<(), Job> {
        let n = self.senders.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            match self.senders[(start + i) % n].try_send(job) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(j)) | Err(TrySendError::Disconnected(j)) => job = j,
            }
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
