//! One Rpc per thread for the applications' benchmarks (`herd-kv`,
//! `sequencer`): a server node and a client node, thread i owning Rpc i of
//! both (as `erpc-bench --threads N` does). On the device model each Rpc
//! has its own queue set on its node's NIC (threaded, wall clock); on
//! kernel UDP its own socket on loopback. Session management runs over
//! kernel UDP on 127.0.0.1 in both.
//!
//! A round: the caller builds the two Nexuses and hands [`run_round`] one
//! input per thread; each thread makes its transports with [`Endpoints`],
//! connects and warms up, and [`Phase`] has the calling thread start and
//! stop the count for all of them at once.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::herd::Handlers;

use mempool::{Allocator, RegionOptions};
use mlx5::{Device, DeviceConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::Transport;
use transport::mlx5::Mlx5Transport;
use transport::udp::{UdpConfig, UdpTransport};

/// Errors of a benchmark run.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The transports the benchmarks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// Two device-model NICs (mlx5 driver and transport), threaded.
    Dev,
    /// Kernel UDP on loopback.
    Udp,
}

impl std::str::FromStr for Net {
    type Err = String;
    fn from_str(s: &str) -> Result<Net, String> {
        match s {
            "dev" => Ok(Net::Dev),
            "udp" => Ok(Net::Udp),
            _ => Err(format!("{s:?}: dev (the device model) or udp (kernel UDP)")),
        }
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Net::Dev => "device model (2 NICs, threaded; a queue set per Rpc)",
            Net::Udp => "kernel UDP on loopback (a socket per Rpc)",
        })
    }
}

/// Makes a thread's transport and buffer allocator on a node.
pub trait Endpoints: Clone + Send + 'static {
    /// The transport.
    type T: Transport + 'static;
    /// Node `node` (0: server, 1: client), thread `thread`, round `round`
    /// (so that no two queue sets of a run share a UDP port).
    fn make(&self, node: usize, thread: usize, round: usize) -> Res<(Self::T, Allocator)>;
}

/// Message-buffer memory per Rpc.
pub const RPC_BYTES: usize = 8 << 20;

/// The device model: two NICs on one threaded fabric. Keep it alive for
/// as long as its [`DevEndpoints`] are used.
pub struct DevNet {
    _fabric: Fabric,
    _nics: Vec<SimNic>,
    devs: Vec<Device<SimBackend>>,
    region: RegionOptions,
}

impl std::fmt::Debug for DevNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevNet({} NICs)", self.devs.len())
    }
}

impl DevNet {
    /// Brings up two device-model NICs.
    pub fn new(region: RegionOptions) -> Res<DevNet> {
        let fabric = Fabric::new(FabricConfig {
            seed: 1,
            deterministic: false,
            ..Default::default()
        });
        let mut nics = Vec::new();
        let mut devs = Vec::new();
        for k in 0..2u8 {
            let nic = SimNic::new(
                &fabric,
                NicConfig {
                    mac: [2, 0, 0, 0, 0x35, k + 1],
                    ..Default::default()
                },
            );
            devs.push(Device::open(
                nic.backend(),
                DeviceConfig {
                    region,
                    ..Default::default()
                },
            )?);
            nics.push(nic);
        }
        Ok(DevNet {
            _fabric: fabric,
            _nics: nics,
            devs,
            region,
        })
    }

    /// What the threads make their queue sets with.
    pub fn endpoints(&self) -> DevEndpoints {
        DevEndpoints {
            devs: self.devs.clone(),
            region: self.region,
        }
    }
}

/// Queue sets on the device model's NICs.
#[derive(Clone)]
pub struct DevEndpoints {
    devs: Vec<Device<SimBackend>>,
    region: RegionOptions,
}

impl std::fmt::Debug for DevEndpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevEndpoints({} NICs)", self.devs.len())
    }
}

impl Endpoints for DevEndpoints {
    type T = Mlx5Transport<SimBackend>;
    fn make(&self, node: usize, thread: usize, round: usize) -> Res<(Self::T, Allocator)> {
        let port = 34_000 + ((round % 64) * 256 + node * 128 + thread) as u16;
        let ip = Ipv4Addr::new(10, 35, 0, node as u8 + 1);
        crate::env::queue_set_on(&self.devs[node], ip, port, self.region, RPC_BYTES)
    }
}

/// Kernel UDP sockets on loopback.
#[derive(Debug, Clone, Copy)]
pub struct UdpEndpoints {
    /// Buffer memory.
    pub region: RegionOptions,
}

impl Endpoints for UdpEndpoints {
    type T = UdpTransport;
    fn make(&self, _node: usize, _thread: usize, _round: usize) -> Res<(Self::T, Allocator)> {
        let t = UdpTransport::new(&UdpConfig::loopback())?;
        let a = erpc_sim::sim_allocator(RPC_BYTES, self.region)?;
        Ok((t, a))
    }
}

/// The measured interval of a round, shared by its threads.
#[derive(Debug, Default)]
pub struct Phase {
    created: AtomicUsize,
    ready: AtomicUsize,
    failed: AtomicBool,
    finished: AtomicUsize,
    start: AtomicBool,
    stop: AtomicBool,
}

impl Phase {
    /// A new interval.
    pub fn new() -> Arc<Phase> {
        Arc::new(Phase::default())
    }

    /// A thread has made its Rpcs: waits until all `n` have (a session to
    /// an Rpc not made yet would be refused), or one failed (`false`).
    pub fn created(&self, n: usize) -> bool {
        self.created.fetch_add(1, Ordering::AcqRel);
        while self.created.load(Ordering::Acquire) < n {
            if self.failed.load(Ordering::Acquire) || self.stopped() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// A thread is connected and warming up.
    pub fn ready(&self) {
        self.ready.fetch_add(1, Ordering::AcqRel);
    }

    /// A thread gave up before it was ready (its error comes back with it).
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// A thread is done with the work after the count (a read-back, a
    /// drain), or gave up: the others may stop serving once all are.
    pub fn finish(&self) {
        self.finished.fetch_add(1, Ordering::AcqRel);
    }

    /// Every one of the round's `n` threads has called [`Phase::finish`].
    pub fn all_finished(&self, n: usize) -> bool {
        self.finished.load(Ordering::Acquire) == n
    }

    /// Counting has started.
    pub fn started(&self) -> bool {
        self.start.load(Ordering::Acquire)
    }

    /// Counting has stopped.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The main thread: waits until `n` threads are ready (or one failed),
    /// warms up for `warmup`, counts for `secs`; returns the seconds
    /// counted.
    pub fn time(&self, n: usize, warmup: Duration, secs: Duration) -> Res<f64> {
        let t = Instant::now();
        while self.ready.load(Ordering::Acquire) < n {
            if self.failed.load(Ordering::Acquire) {
                self.stop.store(true, Ordering::Release);
                return Err("a thread failed to set up".into());
            }
            if t.elapsed() > Duration::from_secs(120) {
                self.stop.store(true, Ordering::Release);
                return Err("threads not connected after 120 s".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(warmup);
        self.start.store(true, Ordering::Release);
        let t0 = Instant::now();
        std::thread::sleep(secs);
        self.stop.store(true, Ordering::Release);
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// One round: a thread per item of `inputs`, thread i running
/// `body(i, inputs[i], phase)`, while the calling thread times the phase
/// ([`Phase::time`]: `warmup`, then `secs` counted). A thread that fails or
/// panics counts as finished and fails the phase, so the others neither
/// wait for it to be ready nor for its work after the count. Returns the
/// threads' results in order and the seconds counted, or a thread's error
/// (the last one joined), before the timing's own.
pub fn run_round<S, T, F>(
    inputs: Vec<S>,
    warmup: Duration,
    secs: Duration,
    body: F,
) -> Res<(Vec<T>, f64)>
where
    S: Send,
    T: Send,
    F: Fn(usize, S, &Phase) -> Res<T> + Sync,
{
    let n = inputs.len();
    let phase = Phase::default();
    let (phase, body) = (&phase, &body);
    std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                scope.spawn(move || {
                    // A panic releases the others too (they would wait
                    // for it to finish), then goes on as the panic it is.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        body(i, input, phase)
                    }));
                    if !matches!(r, Ok(Ok(_))) {
                        phase.finish();
                        phase.fail();
                    }
                    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
                })
            })
            .collect();
        let timed = phase.time(n, warmup, secs);
        let mut outs = Vec::with_capacity(n);
        let mut err = None;
        let mut panicked = false;
        for h in handles {
            match h.join() {
                Ok(Ok(t)) => outs.push(t),
                Ok(Err(e)) => err = Some(e),
                Err(_) => panicked = true,
            }
        }
        if panicked {
            return Err("a thread panicked".into());
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok((outs, timed?))
    })
}

/// Two URIs on 127.0.0.1 for a round's Nexuses (server, client).
pub fn uris() -> [String; 2] {
    [
        format!("127.0.0.1:{}", crate::env::free_udp_port()),
        format!("127.0.0.1:{}", crate::env::free_udp_port()),
    ]
}

/// The flags every per-thread benchmark takes (`herd-kv`, `sequencer`),
/// flattened into each binary's own: where it runs, on how many threads,
/// how long, with which handlers.
#[derive(clap::Args, Debug)]
pub struct RoundArgs {
    /// dev (the device model) or udp (kernel UDP on loopback).
    #[arg(long, default_value = "dev")]
    pub transport: String,
    /// Threads (server and client Rpc each), 1 to 16.
    #[arg(long, default_value_t = 1)]
    pub threads: u64,
    /// Requests in flight per client Rpc, 1 to 1024.
    #[arg(long, default_value_t = 64)]
    pub window: u64,
    /// Seconds measured per point, 0.1 to 600.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// Seconds of warm-up per point, 0 to 60.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// per-request, burst or both.
    #[arg(long, default_value = "both")]
    pub handlers: String,
}

impl RoundArgs {
    /// Checks the flags (each refusal names the flag and its limit) and
    /// returns the transport and the handler kinds to measure.
    pub fn check(&self) -> Result<(Net, Vec<Handlers>), String> {
        let net: Net = self
            .transport
            .parse()
            .map_err(|e| format!("--transport {e}"))?;
        in_range("--threads", self.threads, 1, 16)?;
        in_range("--window", self.window, 1, 1024)?;
        secs_in_range("--secs", self.secs, 0.1, 600.0)?;
        secs_in_range("--warmup", self.warmup, 0.0, 60.0)?;
        let handlers = match self.handlers.as_str() {
            "per-request" => vec![Handlers::PerRequest],
            "burst" => vec![Handlers::Burst],
            "both" => vec![Handlers::PerRequest, Handlers::Burst],
            h => return Err(format!("--handlers {h:?}: per-request, burst or both")),
        };
        Ok((net, handlers))
    }
}

/// Checks a count flag: `1..=max`, or a message naming the limit.
pub fn in_range(flag: &str, v: u64, min: u64, max: u64) -> Result<(), String> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(format!("{flag} {v}: must be {min} to {max}"))
    }
}

/// Checks a seconds flag: finite and in `min..=max`.
pub fn secs_in_range(flag: &str, v: f64, min: f64, max: f64) -> Result<(), String> {
    if v.is_finite() && v >= min && v <= max {
        Ok(())
    } else {
        Err(format!("{flag} {v}: must be a number from {min} to {max}"))
    }
}
