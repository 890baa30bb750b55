//! Typed driver errors. Every command failure names the command, the
//! status by name and the syndrome in hex; every error CQE names its
//! syndrome.

use std::time::Duration;

use crate::prm::codes::{CmdStatus, DeliveryStatus, HealthSyndrome, Opcode};
use crate::prm::cqe::Cqe;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Firmware executed the command and refused it.
    #[error(
        "{op} failed on {device}: {status} (status 0x{raw_status:02x}), syndrome 0x{syndrome:08x}"
    )]
    Command {
        /// Device name.
        device: String,
        /// The command.
        op: OpName,
        /// Status, by name.
        status: StatusName,
        /// Raw status byte.
        raw_status: u8,
        /// Firmware syndrome (the only detail firmware gives).
        syndrome: u32,
    },
    /// Firmware could not read the command (delivery status in `status_own`).
    #[error("{op} not delivered to {device}: {status} (delivery status 0x{raw:02x})")]
    Delivery {
        /// Device name.
        device: String,
        /// The command.
        op: OpName,
        /// Delivery status, by name.
        status: DeliveryName,
        /// Raw value.
        raw: u8,
    },
    /// Something did not happen in time.
    #[error("{what} on {device} timed out after {waited:?}")]
    Timeout {
        /// Device name.
        device: String,
        /// What was awaited.
        what: String,
        /// Time spent waiting.
        waited: Duration,
    },
    /// The device does not speak command interface 5.
    #[error("{device}: command interface revision {found}, this driver needs 5")]
    CmdifRevision {
        /// Device name.
        device: String,
        /// What the init segment says.
        found: u32,
    },
    /// The command queue address did not stick.
    #[error(
        "{device}: the firmware did not take the command queue address (wrote {wrote:#x}, reads back {read:#x}); was it still initializing?"
    )]
    CmdqAddress {
        /// Device name.
        device: String,
        /// The address written.
        wrote: u64,
        /// What `cmdq_addr_h`/`cmdq_addr_l_sz` read back.
        read: u64,
    },
    /// The function has no MAC and the configuration said not to make one up.
    #[error(
        "{device}: the function has no MAC (permanent address 00:00:00:00:00:00); give it one (e.g. `ip link set <pf> vf <n> mac ...`) or set DeviceConfig::mac_if_unset"
    )]
    NoMac {
        /// Device name.
        device: String,
    },
    /// The device lacks a feature the datapath relies on.
    #[error("{device}: missing capability {cap}: {why}")]
    MissingCapability {
        /// Device name.
        device: String,
        /// Capability field.
        cap: &'static str,
        /// Why we need it.
        why: &'static str,
    },
    /// The health check found the device broken.
    #[error("{device}: device unhealthy: {why}")]
    Unhealthy {
        /// Device name.
        device: String,
        /// What is wrong.
        #[source]
        why: HealthProblem,
    },
    /// A send or receive completed with an error CQE.
    #[error("{queue} on {device}: error CQE: {cqe}")]
    ErrorCqe {
        /// Device name.
        device: String,
        /// Which queue (e.g. "SQ 0x12").
        queue: String,
        /// The decoded CQE (its Display names the syndrome).
        cqe: Cqe,
    },
    /// The SQ is in the error state; call `recover_sq`.
    #[error("SQ 0x{sqn:x} on {device} is in error after {cqe}")]
    SqInError {
        /// Device name.
        device: String,
        /// SQ number.
        sqn: u32,
        /// The first error CQE.
        cqe: Cqe,
    },
    /// Firmware asked for more pages than device memory could supply.
    #[error(
        "{device}: firmware asked for {wanted} pages ({mib} MiB, {hugepages} hugepages of 2 MiB) and got {given} before DMA memory ran out; each function needs that much on top of its queues: {source}",
        mib = wanted * 4096 / (1 << 20),
        hugepages = (wanted * 4096).div_ceil(2 << 20)
    )]
    FirmwarePages {
        /// Device name.
        device: String,
        /// Pages firmware asked for in this request.
        wanted: usize,
        /// Pages given before the failure.
        given: usize,
        /// Why memory ran out (hugepages, IOMMU, locked-memory limit).
        #[source]
        source: mempool::RegionError,
    },
    /// Device memory could not be reserved or registered.
    #[error("DMA memory: {0}")]
    Memory(#[source] mempool::RegionError),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// PCI configuration space access failed.
    #[error("{device}: PCI config {what}: {source}")]
    Pci {
        /// Device name.
        device: String,
        /// What was accessed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A resource table is full (flow entries, queue sets).
    #[error("{device}: {what} exhausted ({limit} in use)")]
    Exhausted {
        /// Device name.
        device: String,
        /// Which resource.
        what: &'static str,
        /// Its limit.
        limit: usize,
    },
}

/// Health findings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthProblem {
    /// The health syndrome is set together with reset-required (RFR).
    #[error("health syndrome 0x{raw:02x} ({name}), ext 0x{ext:04x}")]
    Syndrome {
        /// Raw syndrome.
        raw: u8,
        /// Name.
        name: &'static str,
        /// Extended syndrome.
        ext: u16,
    },
    /// The health counter stopped advancing.
    #[error("firmware health counter stuck at 0x{counter:06x} for {checks} samples a second apart")]
    Stalled {
        /// Counter value.
        counter: u32,
        /// Consecutive checks without change.
        checks: u32,
    },
    /// Reads return all-ones: the device has gone from the bus.
    #[error("device not responding (fw_ver reads 0xffffffff)")]
    Gone,
    /// The NIC interface is disabled or in software reset.
    #[error("nic_interface is {0} (1 = disabled, 7 = SW reset)")]
    NicInterface(u32),
}

/// Displays an opcode by name, or its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpName(pub u16);

impl std::fmt::Display for OpName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match Opcode::from_raw(self.0) {
            Some(o) => write!(f, "{o}"),
            None => write!(f, "opcode 0x{:x}", self.0),
        }
    }
}

/// Displays a command status by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusName(pub u8);

impl StatusName {
    /// The status, if known.
    pub fn status(self) -> Option<CmdStatus> {
        CmdStatus::from_raw(self.0)
    }
}

impl std::fmt::Display for StatusName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match CmdStatus::from_raw(self.0) {
            Some(s) => write!(f, "{s}"),
            None => write!(f, "unknown status"),
        }
    }
}

/// Displays a delivery status by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryName(pub u8);

impl std::fmt::Display for DeliveryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match DeliveryStatus::from_raw(self.0) {
            Some(s) => write!(f, "{s}"),
            None => write!(f, "unknown delivery status"),
        }
    }
}

impl HealthProblem {
    /// A syndrome finding.
    pub fn syndrome(raw: u8, ext: u16) -> HealthProblem {
        HealthProblem::Syndrome {
            raw,
            name: HealthSyndrome::from_raw(raw)
                .map(|s| s.name())
                .unwrap_or("unknown syndrome"),
            ext,
        }
    }
}

impl Error {
    /// The command status, if this is a command failure.
    pub fn command_status(&self) -> Option<CmdStatus> {
        match self {
            Error::Command { raw_status, .. } => CmdStatus::from_raw(*raw_status),
            _ => None,
        }
    }
}
