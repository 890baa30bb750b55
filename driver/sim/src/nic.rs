//! One device-model NIC (one PCI function): its configuration, BAR0
//! register file and dispatch, PCI configuration space, the receive entry
//! point from the fabric, and introspection.
//!
//! # BAR0 layout
//!
//! | pages | contents |
//! |---|---|
//! | 0 | initialization segment (fw rev, cmdif rev 5, cmdq address/size/stride, command doorbell, `initializing`, health buffer) |
//! | 1 | internal timer (0x1000/0x1004), health counter (0x1010), real-time clock (0x1040/0x1044) |
//! | 2 | IEEE 1588 clock (0x2000) |
//! | 3..8 | reserved (reads 0) |
//! | [`FIRST_UAR`].. | UAR pages handed out by ALLOC_UAR: CQ arm doorbell +0x20 (64-bit), EQ doorbells +0x40 (arm) / +0x48, bfregs at +0x800 + k × 512 (k = 0..3, two halves of 256 bytes each) |
//!
//! # Locks
//!
//! Per NIC: `fw` (command interface) → `dp` (object tables, read by the
//! datapath, written by commands) → one SQ or RQ → its CQ → its EQ. No lock
//! of a NIC is held while a frame is handed to the fabric, so delivery
//! into another NIC (or this one, for loopback) never deadlocks.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

use mempool::DmaMapper;
use mlx5::hw::pci;
use mlx5::prm::init_seg::{CMDIF_REV, CMDIF_REV_SHIFT, INITIALIZING_BIT};
use mlx5::prm::uar::{
    BF_OFFSET, BFREGS_PER_UAR, CQ_DOORBELL, EQ_DOORBELL_ARM, EQ_DOORBELL_NO_ARM, UAR_PAGE_BYTES,
};

use crate::dma::{DmaFault, DmaSession, Iommu, MappingInfo, SimMapper};
use crate::fabric::{Fabric, FabricInner, PortId, PortSink};
use crate::firmware::{CommandRecord, Firmware, HcaState, cmdq};
use crate::inject::{InjectError, Injection};
use crate::objects::{Datapath, Vport};
use crate::packet;
use crate::queues::Cq;
use crate::rx::Rq;
use crate::stats::{Counters, DropReason, NicStats, ObjectCounts, Queues};
use crate::steering::Verdict;
use crate::tx::DeferredTx;
use crate::util::{lock, mac_str, read, write};
use crate::{backend::SimBackend, rx, tx};
use netsim::Frames;

/// First BAR0 page handed out as a UAR (pages below hold the init segment
/// and clocks).
pub const FIRST_UAR: u32 = 8;
/// Size of a bfreg (`log_bf_reg_size` 9).
pub const BF_REG_BYTES: usize = 512;
/// PCI configuration space size (PCIe extended).
pub const CONFIG_SPACE_BYTES: usize = 4096;

/// Resource limits of a function (the caps report their log2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Protection domains.
    pub max_pds: u32,
    /// Transport domains.
    pub max_tds: u32,
    /// Memory keys.
    pub max_mkeys: u32,
    /// Event queues.
    pub max_eqs: u32,
    /// Completion queues.
    pub max_cqs: u32,
    /// Send queues.
    pub max_sqs: u32,
    /// Receive queues.
    pub max_rqs: u32,
    /// TIRs.
    pub max_tirs: u32,
    /// TISes.
    pub max_tises: u32,
    /// Flow tables.
    pub max_flow_tables: u32,
    /// Q counter sets.
    pub max_q_counters: u32,
    /// log2 of the largest CQ.
    pub log_max_cq_sz: u8,
    /// log2 of the largest EQ.
    pub log_max_eq_sz: u8,
    /// log2 of the largest WQ.
    pub log_max_wq_sz: u8,
    /// log2 of the largest flow table.
    pub log_max_ft_size: u8,
    /// log2 of the unicast MAC list.
    pub log_max_uc_list: u8,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pds: 1 << 16,
            max_tds: 1 << 16,
            max_mkeys: 1 << 16,
            max_eqs: 64,
            max_cqs: 1 << 16,
            max_sqs: 1 << 16,
            max_rqs: 1 << 16,
            max_tirs: 1 << 16,
            max_tises: 1 << 16,
            max_flow_tables: 1 << 10,
            max_q_counters: 64,
            log_max_cq_sz: 22,
            log_max_eq_sz: 22,
            log_max_wq_sz: 16,
            log_max_ft_size: 20,
            log_max_uc_list: 7,
        }
    }
}

/// How unicast frames reach the function before its own flow steering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eswitch {
    /// Flow steering alone decides (no e-switch in front of the function).
    None,
    /// A VF behind its PF's legacy SR-IOV e-switch: unicast only to MACs in
    /// the vport's unicast address list (the PF's e-switch builds a VF's
    /// forwarding rules from that list; MODIFY_NIC_VPORT_CONTEXT sets it).
    LegacyVf,
    /// A PF with `eswitch_manager` on a port shared through MPFS: unicast
    /// only to MACs in its L2 table (SET_L2_TABLE_ENTRY).
    Mpfs,
}

/// What the PF's mlx5_core does with a VF's requests in a legacy SR-IOV
/// e-switch (Linux `esw_vport_change_handler`, `esw_vport_ingress_config`):
/// only for [`Eswitch::LegacyVf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VfPolicy {
    /// The PF copies the VF's unicast list into its forwarding table
    /// asynchronously, from a work item: a MAC the VF adds is forwarded
    /// only this long after the MODIFY_NIC_VPORT_CONTEXT.
    pub copy_delay: Duration,
    /// `ip link set <pf> vf <n> spoofchk on`: frames the VF sends must
    /// carry its admin MAC (`NicConfig::mac`) as source; with no admin MAC
    /// the PF cannot set the check up and the VF sends nothing.
    pub spoofchk: bool,
    /// `ip link set <pf> vf <n> trust on`: the VF's promiscuous request
    /// is honoured; an untrusted VF's is ignored.
    pub trusted: bool,
}

impl Default for VfPolicy {
    /// mlx5's defaults: spoof checking off, not trusted; a millisecond to
    /// copy the list.
    fn default() -> Self {
        VfPolicy {
            copy_delay: Duration::from_millis(1),
            spoofchk: false,
            trusted: false,
        }
    }
}

/// How striding-RQ CQEs number the WQE a packet landed in (`wqe_id`).
/// No reference pins it down (libmlx5 masks it, DPDK compares the low
/// bits, the kernel indexes its ring with it), so the model offers both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeIdMode {
    /// The WQE's free-running sequence number, 16 bits.
    FreeRunning,
    /// The WQE's index in the ring (`sequence & (WQEs - 1)`).
    RingIndex,
}

/// Configuration of one device-model NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    /// The vport's permanent MAC (also pre-learned by the switch); all
    /// zero models a function without one (a VF nobody gave a MAC).
    pub mac: [u8; 6],
    /// What is in front of the function (and `eswitch_manager`).
    pub eswitch: Eswitch,
    /// The PF's policy for this VF (with [`Eswitch::LegacyVf`]).
    pub vf_policy: VfPolicy,
    /// log2 of the MPFS L2 table size.
    pub log_max_l2_table: u8,
    /// PCI device id (0x1017 ConnectX-5; the profiles set it).
    pub device_id: u16,
    /// A virtual function (PF-only registers such as HOST_ENDIANNESS are
    /// refused).
    pub vf: bool,
    /// A BlueField embedded-CPU function (ECPF): the init segment's
    /// `embedded_cpu` bit (`initializing` bit 23) is set, and
    /// ENABLE/DISABLE_HCA and QUERY_PAGES must say
    /// `embedded_cpu_function` = 1 (as Linux does); QUERY_PAGES and page
    /// requests name the function with `ec_function` = 1.
    pub ecpf: bool,
    /// On an ECPF: pages firmware asks for the host PF (function 0,
    /// `ec_function` 0) after INIT_HCA; they must be given, and taken back,
    /// for that function.
    pub host_pf_pages: u32,
    /// The function id firmware names in QUERY_PAGES and page-request
    /// EQEs; MANAGE_PAGES must echo it (0 for a PF, non-zero for a VF).
    pub function_id: u16,
    /// Firmware version: major, minor, sub-minor.
    pub fw_version: (u16, u16, u16),
    /// Pages QUERY_PAGES asks for at boot.
    pub boot_pages: u32,
    /// Pages QUERY_PAGES asks for before INIT_HCA.
    pub init_pages: u32,
    /// Pages requested with a page-request EQE after INIT_HCA.
    pub regular_pages: u32,
    /// How long after INIT_HCA the port's link comes up (QUERY_VPORT_STATE
    /// reports it down, and frames are dropped both ways, until then):
    /// real links take milliseconds to seconds to train.
    pub link_up_delay: Duration,
    /// How long after TEARDOWN_HCA the firmware still holds on to its
    /// pages: MANAGE_PAGES TAKE returns none before, every one after (a
    /// driver must retry, as Linux `mlx5_reclaim_startup_pages` does).
    pub page_release_delay: Duration,
    /// How long `initializing` stays set after reset (the NIC's creation:
    /// vfio-pci resets a function when it is opened). Until it clears, the
    /// firmware ignores writes to the command queue address.
    pub reset_init_delay: Duration,
    /// How long `initializing` stays set (again) after the cmdq address is
    /// written.
    pub fw_init_delay: Duration,
    /// Set `initializing` again for `fw_init_delay` once the cmdq address
    /// is written (the kernel waits before and after programming it).
    /// `false`: it only covers the reset phase.
    pub init_requires_cmdq: bool,
    /// Ethernet cap `wqe_inline_mode`: 0 = L2 always inlined (ConnectX-4
    /// Lx), 1 = per vport (ConnectX-5), 2 = none.
    pub wqe_inline_mode: u8,
    /// `nic_vport_context.min_wqe_inline_mode` (0 none, 1 L2, 2 IP, 3 L4).
    pub vport_min_inline: u8,
    /// Vport MTU as the hardware counts it: the longest frame including one
    /// VLAN tag and the FCS (Linux writes software MTU + 22). Frames longer
    /// than `mtu - 4` bytes in memory are dropped on receive and refused on
    /// send. The default, 1522, is what a previous owner running Linux at
    /// MTU 1500 leaves behind.
    pub mtu: u16,
    /// Cap `striding_rq`.
    pub striding_rq: bool,
    /// Cap `ext_stride_num_range`.
    pub ext_stride_num_range: bool,
    /// Cap `eth_virt`: the vport context's `min_wqe_inline_mode` is
    /// meaningful. Without it the device's own requirement (by device id:
    /// L2 on the ConnectX-4 family, none later) applies, as DPDK assumes.
    pub eth_virt: bool,
    /// General-2 cap `log_min_stride_wqe_sz` (DPDK's position; `Some`
    /// also sets `hca_cap_2`): the smallest striding WQE, log2 bytes.
    /// `None`: no general-2 block; the minimum is then 2^14, DPDK's
    /// default.
    pub log_min_stride_wqe_sz: Option<u8>,
    /// How striding-RQ CQEs report `wqe_id`.
    pub wqe_id_mode: WqeIdMode,
    /// Cap `cq_oi`.
    pub cq_oi: bool,
    /// Flow table cap `reset_root_to_default` (NIC RX): SET_FLOW_TABLE_ROOT
    /// op_mod 1 is allowed only with it.
    pub reset_root_to_default: bool,
    /// Cap `sq_ts_format`: 0 free-running only, 1 real-time only, 2 both.
    pub sq_ts_format: u8,
    /// Cap `rq_ts_format` (same encoding).
    pub rq_ts_format: u8,
    /// Resource limits.
    pub limits: Limits,
    /// Drop unicast frames not for the vport MAC / unicast list (unless
    /// promiscuous) before steering. Off by default: see the README.
    pub vport_mac_filter: bool,
    /// log2 command queue entries (5 = 32).
    pub log_cmdq_size: u8,
    /// BAR0 pages (UARs are pages `FIRST_UAR..bar_pages`).
    pub bar_pages: u32,
    /// MSI-X vectors the function has (the MSI-X table size).
    pub msix_vectors: u16,
    /// The host maps BAR0 write-combining (BlueFlame copies arrive as one
    /// burst). vfio-pci maps it uncached, so this is off by default; an
    /// uncombined BlueFlame write reaches the NIC as a plain doorbell.
    pub bar_write_combining: bool,
    /// Command log entries kept.
    pub command_log_capacity: usize,
    /// Bytes the IOMMU maps at once, at most: VFIO_IOMMU_MAP_DMA fails
    /// with ENOMEM past the process's locked-memory limit (`ulimit -l`)
    /// when it does not run as root. `None`: no limit.
    pub dma_lock_limit: Option<u64>,
    /// Test aid: the TX engine gathers a send's data again later than its
    /// doorbell and reports any change ([`DeferredTx`]). `None` (the
    /// default): everything happens inside the doorbell.
    pub deferred_tx: Option<DeferredTx>,
}

impl Default for NicConfig {
    /// The ConnectX-5 PF profile ([`crate::Profile::ConnectX5Pf`]).
    fn default() -> Self {
        crate::Profile::ConnectX5Pf.config()
    }
}

impl NicConfig {
    /// The ConnectX-5 PF, which the other profiles start from.
    pub(crate) fn base() -> NicConfig {
        NicConfig {
            mac: [2, 0, 0, 0, 0, 1],
            eswitch: Eswitch::Mpfs,
            vf_policy: VfPolicy::default(),
            log_max_l2_table: 5,
            device_id: 0x1017,
            vf: false,
            ecpf: false,
            host_pf_pages: 0,
            function_id: 0,
            fw_version: (16, 35, 2000),
            boot_pages: 96,
            init_pages: 6144,
            regular_pages: 2048,
            page_release_delay: Duration::from_millis(3),
            link_up_delay: Duration::from_millis(2),
            reset_init_delay: Duration::from_millis(5),
            fw_init_delay: Duration::from_millis(1),
            init_requires_cmdq: true,
            wqe_inline_mode: 1,
            vport_min_inline: 0,
            mtu: 1522,
            striding_rq: true,
            ext_stride_num_range: true,
            eth_virt: true,
            log_min_stride_wqe_sz: Some(14),
            wqe_id_mode: WqeIdMode::FreeRunning,
            cq_oi: true,
            reset_root_to_default: false,
            sq_ts_format: 0,
            rq_ts_format: 0,
            limits: Limits::default(),
            vport_mac_filter: false,
            log_cmdq_size: 5,
            bar_pages: 1024,
            msix_vectors: 64,
            bar_write_combining: false,
            command_log_capacity: 4096,
            dma_lock_limit: None,
            deferred_tx: None,
        }
    }
}

/// Health registers.
#[derive(Debug, Default)]
pub(crate) struct Health {
    synd: AtomicU8,
    /// Reset required (health buffer `rfr`): with a syndrome, fatal.
    rfr: AtomicBool,
    stopped: AtomicBool,
    frozen: AtomicU32,
    gone: AtomicBool,
}

impl Health {
    pub(crate) fn set_syndrome(&self, s: u8) {
        self.synd.store(s, Ordering::Relaxed);
    }

    pub(crate) fn set_rfr(&self, on: bool) {
        self.rfr.store(on, Ordering::Relaxed);
    }

    pub(crate) fn stop(&self, now_ns: u64) {
        if !self.stopped.load(Ordering::Relaxed) {
            self.frozen.store(self.counter(now_ns), Ordering::Relaxed);
            self.stopped.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn resume(&self) {
        self.stopped.store(false, Ordering::Relaxed);
    }

    pub(crate) fn set_gone(&self) {
        self.gone.store(true, Ordering::Relaxed);
    }

    fn counter(&self, now_ns: u64) -> u32 {
        if self.stopped.load(Ordering::Relaxed) {
            self.frozen.load(Ordering::Relaxed)
        } else {
            ((now_ns / 1_000_000) as u32).wrapping_add(1) & 0x00ff_ffff
        }
    }
}

/// MSI-X state, as vfio-pci leaves it in the device.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Msix {
    /// MSI-X Enable in the capability's message control.
    pub enabled: bool,
    /// The vector with an interrupt sink behind it.
    pub routed: Option<u16>,
}

pub(crate) struct NicInner {
    pub function: u32,
    pub msix: Mutex<Msix>,
    pub cfg: NicConfig,
    pub fabric: Arc<FabricInner>,
    pub port: PortId,
    pub iommu: Arc<Iommu>,
    pub mapper: Arc<dyn DmaMapper>,
    pub pci: Mutex<Vec<u8>>,
    pub fw: Mutex<Firmware>,
    pub dp: RwLock<Datapath>,
    pub stats: Counters,
    pub drops: [AtomicU64; DropReason::ALL.len()],
    pub health: Health,
    created_ns: u64,
}

impl fmt::Debug for NicInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NicInner(function {}, {}, mac {})",
            self.function,
            self.port,
            mac_str(&self.cfg.mac)
        )
    }
}

/// The frames of one send doorbell and whether each goes to the NIC's own
/// MAC, kept per thread so a doorbell allocates nothing once they have
/// grown to the batch size.
#[derive(Debug, Default)]
struct TxScratch {
    frames: Vec<Vec<u8>>,
    own: Vec<bool>,
}

thread_local! {
    static TX_SCRATCH: RefCell<TxScratch> = RefCell::new(TxScratch::default());
}

/// What the TX path needs to decide on loopback, captured under the read
/// lock.
#[derive(Debug, Clone, Copy)]
struct TxOrigin {
    /// The destination is one of the function's own unicast addresses.
    own: bool,
    td: u32,
    disable_uc_lb: bool,
    disable_mc_lb: bool,
}

/// The loopback facts of `sq`'s frames in `out` (and whether each goes to
/// one of the function's own addresses, into `out.own`).
fn tx_origin(dp: &Datapath, sq: &tx::Sq, out: &mut TxScratch) -> TxOrigin {
    let TxScratch { frames, own } = out;
    own.extend(frames.iter().map(|f| {
        let dmac: [u8; 6] = f[0..6].try_into().unwrap_or([0; 6]);
        dp.vport.owns(&dmac)
    }));
    TxOrigin {
        own: false,
        td: dp.tises.get(&sq.tisn).map_or(0, |t| t.td),
        disable_uc_lb: dp.vport.disable_uc_lb,
        disable_mc_lb: dp.vport.disable_mc_lb,
    }
}

impl TxOrigin {
    /// The frame goes to the wire and nowhere else: not to one of the
    /// function's own addresses, and not multicast looped back (see
    /// [`NicInner::transmit`]).
    fn wire_only(&self, frame: &[u8]) -> bool {
        !self.own && (frame.first().is_none_or(|b| b & 1 == 0) || self.disable_mc_lb)
    }
}

impl NicInner {
    pub(crate) fn now_ns(&self) -> u64 {
        self.fabric.now_ns()
    }

    /// A CQE timestamp: the free-running internal timer (ns of the fabric
    /// clock), or real time (seconds << 32 | nanoseconds, as the
    /// `real_time` registers at 0x1040).
    pub(crate) fn cqe_timestamp(&self, real_time: bool) -> u64 {
        let now = self.now_ns();
        if real_time {
            ((now / 1_000_000_000) << 32) | (now % 1_000_000_000)
        } else {
            now
        }
    }

    pub(crate) fn bar0_len(&self) -> usize {
        self.cfg.bar_pages as usize * UAR_PAGE_BYTES
    }

    pub(crate) fn drop_frame(&self, r: DropReason) {
        if let Some(i) = DropReason::ALL.iter().position(|x| *x == r) {
            self.drops[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Still coming out of reset: `initializing` is set and the command
    /// queue address registers do not take writes.
    fn in_reset(&self, fw: &Firmware) -> bool {
        let delay = self.cfg.reset_init_delay.as_nanos() as u64 + fw.inject.extra_init_delay_ns;
        fw.regs.programmed_at.is_none() && self.now_ns() < self.created_ns.saturating_add(delay)
    }

    fn initializing(&self, fw: &Firmware) -> bool {
        if self.in_reset(fw) {
            return true;
        }
        let delay = self.cfg.fw_init_delay.as_nanos() as u64 + fw.inject.extra_init_delay_ns;
        match fw.regs.programmed_at {
            Some(t) if self.cfg.init_requires_cmdq => self.now_ns() < t.saturating_add(delay),
            _ => false,
        }
    }

    // ----------------------------------------------------------- registers

    pub(crate) fn read32(&self, off: usize) -> u32 {
        self.stats.mmio_reads.fetch_add(1, Ordering::Relaxed);
        if self.health.gone.load(Ordering::Relaxed) {
            return u32::MAX;
        }
        if !off.is_multiple_of(4) || off + 4 > self.bar0_len() {
            self.stats.mmio_ignored.fetch_add(1, Ordering::Relaxed);
            return u32::MAX;
        }
        let (maj, min, sub) = self.cfg.fw_version;
        let now = self.now_ns();
        match off {
            0x0000 | 0x0230 => (u32::from(min) << 16) | u32::from(maj),
            0x0004 => (CMDIF_REV << CMDIF_REV_SHIFT) | u32::from(sub),
            0x0010 => lock(&self.fw).regs.addr_h,
            0x0014 => {
                let fw = lock(&self.fw);
                (fw.regs.addr_l & !0xfff)
                    | (u32::from(fw.regs.nic_interface) << 8)
                    | (u32::from(self.cfg.log_cmdq_size) << 4)
                    | 6
            }
            0x01fc => {
                let fw = lock(&self.fw);
                let ecpu = if self.cfg.ecpf {
                    mlx5::prm::init_seg::EMBEDDED_CPU_BIT
                } else {
                    0
                };
                ecpu | if self.initializing(&fw) {
                    INITIALIZING_BIT
                } else {
                    0
                }
            }
            0x0234 => u32::from(self.cfg.device_id),
            0x0238 => u32::from(self.health.rfr.load(Ordering::Relaxed)) << 31,
            0x023c => u32::from(self.health.synd.load(Ordering::Relaxed)) << 16,
            0x1000 | 0x2000 => (now >> 32) as u32,
            0x1004 | 0x2004 => now as u32,
            0x1010 => self.health.counter(now),
            0x1040 => (now / 1_000_000_000) as u32,
            0x1044 => (now % 1_000_000_000) as u32,
            _ => 0,
        }
    }

    fn uar_of(&self, off: usize) -> Option<(u32, usize)> {
        let page = (off / UAR_PAGE_BYTES) as u32;
        if page < FIRST_UAR || off >= self.bar0_len() {
            return None;
        }
        Some((page, off % UAR_PAGE_BYTES))
    }

    fn ignored(&self, what: &str, off: usize) {
        self.stats.mmio_ignored.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(function = self.function, off, what, "MMIO access ignored");
    }

    pub(crate) fn write32(&self, off: usize, v: u32) {
        self.fabric.check_thread();
        self.stats.mmio_writes.fetch_add(1, Ordering::Relaxed);
        if !off.is_multiple_of(4) || off + 4 > self.bar0_len() {
            return self.ignored("misaligned or out-of-range write32", off);
        }
        match off {
            0x0010 | 0x0014 if self.in_reset(&lock(&self.fw)) => {
                self.stats
                    .cmdq_writes_ignored
                    .fetch_add(1, Ordering::Relaxed);
                self.ignored("command queue address written while initializing", off);
            }
            0x0010 => lock(&self.fw).regs.addr_h = v,
            0x0014 => {
                let now = self.now_ns();
                let mut fw = lock(&self.fw);
                let ifc = ((v >> 8) & 7) as u8;
                let same =
                    fw.regs.programmed_at.is_some() && (v & !0xfff) == (fw.regs.addr_l & !0xfff);
                if same && ifc != 0 {
                    fw.regs.nic_interface = ifc;
                } else {
                    fw.regs.addr_l = v & !0xfff;
                    fw.regs.nic_interface = 0;
                    fw.regs.programmed_at = Some(now);
                }
            }
            0x0018 => self.cmd_doorbell(v),
            _ => match self.uar_of(off) {
                Some((uar, o)) if o == EQ_DOORBELL_ARM || o == EQ_DOORBELL_NO_ARM => {
                    self.eq_doorbell(uar, v, o == EQ_DOORBELL_ARM)
                }
                _ => self.ignored("write32", off),
            },
        }
    }

    pub(crate) fn write64(&self, off: usize, v: u64) {
        self.fabric.check_thread();
        self.stats.mmio_writes.fetch_add(1, Ordering::Relaxed);
        if !off.is_multiple_of(8) || off + 8 > self.bar0_len() {
            return self.ignored("misaligned or out-of-range write64", off);
        }
        match self.uar_of(off) {
            Some((uar, CQ_DOORBELL)) => self.cq_arm(uar, v),
            Some((uar, o)) if is_bfreg(o) => self.sq_doorbell(uar, v, None),
            _ => self.ignored("write64", off),
        }
    }

    pub(crate) fn write_bf(&self, off: usize, data: &[u8]) {
        self.fabric.check_thread();
        self.stats.mmio_writes.fetch_add(1, Ordering::Relaxed);
        self.stats.bf_writes.fetch_add(1, Ordering::Relaxed);
        let ok_len =
            !data.is_empty() && data.len().is_multiple_of(64) && data.len() <= BF_REG_BYTES / 2;
        match self.uar_of(off) {
            Some((uar, o)) if ok_len && is_bfreg(o) && off + data.len() <= self.bar0_len() => {
                let mut v = [0u8; 8];
                v.copy_from_slice(&data[..8]);
                if self.cfg.bar_write_combining {
                    self.sq_doorbell(uar, u64::from_be_bytes(v), Some(data))
                } else {
                    self.stats.bf_uncombined.fetch_add(1, Ordering::Relaxed);
                    self.sq_doorbell(uar, u64::from_be_bytes(v), None)
                }
            }
            _ => self.ignored("BlueFlame write (bad offset or length)", off),
        }
    }

    fn cmd_doorbell(&self, bits: u32) {
        self.stats.cmd_doorbells.fetch_add(1, Ordering::Relaxed);
        let mut fw = lock(&self.fw);
        let why = if fw.regs.programmed_at.is_none() {
            Some("no command queue address")
        } else if fw.regs.nic_interface != 0 {
            Some("NIC interface disabled")
        } else if self.initializing(&fw) {
            Some("firmware still initializing")
        } else {
            None
        };
        if let Some(why) = why {
            self.stats
                .cmd_doorbells_ignored
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(function = self.function, why, "command doorbell ignored");
            return;
        }
        let mut dp = write(&self.dp);
        let slots = 1u32 << self.cfg.log_cmdq_size;
        for slot in 0..32u8 {
            if bits & (1 << slot) == 0 {
                continue;
            }
            if u32::from(slot) >= slots || fw.pending.iter().any(|h| h.slot == slot) {
                self.stats
                    .cmd_doorbells_ignored
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            cmdq::run_slot(self, &mut fw, &mut dp, slot);
        }
    }

    fn eq_doorbell(&self, uar: u32, v: u32, arm: bool) {
        self.stats.eq_doorbells.fetch_add(1, Ordering::Relaxed);
        let dp = read(&self.dp);
        if !dp.uars.contains(&uar) {
            return self.ignored("EQ doorbell on a UAR the function does not own", 0);
        }
        let eqn = v >> 24;
        match dp.eqs.get(&eqn) {
            Some(eq) if lock(eq).uar == uar => lock(eq).doorbell(self, v & 0x00ff_ffff, arm),
            _ => self.ignored("EQ doorbell for an unknown EQ or through the wrong UAR", 0),
        }
    }

    fn cq_arm(&self, uar: u32, v: u64) {
        self.stats.cq_arm_doorbells.fetch_add(1, Ordering::Relaxed);
        let dp = read(&self.dp);
        if !dp.uars.contains(&uar) {
            return self.ignored("CQ arm on a UAR the function does not own", 0);
        }
        let hi = (v >> 32) as u32;
        let cqn = (v as u32) & 0x00ff_ffff;
        let solicited = (hi >> 24) & 0x7 == 1;
        match dp.cqs.get(&cqn) {
            Some(cq) if lock(cq).uar == uar => {
                // The IOMMU session before the CQ's lock (see
                // `Iommu::session`): arming may write an EQE.
                let io = &self.iommu.session();
                lock(cq).arm(self, io, hi & 0x00ff_ffff, solicited)
            }
            _ => self.ignored("CQ arm for an unknown CQ or through the wrong UAR", 0),
        }
    }

    fn sq_doorbell(&self, uar: u32, v: u64, bf: Option<&[u8]>) {
        self.stats.sq_doorbells.fetch_add(1, Ordering::Relaxed);
        let sqn = (v as u32) >> 8;
        let mut out;
        let origin;
        {
            let dp = read(&self.dp);
            if !dp.uars.contains(&uar) || !dp.hca_up {
                self.stats
                    .sq_doorbells_ignored
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            let Some(sq) = dp.sqs.get(&sqn) else {
                self.stats
                    .sq_doorbells_ignored
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(sqn, "send doorbell for an unknown SQ");
                return;
            };
            let mut sq = lock(sq);
            if sq.uar != uar {
                self.stats
                    .sq_doorbells_ignored
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(sqn, uar, "send doorbell through a UAR that is not the SQ's");
                return;
            }
            // This thread's vectors from its previous doorbell (taken, so a
            // nested doorbell would simply start with empty ones).
            out = TX_SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
            tx::doorbell(self, &dp, &mut sq, bf, &mut out.frames);
            origin = tx_origin(&dp, &sq, &mut out);
        }
        self.send_frames(out, origin);
    }

    /// Deferred gather ([`DeferredTx`]): every SQ reads its held WQEs that
    /// are due (all of them with `all`), in SQ-number order, and sends
    /// what it read.
    pub(crate) fn release_deferred_tx(&self, all: bool) {
        if self.cfg.deferred_tx.is_none() {
            return;
        }
        // In SQ-number order (the map's): a replay sends the same frames in
        // the same order.
        let sqs: Vec<Arc<Mutex<tx::Sq>>> = read(&self.dp).sqs.values().cloned().collect();
        for sq in sqs {
            let out;
            let origin;
            {
                let dp = read(&self.dp);
                let mut sq = lock(&sq);
                if sq.held.as_ref().is_none_or(|q| q.len() == 0) {
                    continue;
                }
                let mut o = TX_SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
                let io = self.iommu.session();
                tx::release(self, &io, &dp, &mut sq, &mut o.frames, all);
                drop(io);
                origin = tx_origin(&dp, &sq, &mut o);
                out = o;
            }
            self.send_frames(out, origin);
        }
    }

    /// Sends the frames of a doorbell (or of a deferred read) after every
    /// lock is dropped, and gives the scratch vectors back to the thread.
    fn send_frames(&self, mut out: TxScratch, origin: TxOrigin) {
        // Frames that only go to the wire (no loopback inside the NIC) are
        // handed to the fabric a run at a time, in order; the others one
        // by one between them, as before.
        let wire_only = |f: &[u8], own: bool| TxOrigin { own, ..origin }.wire_only(f);
        let mut frames = out.frames.drain(..).zip(out.own.drain(..)).peekable();
        while let Some((f, own)) = frames.next() {
            if !wire_only(&f, own) {
                self.transmit(f, TxOrigin { own, ..origin });
                continue;
            }
            let run = std::iter::from_fn(|| {
                frames
                    .next_if(|(f, own)| wire_only(f, *own))
                    .map(|(f, _)| f)
            });
            self.fabric
                .transmit_many(self.port.0, std::iter::once(f).chain(run));
        }
        drop(frames);
        TX_SCRATCH.with(|s| *s.borrow_mut() = out);
    }

    /// Sends a frame: unicast to the own MAC loops back inside the NIC,
    /// multicast goes to the wire and loops back, everything else goes to
    /// the wire. No lock is held here.
    fn transmit(&self, frame: Vec<u8>, o: TxOrigin) {
        let dmac: [u8; 6] = frame[0..6].try_into().unwrap_or([0; 6]);
        if o.own {
            if !o.disable_uc_lb {
                self.stats.loopback_frames.fetch_add(1, Ordering::Relaxed);
                self.stats.rx_frames.fetch_add(1, Ordering::Relaxed);
                self.rx_frame(&frame, Some(o.td));
            }
            self.fabric.recycle(frame);
            return;
        }
        if dmac[0] & 1 == 1 && !o.disable_mc_lb {
            self.stats.loopback_frames.fetch_add(1, Ordering::Relaxed);
            self.stats.rx_frames.fetch_add(1, Ordering::Relaxed);
            self.rx_frame(&frame, Some(o.td));
        }
        self.fabric.transmit(self.port.0, frame);
    }

    /// A frame arrives (from the wire, or looped back from an SQ of
    /// transport domain `lb_td`).
    fn rx_frame(&self, frame: &[u8], lb_td: Option<u32>) {
        let dp = read(&self.dp);
        let io = self.iommu.session();
        let mut t = RxTally::default();
        let mut held = None;
        self.rx_one(&dp, &io, frame, lb_td, &mut held, &mut t);
        drop(held);
        drop(io);
        t.add_to(&self.stats);
    }

    /// Frames arrive from the wire, one after the other: [`rx_frame`] for
    /// each, with the object table and the IOMMU locked once and the
    /// counters added once.
    ///
    /// [`rx_frame`]: Self::rx_frame
    fn rx_frames(&self, frames: Frames<'_>) {
        self.stats
            .rx_frames
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        let dp = read(&self.dp);
        let io = self.iommu.session();
        let mut t = RxTally::default();
        let mut held = None;
        for f in frames.iter() {
            self.rx_one(&dp, &io, f, None, &mut held, &mut t);
        }
        drop(held);
        drop(io);
        t.add_to(&self.stats);
    }

    /// One received frame, with the object table read-locked and the
    /// IOMMU session open (in that order; the RQ's and its CQ's locks are
    /// taken after them: see `Iommu::session`). `held` keeps the last RQ
    /// and its CQ locked for the next frame of the same run.
    fn rx_one<'dp>(
        &self,
        dp: &'dp Datapath,
        io: &DmaSession<'_>,
        frame: &[u8],
        lb_td: Option<u32>,
        held: &mut Option<HeldRq<'dp>>,
        t: &mut RxTally,
    ) {
        if !dp.hca_up {
            return self.drop_frame(DropReason::HcaDown);
        }
        if !dp.link_up(self.now_ns()) {
            return self.drop_frame(DropReason::LinkDown);
        }
        // The port MAC drops runts and frames above the port MTU before
        // anything else looks at them.
        if frame.len() < tx::MIN_FRAME {
            return self.drop_frame(DropReason::Runt);
        }
        if frame.len() > tx::max_frame(dp.vport.mtu) {
            return self.drop_frame(DropReason::Oversize);
        }
        let parsed = packet::parse(frame);
        if !eswitch_forwards(&self.cfg, dp, self.now_ns(), &parsed.dmac) {
            return self.drop_frame(DropReason::Eswitch);
        }
        if self.cfg.vport_mac_filter && !vport_accepts(&dp.vport, &parsed.dmac) {
            return self.drop_frame(DropReason::VportFilter);
        }
        let key = packet::match_key(frame, &parsed);
        let targets = match dp.steering.lookup(&key) {
            Verdict::Deliver(t) => t,
            Verdict::Drop(r) => return self.drop_frame(r),
        };
        let multicast = parsed.dmac[0] & 1 == 1;
        for (tirn, tag) in targets {
            let Some(tir) = dp.tirs.get(&tirn) else {
                self.drop_frame(DropReason::FlowMiss);
                continue;
            };
            if let Some(td) = lb_td {
                let bit = if multicast { 2 } else { 1 };
                if td == tir.td && tir.self_lb_block & bit != 0 {
                    self.drop_frame(DropReason::SelfLoopback);
                    continue;
                }
            }
            if held.as_ref().is_none_or(|h| h.rqn != tir.rqn) {
                // Both locks of the previous RQ go before the next ones are
                // taken (two RQs may share a CQ).
                *held = None;
                let Some(rq) = dp.rqs.get(&tir.rqn) else {
                    self.drop_frame(DropReason::FlowMiss);
                    continue;
                };
                let rq = lock(rq);
                let cq = dp.cqs.get(&rq.cqn).filter(|c| Arc::ptr_eq(c, &rq.cq));
                let cq = match cq {
                    Some(c) => HeldCq::Table(lock(c)),
                    None => HeldCq::Own(rq.cq.clone()),
                };
                *held = Some(HeldRq {
                    rqn: tir.rqn,
                    rq,
                    cq,
                });
            }
            let Some(h) = held.as_mut() else { continue };
            let posts = h.rq.cqe_posts;
            let r = match &mut h.cq {
                HeldCq::Table(cq) => rx::deliver(self, io, dp, &mut h.rq, cq, frame, &parsed, tag),
                HeldCq::Own(cq) => {
                    let mut cq = lock(cq);
                    rx::deliver(self, io, dp, &mut h.rq, &mut cq, frame, &parsed, tag)
                }
            };
            t.cqes += h.rq.cqe_posts - posts;
            match r {
                Ok(()) => {
                    t.delivered += 1;
                    t.bytes += frame.len() as u64;
                }
                Err(r) => self.drop_frame(r),
            }
        }
    }

    // ------------------------------------------------------------ PCI

    /// MSI-X on with `vector` routed, as vfio-pci sets the device up for
    /// `VFIO_DEVICE_SET_IRQS`.
    pub(crate) fn enable_msix(&self, vector: u16) -> std::io::Result<()> {
        if vector >= self.cfg.msix_vectors {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "MSI-X vector {vector}: the function has {}",
                    self.cfg.msix_vectors
                ),
            ));
        }
        *lock(&self.msix) = Msix {
            enabled: true,
            routed: Some(vector),
        };
        self.set_msix_enable_bit(true);
        Ok(())
    }

    pub(crate) fn disable_msix(&self) {
        *lock(&self.msix) = Msix::default();
        self.set_msix_enable_bit(false);
    }

    fn set_msix_enable_bit(&self, on: bool) {
        let mut cfg = lock(&self.pci);
        let at = MSIX_CAP + 3;
        cfg[at] = (cfg[at] & 0x7f) | if on { 0x80 } else { 0 };
    }

    pub(crate) fn config_read(&self, off: u16, buf: &mut [u8]) -> std::io::Result<()> {
        let cfg = lock(&self.pci);
        let (s, e) = config_range(off, buf.len())?;
        if self.health.gone.load(Ordering::Relaxed) {
            buf.fill(0xff);
            return Ok(());
        }
        buf.copy_from_slice(&cfg[s..e]);
        Ok(())
    }

    pub(crate) fn config_write(&self, off: u16, data: &[u8]) -> std::io::Result<()> {
        let mut cfg = lock(&self.pci);
        let (s, e) = config_range(off, data.len())?;
        // Only the COMMAND register is writable (memory, bus master, INTx
        // disable); everything else is read-only.
        for (i, &b) in data.iter().enumerate() {
            let at = s + i;
            let mask = match at {
                4 => 0x06,
                5 => 0x04,
                _ => 0,
            };
            cfg[at] = (cfg[at] & !mask) | (b & mask);
        }
        let _ = e;
        let cmd = u16::from_le_bytes([cfg[4], cfg[5]]);
        self.iommu.set_bus_master(cmd & pci::COMMAND_MASTER != 0);
        Ok(())
    }
}

fn is_bfreg(o: usize) -> bool {
    (BF_OFFSET..BF_OFFSET + BFREGS_PER_UAR * BF_REG_BYTES).contains(&o)
        && (o - BF_OFFSET).is_multiple_of(BF_REG_BYTES / 2)
}

fn config_range(off: u16, len: usize) -> std::io::Result<(usize, usize)> {
    let s = usize::from(off);
    let e = s + len;
    if e > CONFIG_SPACE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("config access of {len} bytes at {off:#x} beyond {CONFIG_SPACE_BYTES}"),
        ));
    }
    Ok((s, e))
}

/// Whether the e-switch in front of the function forwards a frame for
/// `dmac` to it: multicast and broadcast always; unicast only to a MAC the
/// driver programmed (a VF's vport address list, a PF's MPFS L2 table).
fn eswitch_forwards(cfg: &NicConfig, dp: &Datapath, now_ns: u64, dmac: &[u8; 6]) -> bool {
    if dmac[0] & 1 == 1 {
        return true;
    }
    let log_max_l2_table = cfg.log_max_l2_table;
    match cfg.eswitch {
        Eswitch::None => true,
        // The PF forwards what it has copied from the VF's list (after
        // `copy_delay`), and everything only for a trusted promiscuous VF.
        Eswitch::LegacyVf => {
            let delay = cfg.vf_policy.copy_delay.as_nanos() as u64;
            let copied = dp
                .vport
                .uc_list_at_ns
                .is_some_and(|t| now_ns >= t.saturating_add(delay));
            (copied && dp.vport.uc_list.contains(dmac))
                || (cfg.vf_policy.trusted && (dp.vport.promisc_uc || dp.vport.promisc_all))
        }
        // An L2 table of one entry means no MPFS (Linux `mlx5_mpfs_init`):
        // the port is not shared, nothing filters.
        Eswitch::Mpfs if log_max_l2_table == 0 => true,
        Eswitch::Mpfs => dp.l2_table.values().any(|m| m == dmac),
    }
}

fn vport_accepts(v: &Vport, dmac: &[u8; 6]) -> bool {
    if v.promisc_all {
        return true;
    }
    if dmac[0] & 1 == 1 {
        return *dmac == [0xff; 6] || v.promisc_mc;
    }
    v.promisc_uc || *dmac == v.mac || v.uc_list.contains(dmac)
}

impl PortSink for NicInner {
    fn receive(&self, frame: &[u8]) {
        self.stats.rx_frames.fetch_add(1, Ordering::Relaxed);
        self.rx_frame(frame, None);
    }

    fn receive_many(&self, frames: Frames<'_>) {
        self.rx_frames(frames);
    }
}

/// The RQ the last received frame went to, and its CQ, locked (RQ first)
/// for the next frames of the same run.
struct HeldRq<'dp> {
    rqn: u32,
    rq: MutexGuard<'dp, Rq>,
    cq: HeldCq<'dp>,
}

/// The CQ of a [`HeldRq`]: locked through the object table, or (if the
/// table does not hold the RQ's CQ under its number, which commands do not
/// allow) locked per frame.
enum HeldCq<'dp> {
    Table(MutexGuard<'dp, Cq>),
    Own(Arc<Mutex<Cq>>),
}

/// What a batch of received frames adds to the NIC's counters (once, at
/// its end, instead of an atomic add per frame).
#[derive(Debug, Default)]
struct RxTally {
    delivered: u64,
    bytes: u64,
    /// CQEs posted (or lost) for them, fillers and errors included.
    cqes: u64,
}

impl RxTally {
    fn add_to(&self, c: &Counters) {
        crate::stats::add_counts([
            (&c.rx_delivered, self.delivered),
            (&c.rx_bytes, self.bytes),
            (&c.rx_cqes, self.cqes),
        ]);
    }
}

fn initial_config_space(cfg: &NicConfig) -> Vec<u8> {
    let mut c = vec![0u8; CONFIG_SPACE_BYTES];
    c[0..2].copy_from_slice(&pci::MELLANOX_VENDOR_ID.to_le_bytes());
    c[2..4].copy_from_slice(&cfg.device_id.to_le_bytes());
    c[0x08] = 0; // revision
    c[0x0b] = 0x02; // class: network controller
    c[0x0a] = 0x00; // subclass: Ethernet
    c[0x10] = 0x0c; // BAR0: 64-bit prefetchable memory
    c[0x2c..0x2e].copy_from_slice(&pci::MELLANOX_VENDOR_ID.to_le_bytes());
    c[0x2e..0x30].copy_from_slice(&0x0008u16.to_le_bytes());
    // Status: capability list; one capability, MSI-X, with its table and
    // pending-bit array in BAR0 pages 3 and 4 (which read as zero).
    c[0x06] = 0x10;
    c[0x34] = MSIX_CAP as u8;
    c[MSIX_CAP] = 0x11;
    c[MSIX_CAP + 1] = 0;
    let ctrl = cfg.msix_vectors.saturating_sub(1) & 0x7ff;
    c[MSIX_CAP + 2..MSIX_CAP + 4].copy_from_slice(&ctrl.to_le_bytes());
    c[MSIX_CAP + 4..MSIX_CAP + 8].copy_from_slice(&0x3000u32.to_le_bytes());
    c[MSIX_CAP + 8..MSIX_CAP + 12].copy_from_slice(&0x4000u32.to_le_bytes());
    c
}

/// Offset of the MSI-X capability in config space.
pub const MSIX_CAP: usize = 0x40;

/// A device-model ConnectX on a fabric port. Cheap to clone (a handle).
#[derive(Clone)]
pub struct SimNic {
    pub(crate) inner: Arc<NicInner>,
}

impl fmt::Debug for SimNic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl SimNic {
    /// A new NIC (a new PCI function) plugged into a new port of `fabric`.
    pub fn new(fabric: &Fabric, cfg: NicConfig) -> SimNic {
        let fab = fabric.inner.clone();
        let function = lock(&fab.registry).new_function();
        let port = fab.add_port(None, (cfg.mac != [0; 6]).then_some(cfg.mac));
        let iommu = Arc::new(Iommu::new());
        if let Some(l) = cfg.dma_lock_limit {
            iommu.set_lock_limit(l);
        }
        let mapper: Arc<dyn DmaMapper> = Arc::new(SimMapper::new(iommu.clone()));
        let vport = Vport {
            mac: cfg.mac,
            min_inline: cfg.vport_min_inline,
            mtu: cfg.mtu,
            promisc_uc: false,
            promisc_mc: false,
            promisc_all: false,
            uc_list: Vec::new(),
            uc_list_at_ns: None,
            roce_en: false,
            disable_uc_lb: false,
            disable_mc_lb: false,
        };
        let inner = Arc::new(NicInner {
            function,
            msix: Mutex::new(Msix::default()),
            fw: Mutex::new(Firmware::new(&cfg)),
            dp: RwLock::new(Datapath::new(vport)),
            pci: Mutex::new(initial_config_space(&cfg)),
            created_ns: fab.now_ns(),
            cfg,
            fabric: fab.clone(),
            port,
            iommu,
            mapper,
            stats: Counters::default(),
            drops: Default::default(),
            health: Health::default(),
        });
        let sink: Weak<dyn PortSink> = Arc::downgrade(&inner) as Weak<dyn PortSink>;
        fab.set_sink(port, sink);
        SimNic { inner }
    }

    /// Deferred gather ([`NicConfig::deferred_tx`]): the NIC reads the
    /// held WQEs whose delay has passed on the fabric clock, as a step of
    /// time would have it do (a harness that moves the clock calls this;
    /// doorbells and the driver's waits do it themselves).
    pub fn release_deferred_tx(&self) {
        self.inner.release_deferred_tx(false);
    }

    /// The backend the driver talks to.
    pub fn backend(&self) -> SimBackend {
        SimBackend {
            nic: self.inner.clone(),
        }
    }

    /// The switch port this NIC is plugged into.
    pub fn port(&self) -> PortId {
        self.inner.port
    }

    /// PCI function number (unique per fabric).
    pub fn function(&self) -> u32 {
        self.inner.function
    }

    /// The configuration.
    pub fn config(&self) -> &NicConfig {
        &self.inner.cfg
    }

    /// The vport MAC now (MODIFY_NIC_VPORT_CONTEXT may change it).
    pub fn mac(&self) -> [u8; 6] {
        read(&self.inner.dp).vport.mac
    }

    /// The model's DMA mapper (same as `backend().dma_mapper()`).
    pub fn dma_mapper(&self) -> Arc<dyn DmaMapper> {
        self.inner.mapper.clone()
    }

    /// Counters, including drops by reason and IOMMU counters.
    pub fn stats(&self) -> NicStats {
        self.inner
            .stats
            .snapshot(&self.inner.drops, self.inner.iommu.stats())
    }

    /// Drops of one reason.
    pub fn drops(&self, r: DropReason) -> u64 {
        DropReason::ALL
            .iter()
            .position(|x| *x == r)
            .map_or(0, |i| self.inner.drops[i].load(Ordering::Relaxed))
    }

    /// Every EQ, CQ, SQ and RQ with its counters.
    pub fn queues(&self) -> Queues {
        let dp = read(&self.inner.dp);
        Queues {
            eqs: dp.eqs.values().map(|e| lock(e).info()).collect(),
            cqs: dp.cqs.values().map(|c| lock(c).info()).collect(),
            sqs: dp.sqs.values().map(|s| lock(s).info()).collect(),
            rqs: dp.rqs.values().map(|r| lock(r).info()).collect(),
        }
    }

    /// Object table sizes.
    pub fn objects(&self) -> ObjectCounts {
        read(&self.inner.dp).counts()
    }

    /// The command log (oldest first, bounded by `command_log_capacity`).
    pub fn command_log(&self) -> Vec<CommandRecord> {
        lock(&self.inner.fw).log.iter().cloned().collect()
    }

    /// HCA state.
    pub fn hca_state(&self) -> HcaState {
        lock(&self.inner.fw).hca
    }

    /// Pages the firmware holds.
    pub fn pages_held(&self) -> usize {
        lock(&self.inner.fw).pages.total()
    }

    /// Live IOMMU mappings.
    pub fn dma_mappings(&self) -> Vec<MappingInfo> {
        self.inner.iommu.mappings()
    }

    /// The most recent DMA fault.
    pub fn last_dma_fault(&self) -> Option<DmaFault> {
        self.inner.iommu.last_fault()
    }

    /// The MSI-X vector the host routed, while MSI-X is enabled.
    pub fn msix_routed(&self) -> Option<u16> {
        let m = *lock(&self.inner.msix);
        if m.enabled { m.routed } else { None }
    }

    /// True while PCI bus mastering is enabled.
    pub fn bus_master(&self) -> bool {
        self.inner.iommu.bus_master()
    }

    /// Applies a device-side fault injection.
    pub fn inject(&self, what: Injection) -> Result<(), InjectError> {
        crate::inject::apply(&self.inner, what)
    }
}
