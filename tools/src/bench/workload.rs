//! The benchmark's RPC workload: a [`Point`] (batch, window, size), each
//! node's [`Ctx`] with its request handler and continuation, and the
//! [`Outcome`] a measured run summarises into.

use std::time::{Duration, Instant};

use erpc::{Completion, MsgBuf, NexusBuilder, Request, Rpc};
use hdrhistogram::Histogram;
use mlx5::QueueSnapshot;
use serde::Serialize;
use transport::{MAX_DATA_PER_PKT, Transport};

use super::{BenchError, REQ};

/// One benchmark point.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    /// Requests enqueued per batch.
    pub batch: usize,
    /// Most requests in flight per node.
    pub window: usize,
    /// Request and response size.
    pub size: usize,
    /// Keep measuring past the duration until this many RPCs completed
    /// (slow points, e.g. large messages under heavy loss), for at most
    /// [`MAX_STRETCH`] times the duration.
    pub min_rpcs: u64,
}

/// Sessions each node opens to the other for point `p`: enough slots
/// (eight per session, the protocol's window) for every request the point
/// keeps in flight, so that none waits in an Rpc's backlog for a slot. A
/// raw echo puts its whole window on the wire; eRPC with one session could
/// put only eight there, and the rest of the window would be queueing
/// time in the backlog, not packet work (the paper's Figure 4 setup and
/// the C++ `small_rpc_tput` spread each thread's requests over sessions
/// the same way).
pub fn sessions_per_node(p: Point) -> usize {
    p.window.div_ceil(erpc::SESSION_REQ_WINDOW).max(1)
}

/// How far past its duration a point with `min_rpcs` may run.
pub const MAX_STRETCH: u32 = 100;

/// Latency percentiles in µs, from enqueue to continuation.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// What a point measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// RPCs completed per second, all nodes together.
    pub rpcs_per_sec: f64,
    /// RPCs completed while measuring.
    pub completed: u64,
    /// Seconds measured.
    pub elapsed_s: f64,
    /// Latency percentiles.
    pub latency_us: Latency,
    /// Latencies in nanoseconds (exported with `--latency-csv`).
    #[serde(skip)]
    pub hist: Histogram<u64>,
    /// The nodes' queue sets at the end of the point (mlx5 transports).
    pub queues: Vec<QueueSnapshot>,
    /// Go-back-N rollbacks (retransmission timeouts), both nodes.
    pub retransmissions: u64,
    /// TX queue drains (around retransmissions and duplicate answers).
    pub tx_flushes: u64,
    /// RPCs in flight at the end of the measurement that completed
    /// afterwards (device model: drained before the buffers go back).
    pub drained: u64,
    /// RPCs still in flight when the drain gave up (0 unless something is
    /// stuck).
    pub unfinished: u64,
}

/// Packets one RPC of `size` bytes puts on the wire in each direction
/// (requests and requests-for-response one way; credit returns and
/// responses the other): 2N − 1 for an N-packet request and response.
pub fn packets_per_direction(size: usize) -> usize {
    let n = size.div_ceil(MAX_DATA_PER_PKT).max(1);
    2 * n - 1
}

/// eRPC's RPC rate over the raw echo's round-trip rate (1.0: eRPC moves
/// its packets as fast as the bare transport moves the same packets). A
/// raw-echo round trip is one message of [`packets_per_direction`] frames
/// each way, as an RPC is, so the two rates compare the same packet work.
pub fn ratio_to_raw(rpcs_per_sec: f64, raw_round_trips_per_sec: f64) -> Option<f64> {
    (raw_round_trips_per_sec > 0.0).then(|| rpcs_per_sec / raw_round_trips_per_sec)
}

/// Per-node application state (no allocation per request).
#[allow(missing_debug_implementations)]
pub struct Ctx {
    /// The sessions to the peer ([`sessions_per_node`] of them); requests
    /// go to them in turn.
    pub(super) sessions: Vec<u16>,
    pub(super) next_session: usize,
    pub(super) in_flight: usize,
    pub(super) completed: u64,
    pub(super) pool: Vec<(MsgBuf, MsgBuf)>,
    pub(super) tags: Vec<usize>,
    pub(super) sent: Vec<Instant>,
    pub(super) lat: Histogram<u64>,
    pub(super) size: usize,
    /// The first failure seen by a handler or continuation.
    pub(super) error: Option<String>,
}

impl Ctx {
    /// The sessions requests go out on.
    pub(crate) fn sessions(&self) -> &[u16] {
        &self.sessions
    }

    pub(crate) fn add_session(&mut self, sn: u16) {
        self.sessions.push(sn);
    }

    /// RPCs completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.completed
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The first failure, taken.
    pub(crate) fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }

    /// Gives the buffer pool back to `rpc`'s allocator.
    pub(crate) fn free_buffers<T: Transport>(&mut self, rpc: &mut Rpc<T, Ctx>) {
        while let Some((a, b)) = self.pool.pop() {
            rpc.free_msg_buffer(a);
            rpc.free_msg_buffer(b);
        }
    }
}

fn fail(c: &mut Ctx, why: String) {
    if c.error.is_none() {
        c.error = Some(why);
    }
}

fn handler<T: Transport>(rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, req: Request<'_>) {
    let mut m = match rpc.response_buffer(&req.handle, c.size) {
        Ok(m) => m,
        Err(e) => return fail(c, format!("server: no response buffer: {e}")),
    };
    let n = req.data.len().min(8).min(c.size);
    m.data_mut()[..n].copy_from_slice(&req.data[..n]);
    if let Err(e) = rpc.enqueue_response(req.handle, m) {
        fail(c, format!("server: cannot respond: {e}"));
    }
}

fn cont<T: Transport>(_rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, comp: Completion) {
    if let Err(e) = &comp.result {
        // Loss is repaired by retransmission; the peer is alive: an error
        // here is a bug.
        fail(c, format!("RPC failed: {e}"));
    }
    c.in_flight -= 1;
    c.completed += 1;
    let ns = c.sent[comp.tag].elapsed().as_nanos() as u64;
    let _ = c.lat.record(ns.max(1));
    c.tags.push(comp.tag);
    c.pool.push((comp.req, comp.resp));
}

pub(crate) fn issue<T: Transport>(rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, p: Point) {
    if c.in_flight + p.batch > p.window || c.error.is_some() {
        return;
    }
    let now = Instant::now();
    for _ in 0..p.batch {
        // `in_flight + batch <= window` and the pool holds `window` pairs
        // less those in flight, so neither list is empty here.
        let (Some((req, resp)), Some(tag)) = (c.pool.pop(), c.tags.pop()) else {
            return fail(c, "internal: buffer pool ran dry".into());
        };
        c.sent[tag] = now;
        c.in_flight += 1;
        let session = c.sessions[c.next_session];
        c.next_session += 1;
        if c.next_session == c.sessions.len() {
            c.next_session = 0;
        }
        if let Err(e) = rpc.enqueue_request(session, REQ, req, resp, cont::<T>, tag) {
            c.in_flight -= 1;
            c.tags.push(tag);
            let msg = e.to_string();
            c.pool.push((e.req, e.resp));
            return fail(c, msg);
        }
    }
}

pub(super) fn histogram() -> Histogram<u64> {
    // 1 ns to 60 s at 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("constant bounds are valid")
}

pub(crate) fn new_ctx<T: Transport + 'static>(
    rpc: &mut Rpc<T, Ctx>,
    p: Point,
) -> Result<Ctx, BenchError> {
    let mut pool = Vec::with_capacity(p.window);
    for _ in 0..p.window {
        let alloc = |rpc: &mut Rpc<T, Ctx>| {
            rpc.alloc_msg_buffer(p.size)
                .map_err(|e| BenchError::setup("message buffers", e))
        };
        let req = alloc(rpc)?;
        let resp = alloc(rpc)?;
        pool.push((req, resp));
    }
    Ok(Ctx {
        sessions: Vec::with_capacity(sessions_per_node(p)),
        next_session: 0,
        in_flight: 0,
        completed: 0,
        pool,
        tags: (0..p.window).collect(),
        sent: vec![Instant::now(); p.window],
        lat: histogram(),
        size: p.size,
        error: None,
    })
}

pub(crate) fn register<T: Transport + 'static>(b: NexusBuilder) -> NexusBuilder {
    b.handler::<T, Ctx>(REQ, handler::<T>)
}

pub(super) fn summarize(ctxs: &[&Ctx], elapsed: Duration) -> Outcome {
    let mut h = histogram();
    let mut done = 0;
    for c in ctxs {
        // Same bounds on both sides: `add` cannot fail.
        let _ = h.add(&c.lat);
        done += c.completed;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Outcome {
        rpcs_per_sec: done as f64 / elapsed.as_secs_f64(),
        completed: done,
        elapsed_s: elapsed.as_secs_f64(),
        latency_us: Latency {
            median: us(h.value_at_quantile(0.5)),
            p99: us(h.value_at_quantile(0.99)),
            p99_9: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            mean: h.mean() / 1000.0,
        },
        hist: h,
        queues: Vec::new(),
        retransmissions: 0,
        tx_flushes: 0,
        drained: 0,
        unfinished: 0,
    }
}

pub(super) fn first_error<'a>(ctxs: impl IntoIterator<Item = &'a mut Ctx>) -> Option<BenchError> {
    ctxs.into_iter()
        .find_map(|c| c.error.take())
        .map(BenchError::Run)
}
