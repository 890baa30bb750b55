//! Shared test machinery: a transport-generic "world" (the simulated
//! network today; the mlx5 transport on the device model later), nodes,
//! the seed harness, and data patterns.
#![allow(dead_code)]

pub mod app;
pub mod devmodel;
pub mod scenarios;
pub mod threads;

use std::sync::Arc;

use erpc::{Nexus, NexusBuilder, Rpc, RpcConfig, SessionHandler};
use erpc_sim::{PortConfig, QueueStats, SimConfig, SimNet, SimTransport};
use transport::Transport;

/// Where scenarios run. A new transport plugs in by implementing this
/// (constructor of a transport, a Nexus builder wired to its SM link and
/// clock, and a way to move time).
pub trait World {
    /// The transport under test.
    type T: Transport + 'static;
    /// A fresh transport endpoint.
    fn transport(&mut self) -> Self::T;
    /// A Nexus builder for URI `uri` wired to this world's clock and SM.
    fn nexus(&mut self, uri: &str) -> NexusBuilder;
    /// Moves time one step and delivers what is due.
    fn step(&mut self);
    /// Current time.
    fn now_ns(&self) -> u64;
    /// A hugepage allocator for one Rpc.
    fn allocator(&mut self, initial_bytes: usize) -> mempool::Allocator {
        erpc_sim::test_allocator(initial_bytes)
    }
    /// True if the links neither lose, duplicate nor reorder: scenarios
    /// then also check that nothing was dropped or retransmitted.
    fn lossless(&self) -> bool {
        true
    }
    /// The switch's output queue towards the port of the `i`-th transport
    /// made (occupancy now, high-water marks, drops).
    fn queue(&self, i: usize) -> QueueStats;
    /// Records that queue at every arrival (up to `capacity` samples).
    fn trace_queue(&mut self, i: usize, capacity: usize);
    /// The recorded samples of that queue.
    fn queue_trace(&self, i: usize) -> Vec<erpc_sim::QueueSample>;
}

/// The faults of a lossy world: 1% of frames lost, 1% duplicated, 1%
/// reordered, with delay jitter. Loss recovery must repair everything.
pub const LOSSY: erpc_sim::LinkFaults = erpc_sim::LinkFaults {
    loss: 0.01,
    duplicate: 0.01,
    reorder: 0.01,
    ..erpc_sim::delayed_link(1_000, 1_000)
};

/// Longest step of virtual time when the network is idle.
pub const IDLE_STEP_NS: u64 = 50_000;

/// The deterministic simulated network.
pub struct SimWorld {
    pub net: SimNet,
    pub seed: u64,
    pub step_ns: u64,
    /// Longest step when the network has nothing due sooner (the Rpcs'
    /// own timers, such as the timing wheel's departures, are invisible
    /// to the world: a scenario whose senders pace every packet sets it
    /// to `step_ns`).
    pub idle_step_ns: u64,
    nexuses: u64,
}

impl SimWorld {
    pub fn new(seed: u64) -> SimWorld {
        SimWorld::with_config(SimConfig {
            seed,
            ..SimConfig::default()
        })
    }

    /// A world whose links have the [`LOSSY`] faults.
    pub fn lossy(seed: u64) -> SimWorld {
        SimWorld::with_config(SimConfig {
            seed,
            link: LOSSY,
            ..SimConfig::default()
        })
    }

    /// A lossless world whose links run at `port.rate_bps` into switch
    /// buffers of `port.buffer_bytes`.
    pub fn with_port(seed: u64, port: PortConfig) -> SimWorld {
        SimWorld::with_config(SimConfig {
            seed,
            port,
            ..SimConfig::default()
        })
    }

    /// A world on a network with settings `cfg`. `ERPC_DEFERRED_DMA=1`
    /// turns on the deferred-DMA mode (`SimConfig::deferred_dma`, default
    /// settings) in every world that does not set it, so that any test
    /// file can be run in it.
    pub fn with_config(mut cfg: SimConfig) -> SimWorld {
        if cfg.deferred_dma.is_none() && deferred_dma_from_env() {
            cfg.deferred_dma = Some(erpc_sim::DeferredDma::default());
        }
        SimWorld {
            net: SimNet::new(cfg),
            seed: cfg.seed,
            step_ns: 500,
            idle_step_ns: IDLE_STEP_NS,
            nexuses: 0,
        }
    }
}

/// Whether `ERPC_DEFERRED_DMA` asks for the deferred-DMA mode.
pub fn deferred_dma_from_env() -> bool {
    std::env::var("ERPC_DEFERRED_DMA").is_ok_and(|v| v != "0" && !v.is_empty())
}

impl World for SimWorld {
    type T = SimTransport;

    fn transport(&mut self) -> SimTransport {
        self.net.add_transport()
    }

    /// The network's allocator: registered with its IOMMU and poisoned on
    /// free in the deferred-DMA mode.
    fn allocator(&mut self, initial_bytes: usize) -> mempool::Allocator {
        self.net.allocator(initial_bytes)
    }

    fn nexus(&mut self, uri: &str) -> NexusBuilder {
        self.nexuses += 1;
        Nexus::builder(uri)
            .sm_link(self.net.sm_link())
            .clock(self.net.erpc_clock())
            .seed(
                self.seed
                    .wrapping_mul(0x9e37_79b9)
                    .wrapping_add(self.nexuses),
            )
    }

    /// At least `step_ns`; when nothing is due that soon, up to the next
    /// delivery, at most [`IDLE_STEP_NS`] (timers are checked on every
    /// poll, so a retransmission timeout waits no more than that extra).
    fn step(&mut self) {
        let now = self.net.now_ns();
        let d = match self.net.next_event_ns() {
            Some(t) if t > now => {
                (t - now).clamp(self.step_ns, self.step_ns.max(self.idle_step_ns))
            }
            Some(_) => self.step_ns,
            None => self.step_ns.max(self.idle_step_ns),
        };
        self.net.advance(d);
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn lossless(&self) -> bool {
        let l = self.net.default_link();
        l.loss == 0.0 && l.duplicate == 0.0 && l.reorder == 0.0 && l.fcs_error == 0.0
    }

    fn queue(&self, i: usize) -> QueueStats {
        self.net.queue(i)
    }

    fn trace_queue(&mut self, i: usize, capacity: usize) {
        self.net.set_queue_trace(i, capacity);
    }

    fn queue_trace(&self, i: usize) -> Vec<erpc_sim::QueueSample> {
        self.net.queue_trace(i)
    }
}

/// An Rpc with its application context.
pub struct Node<T: Transport, C> {
    pub rpc: Rpc<T, C>,
    pub ctx: C,
}

impl<T: Transport + 'static, C: 'static> Node<T, C> {
    pub fn new<W: World<T = T>>(
        w: &mut W,
        nexus: &Arc<Nexus>,
        rpc_id: u8,
        ctx: C,
        cfg: RpcConfig,
        sm: Option<SessionHandler<T, C>>,
    ) -> Node<T, C> {
        let t = w.transport();
        let a = w.allocator(8 << 20);
        let b = Rpc::builder(nexus, t, a).id(rpc_id).config(cfg);
        let rpc = match sm {
            Some(h) => b.session_handler(h),
            None => b,
        }
        .build()
        .expect("Rpc::builder");
        Node { rpc, ctx }
    }

    pub fn poll(&mut self) {
        self.rpc.run_event_loop_once(&mut self.ctx);
    }
}

/// Polls every node and steps the world until `done` holds; panics after
/// `max_steps`.
pub fn run_until<W: World, C: 'static>(
    w: &mut W,
    nodes: &mut [Node<W::T, C>],
    max_steps: u64,
    what: &str,
    mut done: impl FnMut(&[Node<W::T, C>]) -> bool,
) -> u64 {
    for step in 0..max_steps {
        if done(nodes) {
            return step;
        }
        for n in nodes.iter_mut() {
            n.poll();
        }
        w.step();
    }
    panic!(
        "{what}: not done after {max_steps} steps (t = {} ns)",
        w.now_ns()
    );
}

/// The seed of a scenario: `ERPC_SEED` if set, else `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("ERPC_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// [`erpc_sim::with_seeds`] for this crate's tests.
pub fn with_seeds(test: &str, file: &str, defaults: &[u64], f: impl Fn(u64)) {
    erpc_sim::with_seeds("erpc", file, test, defaults, f)
}

/// Deterministic test bytes: byte `i` of a message with key `key`.
#[inline]
pub fn pattern_byte(key: u64, i: usize) -> u8 {
    let x = key
        .wrapping_add(i as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i as u8)
}

pub fn fill_pattern(buf: &mut [u8], key: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(key, i);
    }
}

pub fn check_pattern(buf: &[u8], key: u64) -> bool {
    buf.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(key, i))
}
