//! Where the applications run: a [`World`] makes the endpoints (a
//! transport and a message-buffer allocator per process), Nexus builders
//! wired to its session management and clock, moves time, and injects
//! faults (a process crash, a partition).
//!
//! * [`SimWorld`]: eRPC's deterministic simulated network (one thread,
//!   virtual time, seeded faults).
//! * [`DevWorld`]: the device model — a software ConnectX per process,
//!   brought up by the mlx5 driver, on one fabric; deterministic (virtual
//!   time, SM on the in-memory hub) or threaded (wall clock, SM over
//!   kernel UDP on 127.0.0.1).
//!
//! Over kernel UDP across processes there is no world: each process builds
//! its own Nexus and `UdpTransport` (see the `raft-kv` binary).

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use erpc::{Nexus, NexusBuilder, Uri};
use erpc_sim::{LinkFaults, SimConfig, SimNet, SimTransport};
use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::Transport;
use transport::mlx5::{Mlx5Config, Mlx5Transport};

/// Message-buffer memory reserved up front per process.
pub const PROCESS_BYTES: usize = 8 << 20;

/// Memory for DMA and message buffers: 2 MiB hugepages when `pages` are
/// free; otherwise 4 KiB pages with a note on stderr (numbers are then not
/// representative), except in CI (`ERPC_CI` set), where a shortage is an
/// error.
pub fn region(pages: u64) -> RegionOptions {
    let fallback = if mempool::hugepages_available(pages) {
        Fallback::Never
    } else if std::env::var_os("ERPC_CI").is_some() {
        panic!("ERPC_CI is set and fewer than {pages} free 2 MiB hugepages remain");
    } else {
        static NOTE: std::sync::Once = std::sync::Once::new();
        NOTE.call_once(|| {
            let info = mempool::meminfo::HugepageInfo::read().unwrap_or_default();
            eprintln!(
                "note: fewer than {pages} free 2 MiB hugepages ({} free); using 4 KiB pages \
                 (reserve them with `{}`)",
                info.available(),
                mempool::meminfo::reserve_command(&info, pages)
            );
        });
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..Default::default()
    }
}

/// A place to run processes.
pub trait World {
    /// The transport.
    type T: Transport + 'static;
    /// A new process endpoint: its transport, its allocator, and its
    /// endpoint number (for [`World::crash`] and [`World::isolate`]).
    fn endpoint(&mut self) -> (Self::T, Allocator, usize);
    /// A Nexus builder for `uri` on this world's session management and
    /// clock.
    fn nexus(&mut self, uri: &str) -> NexusBuilder;
    /// Moves time (virtual worlds) and delivers what is due.
    fn step(&mut self);
    /// Now, on the world's clock.
    fn now_ns(&self) -> u64;
    /// The process at endpoint `ep` (Nexus `uri`) crashes: from now on it
    /// sends and receives nothing. Drop its objects afterwards.
    fn crash(&mut self, ep: usize, uri: &str);
    /// Cuts endpoint `ep` and its Nexus off from every other process
    /// (`cut`), or joins it again.
    fn isolate(&mut self, ep: usize, uri: &str, cut: bool);
    /// A URI for process `name` in this world.
    fn uri(&mut self, name: &str) -> String;
}

/// eRPC's deterministic simulated network.
#[derive(Debug)]
pub struct SimWorld {
    /// The network (links, SM hub, clock).
    pub net: SimNet,
    /// Virtual time per step.
    pub step_ns: u64,
    endpoints: usize,
    seed: u64,
    nexuses: u64,
    link: LinkFaults,
}

impl SimWorld {
    /// A network from `seed` whose links behave as `link`.
    pub fn new(seed: u64, link: LinkFaults) -> SimWorld {
        SimWorld {
            net: SimNet::new(SimConfig {
                seed,
                link,
                ..SimConfig::default()
            }),
            step_ns: 1_000,
            endpoints: 0,
            seed,
            nexuses: 0,
            link,
        }
    }
}

impl World for SimWorld {
    type T = SimTransport;

    fn endpoint(&mut self) -> (SimTransport, Allocator, usize) {
        let t = self.net.add_transport();
        self.endpoints += 1;
        (
            t,
            erpc_sim::test_allocator(PROCESS_BYTES),
            self.endpoints - 1,
        )
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

    fn step(&mut self) {
        self.net.advance(self.step_ns);
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn crash(&mut self, ep: usize, uri: &str) {
        self.net.crash(ep);
        self.net
            .sm_hub()
            .set_cut_off(&Uri::parse(uri).expect("a valid URI"), true);
    }

    fn isolate(&mut self, ep: usize, uri: &str, cut: bool) {
        let l = if cut {
            LinkFaults {
                loss: 1.0,
                ..self.link
            }
        } else {
            self.link
        };
        // What it sends (the endpoint's own link) and what it receives
        // (the switch's side, clean and without delay when not cut).
        self.net.set_link(ep, l);
        let inbound = if cut { l } else { erpc_sim::delayed_link(0, 0) };
        self.net.set_link_to(ep, inbound);
        self.net
            .sm_hub()
            .set_cut_off(&Uri::parse(uri).expect("a valid URI"), cut);
    }

    fn uri(&mut self, name: &str) -> String {
        format!("{name}:31850")
    }
}

/// The device model: a software ConnectX per process on one fabric.
pub struct DevWorld {
    /// The fabric.
    pub fabric: Fabric,
    /// Deterministic mode: SM hub and eRPC's virtual clock (no data
    /// transports on it). `None` in threaded mode.
    pub net: Option<SimNet>,
    nics: Vec<SimNic>,
    devices: Vec<Device<SimBackend>>,
    region: RegionOptions,
    seed: u64,
    nexuses: u64,
    /// Virtual time per step (deterministic mode).
    pub step_ns: u64,
}

impl std::fmt::Debug for DevWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DevWorld({} NICs, {})",
            self.nics.len(),
            if self.net.is_some() {
                "virtual time"
            } else {
                "wall clock"
            }
        )
    }
}

impl DevWorld {
    /// Deterministic: virtual time, one thread, SM on the in-memory hub.
    pub fn deterministic(seed: u64, region: RegionOptions) -> DevWorld {
        DevWorld {
            fabric: Fabric::new(FabricConfig {
                seed,
                deterministic: true,
                ..Default::default()
            }),
            net: Some(SimNet::new(SimConfig {
                seed,
                ..SimConfig::default()
            })),
            nics: Vec::new(),
            devices: Vec::new(),
            region,
            seed,
            nexuses: 0,
            step_ns: 1_000,
        }
    }

    /// Threaded: wall clock (TSC), frames delivered inside the sender's
    /// doorbell, SM over kernel UDP on 127.0.0.1.
    pub fn threaded(seed: u64, region: RegionOptions) -> DevWorld {
        DevWorld {
            fabric: Fabric::new(FabricConfig {
                seed,
                deterministic: false,
                ..Default::default()
            }),
            net: None,
            nics: Vec::new(),
            devices: Vec::new(),
            region,
            seed,
            nexuses: 0,
            step_ns: 0,
        }
    }

    /// The NIC of endpoint `ep`.
    pub fn nic(&self, ep: usize) -> &SimNic {
        &self.nics[ep]
    }

    /// The brought-up device of endpoint `ep` (to make more queue sets on
    /// it, e.g. one per thread).
    pub fn device(&self, ep: usize) -> &Device<SimBackend> {
        &self.devices[ep]
    }

    /// A transport on a new queue set of endpoint `ep`'s NIC, with UDP
    /// port `port` and an allocator registered with that NIC.
    pub fn queue_set(
        &self,
        ep: usize,
        port: u16,
    ) -> Result<(Mlx5Transport<SimBackend>, Allocator), Box<dyn std::error::Error>> {
        let ip = Ipv4Addr::new(10, 40, 0, ep as u8 + 1);
        queue_set_on(&self.devices[ep], ip, port, self.region, PROCESS_BYTES)
            .map_err(|e| e as Box<dyn std::error::Error>)
    }
}

/// A transport on a new queue set of `dev` (address `ip`, UDP port
/// `port`) and an allocator of `bytes` registered with that NIC.
pub fn queue_set_on(
    dev: &Device<SimBackend>,
    ip: Ipv4Addr,
    port: u16,
    region: RegionOptions,
    bytes: usize,
) -> Result<(Mlx5Transport<SimBackend>, Allocator), Box<dyn std::error::Error + Send + Sync>> {
    let t = Mlx5Transport::new(
        dev,
        Mlx5Config::new(
            ip,
            QueueConfig {
                udp_port: port,
                ..Default::default()
            },
        ),
    )?;
    let a = Allocator::new(
        dev.dma_mapper(),
        AllocatorConfig {
            initial_bytes: bytes,
            region,
            ..Default::default()
        },
    )?;
    Ok((t, a))
}

impl World for DevWorld {
    type T = Mlx5Transport<SimBackend>;

    fn endpoint(&mut self) -> (Self::T, Allocator, usize) {
        let ep = self.nics.len();
        assert!(ep < 200, "too many device-model NICs");
        let nic = SimNic::new(
            &self.fabric,
            NicConfig {
                mac: [0x02, 0, 0, 0x40, 0, ep as u8 + 1],
                ..Default::default()
            },
        );
        let dev = Device::open(
            nic.backend(),
            DeviceConfig {
                region: self.region,
                ..Default::default()
            },
        )
        .expect("driver bring-up on the device model");
        self.nics.push(nic);
        self.devices.push(dev);
        let (t, a) = self
            .queue_set(ep, 31_900 + ep as u16)
            .expect("a queue set on a fresh device-model NIC");
        (t, a, ep)
    }

    fn nexus(&mut self, uri: &str) -> NexusBuilder {
        self.nexuses += 1;
        let b = Nexus::builder(uri);
        match &self.net {
            Some(net) => b.sm_link(net.sm_link()).clock(net.erpc_clock()).seed(
                self.seed
                    .wrapping_mul(0x9e37_79b9)
                    .wrapping_add(self.nexuses),
            ),
            None => b,
        }
    }

    fn step(&mut self) {
        if let Some(net) = &self.net {
            net.advance(self.step_ns);
            self.fabric.advance(Duration::from_nanos(self.step_ns));
        }
    }

    fn now_ns(&self) -> u64 {
        match &self.net {
            Some(net) => net.now_ns(),
            None => self.fabric.now_ns(),
        }
    }

    fn crash(&mut self, ep: usize, uri: &str) {
        self.isolate(ep, uri, true);
    }

    fn isolate(&mut self, ep: usize, uri: &str, cut: bool) {
        let port = self.nics[ep].port();
        self.fabric.set_link_faults(
            port,
            LinkFaults {
                down: cut,
                ..Default::default()
            },
        );
        if let Some(net) = &self.net {
            net.sm_hub()
                .set_cut_off(&Uri::parse(uri).expect("a valid URI"), cut);
        }
        // Threaded mode: SM is kernel UDP; the process's Nexus is dropped
        // with it on a crash (a cut without a crash is not modelled there).
    }

    fn uri(&mut self, name: &str) -> String {
        match &self.net {
            Some(_) => format!("{name}:31850"),
            None => format!("127.0.0.1:{}", free_udp_port()),
        }
    }
}

/// A UDP port free on 127.0.0.1 now.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("bind a UDP socket on 127.0.0.1")
}
