//! The driver's side of the debug endpoint (`erpc-inspect`; the endpoint
//! itself is the `debug-endpoint` crate).
//!
//! A [`Device`] opened with [`crate::DeviceConfig::inspect`] (or with
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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock, Weak};

use debug_endpoint::{PublishInfo, Publisher, Query, Registration, Slot, Source};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::device::{Device, Health, InlineMode, Inner, input, out_len};
use crate::error::{Error, HealthProblem};
use crate::hw::{HwBackend, mlx5_device_name};
use crate::prm::cmd::*;
use crate::prm::codes::{EventType, Opcode, QueueState, WqeOpcode};
use crate::prm::ctx::*;
use crate::prm::init_seg;
use crate::prm::wqe::{
    ETH_L2_INLINE_HEADER_SIZE, MprqWqe, SEND_WQE_BB, SEND_WQE_DS, WqeCtrlSeg, WqeDataSeg,
    WqeEthSeg, WqeSrqNextSeg,
};
use crate::prm::{Layout, View, ViewMut};
use crate::queue::{HwQueueState, QueueSnapshot};

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

/// How a software value must relate to its firmware twin (JSON: an object
/// with `kind`, and `window` for `unordered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Relation {
    /// Must be equal.
    Equal,
    /// A counter the firmware may have moved past since the software view
    /// was published (software ≤ firmware, modulo the counter width).
    SoftwareBehind,
    /// A counter software moves first and tells the firmware later
    /// (firmware ≤ software).
    FirmwareBehind,
    /// Either may be ahead, by at most `window` (the ring size): one side
    /// reads the other lazily (the NIC reads an RQ doorbell record when it
    /// needs WQEs) and the software may move on after publishing.
    Unordered {
        /// The largest difference either way.
        window: u64,
    },
}

/// What a comparison found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareStatus {
    /// The same value.
    Same,
    /// Different, in the direction the relation allows (a counter moved
    /// between the two reads, or software is told later by design).
    Lagging,
    /// A difference the relation does not allow: worth a look.
    Differs,
}

/// One field of the software view next to the firmware's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comparison {
    /// Stable key (`sq.state`, `sq.producer`, ...).
    pub key: String,
    /// What it is.
    pub what: String,
    /// The software's value.
    pub software: u64,
    /// The firmware's value.
    pub firmware: u64,
    /// Counter width in bits (0 for states).
    pub bits: u32,
    /// The relation checked.
    pub relation: Relation,
    /// The outcome.
    pub status: CompareStatus,
}

impl Comparison {
    fn new(key: &str, what: &str, sw: u64, fw: u64, bits: u32, relation: Relation) -> Self {
        let mask = if bits == 0 || bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let (s, f) = (sw & mask, fw & mask);
        let half = if bits == 0 {
            0
        } else {
            1u64 << (bits.min(63) - 1)
        };
        // a ≤ b modulo 2^bits: b - a is less than half the range.
        let le = |a: u64, b: u64| bits != 0 && (b.wrapping_sub(a) & mask) < half;
        let dist = |a: u64, b: u64| b.wrapping_sub(a) & mask;
        let status = if s == f {
            CompareStatus::Same
        } else {
            match relation {
                Relation::Equal => CompareStatus::Differs,
                Relation::SoftwareBehind if le(s, f) => CompareStatus::Lagging,
                Relation::FirmwareBehind if le(f, s) => CompareStatus::Lagging,
                Relation::Unordered { window }
                    if bits != 0 && dist(s, f).min(dist(f, s)) <= window =>
                {
                    CompareStatus::Lagging
                }
                _ => CompareStatus::Differs,
            }
        };
        Comparison {
            key: key.into(),
            what: what.into(),
            software: s,
            firmware: f,
            bits,
            relation,
            status,
        }
    }
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

fn mac_string(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The report of a brought-up device (takes the control lock briefly and
/// reads the health registers; runs no command).
pub fn report<B: HwBackend>(dev: &Device<B>) -> DeviceReport {
    let i = dev.info();
    let (major, minor, sub) = i.fw_version;
    let (firmware_pages, cmd) = (dev.firmware_pages(), dev.command_stats());
    let pool = dev.dma_stats();
    DeviceReport {
        name: i.name.clone(),
        pci_device_id: i.pci_device_id,
        model: mlx5_device_name(i.pci_device_id).map(str::to_string),
        is_vf: i.is_vf,
        fw_version: format!("{major}.{minor}.{sub}"),
        mac: mac_string(i.mac),
        port_state: match i.vport_state {
            0 => "down".into(),
            1 => "up".into(),
            s => format!("state {s}"),
        },
        caps: CapsView {
            inline_mode: match i.inline_mode {
                InlineMode::None => "none",
                InlineMode::L2 => "l2",
                InlineMode::Ip => "ip",
                InlineMode::L4 => "l4",
            }
            .into(),
            wqe_inline_mode_cap: i.wqe_inline_mode_cap,
            bf_reg_size: i.bf_reg_size,
            log_max_wq_sz: i.log_max_wq_sz,
            log_max_cq_sz: i.log_max_cq_sz,
            ext_stride_num_range: i.ext_stride_num_range,
            cqe_version: i.cqe_version,
            sq_ts_format: i.sq_ts_format,
            rq_ts_format: i.rq_ts_format,
            reset_root_to_default: i.reset_root_to_default,
        },
        objects: SharedObjects {
            pd: i.pd,
            td: i.td,
            lkey: i.lkey,
            eqn: i.eqn,
        },
        pages: PagesView {
            firmware_pages,
            dma_regions: pool.regions,
            dma_pages_total: pool.pages_total,
            dma_pages_in_use: pool.pages_in_use,
        },
        health: HealthView::new(&dev.read_health()),
        commands: CommandsView {
            sent: cmd.sent,
            failed: cmd.failed,
            busy_polls: cmd.busy_polls,
        },
    }
}

/// QUERY_SQ, QUERY_RQ, QUERY_CQ (both) and QUERY_Q_COUNTER for the queue
/// set with these object numbers. Commands: never on the datapath.
pub(crate) fn query_objects<B: HwBackend>(
    inner: &Inner<B>,
    ids: &QueueIds,
) -> Result<HwQueueState, Error> {
    let mut inp = input::<QuerySqIn>(Opcode::QuerySq, 0, 0);
    ViewMut::<QuerySqIn>::new(&mut inp)
        .expect("sized")
        .set(QuerySqIn::SQN, u64::from(ids.sqn));
    let out = inner.exec(&inp, out_len::<QuerySqOut>(0))?;
    let sq = View::<QuerySqOut>::new(&out)
        .expect("sized")
        .sub(QuerySqOut::SQ_CONTEXT);
    let mut inp = input::<QueryRqIn>(Opcode::QueryRq, 0, 0);
    ViewMut::<QueryRqIn>::new(&mut inp)
        .expect("sized")
        .set(QueryRqIn::RQN, u64::from(ids.rqn));
    let out_rq = inner.exec(&inp, out_len::<QueryRqOut>(0))?;
    let rq = View::<QueryRqOut>::new(&out_rq)
        .expect("sized")
        .sub(QueryRqOut::RQ_CONTEXT);
    let cq = |cqn: u32| -> Result<(u32, u32, u8), Error> {
        let mut inp = input::<QueryCqIn>(Opcode::QueryCq, 0, 0);
        ViewMut::<QueryCqIn>::new(&mut inp)
            .expect("sized")
            .set(QueryCqIn::CQN, u64::from(cqn));
        let out = inner.exec(&inp, out_len::<QueryCqOut>(0))?;
        let c = View::<QueryCqOut>::new(&out)
            .expect("sized")
            .sub(QueryCqOut::CQC);
        Ok((
            c.get32(Cqc::CONSUMER_COUNTER),
            c.get32(Cqc::PRODUCER_COUNTER),
            c.get32(Cqc::STATUS) as u8,
        ))
    };
    let (tx_cq, rx_cq) = (cq(ids.tx_cqn)?, cq(ids.rx_cqn)?);
    // Counter set 0: the queue set has no Q counter (none to spare).
    let out_of_buffer = if ids.counter_set_id == 0 {
        0
    } else {
        let mut inp = input::<QueryQCounterIn>(Opcode::QueryQCounter, 0, 0);
        ViewMut::<QueryQCounterIn>::new(&mut inp)
            .expect("sized")
            .set(
                QueryQCounterIn::COUNTER_SET_ID,
                u64::from(ids.counter_set_id),
            );
        let out_q = inner.exec(&inp, out_len::<QueryQCounterOut>(0))?;
        View::<QueryQCounterOut>::new(&out_q)
            .expect("sized")
            .get32(QueryQCounterOut::OUT_OF_BUFFER)
    };
    Ok(HwQueueState {
        sq_state: sq.get32(Sqc::STATE) as u8,
        sq_hw_counter: sq.sub(Sqc::WQ).get32(Wq::HW_COUNTER),
        sq_sw_counter: sq.sub(Sqc::WQ).get32(Wq::SW_COUNTER),
        sq_min_wqe_inline_mode: sq.get32(Sqc::MIN_WQE_INLINE_MODE) as u8,
        sq_ts_format: sq.get32(Sqc::TS_FORMAT) as u8,
        rq_ts_format: rq.get32(Rqc::TS_FORMAT) as u8,
        rq_state: rq.get32(Rqc::STATE) as u8,
        rq_hw_counter: rq.sub(Rqc::WQ).get32(Wq::HW_COUNTER),
        rq_sw_counter: rq.sub(Rqc::WQ).get32(Wq::SW_COUNTER),
        tx_cq,
        rx_cq,
        out_of_buffer,
    })
}

/// The queue-set fields whose firmware twin QUERY_* reports, compared.
/// The software view is published first and the firmware read after it,
/// so counters that move under traffic may show the firmware ahead
/// ([`CompareStatus::Lagging`]); on an idle queue set they are equal,
/// except where one side learns late by design (software sees send
/// completions only at signaled WQEs; the NIC reads an RQ doorbell record
/// only when it needs WQEs). [`CompareStatus::Differs`] is a difference
/// no timing explains: the NIC missed a doorbell, a queue is in another
/// state than the software believes, a counter is off by more than its
/// ring.
pub fn compare_queue_set(sw: &QueueSetSoftware, fw: &HwQueueState) -> Vec<Comparison> {
    use Relation::*;
    let s = &sw.snapshot;
    let sq_state = if s.sq_error.is_some() {
        QueueState::Err
    } else {
        QueueState::Rdy
    } as u64;
    let rq_consumed = u64::from(sw.rx_strides_reported / sw.rq_strides_per_wqe.max(1));
    vec![
        Comparison::new(
            "sq.state",
            "SQ state",
            sq_state,
            u64::from(fw.sq_state),
            0,
            Equal,
        ),
        Comparison::new(
            "sq.producer",
            "SQ producer counter (WQEBBs posted; firmware: doorbell record)",
            u64::from(s.sq_pi),
            u64::from(fw.sq_sw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "sq.completed",
            "SQ WQEBBs completed (software learns at signaled WQEs only)",
            u64::from(s.sq_ci),
            u64::from(fw.sq_hw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "rq.state",
            "RQ state",
            QueueState::Rdy as u64,
            u64::from(fw.rq_state),
            0,
            Equal,
        ),
        Comparison::new(
            "rq.producer",
            "RQ WQEs posted (firmware: the doorbell record as the NIC last read it)",
            u64::from(s.rq_head),
            u64::from(fw.rq_sw_counter),
            16,
            Unordered {
                window: u64::from(sw.rq_wqes),
            },
        ),
        Comparison::new(
            "rq.consumed",
            "RQ WQEs whose strides were all used (software: strides reported / strides per WQE)",
            rq_consumed,
            u64::from(fw.rq_hw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "tx_cq.consumer",
            "TX CQ consumer index (firmware: the doorbell record as the NIC last read it)",
            u64::from(s.tx_cq_ci),
            u64::from(fw.tx_cq.0),
            24,
            Unordered {
                window: u64::from(sw.tx_cq_entries),
            },
        ),
        Comparison::new(
            "tx_cq.produced",
            "TX CQEs written (software: CQEs polled)",
            u64::from(s.tx_cq_ci),
            u64::from(fw.tx_cq.1),
            24,
            SoftwareBehind,
        ),
        Comparison::new(
            "rx_cq.produced",
            "RX CQEs written (software: packets counted; fillers add CQEs)",
            s.stats.rx_pkts,
            u64::from(fw.rx_cq.1),
            24,
            SoftwareBehind,
        ),
    ]
}

fn compare_eq(ci: u32, fw: (u32, u32, u8)) -> Vec<Comparison> {
    vec![
        Comparison::new(
            "eq.consumer",
            "EQ consumer index (software tells firmware every 64 events)",
            u64::from(ci),
            u64::from(fw.0),
            24,
            Relation::FirmwareBehind,
        ),
        Comparison::new(
            "eq.produced",
            "EQ events written (software: events consumed)",
            u64::from(ci),
            u64::from(fw.1),
            24,
            Relation::SoftwareBehind,
        ),
    ]
}

fn eq_view<B: HwBackend>(dev: &Device<B>) -> (Option<EqView>, Vec<CqErrorView>) {
    let (eq, cq_errors) = {
        let ctl = dev.inner.lock();
        let eq = ctl.eq.as_ref().map(|e| {
            let mut events = BTreeMap::new();
            for (t, &n) in e.counts.iter().enumerate() {
                if n > 0 {
                    let name = EventType::from_raw(t as u8)
                        .map_or_else(|| format!("type 0x{t:02x}"), |e| e.name().to_string());
                    events.insert(name, n);
                }
            }
            EqView {
                eqn: e.eqn,
                uar: e.uar,
                ci: e.ci(),
                events,
                last_event: e.last.map(|l| l.to_string()),
                firmware: None,
                firmware_error: None,
                compare: Vec::new(),
            }
        });
        let errs = ctl
            .cq_errors
            .iter()
            .map(|&(cqn, syndrome)| CqErrorView { cqn, syndrome })
            .collect::<Vec<_>>();
        (eq, errs)
    };
    let eq = eq.map(|mut v| {
        match dev.query_eq() {
            Ok(fw) => {
                v.compare = compare_eq(v.ci, fw);
                v.firmware = Some(fw);
            }
            Err(e) => v.firmware_error = Some(e.to_string()),
        }
        v
    });
    (eq, cq_errors)
}

struct QsEntry {
    udp_port: u16,
    ids: QueueIds,
    slot: Arc<Slot<QueueSetRaw>>,
}

/// The device's source, served by the endpoint thread.
struct DeviceSource<B: HwBackend> {
    /// The device; `None` once `Device::close` detached it.
    inner: RwLock<Option<Weak<Inner<B>>>>,
    name: String,
    mac: String,
    queue_sets: Mutex<Vec<QsEntry>>,
}

impl<B: HwBackend> DeviceSource<B> {
    fn entries(&self) -> Vec<(u16, QueueIds, Arc<Slot<QueueSetRaw>>)> {
        let mut q = self.queue_sets.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|e| !e.slot.is_closed());
        q.iter()
            .map(|e| (e.udp_port, e.ids, e.slot.clone()))
            .collect()
    }
}

impl<B: HwBackend> Source for DeviceSource<B> {
    fn kind(&self) -> &'static str {
        "devices"
    }

    fn summary(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "mac": self.mac,
            "queue_sets": self.entries().len(),
        })
    }

    fn pending(&self, generation: u64) -> bool {
        self.entries().iter().any(|(_, _, s)| s.pending(generation))
    }

    fn render(&self, q: &Query) -> Value {
        // Hold the read lock while using the device, so that
        // `Device::close` (which detaches under the write lock) never finds
        // this thread holding a handle.
        let guard = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(inner) = guard.as_ref().and_then(Weak::upgrade) else {
            return Value::Null; // being closed
        };
        let dev = Device { inner };
        let (eq, cq_errors) = eq_view(&dev);
        let queue_sets = self
            .entries()
            .into_iter()
            .map(|(udp_port, ids, slot)| {
                let latest = slot.latest();
                let mut software = latest.as_ref().map(|l| l.value.view());
                if !q.rings
                    && let Some(s) = software.as_mut()
                {
                    s.rings = None;
                }
                let (firmware, firmware_error) = match query_objects(&dev.inner, &ids) {
                    Ok(f) => (Some(f), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                let compare = match (&software, &firmware) {
                    (Some(s), Some(f)) => compare_queue_set(s, f),
                    _ => Vec::new(),
                };
                QueueSetView {
                    udp_port,
                    ids,
                    published: latest.map(|l| l.info(q.generation)),
                    software,
                    firmware,
                    firmware_error,
                    compare,
                }
            })
            .collect();
        let view = DeviceView {
            report: report(&dev),
            eq,
            cq_errors,
            queue_sets,
        };
        drop(dev);
        drop(guard);
        serde_json::to_value(view).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

/// A device's registration with the endpoint (kept in the device).
pub(crate) struct DeviceInspect<B: HwBackend> {
    source: Arc<DeviceSource<B>>,
    _registration: Registration,
}

impl<B: HwBackend> DeviceInspect<B> {
    /// Registers the device being built (`weak` upgrades once it is).
    /// A failure to start the endpoint is logged, not fatal: the device
    /// works without it.
    pub(crate) fn register(weak: Weak<Inner<B>>, name: &str, mac: [u8; 6]) -> Option<Self> {
        let source = Arc::new(DeviceSource {
            inner: RwLock::new(Some(weak)),
            name: name.to_string(),
            mac: mac_string(mac),
            queue_sets: Mutex::new(Vec::new()),
        });
        match debug_endpoint::register(source.clone()) {
            Ok(r) => {
                tracing::debug!(device = %name, socket = %r.socket().display(), "device exposed on the debug endpoint");
                Some(DeviceInspect {
                    source,
                    _registration: r,
                })
            }
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "debug endpoint not available");
                None
            }
        }
    }

    /// A publisher for a new queue set.
    pub(crate) fn add_queue_set(&self, udp_port: u16, ids: QueueIds) -> Publisher<QueueSetRaw> {
        let (p, slot) = Publisher::new();
        let mut q = self
            .source
            .queue_sets
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        q.retain(|e| !e.slot.is_closed());
        q.push(QsEntry {
            udp_port,
            ids,
            slot,
        });
        p
    }

    /// Stops the endpoint thread from using the device, waiting for a
    /// render in progress to finish.
    pub(crate) fn detach(&self) {
        *self.source.inner.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Undoes [`DeviceInspect::detach`] (a `close` that did not happen).
    pub(crate) fn attach(&self, weak: Weak<Inner<B>>) {
        *self.source.inner.write().unwrap_or_else(|p| p.into_inner()) = Some(weak);
    }
}

impl<B: HwBackend> fmt::Debug for DeviceInspect<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceInspect({})", self.source.name)
    }
}

// ------------------------------------------------------------ descriptors

/// A data (gather) segment, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DataSeg {
    /// Bytes (bit 31: inline, never set here).
    pub byte_count: u32,
    /// Memory key.
    pub lkey: u32,
    /// IOVA.
    pub addr: u64,
}

impl fmt::Display for DataSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data {} bytes lkey 0x{:x} addr 0x{:x}",
            self.byte_count, self.lkey, self.addr
        )
    }
}

/// A send WQE, decoded from its WQEBBs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SendWqe {
    /// Opcode (`SEND`, `NOP`, ...).
    pub opcode: u8,
    /// Opcode modifier.
    pub opmod: u8,
    /// WQE index (the producer counter when it was written, 16 bits).
    pub wqe_index: u16,
    /// SQ number.
    pub sqn: u32,
    /// Size in 16-byte units.
    pub ds: u8,
    /// `fm_ce_se`: fence, completion mode, solicited.
    pub fm_ce_se: u8,
    /// A completion is requested.
    pub signaled: bool,
    /// Immediate / TIS.
    pub imm: u32,
    /// Ethernet segment: checksum flags, MSS, inline header bytes (hex).
    pub eth: Option<(u8, u16, String)>,
    /// Gather segments.
    pub data: Vec<DataSeg>,
}

/// Decodes the send WQE starting at the first byte of `bytes` (its
/// WQEBBs, in order; the WQE's `ds` says how many 16-byte units count).
pub fn decode_send_wqe(bytes: &[u8]) -> Option<SendWqe> {
    let ctrl = View::<WqeCtrlSeg>::new(bytes.get(..WqeCtrlSeg::BYTES)?)?;
    let oio = ctrl.get32(WqeCtrlSeg::OPMOD_IDX_OPCODE);
    let qds = ctrl.get32(WqeCtrlSeg::QPN_DS);
    let ds = (qds & 0x3f) as u8;
    let fm_ce_se = ctrl.get32(WqeCtrlSeg::FM_CE_SE) as u8;
    let mut w = SendWqe {
        opcode: oio as u8,
        opmod: (oio >> 24) as u8,
        wqe_index: (oio >> 8) as u16,
        sqn: qds >> 8,
        ds,
        fm_ce_se,
        signaled: fm_ce_se & crate::prm::wqe::CTRL_CQ_UPDATE != 0,
        imm: ctrl.get32(WqeCtrlSeg::IMM),
        eth: None,
        data: Vec::new(),
    };
    let units = usize::from(ds).min(bytes.len() / SEND_WQE_DS);
    let mut u = 1;
    if WqeOpcode::from_raw(w.opcode) != Some(WqeOpcode::Nop) && u < units {
        let eth = View::<WqeEthSeg>::new(bytes.get(SEND_WQE_DS..SEND_WQE_DS + WqeEthSeg::BYTES)?)?;
        let sz = eth.get32(WqeEthSeg::INLINE_HDR_SZ) as usize;
        let start = SEND_WQE_DS + (WqeEthSeg::INLINE_HDR_START.bit() / 8) as usize;
        let inline = bytes.get(start..start + sz.min(ETH_L2_INLINE_HEADER_SIZE))?;
        w.eth = Some((
            eth.get32(WqeEthSeg::CS_FLAGS) as u8,
            eth.get32(WqeEthSeg::MSS) as u16,
            debug_endpoint::hex(inline),
        ));
        // The Ethernet segment and the inline bytes past its first 16.
        u += 1 + sz.saturating_sub(2).div_ceil(SEND_WQE_DS);
        while u < units {
            let d = View::<WqeDataSeg>::new(bytes.get(u * SEND_WQE_DS..(u + 1) * SEND_WQE_DS)?)?;
            w.data.push(DataSeg {
                byte_count: d.get32(WqeDataSeg::BYTE_COUNT),
                lkey: d.get32(WqeDataSeg::LKEY),
                addr: d.get(WqeDataSeg::ADDR),
            });
            u += 1;
        }
    }
    Some(w)
}

impl fmt::Display for SendWqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = WqeOpcode::from_raw(self.opcode).map_or("unknown opcode", |o| o.name());
        write!(
            f,
            "WQE {op} (0x{:02x}) index {} sqn 0x{:x} ds {} ({} WQEBB){}",
            self.opcode,
            self.wqe_index,
            self.sqn,
            self.ds,
            (usize::from(self.ds) * SEND_WQE_DS).div_ceil(SEND_WQE_BB),
            if self.signaled { " signaled" } else { "" }
        )?;
        if let Some((cs, mss, inline)) = &self.eth {
            write!(f, "; eth cs_flags 0x{cs:02x} mss {mss}")?;
            if !inline.is_empty() {
                write!(f, " inline {} bytes {inline}", inline.len() / 2)?;
            }
        }
        for d in &self.data {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

/// A striding RQ WQE, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MprqWqeDecoded {
    /// Next WQE index (unused for cyclic RQs).
    pub next_wqe_index: u16,
    /// The buffer all strides of the WQE share.
    pub buffer: DataSeg,
}

/// Decodes a 32-byte striding RQ WQE.
pub fn decode_mprq_wqe(bytes: &[u8]) -> Option<MprqWqeDecoded> {
    let v = View::<MprqWqe>::new(bytes.get(..MprqWqe::BYTES)?)?;
    let n = v.sub(MprqWqe::NSEG);
    let d = v.sub(MprqWqe::DSEG);
    Some(MprqWqeDecoded {
        next_wqe_index: n.get32(WqeSrqNextSeg::NEXT_WQE_INDEX) as u16,
        buffer: DataSeg {
            byte_count: d.get32(WqeDataSeg::BYTE_COUNT),
            lkey: d.get32(WqeDataSeg::LKEY),
            addr: d.get(WqeDataSeg::ADDR),
        },
    })
}

impl fmt::Display for MprqWqeDecoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "striding RQ WQE: {}", self.buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_allow_only_the_stated_direction_modulo_the_width() {
        use CompareStatus::*;
        use Relation::*;
        let st = |sw, fw, bits, r| Comparison::new("k", "w", sw, fw, bits, r).status;
        assert_eq!(st(5, 5, 16, Equal), Same);
        assert_eq!(st(5, 6, 16, Equal), Differs);
        assert_eq!(st(5, 9, 16, SoftwareBehind), Lagging);
        assert_eq!(st(9, 5, 16, SoftwareBehind), Differs);
        assert_eq!(st(9, 5, 16, FirmwareBehind), Lagging);
        // Across the wrap of a 16-bit counter: software 0xfffe, firmware 3.
        assert_eq!(st(0xfffe, 3, 16, SoftwareBehind), Lagging);
        assert_eq!(st(3, 0xfffe, 16, SoftwareBehind), Differs);
        // The software counter is wider: only the low bits count.
        assert_eq!(st(0x1_0005, 5, 16, Equal), Same);
        assert_eq!(st(0x100_0000 + 7, 9, 24, SoftwareBehind), Lagging);
        // States have no order.
        assert_eq!(st(1, 3, 0, SoftwareBehind), Differs);
        // Either way within the window, across the wrap too.
        let w = Unordered { window: 8 };
        assert_eq!(st(7, 0, 16, w), Lagging);
        assert_eq!(st(0, 7, 16, w), Lagging);
        assert_eq!(st(0xfffe, 5, 16, w), Lagging);
        assert_eq!(st(0, 9, 16, w), Differs);
    }

    #[test]
    fn send_wqes_decode_with_and_without_the_inline_header() {
        // A signaled SEND with the 18-byte L2 header inline and two gathers
        // (5 DS, 2 WQEBBs), as QueueSet::write_send_wqe builds it.
        let mut b = vec![0u8; 128];
        b[0..4].copy_from_slice(&((0x1234u32 << 8) | 0x0a).to_be_bytes());
        b[4..8].copy_from_slice(&((0x56u32 << 8) | 5).to_be_bytes());
        b[11] = crate::prm::wqe::CTRL_CQ_UPDATE;
        b[16 + 12..16 + 14].copy_from_slice(&18u16.to_be_bytes());
        for (i, x) in b[16 + 14..16 + 32].iter_mut().enumerate() {
            *x = i as u8;
        }
        b[48..52].copy_from_slice(&70u32.to_be_bytes());
        b[52..56].copy_from_slice(&0x77u32.to_be_bytes());
        b[56..64].copy_from_slice(&0x1000u64.to_be_bytes());
        b[64..68].copy_from_slice(&900u32.to_be_bytes());
        b[68..72].copy_from_slice(&0x77u32.to_be_bytes());
        b[72..80].copy_from_slice(&0x2000u64.to_be_bytes());
        let w = decode_send_wqe(&b).unwrap();
        assert_eq!(
            (w.opcode, w.wqe_index, w.sqn, w.ds, w.signaled),
            (0x0a, 0x1234, 0x56, 5, true)
        );
        let (_, _, inline) = w.eth.as_ref().unwrap();
        assert_eq!(inline.len(), 36);
        assert!(inline.starts_with("0001"));
        assert_eq!(w.data.len(), 2);
        assert_eq!((w.data[0].byte_count, w.data[0].addr), (70, 0x1000));
        assert_eq!((w.data[1].byte_count, w.data[1].addr), (900, 0x2000));
        let s = w.to_string();
        assert!(
            s.contains("SEND") && s.contains("2 WQEBB") && s.contains("signaled"),
            "{s}"
        );
        // A NOP: control segment only.
        let mut n = vec![0u8; 64];
        n[0..4].copy_from_slice(&(7u32 << 8).to_be_bytes());
        n[4..8].copy_from_slice(&((0x56u32 << 8) | 1).to_be_bytes());
        let w = decode_send_wqe(&n).unwrap();
        assert_eq!((w.opcode, w.wqe_index, w.ds), (0, 7, 1));
        assert!(w.eth.is_none() && w.data.is_empty());
        assert!(decode_send_wqe(&n[..8]).is_none());
    }

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
