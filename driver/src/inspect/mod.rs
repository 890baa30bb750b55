//! The driver's side of the debug endpoint (`erpc-inspect`; the endpoint
//! itself is the `debug-endpoint` crate).
//!
//! A [`Device`](crate::Device) opened with [`crate::DeviceConfig::inspect`] (or with
//! `ERPC_INSPECT=1`) registers itself with the process's endpoint. Each of
//! its queue sets then owns a publisher: when a client asks, the queue
//! set's thread copies its software state as it is (counters, indexes and
//! the raw RX CQEs, [`QueueSetRaw`]) the next time
//! [`crate::QueueSet::poll_control`] services the event queue (every
//! `control_interval` calls, so the datapath pays nothing per call); the
//! endpoint's thread turns the copy into a [`QueueSetSoftware`] (hex,
//! names). Everything else is read by the endpoint's thread, which the datapath never
//! waits for: the device's identity and capabilities, the health registers,
//! the event queue (under the control lock, which queue-set threads only
//! ever try-lock), and the firmware's view of every queue through QUERY_SQ,
//! QUERY_RQ, QUERY_CQ, QUERY_EQ and QUERY_Q_COUNTER. The two views are
//! compared field by field ([`Comparison`]).
//!
//! The JSON keys are the field names of [`DeviceView`] and the types it
//! holds; `erpc-inspect --json` prints them and a test pins them.
//!
//! This file holds the types; the reading and the report (`report`), the
//! comparison (`compare`), the registration with the endpoint (`endpoint`)
//! and the descriptor decoders (`decode`) have a file each.

use std::collections::BTreeMap;

use debug_endpoint::PublishInfo;
use serde::{Deserialize, Serialize};

use crate::device::Health;
use crate::error::HealthProblem;
use crate::prm::init_seg;
use crate::queue::{HwQueueState, QueueSnapshot};

mod compare;
mod decode;
mod endpoint;
mod report;

pub use compare::{CompareStatus, Comparison, Relation, compare_queue_set};
pub use decode::{DataSeg, MprqWqeDecoded, SendWqe, decode_mprq_wqe, decode_send_wqe};
pub(crate) use endpoint::DeviceInspect;
pub(crate) use report::query_objects;
pub use report::report;

/// Most entries of one ring a snapshot copies (rings up to this size are
/// copied whole; of a larger one, the entries before the producer).
pub const RING_COPY_MAX: usize = 1024;

/// Object numbers of a queue set (fixed for its life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueIds {
    /// SQ number.
    pub sqn: u32,
    /// RQ number.
    pub rqn: u32,
    /// TX CQ number.
    pub tx_cqn: u32,
    /// RX CQ number.
    pub rx_cqn: u32,
    /// TIS number.
    pub tisn: u32,
    /// TIR number.
    pub tirn: u32,
    /// UAR page index.
    pub uar: u32,
    /// Flow table entry index.
    pub flow_index: u32,
    /// Q counter set.
    pub counter_set_id: u32,
}

/// Copies of one descriptor ring, as hex strings of each entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingCopy {
    /// Bytes per entry (64 for SQ WQEBBs and CQEs, 32 for striding RQ WQEs).
    pub entry_bytes: u32,
    /// Entries in the ring.
    pub ring_entries: u32,
    /// Ring index of `hex[0]`; `hex[k]` is entry `(first + k) % ring_entries`.
    pub first: u32,
    /// The entries, lowercase hex.
    pub hex: Vec<String>,
}

impl RingCopy {
    /// The bytes of ring entry `index`, if copied.
    pub fn entry(&self, index: u32) -> Option<Vec<u8>> {
        if self.ring_entries == 0 || index >= self.ring_entries {
            return None;
        }
        let k = (index + self.ring_entries - self.first) % self.ring_entries;
        self.hex
            .get(k as usize)
            .and_then(|h| debug_endpoint::unhex(h))
    }
}

/// A ring as copied by the queue set's thread (raw bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRing {
    /// Bytes per entry.
    pub entry_bytes: u32,
    /// Entries in the ring.
    pub ring_entries: u32,
    /// Ring index of the first entry copied.
    pub first: u32,
    /// The entries, back to back.
    pub bytes: Vec<u8>,
}

impl RawRing {
    fn view(&self) -> RingCopy {
        RingCopy {
            entry_bytes: self.entry_bytes,
            ring_entries: self.ring_entries,
            first: self.first,
            hex: self
                .bytes
                .chunks(self.entry_bytes.max(1) as usize)
                .map(debug_endpoint::hex)
                .collect(),
        }
    }
}

/// What a queue set's thread copies when asked: its state as is.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSetRaw {
    /// See [`QueueSetSoftware`]: every field but the CQEs and rings.
    pub software: QueueSetSoftware,
    /// The RX CQ ring, raw.
    pub rx_cqes: RawRing,
    /// Whole rings (SQ, RQ, TX CQ), when asked for.
    pub rings: Option<[RawRing; 3]>,
}

impl QueueSetRaw {
    /// The view: descriptors as hex.
    pub fn view(&self) -> QueueSetSoftware {
        let mut v = self.software.clone();
        v.rx_cqes = self.rx_cqes.view().hex;
        v.rings = self.rings.as_ref().map(|[sq, rq, tx_cq]| Rings {
            sq: sq.view(),
            rq: rq.view(),
            tx_cq: tx_cq.view(),
        });
        v
    }
}

/// Whole rings, copied when a client asks (`--wqe`, `--cqe`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rings {
    /// SQ WQEBBs.
    pub sq: RingCopy,
    /// Striding RQ WQEs.
    pub rq: RingCopy,
    /// TX CQEs.
    pub tx_cq: RingCopy,
}

/// What a queue set's thread publishes: its software state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueSetSoftware {
    /// Counters and indexes ([`crate::QueueSet::snapshot`]).
    pub snapshot: QueueSnapshot,
    /// SQ size in 64-byte WQEBBs.
    pub sq_wqebbs: u32,
    /// One signaled WQE per this many.
    pub unsignaled_batch: u32,
    /// BlueFlame is used for single-WQE bursts.
    pub blueflame: bool,
    /// Sends carry the L2 header inline.
    pub inline_l2: bool,
    /// BAR0 offset of the BlueFlame register half the next doorbell uses.
    pub bf_register: u64,
    /// Bytes of one BlueFlame half (0: no BlueFlame on this device).
    pub bf_half_bytes: u32,
    /// Striding RQ WQEs.
    pub rq_wqes: u32,
    /// Strides per RQ WQE.
    pub rq_strides_per_wqe: u32,
    /// Bytes per stride.
    pub rq_stride_bytes: u32,
    /// Strides reported to the application so far (free running, 32 bits).
    pub rx_strides_reported: u32,
    /// RX CQ entries (overrun ignored).
    pub rx_cq_entries: u32,
    /// TX CQ entries.
    pub tx_cq_entries: u32,
    /// Every RX CQE as the NIC last wrote it (hex, 64 bytes each), in ring
    /// order; `snapshot.rx_cqe_idx` is the one read next.
    pub rx_cqes: Vec<String>,
    /// Whole rings, only when asked for.
    pub rings: Option<Rings>,
}

/// One queue set in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueSetView {
    /// The UDP port steered to it.
    pub udp_port: u16,
    /// Its object numbers.
    pub ids: QueueIds,
    /// When its software state was published (`None`: never yet).
    pub published: Option<PublishInfo>,
    /// The software state.
    pub software: Option<QueueSetSoftware>,
    /// The firmware's view (QUERY_SQ/RQ/CQ/Q_COUNTER), read by the
    /// endpoint thread after the software state was published.
    pub firmware: Option<HwQueueState>,
    /// Why the firmware view is missing.
    pub firmware_error: Option<String>,
    /// Software and firmware, field by field.
    pub compare: Vec<Comparison>,
}

/// The health registers, with a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    /// `health.synd` (0 = healthy).
    pub syndrome: u8,
    /// `health.ext_synd`.
    pub ext_syndrome: u16,
    /// The firmware heartbeat counter (advances while firmware runs).
    pub heartbeat: u32,
    /// `nic_interface` (0 = full driver).
    pub nic_interface: u32,
    /// `fw_ver` from the health buffer, raw.
    pub fw_ver_raw: u32,
    /// Reset required.
    pub rfr: bool,
    /// `ok`, `warning: ...` (a syndrome without reset-required) or
    /// `fatal: ...` (what `Device::check_health` fails on).
    pub verdict: String,
}

impl HealthView {
    fn new(h: &Health) -> HealthView {
        let verdict = if h.fw_ver == 0xffff_ffff {
            format!("fatal: {}", HealthProblem::Gone)
        } else if h.nic_interface == init_seg::NIC_IFC_DISABLED
            || h.nic_interface == init_seg::NIC_IFC_SW_RESET
        {
            format!("fatal: {}", HealthProblem::NicInterface(h.nic_interface))
        } else if h.syndrome != 0 {
            let p = HealthProblem::syndrome(h.syndrome, h.ext_syndrome);
            if h.rfr {
                format!("fatal: {p} with reset required")
            } else {
                format!("warning: {p} (no reset required)")
            }
        } else {
            "ok".into()
        };
        HealthView {
            syndrome: h.syndrome,
            ext_syndrome: h.ext_syndrome,
            heartbeat: h.counter,
            nic_interface: h.nic_interface,
            fw_ver_raw: h.fw_ver,
            rfr: h.rfr,
            verdict,
        }
    }
}

/// Capabilities and settings that matter to this driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapsView {
    /// Send inline requirement: `none`, `l2`, `ip`, `l4`.
    pub inline_mode: String,
    /// Ethernet cap `wqe_inline_mode` (0 L2, 1 vport context, 2 none).
    pub wqe_inline_mode_cap: u8,
    /// BlueFlame register bytes (0: none).
    pub bf_reg_size: usize,
    /// log2 of the largest WQ.
    pub log_max_wq_sz: u8,
    /// log2 of the largest CQ.
    pub log_max_cq_sz: u8,
    /// Striding RQ with 2^3..2^8 strides.
    pub ext_stride_num_range: bool,
    /// CQE version in use.
    pub cqe_version: u8,
    /// `sqc.ts_format` used.
    pub sq_ts_format: u8,
    /// `rqc.ts_format` used.
    pub rq_ts_format: u8,
    /// NIC RX flow table `reset_root_to_default`.
    pub reset_root_to_default: bool,
}

/// Objects bring-up created that every queue set shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedObjects {
    /// Protection domain.
    pub pd: u32,
    /// Transport domain.
    pub td: u32,
    /// lkey of the physical-address mkey.
    pub lkey: u32,
    /// The EQ number.
    pub eqn: u8,
}

/// Memory the device holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagesView {
    /// 4 KiB pages given to firmware.
    pub firmware_pages: usize,
    /// Hugepage regions of the driver's DMA pool.
    pub dma_regions: usize,
    /// 4 KiB pages in those regions.
    pub dma_pages_total: usize,
    /// Of those, in use (queues, mailboxes, firmware pages).
    pub dma_pages_in_use: usize,
}

/// Command interface counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandsView {
    /// Commands sent.
    pub sent: u64,
    /// Commands failed.
    pub failed: u64,
    /// Ownership polls that found a command still running.
    pub busy_polls: u64,
}

/// What a device is: identity, firmware, capabilities, port, memory,
/// health. Also what `erpc-inspect device` prints for a device it brings
/// up itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// Backend name (`vfio 0000:03:00.0`, `sim nic 1 (...)`).
    pub name: String,
    /// PCI device id.
    pub pci_device_id: u16,
    /// Model from the device id, if known.
    pub model: Option<String>,
    /// A virtual function.
    pub is_vf: bool,
    /// Firmware version `major.minor.subminor`.
    pub fw_version: String,
    /// The function's MAC.
    pub mac: String,
    /// Port (vport) state: `up`, `down`, or the raw value.
    pub port_state: String,
    /// Capabilities that matter to this driver.
    pub caps: CapsView,
    /// Shared objects.
    pub objects: SharedObjects,
    /// Pages.
    pub pages: PagesView,
    /// Health registers.
    pub health: HealthView,
    /// Command counters.
    pub commands: CommandsView,
}

/// The event queue: software and firmware.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EqView {
    /// EQ number.
    pub eqn: u8,
    /// UAR of its doorbell.
    pub uar: u32,
    /// Software consumer index (events consumed).
    pub ci: u32,
    /// Events seen, by name (only those seen).
    pub events: BTreeMap<String, u64>,
    /// The last event, decoded.
    pub last_event: Option<String>,
    /// QUERY_EQ: (consumer counter, producer counter, state).
    pub firmware: Option<(u32, u32, u8)>,
    /// Why QUERY_EQ failed.
    pub firmware_error: Option<String>,
    /// Software and firmware, field by field.
    pub compare: Vec<Comparison>,
}

/// A CQ error event the control path recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CqErrorView {
    /// CQ number.
    pub cqn: u32,
    /// Syndrome (1 overrun, 2 access violation).
    pub syndrome: u8,
}

/// One device in a snapshot (`devices[i]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceView {
    /// Identity, firmware, capabilities, port, pages, health, commands.
    #[serde(flatten)]
    pub report: DeviceReport,
    /// The event queue.
    pub eq: Option<EqView>,
    /// CQ errors the event queue reported.
    pub cq_errors: Vec<CqErrorView>,
    /// Every queue set, in creation order.
    pub queue_sets: Vec<QueueSetView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_copies_index_from_their_first_entry() {
        let r = RingCopy {
            entry_bytes: 1,
            ring_entries: 4,
            first: 2,
            hex: vec!["02".into(), "03".into(), "00".into()],
        };
        assert_eq!(r.entry(2), Some(vec![2]));
        assert_eq!(r.entry(0), Some(vec![0]));
        assert_eq!(r.entry(1), None, "not copied");
        assert_eq!(r.entry(4), None, "outside the ring");
    }
}
