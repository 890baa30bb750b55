//! Firmware: the command interface (command queue, mailboxes, delivery
//! statuses), every modeled command and its validation, HCA state, page
//! management and capabilities.
//!
//! Commands run synchronously inside the command-doorbell write, under the
//! NIC's firmware lock and the object tables' write lock, except a command
//! held by the injected "waits for pages" mode, which completes when a
//! later MANAGE_PAGES supplies the pages.

pub(crate) mod caps;
pub(crate) mod cmdq;
pub(crate) mod commands;
pub(crate) mod pages;

use std::collections::VecDeque;
use std::fmt;

use mlx5::prm::codes::{CmdStatus, DeliveryStatus, Opcode};

use crate::inject::FailCommand;
use crate::nic::NicConfig;

/// HCA (function) state, driven by ENABLE/INIT/TEARDOWN/DISABLE_HCA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcaState {
    /// Before ENABLE_HCA (or after DISABLE_HCA).
    Disabled,
    /// After ENABLE_HCA, before INIT_HCA.
    Enabled,
    /// After INIT_HCA: objects can be created.
    Initialized,
    /// After TEARDOWN_HCA: pages can be taken back.
    TornDown,
}

/// What a command-log entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// Sequence number (1 = first command).
    pub seq: u64,
    /// Command queue slot.
    pub slot: u8,
    /// Opcode (0 if the entry could not be read).
    pub opcode: u16,
    /// Opcode name.
    pub name: &'static str,
    /// Opcode modifier.
    pub op_mod: u16,
    /// Delivery status (`status_own >> 1`).
    pub delivery: DeliveryStatus,
    /// Command status (meaningful when delivery is OK).
    pub status: CmdStatus,
    /// Syndrome (0 on success). The model's syndromes are
    /// `opcode << 16 | why << 8`, with `why` a [`Why`] code.
    pub syndrome: u32,
    /// Why it was rejected (empty on success).
    pub reason: String,
    /// Failed by injection.
    pub injected: bool,
    /// Fabric clock when it completed.
    pub time_ns: u64,
}

impl fmt::Display for CommandRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} slot {} {} ({:#x}) op_mod {:#x}: ",
            self.seq, self.slot, self.name, self.opcode, self.op_mod
        )?;
        if self.delivery != DeliveryStatus::Ok {
            write!(f, "delivery {} — {}", self.delivery, self.reason)
        } else if self.status == CmdStatus::Ok {
            f.write_str("OK")
        } else {
            write!(
                f,
                "{} syndrome {:#010x} — {}",
                self.status, self.syndrome, self.reason
            )
        }
    }
}

/// Categories of rejection; bits 15..8 of every syndrome the model
/// returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Why {
    /// The opcode is not modeled.
    BadOpcode = 0x01,
    /// Input shorter than the command needs.
    InputLength = 0x02,
    /// Output shorter than the command needs.
    OutputLength = 0x03,
    /// Unsupported op_mod.
    OpMod = 0x04,
    /// A reserved or must-be-zero field is set.
    Reserved = 0x05,
    /// The object does not exist.
    NoObject = 0x06,
    /// The object belongs to another function.
    OtherFunction = 0x07,
    /// The object is in the wrong state for the request.
    ObjectState = 0x08,
    /// A value is out of range.
    OutOfRange = 0x09,
    /// A resource limit is reached.
    Limit = 0x0a,
    /// A feature the model (or the device's caps) does not support.
    NotSupported = 0x0b,
    /// The object is still referenced.
    InUse = 0x0c,
    /// The HCA is not in a state that allows the command.
    HcaState = 0x0d,
    /// Failed by injection.
    Injected = 0x0e,
    /// Page accounting (not enough pages, bad page).
    Pages = 0x0f,
    /// An address is misaligned.
    Alignment = 0x10,
    /// An address is not mapped in the IOMMU.
    Unmapped = 0x11,
    /// A duplicate (page given twice, entry exists).
    Duplicate = 0x12,
    /// Fields disagree with each other.
    Mismatch = 0x13,
    /// The interrupt vector named is not enabled (MSI-X off, or beyond
    /// the vectors the host allocated).
    Interrupt = 0x14,
}

/// A rejected command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reject {
    pub status: CmdStatus,
    pub why: Why,
    pub reason: String,
    /// Overrides the computed syndrome (injection).
    pub syndrome: Option<u32>,
}

impl Reject {
    pub(crate) fn new(status: CmdStatus, why: Why, reason: impl Into<String>) -> Reject {
        Reject {
            status,
            why,
            reason: reason.into(),
            syndrome: None,
        }
    }

    pub(crate) fn syndrome(&self, opcode: u16) -> u32 {
        self.syndrome
            .unwrap_or((u32::from(opcode) << 16) | ((self.why as u32) << 8))
    }
}

/// Command-queue registers of the init segment.
#[derive(Debug, Clone, Default)]
pub(crate) struct CmdqRegs {
    pub addr_h: u32,
    pub addr_l: u32,
    /// Fabric time when the low address was written.
    pub programmed_at: Option<u64>,
    /// `nic_interface` (0 full driver, 1 disabled).
    pub nic_interface: u8,
}

impl CmdqRegs {
    pub(crate) fn base(&self) -> u64 {
        (u64::from(self.addr_h) << 32) | u64::from(self.addr_l & !0xfff)
    }
}

/// Device-side injections handled by the firmware.
#[derive(Debug, Clone, Default)]
pub(crate) struct FwInject {
    /// Armed command failures (each with its countdown).
    pub fail: Vec<FailCommand>,
    /// The next eligible command waits until this many extra pages arrive.
    pub wait_for_pages: Option<u32>,
    /// Extra firmware-ready delay.
    pub extra_init_delay_ns: u64,
}

/// Everything behind the firmware lock.
#[derive(Debug)]
pub(crate) struct Firmware {
    pub regs: CmdqRegs,
    pub hca: HcaState,
    pub issi: u16,
    pub caps: caps::Caps,
    pub host_endianness: Option<[u8; 16]>,
    pub pages: pages::Pages,
    pub log: VecDeque<CommandRecord>,
    pub log_capacity: usize,
    pub seq: u64,
    pub inject: FwInject,
    /// Commands that wait for pages (fetched; finished as fetched).
    pub pending: Vec<cmdq::Held>,
    /// Fabric time of TEARDOWN_HCA (pages come back over time after it).
    pub torn_down_at: Option<u64>,
    /// Page-request EQEs not yet written (no EQ takes them yet).
    pub page_events: VecDeque<(bool, u16, i32)>,
}

impl Firmware {
    pub(crate) fn new(cfg: &NicConfig) -> Firmware {
        Firmware {
            regs: CmdqRegs::default(),
            hca: HcaState::Disabled,
            issi: 0,
            caps: caps::Caps::new(cfg),
            host_endianness: None,
            pages: pages::Pages::new(cfg),
            log: VecDeque::new(),
            log_capacity: cfg.command_log_capacity,
            seq: 0,
            inject: FwInject::default(),
            pending: Vec::new(),
            torn_down_at: None,
            page_events: VecDeque::new(),
        }
    }

    pub(crate) fn record(&mut self, r: CommandRecord) {
        if r.delivery != DeliveryStatus::Ok || r.status != CmdStatus::Ok {
            tracing::debug!(record = %r, "command rejected");
        }
        if self.log.len() >= self.log_capacity.max(1) {
            self.log.pop_front();
        }
        self.log.push_back(r);
    }
}

/// Name of an opcode for logs.
pub(crate) fn op_name(op: u16) -> &'static str {
    Opcode::from_raw(op).map_or("unknown opcode", |o| o.name())
}
