//! Device model of an mlx5 NIC (a software ConnectX, in several device
//! profiles) and a simulated Ethernet fabric, for testing the driver, the
//! transports and eRPC without hardware.
//!
//! ```no_run
//! use mlx5::hw::HwBackend;
//! let fabric = mlx5_sim::Fabric::new(mlx5_sim::FabricConfig {
//!     seed: 1,
//!     deterministic: true,
//!     ..Default::default()
//! });
//! let nic = mlx5_sim::SimNic::new(&fabric, mlx5_sim::NicConfig {
//!     mac: [2, 0, 0, 0, 0, 1],
//!     ..Default::default()
//! });
//! let backend: mlx5_sim::SimBackend = nic.backend();
//! fabric.set_link_faults(nic.port(), mlx5_sim::LinkFaults { loss: 0.01, ..Default::default() });
//! fabric.advance(std::time::Duration::from_micros(10));
//! let _ = (backend.bar0_len(), nic.stats(), nic.queues(), nic.command_log());
//! ```
//!
//! What is modeled and what is not is listed in the crate's README
//! (`driver/sim/README.md`), which is also included below.
//!
//! Modules:
//! * [`dma`]: the model's IOMMU (the only unsafe code) and [`HostMem`].
//! * [`backend`]: [`SimBackend`], the `HwBackend` implementation.
//! * [`nic`]: [`SimNic`], configuration, BAR0 dispatch, PCI config space.
//! * `firmware`: command queue, every command, pages, capabilities.
//! * `tx` / `rx` / `steering`: the datapath.
//! * [`fabric`]: the NICs' side of the network model ([`netsim`]): switch,
//!   links with rates and faults, output queues, clock; [`pcap`].
//! * [`inject`]: device-side fault injection; [`stats`]: introspection.
#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]

pub mod backend;
pub mod bridge;
mod bridge_sys;
pub mod dma;
pub mod fabric;
mod firmware;
pub mod inject;
pub mod nic;
mod objects;
pub mod packet;
pub mod profile;
mod queues;
mod rx;
pub mod stats;
mod steering;
mod tx;
mod util;

/// The network model the fabric is built on.
pub use netsim;
/// pcap capture of fabric ports (the network model's).
pub use netsim::pcap;
/// The network model's seeded generator.
pub use netsim::rng;

pub use backend::SimBackend;
pub use bridge::{Bridge, BridgeError, BridgeStats};
pub use dma::{
    DmaFault, FaultKind, HostMem, HostMemError, IOVA_BASE, Iommu, IommuStats, MappingInfo,
    SimMapper,
};
pub use fabric::{
    Direction, Fabric, FabricConfig, FabricStats, LinkEvent, LinkEventKind, LinkFaults, PortConfig,
    PortId, PortStats, QueueSample, QueueStats, Tap,
};
pub use firmware::cmdq::{MAILBOX_ALIGN, MAX_MSG_BYTES};
pub use firmware::pages::PAGE_FILL;
pub use firmware::{CommandRecord, HcaState, Why};
pub use inject::{FailCommand, InjectError, Injection};
pub use netsim::PcapBuffer;
pub use nic::{BF_REG_BYTES, Eswitch, FIRST_UAR, Limits, NicConfig, SimNic, VfPolicy, WqeIdMode};
pub use profile::Profile;
pub use stats::{
    CqInfo, DropReason, EqInfo, NicStats, ObjectCounts, Queues, RqInfo, SqInfo, WqState,
};
pub use tx::{DeferredTx, MIN_FRAME};
