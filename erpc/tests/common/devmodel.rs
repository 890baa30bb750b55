//! The device-model world: every Rpc gets its own software ConnectX on one
//! deterministic fabric, the driver brings it up, and the Rpc's transport
//! is the mlx5 raw-Ethernet transport on a queue set of that NIC. Session
//! management stays on the in-memory hub; eRPC's virtual clock and the
//! fabric's clock move together.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::time::Duration;

use erpc::{Nexus, NexusBuilder};
use erpc_sim::{SimConfig, SimNet};
use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};

use super::World;

/// Device memory and message buffers: hugepages when reserved (always in
/// CI), otherwise an explicit opt-in to 4 KiB pages.
pub fn region() -> RegionOptions {
    let fallback = if mempool::hugepages_available(64) {
        Fallback::Never
    } else if std::env::var_os("ERPC_CI").is_some() {
        panic!("ERPC_CI is set and fewer than 64 free 2 MiB hugepages remain");
    } else {
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..Default::default()
    }
}

pub struct DevWorld {
    /// SM hub and eRPC's virtual clock (no data transports on it).
    pub net: SimNet,
    pub fabric: Fabric,
    pub nics: Vec<SimNic>,
    last: Option<Device<SimBackend>>,
    pub seed: u64,
    pub step_ns: u64,
    /// Longest step when nothing moves (see `step`); the Rpcs' own timers
    /// (the timing wheel's departures) are invisible to the world, so a
    /// scenario whose senders pace every packet sets it to `step_ns`.
    pub idle_step_ns: u64,
    nexuses: u64,
    /// Faults of every NIC's link (lossless when `None`).
    faults: Option<mlx5_sim::LinkFaults>,
    /// RX ring entries of every transport made from now on (`None`: the
    /// driver's default, 4 096).
    pub ring_entries: Option<usize>,
    /// Frames the NICs had sent at the last step.
    last_sent: u64,
    /// The fabric moved frames at the last step.
    busy: bool,
}

impl DevWorld {
    /// A world whose NICs' links lose, duplicate and reorder what they
    /// send as [`super::LOSSY`] says: the same faults, in the same place
    /// (device → switch), as on the simulated network.
    pub fn lossy(seed: u64) -> DevWorld {
        DevWorld {
            faults: Some(super::LOSSY),
            ..DevWorld::new(seed)
        }
    }

    /// A lossless world whose NICs' links run at `port.rate_bps` into
    /// switch buffers of `port.buffer_bytes`.
    pub fn with_port(seed: u64, port: mlx5_sim::PortConfig) -> DevWorld {
        let w = DevWorld::new(seed);
        DevWorld {
            fabric: Fabric::new(FabricConfig {
                port,
                ..w.fabric.config().clone()
            }),
            ..w
        }
    }

    pub fn new(seed: u64) -> DevWorld {
        DevWorld {
            net: SimNet::new(SimConfig {
                seed,
                ..SimConfig::default()
            }),
            fabric: Fabric::new(FabricConfig {
                seed,
                deterministic: true,
                ..Default::default()
            }),
            nics: Vec::new(),
            last: None,
            seed,
            step_ns: 500,
            idle_step_ns: super::IDLE_STEP_NS,
            nexuses: 0,
            faults: None,
            ring_entries: None,
            last_sent: 0,
            busy: true,
        }
    }
}

impl World for DevWorld {
    type T = Mlx5Transport<SimBackend>;

    fn transport(&mut self) -> Self::T {
        let i = self.nics.len() as u8 + 1;
        let nic = SimNic::new(
            &self.fabric,
            NicConfig {
                mac: [0x02, 0, 0, 0, 0x10, i],
                // ERPC_DEFERRED_DMA=1: the NIC gathers sends later than
                // their doorbell (and buffers are poisoned when freed).
                deferred_tx: super::deferred_dma_from_env().then(|| mlx5_sim::DeferredTx {
                    seed: self.seed ^ u64::from(i),
                    ..mlx5_sim::DeferredTx::default()
                }),
                ..Default::default()
            },
        );
        let dev = Device::open(
            nic.backend(),
            DeviceConfig {
                region: region(),
                ..Default::default()
            },
        )
        .expect("driver bring-up on the device model");
        if let Some(f) = self.faults {
            self.fabric
                .set_link_faults_dir(nic.port(), mlx5_sim::Direction::ToSwitch, f);
        }
        let mut cfg = Mlx5Config::new(
            Ipv4Addr::new(10, 20, 0, i),
            QueueConfig {
                udp_port: 31850 + u16::from(i),
                ..Default::default()
            },
        );
        if let Some(n) = self.ring_entries {
            cfg = cfg.with_rx_ring_entries(n);
        }
        let t = Mlx5Transport::new(&dev, cfg).expect("mlx5 transport");
        self.nics.push(nic);
        self.last = Some(dev);
        t
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

    /// `step_ns` while frames move; when no NIC sent anything since the
    /// last step and the fabric delivered nothing, up to `idle_step_ns`
    /// (or the next SM delivery), so that waiting
    /// for a retransmission timeout costs few steps.
    fn step(&mut self) {
        let sent: u64 = self.nics.iter().map(|n| n.stats().tx_frames).sum();
        let idle = sent == self.last_sent && !self.busy;
        self.last_sent = sent;
        let mut d = self.step_ns;
        if idle {
            // Up to the next SM delivery or the next hop the fabric holds
            // (frames waiting in a queue or on a slow link).
            let now = self.net.now_ns();
            let next = match (self.net.next_event_ns(), self.fabric.next_event_ns()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            d = match next {
                Some(t) if t > now => {
                    (t - now).clamp(self.step_ns, self.step_ns.max(self.idle_step_ns))
                }
                Some(_) => self.step_ns,
                None => self.step_ns.max(self.idle_step_ns),
            };
        }
        self.net.advance(d);
        for nic in &self.nics {
            // Deferred gather: held sends whose delay passed leave now.
            nic.release_deferred_tx();
        }
        self.busy = self.fabric.advance(Duration::from_nanos(d)) > 0;
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn lossless(&self) -> bool {
        self.faults.is_none()
    }

    fn queue(&self, i: usize) -> erpc_sim::QueueStats {
        self.fabric
            .queue(self.nics[i].port())
            .expect("a NIC's port")
    }

    fn trace_queue(&mut self, i: usize, capacity: usize) {
        self.fabric.set_queue_trace(self.nics[i].port(), capacity);
    }

    fn queue_trace(&self, i: usize) -> Vec<erpc_sim::QueueSample> {
        self.fabric.queue_trace(self.nics[i].port())
    }

    /// Message buffers registered with the NIC of the transport made last
    /// (so their IOVAs and lkey are valid for it).
    fn allocator(&mut self, initial_bytes: usize) -> Allocator {
        let dev = self.last.as_ref().expect("transport() before allocator()");
        Allocator::new(
            dev.dma_mapper(),
            AllocatorConfig {
                initial_bytes,
                region: region(),
                poison_on_free: super::deferred_dma_from_env().then_some(0xa5),
                ..Default::default()
            },
        )
        .expect("allocator")
    }
}
