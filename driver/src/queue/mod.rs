//! Per-thread queue sets and the datapath.
//!
//! A [`QueueSet`] is what one eRPC `Rpc` owns: a raw-Ethernet SQ with a
//! small TX CQ, a striding (multi-packet) RQ feeding an 8-entry RX CQ
//! created with overrun-ignore, a TIR, a TIS, its own UAR page, a Q counter,
//! and a flow rule steering (our MAC, IPv4, UDP, destination port) to the
//! RQ.
//!
//! TX: bursts of WQEs, one doorbell-record update and one doorbell (or
//! BlueFlame) write per burst, a completion requested only every
//! `unsignaled_batch` WQEs, and the TX CQ polled only when such a signaled
//! WQE is due (its predecessor must have completed).
//!
//! RX: no per-packet CQE is read. The NIC overwrites the 8 RX CQEs round
//! robin; the driver snapshots (wqe id, stride index) of the next one and
//! turns the difference into a packet count (facts sheet §6.6). A whole
//! striding WQE is reposted each time its strides have been given back.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::barrier;
use crate::device::{Device, InlineMode, Inner, destroy_u24, input, out_len};
use crate::dma::{DmaMem, PAGE};
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::cmd::*;
use crate::prm::codes::{CqeOpcode, Opcode, QueueState, WqeOpcode, flow, inline_mode, wq_type};
use crate::prm::cqe::{
    CQE_L3_HDR_TYPE_IPV4, CQE_L3_HDR_TYPE_MASK, CQE_L3_HDR_TYPE_SHIFT, CQE_OP_OWN_INVALID, Cqe,
    Cqe64, CqeChecksum,
};
use crate::prm::ctx::*;
use crate::prm::wqe::{
    self, ETH_L2_INLINE_HEADER_SIZE, FmCeSe, MprqWqe, SEND_WQE_BB, SEND_WQE_DS,
    SEND_WQE_MAX_WQEBBS, WqeCtrlSeg, WqeDataSeg, WqeEthSeg, WqeSrqNextSeg,
};
use crate::prm::{Layout, View, ViewMut, uar};

mod inspect;

const CQE_BYTES: usize = 64;
const OP_OWN: usize = (Cqe64::OP_OWN.bit() / 8) as usize;
const WQE_ID: usize = (Cqe64::WQE_ID.bit() / 8) as usize;
const WQE_COUNTER: usize = (Cqe64::WQE_COUNTER.bit() / 8) as usize;
/// `hds_ip_ext` (checksum flags), followed by `l4_hdr_type_etc`: one
/// big-endian 16-bit load reads both.
const HDS_IP_EXT: usize = (Cqe64::HDS_IP_EXT.bit() / 8) as usize;
/// Doorbell records of one queue set, each in its own 64-byte line of one page.
const DBR_SQ: usize = 0;
const DBR_RQ: usize = 64;
const DBR_TX_CQ: usize = 128;
const DBR_RX_CQ: usize = 192;
/// Data segments a send WQE may carry.
pub const MAX_GATHER: usize = 2;
/// Largest WQE we build, in WQEBBs: ctrl + eth with 18 inline bytes + 2 data
/// = 5 DS (without inline: 4 DS, one WQEBB).
const MAX_WQEBBS: u32 = (16 + 32 + MAX_GATHER * 16).div_ceil(SEND_WQE_BB) as u32;
const _: () = assert!(MAX_WQEBBS as usize <= SEND_WQE_MAX_WQEBBS);
const _: () = assert!(OP_OWN == 0x3f && WQE_ID == 0x02 && WQE_COUNTER == 0x3c);
const _: () =
    assert!(HDS_IP_EXT == 0x1c && Cqe64::L4_HDR_TYPE_ETC.bit() / 8 == HDS_IP_EXT as u32 + 1);

/// Queue-set settings (eRPC's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// UDP destination port steered to this queue set.
    pub udp_port: u16,
    /// log2 of the SQ size in 64-byte WQEBBs (7 = 128).
    pub sq_log_wqebbs: u8,
    /// One signaled WQE per this many (64).
    pub unsignaled_batch: u32,
    /// log2 of strides per RQ WQE (9 = 512).
    pub rq_log_strides: u8,
    /// log2 of the stride size (10 = 1 KiB, one frame per stride).
    pub rq_log_stride_bytes: u8,
    /// log2 of RQ WQEs (3 = 8, so 4096 ring entries).
    pub rq_log_wqes: u8,
    /// log2 of RX CQEs (3 = 8, overrun ignored).
    pub rx_cq_log_size: u8,
    /// Use BlueFlame (copy the WQE into the doorbell register) for
    /// single-WQE bursts.
    pub blueflame: bool,
    /// [`QueueSet::poll_control`] services the device's event queue once
    /// per this many calls.
    pub control_interval: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            udp_port: 31850,
            sq_log_wqebbs: 7,
            unsignaled_batch: 64,
            rq_log_strides: 9,
            rq_log_stride_bytes: 10,
            rq_log_wqes: 3,
            rx_cq_log_size: 3,
            blueflame: false,
            control_interval: 1024,
        }
    }
}

impl QueueConfig {
    /// RX ring entries (strides).
    pub fn rx_ring_entries(&self) -> usize {
        1 << (self.rq_log_strides + self.rq_log_wqes)
    }
}

/// One gather segment in registered memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gather {
    /// IOVA.
    pub iova: u64,
    /// Bytes (0 = absent).
    pub len: u32,
    /// Memory key.
    pub lkey: u32,
}

/// A frame to send: its first segment (which the CPU can read, for
/// inlining the L2 header) and an optional second segment.
#[derive(Debug, Clone, Copy)]
pub struct TxFrame<'a> {
    /// First bytes of the frame (Ethernet header first).
    pub first: &'a [u8],
    /// IOVA of `first[0]`.
    pub first_iova: u64,
    /// lkey of `first`.
    pub first_lkey: u32,
    /// The rest of the frame, if not contiguous with `first`.
    pub rest: Gather,
}

/// Datapath counters of one queue set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueStats {
    /// WQEs posted (sends and NOPs).
    pub tx_wqes: u64,
    /// Frame bytes posted.
    pub tx_bytes: u64,
    /// Doorbells rung (one per burst).
    pub tx_doorbells: u64,
    /// BlueFlame writes among them.
    pub tx_blueflame: u64,
    /// Signaled WQEs.
    pub tx_signaled: u64,
    /// TX CQEs consumed.
    pub tx_cqes: u64,
    /// Times the TX CQ was polled.
    pub tx_cq_polls: u64,
    /// Bursts cut short because the SQ was full.
    pub tx_full: u64,
    /// Packets reported by `rx_burst`.
    pub rx_pkts: u64,
    /// `rx_burst` calls that found packets.
    pub rx_bursts: u64,
    /// RQ WQEs reposted.
    pub rx_reposts: u64,
    /// Snapshots retried because `wqe_id` changed under the read.
    pub rx_torn_snapshots: u64,
    /// Times [`QueueSet::poll_control`] serviced the device's event queue.
    pub control_services: u64,
    /// Times it found another thread doing so and left it.
    pub control_busy: u64,
    /// Event handling that failed (logged; e.g. no memory for pages).
    pub control_errors: u64,
}

struct SendQueue {
    ring: DmaMem,
    sqn: u32,
    mask: u32,
    /// Producer counter in WQEBBs (free running).
    pi: u32,
    /// WQEBBs completed (free running).
    ci: u32,
    since_signal: u32,
    batch: u32,
    /// The outstanding signaled WQE: (WQE index, producer counter after it).
    signaled: Option<(u16, u32)>,
    bf_offset: usize,
    bf_half: usize,
    /// Which half of the BlueFlame register the next doorbell uses.
    bf_toggle: usize,
    error: Option<Cqe>,
}

struct CompQueue {
    ring: DmaMem,
    cqn: u32,
    log: u32,
    ci: u32,
    last: Option<Cqe>,
}

struct RecvQueue {
    wqes: DmaMem,
    data: Arc<DmaMem>,
    rqn: u32,
    log_wqes: u32,
    log_strides: u32,
    stride: usize,
    /// WQEs posted (free running, what the doorbell record says).
    head: u32,
    /// Ring slots given back but not yet reposted.
    to_post: usize,
    /// Strides reported by `rx_burst` (free running).
    reported: u32,
    /// Next ring slot to hand out.
    recv_head: usize,
}

struct RxCq {
    ring: DmaMem,
    cqn: u32,
    entries: usize,
    idx: usize,
    /// Position of the last packet counted, in the free-running cycle.
    prev: u32,
    /// The free-running cycle: 65536 WQEs × strides.
    cycle: u32,
    /// How the hardware reports `wqe_id`.
    mode: RxWqeIdMode,
    /// (`wqe_id` << 16 | `wqe_counter`) of the CQE consumed last (in the
    /// slot before `idx`), as read then.
    last_raw: u32,
    /// Per RX ring slot: the CQE flags of the frame in it
    /// ([`RxCqeFlags`]), or unknown.
    flags: Box<[RxCqeFlags]>,
}

/// How a striding RQ's CQEs number the WQE a packet landed in. The
/// references only ever use the low bits (libmlx5 masks it with the ring
/// size, DPDK compares `(wqe_id ^ rq_ci) & wq_mask`, the kernel indexes its
/// ring with it), so either reading is possible; the driver finds out
/// from the first CQE that tells them apart (the first packet in the WQE
/// after the last ring slot) and counts exactly in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RxWqeIdMode {
    /// Not known yet: no packet has landed past the first lap of the ring.
    Undetermined,
    /// A free-running 16-bit WQE counter.
    FreeRunning,
    /// The WQE's ring index (`counter & (WQEs - 1)`).
    RingIndex,
}

/// What the NIC said about a received frame in its CQE: the checksum
/// flags (`hds_ip_ext`) and header types (`l4_hdr_type_etc`), when the
/// driver could read that frame's own CQE (see
/// [`QueueSet::rx_cqe_flags_of`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RxCqeFlags(u16);

impl RxCqeFlags {
    /// Nothing known: the frame's CQE was not read.
    pub const UNKNOWN: RxCqeFlags = RxCqeFlags(0);
    /// Set in every known value (in place of `l4_hdr_type_etc` bit 7,
    /// which the driver does not use).
    const KNOWN: u16 = 0x80;

    /// From the big-endian 16 bits at CQE offset 0x1c (`hds_ip_ext`,
    /// `l4_hdr_type_etc`).
    #[inline]
    pub fn from_cqe(hds_ip_ext_and_hdr_type: u16) -> RxCqeFlags {
        RxCqeFlags(hds_ip_ext_and_hdr_type | Self::KNOWN)
    }

    /// Whether the frame's CQE was read.
    #[inline]
    pub fn known(self) -> bool {
        self.0 & Self::KNOWN != 0
    }

    /// The checksum flags (empty when unknown).
    #[inline]
    pub fn checksum(self) -> CqeChecksum {
        CqeChecksum::from_bits_retain(if self.known() { (self.0 >> 8) as u8 } else { 0 })
    }

    /// The L3 header type (`l4_hdr_type_etc[3:2]`, `CQE_L3_HDR_TYPE_*`;
    /// none when unknown).
    #[inline]
    pub fn l3_hdr_type(self) -> u8 {
        ((self.0 as u8) >> CQE_L3_HDR_TYPE_SHIFT) & CQE_L3_HDR_TYPE_MASK
    }

    /// The NIC checked the frame's IPv4 header checksum and found it right:
    /// known, L3 header type IPv4, and `l3_ok`.
    #[inline]
    pub fn ipv4_header_ok(self) -> bool {
        self.known()
            && self.l3_hdr_type() == CQE_L3_HDR_TYPE_IPV4
            && self.checksum().contains(CqeChecksum::L3_OK)
    }
}

impl std::fmt::Debug for RxCqeFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.known() {
            return f.write_str("RxCqeFlags(unknown)");
        }
        write!(
            f,
            "RxCqeFlags({:?}, l3 type {}, l4_hdr_type_etc {:#04x})",
            self.checksum(),
            self.l3_hdr_type(),
            self.0 as u8 & 0x7f
        )
    }
}

/// A read-only view of a queue set's RX ring that outlives borrows of the
/// queue set (the transport hands it to eRPC).
#[derive(Clone)]
pub struct RxRingView {
    data: Arc<DmaMem>,
    stride: usize,
    entries: usize,
}

impl std::fmt::Debug for RxRingView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RxRingView({} x {} B at iova {:#x})",
            self.entries,
            self.stride,
            self.data.iova()
        )
    }
}

impl RxRingView {
    /// Ring slots.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Bytes per slot.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The bytes of ring slot `idx` (a whole stride; the frame inside is as
    /// long as its headers say).
    ///
    /// # Safety
    /// The slot must have been reported by [`QueueSet::rx_burst`] and not yet
    /// given back with [`QueueSet::post_recvs`], for as long as the slice
    /// lives: only then does the NIC leave it alone.
    pub unsafe fn slot(&self, idx: usize) -> &[u8] {
        let i = idx & (self.entries - 1);
        // SAFETY: in bounds; quiescence is the caller's contract.
        unsafe { self.data.slice(i * self.stride, self.stride) }
    }
}

/// Software and hardware state of a queue set, for the queue inspector.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    /// Device name.
    pub device: String,
    /// UDP port steered here.
    pub udp_port: u16,
    /// Object numbers: (SQ, RQ, TX CQ, RX CQ, TIS, TIR, UAR, flow index, Q counter).
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
    /// UAR index.
    pub uar: u32,
    /// Flow table entry index.
    pub flow_index: u32,
    /// Q counter set (0: none; the function had none to spare).
    pub counter_set_id: u32,
    /// SQ producer counter (WQEBBs).
    pub sq_pi: u32,
    /// SQ WQEBBs known complete.
    pub sq_ci: u32,
    /// WQEs since the last signaled one.
    pub sq_unsignaled: u32,
    /// A signaled WQE is outstanding.
    pub sq_signaled_outstanding: bool,
    /// The SQ's error CQE, if it is in error.
    pub sq_error: Option<Cqe>,
    /// TX CQ consumer index.
    pub tx_cq_ci: u32,
    /// Last TX CQE.
    pub tx_last_cqe: Option<Cqe>,
    /// RQ WQEs posted.
    pub rq_head: u32,
    /// Next RX ring slot.
    pub rx_recv_head: usize,
    /// Slots given back, not yet reposted.
    pub rx_to_post: usize,
    /// RX CQ slot read next.
    pub rx_cqe_idx: usize,
    /// Last (wqe id × strides + stride) position seen.
    pub rx_prev_position: u32,
    /// How the NIC numbers striding-RQ WQEs in CQEs, once known.
    pub rx_wqe_id_mode: RxWqeIdMode,
    /// Counters.
    pub stats: QueueStats,
}

/// Hardware's view (QUERY_SQ/RQ/CQ, QUERY_Q_COUNTER).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HwQueueState {
    /// SQ state (0 RST, 1 RDY, 3 ERR).
    pub sq_state: u8,
    /// SQ hardware consumer counter.
    pub sq_hw_counter: u32,
    /// SQ producer counter as hardware last read it.
    pub sq_sw_counter: u32,
    /// `sqc.min_wqe_inline_mode` as the SQ was created.
    pub sq_min_wqe_inline_mode: u8,
    /// `sqc.ts_format`.
    pub sq_ts_format: u8,
    /// `rqc.ts_format`.
    pub rq_ts_format: u8,
    /// RQ state.
    pub rq_state: u8,
    /// RQ hardware counter.
    pub rq_hw_counter: u32,
    /// RQ producer counter as hardware last read it.
    pub rq_sw_counter: u32,
    /// TX CQ (consumer, producer, status).
    pub tx_cq: (u32, u32, u8),
    /// RX CQ (consumer, producer, status).
    pub rx_cq: (u32, u32, u8),
    /// Packets dropped because the RQ had no WQE (0 when the queue set has
    /// no Q counter: `counter_set_id` 0).
    pub out_of_buffer: u32,
}

/// One thread's queues. `Send` (create it anywhere, move it to its thread)
/// but not `Sync`:
///
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<mlx5::QueueSet<mlx5::vfio::VfioBackend>>();
/// ```
pub struct QueueSet<B: HwBackend> {
    dev: Arc<Inner<B>>,
    cfg: QueueConfig,
    uar: u32,
    dbr: DmaMem,
    sq: SendQueue,
    tx_cq: CompQueue,
    rq: RecvQueue,
    rx_cq: RxCq,
    tisn: u32,
    tirn: u32,
    counter_set_id: u32,
    flow_index: u32,
    inline: bool,
    lkey: u32,
    stats: QueueStats,
    /// Objects created so far, for teardown in reverse.
    created: Vec<QObj>,
    /// Calls of `poll_control` until the next EQ service.
    control_countdown: u32,
    /// Publication for the debug endpoint, if the device exposes one.
    inspect: Option<debug_endpoint::Publisher<crate::inspect::QueueSetRaw>>,
    _not_sync: PhantomData<Cell<()>>,
}

#[derive(Debug, Clone, Copy)]
enum QObj {
    Uar(u32),
    Cq(u32),
    Tis(u32),
    Sq(u32),
    QCounter(u32),
    Rq(u32),
    Tir(u32),
    Fte(u32),
}

impl<B: HwBackend> std::fmt::Debug for QueueSet<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueueSet(port {}, sqn {:#x}, rqn {:#x})",
            self.cfg.udp_port, self.sq.sqn, self.rq.rqn
        )
    }
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::Config(msg()))
    }
}

impl<B: HwBackend> Device<B> {
    /// Creates a queue set steered to `cfg.udp_port`.
    pub fn create_queue_set(&self, cfg: QueueConfig) -> Result<QueueSet<B>, Error> {
        QueueSet::create(self.inner.clone(), cfg)
    }
}

impl<B: HwBackend> QueueSet<B> {
    fn create(dev: Arc<Inner<B>>, cfg: QueueConfig) -> Result<QueueSet<B>, Error> {
        let info = &dev.info;
        check(
            (6..=15).contains(&cfg.sq_log_wqebbs) && cfg.sq_log_wqebbs <= info.log_max_wq_sz,
            || {
                format!(
                    "sq_log_wqebbs {} outside 6..=min(15, log_max_wq_sz {})",
                    cfg.sq_log_wqebbs, info.log_max_wq_sz
                )
            },
        )?;
        let min_strides = if info.ext_stride_num_range { 3 } else { 9 };
        check((min_strides..=16).contains(&cfg.rq_log_strides), || {
            format!(
                "rq_log_strides {} outside {min_strides}..=16",
                cfg.rq_log_strides
            )
        })?;
        let log_wqe = u32::from(cfg.rq_log_strides) + u32::from(cfg.rq_log_stride_bytes);
        check(log_wqe >= u32::from(info.log_min_stride_wqe_sz), || {
            format!(
                "a striding RQ WQE of 2^{} strides of 2^{} bytes ({} KiB) is below the device's minimum WQE size of {} KiB (log_min_stride_wqe_sz {}): use more strides",
                cfg.rq_log_strides,
                cfg.rq_log_stride_bytes,
                (1u64 << log_wqe) >> 10,
                (1u64 << info.log_min_stride_wqe_sz) >> 10,
                info.log_min_stride_wqe_sz
            )
        })?;
        check((6..=13).contains(&cfg.rq_log_stride_bytes), || {
            format!(
                "rq_log_stride_bytes {} outside 6..=13",
                cfg.rq_log_stride_bytes
            )
        })?;
        check(
            1usize << cfg.rq_log_stride_bytes >= crate::device::MAX_RX_FRAME,
            || {
                format!(
                    "strides must hold a whole {}-byte frame (rq_log_stride_bytes >= 10): RX counting assumes one stride per packet, which the vport MTU guarantees only for such strides",
                    crate::device::MAX_RX_FRAME
                )
            },
        )?;
        check(
            (1..=info.log_max_wq_sz.min(10)).contains(&cfg.rq_log_wqes),
            || format!("rq_log_wqes {}", cfg.rq_log_wqes),
        )?;
        check(
            (1..=info.log_max_cq_sz.min(12)).contains(&cfg.rx_cq_log_size),
            || format!("rx_cq_log_size {}", cfg.rx_cq_log_size),
        )?;
        check(cfg.unsignaled_batch >= 1, || {
            "unsignaled_batch must be at least 1".into()
        })?;
        check(cfg.control_interval >= 1, || {
            "control_interval must be at least 1".into()
        })?;
        check(!cfg.blueflame || info.bf_reg_size >= 128, || {
            "BlueFlame requested but the device has none".into()
        })?;
        check(
            !cfg.blueflame || dev.bar.backend().bar_write_combining(),
            || {
                "BlueFlame needs BAR0 mapped write-combining; vfio-pci maps it uncached, so the 64-byte copy would reach the NIC as separate stores: leave `blueflame` off".into()
            },
        )?;
        let sq_wqebbs = 1u32 << cfg.sq_log_wqebbs;
        let inline = info.inline_mode == InlineMode::L2;
        // Two signaled batches of the largest WQEs must fit the ring: with
        // the 18-byte inline header a two-gather WQE takes 2 WQEBBs, else 1.
        let max_wqebbs = if inline { MAX_WQEBBS } else { 1 };
        let batch = cfg
            .unsignaled_batch
            .min(sq_wqebbs / (2 * max_wqebbs))
            .max(1);

        let dbr = dev.alloc(PAGE)?;
        let mut qs = QueueSet {
            cfg,
            uar: 0,
            dbr,
            sq: SendQueue {
                ring: dev.alloc(sq_wqebbs as usize * SEND_WQE_BB)?,
                sqn: 0,
                mask: sq_wqebbs - 1,
                pi: 0,
                ci: 0,
                since_signal: 0,
                batch,
                signaled: None,
                bf_offset: 0,
                bf_half: info.bf_reg_size / 2,
                bf_toggle: 0,
                error: None,
            },
            tx_cq: CompQueue {
                ring: dev.alloc(sq_wqebbs as usize * CQE_BYTES)?,
                cqn: 0,
                log: cfg.sq_log_wqebbs as u32,
                ci: 0,
                last: None,
            },
            rq: RecvQueue {
                wqes: dev.alloc((1usize << cfg.rq_log_wqes) * MprqWqe::BYTES)?,
                data: Arc::new(dev.alloc(cfg.rx_ring_entries() << cfg.rq_log_stride_bytes)?),
                rqn: 0,
                log_wqes: cfg.rq_log_wqes as u32,
                log_strides: cfg.rq_log_strides as u32,
                stride: 1 << cfg.rq_log_stride_bytes,
                head: 0,
                to_post: 0,
                reported: 0,
                recv_head: 0,
            },
            rx_cq: RxCq {
                ring: dev.alloc((1usize << cfg.rx_cq_log_size) * CQE_BYTES)?,
                cqn: 0,
                entries: 1 << cfg.rx_cq_log_size,
                idx: 0,
                prev: 0,
                cycle: 65536u32 << cfg.rq_log_strides,
                mode: RxWqeIdMode::Undetermined,
                last_raw: 0,
                flags: vec![RxCqeFlags::UNKNOWN; cfg.rx_ring_entries()].into_boxed_slice(),
            },
            tisn: 0,
            tirn: 0,
            counter_set_id: 0,
            flow_index: 0,
            inline,
            lkey: info.lkey,
            stats: QueueStats::default(),
            created: Vec::new(),
            control_countdown: cfg.control_interval.max(1),
            inspect: None,
            _not_sync: PhantomData,
            dev,
        };
        match qs.build() {
            Ok(()) => {
                if let Some(i) = qs.dev.inspect.as_ref() {
                    qs.inspect = Some(i.add_queue_set(cfg.udp_port, qs.inspect_ids()));
                }
                Ok(qs)
            }
            Err(e) => {
                if let Err(t) = qs.destroy() {
                    tracing::error!(error = %t, "cleanup after failed queue-set creation also failed");
                }
                Err(e)
            }
        }
    }

    fn exec(&self, inp: &[u8], out: usize) -> Result<Vec<u8>, Error> {
        self.dev.exec(inp, out)
    }

    fn build(&mut self) -> Result<(), Error> {
        let info = self.dev.info.clone();
        // UAR for this queue set's doorbells.
        let out = self.exec(
            &input::<MboxIn>(Opcode::AllocUar, 0, 0),
            out_len::<AllocUarOut>(0),
        )?;
        self.uar = View::<AllocUarOut>::new(&out)
            .expect("sized")
            .get32(AllocUarOut::UAR);
        self.created.push(QObj::Uar(self.uar));
        self.sq.bf_offset = self.uar as usize * uar::UAR_PAGE_BYTES + uar::BF_OFFSET;

        // TX CQ: every CQE starts invalid, owned by hardware.
        for i in 0..(1usize << self.tx_cq.log) {
            self.tx_cq
                .ring
                .write_u8(i * CQE_BYTES + OP_OWN, CQE_OP_OWN_INVALID);
        }
        self.tx_cq.cqn = self.create_cq(&self.tx_cq.ring, self.tx_cq.log, false, DBR_TX_CQ)?;
        self.created.push(QObj::Cq(self.tx_cq.cqn));

        // TIS in our transport domain.
        let mut inp = input::<CreateTisIn>(Opcode::CreateTis, 0, 0);
        ViewMut::<CreateTisIn>::new(&mut inp)
            .expect("sized")
            .sub(CreateTisIn::CTX)
            .set(Tisc::TRANSPORT_DOMAIN, info.td as u64);
        let out = self.exec(&inp, out_len::<CreateTisOut>(0))?;
        self.tisn = View::<CreateTisOut>::new(&out)
            .expect("sized")
            .get32(CreateTisOut::TISN);
        self.created.push(QObj::Tis(self.tisn));

        // SQ: cyclic, 64-byte WQEBBs.
        let pages = self.sq.ring.len() / PAGE;
        let mut inp = input::<CreateSqIn>(Opcode::CreateSq, 0, pages.max(1) * 8);
        {
            let mut v = ViewMut::<CreateSqIn>::new(&mut inp).expect("sized");
            let mut c = v.sub(CreateSqIn::CTX);
            // The SQ's inline field counts only when the requirement lives
            // in the vport context (Linux and DPDK set it only then).
            let min_inline = if info.wqe_inline_mode_cap == inline_mode::VPORT_CONTEXT {
                u64::from(self.inline)
            } else {
                0
            };
            c.set(Sqc::FLUSH_IN_ERROR_EN, 1)
                .set(Sqc::MIN_WQE_INLINE_MODE, min_inline)
                .set(Sqc::TS_FORMAT, u64::from(info.sq_ts_format))
                .set(Sqc::STATE, QueueState::Rst as u64)
                .set(Sqc::CQN, self.tx_cq.cqn as u64)
                .set(Sqc::TIS_LST_SZ, 1)
                .set(Sqc::TIS_NUM_0, self.tisn as u64);
            let mut w = c.sub(Sqc::WQ);
            w.set(Wq::WQ_TYPE, wq_type::CYCLIC as u64)
                .set(Wq::PD, info.pd as u64)
                .set(Wq::UAR_PAGE, self.uar as u64)
                .set(Wq::DBR_ADDR, self.dbr.iova_at(DBR_SQ))
                .set(Wq::LOG_WQ_STRIDE, wqe::SEND_WQE_SHIFT as u64)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, self.cfg.sq_log_wqebbs as u64);
            for p in 0..pages.max(1) {
                assert!(w.set_flex(Wq::PAS, p as u32, self.sq.ring.iova_at(p * PAGE)));
            }
        }
        let out = self.exec(&inp, out_len::<CreateSqOut>(0))?;
        self.sq.sqn = View::<CreateSqOut>::new(&out)
            .expect("sized")
            .get32(CreateSqOut::SQN);
        self.created.push(QObj::Sq(self.sq.sqn));
        self.modify_sq(QueueState::Rst, QueueState::Rdy)?;

        // RX CQ: overrun ignored, pre-filled so the first packet counts as 1.
        let strides = 1u32 << self.rq.log_strides;
        let n = self.rx_cq.entries;
        for i in 0..n {
            let off = i * CQE_BYTES;
            self.rx_cq.ring.write_u8(off + OP_OWN, CQE_OP_OWN_INVALID);
            self.rx_cq.ring.write_u8(off + WQE_ID, 0xff);
            self.rx_cq.ring.write_u8(off + WQE_ID + 1, 0xff);
            let ctr = (strides - (n - i) as u32) as u16;
            self.rx_cq
                .ring
                .write_u8(off + WQE_COUNTER, (ctr >> 8) as u8);
            self.rx_cq.ring.write_u8(off + WQE_COUNTER + 1, ctr as u8);
        }
        self.rx_cq.prev = self.rx_snapshot(n - 1);
        let (id, ctr) = self.rx_snapshot_raw(n - 1);
        self.rx_cq.last_raw = (u32::from(id) << 16) | u32::from(ctr);
        self.rx_cq.cqn = self.create_cq(
            &self.rx_cq.ring,
            self.cfg.rx_cq_log_size as u32,
            true,
            DBR_RX_CQ,
        )?;
        self.created.push(QObj::Cq(self.rx_cq.cqn));

        // A Q counter (out-of-buffer drops) if the function has one to
        // spare: VFs get few (`max_qp_cnt`), and the RQ works without one
        // (Linux mlx5e carries on when ALLOC_Q_COUNTER fails).
        self.counter_set_id = 0;
        if info.max_q_counters > 0 {
            match self.exec(
                &input::<MboxIn>(Opcode::AllocQCounter, 0, 0),
                out_len::<AllocQCounterOut>(0),
            ) {
                Ok(out) => {
                    self.counter_set_id = View::<AllocQCounterOut>::new(&out)
                        .expect("sized")
                        .get32(AllocQCounterOut::COUNTER_SET_ID);
                    self.created.push(QObj::QCounter(self.counter_set_id));
                }
                Err(e @ Error::Command { .. }) => {
                    tracing::warn!(device = %info.name, udp_port = self.cfg.udp_port, error = %e, "no Q counter for this queue set; out-of-buffer drops are not counted");
                }
                Err(e) => return Err(e),
            }
        }

        // Striding RQ.
        let log_num_strides =
            wqe::encode_log_num_strides(self.rq.log_strides, info.ext_stride_num_range)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "2^{} strides per WQE not supported",
                        self.rq.log_strides
                    ))
                })?;
        let pages = self.rq.wqes.len() / PAGE;
        let mut inp = input::<CreateRqIn>(Opcode::CreateRq, 0, pages * 8);
        {
            let mut v = ViewMut::<CreateRqIn>::new(&mut inp).expect("sized");
            let mut c = v.sub(CreateRqIn::CTX);
            c.set(Rqc::VSD, 1)
                .set(Rqc::TS_FORMAT, u64::from(info.rq_ts_format))
                .set(Rqc::MEM_RQ_TYPE, 0)
                .set(Rqc::STATE, QueueState::Rst as u64)
                .set(Rqc::FLUSH_IN_ERROR_EN, 1)
                .set(Rqc::CQN, self.rx_cq.cqn as u64)
                .set(Rqc::COUNTER_SET_ID, self.counter_set_id as u64);
            let mut w = c.sub(Rqc::WQ);
            w.set(Wq::WQ_TYPE, wq_type::CYCLIC_STRIDING as u64)
                .set(Wq::PD, info.pd as u64)
                .set(Wq::DBR_ADDR, self.dbr.iova_at(DBR_RQ))
                .set(Wq::LOG_WQ_STRIDE, wqe::MPRQ_WQE_SHIFT as u64)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, self.rq.log_wqes as u64)
                .set(Wq::LOG_WQE_NUM_OF_STRIDES, log_num_strides as u64)
                .set(Wq::TWO_BYTE_SHIFT_EN, 0)
                .set(
                    Wq::LOG_WQE_STRIDE_SIZE,
                    (self.cfg.rq_log_stride_bytes as u32 - wqe::MPWQE_LOG_STRIDE_SZ_BASE) as u64,
                );
            for p in 0..pages {
                assert!(w.set_flex(Wq::PAS, p as u32, self.rq.wqes.iova_at(p * PAGE)));
            }
        }
        let out = self.exec(&inp, out_len::<CreateRqOut>(0))?;
        self.rq.rqn = View::<CreateRqOut>::new(&out)
            .expect("sized")
            .get32(CreateRqOut::RQN);
        self.created.push(QObj::Rq(self.rq.rqn));
        // Until the wqe_id reading is known, one WQE stays unposted (see
        // `rx_burst`); it is owed, and posted once the reading is known to
        // be free running.
        let per_wqe = 1usize << self.rq.log_strides;
        self.rq.to_post = (1usize << self.rq.log_wqes) * per_wqe;
        self.repost();
        self.modify_rq(QueueState::Rst, QueueState::Rdy)?;

        // Direct TIR to the RQ.
        let mut inp = input::<CreateTirIn>(Opcode::CreateTir, 0, 0);
        ViewMut::<CreateTirIn>::new(&mut inp)
            .expect("sized")
            .sub(CreateTirIn::CTX)
            .set(Tirc::DISP_TYPE, 0)
            .set(Tirc::INLINE_RQN, self.rq.rqn as u64)
            .set(Tirc::TRANSPORT_DOMAIN, info.td as u64);
        let out = self.exec(&inp, out_len::<CreateTirOut>(0))?;
        self.tirn = View::<CreateTirOut>::new(&out)
            .expect("sized")
            .get32(CreateTirOut::TIRN);
        self.created.push(QObj::Tir(self.tirn));

        self.add_flow_rule(&info)
    }

    fn add_flow_rule(&mut self, info: &crate::device::DeviceInfo) -> Result<(), Error> {
        let port = self.cfg.udp_port;
        let mut ctl = self.dev.lock();
        let flow = ctl
            .flow
            .as_mut()
            .ok_or_else(|| Error::Config("device has no flow table".into()))?;
        if flow.ports.contains(&Some(port)) {
            return Err(Error::Config(format!(
                "UDP port {port} is already steered to another queue set on {}",
                info.name
            )));
        }
        let index = flow
            .ports
            .iter()
            .position(Option::is_none)
            .ok_or(Error::Exhausted {
                device: info.name.clone(),
                what: "NIC RX flow table entries",
                limit: flow.ports.len(),
            })?;
        let (table_id, group_id) = (flow.table_id, flow.group_id);
        let mut inp = input::<SetFteIn>(Opcode::SetFlowTableEntry, 0, DestFormatStruct::BYTES);
        {
            let mut v = ViewMut::<SetFteIn>::new(&mut inp).expect("sized");
            v.set(SetFteIn::TABLE_TYPE, flow::TABLE_TYPE_NIC_RX as u64)
                .set(SetFteIn::TABLE_ID, table_id as u64)
                .set(SetFteIn::FLOW_INDEX, index as u64);
            let mut fc = v.sub(SetFteIn::FLOW_CONTEXT);
            fc.set(FlowContext::GROUP_ID, group_id as u64)
                .set(FlowContext::ACTION, flow::ACTION_FWD_DEST as u64)
                .set(FlowContext::DESTINATION_LIST_SIZE, 1);
            let dest = (u64::from(flow::DEST_TIR) << 56) | (u64::from(self.tirn) << 32);
            assert!(fc.set_flex(FlowContext::DESTINATION, 0, dest));
            let mut mv = fc.sub(FlowContext::MATCH_VALUE);
            let mut o = mv.sub(FteMatchParam::OUTER_HEADERS);
            let m = info.mac;
            o.set(
                FteMatchSetLyr24::DMAC_47_16,
                u32::from_be_bytes([m[0], m[1], m[2], m[3]]) as u64,
            )
            .set(
                FteMatchSetLyr24::DMAC_15_0,
                u16::from_be_bytes([m[4], m[5]]) as u64,
            )
            .set(FteMatchSetLyr24::ETHERTYPE, 0x0800)
            .set(FteMatchSetLyr24::IP_PROTOCOL, 17)
            .set(FteMatchSetLyr24::UDP_DPORT, port as u64);
        }
        let inner = &self.dev;
        ctl.exec(&inner.bar, &inner.pool, &inp, 16)?;
        ctl.flow.as_mut().expect("checked").ports[index] = Some(port);
        self.flow_index = index as u32;
        self.created.push(QObj::Fte(index as u32));
        Ok(())
    }

    fn create_cq(
        &self,
        ring: &DmaMem,
        log: u32,
        overrun_ignore: bool,
        dbr_off: usize,
    ) -> Result<u32, Error> {
        let pages = ring.len() / PAGE;
        let mut inp = input::<CreateCqIn>(Opcode::CreateCq, 0, pages * 8);
        {
            let mut v = ViewMut::<CreateCqIn>::new(&mut inp).expect("sized");
            for p in 0..pages {
                assert!(v.set_flex(CreateCqIn::PAS, p as u32, ring.iova_at(p * PAGE)));
            }
            let mut c = v.sub(CreateCqIn::CQC);
            c.set(Cqc::CQE_SZ, 0)
                .set(Cqc::OI, u64::from(overrun_ignore))
                .set(Cqc::CQE_COMP_EN, 0)
                .set(Cqc::LOG_CQ_SIZE, log as u64)
                .set(Cqc::UAR_PAGE, self.uar as u64)
                .set(Cqc::C_EQN, self.dev.info.eqn as u64)
                .set(Cqc::LOG_PAGE_SIZE, 0)
                .set(Cqc::DBR_ADDR, self.dbr.iova_at(dbr_off));
        }
        let out = self.exec(&inp, out_len::<CreateCqOut>(0))?;
        Ok(View::<CreateCqOut>::new(&out)
            .expect("sized")
            .get32(CreateCqOut::CQN))
    }

    fn modify_sq(&self, from: QueueState, to: QueueState) -> Result<(), Error> {
        let mut inp = input::<ModifySqIn>(Opcode::ModifySq, 0, 0);
        let mut v = ViewMut::<ModifySqIn>::new(&mut inp).expect("sized");
        v.set(ModifySqIn::SQ_STATE, from as u64)
            .set(ModifySqIn::SQN, self.sq.sqn as u64);
        v.sub(ModifySqIn::CTX).set(Sqc::STATE, to as u64);
        self.exec(&inp, 16).map(|_| ())
    }

    fn modify_rq(&self, from: QueueState, to: QueueState) -> Result<(), Error> {
        let mut inp = input::<ModifyRqIn>(Opcode::ModifyRq, 0, 0);
        let mut v = ViewMut::<ModifyRqIn>::new(&mut inp).expect("sized");
        v.set(ModifyRqIn::RQ_STATE, from as u64)
            .set(ModifyRqIn::RQN, self.rq.rqn as u64);
        v.sub(ModifyRqIn::CTX).set(Rqc::STATE, to as u64);
        self.exec(&inp, 16).map(|_| ())
    }

    // ------------------------------------------------------------------ TX

    /// WQEBBs a frame's WQE takes.
    #[inline]
    fn wqe_ds(&self, f: &TxFrame<'_>) -> u32 {
        let inline = self.inline && f.first.len() >= ETH_L2_INLINE_HEADER_SIZE;
        let eth_ds = if inline { 2 } else { 1 };
        let first_left = if inline {
            f.first.len() - ETH_L2_INLINE_HEADER_SIZE
        } else {
            f.first.len()
        };
        1 + eth_ds + u32::from(first_left > 0) + u32::from(f.rest.len > 0)
    }

    /// Posts a burst of frames with one doorbell. Returns how many were
    /// posted (fewer only if the SQ is full). Fails if the SQ is in error.
    pub fn tx_burst(&mut self, frames: &[TxFrame<'_>]) -> Result<usize, Error> {
        if let Some(cqe) = self.sq.error {
            return Err(self.sq_error(cqe));
        }
        let n = frames.len() as u32;
        // The common case, decided once for the whole burst: no L2 inline
        // (every WQE is one WQEBB), room for all of it, and at most one WQE
        // of it due to ask for a completion, whose predecessor has
        // completed (checked with one poll of the TX CQ if needed).
        if n > 0 && !self.inline {
            // Index in the burst of the WQE to signal (n or more: none).
            let signal_at = self.sq.batch - 1 - self.sq.since_signal.min(self.sq.batch - 1);
            let one_signal = signal_at >= n || signal_at + self.sq.batch >= n;
            if signal_at < n && self.sq.signaled.is_some() && one_signal {
                self.poll_tx_cq()?;
            }
            if one_signal
                && (signal_at >= n || self.sq.signaled.is_none())
                && self.sq.pi.wrapping_sub(self.sq.ci) + n <= self.sq.mask + 1
            {
                self.tx_burst_plain(frames, signal_at);
                return Ok(frames.len());
            }
        }
        let mut posted = 0;
        // WQEs written since the last doorbell, and whether one of them
        // asks for a completion.
        let mut unrung = 0;
        let mut unrung_signaled = false;
        let mut last_off = 0;
        let mut last_wqebbs = 0;
        for f in frames {
            if self.inline && f.first.len() < ETH_L2_INLINE_HEADER_SIZE {
                return Err(Error::Config(format!(
                    "frame's first segment is {} bytes; the device requires the {ETH_L2_INLINE_HEADER_SIZE}-byte L2 header inline",
                    f.first.len()
                )));
            }
            let ds = self.wqe_ds(f);
            let wqebbs = (ds * SEND_WQE_DS as u32).div_ceil(SEND_WQE_BB as u32);
            let signal = self.sq.since_signal + 1 >= self.sq.batch;
            let full = self.sq.pi.wrapping_sub(self.sq.ci) + wqebbs > self.sq.mask + 1;
            if (full || signal) && unrung_signaled {
                // About to wait for a completion that a WQE of this burst,
                // not yet announced to the NIC, must bring: ring for what
                // is written first (with a signal every few sends, less
                // than a burst, this happens within a burst).
                self.ring_sq_doorbell(last_off, last_wqebbs, unrung == 1);
                unrung = 0;
                unrung_signaled = false;
            }
            if signal && !self.wait_signaled()? {
                break;
            }
            if full && !self.reap_until_space(wqebbs)? {
                self.stats.tx_full += 1;
                break;
            }
            last_off = self.write_send_wqe(f, ds, signal);
            last_wqebbs = wqebbs;
            posted += 1;
            unrung += 1;
            unrung_signaled |= signal;
        }
        if unrung > 0 {
            self.ring_sq_doorbell(last_off, last_wqebbs, unrung == 1);
        }
        Ok(posted)
    }

    /// [`QueueSet::tx_burst`] when the caller has checked that every frame
    /// fits (one WQEBB each: no inline header, at most two gather entries),
    /// that the SQ has room for all of them, and that at most one WQE, the
    /// one at `signal_at` (none if that is past the end), asks for a
    /// completion, its predecessor's having arrived: per frame, only the
    /// WQE is built and stored.
    #[inline]
    fn tx_burst_plain(&mut self, frames: &[TxFrame<'_>], signal_at: u32) {
        const _: () = assert!(4 * SEND_WQE_DS == SEND_WQE_BB);
        // The WQE as eight big-endian 64-bit words: control segment (2),
        // Ethernet segment (2, all zero: no inline header, no checksum
        // offload), up to two data segments (2 each, zero if unused).
        const _: () = assert!(
            WqeCtrlSeg::OPMOD_IDX_OPCODE.bit() == 0
                && WqeCtrlSeg::QPN_DS.bit() == 32
                && WqeCtrlSeg::IMM.bit() == 96
                && WqeDataSeg::BYTE_COUNT.bit() == 0
                && WqeDataSeg::LKEY.bit() == 32
                && WqeDataSeg::ADDR.bit() == 64
        );
        // The ring's slots, bounds checked once for the whole burst.
        let slots = self.sq.ring.ring_slots::<8>(self.sq.mask + 1);
        // Control word 0 without the WQE index and DS count: opcode and SQ
        // number, the same for every WQE.
        let ctrl_base = u64::from(WqeOpcode::Send as u32) << 32 | u64::from(self.sq.sqn << 8);
        let ds_of =
            |first_len: u32, rest_len: u32| 2 + u64::from(first_len > 0) + u64::from(rest_len > 0);
        // Word 0 in the device's byte order, for one data segment; the WQE
        // index is or-ed in per WQE (byte-swapped on its own).
        let ctrl_one_be = (ctrl_base | 3).to_be();
        let dseg = |len: u32, lkey: u32, iova: u64| {
            [
                (u64::from(len) << 32 | u64::from(lkey)).to_be(),
                iova.to_be(),
            ]
        };
        let pi0 = self.sq.pi;
        let mut pi = pi0;
        let mut bytes = 0u64;
        for f in frames {
            let first_len = f.first.len() as u32;
            let rest_len = f.rest.len;
            let idx_be = (u64::from(pi & 0xffff) << 40).to_be();
            // Unsignaled: control word 1 (signature, fm_ce_se) stays 0; the
            // one signaled WQE is marked below.
            if first_len > 0 && rest_len == 0 {
                // The common case: the frame in one segment.
                let [a0, a1] = dseg(first_len, f.first_lkey, f.first_iova);
                slots.write(pi, &[ctrl_one_be | idx_be, 0, 0, 0, a0, a1, 0, 0]);
                bytes += u64::from(first_len);
            } else {
                let ctrl_be = (ctrl_base | ds_of(first_len, rest_len)).to_be() | idx_be;
                let rest = dseg(rest_len, f.rest.lkey, f.rest.iova);
                let (a, b) = match (first_len > 0, rest_len > 0) {
                    (true, _) => (dseg(first_len, f.first_lkey, f.first_iova), rest),
                    (false, true) => (rest, [0, 0]),
                    (false, false) => ([0, 0], [0, 0]),
                };
                slots.write(pi, &[ctrl_be, 0, 0, 0, a[0], a[1], b[0], b[1]]);
                bytes += u64::from(first_len) + u64::from(rest_len);
            }
            pi = pi.wrapping_add(1);
        }
        let n = frames.len() as u32;
        self.sq.pi = pi;
        if signal_at < n {
            let at = pi0.wrapping_add(signal_at);
            self.sq.ring.write_be32(
                (at & self.sq.mask) as usize * SEND_WQE_BB + 8,
                u32::from(FmCeSe::CQ_UPDATE.bits()),
            );
            self.sq.signaled = Some(((at & 0xffff) as u16, at.wrapping_add(1)));
            self.sq.since_signal = n - 1 - signal_at;
            self.stats.tx_signaled += 1;
        } else {
            self.sq.since_signal += n;
        }
        self.stats.tx_wqes += u64::from(n);
        self.stats.tx_bytes += bytes;
        if self.cfg.blueflame && n == 1 {
            let last_off = (pi0 & self.sq.mask) as usize * SEND_WQE_BB;
            self.ring_sq_doorbell(last_off, 1, true);
        } else {
            let last = &frames[frames.len() - 1];
            let ds = ds_of(last.first.len() as u32, last.rest.len);
            let ctrl = ctrl_base | u64::from(pi.wrapping_sub(1) & 0xffff) << 40 | ds;
            self.publish_sq_pi();
            self.write_sq_doorbell(ctrl);
        }
    }

    /// Writes one SEND WQE at the producer index; returns its ring offset.
    /// The WQE is built in a local buffer (fixed offsets, no bounds checks)
    /// and copied into the ring in whole WQEBBs, split where the ring
    /// wraps: the slots are the driver's until the doorbell record says
    /// otherwise (ordered by the barrier in `ring_sq_doorbell`).
    #[inline]
    fn write_send_wqe(&mut self, f: &TxFrame<'_>, ds: u32, signal: bool) -> usize {
        const WQE_MAX: usize = MAX_WQEBBS as usize * SEND_WQE_BB;
        let mut w = [0u8; WQE_MAX];
        let put32 = |w: &mut [u8; WQE_MAX], at: usize, v: u32| {
            w[at..at + 4].copy_from_slice(&v.to_be_bytes());
        };
        let idx = self.sq.pi & 0xffff;
        // Control segment (the immediate stays 0).
        put32(
            &mut w,
            WqeCtrlSeg::OPMOD_IDX_OPCODE.dword(),
            (idx << 8) | WqeOpcode::Send as u32,
        );
        put32(&mut w, WqeCtrlSeg::QPN_DS.dword(), (self.sq.sqn << 8) | ds);
        let fm_ce_se = if signal {
            FmCeSe::CQ_UPDATE
        } else {
            FmCeSe::empty()
        };
        put32(&mut w, 8, u32::from(fm_ce_se.bits()));
        // Ethernet segment: cs_flags 0 (headers carry their checksum), mss
        // 0, and the L2 header inline if the device requires it.
        let e = SEND_WQE_DS;
        let (mut seg, first_skip) = if self.inline {
            let h: &[u8; ETH_L2_INLINE_HEADER_SIZE] = f.first[..ETH_L2_INLINE_HEADER_SIZE]
                .try_into()
                .expect("checked by tx_burst");
            put32(
                &mut w,
                e + WqeEthSeg::INLINE_HDR_SZ.dword(),
                ((ETH_L2_INLINE_HEADER_SIZE as u32) << 16)
                    | u32::from(u16::from_be_bytes([h[0], h[1]])),
            );
            let at = e + (WqeEthSeg::INLINE_HDR.bit() / 8) as usize;
            w[at..at + ETH_L2_INLINE_HEADER_SIZE - 2].copy_from_slice(&h[2..]);
            (3, ETH_L2_INLINE_HEADER_SIZE)
        } else {
            (2, 0)
        };
        let mut data_seg = |w: &mut [u8; WQE_MAX], len: u32, lkey: u32, iova: u64| {
            let d = seg * SEND_WQE_DS;
            put32(w, d + WqeDataSeg::BYTE_COUNT.dword(), len);
            put32(w, d + WqeDataSeg::LKEY.dword(), lkey);
            w[d + WqeDataSeg::ADDR.dword()..d + WqeDataSeg::ADDR.dword() + 8]
                .copy_from_slice(&iova.to_be_bytes());
            seg += 1;
        };
        let first_len = f.first.len() - first_skip;
        if first_len > 0 {
            data_seg(
                &mut w,
                first_len as u32,
                f.first_lkey,
                f.first_iova + first_skip as u64,
            );
        }
        if f.rest.len > 0 {
            data_seg(&mut w, f.rest.len, f.rest.lkey, f.rest.iova);
        }
        debug_assert_eq!(seg as u32, ds);
        let wqebbs = (ds * SEND_WQE_DS as u32).div_ceil(SEND_WQE_BB as u32);
        let base = (self.sq.pi & self.sq.mask) as usize * SEND_WQE_BB;
        let ring = &self.sq.ring;
        if wqebbs == 1 {
            ring.write_array::<SEND_WQE_BB>(base, w[..SEND_WQE_BB].try_into().expect("one WQEBB"));
        } else {
            let bytes = wqebbs as usize * SEND_WQE_BB;
            let ring_bytes = (self.sq.mask as usize + 1) * SEND_WQE_BB;
            let first = bytes.min(ring_bytes - base);
            ring.write_bytes(base, &w[..first]);
            ring.write_bytes(0, &w[first..bytes]);
        }
        self.sq.pi = self.sq.pi.wrapping_add(wqebbs);
        if signal {
            self.sq.signaled = Some((idx as u16, self.sq.pi));
            self.sq.since_signal = 0;
            self.stats.tx_signaled += 1;
        } else {
            self.sq.since_signal += 1;
        }
        self.stats.tx_wqes += 1;
        self.stats.tx_bytes += (f.first.len() + f.rest.len as usize) as u64;
        base
    }

    /// Doorbell: WQEs → barrier → doorbell record → barrier → MMIO write of
    /// the last WQE's first 8 bytes (or the whole WQE via BlueFlame).
    #[inline]
    fn ring_sq_doorbell(&mut self, last_off: usize, last_wqebbs: u32, single: bool) {
        self.publish_sq_pi();
        let ring = &self.sq.ring;
        let wqe_bytes = last_wqebbs as usize * SEND_WQE_BB;
        if self.cfg.blueflame
            && single
            && wqe_bytes <= self.sq.bf_half
            && last_off + wqe_bytes <= ring.len()
        {
            let mut buf = [0u8; 256];
            ring.read_bytes(last_off, &mut buf[..wqe_bytes]);
            let reg = self.sq.bf_offset + self.sq.bf_offset_toggle();
            barrier::wc_start();
            self.dev.bar.write_bf(reg, &buf[..wqe_bytes]);
            barrier::wc_flush();
            self.stats.tx_blueflame += 1;
            self.stats.tx_doorbells += 1;
        } else {
            let hi = ring.read_be32(last_off + WqeCtrlSeg::OPMOD_IDX_OPCODE.dword());
            let lo = ring.read_be32(last_off + WqeCtrlSeg::QPN_DS.dword());
            self.write_sq_doorbell((u64::from(hi) << 32) | u64::from(lo));
        }
    }

    /// The WQEs written so far, then the doorbell record that hands them
    /// to the device, then (ordered after it) whatever doorbell follows.
    #[inline(always)]
    fn publish_sq_pi(&self) {
        barrier::to_device();
        self.dbr
            .write_be32(DBR_SQ + 4 * wqe::SND_DBR, self.sq.pi & 0xffff);
        barrier::to_device();
    }

    /// The doorbell register write: `ctrl0` is the last WQE's first 8
    /// control-segment bytes as a big-endian number (opmod, WQE index,
    /// opcode, SQ number, DS count). After [`QueueSet::publish_sq_pi`].
    #[inline(always)]
    fn write_sq_doorbell(&mut self, ctrl0: u64) {
        let reg = self.sq.bf_offset + self.sq.bf_offset_toggle();
        self.dev.bar.write64(reg, ctrl0);
        barrier::wc_flush();
        self.stats.tx_doorbells += 1;
    }

    /// Before a signaled WQE: the previous signaled one must be complete.
    /// Returns false (and posts nothing more) if it did not complete within
    /// the command timeout.
    fn wait_signaled(&mut self) -> Result<bool, Error> {
        let mut spins = 0u32;
        while self.sq.signaled.is_some() {
            self.poll_tx_cq()?;
            if self.sq.signaled.is_none() {
                break;
            }
            spins += 1;
            if spins > 1 << 20 {
                return Ok(false);
            }
            if spins > 1024 {
                self.dev.bar.wait(Duration::from_micros(1));
            }
        }
        Ok(true)
    }

    fn reap_until_space(&mut self, wqebbs: u32) -> Result<bool, Error> {
        for _ in 0..(1 << 16) {
            self.poll_tx_cq()?;
            if self.sq.pi.wrapping_sub(self.sq.ci) + wqebbs <= self.sq.mask + 1 {
                return Ok(true);
            }
            if self.sq.signaled.is_none() {
                // Nothing outstanding can free space.
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// Consumes TX CQEs. A REQ CQE for the signaled WQE frees the ring up
    /// to it; an error CQE puts the SQ in error.
    fn poll_tx_cq(&mut self) -> Result<(), Error> {
        self.stats.tx_cq_polls += 1;
        let cq = &mut self.tx_cq;
        let mask = (1u32 << cq.log) - 1;
        let mut consumed = 0;
        loop {
            let off = (cq.ci & mask) as usize * CQE_BYTES;
            let op_own = cq.ring.load_owner(off + OP_OWN);
            if op_own >> 4 == CqeOpcode::Invalid as u8
                || u32::from(op_own & 1) != (cq.ci >> cq.log) & 1
            {
                break;
            }
            barrier::from_device();
            let mut raw = [0u8; CQE_BYTES];
            cq.ring.read_bytes(off, &mut raw);
            let cqe = Cqe::decode(&raw);
            cq.ci = cq.ci.wrapping_add(1);
            cq.last = Some(cqe);
            consumed += 1;
            if cqe.is_error() {
                tracing::error!(sqn = self.sq.sqn, %cqe, "send error CQE");
                self.sq.error.get_or_insert(cqe);
            } else if let Some((idx, pi_after)) = self.sq.signaled
                && cqe.wqe_counter == idx
            {
                self.sq.ci = pi_after;
                self.sq.signaled = None;
            }
        }
        if consumed > 0 {
            self.stats.tx_cqes += consumed;
            barrier::to_device();
            self.dbr.write_be32(DBR_TX_CQ, cq.ci & 0xff_ffff);
        }
        match self.sq.error {
            Some(cqe) => Err(self.sq_error(cqe)),
            None => Ok(()),
        }
    }

    fn sq_error(&self, cqe: Cqe) -> Error {
        Error::SqInError {
            device: self.dev.info.name.clone(),
            sqn: self.sq.sqn,
            cqe,
        }
    }

    /// Returns once every WQE posted so far has completed: posts a signaled
    /// NOP and waits for its CQE. The rare path (buffer reuse guarantee).
    pub fn tx_flush(&mut self) -> Result<(), Error> {
        if let Some(cqe) = self.sq.error {
            return Err(self.sq_error(cqe));
        }
        if !self.wait_signaled()? {
            return Err(self.flush_timeout());
        }
        if self.sq.pi.wrapping_sub(self.sq.ci) + 1 > self.sq.mask + 1
            && !self.reap_until_space(1)?
        {
            return Err(self.flush_timeout());
        }
        let ring = &self.sq.ring;
        let off = (self.sq.pi & self.sq.mask) as usize * SEND_WQE_BB;
        let idx = self.sq.pi & 0xffff;
        ring.write_be32(
            off + WqeCtrlSeg::OPMOD_IDX_OPCODE.dword(),
            (idx << 8) | WqeOpcode::Nop as u32,
        );
        ring.write_be32(off + WqeCtrlSeg::QPN_DS.dword(), (self.sq.sqn << 8) | 1);
        ring.write_be32(off + 8, u32::from(FmCeSe::CQ_UPDATE.bits()));
        ring.write_be32(off + WqeCtrlSeg::IMM.dword(), 0);
        self.sq.pi = self.sq.pi.wrapping_add(1);
        self.sq.signaled = Some((idx as u16, self.sq.pi));
        self.sq.since_signal = 0;
        self.stats.tx_wqes += 1;
        self.stats.tx_signaled += 1;
        self.ring_sq_doorbell(off, 1, false);
        let timeout = self.dev.lock().cmdq.timeout();
        let mut waited = Duration::ZERO;
        let mut spins = 0u32;
        while self.sq.signaled.is_some() {
            self.poll_tx_cq()?;
            spins += 1;
            if spins > 256 && self.sq.signaled.is_some() {
                if waited >= timeout {
                    return Err(self.flush_timeout());
                }
                let step = Duration::from_micros(10);
                self.dev.bar.wait(step);
                waited += step;
            }
        }
        Ok(())
    }

    fn flush_timeout(&self) -> Error {
        Error::Timeout {
            device: self.dev.info.name.clone(),
            what: format!("TX flush of SQ 0x{:x}", self.sq.sqn),
            waited: Duration::ZERO,
        }
    }

    /// Brings an SQ in error back: drains the TX CQ, ERR → RST → RDY, and
    /// resets the software counters. Frames posted before the error are lost.
    pub fn recover_sq(&mut self) -> Result<(), Error> {
        let _ = self.poll_tx_cq();
        self.modify_sq(QueueState::Err, QueueState::Rst)?;
        self.sq.pi = 0;
        self.sq.ci = 0;
        self.sq.since_signal = 0;
        self.sq.signaled = None;
        self.sq.error = None;
        self.dbr.write_be32(DBR_SQ + 4 * wqe::SND_DBR, 0);
        self.modify_sq(QueueState::Rst, QueueState::Rdy)
    }

    // ------------------------------------------------------------------ RX

    /// Snapshots (wqe id, stride index) in RX CQE `i`, with the torn-read
    /// guard: wqe id, stride index, wqe id again, each load ordered after
    /// the one before it. Only load-load order is needed (the two id reads
    /// bracket the counter read), so the barriers are [`barrier::from_device`]:
    /// free on x86, whose loads are not reordered with older loads (the C++
    /// eRPC's compiler-only `memory_barrier` here), `dmb oshld` on aarch64.
    /// A full fence cost one `mfence` per poll, about half of the idle
    /// event-loop iteration's time on the device model.
    #[inline]
    fn rx_snapshot_raw(&self, i: usize) -> (u16, u16) {
        let ring = &self.rx_cq.ring;
        let off = i * CQE_BYTES;
        loop {
            let id = ring.load_be16(off + WQE_ID);
            barrier::from_device();
            let ctr = ring.load_be16(off + WQE_COUNTER);
            barrier::from_device();
            if ring.load_be16(off + WQE_ID) == id {
                return (id, ctr);
            }
        }
    }

    /// The position in RX CQE `i`, reading `wqe_id` as a free-running
    /// counter.
    #[inline]
    fn rx_snapshot(&self, i: usize) -> u32 {
        let (id, ctr) = self.rx_snapshot_raw(i);
        ((u32::from(id) << self.rq.log_strides) + u32::from(ctr)) & (self.rx_cq.cycle - 1)
    }

    /// Strides posted to the RQ and not yet reported: the most packets the
    /// NIC can have delivered that `rx_burst` has not counted.
    #[inline]
    fn rx_outstanding(&self) -> u32 {
        (self.rq.head << self.rq.log_strides).wrapping_sub(self.rq.reported)
    }

    /// WQEs that may be posted ahead of the last reported packet. While
    /// `wqe_id` could be a ring index, one WQE of the ring stays unposted:
    /// then a slot the NIC has not rewritten yet (it still holds a packet
    /// from the previous lap, up to 7 CQEs back) reads as at least
    /// `ring - 7` strides ahead, which is more than can be outstanding, and
    /// is ignored, exactly as a free-running reading ignores it.
    #[inline]
    fn rx_wqes_ahead(&self) -> u32 {
        let n = 1u32 << self.rq.log_wqes;
        match self.rx_cq.mode {
            RxWqeIdMode::FreeRunning => n,
            _ => n - 1,
        }
    }

    /// Counts packets that arrived since the last call. They occupy ring
    /// slots `[head, head + n)` (mod the ring size), where `head` is the sum
    /// of all earlier results; read them through [`QueueSet::rx_ring`].
    #[inline]
    pub fn rx_burst(&mut self) -> usize {
        let entries = self.cfg.rx_ring_entries() as u32;
        let slot_mask = entries as usize - 1;
        let outstanding = self.rx_outstanding();
        let mut total = 0u32;
        for _ in 0..self.rx_cq.entries {
            let room = outstanding - total;
            let Some((delta, raw)) = self.rx_delta(room) else {
                break;
            };
            // The CQE read is that of the last of the `delta` packets; the
            // ones before it (their CQEs overwritten) have no known flags.
            let flags = self.rx_cqe_flags();
            let first = self.rq.recv_head + total as usize;
            for k in 0..delta as usize - 1 {
                self.rx_cq.flags[(first + k) & slot_mask] = RxCqeFlags::UNKNOWN;
            }
            self.rx_cq.flags[(first + delta as usize - 1) & slot_mask] = flags;
            self.rx_cq.last_raw = raw;
            total += delta;
            self.rx_cq.prev = self.rx_cq.prev.wrapping_add(delta) & (self.rx_cq.cycle - 1);
            self.rx_cq.idx = (self.rx_cq.idx + 1) & (self.rx_cq.entries - 1);
        }
        if total > 0 {
            self.rq.recv_head = (self.rq.recv_head + total as usize) & slot_mask;
            self.rq.reported = self.rq.reported.wrapping_add(total);
            self.stats.rx_pkts += u64::from(total);
            self.stats.rx_bursts += 1;
            if self.rq.to_post >= 1 << self.rq.log_strides {
                self.repost();
            }
        }
        total as usize
    }

    /// The checksum and header-type flags of the RX CQE at `rx_cq.idx`,
    /// whose position was just read, or
    /// [`RxCqeFlags::UNKNOWN`] if they may belong to a later packet.
    ///
    /// The CQ overruns: while the flags are read, the NIC may be rewriting
    /// the slot with the CQE one lap (8 packets) later, and a position
    /// re-read cannot tell, because the device writes the position after
    /// the body. But it writes CQEs in order, each complete (`wqe_id` after
    /// the rest) before the next: so if, after the flags were read, the
    /// slot before still holds the CQE consumed before this one (its
    /// `wqe_id` read first), the rewrite of this slot had not begun when
    /// the flags were read. Otherwise the flags are not trusted.
    #[inline]
    fn rx_cqe_flags(&self) -> RxCqeFlags {
        let ring = &self.rx_cq.ring;
        let idx = self.rx_cq.idx;
        // The position of this CQE was read (with a full barrier) before.
        let f = ring.load_be16(idx * CQE_BYTES + HDS_IP_EXT);
        barrier::from_device();
        let before = ((idx + self.rx_cq.entries - 1) & (self.rx_cq.entries - 1)) * CQE_BYTES;
        let id = ring.load_be16(before + WQE_ID);
        barrier::from_device();
        let ctr = ring.load_be16(before + WQE_COUNTER);
        if (u32::from(id) << 16 | u32::from(ctr)) == self.rx_cq.last_raw {
            RxCqeFlags::from_cqe(f)
        } else {
            RxCqeFlags::UNKNOWN
        }
    }

    /// What the NIC reported in the CQE of the frame in RX ring slot `idx`,
    /// as read by the [`QueueSet::rx_burst`] that reported the slot last:
    /// [`RxCqeFlags::UNKNOWN`] when that frame's own CQE could not be read
    /// (the overrunning CQ had already reused it), or it may not be the
    /// frame's. Unknown is the safe answer: check in software.
    #[inline]
    pub fn rx_cqe_flags_of(&self, idx: usize) -> RxCqeFlags {
        self.rx_cq.flags[idx & (self.rx_cq.flags.len() - 1)]
    }

    /// Packets new in the next RX CQE (at most `room`) and its raw position
    /// (`wqe_id` << 16 | `wqe_counter`), or `None` if it holds nothing new
    /// (or a stale position from the previous lap).
    #[inline]
    fn rx_delta(&mut self, room: u32) -> Option<(u32, u32)> {
        let (id, ctr) = self.rx_snapshot_raw(self.rx_cq.idx);
        let raw = (u32::from(id) << 16) | u32::from(ctr);
        let ls = self.rq.log_strides;
        let wqes = 1u32 << self.rq.log_wqes;
        let ring = wqes << ls;
        let prev = self.rx_cq.prev;
        let valid = |d: u32| d != 0 && d <= room;
        if self.rx_cq.mode != RxWqeIdMode::RingIndex {
            let cur = ((u32::from(id) << ls) + u32::from(ctr)) & (self.rx_cq.cycle - 1);
            let d = cur.wrapping_sub(prev) & (self.rx_cq.cycle - 1);
            if valid(d) {
                if self.rx_cq.mode == RxWqeIdMode::Undetermined && u32::from(id) >= wqes {
                    self.rx_cq.mode = RxWqeIdMode::FreeRunning;
                    tracing::debug!(
                        rqn = self.rq.rqn,
                        "striding RQ wqe_id is a free-running counter"
                    );
                }
                return Some((d, raw));
            }
            if self.rx_cq.mode == RxWqeIdMode::FreeRunning || u32::from(id) >= wqes {
                return None;
            }
        }
        // A ring index (known, or the first packet past the first lap).
        let cur = ((u32::from(id) & (wqes - 1)) << ls) + u32::from(ctr);
        let d = cur.wrapping_sub(prev) & (ring - 1);
        if !valid(d) {
            return None;
        }
        if self.rx_cq.mode == RxWqeIdMode::Undetermined {
            self.rx_cq.mode = RxWqeIdMode::RingIndex;
            tracing::debug!(rqn = self.rq.rqn, "striding RQ wqe_id is a ring index");
        }
        Some((d, raw))
    }

    /// Gives `n` ring slots back (in ring order). Each time a whole WQE's
    /// worth of strides is back, that WQE is reposted.
    #[inline]
    pub fn post_recvs(&mut self, n: usize) {
        self.rq.to_post += n;
        if self.rq.to_post >= 1 << self.rq.log_strides {
            self.repost();
        }
    }

    /// Posts every WQE whose strides are back, as far as the number of
    /// WQEs allowed ahead permits; rings the doorbell if any was posted.
    fn repost(&mut self) {
        let per_wqe = 1usize << self.rq.log_strides;
        let limit = (self.rq.reported >> self.rq.log_strides).wrapping_add(self.rx_wqes_ahead());
        let mut posted = false;
        while self.rq.to_post >= per_wqe && self.rq.head != limit {
            self.write_rq_wqe();
            self.rq.to_post -= per_wqe;
            self.stats.rx_reposts += 1;
            posted = true;
        }
        if posted {
            self.ring_rq_doorbell();
        }
    }

    fn write_rq_wqe(&mut self) {
        let slot = (self.rq.head & ((1 << self.rq.log_wqes) - 1)) as usize;
        let off = slot * MprqWqe::BYTES;
        let wqe_bytes = (1usize << self.rq.log_strides) * self.rq.stride;
        let d = off + MprqWqe::DSEG.byte();
        self.rq.wqes.write_be32(
            off + MprqWqe::NSEG.byte() + WqeSrqNextSeg::NEXT_WQE_INDEX.dword(),
            0,
        );
        self.rq
            .wqes
            .write_be32(d + WqeDataSeg::BYTE_COUNT.dword(), wqe_bytes as u32);
        self.rq
            .wqes
            .write_be32(d + WqeDataSeg::LKEY.dword(), self.lkey);
        self.rq.wqes.write_be64(
            d + WqeDataSeg::ADDR.dword(),
            self.rq.data.iova_at(slot * wqe_bytes),
        );
        self.rq.head = self.rq.head.wrapping_add(1);
    }

    fn ring_rq_doorbell(&self) {
        barrier::to_device();
        self.dbr
            .write_be32(DBR_RQ + 4 * wqe::RCV_DBR, self.rq.head & 0xffff);
    }

    /// The RX ring reader.
    pub fn rx_ring(&self) -> RxRingView {
        RxRingView {
            data: self.rq.data.clone(),
            stride: self.rq.stride,
            entries: self.cfg.rx_ring_entries(),
        }
    }

    // ------------------------------------------------------------- control

    /// Keeps the device's control side alive from the datapath: call it
    /// once per event-loop iteration (the mlx5 transport does, in its
    /// `rx_burst`). Every `control_interval` calls it services the event
    /// queue — answers firmware page requests (which arrive at any time,
    /// not only while a command runs), records CQ errors and port changes,
    /// and publishes the EQ consumer index before the 256-entry EQ can
    /// overrun (a fatal health condition) — and, if the device exposes the
    /// debug endpoint and a client asked, publishes this queue set's
    /// software state. It never waits: if another thread holds the control
    /// lock, it leaves the work to it. Returns true if it serviced the
    /// queue.
    #[inline]
    pub fn poll_control(&mut self) -> bool {
        self.control_countdown -= 1;
        if self.control_countdown != 0 {
            return false;
        }
        self.control_countdown = self.cfg.control_interval;
        self.service_control()
    }

    #[cold]
    fn service_control(&mut self) -> bool {
        self.inspect_if_wanted();
        let dev = &self.dev;
        let mut ctl = match dev.ctl.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.stats.control_busy += 1;
                return false;
            }
        };
        self.stats.control_services += 1;
        if let Err(e) = ctl.service(&dev.bar, &dev.pool) {
            self.stats.control_errors += 1;
            tracing::error!(device = %dev.info.name, error = %e, "event queue service failed");
        }
        true
    }

    /// Settings in effect (the unsignaled batch may have been clamped).
    pub fn config(&self) -> QueueConfig {
        QueueConfig {
            unsignaled_batch: self.sq.batch,
            ..self.cfg
        }
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The device's MAC (source of our frames).
    pub fn mac(&self) -> [u8; 6] {
        self.dev.info.mac
    }

    /// Whether frames carry the L2 header inline.
    pub fn inlines_l2(&self) -> bool {
        self.inline
    }

    /// Software state, cheap (no command).
    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot {
            device: self.dev.info.name.clone(),
            udp_port: self.cfg.udp_port,
            sqn: self.sq.sqn,
            rqn: self.rq.rqn,
            tx_cqn: self.tx_cq.cqn,
            rx_cqn: self.rx_cq.cqn,
            tisn: self.tisn,
            tirn: self.tirn,
            uar: self.uar,
            flow_index: self.flow_index,
            counter_set_id: self.counter_set_id,
            sq_pi: self.sq.pi,
            sq_ci: self.sq.ci,
            sq_unsignaled: self.sq.since_signal,
            sq_signaled_outstanding: self.sq.signaled.is_some(),
            sq_error: self.sq.error,
            tx_cq_ci: self.tx_cq.ci,
            tx_last_cqe: self.tx_cq.last,
            rq_head: self.rq.head,
            rx_recv_head: self.rq.recv_head,
            rx_to_post: self.rq.to_post,
            rx_cqe_idx: self.rx_cq.idx,
            rx_prev_position: self.rx_cq.prev,
            rx_wqe_id_mode: self.rx_cq.mode,
            stats: self.stats,
        }
    }

    /// Hardware's view: QUERY_SQ, QUERY_RQ, QUERY_CQ ×2, QUERY_Q_COUNTER.
    /// Several commands; never call it on the datapath.
    pub fn query_hw(&self) -> Result<HwQueueState, Error> {
        crate::inspect::query_objects(&self.dev, &self.inspect_ids())
    }

    /// Destroys every object now and reports the first failure.
    pub fn close(mut self) -> Result<(), Error> {
        self.destroy()
    }

    fn destroy(&mut self) -> Result<(), Error> {
        let mut first = None;
        let inner = self.dev.clone();
        while let Some(o) = self.created.pop() {
            let mut ctl = inner.lock();
            let (bar, pool) = (&inner.bar, &inner.pool);
            let r = match o {
                QObj::Fte(index) => {
                    let table = ctl.flow.as_ref().map(|f| f.table_id).unwrap_or(0);
                    let mut inp = input::<DeleteFteIn>(Opcode::DeleteFlowTableEntry, 0, 0);
                    ViewMut::<DeleteFteIn>::new(&mut inp)
                        .expect("sized")
                        .set(DeleteFteIn::TABLE_TYPE, flow::TABLE_TYPE_NIC_RX as u64)
                        .set(DeleteFteIn::TABLE_ID, table as u64)
                        .set(DeleteFteIn::FLOW_INDEX, index as u64);
                    let r = ctl.exec(bar, pool, &inp, 16).map(|_| ());
                    if let Some(f) = ctl.flow.as_mut() {
                        f.ports[index as usize] = None;
                    }
                    r
                }
                QObj::Tir(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DestroyTir,
                    DestroyTirIn::TIRN,
                    n,
                ),
                QObj::Rq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroyRq, DestroyRqIn::RQN, n)
                }
                QObj::QCounter(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DeallocQCounter,
                    DeallocQCounterIn::COUNTER_SET_ID,
                    n,
                ),
                QObj::Sq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroySq, DestroySqIn::SQN, n)
                }
                QObj::Tis(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DestroyTis,
                    DestroyTisIn::TISN,
                    n,
                ),
                QObj::Cq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroyCq, DestroyCqIn::CQN, n)
                }
                QObj::Uar(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DeallocUar,
                    DeallocUarIn::UAR,
                    n,
                ),
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "queue-set teardown step failed");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl SendQueue {
    /// Alternates between the two halves of the BlueFlame register so that
    /// consecutive write-combined bursts never merge.
    #[inline]
    fn bf_offset_toggle(&mut self) -> usize {
        let cur = self.bf_toggle;
        self.bf_toggle ^= self.bf_half;
        cur
    }
}

impl<B: HwBackend> Drop for QueueSet<B> {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::error!(error = %e, "queue-set teardown on drop failed");
        }
    }
}
