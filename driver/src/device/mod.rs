//! A brought-up mlx5 function: bring-up in rdma-core's VFIO-provider order,
//! capability checks, the polled EQ and firmware pages, the shared objects
//! (UAR, PD, transport domain, mkey, NIC RX flow table), the health check,
//! and a complete teardown (also on drop and on bring-up failure).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use mempool::{DmaError, DmaMapper, DmaMapping, RegionOptions};

use crate::bar::Bar;
use crate::cmd::{CmdQueue, CmdStats, SlotKind};
use crate::dma::{DmaMem, DmaPool, PAGE};
use crate::eq::EventQueue;
use crate::error::{Error, HealthProblem};
use crate::hw::{HwBackend, pci};
use crate::pages::FwPages;
use crate::prm::cmd::*;
use crate::prm::codes::{
    EventType, Opcode, cap_type, flow, inline_mode, manage_pages_op_mod, pages_op_mod, reg,
    ts_format, ts_format_cap,
};
use crate::prm::cqe::EqeDecoded;
use crate::prm::ctx::*;
use crate::prm::init_seg::{self, HealthBuffer, InitSeg};
use crate::prm::{Layout, View, ViewMut};

/// Pages per MANAGE_PAGES command (keeps the mailbox chain at 8 pages).
const PAGES_PER_CMD: usize = 512;
/// Bytes of a capability block in QUERY/SET_HCA_CAP.
const CAP_BYTES: usize = 0x1000;
/// ConnectX-4 and ConnectX-4 Lx and their VFs: the devices that need the
/// L2 header inline when the vport context cannot say (DPDK's device-id
/// fallback).
const CX4_FAMILY_IDS: &[u16] = &[0x1013, 0x1014, 0x1015, 0x1016];
/// The MSI-X vector of the (polled) EQ.
const EQ_VECTOR: u16 = 0;
/// The longest frame the device may place in a receive stride: eRPC's
/// 1024-byte frames, one per 1 KiB stride. The RX count turns stride
/// positions into packets, so a longer frame (two strides) or a filler
/// CQE would be miscounted: the vport MTU keeps them out.
pub const MAX_RX_FRAME: usize = 1024;
/// The vport MTU the driver programs: [`MAX_RX_FRAME`] plus the 4-byte
/// FCS. The hardware's MTU is a frame length counting the FCS (Linux
/// `mlx5e_set_mtu` writes software MTU + 22: Ethernet header, one VLAN tag,
/// FCS); no VLAN allowance is added, so a tagged frame is also at most
/// 1024 bytes in memory.
pub const VPORT_MTU: u16 = MAX_RX_FRAME as u16 + 4;

/// Bring-up settings.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Hugepage policy for device memory (queues, mailboxes, firmware pages).
    pub region: RegionOptions,
    /// Longest wait for the `initializing` bit to clear (rdma-core: 120 s).
    pub init_timeout: Duration,
    /// log2 of the NIC RX flow table size: the most queue sets (UDP ports)
    /// steered at once.
    pub flow_table_log_size: u8,
    /// The PF trusts this VF (`ip link set <pf> vf <n> trust on`), so it
    /// honours the VF's promiscuous request. A VF cannot query it; without
    /// this, `promiscuous` on a VF is refused (the PF would ignore it).
    pub vf_trusted: bool,
    /// Ask for unicast promiscuous mode. Off by default: the driver
    /// programs its MAC into the vport address list (and the MPFS L2 table
    /// on an e-switch manager), which is what makes unicast reach it.
    pub promiscuous: bool,
    /// What to do when the function has no MAC (the permanent address
    /// reads as zero, as on a VF nobody gave one).
    pub mac_if_unset: MacIfUnset,
    /// Longest wait after INIT_HCA for the link to come up (the vport
    /// state to read up): frames sent before are lost. Zero: do not wait
    /// (bring-up then only logs a warning if the link is down).
    pub link_up_timeout: Duration,
    /// Expose the device and its queue sets on the process's debug
    /// endpoint (`erpc-inspect`; see [`crate::inspect`]). Off by default;
    /// `ERPC_INSPECT=1` in the environment turns it on too. If the
    /// endpoint cannot start (no writable socket directory), bring-up
    /// logs a warning and goes on without it.
    pub inspect: bool,
}

/// The MAC to use when the vport's permanent address is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MacIfUnset {
    /// A random locally administered unicast MAC, with a warning (what
    /// Linux mlx5e does: `eth_hw_addr_random`).
    #[default]
    Random,
    /// This MAC.
    Use([u8; 6]),
    /// Fail bring-up with [`Error::NoMac`].
    Refuse,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            region: RegionOptions::default(),
            init_timeout: Duration::from_secs(120),
            flow_table_log_size: 8,
            promiscuous: false,
            vf_trusted: false,
            mac_if_unset: MacIfUnset::Random,
            link_up_timeout: Duration::from_secs(10),
            inspect: false,
        }
    }
}

/// How much of the L2 header a send WQE must carry inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InlineMode {
    /// Nothing needs to be inlined.
    None,
    /// The first 18 bytes (L2 header) must be inlined.
    L2,
    /// Up to the IP header (not supported by this driver).
    Ip,
    /// Up to the L4 header (not supported by this driver).
    L4,
}

/// What bring-up learned about the device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Backend name (`vfio 0000:03:00.0`, `sim nic 1`).
    pub name: String,
    /// Firmware version major.minor.subminor.
    pub fw_version: (u16, u16, u16),
    /// The function's MAC address.
    pub mac: [u8; 6],
    /// Required send inline mode.
    pub inline_mode: InlineMode,
    /// Link state from QUERY_VPORT_STATE (1 = up).
    pub vport_state: u8,
    /// Protection domain.
    pub pd: u32,
    /// Transport domain.
    pub td: u32,
    /// lkey of the physical-address mkey covering all DMA memory.
    pub lkey: u32,
    /// EQ number (CQs report to it).
    pub eqn: u8,
    /// BlueFlame register size in bytes (0 if no BlueFlame).
    pub bf_reg_size: usize,
    /// log2 of the largest WQ.
    pub log_max_wq_sz: u8,
    /// log2 of the largest CQ.
    pub log_max_cq_sz: u8,
    /// Striding RQ with 2^3..2^8 strides supported.
    pub ext_stride_num_range: bool,
    /// log2 of the smallest striding-RQ WQE (strides × stride bytes) the
    /// device accepts (general-2 cap, or DPDK's default 14).
    pub log_min_stride_wqe_sz: u8,
    /// Q counter sets the function may allocate (`max_qp_cnt`, read after
    /// INIT_HCA); 0: queue sets go without one.
    pub max_q_counters: u32,
    /// CQE version in use.
    pub cqe_version: u8,
    /// Ethernet cap `wqe_inline_mode`; `sqc.min_wqe_inline_mode` is set
    /// only when it is VPORT_CONTEXT (as Linux and DPDK do).
    pub wqe_inline_mode_cap: u8,
    /// `sqc.ts_format` the SQs use.
    pub sq_ts_format: u8,
    /// `rqc.ts_format` the RQs use.
    pub rq_ts_format: u8,
    /// NIC RX flow table cap `reset_root_to_default`.
    pub reset_root_to_default: bool,
    /// PCI device id.
    pub pci_device_id: u16,
    /// A virtual function (from the device id).
    pub is_vf: bool,
    /// A BlueField embedded-CPU function (ECPF), from the init segment.
    pub embedded_cpu: bool,
    /// The function id firmware names for page management.
    pub func: FuncId,
}

/// The function a page request or MANAGE_PAGES is for: firmware names it
/// in QUERY_PAGES and in page-request EQEs, and MANAGE_PAGES must echo it
/// (rdma-core and Linux `pagealloc.c` do). A PF is usually 0, a VF or an
/// embedded-CPU function is not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuncId {
    /// `embedded_cpu_function` / `ec_function`.
    pub ec: bool,
    /// `function_id` / `func_id`.
    pub id: u16,
}

impl FuncId {
    /// One number per function (`ec << 16 | id`, as Linux keys its pages).
    pub fn key(self) -> u32 {
        (u32::from(self.ec) << 16) | u32::from(self.id)
    }

    /// The inverse of [`FuncId::key`].
    pub fn from_key(k: u32) -> FuncId {
        FuncId {
            ec: k >> 16 != 0,
            id: k as u16,
        }
    }
}

/// How long teardown keeps asking for pages back while the firmware makes
/// no progress (Linux `mlx5_reclaim_startup_pages`: a budget that restarts
/// whenever pages come back).
pub const PAGE_RECLAIM_BUDGET: Duration = Duration::from_secs(5);

/// QUERY_VPORT_STATE `state` of a link that is up.
const VPORT_STATE_UP: u8 = 1;

/// How often the heartbeat is sampled (rdma-core `POLL_HEALTH_INTERVAL`).
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(1000);
/// Samples without a heartbeat change that mean the firmware is stuck
/// (rdma-core `MAX_MISSES`).
pub const HEALTH_MAX_MISSES: u32 = 3;

/// Health state between checks.
#[derive(Debug, Default, Clone, Copy)]
struct HealthState {
    /// Time and counter of the last heartbeat sample.
    last_sample: Option<(Duration, u32)>,
    /// Consecutive samples without a change.
    misses: u32,
    /// The last non-fatal syndrome logged.
    warned_syndrome: u8,
}

/// A snapshot of the health registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// `health.synd` (0 = healthy).
    pub syndrome: u8,
    /// `health.ext_synd`.
    pub ext_syndrome: u16,
    /// Heartbeat counter.
    pub counter: u32,
    /// `nic_interface` state.
    pub nic_interface: u32,
    /// `fw_ver` from the health buffer.
    pub fw_ver: u32,
    /// Reset-required flag.
    pub rfr: bool,
}

impl Health {
    /// What makes these registers fatal, the way rdma-core's
    /// `mlx5_vfio_poll_health` judges them (the heartbeat aside, which
    /// needs samples over time): the device is gone (`fw_ver` reads
    /// all-ones), the NIC interface is disabled or in software reset, or a
    /// syndrome is set with reset-required.
    pub fn fatal(&self) -> Option<HealthProblem> {
        if self.fw_ver == 0xffff_ffff {
            Some(HealthProblem::Gone)
        } else if self.nic_interface == init_seg::NIC_IFC_DISABLED
            || self.nic_interface == init_seg::NIC_IFC_SW_RESET
        {
            Some(HealthProblem::NicInterface(self.nic_interface))
        } else if self.rfr && self.syndrome != 0 {
            Some(HealthProblem::syndrome(self.syndrome, self.ext_syndrome))
        } else {
            None
        }
    }
}

/// Reads the health registers (health buffer, heartbeat, `nic_interface`).
pub(crate) fn read_health_regs<B: HwBackend>(bar: &Bar<B>) -> Health {
    let hb = InitSeg::HEALTH.byte();
    let synd_dw = bar.read32(hb + HealthBuffer::IRISC_INDEX.dword());
    Health {
        syndrome: (synd_dw >> HealthBuffer::SYND.shift()) as u8,
        ext_syndrome: (synd_dw >> HealthBuffer::EXT_SYND.shift()) as u16,
        counter: bar.read32(InitSeg::HEALTH_COUNTER.dword()) & init_seg::HEALTH_COUNTER_MASK,
        nic_interface: (bar.read32(InitSeg::CMDQ_ADDR_L_SZ.dword()) >> init_seg::NIC_IFC_SHIFT)
            & init_seg::NIC_IFC_MASK,
        fw_ver: bar.read32(hb + HealthBuffer::FW_VER.dword()),
        rfr: (bar.read32(hb + HealthBuffer::RFR_SEVERITY.dword())
            >> HealthBuffer::RFR_SEVERITY.shift()) as u8
            & init_seg::RFR_BIT
            != 0,
    }
}

/// The NIC RX steering objects shared by all queue sets.
#[derive(Debug)]
pub(crate) struct FlowTable {
    pub table_id: u32,
    pub group_id: u32,
    /// UDP port steered by each entry.
    pub ports: Vec<Option<u16>>,
}

/// An object to destroy at teardown, in reverse creation order.
#[derive(Debug, Clone, Copy)]
enum Obj {
    Uar(u32),
    /// Our MAC in the vport's unicast address list.
    VportMacList,
    /// Our MAC in the MPFS L2 table, at this index.
    L2Entry(u32),
    Msix,
    Eq(u8),
    Pd(u32),
    Td(u32),
    Mkey(u32),
    FlowTable(u32),
    FlowGroup(u32, u32),
    FlowRoot,
}

/// Mutable control-path state, behind one lock.
pub(crate) struct Ctl {
    pub cmdq: CmdQueue,
    pub eq: Option<EventQueue>,
    pub pages: FwPages,
    /// The function QUERY_PAGES named (pages are given and taken for it).
    pub func: FuncId,
    /// Flow table cap `reset_root_to_default` (NIC RX).
    reset_root_to_default: bool,
    pub flow: Option<FlowTable>,
    objects: Vec<Obj>,
    health: HealthState,
    pub cq_errors: Vec<(u32, u8)>,
    /// Page requests the driver could not meet (answered CANT_GIVE).
    pub pages_refused: u64,
    /// The function is a BlueField embedded-CPU function (init segment).
    pub ecpf: bool,
    enabled: bool,
    initialized: bool,
}

pub(crate) struct Inner<B: HwBackend> {
    pub bar: Bar<B>,
    pub pool: Arc<DmaPool>,
    /// The control state, on its own cache lines: every queue set's thread
    /// try-locks it now and then (`QueueSet::poll_control`), and that
    /// write must not evict the read-mostly fields every doorbell reads.
    pub ctl: CachePadded<Mutex<Ctl>>,
    pub info: DeviceInfo,
    /// The debug endpoint registration, if exposed.
    pub inspect: Option<crate::inspect::DeviceInspect<B>>,
}

/// An mlx5 function brought up and ready to create queue sets.
///
/// Cheap to clone (shared); queue sets keep the device alive. The device is
/// torn down when the last handle and queue set are gone, or explicitly
/// with [`Device::close`], which reports errors.
pub struct Device<B: HwBackend> {
    pub(crate) inner: Arc<Inner<B>>,
}

impl<B: HwBackend> Clone for Device<B> {
    fn clone(&self) -> Self {
        Device {
            inner: self.inner.clone(),
        }
    }
}

impl<B: HwBackend> std::fmt::Debug for Device<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.inner.info.name)
    }
}

/// A typed command input buffer.
pub(crate) fn input<I: Layout>(op: Opcode, op_mod: u16, extra: usize) -> Vec<u8> {
    let mut v = vec![0u8; I::BYTES.max(16) + extra];
    let mut h = ViewMut::<MboxIn>::new(&mut v).expect("16 bytes");
    h.set(MboxIn::OPCODE, op as u64)
        .set(MboxIn::OP_MOD, op_mod as u64);
    v
}

/// Output length of a command with output layout `O` plus `extra` bytes.
pub(crate) fn out_len<O: Layout>(extra: usize) -> usize {
    O::BYTES.max(16) + extra
}

impl Ctl {
    /// Runs a command from a general slot, answering page requests while
    /// it is in flight. A failure to answer an event is logged and counted
    /// (`CmdStats::service_errors`), never returned as this command's: the
    /// command itself still completes (or fails) on its own.
    pub(crate) fn exec<B: HwBackend>(
        &mut self,
        bar: &Bar<B>,
        pool: &Arc<DmaPool>,
        input: &[u8],
        out_len: usize,
    ) -> Result<Vec<u8>, Error> {
        let Ctl {
            cmdq,
            eq,
            pages,
            cq_errors,
            pages_refused,
            ..
        } = self;
        cmdq.exec(bar, pool, SlotKind::General, input, out_len, |cmdq| {
            if let Some(eq) = eq.as_mut()
                && let Err(e) = service_events(cmdq, eq, pages, cq_errors, pages_refused, bar, pool)
                {
                    cmdq.note_service_error();
                    tracing::error!(device = %bar.name(), error = %e, "servicing the event queue during a command failed; the command goes on");
                }
        })
    }

    /// Polls the EQ once (outside a command).
    pub(crate) fn service<B: HwBackend>(
        &mut self,
        bar: &Bar<B>,
        pool: &Arc<DmaPool>,
    ) -> Result<(), Error> {
        let Ctl {
            cmdq,
            eq,
            pages,
            cq_errors,
            pages_refused,
            ..
        } = self;
        match eq.as_mut() {
            Some(eq) => service_events(cmdq, eq, pages, cq_errors, pages_refused, bar, pool),
            None => Ok(()),
        }
    }
}

/// Handles every pending EQE: page requests are answered from the pages
/// slot; CQ errors are recorded for the queue sets to report. A page
/// request the driver cannot meet for lack of memory is answered with
/// MANAGE_PAGES CANT_GIVE (Linux `page_notify_fail`), so that firmware
/// stops waiting for the pages; one the firmware itself refuses is
/// dropped (Linux `give_pages` in event context). Every pending event is
/// handled; the first failure is returned.
fn service_events<B: HwBackend>(
    cmdq: &mut CmdQueue,
    eq: &mut EventQueue,
    pages: &mut FwPages,
    cq_errors: &mut Vec<(u32, u8)>,
    pages_refused: &mut u64,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
) -> Result<(), Error> {
    let mut handled = 0;
    let mut first = None;
    while let Some(e) = eq.poll() {
        handled += 1;
        if let Some((ec, id, n)) = e.page_request_for() {
            let func = FuncId { ec, id };
            tracing::debug!(num_pages = n, ?func, "firmware page request");
            let r = if n > 0 {
                match give_pages(cmdq, pages, bar, pool, n as usize, func, true) {
                    Err(e @ Error::FirmwarePages { .. }) => {
                        *pages_refused += 1;
                        tracing::error!(device = %bar.name(), error = %e, "firmware page request refused (CANT_GIVE)");
                        Ok(())
                    }
                    r => r,
                }
            } else if n < 0 {
                take_pages(cmdq, pages, bar, pool, n.unsigned_abs() as usize, func).map(|_| ())
            } else {
                Ok(())
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        } else if let Some((cqn, synd)) = e.cq_error() {
            tracing::warn!(cqn, syndrome = synd, "CQ error event");
            cq_errors.push((cqn, synd));
        } else if e.event_type != EventType::PortChange as u8 {
            tracing::debug!(event = %e, "unexpected event");
        }
        if handled >= 64 {
            break;
        }
    }
    eq.publish(bar, true);
    first.map_or(Ok(()), Err)
}

/// Fills in the function a MANAGE_PAGES is for.
fn set_func(v: &mut ViewMut<'_, ManagePagesIn>, func: FuncId) {
    v.set(ManagePagesIn::EMBEDDED_CPU_FUNCTION, u64::from(func.ec))
        .set(ManagePagesIn::FUNCTION_ID, u64::from(func.id));
}

/// MANAGE_PAGES GIVE of `n` pages for `func`, in batches. `event`: the
/// request came as an event (not QUERY_PAGES during bring-up); then, if
/// memory runs out, firmware is told with CANT_GIVE (Linux
/// `page_notify_fail`), and a GIVE the firmware refuses is dropped rather
/// than returned (Linux `give_pages`: an event's GIVE failed by firmware
/// is ignored).
fn give_pages<B: HwBackend>(
    cmdq: &mut CmdQueue,
    pages: &mut FwPages,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    n: usize,
    func: FuncId,
    event: bool,
) -> Result<(), Error> {
    // Every page first (as Linux `give_pages` does), so that a request
    // memory cannot meet leaves nothing half given.
    let all = match pages.take_for_firmware(pool, n, func.key()) {
        Ok(a) => a,
        Err(Error::Memory(source)) => {
            // What was reserved on the way is of no use now.
            pool.release_unused();
            if event {
                cant_give(cmdq, bar, pool, func);
            }
            return Err(Error::FirmwarePages {
                device: bar.name(),
                wanted: n,
                given: 0,
                source,
            });
        }
        Err(e) => return Err(e),
    };
    for (k, addrs) in all.chunks(PAGES_PER_CMD).enumerate() {
        let batch = addrs.len();
        let mut inp =
            input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::GIVE, batch * 8);
        {
            let mut v = ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized");
            v.set(ManagePagesIn::INPUT_NUM_ENTRIES, batch as u64);
            set_func(&mut v, func);
            for (i, a) in addrs.iter().enumerate() {
                assert!(v.set_flex(ManagePagesIn::PAS, i as u32, *a));
            }
        }
        if let Err(e) = cmdq.exec(
            bar,
            pool,
            SlotKind::Pages,
            &inp,
            out_len::<ManagePagesOut>(0),
            |_| {},
        ) {
            let given = k * PAGES_PER_CMD;
            pages.unwind(&all[given..]);
            pages.trim();
            if event && matches!(e, Error::Command { .. }) {
                tracing::warn!(device = %bar.name(), error = %e, given, wanted = n, ?func, "firmware refused the pages it asked for; dropping the rest of the request");
                return Ok(());
            }
            return Err(e);
        }
    }
    Ok(())
}

/// MANAGE_PAGES op_mod CANT_GIVE for `func`: the driver cannot supply the
/// pages firmware asked for. Best effort: a failure is only logged.
fn cant_give<B: HwBackend>(cmdq: &mut CmdQueue, bar: &Bar<B>, pool: &Arc<DmaPool>, func: FuncId) {
    let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::CANNOT_GIVE, 0);
    set_func(
        &mut ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized"),
        func,
    );
    if let Err(e) = cmdq.exec(
        bar,
        pool,
        SlotKind::Pages,
        &inp,
        out_len::<ManagePagesOut>(0),
        |_| {},
    ) {
        tracing::error!(device = %bar.name(), error = %e, "MANAGE_PAGES CANT_GIVE failed");
    }
}

/// MANAGE_PAGES TAKE of up to `n` pages from `func`; returns how many
/// came back.
fn take_pages<B: HwBackend>(
    cmdq: &mut CmdQueue,
    pages: &mut FwPages,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    n: usize,
    func: FuncId,
) -> Result<usize, Error> {
    let mut got = 0;
    let mut left = n;
    while left > 0 {
        let batch = left.min(PAGES_PER_CMD);
        let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::TAKE, 0);
        {
            let mut v = ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized");
            v.set(ManagePagesIn::INPUT_NUM_ENTRIES, batch as u64);
            set_func(&mut v, func);
        }
        let out = cmdq.exec(
            bar,
            pool,
            SlotKind::Pages,
            &inp,
            out_len::<ManagePagesOut>(batch * 8),
            |_| {},
        )?;
        let v = View::<ManagePagesOut>::new(&out).expect("sized");
        let returned = (v.get32(ManagePagesOut::OUTPUT_NUM_ENTRIES) as usize).min(batch);
        for i in 0..returned {
            let addr = v.flex(ManagePagesOut::PAS, i as u32).unwrap_or(0);
            if let Err(bad) = pages.returned(addr) {
                tracing::error!(iova = bad.0, "firmware returned a page it was never given");
            }
        }
        got += returned;
        if returned < batch {
            break;
        }
        left -= batch;
    }
    Ok(got)
}

impl<B: HwBackend> Device<B> {
    /// Brings the function up (facts sheet §8 steps 1–3, plus the shared
    /// NIC RX flow table). On failure, everything already created is torn
    /// down again before the error is returned.
    pub fn open(backend: B, config: DeviceConfig) -> Result<Device<B>, Error> {
        let bar = Bar::new(backend);
        let name = bar.name();
        let pool = DmaPool::new(bar.backend().dma_mapper(), config.region);
        // The kernel's order: bus mastering, wait for the firmware to come
        // out of reset (vfio-pci resets the function when it is opened;
        // until `initializing` clears, the firmware ignores the command
        // queue address), program the command queue, wait again.
        enable_bus_master(&bar)?;
        wait_ready(&bar, config.init_timeout, "firmware start after reset")?;
        let cmdq = CmdQueue::setup(&bar, &pool)?;
        let mut ctl = Ctl {
            cmdq,
            eq: None,
            pages: FwPages::default(),
            func: FuncId::default(),
            reset_root_to_default: false,
            flow: None,
            objects: Vec::new(),
            health: HealthState::default(),
            cq_errors: Vec::new(),
            pages_refused: 0,
            ecpf: false,
            enabled: false,
            initialized: false,
        };
        match bring_up(&bar, &pool, &mut ctl, &config) {
            Ok(info) => {
                let inspect = config.inspect || debug_endpoint::env_enabled();
                Ok(Device {
                    inner: Arc::new_cyclic(|weak| Inner {
                        inspect: inspect
                            .then(|| {
                                crate::inspect::DeviceInspect::register(
                                    weak.clone(),
                                    &info.name,
                                    info.mac,
                                )
                            })
                            .flatten(),
                        bar,
                        pool,
                        ctl: CachePadded::new(Mutex::new(ctl)),
                        info,
                    }),
                })
            }
            Err(e) => {
                tracing::error!(device = %name, error = %e, "bring-up failed; tearing down");
                if let Err(t) = teardown(&bar, &pool, &mut ctl) {
                    tracing::error!(device = %name, error = %t, "teardown after failed bring-up also failed");
                }
                Err(e)
            }
        }
    }

    /// What bring-up learned.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// A DMA mapper for application memory (message buffers) that stamps the
    /// device's lkey into every mapping, so buffers carry what data
    /// segments need.
    pub fn dma_mapper(&self) -> Arc<dyn DmaMapper> {
        Arc::new(LkeyMapper {
            inner: self.inner.bar.backend().dma_mapper(),
            lkey: self.inner.info.lkey,
        })
    }

    /// Reads the health registers and checks them the way rdma-core's
    /// `mlx5_vfio_poll_health` does. Fatal only on the documented
    /// conditions: the device is gone (`fw_ver` reads all-ones), the NIC
    /// interface is disabled or in software reset, or a syndrome with the
    /// reset-required flag (RFR) set. A syndrome without RFR is reported in
    /// [`Health::syndrome`] and logged, not fatal. The heartbeat is sampled
    /// at most once per [`HEALTH_POLL_INTERVAL`] (calls in between do not
    /// count), and the firmware is stalled only after
    /// [`HEALTH_MAX_MISSES`] samples in a row saw no change. Cheap; callable
    /// at any rate.
    pub fn check_health(&self) -> Result<Health, Error> {
        let h = self.read_health();
        let mut ctl = self.inner.lock();
        let device = self.inner.info.name.clone();
        let fail = |why| {
            Err(Error::Unhealthy {
                device: device.clone(),
                why,
            })
        };
        if let Some(why) = h.fatal() {
            return fail(why);
        }
        let st = &mut ctl.health;
        if h.syndrome != 0 && h.syndrome != st.warned_syndrome {
            tracing::warn!(device = %device, problem = %HealthProblem::syndrome(h.syndrome, h.ext_syndrome), "health syndrome without reset-required: not fatal");
        }
        st.warned_syndrome = h.syndrome;
        let now = self.inner.bar.backend().now();
        match st.last_sample {
            Some((at, _)) if now.saturating_sub(at) < HEALTH_POLL_INTERVAL => {}
            Some((_, counter)) => {
                if counter == h.counter {
                    st.misses += 1;
                } else {
                    st.misses = 0;
                }
                st.last_sample = Some((now, h.counter));
            }
            None => st.last_sample = Some((now, h.counter)),
        }
        if st.misses >= HEALTH_MAX_MISSES {
            return fail(HealthProblem::Stalled {
                counter: h.counter,
                checks: st.misses,
            });
        }
        Ok(h)
    }

    /// The health registers, without judging them.
    pub fn read_health(&self) -> Health {
        read_health_regs(&self.inner.bar)
    }

    /// Page requests the driver could not meet for lack of memory (each
    /// answered with MANAGE_PAGES CANT_GIVE).
    pub fn page_requests_refused(&self) -> u64 {
        self.inner.lock().pages_refused
    }

    /// Services the event queue (page requests, CQ errors) outside a
    /// command. Queue sets do this from the datapath
    /// ([`crate::QueueSet::poll_control`]); a control loop may call it too.
    pub fn poll_events(&self) -> Result<(), Error> {
        let inner = &self.inner;
        inner.lock().service(&inner.bar, &inner.pool)
    }

    /// Pages firmware holds right now.
    pub fn firmware_pages(&self) -> usize {
        self.inner.lock().pages.given()
    }

    /// Command counters.
    pub fn command_stats(&self) -> CmdStats {
        self.inner.lock().cmdq.stats()
    }

    /// Events seen on the EQ, by event type.
    pub fn event_counts(&self) -> [u64; 32] {
        self.inner
            .lock()
            .eq
            .as_ref()
            .map(|e| e.counts)
            .unwrap_or([0; 32])
    }

    /// The last event, decoded.
    pub fn last_event(&self) -> Option<EqeDecoded> {
        self.inner.lock().eq.as_ref().and_then(|e| e.last)
    }

    /// QUERY_EQ: (consumer counter, producer counter, state) as hardware sees them.
    pub fn query_eq(&self) -> Result<(u32, u32, u8), Error> {
        let inner = &self.inner;
        let mut ctl = inner.lock();
        let eqn = ctl.eq.as_ref().map(|e| e.eqn).unwrap_or(0);
        let mut inp = input::<QueryEqIn>(Opcode::QueryEq, 0, 0);
        ViewMut::<QueryEqIn>::new(&mut inp)
            .expect("sized")
            .set(QueryEqIn::EQ_NUMBER, eqn as u64);
        let out = ctl.exec(&inner.bar, &inner.pool, &inp, out_len::<QueryEqOut>(0))?;
        let v = View::<QueryEqOut>::new(&out).expect("sized");
        let c = v.sub(QueryEqOut::EQC);
        Ok((
            c.get32(Eqc::CONSUMER_COUNTER),
            c.get32(Eqc::PRODUCER_COUNTER),
            c.get32(Eqc::ST) as u8,
        ))
    }

    /// Tears the device down now and reports what failed. Every queue set
    /// must have been dropped first (otherwise this returns an error and
    /// leaves the device up).
    pub fn close(self) -> Result<(), Error> {
        // The debug endpoint's thread must not hold the device meanwhile.
        if let Some(i) = &self.inner.inspect {
            i.detach();
        }
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(i) => i,
            Err(arc) => {
                if let Some(i) = &arc.inspect {
                    i.attach(Arc::downgrade(&arc));
                }
                return Err(Error::Config(format!(
                    "{}: close() with {} other handles or queue sets alive",
                    arc.info.name,
                    Arc::strong_count(&arc) - 1
                )));
            }
        };
        inner.close()
    }

    /// DMA pool counters (pages used by queues, mailboxes, firmware).
    pub fn dma_stats(&self) -> crate::dma::PoolStats {
        self.inner.pool.stats()
    }
}

impl<B: HwBackend> Inner<B> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a command.
    pub(crate) fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, Error> {
        self.lock().exec(&self.bar, &self.pool, input, out_len)
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<DmaMem, Error> {
        self.pool.alloc(bytes)
    }

    fn close(mut self) -> Result<(), Error> {
        let ctl = self.ctl.get_mut().unwrap_or_else(|p| p.into_inner());
        // teardown() clears `enabled`, so Drop has nothing left to do.
        teardown(&self.bar, &self.pool, ctl)
    }
}

impl<B: HwBackend> Drop for Inner<B> {
    fn drop(&mut self) {
        let ctl = self.ctl.get_mut().unwrap_or_else(|p| p.into_inner());
        if ctl.enabled
            && let Err(e) = teardown(&self.bar, &self.pool, ctl)
        {
            tracing::error!(device = %self.info.name, error = %e, "teardown on drop failed");
        }
    }
}

/// Maps through the backend and stamps the device's lkey.
#[derive(Debug)]
struct LkeyMapper {
    inner: Arc<dyn DmaMapper>,
    lkey: u32,
}

impl DmaMapper for LkeyMapper {
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        // SAFETY: the caller's obligations are those of the inner mapper.
        let mut m = unsafe { self.inner.map(va, len) }?;
        m.lkey = self.lkey;
        Ok(m)
    }

    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError> {
        self.inner.unmap(va, mapping)
    }
}

/// ENABLE_HCA or DISABLE_HCA of our own function (0), with
/// `embedded_cpu_function` set on an ECPF (the two inputs share a layout).
fn enable_hca<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
) -> Result<(), Error> {
    const _: () = assert!(
        EnableHcaIn::EMBEDDED_CPU_FUNCTION.bit() == DisableHcaIn::EMBEDDED_CPU_FUNCTION.bit()
    );
    let mut inp = input::<EnableHcaIn>(op, 0, 0);
    ViewMut::<EnableHcaIn>::new(&mut inp)
        .expect("sized")
        .set(EnableHcaIn::EMBEDDED_CPU_FUNCTION, u64::from(ctl.ecpf));
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// QUERY_PAGES for our own function: the function firmware names (to echo
/// in MANAGE_PAGES) and how many pages it wants.
fn query_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op_mod: u16,
) -> Result<(FuncId, i32), Error> {
    let mut inp = input::<QueryPagesIn>(Opcode::QueryPages, op_mod, 0);
    ViewMut::<QueryPagesIn>::new(&mut inp)
        .expect("sized")
        .set(QueryPagesIn::EMBEDDED_CPU_FUNCTION, u64::from(ctl.ecpf));
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryPagesOut>(0))?;
    let v = View::<QueryPagesOut>::new(&out).expect("sized");
    let func = FuncId {
        ec: v.get32(QueryPagesOut::EMBEDDED_CPU_FUNCTION) == 1,
        id: v.get32(QueryPagesOut::FUNCTION_ID) as u16,
    };
    Ok((func, v.get32(QueryPagesOut::NUM_PAGES) as i32))
}

fn satisfy_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op_mod: u16,
) -> Result<(), Error> {
    let (func, n) = query_pages(bar, pool, ctl, op_mod)?;
    ctl.func = func;
    if n > 0 {
        give_pages(
            &mut ctl.cmdq,
            &mut ctl.pages,
            bar,
            pool,
            n as usize,
            func,
            false,
        )?;
    }
    Ok(())
}

fn query_cap<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    cap: u16,
    current: bool,
) -> Result<Vec<u8>, Error> {
    let op_mod = (cap << 1) | u16::from(current);
    let inp = input::<QueryHcaCapIn>(Opcode::QueryHcaCap, op_mod, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryHcaCapOut>(0))?;
    let at = QueryHcaCapOut::CMD_HCA_CAP.byte();
    Ok(out[at..at + CAP_BYTES].to_vec())
}

/// Memory space and bus master on, keeping the other command bits.
fn enable_bus_master<B: HwBackend>(bar: &Bar<B>) -> Result<(), Error> {
    let mut cmd = [0u8; 2];
    let pci_err = |what, source| Error::Pci {
        device: bar.name(),
        what,
        source,
    };
    bar.backend()
        .config_read(pci::COMMAND, &mut cmd)
        .map_err(|e| pci_err("read of the command register", e))?;
    let v = u16::from_le_bytes(cmd) | pci::COMMAND_MEMORY | pci::COMMAND_MASTER;
    bar.backend()
        .config_write(pci::COMMAND, &v.to_le_bytes())
        .map_err(|e| pci_err("write of the command register", e))
}

/// Polls `initializing` (2 ms steps, as rdma-core) until it clears.
fn wait_ready<B: HwBackend>(bar: &Bar<B>, timeout: Duration, what: &str) -> Result<(), Error> {
    let step = Duration::from_millis(2);
    let mut waited = Duration::ZERO;
    while bar.read32(InitSeg::INITIALIZING.dword()) & init_seg::INITIALIZING_BIT != 0 {
        if waited >= timeout {
            return Err(Error::Timeout {
                device: bar.name(),
                what: what.into(),
                waited,
            });
        }
        bar.wait(step);
        waited += step;
    }
    Ok(())
}

fn bring_up<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    cfg: &DeviceConfig,
) -> Result<DeviceInfo, Error> {
    let name = bar.name();
    wait_ready(bar, cfg.init_timeout, "firmware initialization")?;
    let mut id = [0u8; 2];
    bar.backend()
        .config_read(pci::DEVICE_ID, &mut id)
        .map_err(|source| Error::Pci {
            device: name.clone(),
            what: "read of the device id",
            source,
        })?;
    let pci_device_id = u16::from_le_bytes(id);
    let is_vf = crate::hw::mlx5_is_vf(pci_device_id);
    // A BlueField embedded-CPU function (the Arm side's PF) says so in the
    // init segment; it must name itself as one in ENABLE/DISABLE_HCA and
    // QUERY_PAGES (Linux `mlx5_read_embedded_cpu`, `mlx5_core_is_ecpf`),
    // and firmware may ask it for the host PF's pages too.
    ctl.ecpf = bar.read32(InitSeg::INITIALIZING.dword()) & init_seg::EMBEDDED_CPU_BIT != 0;
    if ctl.ecpf {
        tracing::info!(device = %name, "BlueField embedded-CPU function (ECPF)");
    }
    let to = bar.read32(InitSeg::CMD_EXEC_TO.dword());
    if to != 0 && to != 0xffff_ffff {
        ctl.cmdq
            .set_timeout(Duration::from_millis(u64::from(to)).max(Duration::from_secs(1)));
    }
    let fw = bar.read32(InitSeg::FW_REV.dword());
    let fw_sub = bar.read32(InitSeg::CMDIF_REV_FW_SUB.dword()) & 0xffff;

    enable_hca(bar, pool, ctl, Opcode::EnableHca)?;
    ctl.enabled = true;

    let out = simple_out::<QueryIssiOut>(bar, pool, ctl, Opcode::QueryIssi)?;
    let issi = View::<QueryIssiOut>::new(&out)
        .expect("sized")
        .get32(QueryIssiOut::SUPPORTED_ISSI_DW0);
    if issi & 0b10 == 0 {
        return Err(Error::MissingCapability {
            device: name,
            cap: "ISSI 1",
            why: "the driver speaks interface step 1 only",
        });
    }
    let mut inp = input::<SetIssiIn>(Opcode::SetIssi, 0, 0);
    ViewMut::<SetIssiIn>::new(&mut inp)
        .expect("sized")
        .set(SetIssiIn::CURRENT_ISSI, 1);
    ctl.exec(bar, pool, &inp, 16)?;

    satisfy_pages(bar, pool, ctl, pages_op_mod::BOOT)?;

    // Host endianness (0x00 on a little-endian host), on a PF only: the
    // register belongs to the physical function (Linux `set_hca_ctrl` and
    // FreeBSD return early on a VF).
    if !is_vf {
        let mut inp = input::<AccessRegisterIn>(Opcode::AccessReg, 0, 16);
        ViewMut::<AccessRegisterIn>::new(&mut inp)
            .expect("sized")
            .set(AccessRegisterIn::REGISTER_ID, reg::HOST_ENDIANNESS as u64);
        inp[AccessRegisterIn::REGISTER_DATA.byte()] =
            if cfg!(target_endian = "big") { 0x80 } else { 0 };
        ctl.exec(bar, pool, &inp, out_len::<AccessRegisterOut>(16))?;
    }

    let cur = query_cap(bar, pool, ctl, cap_type::GENERAL, true)?;
    let _max = query_cap(bar, pool, ctl, cap_type::GENERAL, false)?;
    let caps = View::<CmdHcaCap>::new(&cur).expect("cap block");
    let need = |ok: bool, cap, why| {
        if ok {
            Ok(())
        } else {
            Err(Error::MissingCapability {
                device: name.clone(),
                cap,
                why,
            })
        }
    };
    need(
        caps.get32(CmdHcaCap::PORT_TYPE) == 1,
        "port_type = Ethernet",
        "the datapath sends raw Ethernet",
    )?;
    need(
        caps.get32(CmdHcaCap::ETH_NET_OFFLOADS) == 1,
        "eth_net_offloads",
        "needed to learn the inline mode",
    )?;
    need(
        caps.get32(CmdHcaCap::NIC_FLOW_TABLE) == 1,
        "nic_flow_table",
        "each Rpc's UDP port is steered to its RQ",
    )?;
    need(
        caps.get32(CmdHcaCap::STRIDING_RQ) == 1,
        "striding_rq",
        "eRPC receives into a multi-packet RQ",
    )?;
    need(
        caps.get32(CmdHcaCap::CQ_OI) == 1,
        "cq_oi",
        "the RX CQ is created with overrun ignore",
    )?;
    // SET_HCA_CAP from the current values: no command checksums, 4 KiB UARs.
    // Only the general block (cmd_hca_cap, 256 bytes) is copied, as Linux
    // and rdma-core do: the rest of the 4 KiB union is reserved on input,
    // while on output it may hold anything.
    let mut inp = input::<SetHcaCapIn>(Opcode::SetHcaCap, cap_type::GENERAL << 1, 0);
    {
        let at = SetHcaCapIn::CMD_HCA_CAP.byte();
        inp[at..at + CmdHcaCap::BYTES].copy_from_slice(&cur[..CmdHcaCap::BYTES]);
        let mut v = ViewMut::<SetHcaCapIn>::new(&mut inp).expect("sized");
        let mut c = v.sub(SetHcaCapIn::CMD_HCA_CAP);
        c.set(CmdHcaCap::CMDIF_CHECKSUM, 0)
            .set(CmdHcaCap::LOG_UAR_PAGE_SZ, 0);
    }
    ctl.exec(bar, pool, &inp, 16)?;

    satisfy_pages(bar, pool, ctl, pages_op_mod::INIT)?;
    let inp = input::<InitHcaIn>(Opcode::InitHca, 0, 0);
    ctl.exec(bar, pool, &inp, 16)?;
    ctl.initialized = true;

    // Every capability group again, now that INIT_HCA has applied
    // SET_HCA_CAP and given the function its resources (Linux
    // `mlx5_function_open` re-queries them too): some, such as the Q
    // counters a function may allocate, are only meaningful from here on.
    // Everything below uses these.
    let cur = query_cap(bar, pool, ctl, cap_type::GENERAL, true)?;
    let caps = View::<CmdHcaCap>::new(&cur).expect("cap block");
    let eth = query_cap(bar, pool, ctl, cap_type::ETHERNET_OFFLOADS, true)?;
    let eth_inline = View::<EthCaps>::new(&eth)
        .expect("cap block")
        .get32(EthCaps::WQE_INLINE_MODE);
    let ft = query_cap(bar, pool, ctl, cap_type::NIC_FLOW_TABLE, true)?;
    ctl.reset_root_to_default = View::<FlowTableNicCap>::new(&ft)
        .expect("cap block")
        .sub(FlowTableNicCap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE)
        .get32(FlowTablePropLayout::RESET_ROOT_TO_DEFAULT)
        == 1;
    // Timestamp formats, chosen as DPDK's mlx5_ts_format_conv does: a
    // device with only a real-time clock gets REAL_TIME, otherwise the
    // free-running timer.
    let ts = |cap: u32| match cap as u8 {
        ts_format_cap::FREE_RUNNING | ts_format_cap::FREE_RUNNING_AND_REAL_TIME => {
            ts_format::FREE_RUNNING
        }
        ts_format_cap::REAL_TIME => ts_format::REAL_TIME,
        _ => ts_format::DEFAULT,
    };
    // The smallest striding WQE (DPDK `mlx5_devx_cmd_query_hca_attr`: the
    // general-2 cap, 16 KiB when the device does not report one).
    let log_min_stride_wqe_sz = if caps.get32(CmdHcaCap::HCA_CAP_2) == 1 {
        let c2 = query_cap(bar, pool, ctl, cap_type::GENERAL_2, true)?;
        cap2_log_min_stride_wqe_sz(&c2)
    } else {
        0
    };
    let log_min_stride_wqe_sz = match log_min_stride_wqe_sz {
        0 => MPRQ_LOG_MIN_STRIDE_WQE_SZ_DEFAULT,
        v => v,
    };
    let sq_ts_format = ts(caps.get32(CmdHcaCap::SQ_TS_FORMAT));
    let rq_ts_format = ts(caps.get32(CmdHcaCap::RQ_TS_FORMAT));

    // The polled EQ: page requests, CQ errors, port changes. Never armed.
    let eq_uar = alloc_u24::<AllocUarOut>(bar, pool, ctl, Opcode::AllocUar, AllocUarOut::UAR)?;
    ctl.objects.push(Obj::Uar(eq_uar));
    // MSI-X vector 0 gets an interrupt sink before the EQ names it, as in
    // every reference (rdma-core: VFIO_DEVICE_SET_IRQS at open); firmware
    // refuses an EQ on a vector that is not enabled. The EQ is still
    // polled and never armed.
    bar.backend()
        .enable_msix(EQ_VECTOR)
        .map_err(|source| Error::Pci {
            device: name.clone(),
            what: "MSI-X enable (VFIO_DEVICE_SET_IRQS)",
            source,
        })?;
    ctl.objects.push(Obj::Msix);
    let buf = EventQueue::alloc_buffer(pool)?;
    let npages = buf.len() / PAGE;
    let mut inp = input::<CreateEqIn>(Opcode::CreateEq, 0, npages * 8);
    {
        let mut v = ViewMut::<CreateEqIn>::new(&mut inp).expect("sized");
        let mask = (1u64 << EventType::PageRequest as u8)
            | (1u64 << EventType::CqError as u8)
            | (1u64 << EventType::PortChange as u8);
        assert!(v.set_flex(CreateEqIn::EVENT_BITMASK, 0, mask));
        for p in 0..npages {
            assert!(v.set_flex(CreateEqIn::PAS, p as u32, buf.iova_at(p * PAGE)));
        }
        let mut c = v.sub(CreateEqIn::EQC);
        c.set(
            Eqc::LOG_EQ_SIZE,
            crate::eq::EQ_ENTRIES.trailing_zeros() as u64,
        )
        .set(Eqc::UAR_PAGE, eq_uar as u64)
        .set(Eqc::INTR, u64::from(EQ_VECTOR))
        .set(Eqc::LOG_PAGE_SIZE, 0);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateEqOut>(0))?;
    let eqn = View::<CreateEqOut>::new(&out)
        .expect("sized")
        .get32(CreateEqOut::EQ_NUMBER) as u8;
    ctl.objects.push(Obj::Eq(eqn));
    ctl.eq = Some(EventQueue::new(buf, eqn, eq_uar));
    // Firmware may ask for regular pages right after INIT_HCA.
    ctl.service(bar, pool)?;

    let pd = alloc_u24::<AllocPdOut>(bar, pool, ctl, Opcode::AllocPd, AllocPdOut::PD)?;
    ctl.objects.push(Obj::Pd(pd));
    let td = alloc_u24::<AllocTransportDomainOut>(
        bar,
        pool,
        ctl,
        Opcode::AllocTransportDomain,
        AllocTransportDomainOut::TRANSPORT_DOMAIN,
    )?;
    ctl.objects.push(Obj::Td(td));

    // One physical-address mkey: data segments carry IOVAs directly.
    const MKEY_VARIANT: u8 = 0x5a;
    let mut inp = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0);
    {
        let mut v = ViewMut::<CreateMkeyIn>::new(&mut inp).expect("sized");
        let mut m = v.sub(CreateMkeyIn::MKC);
        m.set(Mkc::ACCESS_MODE_1_0, 0)
            .set(Mkc::LR, 1)
            .set(Mkc::LW, 1)
            .set(Mkc::QPN, 0xff_ffff)
            .set(Mkc::MKEY_7_0, MKEY_VARIANT as u64)
            .set(Mkc::LENGTH64, 1)
            .set(Mkc::PD, pd as u64);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateMkeyOut>(0))?;
    let mkey_index = View::<CreateMkeyOut>::new(&out)
        .expect("sized")
        .get32(CreateMkeyOut::MKEY_INDEX);
    ctl.objects.push(Obj::Mkey(mkey_index));
    let lkey = (mkey_index << 8) | MKEY_VARIANT as u32;

    // MAC and inline mode from the vport context.
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryNicVportContextOut>(0))?;
    let vctx = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT);
    let mac_l = vctx.sub(NicVportContext::PERMANENT_ADDRESS);
    let (hi, lo) = (
        mac_l.get32(MacAddressLayout::MAC_ADDR_47_32) as u16,
        mac_l.get32(MacAddressLayout::MAC_ADDR_31_0),
    );
    let mac = [
        (hi >> 8) as u8,
        hi as u8,
        (lo >> 24) as u8,
        (lo >> 16) as u8,
        (lo >> 8) as u8,
        lo as u8,
    ];
    let admin_mac = mac;
    let mac = if mac == [0; 6] {
        match cfg.mac_if_unset {
            MacIfUnset::Random => {
                let m = random_local_mac();
                tracing::warn!(device = %name, mac = %MacStr(m), "the function has no MAC; using a random locally administered one");
                m
            }
            MacIfUnset::Use(m) if m[0] & 1 == 0 && m != [0; 6] => m,
            MacIfUnset::Use(m) => {
                return Err(Error::Config(format!(
                    "mac_if_unset {} is not a unicast MAC",
                    MacStr(m)
                )));
            }
            MacIfUnset::Refuse => return Err(Error::NoMac { device: name }),
        }
    } else {
        mac
    };
    let vport_inline = vctx.get32(NicVportContext::MIN_WQE_INLINE_MODE);
    // The vport context's requirement is trusted only with `eth_virt`;
    // without it the device id decides (DPDK `mlx5_set_min_inline`: the
    // ConnectX-4 family needs the L2 header, later devices nothing).
    let eth_virt = caps.get32(CmdHcaCap::ETH_VIRT) == 1;
    let mode = match eth_inline as u8 {
        inline_mode::L2 => 1,
        inline_mode::VPORT_CONTEXT if eth_virt => vport_inline,
        inline_mode::VPORT_CONTEXT => {
            let by_id = u32::from(CX4_FAMILY_IDS.contains(&pci_device_id));
            tracing::debug!(device = %name, vport_inline, by_id, "inline mode from the device id: the vport context is not trusted without eth_virt");
            by_id
        }
        _ => 0,
    };
    let inline_mode = match mode {
        0 => InlineMode::None,
        1 => InlineMode::L2,
        2 => InlineMode::Ip,
        _ => InlineMode::L4,
    };
    if matches!(inline_mode, InlineMode::Ip | InlineMode::L4) {
        return Err(Error::MissingCapability {
            device: name,
            cap: "min_wqe_inline_mode <= L2",
            why: "the driver inlines at most the L2 header",
        });
    }
    // The MTU: whatever the previous owner left (a PF's port MTU is often
    // 1500 or 9000) would let frames longer than a stride in.
    set_vport_mtu(bar, pool, ctl, VPORT_MTU)?;

    // Promiscuous mode on a VF is the PF's decision: its mlx5_core ignores
    // the request unless the VF is trusted, and a VF cannot see that.
    if cfg.promiscuous && is_vf && !cfg.vf_trusted {
        return Err(Error::Config(format!(
            "{name}: promiscuous mode on a VF works only if the PF trusts it (`ip link set <pf> vf <n> trust on`); the PF ignores an untrusted VF's request. Set DeviceConfig::vf_trusted once it does"
        )));
    }

    // Unicast reaches the function only for MACs programmed into the
    // e-switch: the vport's address list (from which a PF's legacy SR-IOV
    // e-switch builds a VF's forwarding rules; Linux mlx5e always sets
    // it), and on an e-switch manager the MPFS L2 table (Linux
    // `mlx5_mpfs_add_mac`). The PF copies a VF's list into its forwarding
    // table from a work item, some time after the MODIFY, and a VF cannot
    // see when: the list is programmed before the link wait, so that the
    // copy overlaps it.
    set_vport_mac_list(bar, pool, ctl, &[mac])?;
    ctl.objects.push(Obj::VportMacList);
    let listed = query_vport_mac_list(bar, pool, ctl)?;
    if !listed.contains(&mac) {
        tracing::warn!(device = %name, mac = %MacStr(mac), listed = listed.len(), "the vport address list does not hold our MAC after setting it: unicast may not reach the function");
    }
    if is_vf && mac != admin_mac {
        tracing::warn!(device = %name, mac = %MacStr(mac), "this VF has no admin MAC: if the PF checks spoofing (`spoofchk on`) it drops every frame the VF sends; give it one with `ip link set <pf> vf <n> mac ...`");
    }
    // MPFS exists only on an e-switch manager whose L2 table has more
    // than one entry (Linux `mlx5_mpfs_init`); a failure costs unicast
    // delivery on a shared port, not the function, so it is a warning
    // (Linux mlx5e logs it and carries on).
    if caps.get32(CmdHcaCap::ESWITCH_MANAGER) == 1 && caps.get32(CmdHcaCap::LOG_MAX_L2_TABLE) > 0 {
        const L2_INDEX: u32 = 0;
        let mut inp = input::<SetL2TableEntryIn>(Opcode::SetL2TableEntry, 0, 0);
        {
            let mut v = ViewMut::<SetL2TableEntryIn>::new(&mut inp).expect("sized");
            v.set(SetL2TableEntryIn::TABLE_INDEX, u64::from(L2_INDEX));
            let mut a = v.sub(SetL2TableEntryIn::MAC_ADDRESS);
            set_mac(&mut a, mac);
        }
        match ctl.exec(bar, pool, &inp, 16) {
            Ok(_) => ctl.objects.push(Obj::L2Entry(L2_INDEX)),
            Err(e @ Error::Command { .. }) => {
                tracing::warn!(device = %name, error = %e, mac = %MacStr(mac), "MPFS L2 table entry refused: unicast for this MAC may not reach the function on a shared port");
            }
            Err(e) => return Err(e),
        }
    }

    if cfg.promiscuous {
        let mut inp = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0);
        let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::PROMISC, 1);
        v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
            .set(NicVportContext::PROMISC_UC, 1);
        ctl.exec(bar, pool, &inp, 16)?;
    }

    let vport_state = wait_link_up(bar, pool, ctl, cfg.link_up_timeout)?;

    // The NIC RX root table with one group: exact dmac, ethertype, IP
    // protocol and UDP destination port.
    let log_size = cfg.flow_table_log_size;
    if !(1..=16).contains(&log_size) {
        return Err(Error::Config(format!(
            "flow_table_log_size {log_size} not in 1..=16"
        )));
    }
    let mut inp = input::<CreateFlowTableIn>(Opcode::CreateFlowTable, 0, 0);
    {
        let mut v = ViewMut::<CreateFlowTableIn>::new(&mut inp).expect("sized");
        v.set(
            CreateFlowTableIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        );
        v.sub(CreateFlowTableIn::FLOW_TABLE_CONTEXT)
            .set(FlowTableContext::LOG_SIZE, log_size as u64)
            .set(FlowTableContext::LEVEL, 0);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateFlowTableOut>(0))?;
    let table_id = View::<CreateFlowTableOut>::new(&out)
        .expect("sized")
        .get32(CreateFlowTableOut::TABLE_ID);
    ctl.objects.push(Obj::FlowTable(table_id));
    let size = 1usize << log_size;
    let mut inp = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0);
    {
        let mut v = ViewMut::<CreateFlowGroupIn>::new(&mut inp).expect("sized");
        v.set(
            CreateFlowGroupIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        )
        .set(CreateFlowGroupIn::TABLE_ID, table_id as u64)
        .set(CreateFlowGroupIn::START_FLOW_INDEX, 0)
        .set(CreateFlowGroupIn::END_FLOW_INDEX, (size - 1) as u64)
        .set(
            CreateFlowGroupIn::MATCH_CRITERIA_ENABLE,
            flow::MATCH_OUTER_HEADERS as u64,
        );
        let mut mc = v.sub(CreateFlowGroupIn::MATCH_CRITERIA);
        let mut o = mc.sub(FteMatchParam::OUTER_HEADERS);
        o.set(FteMatchSetLyr24::DMAC_47_16, 0xffff_ffff)
            .set(FteMatchSetLyr24::DMAC_15_0, 0xffff)
            .set(FteMatchSetLyr24::ETHERTYPE, 0xffff)
            .set(FteMatchSetLyr24::IP_PROTOCOL, 0xff)
            .set(FteMatchSetLyr24::UDP_DPORT, 0xffff);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateFlowGroupOut>(0))?;
    let group_id = View::<CreateFlowGroupOut>::new(&out)
        .expect("sized")
        .get32(CreateFlowGroupOut::GROUP_ID);
    ctl.objects.push(Obj::FlowGroup(table_id, group_id));
    let mut inp = input::<SetFlowTableRootIn>(Opcode::SetFlowTableRoot, 0, 0);
    ViewMut::<SetFlowTableRootIn>::new(&mut inp)
        .expect("sized")
        .set(
            SetFlowTableRootIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        )
        .set(SetFlowTableRootIn::TABLE_ID, table_id as u64);
    ctl.exec(bar, pool, &inp, 16)?;
    ctl.objects.push(Obj::FlowRoot);
    ctl.flow = Some(FlowTable {
        table_id,
        group_id,
        ports: vec![None; size],
    });

    Ok(DeviceInfo {
        name: name.clone(),
        fw_version: ((fw & 0xffff) as u16, (fw >> 16) as u16, fw_sub as u16),
        mac,
        inline_mode,
        vport_state,
        pd,
        td,
        lkey,
        eqn,
        bf_reg_size: if caps.get32(CmdHcaCap::BF) == 1 {
            1 << caps.get32(CmdHcaCap::LOG_BF_REG_SIZE)
        } else {
            0
        },
        log_max_wq_sz: caps.get32(CmdHcaCap::LOG_MAX_WQ_SZ) as u8,
        log_max_cq_sz: caps.get32(CmdHcaCap::LOG_MAX_CQ_SZ) as u8,
        ext_stride_num_range: caps.get32(CmdHcaCap::EXT_STRIDE_NUM_RANGE) == 1,
        log_min_stride_wqe_sz,
        max_q_counters: caps.get32(CmdHcaCap::MAX_QP_CNT),
        cqe_version: caps.get32(CmdHcaCap::CQE_VERSION) as u8,
        wqe_inline_mode_cap: eth_inline as u8,
        sq_ts_format,
        rq_ts_format,
        reset_root_to_default: ctl.reset_root_to_default,
        pci_device_id,
        is_vf,
        embedded_cpu: ctl.ecpf,
        func: ctl.func,
    })
}

/// Writes a MAC into a `mac_address_layout`.
fn set_mac(a: &mut ViewMut<'_, MacAddressLayout>, m: [u8; 6]) {
    a.set(
        MacAddressLayout::MAC_ADDR_47_32,
        u64::from(u16::from_be_bytes([m[0], m[1]])),
    )
    .set(
        MacAddressLayout::MAC_ADDR_31_0,
        u64::from(u32::from_be_bytes([m[2], m[3], m[4], m[5]])),
    );
}

/// QUERY_VPORT_STATE's `state` (1 = up).
fn vport_state<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<u8, Error> {
    let inp = input::<QueryVportStateIn>(Opcode::QueryVportState, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryVportStateOut>(0))?;
    Ok(View::<QueryVportStateOut>::new(&out)
        .expect("sized")
        .get32(QueryVportStateOut::STATE) as u8)
}

/// Waits for the link: INIT_HCA brings it up (unless the cap
/// `disable_link_up` says otherwise), but training takes time, and frames
/// sent before it is up are lost (rdma-core leaves this to its caller; the
/// `disable_link_up_by_init_hca` cap shows the link follows INIT_HCA). The
/// vport state is polled every millisecond, servicing the event queue
/// (page requests, port-change events) in between.
fn wait_link_up<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    timeout: Duration,
) -> Result<u8, Error> {
    let step = Duration::from_millis(1);
    let mut waited = Duration::ZERO;
    loop {
        let state = vport_state(bar, pool, ctl)?;
        if state == VPORT_STATE_UP {
            if !waited.is_zero() {
                tracing::info!(device = %bar.name(), ?waited, "link up");
            }
            return Ok(state);
        }
        if timeout.is_zero() {
            tracing::warn!(device = %bar.name(), "link is down; not waiting (link_up_timeout 0): frames are lost until it comes up");
            return Ok(state);
        }
        if waited >= timeout {
            return Err(Error::Timeout {
                device: bar.name(),
                what: "link up (QUERY_VPORT_STATE still reports the port down: check the cable and the switch port, or set DeviceConfig::link_up_timeout to 0 to come up without waiting)".into(),
                waited,
            });
        }
        ctl.service(bar, pool)?;
        bar.wait(step);
        waited += step;
    }
}

/// MODIFY_NIC_VPORT_CONTEXT of the MTU (a frame length: Linux
/// `mlx5_modify_nic_vport_mtu` with software MTU + 22), then a query to
/// see that it holds.
fn set_vport_mtu<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    mtu: u16,
) -> Result<(), Error> {
    let mut inp = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0);
    {
        let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::MTU, 1);
        v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
            .set(NicVportContext::MTU, u64::from(mtu));
    }
    ctl.exec(bar, pool, &inp, 16)?;
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryNicVportContextOut>(0))?;
    let now = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT)
        .get32(NicVportContext::MTU);
    if now != u32::from(mtu) {
        return Err(Error::Config(format!(
            "{}: the vport MTU reads {now} after setting it to {mtu}; frames longer than a {MAX_RX_FRAME}-byte receive stride would be miscounted",
            bar.name()
        )));
    }
    Ok(())
}

/// Most unicast addresses read back by [`query_vport_mac_list`].
const MAC_LIST_READ_BACK: usize = 8;

/// QUERY_NIC_VPORT_CONTEXT of the unicast address list (the first
/// [`MAC_LIST_READ_BACK`] entries).
fn query_vport_mac_list<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<Vec<[u8; 6]>, Error> {
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let base = QueryNicVportContextOut::NIC_VPORT_CONTEXT.byte()
        + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
    let len = (base + MAC_LIST_READ_BACK * MacAddressLayout::BYTES)
        .max(out_len::<QueryNicVportContextOut>(0));
    let out = ctl.exec(bar, pool, &inp, len)?;
    let n = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT)
        .get32(NicVportContext::ALLOWED_LIST_SIZE) as usize;
    Ok((0..n.min(MAC_LIST_READ_BACK))
        .map(|i| {
            let e = View::<MacAddressLayout>::new(&out[base + i * MacAddressLayout::BYTES..])
                .expect("sized");
            let (hi, lo) = (
                e.get32(MacAddressLayout::MAC_ADDR_47_32) as u16,
                e.get32(MacAddressLayout::MAC_ADDR_31_0),
            );
            let (h, l) = (hi.to_be_bytes(), lo.to_be_bytes());
            [h[0], h[1], l[0], l[1], l[2], l[3]]
        })
        .collect())
}

/// MODIFY_NIC_VPORT_CONTEXT of the unicast address list (Linux
/// `mlx5_modify_nic_vport_mac_list`).
fn set_vport_mac_list<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    macs: &[[u8; 6]],
) -> Result<(), Error> {
    let mut inp = input::<ModifyNicVportContextIn>(
        Opcode::ModifyNicVportContext,
        0,
        macs.len() * MacAddressLayout::BYTES,
    );
    let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
    v.sub(ModifyNicVportContextIn::FIELD_SELECT)
        .set(ModifyNicVportFieldSelect::ADDRESSES_LIST, 1);
    let mut c = v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT);
    c.set(NicVportContext::ALLOWED_LIST_TYPE, 0)
        .set(NicVportContext::ALLOWED_LIST_SIZE, macs.len() as u64);
    let base = ModifyNicVportContextIn::NIC_VPORT_CONTEXT.byte()
        + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
    for (i, m) in macs.iter().enumerate() {
        let at = base + i * MacAddressLayout::BYTES;
        let mut e = ViewMut::<MacAddressLayout>::new(&mut inp[at..]).expect("sized");
        set_mac(&mut e, *m);
    }
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// A random locally administered unicast MAC (std's per-process random
/// hash keys, mixed with the time: no RNG dependency for one address).
fn random_local_mac() -> [u8; 6] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let b = h.finish().to_be_bytes();
    [(b[0] & 0xfe) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// Displays a MAC as `aa:bb:cc:dd:ee:ff`.
struct MacStr([u8; 6]);

impl std::fmt::Display for MacStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

fn simple_out<O: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
) -> Result<Vec<u8>, Error> {
    let inp = input::<MboxIn>(op, 0, 0);
    ctl.exec(bar, pool, &inp, out_len::<O>(0))
}

fn alloc_u24<O: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
    f: crate::prm::Field<O>,
) -> Result<u32, Error> {
    let out = simple_out::<O>(bar, pool, ctl, op)?;
    Ok(View::<O>::new(&out).expect("sized").get32(f))
}

/// Destroys one object by number (DEALLOC_*/DESTROY_* with the number at +0x08).
pub(crate) fn destroy_u24<I: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
    f: crate::prm::Field<I>,
    n: u32,
) -> Result<(), Error> {
    let mut inp = input::<I>(op, 0, 0);
    ViewMut::<I>::new(&mut inp).expect("sized").set(f, n as u64);
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// Takes back every page firmware holds, each for the function it was given
/// for, as Linux `mlx5_reclaim_startup_pages` does: firmware may return
/// pages a little at a time after TEARDOWN_HCA, so a TAKE that returns
/// nothing is retried (1 ms apart) until no page has come back for
/// [`PAGE_RECLAIM_BUDGET`]. Pages still held then are leaked (never reused:
/// the device may write them) and reported.
fn reclaim_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let step = Duration::from_millis(1);
    let mut idle = Duration::ZERO;
    while ctl.pages.given() > 0 {
        let mut progress = 0;
        for (key, n) in ctl.pages.by_function() {
            let func = FuncId::from_key(key);
            progress += take_pages(&mut ctl.cmdq, &mut ctl.pages, bar, pool, n, func)?;
        }
        if progress > 0 {
            idle = Duration::ZERO;
            continue;
        }
        if idle >= PAGE_RECLAIM_BUDGET {
            break;
        }
        bar.wait(step);
        idle += step;
    }
    if ctl.pages.given() > 0 {
        tracing::error!(
            device = %bar.name(),
            pages = ctl.pages.given(),
            by_function = ?ctl.pages.by_function(),
            waited = ?idle,
            "firmware kept pages after teardown; leaking them"
        );
        return Err(Error::Timeout {
            device: bar.name(),
            what: format!(
                "return of {} firmware pages (leaked, never reused)",
                ctl.pages.given()
            ),
            waited: idle,
        });
    }
    Ok(())
}

/// Tears down everything bring-up created, in reverse; then TEARDOWN_HCA,
/// reclaims every firmware page, DISABLE_HCA. Keeps going after failures
/// and returns the first.
fn teardown<B: HwBackend>(bar: &Bar<B>, pool: &Arc<DmaPool>, ctl: &mut Ctl) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            tracing::error!(error = %e, "teardown step failed");
            first.get_or_insert(e);
        }
    };
    while let Some(obj) = ctl.objects.pop() {
        let r = match obj {
            // Linux destroys the last NIC RX root table without
            // disconnecting it (firmware allows that); SET_FLOW_TABLE_ROOT
            // op_mod 1 exists only with the reset_root_to_default cap.
            Obj::FlowRoot if !ctl.reset_root_to_default => Ok(()),
            Obj::FlowRoot => {
                let mut inp = input::<SetFlowTableRootIn>(
                    Opcode::SetFlowTableRoot,
                    flow::SET_ROOT_OP_MOD_DISCONNECT,
                    0,
                );
                ViewMut::<SetFlowTableRootIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        SetFlowTableRootIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    );
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::FlowGroup(table, group) => {
                let mut inp = input::<DestroyFlowGroupIn>(Opcode::DestroyFlowGroup, 0, 0);
                ViewMut::<DestroyFlowGroupIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        DestroyFlowGroupIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    )
                    .set(DestroyFlowGroupIn::TABLE_ID, table as u64)
                    .set(DestroyFlowGroupIn::GROUP_ID, group as u64);
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::FlowTable(table) => {
                ctl.flow = None;
                let mut inp = input::<DestroyFlowTableIn>(Opcode::DestroyFlowTable, 0, 0);
                ViewMut::<DestroyFlowTableIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        DestroyFlowTableIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    )
                    .set(DestroyFlowTableIn::TABLE_ID, table as u64);
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::Mkey(i) => destroy_u24(
                bar,
                pool,
                ctl,
                Opcode::DestroyMkey,
                DestroyMkeyIn::MKEY_INDEX,
                i,
            ),
            Obj::Td(t) => destroy_u24(
                bar,
                pool,
                ctl,
                Opcode::DeallocTransportDomain,
                DeallocTransportDomainIn::TRANSPORT_DOMAIN,
                t,
            ),
            Obj::Pd(p) => destroy_u24(bar, pool, ctl, Opcode::DeallocPd, DeallocPdIn::PD, p),
            Obj::Eq(e) => {
                let r = destroy_u24(
                    bar,
                    pool,
                    ctl,
                    Opcode::DestroyEq,
                    DestroyEqIn::EQ_NUMBER,
                    e as u32,
                );
                ctl.eq = None;
                r
            }
            Obj::L2Entry(index) => {
                let mut inp = input::<DeleteL2TableEntryIn>(Opcode::DeleteL2TableEntry, 0, 0);
                ViewMut::<DeleteL2TableEntryIn>::new(&mut inp)
                    .expect("sized")
                    .set(DeleteL2TableEntryIn::TABLE_INDEX, u64::from(index));
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::VportMacList => set_vport_mac_list(bar, pool, ctl, &[]),
            Obj::Msix => bar.backend().disable_msix().map_err(|source| Error::Pci {
                device: bar.name(),
                what: "MSI-X disable (VFIO_DEVICE_SET_IRQS)",
                source,
            }),
            Obj::Uar(u) => destroy_u24(bar, pool, ctl, Opcode::DeallocUar, DeallocUarIn::UAR, u),
        };
        note(r);
    }
    if ctl.initialized {
        let mut inp = input::<TeardownHcaIn>(Opcode::TeardownHca, 0, 0);
        ViewMut::<TeardownHcaIn>::new(&mut inp)
            .expect("sized")
            .set(TeardownHcaIn::PROFILE, 0);
        note(
            ctl.exec(bar, pool, &inp, out_len::<TeardownHcaOut>(0))
                .map(|_| ()),
        );
        ctl.initialized = false;
    }
    if ctl.enabled {
        note(reclaim_pages(bar, pool, ctl));
        note(enable_hca(bar, pool, ctl, Opcode::DisableHca));
        ctl.enabled = false;
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
