//! `erpc-bench --experiment loss` and `--experiment failure-detection`:
//! the paper's loss-tolerance experiment and failure detection time.
//!
//! * **loss**: goodput of the largest messages (about 8 MB, requests and
//!   responses) on one session between two device-model NICs while the
//!   fabric loses frames at 10⁻⁶ … 10⁻², as a ratio to the lossless
//!   goodput measured in the same run, with go-back-N rollbacks and TX
//!   drains counted; then the small-RPC rate at loss 10⁻³ against
//!   lossless. Every RPC either completes or the run fails (eRPC must
//!   repair every loss); the table prints how many completed. Rates are
//!   wall-clock rates of the device model, whose fabric has no link rate:
//!   the ratio, not the absolute goodput, is the result.
//! * **failure-detection**: a server process on kernel UDP (loopback)
//!   holds requests without answering; the benchmark kills it (SIGKILL)
//!   and measures the time until the client's continuations report
//!   `PeerFailed`, over many trials, against the configured failure
//!   timeout.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use erpc::{Completion, Nexus, ReqHandle, Request, Rpc, RpcConfig, RpcError};
use serde::Serialize;
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

use crate::bench::{BenchError, DeviceModel, Knobs, Outcome, Point, Progress, erpc_on};
use crate::memory::MemoryPlan;

/// Frame loss rates of the loss experiment (0 is the reference).
pub const LOSS_RATES: [f64; 6] = [0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2];
/// Loss rate of the small-RPC comparison.
pub const SMALL_RPC_LOSS: f64 = 1e-3;

/// One row of the large-message loss table.
#[derive(Debug, Clone, Serialize)]
pub struct LossRow {
    /// Frame loss probability per link and direction.
    pub loss: f64,
    /// Message size (requests and responses).
    pub size: usize,
    /// RPCs completed while measuring.
    pub rpcs: u64,
    /// RPCs in flight at the end that completed afterwards.
    pub drained: u64,
    /// RPCs that never completed (the run fails if any).
    pub unfinished: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Payload bits per second, both directions.
    pub goodput_gbps: f64,
    /// Goodput over the lossless goodput of the same run.
    pub ratio_to_lossless: Option<f64>,
    /// Go-back-N rollbacks.
    pub retransmissions: u64,
    /// TX queue drains.
    pub tx_flushes: u64,
}

/// One row of the small-RPC loss comparison.
#[derive(Debug, Clone, Serialize)]
pub struct SmallLossRow {
    /// Requests per batch.
    pub batch: usize,
    /// Frame loss probability.
    pub loss: f64,
    /// Million RPCs per second, both nodes.
    pub mrps: f64,
    /// Over the lossless rate at the same batch.
    pub ratio_to_lossless: Option<f64>,
    /// Go-back-N rollbacks.
    pub retransmissions: u64,
    /// RPCs completed while measuring.
    pub rpcs: u64,
}

fn measure(
    plan: &MemoryPlan,
    loss: f64,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Outcome, BenchError> {
    let dm = DeviceModel::new(plan.clone(), None, false)?;
    dm.set_loss(loss);
    erpc_on(&dm, &Knobs::default(), p, dur, warmup, progress)
}

/// The large-message rows: `size`-byte RPCs with `window` in flight per
/// node, at every rate of [`LOSS_RATES`]. `row` is called as each row is
/// measured.
pub fn large_message_loss(
    plan: &MemoryPlan,
    size: usize,
    window: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    mut row: impl FnMut(&LossRow) -> Result<(), BenchError>,
) -> Result<Vec<LossRow>, BenchError> {
    let mut rows: Vec<LossRow> = Vec::new();
    // At least one RPC per point (heavy loss is slow), so each row has a
    // goodput.
    let p = Point {
        batch: 1,
        window,
        size,
        min_rpcs: 1,
    };
    for loss in LOSS_RATES {
        let o = measure(plan, loss, p, dur, warmup, progress)?;
        let goodput_gbps = o.rpcs_per_sec * 2.0 * size as f64 * 8.0 / 1e9;
        let ratio_to_lossless = rows
            .first()
            .filter(|r| r.goodput_gbps > 0.0)
            .map(|r| goodput_gbps / r.goodput_gbps);
        if o.unfinished > 0 {
            return Err(BenchError::Run(format!(
                "loss {loss}: {} RPCs did not complete",
                o.unfinished
            )));
        }
        let r = LossRow {
            loss,
            size,
            rpcs: o.completed,
            drained: o.drained,
            unfinished: o.unfinished,
            seconds: o.elapsed_s,
            goodput_gbps,
            ratio_to_lossless,
            retransmissions: o.retransmissions,
            tx_flushes: o.tx_flushes,
        };
        row(&r)?;
        rows.push(r);
    }
    Ok(rows)
}

/// The small-RPC comparison: at each batch, lossless then
/// [`SMALL_RPC_LOSS`].
#[allow(clippy::too_many_arguments)]
pub fn small_rpc_loss(
    plan: &MemoryPlan,
    batches: &[usize],
    window: usize,
    size: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    mut row: impl FnMut(&SmallLossRow) -> Result<(), BenchError>,
) -> Result<Vec<SmallLossRow>, BenchError> {
    let mut rows = Vec::new();
    for &batch in batches {
        let p = Point {
            batch,
            window,
            size,
            min_rpcs: 0,
        };
        let mut lossless = None;
        for loss in [0.0, SMALL_RPC_LOSS] {
            let o = measure(plan, loss, p, dur, warmup, progress)?;
            let mrps = o.rpcs_per_sec / 1e6;
            let r = SmallLossRow {
                batch,
                loss,
                mrps,
                ratio_to_lossless: lossless.filter(|&m: &f64| m > 0.0).map(|m| mrps / m),
                retransmissions: o.retransmissions,
                rpcs: o.completed,
            };
            if loss == 0.0 {
                lossless = Some(mrps);
            }
            row(&r)?;
            rows.push(r);
        }
    }
    Ok(rows)
}

// ------------------------------------------------- failure detection

/// Request type the failure-detection peer holds without answering.
pub const HOLD: u8 = 7;
/// Requests in flight when the peer is killed.
pub const HELD_REQUESTS: usize = 4;

/// What the failure-detection experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    /// The configured failure timeout.
    pub timeout_ms: u64,
    /// Milliseconds from the kill to the first error continuation, per trial.
    pub trials_ms: Vec<f64>,
    /// Median of `trials_ms`.
    pub median_ms: f64,
    /// Largest of `trials_ms`.
    pub max_ms: f64,
    /// Smallest of `trials_ms`.
    pub min_ms: f64,
}

#[derive(Default)]
struct Held(Vec<ReqHandle>);

fn hold<T: Transport>(_rpc: &mut Rpc<T, Held>, c: &mut Held, req: Request<'_>) {
    c.0.push(req.handle);
}

/// The peer process of the failure-detection experiment: an Rpc on kernel
/// UDP at `uri` that holds every request it gets. Prints `READY` when its
/// Rpc exists and `HELD n` as requests arrive; runs until killed.
pub fn failure_peer(uri: &str) -> Result<(), BenchError> {
    let nexus = Nexus::builder(uri)
        .handler::<UdpTransport, Held>(HOLD, hold::<UdpTransport>)
        .build()
        .map_err(|e| BenchError::setup(format!("peer Nexus on {uri}"), e))?;
    let t = UdpTransport::new(&UdpConfig::loopback())
        .map_err(|e| BenchError::setup("peer UDP transport", e))?;
    let alloc = erpc_sim::sim_allocator(4 << 20, mempool::RegionOptions::default())
        .map_err(|e| BenchError::setup("peer buffers", e))?;
    let mut rpc: Rpc<UdpTransport, Held> =
        Rpc::new(&nexus, 0, t, alloc, RpcConfig::default(), None)
            .map_err(|e| BenchError::setup("peer Rpc", e))?;
    let mut held = Held::default();
    println!("READY");
    let mut told = 0;
    loop {
        rpc.run_event_loop_once(&mut held);
        if held.0.len() != told {
            told = held.0.len();
            println!("HELD {told}");
        }
    }
}

struct Client {
    session: u16,
    failed_at: Option<Instant>,
    errors: Vec<RpcError>,
}

fn client_cont<T: Transport>(rpc: &mut Rpc<T, Client>, c: &mut Client, comp: Completion) {
    if let Err(e) = comp.result {
        c.failed_at.get_or_insert_with(Instant::now);
        c.errors.push(e);
    }
    rpc.free_msg_buffer(comp.req);
    rpc.free_msg_buffer(comp.resp);
}

fn free_port() -> Result<u16, BenchError> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::setup("a free UDP port on 127.0.0.1", e))
}

/// Reads lines from the child until one starts with `want`.
fn expect_line(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    want: &str,
) -> Result<(), BenchError> {
    for l in lines {
        let l = l.map_err(|e| BenchError::Run(format!("reading the peer: {e}")))?;
        if l.starts_with(want) {
            return Ok(());
        }
    }
    Err(BenchError::Run(format!(
        "the peer exited before saying {want}"
    )))
}

/// Runs `trials` kills of a peer started as `exe --failure-peer URI`.
pub fn failure_detection(
    exe: &Path,
    trials: usize,
    timeout_ms: u64,
    progress: &Progress,
) -> Result<Detection, BenchError> {
    use std::io::BufRead;
    let mut trials_ms = Vec::with_capacity(trials);
    progress.phase(
        "trials",
        Duration::from_millis(trials as u64 * (timeout_ms + 300)),
    );
    let t_all = Instant::now();
    for trial in 0..trials {
        progress.tick(t_all.elapsed());
        let peer_uri = format!("127.0.0.1:{}", free_port()?);
        let mut child = Command::new(exe)
            .args(["--failure-peer", &peer_uri])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::setup(format!("starting {}", exe.display()), e))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let r = expect_line(&mut lines, "READY");
            let _ = tx.send(r);
            let r = expect_line(&mut lines, &format!("HELD {HELD_REQUESTS}"));
            let _ = tx.send(r);
        });
        let result = (|| {
            rx.recv_timeout(Duration::from_secs(30))
                .map_err(|_| BenchError::Run("the peer did not start".into()))??;
            let uri = format!("127.0.0.1:{}", free_port()?);
            let nexus = Nexus::builder(&uri)
                .failure_timeout_ms(timeout_ms)
                .build()
                .map_err(|e| BenchError::setup("client Nexus", e))?;
            let t = UdpTransport::new(&UdpConfig::loopback())
                .map_err(|e| BenchError::setup("client UDP transport", e))?;
            let alloc = erpc_sim::sim_allocator(4 << 20, mempool::RegionOptions::default())
                .map_err(|e| BenchError::setup("client buffers", e))?;
            let cfg = RpcConfig {
                failure_timeout_ms: timeout_ms,
                ..RpcConfig::default()
            };
            let mut rpc: Rpc<UdpTransport, Client> = Rpc::new(&nexus, 0, t, alloc, cfg, None)
                .map_err(|e| BenchError::setup("client Rpc", e))?;
            let mut c = Client {
                session: 0,
                failed_at: None,
                errors: Vec::new(),
            };
            c.session = rpc
                .create_session(&peer_uri, 0)
                .map_err(|e| BenchError::setup("session to the peer", e))?;
            for k in 0..HELD_REQUESTS {
                let req = rpc
                    .alloc_msg_buffer(32)
                    .map_err(|e| BenchError::setup("request", e))?;
                let resp = rpc
                    .alloc_msg_buffer(32)
                    .map_err(|e| BenchError::setup("response", e))?;
                rpc.enqueue_request(c.session, HOLD, req, resp, client_cont::<UdpTransport>, k)
                    .map_err(|e| BenchError::Run(e.to_string()))?;
            }
            // Until the peer holds every request.
            let t0 = Instant::now();
            loop {
                rpc.run_event_loop_once(&mut c);
                match rx.try_recv() {
                    Ok(r) => break r?,
                    Err(_) if t0.elapsed() > Duration::from_secs(30) => {
                        return Err(BenchError::Run("the peer never held the requests".into()));
                    }
                    Err(_) => {}
                }
            }
            let killed = Instant::now();
            child
                .kill()
                .map_err(|e| BenchError::Run(format!("killing the peer: {e}")))?;
            while c.errors.len() < HELD_REQUESTS {
                rpc.run_event_loop_once(&mut c);
                if killed.elapsed() > Duration::from_millis(100 * timeout_ms.max(100)) {
                    return Err(BenchError::Run(format!(
                        "no error continuation {} ms after the kill",
                        killed.elapsed().as_millis()
                    )));
                }
            }
            if let Some(e) = c
                .errors
                .iter()
                .find(|e| !matches!(e, RpcError::PeerFailed { .. }))
            {
                return Err(BenchError::Run(format!("expected PeerFailed, got {e}")));
            }
            let at = c.failed_at.expect("errors were recorded");
            Ok((at - killed).as_secs_f64() * 1e3)
        })();
        let _ = child.kill();
        let _ = child.wait();
        let ms = result.map_err(|e| BenchError::Run(format!("trial {trial}: {e}")))?;
        trials_ms.push(ms);
    }
    progress.clear();
    let mut sorted = trials_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Detection {
        timeout_ms,
        median_ms: sorted[sorted.len() / 2],
        max_ms: *sorted.last().unwrap_or(&0.0),
        min_ms: *sorted.first().unwrap_or(&0.0),
        trials_ms,
    })
}

// --------------------------------------------------- factor analysis

/// One row of the factor analysis: a configuration with one optimisation
/// switched off (or all on, or congestion control off).
#[derive(Debug, Clone, Serialize)]
pub struct FactorRow {
    /// What is switched off.
    pub factor: &'static str,
    /// Million RPCs per second, both nodes: the median of the rounds.
    pub mrps: f64,
    /// Every round's rate.
    pub rounds_mrps: Vec<f64>,
    /// `mrps` over the all-on rate (below 1: the optimisation helps).
    pub ratio_to_all_on: f64,
}

/// The configurations of the factor analysis: everything on, then each of
/// eRPC's optimisations off in turn (the paper's Table 3 idea), and
/// congestion control off altogether (its cost when uncongested).
pub fn factor_knobs() -> Vec<(&'static str, Knobs)> {
    let all = Knobs::default();
    let rpc = |f: &dyn Fn(&mut erpc::RpcConfig)| {
        let mut k = all;
        f(&mut k.rpc);
        k
    };
    let queue = |f: &dyn Fn(&mut mlx5::QueueConfig)| {
        let mut k = all;
        f(&mut k.queue);
        k
    };
    vec![
        ("none (all optimisations on)", all),
        (
            "batched RTT timestamps",
            rpc(&|r| r.cc.batch_timestamps = false),
        ),
        ("Timely bypass", rpc(&|r| r.cc.timely_bypass = false)),
        ("timing-wheel bypass", rpc(&|r| r.cc.wheel_bypass = false)),
        (
            // 16 strides: the smallest striding WQE devices accept is
            // 16 KiB (DPDK's log_min_stride_wqe_sz default).
            "multi-packet RQ (16 instead of 512 strides per WQE)",
            queue(&|q| {
                q.rq_log_strides = 4;
                q.rq_log_wqes = 8;
            }),
        ),
        (
            "unsignaled TX (a CQE per send instead of 1 per 64)",
            queue(&|q| q.unsignaled_batch = 1),
        ),
        ("doorbell batching (postlist 1)", {
            let mut k = all;
            k.postlist = 1;
            k
        }),
        (
            "preallocated responses",
            rpc(&|r| r.prealloc_responses = false),
        ),
        ("zero-copy RX", rpc(&|r| r.zero_copy_rx = false)),
        (
            "congestion control (Timely, wheel, bypasses)",
            rpc(&|r| r.cc = erpc::CcConfig::disabled()),
        ),
    ]
}

/// Measures every configuration of [`factor_knobs`] `rounds` times,
/// interleaved (so that a change in the machine's load hits every row
/// alike), at one point; the rate of a row is the median of its rounds.
#[allow(clippy::too_many_arguments)]
pub fn factor_analysis(
    plan: &MemoryPlan,
    p: Point,
    rounds: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Vec<FactorRow>, BenchError> {
    let knobs = factor_knobs();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); knobs.len()];
    for _ in 0..rounds.max(1) {
        for (k, (_, kn)) in knobs.iter().enumerate() {
            let dm = DeviceModel::new(plan.clone(), None, false)?;
            let o = erpc_on(&dm, kn, p, dur, warmup, progress)?;
            rates[k].push(o.rpcs_per_sec / 1e6);
        }
    }
    let median = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let base = median(&rates[0]);
    Ok(knobs
        .iter()
        .zip(rates)
        .map(|((name, _), r)| {
            let m = median(&r);
            FactorRow {
                factor: name,
                mrps: m,
                ratio_to_all_on: if base > 0.0 { m / base } else { 0.0 },
                rounds_mrps: r,
            }
        })
        .collect())
}
