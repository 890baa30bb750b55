//! Where the two nodes run on NICs: the [`Testbed`] trait, a ConnectX
//! over VFIO ([`Vfio`]) and the device model ([`DeviceModel`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use erpc::{Nexus, NexusBuilder};
use erpc_sim::SimNet;
use mempool::{Allocator, AllocatorConfig};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};

use crate::capture::{Capture, CapturingSmLink, NodeAddr};
use crate::memory::MemoryPlan;

use super::{BenchError, Knobs};

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
