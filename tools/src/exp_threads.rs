//! One Rpc per core (issue 28): `erpc-bench --threads N`. N threads, thread
//! i owning Rpc i of node A and Rpc i of node B (each Rpc client and server
//! of the other, as in the one-thread main job): on the device model each
//! Rpc has its own queue set on its node's NIC (its own UDP port, steered
//! by its own flow rule), on kernel UDP its own socket. Every thread
//! measures over the same wall-clock interval; the table gives each
//! thread's rate, the total, and the scaling efficiency against one thread
//! measured in the same run (total at N / (N x the one-thread total)).
//!
//! The device model runs threaded here (wall clock; a doorbell delivers its
//! frames inside the sender's call), so the threads share the model's
//! NICs the way the Rpcs of one process share a real ConnectX: whatever
//! the model serialises shows up as lost efficiency.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use erpc::{Nexus, Rpc};
use mempool::{Allocator, AllocatorConfig};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use serde::Serialize;
use transport::Transport;
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::udp::{UdpConfig, UdpTransport};

use crate::bench::{BenchError, Ctx, Point, issue, loopback_uri, new_ctx, register};
use crate::memory::{MemoryPlan, node_bytes};

/// Which transport the threads run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ThreadsOn {
    /// Two device-model NICs, threaded.
    DeviceModel,
    /// Kernel UDP on loopback.
    Udp,
}

/// One row: a point at a thread count.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadsRow {
    /// Requests per batch.
    pub batch: usize,
    /// Threads (Rpcs per node).
    pub threads: usize,
    /// RPCs per second of each thread (both its Rpcs), in millions.
    pub per_thread_mrps: Vec<f64>,
    /// Their sum.
    pub total_mrps: f64,
    /// The one-thread total of the same run, and total / (threads × it).
    pub one_thread_mrps: f64,
    pub efficiency: f64,
}

/// The measured interval of one run, shared by its threads.
struct Phase {
    /// Threads that connected and warmed up.
    ready: AtomicUsize,
    /// Set by the main thread: count from now on.
    start: AtomicBool,
    /// Set by the main thread: stop counting.
    stop: AtomicBool,
}

/// What a thread reports: RPCs in the measured interval, and the first
/// error of its Rpcs.
type ThreadResult = Result<u64, BenchError>;

/// Runs one thread's two Rpcs (node A's and node B's Rpc `i`), each a
/// client of the other, until the main thread says stop.
fn pair_loop<T: Transport + 'static>(
    i: usize,
    mut nodes: [(Rpc<T, Ctx>, Ctx); 2],
    uris: &[String; 2],
    p: Point,
    phase: &Phase,
) -> ThreadResult {
    for (k, (rpc, ctx)) in nodes.iter_mut().enumerate() {
        let peer = &uris[1 - k];
        // Enough sessions for the window (8 slots each), as erpc-bench's
        // one-thread run opens.
        for _ in 0..crate::bench::sessions_per_node(p) {
            ctx.add_session(
                rpc.create_session(peer, i as u8)
                    .map_err(|e| BenchError::setup(format!("thread {i}: session to {peer}"), e))?,
            );
        }
    }
    let t = Instant::now();
    while !nodes
        .iter()
        .all(|(r, c)| c.sessions().iter().all(|&sn| r.is_connected(sn)))
    {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(BenchError::Run(format!(
                "thread {i}: sessions did not connect in 60 s"
            )));
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
    }
    phase.ready.fetch_add(1, Ordering::AcqRel);
    // Warm up until the main thread starts the interval.
    let mut counted_from = None;
    loop {
        for _ in 0..64 {
            for (r, c) in nodes.iter_mut() {
                issue(r, c, p);
                r.run_event_loop_once(c);
            }
        }
        if let Some(e) = nodes.iter_mut().find_map(|(_, c)| c.take_error()) {
            phase.ready.fetch_add(1 << 20, Ordering::AcqRel);
            return Err(BenchError::Run(format!("thread {i}: {e}")));
        }
        let done: u64 = nodes.iter().map(|(_, c)| c.completed()).sum();
        if counted_from.is_none() && phase.start.load(Ordering::Acquire) {
            counted_from = Some(done);
        }
        if phase.stop.load(Ordering::Acquire) {
            let from = counted_from.unwrap_or(done);
            // Let the requests in flight finish before the buffers go.
            let t = Instant::now();
            while nodes.iter().any(|(_, c)| c.in_flight() > 0)
                && t.elapsed() < Duration::from_secs(5)
            {
                for (r, c) in nodes.iter_mut() {
                    r.run_event_loop_once(c);
                }
            }
            for (r, c) in nodes.iter_mut() {
                c.free_buffers(r);
            }
            return Ok(done - from);
        }
    }
}

/// The two Nexuses of a run (SM over kernel UDP on loopback, the TSC
/// clock: the threads run in wall time).
fn nexuses<T: Transport + 'static>() -> Result<(Vec<Arc<Nexus>>, [String; 2]), BenchError> {
    let uris = [loopback_uri()?, loopback_uri()?];
    let mut v = Vec::new();
    for (k, uri) in uris.iter().enumerate() {
        v.push(
            register::<T>(Nexus::builder(uri))
                .workers(0)
                .build()
                .map_err(|e| BenchError::setup(format!("Nexus of node {k} on {uri}"), e))?,
        );
    }
    Ok((v, uris))
}

/// Measures `n` threads at point `p` for `secs` after `warmup`: RPCs per
/// second of each thread.
fn measure(
    on: ThreadsOn,
    n: usize,
    p: Point,
    secs: Duration,
    warmup: Duration,
    plan: &MemoryPlan,
) -> Result<Vec<f64>, BenchError> {
    let phase = Arc::new(Phase {
        ready: AtomicUsize::new(0),
        start: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let go = Arc::new(Barrier::new(n));
    let bytes = node_bytes(p.size, p.window);
    let region = plan.region;
    let handles: Vec<std::thread::JoinHandle<ThreadResult>> = match on {
        ThreadsOn::DeviceModel => {
            let fabric = Fabric::new(FabricConfig {
                seed: 1,
                deterministic: false,
                ..Default::default()
            });
            let mut devs: Vec<Device<SimBackend>> = Vec::new();
            let mut nics: Vec<SimNic> = Vec::new();
            for k in 0..2u8 {
                let nic = SimNic::new(
                    &fabric,
                    NicConfig {
                        mac: [2, 0, 0, 0, 0x40, k + 1],
                        ..Default::default()
                    },
                );
                devs.push(
                    Device::open(
                        nic.backend(),
                        DeviceConfig {
                            region,
                            ..Default::default()
                        },
                    )
                    .map_err(|e| {
                        BenchError::setup(format!("bringing up device-model NIC {k}"), e)
                    })?,
                );
                nics.push(nic);
            }
            let (nx, uris) = nexuses::<Mlx5Transport<SimBackend>>()?;
            (0..n)
                .map(|i| {
                    let (devs, nx, uris, phase, go) = (
                        devs.clone(),
                        nx.clone(),
                        uris.clone(),
                        phase.clone(),
                        go.clone(),
                    );
                    std::thread::spawn(move || {
                        let mk = |k: usize| -> Result<
                            (Rpc<Mlx5Transport<SimBackend>, Ctx>, Ctx),
                            BenchError,
                        > {
                            let cfg = Mlx5Config::new(
                                Ipv4Addr::new(10, 40, 0, k as u8 + 1),
                                QueueConfig {
                                    udp_port: 40_000 + (k * 1000 + i) as u16,
                                    ..Default::default()
                                },
                            );
                            let t = Mlx5Transport::new(&devs[k], cfg).map_err(|e| {
                                BenchError::setup(format!("thread {i}: queue set on NIC {k}"), e)
                            })?;
                            let a = Allocator::new(
                                devs[k].dma_mapper(),
                                AllocatorConfig {
                                    initial_bytes: bytes,
                                    region,
                                    ..Default::default()
                                },
                            )
                            .map_err(|e| {
                                BenchError::setup(format!("thread {i}: buffers on NIC {k}"), e)
                            })?;
                            let mut rpc =
                                Rpc::builder(&nx[k], t, a)
                                    .id(i as u8)
                                    .build()
                                    .map_err(|e| {
                                        BenchError::setup(format!("thread {i}: Rpc of node {k}"), e)
                                    })?;
                            let c = new_ctx(&mut rpc, p)?;
                            Ok((rpc, c))
                        };
                        let nodes = [mk(0)?, mk(1)?];
                        go.wait();
                        pair_loop(i, nodes, &uris, p, &phase)
                    })
                })
                .collect()
        }
        ThreadsOn::Udp => {
            let (nx, uris) = nexuses::<UdpTransport>()?;
            (0..n)
                .map(|i| {
                    let (nx, uris, phase, go) =
                        (nx.clone(), uris.clone(), phase.clone(), go.clone());
                    std::thread::spawn(move || {
                        let mk = |k: usize| -> Result<(Rpc<UdpTransport, Ctx>, Ctx), BenchError> {
                            let t = UdpTransport::new(&UdpConfig::loopback()).map_err(|e| {
                                BenchError::setup(
                                    format!("thread {i}: UDP transport of node {k}"),
                                    e,
                                )
                            })?;
                            let a = erpc_sim::sim_allocator(bytes, region).map_err(|e| {
                                BenchError::setup(format!("thread {i}: buffers of node {k}"), e)
                            })?;
                            let mut rpc =
                                Rpc::builder(&nx[k], t, a)
                                    .id(i as u8)
                                    .build()
                                    .map_err(|e| {
                                        BenchError::setup(format!("thread {i}: Rpc of node {k}"), e)
                                    })?;
                            let c = new_ctx(&mut rpc, p)?;
                            Ok((rpc, c))
                        };
                        let nodes = [mk(0)?, mk(1)?];
                        go.wait();
                        pair_loop(i, nodes, &uris, p, &phase)
                    })
                })
                .collect()
        }
    };
    // Every thread connected (or failed: it adds a large number).
    let t = Instant::now();
    while phase.ready.load(Ordering::Acquire) < n && handles.iter().all(|h| !h.is_finished()) {
        if t.elapsed() > Duration::from_secs(120) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(warmup);
    phase.start.store(true, Ordering::Release);
    let t0 = Instant::now();
    std::thread::sleep(secs);
    phase.stop.store(true, Ordering::Release);
    let elapsed = t0.elapsed().as_secs_f64();
    let mut rates = Vec::new();
    for h in handles {
        let done = h
            .join()
            .map_err(|_| BenchError::Run("a benchmark thread panicked".into()))??;
        rates.push(done as f64 / elapsed);
    }
    Ok(rates)
}

/// Runs every batch of `batches` at one thread and at `threads` threads,
/// in that order, each point (`window` in flight per Rpc, `size`-byte
/// messages) for `secs` after `warmup`.
pub fn run_threads(
    on: ThreadsOn,
    threads: usize,
    batches: &[usize],
    (window, size): (usize, usize),
    (secs, warmup): (Duration, Duration),
    plan: &MemoryPlan,
) -> Result<Vec<ThreadsRow>, BenchError> {
    let mut rows = Vec::new();
    for &batch in batches {
        let p = Point {
            batch,
            window,
            size,
            min_rpcs: 0,
        };
        let one: f64 = measure(on, 1, p, secs, warmup, plan)?.iter().sum();
        let rates = measure(on, threads, p, secs, warmup, plan)?;
        let total: f64 = rates.iter().sum();
        rows.push(ThreadsRow {
            batch,
            threads,
            per_thread_mrps: rates.iter().map(|r| r / 1e6).collect(),
            total_mrps: total / 1e6,
            one_thread_mrps: one / 1e6,
            efficiency: if one > 0.0 {
                total / (threads as f64 * one)
            } else {
                0.0
            },
        });
    }
    Ok(rows)
}

/// The table `erpc-bench --threads N` prints.
pub fn report(
    on: ThreadsOn,
    rows: &[ThreadsRow],
    window: usize,
    size: usize,
    secs: Duration,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let what = match on {
        ThreadsOn::DeviceModel => {
            "mlx5 transport on the device model (2 NICs, threaded; a queue set per Rpc)"
        }
        ThreadsOn::Udp => "kernel UDP on loopback (a socket per Rpc)",
    };
    let _ = writeln!(
        s,
        "erpc-bench: {size}-byte RPCs, {what}, thread i owns Rpc i of both nodes; window {window} per Rpc, {:.1} s per point",
        secs.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "efficiency: the total at N threads / (N x the one-thread total measured just before it)"
    );
    let _ = writeln!(
        s,
        "   B  threads  1-thread Mrps  total Mrps  efficiency  per thread Mrps"
    );
    for r in rows {
        let per: Vec<String> = r
            .per_thread_mrps
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect();
        let _ = writeln!(
            s,
            "{:>4}  {:>7}  {:>13.3}  {:>10.3}  {:>10.2}  {}",
            r.batch,
            r.threads,
            r.one_thread_mrps,
            r.total_mrps,
            r.efficiency,
            per.join(" ")
        );
    }
    s
}
