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
//!
//! The parts, one file each: the settings and their checks (`config`),
//! creating the objects (`create`), the send path (`tx`), the receive path
//! (`rx`), the control side reached from the datapath, accessors and
//! snapshots (`control`), destroying the objects (`teardown`), and the
//! debug-endpoint publication (`inspect`). This file holds the types.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::Inner;
use crate::dma::DmaMem;
use crate::hw::HwBackend;
use crate::prm::cqe::{
    CQE_L3_HDR_TYPE_IPV4, CQE_L3_HDR_TYPE_MASK, CQE_L3_HDR_TYPE_SHIFT, Cqe, Cqe64, CqeChecksum,
};
use crate::prm::wqe::{SEND_WQE_BB, SEND_WQE_MAX_WQEBBS};

mod config;
mod control;
mod create;
mod inspect;
mod rx;
mod teardown;
mod tx;

pub use config::QueueConfig;

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
