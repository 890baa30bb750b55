//! The small-RPC benchmark behind `erpc-bench` (the paper's Figure 4 setup
//! scaled to a small machine): every node is both client and server, sends
//! requests of `size` bytes in batches of B with at most `window` in
//! flight, and answers the other node's requests with responses of the
//! same size. Each run also measures a raw echo of eRPC-sized frames over
//! the same transport, so the eRPC rate is reported as a ratio against
//! what the transport itself can do in the same run.
//!
//! Nothing here panics on user input or on a failed setup: every setting
//! is checked by [`Settings::validate`] (each error names the limit), and
//! every failure of a run is a [`BenchError`].

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use erpc::sim::SimNet;
use erpc::{Completion, MAX_MSG_BYTES, MsgBuf, Nexus, NexusBuilder, Request, Rpc, RpcConfig};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mempool::{Allocator, AllocatorConfig};
use mlx5::{Device, DeviceConfig, QueueConfig, QueueSnapshot};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use serde::Serialize;
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::udp::{UdpConfig, UdpTransport};
use transport::{MAX_DATA_PER_PKT, PKTHDR_BYTES, RxRing, Transport, TxItem};

use crate::capture::{Capture, CapturingSmLink, NodeAddr};
use crate::memory::{MemoryPlan, node_bytes};

/// Request type of the benchmark's RPC.
pub const REQ: u8 = 1;
/// Most requests in flight per node (`--window`). The paper's small-RPC
/// runs use up to 60; beyond a few hundred the session backlog, not the
/// protocol, is what is measured.
pub const MAX_WINDOW: usize = 1024;
/// Most message-buffer memory one node may reserve (`--size` × `--window`).
pub const MAX_NODE_BYTES: usize = 4 << 30;
/// Longest measurement per point (`--secs`), one day.
pub const MAX_SECS: f64 = 86_400.0;
/// First UDP port of the nodes' Rpcs (node i uses `DATA_PORT + i`): the
/// C++ eRPC's base port, inside the dissector's default range.
pub const DATA_PORT: u16 = 31850;
/// First UDP port of the raw echo (outside the dissector's range: its
/// frames carry no eRPC header).
pub const RAW_ECHO_PORT: u16 = 41000;
/// Bound on event-loop rounds while sessions connect (device model: rounds
/// of virtual time, so this is about 0.5 s of simulated time).
const CONNECT_ROUNDS: usize = 1_000_000;
/// Bound on event-loop rounds while the RPCs in flight at the end of a
/// device-model point complete (about 10 s of virtual time).
const DRAIN_ROUNDS: usize = 20_000_000;
/// A counted run (`Stop::Count`) fails after this many event-loop rounds
/// without one completion (device model: 10 s of virtual time), instead of
/// hanging; no wall clock is read to decide it.
const STALL_ROUNDS: usize = DRAIN_ROUNDS;
/// Wall-clock bound for connecting over kernel UDP (SM retries every
/// 100 ms; a refusal arrives within one round trip).
const UDP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Which {
    /// The mlx5 transport on the device model (a software ConnectX), one thread.
    Mlx5Sim,
    /// Kernel UDP over loopback, one thread.
    Udp,
    /// A real ConnectX bound to vfio-pci (`--pci`): both nodes are queue
    /// sets of that function, talking through the NIC's own loopback.
    Mlx5,
}

impl Which {
    /// One line for the report header.
    pub fn describe(self) -> &'static str {
        match self {
            Which::Mlx5Sim => "mlx5 transport on the device model (2 NICs, 1 thread)",
            Which::Udp => "kernel UDP over loopback (1 thread)",
            Which::Mlx5 => "mlx5 transport on a ConnectX via VFIO (2 queue sets, 1 thread)",
        }
    }
}

/// Why a run could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range or does not fit the other settings.
    #[error("{0}")]
    Usage(String),
    /// Bringing up the testbed failed.
    #[error("{what}: {why}")]
    Setup {
        /// What was being set up.
        what: String,
        /// The underlying error, as text.
        why: String,
    },
    /// The run failed after it started.
    #[error("{0}")]
    Run(String),
    /// Writing an output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl BenchError {
    pub(crate) fn setup(what: impl Into<String>, why: impl std::fmt::Display) -> BenchError {
        BenchError::Setup {
            what: what.into(),
            why: why.to_string(),
        }
    }

    /// The process exit code: 2 for bad settings (as clap uses), 1 else.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// Everything a run is told.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Where it runs.
    pub transport: Which,
    /// Batch sizes B, one point each.
    pub batches: Vec<usize>,
    /// Most requests in flight per node.
    pub window: usize,
    /// Request and response size in bytes.
    pub size: usize,
    /// Seconds measured per point.
    pub secs: f64,
    /// Seconds of warm-up before each point is measured.
    pub warmup_secs: f64,
    /// PCI address for `--transport mlx5`.
    pub pci: Option<String>,
    /// Packet capture file.
    pub pcap: Option<PathBuf>,
    /// Probability that a frame is lost on each device-model link (both
    /// directions); loss recovery must repair it.
    pub loss: f64,
    /// Stop each point, and each raw-echo reference, after this many
    /// completed RPCs / round trips (both nodes) instead of after `secs`,
    /// with no warm-up (`erpc-bench --count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl Settings {
    /// Checks every setting; the error names the limit it broke.
    pub fn validate(&self) -> Result<(), BenchError> {
        let usage = |s: String| Err(BenchError::Usage(s));
        if self.size > MAX_MSG_BYTES {
            return usage(format!(
                "--size {}: above the largest eRPC message, {MAX_MSG_BYTES} bytes \
                 (8 MiB less the headers of its packets)",
                self.size
            ));
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return usage(format!(
                "--window {}: must be 1 to {MAX_WINDOW} requests in flight per node",
                self.window
            ));
        }
        let bytes = node_bytes(self.size, self.window);
        if bytes > MAX_NODE_BYTES {
            return usage(format!(
                "--size {} with --window {} needs {} MiB of message buffers per node; \
                 the limit is {} MiB: lower --window or --size",
                self.size,
                self.window,
                bytes >> 20,
                MAX_NODE_BYTES >> 20
            ));
        }
        if self.batches.is_empty() {
            return usage("--batch: give at least one batch size".into());
        }
        if let Some(b) = self.batches.iter().find(|&&b| b == 0 || b > self.window) {
            return usage(format!(
                "--batch {b}: a batch must be 1 to --window ({}) requests",
                self.window
            ));
        }
        if !self.secs.is_finite() || self.secs <= 0.0 || self.secs > MAX_SECS {
            return usage(format!(
                "--secs {}: must be a number of seconds above 0 and at most {MAX_SECS} \
                 (one day)",
                self.secs
            ));
        }
        if !self.warmup_secs.is_finite() || self.warmup_secs < 0.0 || self.warmup_secs > MAX_SECS {
            return usage(format!(
                "--warmup {}: must be a number of seconds from 0 to {MAX_SECS} (one day)",
                self.warmup_secs
            ));
        }
        match (self.transport, &self.pci) {
            (Which::Mlx5, None) => {
                return usage(
                    "--transport mlx5 needs --pci DDDD:BB:DD.F (see `erpc-vfio list`)".into(),
                );
            }
            (Which::Mlx5Sim | Which::Udp, Some(_)) => {
                return usage(format!(
                    "--pci is for --transport mlx5 (a ConnectX bound to vfio-pci); \
                     it means nothing with --transport {}",
                    self.transport_name()
                ));
            }
            _ => {}
        }
        if !self.loss.is_finite() || !(0.0..0.5).contains(&self.loss) {
            return usage(format!(
                "--loss {}: must be a frame loss probability from 0 to below 0.5",
                self.loss
            ));
        }
        if self.count == Some(0) {
            return usage("--count 0: must be at least 1 RPC (round trip) per point".into());
        }
        if self.loss > 0.0 && self.transport != Which::Mlx5Sim {
            return usage(format!(
                "--loss is injected by the device model's fabric; it means nothing with \
                 --transport {}",
                self.transport_name()
            ));
        }
        if self.pcap.is_some() {
            match self.transport {
                Which::Mlx5Sim => {}
                Which::Udp => {}
                Which::Mlx5 => {
                    return usage(
                        "--pcap works on the device model only: a real ConnectX sends \
                         through its own loopback, which no host tool sees; drop --pcap \
                         or use the default transport"
                            .into(),
                    );
                }
            }
        }
        Ok(())
    }

    fn transport_name(&self) -> &'static str {
        match self.transport {
            Which::Mlx5Sim => "mlx5-sim",
            Which::Udp => "udp",
            Which::Mlx5 => "mlx5",
        }
    }

    /// Measurement time per point (valid settings only).
    pub fn duration(&self) -> Duration {
        Duration::try_from_secs_f64(self.secs).unwrap_or(Duration::ZERO)
    }

    /// Warm-up per point (valid settings only).
    pub fn warmup(&self) -> Duration {
        Duration::try_from_secs_f64(self.warmup_secs).unwrap_or(Duration::ZERO)
    }

    /// When each point and each reference stops: after `count` completions
    /// if set, otherwise after the warm-up and the duration.
    pub fn stop(&self) -> Stop {
        match self.count {
            Some(n) => Stop::Count(n),
            None => Stop::Time {
                dur: self.duration(),
                warmup: self.warmup(),
            },
        }
    }
}

/// When a measured run (an eRPC point or its raw-echo reference) stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `warmup` of wall time (counters then zeroed), then `dur` measured:
    /// the rate benchmark.
    Time {
        /// The measured interval.
        dur: Duration,
        /// Run before the measured interval, not counted.
        warmup: Duration,
    },
    /// At the first check (every 64 event-loop rounds, as in a timed run)
    /// where at least this many RPCs / round trips have completed, both
    /// nodes together, counted from the first round (no warm-up). No wall
    /// clock decides anything, so on the deterministic device model the
    /// same count always does the same work: the fixed amount of work for
    /// an instruction count (`tools/bench-callgrind.sh`). The run reports
    /// how many completed (at most one check's worth above the count).
    Count(u64),
}

impl Stop {
    /// The warm-up: none for a counted run.
    fn warmup(self) -> Duration {
        match self {
            Stop::Time { warmup, .. } => warmup,
            Stop::Count(_) => Duration::ZERO,
        }
    }

    /// Whether a run that has measured for `measured` and completed `done`
    /// is over (`min_rpcs`: a timed run's minimum, see [`Point`]).
    fn reached(self, measured: Duration, done: u64, min_rpcs: u64) -> bool {
        match self {
            Stop::Time { dur, .. } => {
                measured >= dur && (done >= min_rpcs || measured >= dur * MAX_STRETCH)
            }
            Stop::Count(n) => done >= n,
        }
    }

    /// Draws a progress bar for a timed run (a counted one has none).
    fn phase(self, progress: &Progress, name: &str) {
        if let Stop::Time { dur, warmup } = self {
            progress.phase(name, warmup + dur);
        }
    }
}

/// Counts event-loop rounds without a completion, for a counted run's
/// stall bound (`STALL_ROUNDS`).
struct Stall {
    last: u64,
    rounds: usize,
}

impl Stall {
    fn new() -> Stall {
        Stall { last: 0, rounds: 0 }
    }

    /// `rounds` more have run and `done` completed so far: true once
    /// [`STALL_ROUNDS`] rounds in a row completed nothing.
    fn stalled(&mut self, done: u64, rounds: usize) -> bool {
        if done != self.last {
            self.last = done;
            self.rounds = 0;
            return false;
        }
        self.rounds += rounds;
        self.rounds >= STALL_ROUNDS
    }
}

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

/// Data bytes of the raw echo's largest frames: eRPC's packet for
/// single-packet messages, a full MTU otherwise (its other frames have
/// the sizes of eRPC's: see [`raw_echo`]).
pub fn raw_echo_data_bytes(size: usize) -> usize {
    size.min(MAX_DATA_PER_PKT)
}

/// eRPC's RPC rate over the raw echo's round-trip rate (1.0: eRPC moves
/// its packets as fast as the bare transport moves the same packets). A
/// raw-echo round trip is one message of [`packets_per_direction`] frames
/// each way, as an RPC is, so the two rates compare the same packet work.
pub fn ratio_to_raw(rpcs_per_sec: f64, raw_round_trips_per_sec: f64) -> Option<f64> {
    (raw_round_trips_per_sec > 0.0).then(|| rpcs_per_sec / raw_round_trips_per_sec)
}

/// Request frames one node of the raw echo keeps on the wire at once for
/// point `p`, given `ring_entries` RX slots per node: every frame of the
/// window's messages, but no more than eRPC's credits allow (a session's
/// credits bound the requests and requests for response it has
/// unanswered, and the point opens [`sessions_per_node`] sessions), nor
/// more than half the RX ring (a node receives the peer's requests and the
/// answers to its own; the raw echo has no loss recovery, so it must not
/// overrun the ring). Never below the window: a one-packet point keeps its
/// whole window on the wire, as eRPC does.
pub fn raw_echo_frames_in_flight(p: Point, ring_entries: usize) -> usize {
    let k = packets_per_direction(p.size);
    (p.window * k)
        .min(sessions_per_node(p) * erpc::SESSION_CREDITS)
        .min(ring_entries / 2)
        .max(p.window)
}

/// Progress of a run on the terminal: one bar per phase (raw echo, each
/// point) on stderr, removed before the phase's result is printed; nothing
/// at all when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    visible: bool,
    bar: std::cell::RefCell<Option<ProgressBar>>,
    /// Tenths of a second shown last (the bar redraws only when it moves).
    shown: std::cell::Cell<u64>,
}

impl Progress {
    /// Bars on stderr if stderr is a terminal, otherwise none.
    pub fn new() -> Progress {
        Progress {
            visible: std::io::stderr().is_terminal(),
            bar: std::cell::RefCell::new(None),
            shown: std::cell::Cell::new(u64::MAX),
        }
    }

    /// A progress that never draws.
    pub fn hidden() -> Progress {
        Progress {
            visible: false,
            ..Progress::new()
        }
    }

    /// Starts a phase of `total` wall time.
    pub fn phase(&self, name: &str, total: Duration) {
        self.clear();
        if !self.visible {
            return;
        }
        let bar = ProgressBar::with_draw_target(
            Some(total.as_millis().max(1) as u64),
            ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = ProgressStyle::with_template("{prefix:>10} [{bar:30}] {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(name.to_string());
        self.shown.set(u64::MAX);
        *self.bar.borrow_mut() = Some(bar);
    }

    /// `done` of the phase has passed. Cheap when nothing is drawn: the
    /// measurement loop calls it often.
    #[inline]
    pub fn tick(&self, done: Duration) {
        if !self.visible {
            return;
        }
        let tenths = done.as_millis() as u64 / 100;
        if tenths != self.shown.get() {
            self.shown.set(tenths);
            if let Some(bar) = self.bar.borrow().as_ref() {
                bar.set_position(done.as_millis() as u64);
                bar.set_message(format!("{:.1} s", done.as_secs_f64()));
            }
        }
    }

    /// Removes the phase's bar (before printing its result).
    pub fn clear(&self) {
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }

    /// Runs `f` with any bar out of the way, so printed lines do not mix
    /// with it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.bar.borrow().as_ref() {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// Per-node application state (no allocation per request).
#[allow(missing_debug_implementations)]
pub struct Ctx {
    /// The sessions to the peer ([`sessions_per_node`] of them); requests
    /// go to them in turn.
    sessions: Vec<u16>,
    next_session: usize,
    in_flight: usize,
    completed: u64,
    pool: Vec<(MsgBuf, MsgBuf)>,
    tags: Vec<usize>,
    sent: Vec<Instant>,
    lat: Histogram<u64>,
    size: usize,
    /// The first failure seen by a handler or continuation.
    error: Option<String>,
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

fn histogram() -> Histogram<u64> {
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

fn summarize(ctxs: &[&Ctx], elapsed: Duration) -> Outcome {
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

fn first_error<'a>(ctxs: impl IntoIterator<Item = &'a mut Ctx>) -> Option<BenchError> {
    ctxs.into_iter()
        .find_map(|c| c.error.take())
        .map(BenchError::Run)
}

/// Where the two benchmark nodes run: NICs brought up by the driver, each
/// node a queue set (and message buffers registered with its NIC).
pub trait Testbed {
    /// The hardware backend.
    type B: mlx5::hw::HwBackend;
    /// The NIC of node `i`.
    fn device(&self, i: usize) -> &Device<Self::B>;
    /// Lets time pass (the device model's clock); real NICs need nothing.
    fn step(&self) {}
    /// An SM link and clock for the Nexuses (in-memory and virtual for the
    /// deterministic device model; kernel UDP and the TSC otherwise).
    fn nexus(&self, uri: &str) -> NexusBuilder;
    /// The memory plan of the run.
    fn plan(&self) -> &MemoryPlan;

    /// A transport on node `i`'s NIC.
    fn transport(
        &self,
        i: usize,
        port: u16,
        knobs: &Knobs,
    ) -> Result<Mlx5Transport<Self::B>, BenchError> {
        let mut cfg = Mlx5Config::new(
            node_ipv4(i),
            QueueConfig {
                udp_port: port,
                ..knobs.queue
            },
        );
        cfg.postlist = knobs.postlist;
        Mlx5Transport::new(self.device(i), cfg)
            .map_err(|e| BenchError::setup(format!("mlx5 transport of node {i}"), e))
    }

    /// Message buffers registered with node `i`'s NIC, `bytes` reserved up
    /// front.
    fn allocator(&self, i: usize, bytes: usize) -> Result<Allocator, BenchError> {
        Allocator::new(
            self.device(i).dma_mapper(),
            AllocatorConfig {
                initial_bytes: bytes,
                region: self.plan().region,
                ..Default::default()
            },
        )
        .map_err(|e| BenchError::setup(format!("message buffers of node {i}"), e))
    }
}

fn node_ipv4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i as u8 + 1)
}

fn node_mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, i as u8 + 1]
}

/// A ConnectX bound to vfio-pci: both nodes are queue sets of that one
/// function, talking through the NIC's own loopback.
#[allow(missing_debug_implementations)]
pub struct Vfio {
    device: Device<mlx5::vfio::VfioBackend>,
    plan: MemoryPlan,
    inspect: bool,
}

impl Vfio {
    /// Opens and brings up the function at `bdf`; `inspect` exposes it
    /// and the nodes' Nexuses on the debug endpoint.
    pub fn open(bdf: &str, plan: MemoryPlan, inspect: bool) -> Result<Vfio, BenchError> {
        let addr: mlx5::vfio::PciAddress = bdf
            .parse()
            .map_err(|e| BenchError::Usage(format!("--pci {bdf}: {e}")))?;
        let backend = mlx5::vfio::VfioBackend::open(addr)
            .map_err(|e| BenchError::setup(format!("opening {bdf} through VFIO"), e))?;
        let device = Device::open(
            backend,
            DeviceConfig {
                region: plan.region,
                inspect,
                ..Default::default()
            },
        )
        .map_err(|e| BenchError::setup(format!("bringing up {bdf}"), e))?;
        Ok(Vfio {
            device,
            plan,
            inspect,
        })
    }
}

impl Testbed for Vfio {
    type B = mlx5::vfio::VfioBackend;
    fn device(&self, _i: usize) -> &Device<Self::B> {
        &self.device
    }
    fn nexus(&self, uri: &str) -> NexusBuilder {
        // Session management over kernel UDP on loopback: node i on 31850 + i.
        let port = 31850 + u16::from(uri.starts_with("node1"));
        Nexus::builder(&format!("127.0.0.1:{port}")).inspect(self.inspect)
    }
    fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
}

/// Two device-model NICs on one deterministic fabric, driven by one thread.
#[allow(missing_debug_implementations)]
pub struct DeviceModel {
    fabric: Fabric,
    nics: Vec<SimNic>,
    devices: Vec<Device<SimBackend>>,
    net: SimNet,
    step: Duration,
    plan: MemoryPlan,
    capture: Option<Capture>,
    inspect: bool,
}

impl Testbed for DeviceModel {
    type B = SimBackend;
    fn device(&self, i: usize) -> &Device<SimBackend> {
        &self.devices[i]
    }
    fn step(&self) {
        self.net.advance(self.step.as_nanos() as u64);
        self.fabric.advance(self.step);
    }
    fn nexus(&self, uri: &str) -> NexusBuilder {
        let link = match &self.capture {
            Some(cap) => {
                let nodes: HashMap<String, NodeAddr> = (0..2)
                    .map(|i| {
                        (
                            format!("node{i}"),
                            NodeAddr {
                                mac: node_mac(i),
                                ipv4: node_ipv4(i),
                            },
                        )
                    })
                    .collect();
                let fabric = self.fabric.clone();
                Arc::new(CapturingSmLink::new(
                    self.net.sm_link(),
                    cap.clone(),
                    nodes,
                    move || fabric.now_ns(),
                ))
            }
            None => self.net.sm_link(),
        };
        Nexus::builder(uri)
            .sm_link(link)
            .clock(self.net.erpc_clock())
            .inspect(self.inspect)
    }
    fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
}

impl DeviceModel {
    /// A fabric with two NICs brought up by the driver; with `capture`,
    /// node 0's port and the SM link are captured once
    /// [`DeviceModel::start_capture`] is called; `inspect` exposes the NICs
    /// and the nodes' Nexuses on the debug endpoint (`erpc-inspect`).
    pub fn new(
        plan: MemoryPlan,
        capture: Option<Capture>,
        inspect: bool,
    ) -> Result<DeviceModel, BenchError> {
        let fabric = Fabric::new(FabricConfig {
            seed: 1,
            deterministic: true,
            ..Default::default()
        });
        let mut nics = Vec::new();
        let mut devices = Vec::new();
        for i in 0..2 {
            let nic = SimNic::new(
                &fabric,
                NicConfig {
                    mac: node_mac(i),
                    ..Default::default()
                },
            );
            let dev = Device::open(
                nic.backend(),
                DeviceConfig {
                    region: plan.region,
                    inspect,
                    ..Default::default()
                },
            )
            .map_err(|e| BenchError::setup(format!("bringing up device-model NIC {i}"), e))?;
            devices.push(dev);
            nics.push(nic);
        }
        Ok(DeviceModel {
            fabric,
            nics,
            devices,
            net: SimNet::new(Default::default()),
            step: Duration::from_nanos(500),
            plan,
            capture,
            inspect,
        })
    }

    /// Starts writing node 0's port into the capture (every frame between
    /// the two NICs crosses it). Called after the raw echo, whose frames
    /// carry no eRPC header.
    pub fn start_capture(&self) -> Result<(), BenchError> {
        if let Some(cap) = &self.capture {
            self.fabric
                .set_pcap(self.nics[0].port(), cap.fabric_sink())
                .map_err(|e| BenchError::setup("starting the capture", e))?;
        }
        Ok(())
    }

    /// Flushes the fabric's capture into the file.
    pub fn flush_capture(&self) -> Result<(), BenchError> {
        if let Some(cap) = &self.capture {
            self.fabric.flush_pcaps().map_err(|e| BenchError::Output {
                path: cap.path().to_owned(),
                source: e,
            })?;
        }
        Ok(())
    }

    /// The NICs (for their counters).
    pub fn nics(&self) -> &[SimNic] {
        &self.nics
    }

    /// Loses each frame with probability `rate` on every NIC's link, both
    /// directions (0: lossless).
    pub fn set_loss(&self, rate: f64) {
        for n in &self.nics {
            self.fabric.set_link_faults(
                n.port(),
                mlx5_sim::LinkFaults {
                    loss: rate,
                    ..Default::default()
                },
            );
        }
    }
}

/// What a run can switch off to measure it (the factor analysis): the
/// Rpc's settings, the queue sets' and the mlx5 transport's postlist. The
/// default is everything on, as a user would run it.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// The Rpcs' settings (congestion control and its bypasses, zero-copy
    /// RX, preallocated responses).
    pub rpc: RpcConfig,
    /// The queue sets' settings (the UDP port is set per node).
    pub queue: QueueConfig,
    /// Frames per doorbell.
    pub postlist: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            rpc: RpcConfig::default(),
            queue: QueueConfig::default(),
            postlist: transport::mlx5::POSTLIST,
        }
    }
}

/// eRPC at one point on a testbed, for `dur` after `warmup`.
pub fn erpc_on<W: Testbed>(
    w: &W,
    knobs: &Knobs,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Outcome, BenchError>
where
    W::B: 'static,
{
    erpc_until(w, knobs, p, Stop::Time { dur, warmup }, progress)
}

/// eRPC at one point on a testbed until `stop`.
pub fn erpc_until<W: Testbed>(
    w: &W,
    knobs: &Knobs,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<Outcome, BenchError>
where
    W::B: 'static,
{
    type R<B> = Rpc<Mlx5Transport<B>, Ctx>;
    let mut nexuses = Vec::new();
    for i in 0..2 {
        let n = register::<Mlx5Transport<W::B>>(w.nexus(&format!("node{i}:31850")))
            .build()
            .map_err(|e| BenchError::setup(format!("Nexus of node {i}"), e))?;
        nexuses.push(n);
    }
    let uris: Vec<String> = nexuses.iter().map(|n| n.uri().to_string()).collect();
    let mut nodes: Vec<(R<W::B>, Ctx)> = Vec::new();
    for (i, nexus) in nexuses.iter().enumerate() {
        let mut rpc = Rpc::new(
            nexus,
            i as u8,
            w.transport(i, DATA_PORT + i as u16, knobs)?,
            w.allocator(i, node_bytes(p.size, p.window))?,
            knobs.rpc,
            None,
        )
        .map_err(|e| BenchError::setup(format!("Rpc of node {i}"), e))?;
        let c = new_ctx(&mut rpc, p)?;
        nodes.push((rpc, c));
    }
    let out = run_points(&mut nodes, &uris, p, stop, progress, || w.step());
    // Let requests in flight complete before the buffers go back (under
    // heavy loss a large message needs seconds of retransmissions).
    let done_before: u64 = nodes.iter().map(|(_, c)| c.completed).sum();
    for _ in 0..DRAIN_ROUNDS {
        if nodes.iter().all(|(_, c)| c.in_flight == 0) {
            break;
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        w.step();
    }
    let mut out = out?;
    out.drained = nodes.iter().map(|(_, c)| c.completed).sum::<u64>() - done_before;
    out.unfinished = nodes.iter().map(|(_, c)| c.in_flight as u64).sum();
    out.queues = nodes
        .iter()
        .map(|(r, _)| r.transport().queue_set().snapshot())
        .collect();
    out.retransmissions = nodes.iter().map(|(r, _)| r.stats().retransmissions).sum();
    out.tx_flushes = nodes.iter().map(|(r, _)| r.stats().tx_flushes).sum();
    for (r, c) in nodes.iter_mut() {
        while let Some((a, b)) = c.pool.pop() {
            r.free_msg_buffer(a);
            r.free_msg_buffer(b);
        }
    }
    Ok(out)
}

/// Connects the nodes to each other, warms up, measures.
fn run_points<T: Transport + 'static>(
    nodes: &mut [(Rpc<T, Ctx>, Ctx)],
    uris: &[String],
    p: Point,
    stop: Stop,
    progress: &Progress,
    mut step: impl FnMut(),
) -> Result<Outcome, BenchError> {
    for (i, (rpc, ctx)) in nodes.iter_mut().enumerate() {
        let peer = 1 - i;
        for _ in 0..sessions_per_node(p) {
            let sn = rpc.create_session(&uris[peer], peer as u8).map_err(|e| {
                BenchError::setup(format!("session from node {i} to node {peer}"), e)
            })?;
            ctx.sessions.push(sn);
        }
    }
    let t = Instant::now();
    let virtual_time = nodes[0].0.nexus().clock().is_virtual();
    for round in 0.. {
        if nodes
            .iter()
            .all(|(r, c)| c.sessions.iter().all(|&sn| r.is_connected(sn)))
        {
            break;
        }
        let gave_up = if virtual_time {
            round >= CONNECT_ROUNDS
        } else {
            t.elapsed() >= UDP_CONNECT_TIMEOUT
        };
        if gave_up {
            let states: Vec<String> = nodes
                .iter()
                .enumerate()
                .map(|(i, (r, c))| {
                    let st: Vec<_> = c.sessions.iter().map(|&sn| r.session_state(sn)).collect();
                    format!("node {i}: {st:?}")
                })
                .collect();
            return Err(BenchError::Run(format!(
                "sessions did not connect ({})",
                states.join(", ")
            )));
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        step();
    }
    stop.phase(progress, &format!("B = {}", p.batch));
    let mut clock = MeasureClock::new(stop.warmup());
    let mut stall = Stall::new();
    loop {
        if clock.tick(progress) {
            for (_, c) in nodes.iter_mut() {
                c.completed = 0;
                c.lat.reset();
            }
        }
        if let Some(m) = clock.measured() {
            let done: u64 = nodes.iter().map(|(_, c)| c.completed).sum();
            if stop.reached(m, done, p.min_rpcs) {
                break;
            }
            if let Stop::Count(n) = stop
                && stall.stalled(done, 64)
            {
                progress.clear();
                return Err(BenchError::Run(format!(
                    "B = {}: no RPC completed in {STALL_ROUNDS} event-loop rounds \
                     ({done} of the {n} counted)",
                    p.batch
                )));
            }
        }
        for _ in 0..64 {
            for (r, c) in nodes.iter_mut() {
                issue(r, c, p);
                r.run_event_loop_once(c);
            }
            step();
        }
        if let Some(e) = first_error(nodes.iter_mut().map(|(_, c)| c)) {
            progress.clear();
            return Err(e);
        }
    }
    let elapsed = clock.measured().unwrap_or_default();
    progress.clear();
    Ok(summarize(
        &nodes.iter().map(|(_, c)| c).collect::<Vec<_>>(),
        elapsed,
    ))
}

/// The wall clock of one measured run: `warmup`, then the measured
/// interval (an eRPC point and its raw-echo reference keep time alike).
struct MeasureClock {
    start: Instant,
    warmup: Duration,
    /// When the measured interval began.
    t0: Option<Instant>,
}

impl MeasureClock {
    fn new(warmup: Duration) -> MeasureClock {
        MeasureClock {
            start: Instant::now(),
            warmup,
            t0: None,
        }
    }

    /// Advances the progress bar; true exactly once, when the warm-up
    /// has just ended (the caller zeroes its counters then).
    fn tick(&mut self, progress: &Progress) -> bool {
        let now = Instant::now();
        progress.tick(now - self.start);
        if self.t0.is_none() && now - self.start >= self.warmup {
            self.t0 = Some(now);
            return true;
        }
        false
    }

    /// Time since the measured interval began (`None` while warming up).
    fn measured(&self) -> Option<Duration> {
        self.t0.map(|t| t.elapsed())
    }
}

/// The raw-echo reference of one eRPC point, between two transports of a
/// testbed (no eRPC): see [`raw_echo`].
pub fn raw_echo_on<W: Testbed>(
    w: &W,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<RawEcho, BenchError> {
    let mut a = w.transport(0, RAW_ECHO_PORT, &Knobs::default())?;
    let mut b = w.transport(1, RAW_ECHO_PORT + 1, &Knobs::default())?;
    let (mut aa, mut ab) = (w.allocator(0, 2 << 20)?, w.allocator(1, 2 << 20)?);
    raw_echo(
        [&mut a, &mut b],
        [&mut aa, &mut ab],
        p,
        stop,
        progress,
        || w.step(),
    )
}

/// What a raw echo measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawEcho {
    /// Round trips completed per second by both nodes together.
    pub round_trips_per_sec: f64,
    /// Median round-trip time, µs, from the request's batch being queued
    /// to its response (as eRPC's latency is timed).
    pub median_us: f64,
    /// Round trips completed while measuring, both nodes together (as
    /// [`Outcome::completed`] counts RPCs).
    pub round_trips: u64,
}

/// First payload byte of a raw-echo packet: a request (answered) or a
/// response (completes a round trip).
const RAW_REQ: u8 = 0;
const RAW_RESP: u8 = 1;

/// The three frame sizes of a raw-echo message (see [`raw_echo_frame`]).
const FULL: usize = 0;
const LAST: usize = 1;
const SMALL: usize = 2;

/// Which of the pre-built frames (`FULL`, `LAST` or `SMALL`) is frame `j`
/// of a message of `n` data packets, each way: the frame eRPC sends there.
/// Requests: the request's `n` data packets (all full but the last), then
/// `n − 1` header-only requests for response. Answers: a header-only
/// credit return for each request packet but the last, then the
/// response's `n` data packets.
fn raw_echo_frame(n: usize, j: usize, answer: bool) -> usize {
    let data = |i: usize| if i + 1 < n { FULL } else { LAST };
    match (answer, j < n, j + 1 < n) {
        (false, true, _) => data(j),
        (false, false, _) => SMALL,
        (true, _, true) => SMALL,
        (true, _, false) => data(j + 1 - n),
    }
}

/// Frame bytes of `FULL`, `LAST` and `SMALL` for messages of `size` bytes.
fn raw_echo_frame_bytes(size: usize) -> [usize; 3] {
    let n = size.div_ceil(MAX_DATA_PER_PKT).max(1);
    [
        PKTHDR_BYTES + MAX_DATA_PER_PKT,
        PKTHDR_BYTES + (size - (n - 1) * MAX_DATA_PER_PKT),
        PKTHDR_BYTES,
    ]
}

/// One node of the raw echo: what eRPC's node does with packets, without
/// eRPC. Its request and answer frames are pre-built, one per size
/// (headers filled once), and sent as often as needed.
struct EchoNode<'a, T: Transport> {
    t: &'a mut T,
    ring: T::Ring,
    head: usize,
    route: T::Route,
    /// Request frames and answer frames, by `FULL`, `LAST`, `SMALL`, with
    /// their lengths.
    req: [mempool::Buffer; 3],
    resp: [mempool::Buffer; 3],
    lens: [usize; 3],
    /// Data packets per message ([`raw_echo_frame`]'s `n`).
    data_pkts: usize,
    /// Frame index (in its message) of the next request frame to send, and
    /// of the next answer.
    req_idx: usize,
    ans_idx: usize,
    /// Messages (round trips) issued and not yet answered in full.
    in_flight: usize,
    /// Request and response frames queued for the next flush (refused
    /// ones stay).
    queued_req: usize,
    queued_resp: usize,
    /// Frames per message each way ([`packets_per_direction`]).
    frames_per_msg: usize,
    /// Request frames sent and not yet answered, and the most allowed
    /// ([`raw_echo_frames_in_flight`]).
    frames_out: usize,
    frames_cap: usize,
    /// Response frames received of the oldest message in flight.
    resp_frames: usize,
    /// Round trips completed.
    done: u64,
    /// Send time of each request in flight, oldest first (the peer answers
    /// in arrival order and the network keeps it), and the round-trip
    /// times: the same clock reads and histogram records per request as
    /// eRPC's `issue` and continuation, so that the reference also carries
    /// the benchmark's own timing work, and the raw echo's latency is
    /// known.
    sent: VecDeque<Instant>,
    lat: Histogram<u64>,
}

impl<T: Transport> EchoNode<'_, T> {
    /// Queues a batch of request messages if the window allows (eRPC's
    /// `issue`).
    fn issue(&mut self, p: Point) {
        if self.in_flight + p.batch <= p.window {
            self.in_flight += p.batch;
            self.queued_req += p.batch * self.frames_per_msg;
            let now = Instant::now();
            for _ in 0..p.batch {
                self.sent.push_back(now);
            }
        }
    }

    /// One event-loop iteration: an RX burst (each request frame queues a
    /// response frame; the last response frame of a message completes a
    /// round trip), then the TX flush in bursts of the transport's
    /// maximum, requests first and no more of them than the frame limit
    /// allows; what the transport refuses stays queued.
    fn poll(&mut self) {
        let n = self.t.rx_burst();
        if n > 0 {
            let entries = self.ring.entries();
            for k in 0..n {
                match self
                    .ring
                    .packet((self.head + k) % entries)
                    .and_then(|p| p.first())
                {
                    Some(&RAW_REQ) => self.queued_resp += 1,
                    Some(&RAW_RESP) if self.frames_out > 0 => {
                        self.frames_out -= 1;
                        self.resp_frames += 1;
                        if self.resp_frames == self.frames_per_msg {
                            self.resp_frames = 0;
                            self.in_flight -= 1;
                            self.done += 1;
                            if let Some(t) = self.sent.pop_front() {
                                let ns = t.elapsed().as_nanos() as u64;
                                let _ = self.lat.record(ns.max(1));
                            }
                        }
                    }
                    // Malformed, foreign or a response to nothing: not a
                    // round trip.
                    _ => {}
                }
            }
            self.head = (self.head + n) % entries;
            self.t.post_recvs(&mut self.ring, n);
        }
        let chunk = self.t.tx_burst_max().min(16);
        loop {
            let room = self.frames_cap - self.frames_out;
            let nreq = self.queued_req.min(room).min(chunk);
            if nreq + self.queued_resp == 0 {
                break;
            }
            let k = (nreq + self.queued_resp).min(chunk);
            let (route, req, resp, lens) = (&self.route, &self.req, &self.resp, &self.lens);
            let (n, fpm, ri, ai) = (
                self.data_pkts,
                self.frames_per_msg,
                self.req_idx,
                self.ans_idx,
            );
            // Only the `k` items sent are built (building all 16 for a
            // burst of one or two made the reference slower than the
            // point it measures at B = 1).
            let items: ArrayVec<TxItem<'_, T::Route>, 16> = (0..k)
                .map(|j| {
                    let (bufs, f) = if j < nreq {
                        (req, raw_echo_frame(n, (ri + j) % fpm, false))
                    } else {
                        (resp, raw_echo_frame(n, (ai + j - nreq) % fpm, true))
                    };
                    let buf = &bufs[f];
                    TxItem::contiguous(route, &buf.as_slice()[..lens[f]], buf.iova(), buf.lkey())
                })
                .collect();
            let sent = self.t.tx_burst(&items).min(k);
            let sent_req = sent.min(nreq);
            self.queued_req -= sent_req;
            self.frames_out += sent_req;
            self.queued_resp -= sent - sent_req;
            self.req_idx = (self.req_idx + sent_req) % fpm;
            self.ans_idx = (self.ans_idx + sent - sent_req) % fpm;
            if sent < k {
                break;
            }
        }
    }
}

/// The like-for-like reference of an eRPC point: two nodes, each both
/// client and server as in eRPC's run, each sending request messages in
/// batches of `p.batch` with at most `p.window` in flight and answering
/// the other's, polled and flushed the way the eRPC event loop does (one
/// RX burst, then one TX flush, per node per iteration, `step` after
/// both), after the same warm-up as the eRPC point, until the same `stop`.
///
/// A message is the packets an RPC of `p.size` bytes puts on the wire each
/// way ([`packets_per_direction`]: one for a one-packet RPC; for an
/// N-packet one, 2N − 1, eRPC's requests and requests for response one way
/// and its credit returns and responses back), each frame of the size
/// eRPC's is (full data packets, the last one's size, header-only control
/// packets), each request frame answered by one frame,
/// with as many request frames unanswered as eRPC's credits allow
/// ([`raw_echo_frames_in_flight`]) and without eRPC's wait for the first
/// response packet before the requests for the rest: the same packets, at
/// least eRPC's parallelism, none of its protocol work. Returns round
/// trips completed per second of the measured interval by both nodes
/// together, counted as eRPC counts RPCs; eRPC's RPC rate divided by this
/// is at most 1 unless the measurement is wrong (or the machine changed
/// between the two).
///
/// The reference has no loss recovery: it must run on a lossless link
/// (erpc-bench applies `--loss` to the eRPC points only).
pub fn raw_echo<T: Transport>(
    t: [&mut T; 2],
    mut alloc: [&mut Allocator; 2],
    p: Point,
    stop: Stop,
    progress: &Progress,
    mut step: impl FnMut(),
) -> Result<RawEcho, BenchError> {
    let lens = raw_echo_frame_bytes(p.size);
    let frames_per_msg = packets_per_direction(p.size);
    let [ta, tb] = t;
    let routes = [
        ta.resolve(&tb.local_routing_info()),
        tb.resolve(&ta.local_routing_info()),
    ];
    let mut nodes: Vec<EchoNode<'_, T>> = Vec::with_capacity(2);
    let mut failed = None;
    for (i, (t, route)) in [ta, tb].into_iter().zip(routes).enumerate() {
        let made = (|| {
            let route = route.map_err(|e| {
                BenchError::setup(format!("raw echo: resolving node {i}'s peer"), e)
            })?;
            let ring = t
                .take_rx_ring()
                .ok_or_else(|| BenchError::Run("raw echo: the RX ring was taken".into()))?;
            // Six frames: requests and answers of each size.
            let mut bufs: ArrayVec<mempool::Buffer, 6> = ArrayVec::new();
            for &len in lens.iter().chain(&lens) {
                match alloc[i].alloc(len) {
                    Ok(b) => bufs.push(b),
                    Err(e) => {
                        for b in bufs {
                            alloc[i].free(b);
                        }
                        return Err(BenchError::setup("raw echo: packet buffer", e));
                    }
                }
            }
            Ok((route, ring, bufs))
        })();
        match made {
            Ok((route, ring, mut bufs)) => {
                let frames_cap = raw_echo_frames_in_flight(p, ring.entries());
                for (k, b) in bufs.iter_mut().enumerate() {
                    let (len, kind) = (lens[k % 3], if k < 3 { RAW_REQ } else { RAW_RESP });
                    let s = b.as_mut_slice();
                    t.fill_headroom(&route, &mut s[..transport::HEADROOM_BYTES], len);
                    s[transport::HEADROOM_BYTES..len].fill(0);
                    s[transport::HEADROOM_BYTES] = kind;
                }
                let mut bufs = bufs.into_iter();
                let mut three = || -> [mempool::Buffer; 3] {
                    std::array::from_fn(|_| bufs.next().expect("six buffers"))
                };
                let (req, resp) = (three(), three());
                nodes.push(EchoNode {
                    t,
                    ring,
                    head: 0,
                    route,
                    req,
                    resp,
                    lens,
                    data_pkts: p.size.div_ceil(MAX_DATA_PER_PKT).max(1),
                    req_idx: 0,
                    ans_idx: 0,
                    in_flight: 0,
                    queued_req: 0,
                    queued_resp: 0,
                    frames_per_msg,
                    frames_out: 0,
                    frames_cap,
                    resp_frames: 0,
                    done: 0,
                    sent: VecDeque::with_capacity(p.window),
                    lat: histogram(),
                });
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let mut elapsed = 0.0;
    if failed.is_none() {
        // The same warm-up as the eRPC point it is the reference of
        // (first touches of ring and buffer memory, caches, the clock
        // speed settling), then the same measured interval (or, counted,
        // no warm-up and the same count).
        stop.phase(progress, &format!("raw echo, B = {}", p.batch));
        let mut clock = MeasureClock::new(stop.warmup());
        let mut stall = Stall::new();
        loop {
            if clock.tick(progress) {
                for n in nodes.iter_mut() {
                    n.done = 0;
                    n.lat.reset();
                }
            }
            if let Some(m) = clock.measured() {
                let done: u64 = nodes.iter().map(|n| n.done).sum();
                if stop.reached(m, done, 0) {
                    break;
                }
                if let Stop::Count(n) = stop
                    && stall.stalled(done, 64)
                {
                    failed = Some(BenchError::Run(format!(
                        "raw echo, B = {}: no round trip completed in {STALL_ROUNDS} \
                         event-loop rounds ({done} of the {n} counted)",
                        p.batch
                    )));
                    break;
                }
            }
            for _ in 0..64 {
                for n in nodes.iter_mut() {
                    n.issue(p);
                    n.poll();
                }
                step();
            }
        }
        elapsed = clock.measured().unwrap_or_default().as_secs_f64();
        progress.clear();
    }
    let done: u64 = nodes.iter().map(|n| n.done).sum();
    let mut lat = histogram();
    for n in &nodes {
        // Same bounds on both sides: `add` cannot fail.
        let _ = lat.add(&n.lat);
    }
    for (i, n) in nodes.into_iter().enumerate() {
        for b in n.req.into_iter().chain(n.resp) {
            alloc[i].free(b);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if done == 0 {
        let within = match stop {
            Stop::Time { dur, .. } => format!("{:.1} s", dur.as_secs_f64()),
            Stop::Count(_) => "the run".into(),
        };
        return Err(BenchError::Run(format!(
            "raw echo: no message of {} bytes came back in {within}",
            p.size
        )));
    }
    Ok(RawEcho {
        round_trips_per_sec: done as f64 / elapsed,
        median_us: lat.value_at_quantile(0.5) as f64 / 1000.0,
        round_trips: done,
    })
}

/// An identity-mapped allocator for the kernel-UDP runs (the kernel
/// copies; nothing is registered with a device).
fn udp_allocator(plan: &MemoryPlan, bytes: usize, what: &str) -> Result<Allocator, BenchError> {
    erpc::sim::sim_allocator(bytes, plan.region).map_err(|e| BenchError::setup(what.to_string(), e))
}

/// eRPC over kernel UDP on loopback, two Rpcs in one thread (the same shape
/// as the device-model run, so the two are comparable). With `capture`,
/// node 0's transport captures every datagram it sends and receives and
/// both Nexuses' SM packets are captured too (see [`crate::capture`]);
/// `inspect` exposes the Nexuses on the debug endpoint.
pub fn udp_erpc(
    plan: &MemoryPlan,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
) -> Result<Outcome, BenchError> {
    udp_erpc_until(
        plan,
        p,
        Stop::Time { dur, warmup },
        progress,
        capture,
        inspect,
    )
}

/// [`udp_erpc`] until `stop`.
pub fn udp_erpc_until(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
) -> Result<Outcome, BenchError> {
    udp_erpc_with(
        plan,
        p,
        stop,
        progress,
        capture,
        inspect,
        RpcConfig::default(),
    )
}

/// [`udp_erpc_until`] with the Rpcs' settings `cfg` (e.g. congestion
/// control switched on, which over kernel UDP needs
/// `cfg.cc.on_software_stack`).
pub fn udp_erpc_with(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
    cfg: RpcConfig,
) -> Result<Outcome, BenchError> {
    let free_port = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
            .map_err(|e| BenchError::setup("a free UDP port on 127.0.0.1", e))
    };
    let uris = [
        format!("127.0.0.1:{}", free_port()?),
        format!("127.0.0.1:{}", free_port()?),
    ];
    let mut nodes: Vec<(Rpc<UdpTransport, Ctx>, Ctx)> = Vec::new();
    for (i, uri) in uris.iter().enumerate() {
        let mut b = Nexus::builder(uri).inspect(inspect);
        if let Some(cap) = capture {
            // Both nodes are 127.0.0.1, without a MAC on loopback (as the
            // UDP transport frames its own datagrams).
            let nodes = HashMap::from([(
                "127.0.0.1".to_string(),
                NodeAddr {
                    mac: [0; 6],
                    ipv4: Ipv4Addr::LOCALHOST,
                },
            )]);
            let link = CapturingSmLink::new(
                Arc::new(erpc::nexus::UdpSmLink::new()),
                cap.clone(),
                nodes,
                unix_ns,
            );
            b = b.sm_link(Arc::new(link));
            if let Some(port) = uri.rsplit(':').next().and_then(|p| p.parse().ok()) {
                cap.note_port(port);
            }
        }
        let nexus = register::<UdpTransport>(b)
            .build()
            .map_err(|e| BenchError::setup(format!("Nexus of node {i} on {uri}"), e))?;
        let udp = UdpConfig {
            pcap: capture.filter(|_| i == 0).map(Capture::transport_file),
            ..UdpConfig::loopback()
        };
        let t = UdpTransport::new(&udp)
            .map_err(|e| BenchError::setup(format!("UDP transport of node {i}"), e))?;
        if let Some(cap) = capture {
            cap.note_port(t.local_routing_info().udp_port);
        }
        let alloc = udp_allocator(
            plan,
            node_bytes(p.size, p.window),
            &format!("message buffers of node {i}"),
        )?;
        let mut rpc = Rpc::new(&nexus, i as u8, t, alloc, cfg, None)
            .map_err(|e| BenchError::setup(format!("Rpc of node {i}"), e))?;
        let c = new_ctx(&mut rpc, p)?;
        nodes.push((rpc, c));
    }
    let out = run_points(&mut nodes, &uris, p, stop, progress, || {});
    // Let stragglers land before the Rpcs go away (kernel UDP on loopback
    // does not lose them; the bound only keeps a bug from hanging here).
    let t = Instant::now();
    while nodes.iter().any(|(_, c)| c.in_flight > 0) && t.elapsed() < Duration::from_secs(1) {
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
    }
    let mut out = out?;
    out.retransmissions = nodes.iter().map(|(r, _)| r.stats().retransmissions).sum();
    out.tx_flushes = nodes.iter().map(|(r, _)| r.stats().tx_flushes).sum();
    for (r, c) in nodes.iter_mut() {
        while let Some((a, b)) = c.pool.pop() {
            r.free_msg_buffer(a);
            r.free_msg_buffer(b);
        }
    }
    Ok(out)
}

/// The system clock in ns since the Unix epoch: what the UDP transport
/// stamps its capture with, so SM packets sort among its frames.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The raw-echo reference of an eRPC point over two UDP transports on
/// loopback (see [`raw_echo`]).
pub fn udp_raw_echo(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<RawEcho, BenchError> {
    let udp = |who| {
        UdpTransport::new(&UdpConfig::loopback())
            .map_err(|e| BenchError::setup(format!("raw echo: UDP transport {who}"), e))
    };
    let (mut a, mut b) = (udp("a")?, udp("b")?);
    let mut aa = udp_allocator(plan, 2 << 20, "raw echo: buffers")?;
    let mut ab = udp_allocator(plan, 2 << 20, "raw echo: buffers")?;
    raw_echo(
        [&mut a, &mut b],
        [&mut aa, &mut ab],
        p,
        stop,
        progress,
        || {},
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            transport: Which::Mlx5Sim,
            batches: vec![1, 3],
            window: 60,
            size: 32,
            secs: 1.0,
            warmup_secs: 0.2,
            pci: None,
            pcap: None,
            loss: 0.0,
            count: None,
        }
    }

    fn usage(s: Settings) -> String {
        match s.validate() {
            Err(BenchError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_limits_are_named() {
        settings().validate().unwrap();
        let m = usage(Settings {
            size: MAX_MSG_BYTES + 1,
            ..settings()
        });
        assert!(m.contains(&MAX_MSG_BYTES.to_string()), "{m}");
        Settings {
            size: MAX_MSG_BYTES,
            window: 8,
            batches: vec![1],
            ..settings()
        }
        .validate()
        .unwrap();
        assert!(
            usage(Settings {
                window: 0,
                ..settings()
            })
            .contains("1 to 1024")
        );
        assert!(
            usage(Settings {
                batches: vec![0],
                ..settings()
            })
            .contains("--batch 0")
        );
        assert!(
            usage(Settings {
                batches: vec![61],
                ..settings()
            })
            .contains("--window (60)")
        );
        for secs in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e9] {
            let m = usage(Settings { secs, ..settings() });
            assert!(m.contains("at most 86400"), "{m}");
        }
        let m = usage(Settings {
            size: MAX_MSG_BYTES,
            window: 1024,
            batches: vec![1],
            ..settings()
        });
        assert!(m.contains("MiB of message buffers per node"), "{m}");
        for warmup_secs in [f64::NAN, -0.1, 1e6] {
            let m = usage(Settings {
                warmup_secs,
                ..settings()
            });
            assert!(m.contains("from 0 to 86400"), "{m}");
        }
        Settings {
            warmup_secs: 0.0,
            ..settings()
        }
        .validate()
        .unwrap();
        assert!(
            usage(Settings {
                pci: Some("0000:03:00.0".into()),
                ..settings()
            })
            .contains("--pci is for")
        );
        assert!(
            usage(Settings {
                transport: Which::Mlx5,
                ..settings()
            })
            .contains("needs --pci")
        );
        // Kernel UDP captures too (node 0's transport and the SM link).
        assert!(
            Settings {
                transport: Which::Udp,
                pcap: Some("x".into()),
                ..settings()
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn count_zero_is_refused_and_count_replaces_the_clock() {
        let m = usage(Settings {
            count: Some(0),
            ..settings()
        });
        assert!(m.contains("--count 0"), "{m}");
        let s = Settings {
            count: Some(500),
            ..settings()
        };
        s.validate().unwrap();
        assert_eq!(s.stop(), Stop::Count(500));
        assert_eq!(Stop::Count(500).warmup(), Duration::ZERO);
        assert_eq!(
            settings().stop(),
            Stop::Time {
                dur: Duration::from_secs(1),
                warmup: Duration::from_millis(200)
            }
        );
        // A count stops on the count alone, whatever the time.
        assert!(!Stop::Count(500).reached(Duration::from_secs(1000), 499, 0));
        assert!(Stop::Count(500).reached(Duration::ZERO, 500, 0));
        let t = settings().stop();
        assert!(!t.reached(Duration::from_millis(999), 1 << 40, 0));
        assert!(t.reached(Duration::from_secs(1), 0, 0));
        // min_rpcs stretches a timed run, up to MAX_STRETCH.
        assert!(!t.reached(Duration::from_secs(1), 9, 10));
        assert!(t.reached(Duration::from_secs(u64::from(MAX_STRETCH)), 9, 10));
    }

    #[test]
    fn a_stall_is_rounds_in_a_row_without_a_completion() {
        let mut s = Stall::new();
        assert!(!s.stalled(0, STALL_ROUNDS - 1));
        assert!(!s.stalled(1, STALL_ROUNDS - 1), "a completion restarts it");
        assert!(!s.stalled(1, STALL_ROUNDS - 1));
        assert!(s.stalled(1, 1));
    }

    /// A counted run on the device model stops on its count alone, and the
    /// same count is the same work: the same RPCs and round trips
    /// completed every time (what tools/bench-callgrind.sh relies on).
    #[test]
    fn counted_runs_on_the_device_model_are_the_same_work_every_time() {
        let p = |batch| Point {
            batch,
            window: 60,
            size: 32,
            min_rpcs: 0,
        };
        let plan = MemoryPlan::decide("bench unit test", crate::memory::default_bench_pages());
        let progress = Progress::hidden();
        let run = || -> (Vec<u64>, Vec<u64>) {
            let dm = DeviceModel::new(plan.clone(), None, false).unwrap();
            let mut erpc = Vec::new();
            let mut raw = Vec::new();
            for b in [1, 8] {
                let r = raw_echo_on(&dm, p(b), Stop::Count(3000), &progress).unwrap();
                raw.push(r.round_trips);
                let o =
                    erpc_until(&dm, &Knobs::default(), p(b), Stop::Count(3000), &progress).unwrap();
                assert_eq!(o.unfinished, 0);
                erpc.push(o.completed);
            }
            (erpc, raw)
        };
        let (erpc, raw) = run();
        for n in erpc.iter().chain(&raw) {
            // At most one check (64 rounds) past the count: with 120
            // requests in flight, well under 64 * 120 more.
            assert!((3000..3000 + 64 * 120).contains(n), "{erpc:?} {raw:?}");
        }
        assert_eq!(run(), (erpc, raw));
    }

    #[test]
    fn multi_packet_rpcs_are_compared_per_packet() {
        assert_eq!(packets_per_direction(0), 1);
        assert_eq!(packets_per_direction(32), 1);
        assert_eq!(packets_per_direction(MAX_DATA_PER_PKT), 1);
        assert_eq!(packets_per_direction(MAX_DATA_PER_PKT + 1), 3);
        assert_eq!(packets_per_direction(2000), 5);
        assert_eq!(raw_echo_data_bytes(2000), MAX_DATA_PER_PKT);
        assert_eq!(ratio_to_raw(100.0, 1000.0), Some(0.1));
        assert_eq!(ratio_to_raw(100.0, 0.0), None);
    }

    /// The raw echo's frames are eRPC's: for 3 data packets, requests
    /// full, full, last, then two header-only requests for response;
    /// answers two header-only credit returns, then full, full, last.
    #[test]
    fn raw_echo_frames_have_the_sizes_of_erpcs() {
        let req: Vec<usize> = (0..5).map(|j| raw_echo_frame(3, j, false)).collect();
        let ans: Vec<usize> = (0..5).map(|j| raw_echo_frame(3, j, true)).collect();
        assert_eq!(req, [FULL, FULL, LAST, SMALL, SMALL]);
        assert_eq!(ans, [SMALL, SMALL, FULL, FULL, LAST]);
        assert_eq!(raw_echo_frame(1, 0, false), LAST);
        assert_eq!(raw_echo_frame(1, 0, true), LAST);
        let size = 2 * MAX_DATA_PER_PKT + 7;
        assert_eq!(packets_per_direction(size), 5);
        assert_eq!(
            raw_echo_frame_bytes(size),
            [
                PKTHDR_BYTES + MAX_DATA_PER_PKT,
                PKTHDR_BYTES + 7,
                PKTHDR_BYTES
            ]
        );
        assert_eq!(raw_echo_frame_bytes(32)[LAST], PKTHDR_BYTES + 32);
        assert_eq!(raw_echo_frame_bytes(0)[LAST], PKTHDR_BYTES);
    }

    #[test]
    fn the_raw_echo_keeps_as_many_frames_on_the_wire_as_erpc_may() {
        let p = |window, size| Point {
            batch: 1,
            window,
            size,
            min_rpcs: 0,
        };
        // One packet: the window, whatever the ring (as before).
        assert_eq!(raw_echo_frames_in_flight(p(60, 32), 4096), 60);
        assert_eq!(raw_echo_frames_in_flight(p(1024, 32), 512), 1024);
        // 4 KiB: k frames a message; one session's credits bound 8 messages.
        let k = packets_per_direction(4096);
        assert!(k > 1);
        assert_eq!(
            raw_echo_frames_in_flight(p(8, 4096), 4096),
            (8 * k).min(erpc::SESSION_CREDITS)
        );
        // Two sessions for a window of 16: twice the credits.
        assert_eq!(
            raw_echo_frames_in_flight(p(16, 4096), 4096),
            (16 * k).min(2 * erpc::SESSION_CREDITS)
        );
        // Half the ring at most.
        assert_eq!(raw_echo_frames_in_flight(p(1024, 4096), 1024), 1024);
        assert_eq!(raw_echo_frames_in_flight(p(512, 4096), 512), 512);
        assert_eq!(raw_echo_frames_in_flight(p(64, 4096), 64), 64);
    }

    /// A multi-packet raw echo moves whole messages: every round trip is
    /// `packets_per_direction` frames each way on the device model's wire,
    /// and it completes with its frame limit below the window's frames.
    #[test]
    fn a_multi_packet_raw_echo_moves_every_frame_of_each_message() {
        let size = 4096;
        let k = packets_per_direction(size) as u64;
        let plan = MemoryPlan::decide("bench unit test", crate::memory::default_bench_pages());
        let dm = DeviceModel::new(plan, None, false).unwrap();
        let p = Point {
            batch: 8,
            window: 8,
            size,
            min_rpcs: 0,
        };
        let r = raw_echo_on(&dm, p, Stop::Count(500), &Progress::hidden()).unwrap();
        assert!(r.round_trips >= 500, "{r:?}");
        let frames: u64 = dm.nics().iter().map(|n| n.stats().tx_frames).sum();
        // Both nodes' round trips, each 2k frames; at most the window's
        // messages (both nodes) still on the wire at the end.
        let min = r.round_trips * 2 * k;
        let max = (r.round_trips + 2 * 8) * 2 * k;
        assert!((min..=max).contains(&frames), "{frames} frames for {r:?}");
        assert_eq!(
            dm.nics()
                .iter()
                .map(|n| n.drops(mlx5_sim::DropReason::OutOfBuffer))
                .sum::<u64>(),
            0
        );
    }
}
