//! A brought-up mlx5 function: bring-up in rdma-core's VFIO-provider order,
//! capability checks, the polled EQ and firmware pages, the shared objects
//! (UAR, PD, transport domain, mkey, NIC RX flow table), the health check,
//! and a complete teardown (also on drop and on bring-up failure).
//!
//! Bring-up reads as the PRM's order of steps (`bring_up`); firmware pages
//! and the event-queue service (`fw_pages`), the vport's MTU, address list
//! and link (`vport`) and teardown (`teardown`) have a file each; this
//! file holds the types, the control state and the public API.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use mempool::{DmaError, DmaMapper, DmaMapping, RegionOptions};

use crate::bar::Bar;
use crate::cmd::{CmdQueue, CmdStats, SlotKind};
use crate::dma::{DmaMem, DmaPool};
use crate::eq::EventQueue;
use crate::error::{Error, HealthProblem};
use crate::hw::HwBackend;
use crate::pages::FwPages;
use crate::prm::cmd::*;
use crate::prm::codes::Opcode;
use crate::prm::cqe::EqeDecoded;
use crate::prm::ctx::*;
use crate::prm::init_seg::{self, HealthBuffer, InitSeg};
use crate::prm::{Layout, View, ViewMut};

mod bring_up;
mod fw_pages;
mod teardown;
mod vport;

use bring_up::{bring_up, enable_bus_master, wait_ready};
use fw_pages::service_events;
pub(crate) use teardown::destroy_u24;
use teardown::teardown;

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
