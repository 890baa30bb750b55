//! The TX engine: on a send doorbell, fetch WQEs from the hardware
//! consumer counter up to the producer counter in the doorbell record,
//! parse control + Ethernet (+ inline header) + data segments, gather the
//! frame, and hand it to the port; write a CQE when the WQE asks for one,
//! and an error CQE (moving the SQ to ERR) when it is malformed.
//!
//! # Deferred gather
//!
//! A real ConnectX reads a send's data some time after the doorbell, and
//! says it is done with a WQE only through a CQE (sends are mostly
//! unsignaled). Gathering inside the doorbell, as this engine does by
//! default, hides a driver or application that reuses, frees or
//! unregisters a buffer before a CQE covered its send. With
//! [`crate::NicConfig::deferred_tx`] ([`DeferredTx`]) the engine still
//! checks and gathers each WQE at the doorbell (a snapshot), but holds its
//! frame and its CQE, and gathers its data segments again later: at a
//! later doorbell of the same SQ once a seeded number of later WQEs were
//! posted, at the first doorbell or [`crate::SimNic::release_deferred_tx`]
//! past a seeded delay, or when the driver waits
//! ([`mlx5::hw::HwBackend::wait`]: the NIC goes on while the host
//! polls), and never inside the doorbell that posted it. What it gathers
//! then goes on the wire, and held CQEs are written in WQE order after the
//! sends before them were read (a CQE still means that the NIC is done
//! with every earlier WQE). Bytes that differ from the snapshot (a buffer
//! rewritten, or freed and poisoned) count as
//! [`crate::NicStats::tx_deferred_mismatches`]; a memory key or IOMMU
//! mapping that is gone counts as [`crate::NicStats::tx_deferred_faults`]
//! and completes the WQE with an error CQE, as the hardware would. Either
//! panics by default ([`DeferredTx::panic`]) with a message that names the
//! SQ and the WQE. Nothing in the driver's path changes.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mlx5::prm::codes::{CqeOpcode, CqeSyndrome, WqeOpcode};
use mlx5::prm::cqe::{Cqe64, ErrCqe};
use mlx5::prm::wqe::{
    CsFlags, ETH_L2_INLINE_HEADER_SIZE, FmCeSe, INLINE_SEG, SEND_WQE_BB, SEND_WQE_MAX_WQEBBS,
    SND_DBR, WqeCtrlSeg, WqeEthSeg,
};
use mlx5::prm::{View, ViewMut};

use crate::dma::{Dma, DmaSession};
use crate::nic::NicInner;
use crate::objects::{Datapath, IovaPieces, MkeyError};
use crate::packet;
use crate::queues::{Cq, CqPost, Ring, op_own};
use crate::stats::{SqInfo, WqState};
use crate::util::{be32, be64, lock};

/// Smallest frame on the wire (without FCS); shorter frames are padded.
pub const MIN_FRAME: usize = 60;

/// Settings of the deferred-gather mode ([`crate::NicConfig::deferred_tx`];
/// see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferredTx {
    /// A send is gathered again once at most this many later WQEs of its SQ
    /// were posted (drawn per WQE in `0..=max_later_wqes`), at a later
    /// doorbell.
    pub max_later_wqes: u32,
    /// ... or once the fabric clock passed its doorbell by a delay drawn
    /// per WQE in `1..=max_delay_ns` (0: no time bound).
    pub max_delay_ns: u64,
    /// Panic at the first mismatch or fault (else only count them).
    pub panic: bool,
    /// Seed of the draws (mixed with the SQ number).
    pub seed: u64,
}

impl Default for DeferredTx {
    fn default() -> Self {
        DeferredTx {
            max_later_wqes: 32,
            max_delay_ns: 20_000,
            panic: true,
            seed: 0,
        }
    }
}

/// A pointer data segment of a held send, and where its bytes sit in the
/// frame.
#[derive(Debug, Clone, Copy)]
struct Gather {
    lkey: u32,
    addr: u64,
    len: u64,
    at: usize,
}

/// What a send recorded of its gather for a later read.
#[derive(Debug, Default)]
struct Record {
    gathers: Vec<Gather>,
    /// The gathered bytes as read at the doorbell, in segment order.
    snapshot: Vec<u8>,
    cs: u8,
}

/// A WQE whose frame and CQE wait for the later read.
#[derive(Debug)]
struct Held {
    idx: u16,
    opcode: u8,
    /// Signaled: its CQE (with the solicited flag) is written at the read.
    cqe: Option<bool>,
    frame: Option<Vec<u8>>,
    rec: Record,
    doorbell: u64,
    read_at_wqe: u64,
    due_ns: u64,
}

/// An SQ's held WQEs, oldest first (deferred-gather mode).
#[derive(Debug)]
pub(crate) struct HeldQueue {
    cfg: DeferredTx,
    rng: crate::rng::Rng,
    held: VecDeque<Held>,
}

impl HeldQueue {
    pub(crate) fn new(cfg: DeferredTx, sqn: u32) -> HeldQueue {
        HeldQueue {
            cfg,
            rng: crate::rng::Rng::with_stream(cfg.seed, u64::from(sqn)),
            held: VecDeque::new(),
        }
    }

    /// WQEs held now.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// The PF's spoof check on a VF's frame (`VfPolicy::spoofchk`): the
/// source MAC must be the admin MAC, and without one nothing passes
/// (Linux `esw_vport_ingress_config` refuses a zero MAC with spoofchk).
fn spoof_check_passes(cfg: &crate::nic::NicConfig, frame: &[u8]) -> bool {
    if cfg.eswitch != crate::nic::Eswitch::LegacyVf || !cfg.vf_policy.spoofchk {
        return true;
    }
    cfg.mac != [0; 6] && frame.len() >= 12 && frame[6..12] == cfg.mac
}

/// Bytes of the frame check sequence, which the vport MTU counts but which
/// never reaches host memory.
pub const FCS_BYTES: usize = 4;

/// The longest frame (as it is in host memory, without the FCS) a vport
/// MTU lets through. `nic_vport_context.mtu` is a frame length that counts
/// the Ethernet header, one VLAN tag and the FCS: Linux `mlx5e_set_mtu`
/// writes the software MTU + 22 (`ETH_HLEN + VLAN_HLEN + ETH_FCS_LEN`).
pub fn max_frame(vport_mtu: u16) -> usize {
    usize::from(vport_mtu).saturating_sub(FCS_BYTES)
}

/// A send queue.
#[derive(Debug)]
pub(crate) struct Sq {
    pub sqn: u32,
    pub state: WqState,
    pub ring: Ring,
    pub log_sz: u8,
    pub cq: Arc<Mutex<Cq>>,
    pub cqn: u32,
    pub tisn: u32,
    pub pd: u32,
    pub uar: u32,
    pub dbr: u64,
    /// The inline requirement in force: `sqc.min_wqe_inline_mode` when the
    /// Ethernet cap says VPORT_CONTEXT, else the device's own.
    pub min_inline: u8,
    /// `sqc.min_wqe_inline_mode` as written.
    pub min_inline_field: u8,
    /// `sqc.ts_format` as written.
    pub ts_format: u8,
    /// CQE timestamps in real-time format.
    pub real_time: bool,
    pub flush_in_error: bool,
    pub user_index: u32,
    /// Hardware consumer counter in WQEBBs.
    pub cc: u16,
    /// Producer counter last read from the doorbell record.
    pub sw_counter: u16,
    pub doorbells: u64,
    pub wqes: u64,
    pub cqes: u64,
    pub frames: u64,
    pub bytes: u64,
    pub errors: u64,
    pub last_error: Option<u8>,
    /// Injected: the next WQE fails with this syndrome.
    pub fail_next: Option<u8>,
    /// Where the engine reads the WQE it executes (at most
    /// SEND_WQE_MAX_WQEBBS; allocated with the SQ, so a doorbell neither
    /// allocates nor zeroes one). Only meaningful during a doorbell.
    pub wqe_buf: Box<[u8]>,
    /// Deferred-gather mode: the WQEs whose frame and CQE are held.
    pub held: Option<HeldQueue>,
}

/// Bytes of [`Sq::wqe_buf`].
pub(crate) const WQE_BUF_BYTES: usize = SEND_WQE_MAX_WQEBBS * SEND_WQE_BB;

/// A WQE the engine refused.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TxError {
    syndrome: CqeSyndrome,
    /// Model-specific detail, reported in `vendor_err_synd`.
    vendor: u8,
    reason: String,
}

fn err(syndrome: CqeSyndrome, vendor: u8, reason: String) -> TxError {
    TxError {
        syndrome,
        vendor,
        reason,
    }
}

/// Vendor syndromes of the model's TX errors (error CQE byte 0x36).
pub mod vendor {
    /// WQE index in the control segment differs from the consumer counter.
    pub const BAD_INDEX: u8 = 0x01;
    /// SQ number in the control segment is not this SQ.
    pub const BAD_SQN: u8 = 0x02;
    /// DS count zero, or past the producer counter.
    pub const BAD_DS: u8 = 0x03;
    /// Unsupported opcode or opmod.
    pub const BAD_OPCODE: u8 = 0x04;
    /// Ethernet segment missing or inline header past the WQE.
    pub const BAD_ETH_SEG: u8 = 0x05;
    /// Inline header shorter than the SQ's minimum inline mode.
    pub const INLINE_TOO_SHORT: u8 = 0x06;
    /// Data segment runs past the WQE.
    pub const BAD_DATA_SEG: u8 = 0x07;
    /// Zero-length pointer segment (means 2 GiB).
    pub const ZERO_LENGTH: u8 = 0x08;
    /// Memory key invalid or wrong PD.
    pub const BAD_LKEY: u8 = 0x09;
    /// Memory key does not allow local read, or range outside the key.
    pub const MKEY_ACCESS: u8 = 0x0a;
    /// DMA fault while gathering.
    pub const DMA_FAULT: u8 = 0x0b;
    /// Frame longer than the vport MTU allows, or shorter than a header.
    pub const BAD_LENGTH: u8 = 0x0c;
    /// Producer counter more than a ring ahead.
    pub const RING_OVERRUN: u8 = 0x0d;
    /// Injected by the test.
    pub const INJECTED: u8 = 0xee;
    /// Flushed because the SQ is in error.
    pub const FLUSHED: u8 = 0x00;
}

impl Sq {
    fn wqebbs(&self) -> u32 {
        1 << self.log_sz
    }

    fn slot_off(&self, idx: u16) -> u64 {
        u64::from(u32::from(idx) & (self.wqebbs() - 1)) * SEND_WQE_BB as u64
    }

    /// Fills `buf` with the `buf.len() / SEND_WQE_BB` WQEBBs from `idx`,
    /// wrapping around the ring.
    fn read_wqebbs(
        &self,
        io: &DmaSession<'_>,
        idx: u16,
        buf: &mut [u8],
    ) -> Result<(), crate::dma::DmaFault> {
        for (i, bb) in buf.chunks_exact_mut(SEND_WQE_BB).enumerate() {
            let off = self.slot_off(idx.wrapping_add(i as u16));
            self.ring.read(io, off, bb)?;
        }
        Ok(())
    }

    pub(crate) fn info(&self) -> SqInfo {
        SqInfo {
            sqn: self.sqn,
            state: self.state,
            wqebbs: self.wqebbs(),
            hw_counter: self.cc,
            sw_counter: self.sw_counter,
            cqn: self.cqn,
            doorbells: self.doorbells,
            wqes: self.wqes,
            cqes: self.cqes,
            frames: self.frames,
            bytes: self.bytes,
            errors: self.errors,
            last_error: self.last_error,
        }
    }

    fn post_cqe(&mut self, nic: &NicInner, io: &DmaSession<'_>, cqe: &[u8; 64]) {
        if lock(&self.cq).post(nic, io, cqe) == CqPost::Written {
            self.cqes += 1;
        }
    }

    fn error_cqe(
        &mut self,
        nic: &NicInner,
        io: &DmaSession<'_>,
        idx: u16,
        opcode: u8,
        e: &TxError,
    ) {
        let mut c = [0u8; 64];
        {
            let mut v = ViewMut::<ErrCqe>::new(&mut c).expect("64 bytes");
            v.set(ErrCqe::SYNDROME, e.syndrome as u64)
                .set(ErrCqe::VENDOR_ERR_SYND, u64::from(e.vendor))
                .set(
                    ErrCqe::S_WQE_OPCODE_QPN,
                    (u64::from(opcode) << 24) | u64::from(self.sqn),
                )
                .set(ErrCqe::WQE_COUNTER, u64::from(idx))
                .set(
                    ErrCqe::OP_OWN,
                    u64::from(op_own(CqeOpcode::ReqErr as u8, false)),
                );
        }
        self.errors += 1;
        self.last_error = Some(e.syndrome as u8);
        nic.stats.error_cqes.fetch_add(1, Ordering::Relaxed);
        self.post_cqe(nic, io, &c);
    }

    #[allow(clippy::too_many_arguments)]
    fn req_cqe(
        &mut self,
        nic: &NicInner,
        io: &DmaSession<'_>,
        dp: &Datapath,
        idx: u16,
        opcode: u8,
        se: bool,
    ) {
        let mut c = [0u8; 64];
        {
            let mut v = ViewMut::<Cqe64>::new(&mut c).expect("64 bytes");
            v.set(Cqe64::WQE_COUNTER, u64::from(idx))
                .set(
                    Cqe64::SOP_DROP_QPN,
                    (u64::from(opcode) << 24) | u64::from(self.sqn),
                )
                .set(Cqe64::TIMESTAMP, nic.cqe_timestamp(self.real_time))
                .set(Cqe64::OP_OWN, u64::from(op_own(CqeOpcode::Req as u8, se)));
            if dp.cqe_version == 1 {
                v.set(Cqe64::SRQN_UIDX, u64::from(self.user_index));
            }
        }
        self.post_cqe(nic, io, &c);
    }

    /// Moves to ERR after an error CQE; later WQEs are flushed.
    fn enter_error(&mut self, reason: &str) {
        tracing::debug!(sqn = self.sqn, reason, "SQ moved to error");
        self.state = WqState::Err;
    }
}

/// Handles a send doorbell (or BlueFlame write) for `sq`; frames to send
/// are appended to `out` (the caller transmits them after dropping every
/// lock).
pub(crate) fn doorbell(
    nic: &NicInner,
    dp: &Datapath,
    sq: &mut Sq,
    bf: Option<&[u8]>,
    out: &mut Vec<Vec<u8>>,
) {
    sq.doorbells += 1;
    // Every access of this doorbell under one IOMMU session (taken after
    // the SQ's lock, before any CQ's: see `Iommu::session`).
    let io = &nic.iommu.session();
    let pc = match io.load_be32_acquire(sq.dbr + 4 * SND_DBR as u64) {
        Ok(v) => v as u16,
        Err(f) => {
            tracing::warn!(sqn = sq.sqn, %f, "SQ doorbell record unreadable");
            nic.stats
                .sq_doorbells_ignored
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    sq.sw_counter = pc;
    if sq.state == WqState::Rst {
        nic.stats
            .sq_doorbells_ignored
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    if let Some(bf) = bf {
        check_bf(nic, io, sq, bf);
    }
    // Held WQEs of earlier doorbells whose time has come are read first.
    release(nic, io, dp, sq, out, false);
    let ring = sq.wqebbs() as u16;
    let ahead = pc.wrapping_sub(sq.cc);
    if u32::from(ahead) > sq.wqebbs() {
        if sq.state == WqState::Rdy {
            release(nic, io, dp, sq, out, true);
            let e = err(
                CqeSyndrome::LocalQpOperation,
                vendor::RING_OVERRUN,
                format!(
                    "producer {pc} is {ahead} WQEBBs ahead of consumer {} in a ring of {ring}",
                    sq.cc
                ),
            );
            let idx = sq.cc;
            sq.error_cqe(nic, io, idx, 0, &e);
            sq.enter_error(&e.reason);
        }
        sq.cc = pc;
        return;
    }
    // The WQE being executed (at most SEND_WQE_MAX_WQEBBS, checked before
    // it is read), reused for every WQE of the doorbell. Its first WQEBB
    // (the control segment) is read first; the rest only once the control
    // segment has been checked. Only bytes just read are looked at.
    let mut wqe_buf = std::mem::take(&mut sq.wqe_buf);
    if wqe_buf.len() != WQE_BUF_BYTES {
        wqe_buf = vec![0u8; WQE_BUF_BYTES].into_boxed_slice();
    }
    // The NIC's counters get this doorbell's WQEs, frames, bytes and
    // completions once, at its end (the SQ's own counters as it goes).
    let (wqes, frames, bytes) = (sq.wqes, sq.frames, sq.bytes);
    let mut req_cqes = 0u64;
    // Bounded: every iteration advances `cc` by at least one WQEBB towards `pc`.
    while sq.cc != pc {
        let idx = sq.cc;
        let left = pc.wrapping_sub(idx);
        match sq.read_wqebbs(io, idx, &mut wqe_buf[..SEND_WQE_BB]) {
            Ok(()) => {}
            Err(f) => {
                let e = err(CqeSyndrome::LocalAccess, vendor::DMA_FAULT, f.to_string());
                release(nic, io, dp, sq, out, true);
                fail_and_flush(nic, io, sq, idx, 0, 1, &e);
                continue;
            }
        };
        let c = View::<WqeCtrlSeg>::new(&wqe_buf[..SEND_WQE_BB]).expect("64 bytes");
        let opmod_idx_opcode = c.get32(WqeCtrlSeg::OPMOD_IDX_OPCODE);
        let opcode = opmod_idx_opcode as u8;
        let qpn_ds = c.get32(WqeCtrlSeg::QPN_DS);
        let ds = (qpn_ds & 0x3f) as usize;
        let wqebbs = (ds * 16).div_ceil(SEND_WQE_BB).max(1);
        let adv = (wqebbs as u16).min(left);
        sq.wqes += 1;
        if sq.state == WqState::Err {
            if sq.flush_in_error {
                let e = err(
                    CqeSyndrome::WrFlushed,
                    vendor::FLUSHED,
                    "flushed: SQ in error".into(),
                );
                sq.error_cqe(nic, io, idx, opcode, &e);
            }
            sq.cc = sq.cc.wrapping_add(adv);
            continue;
        }
        let fm_ce_se = FmCeSe::from_bits_retain(c.get32(WqeCtrlSeg::FM_CE_SE) as u8);
        // CE 0b10 (CQE) and 0b11 (CQE + EQE) both have the CQ_UPDATE bit.
        let signaled = fm_ce_se.contains(FmCeSe::CQ_UPDATE);
        let se = fm_ce_se.contains(FmCeSe::SOLICITED);
        let mut rec = sq.held.as_ref().map(|_| Record::default());
        let result = check_ctrl(sq, idx, opmod_idx_opcode, qpn_ds, ds, left).and_then(|()| {
            if let Some(s) = sq.fail_next.take() {
                return Err(err(
                    CqeSyndrome::from_raw(s).unwrap_or(CqeSyndrome::LocalQpOperation),
                    vendor::INJECTED,
                    format!("injected error CQE, syndrome {s:#x}"),
                ));
            }
            sq.read_wqebbs(
                io,
                idx.wrapping_add(1),
                &mut wqe_buf[SEND_WQE_BB..wqebbs * SEND_WQE_BB],
            )
            .map_err(|f| err(CqeSyndrome::LocalAccess, vendor::DMA_FAULT, f.to_string()))?;
            execute(nic, io, dp, sq, &wqe_buf[..ds * 16], opcode, rec.as_mut())
        });
        match result {
            Ok(frame) if hold(sq, frame.is_some()) => {
                if let Some(f) = &frame {
                    sq.frames += 1;
                    sq.bytes += f.len() as u64;
                }
                let (doorbell, wqes, now) = (sq.doorbells, sq.wqes, nic.now_ns());
                let q = sq.held.as_mut().expect("hold() checked");
                let later = q.rng.below(u64::from(q.cfg.max_later_wqes) + 1);
                let due_ns = match q.cfg.max_delay_ns {
                    0 => u64::MAX,
                    d => now.saturating_add(1 + q.rng.below(d)),
                };
                q.held.push_back(Held {
                    idx,
                    opcode,
                    cqe: signaled.then_some(se),
                    frame,
                    rec: rec.take().unwrap_or_default(),
                    doorbell,
                    read_at_wqe: wqes + later,
                    due_ns,
                });
                sq.cc = sq.cc.wrapping_add(adv);
            }
            Ok(frame) => {
                if let Some(f) = frame {
                    sq.frames += 1;
                    sq.bytes += f.len() as u64;
                    // Until the link is up the port sends nothing; a VF's
                    // frames pass the PF's spoof check first.
                    if !dp.link_up(nic.now_ns()) {
                        nic.drop_frame(crate::stats::DropReason::LinkDown);
                    } else if !spoof_check_passes(&nic.cfg, &f) {
                        nic.drop_frame(crate::stats::DropReason::Eswitch);
                    } else {
                        out.push(f);
                    }
                }
                if signaled {
                    sq.req_cqe(nic, io, dp, idx, opcode, se);
                    req_cqes += 1;
                }
                sq.cc = sq.cc.wrapping_add(adv);
            }
            Err(e) => {
                tracing::debug!(sqn = sq.sqn, idx, reason = %e.reason, "send WQE error");
                // The error CQE comes after the CQEs of what was held.
                release(nic, io, dp, sq, out, true);
                fail_and_flush(nic, io, sq, idx, opcode, adv, &e);
            }
        }
    }
    sq.wqe_buf = wqe_buf;
    let c = &nic.stats;
    crate::stats::add_counts([
        (&c.wqes, sq.wqes - wqes),
        (&c.tx_frames, sq.frames - frames),
        (&c.tx_bytes, sq.bytes - bytes),
        (&c.tx_cqes, req_cqes),
    ]);
}

/// Deferred-gather mode: whether a WQE that executed is held (a send, or
/// a WQE behind held ones, whose CQE must not overtake theirs).
fn hold(sq: &Sq, sends: bool) -> bool {
    sq.held
        .as_ref()
        .is_some_and(|q| sends || !q.held.is_empty())
}

/// Deferred-gather mode: reads the held WQEs of `sq` that are due (every
/// one with `all`), oldest first: gathers each send's data again, checks
/// it against the doorbell's snapshot, appends what it read to `out` and
/// writes the held CQEs.
pub(crate) fn release(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    sq: &mut Sq,
    out: &mut Vec<Vec<u8>>,
    all: bool,
) {
    // Off, or nothing held: nothing to do (not even a clock read).
    if sq.held.as_ref().is_none_or(|q| q.held.is_empty()) {
        return;
    }
    let now = nic.now_ns();
    let mut again = Vec::new();
    loop {
        let (doorbells, wqes) = (sq.doorbells, sq.wqes);
        let Some(q) = sq.held.as_mut() else {
            return;
        };
        let due = q.held.front().is_some_and(|h| {
            all || h.due_ns <= now || (h.doorbell < doorbells && wqes >= h.read_at_wqe)
        });
        if !due {
            return;
        }
        let h = q.held.pop_front().expect("due");
        let panic = q.cfg.panic;
        nic.stats.tx_deferred_reads.fetch_add(1, Ordering::Relaxed);
        if let Some(mut f) = h.frame {
            again.clear();
            if let Err(why) = regather(io, dp, sq.pd, &h.rec, &mut again) {
                nic.stats.tx_deferred_faults.fetch_add(1, Ordering::Relaxed);
                let msg = format!(
                    "device model, deferred gather: SQ {:#x} WQE {}: {why} when the NIC read it \
                     at {now} ns, after the doorbell. The memory was unregistered or unmapped \
                     while no CQE covered the send: a TX drain is missing.",
                    sq.sqn, h.idx
                );
                report(&msg, panic);
                nic.fabric.recycle(f);
                let e = err(CqeSyndrome::LocalProtection, vendor::BAD_LKEY, msg);
                sq.error_cqe(nic, io, h.idx, h.opcode, &e);
                sq.enter_error(&e.reason);
                continue;
            }
            if again != h.rec.snapshot {
                nic.stats
                    .tx_deferred_mismatches
                    .fetch_add(1, Ordering::Relaxed);
                let differ = again
                    .iter()
                    .zip(&h.rec.snapshot)
                    .filter(|(a, b)| a != b)
                    .count();
                let first = again
                    .iter()
                    .zip(&h.rec.snapshot)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                report(
                    &format!(
                        "device model, deferred gather: SQ {:#x} WQE {}: {differ} of {} gathered \
                         bytes changed between the doorbell and the NIC's read at {now} ns \
                         (first at gathered byte {first}: {:#04x} -> {:#04x}): the buffer was \
                         rewritten or freed while no CQE covered the send. A TX drain is missing.",
                        sq.sqn,
                        h.idx,
                        again.len(),
                        h.rec.snapshot[first],
                        again[first],
                    ),
                    panic,
                );
                // What goes on the wire is what the NIC reads now.
                let mut from = 0;
                for g in &h.rec.gathers {
                    let n = g.len as usize;
                    f[g.at..g.at + n].copy_from_slice(&again[from..from + n]);
                    from += n;
                }
                let cs = CsFlags::from_bits_retain(h.rec.cs);
                if cs.intersects(CsFlags::L3_CSUM | CsFlags::L4_CSUM) {
                    packet::offload_checksums(
                        &mut f,
                        cs.contains(CsFlags::L3_CSUM),
                        cs.contains(CsFlags::L4_CSUM),
                    );
                }
            }
            if !dp.link_up(now) {
                nic.drop_frame(crate::stats::DropReason::LinkDown);
            } else if !spoof_check_passes(&nic.cfg, &f) {
                nic.drop_frame(crate::stats::DropReason::Eswitch);
            } else {
                out.push(f);
            }
        }
        if let Some(se) = h.cqe {
            sq.req_cqe(nic, io, dp, h.idx, h.opcode, se);
            nic.stats.tx_cqes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Deferred gather: `sq` is reset or destroyed with WQEs held. Nothing of
/// them is sent or completed, but their data is read once more, as the NIC
/// may have read it before it stopped: a buffer given back before its
/// drain is still reported. (Memory already gone is not: a teardown may
/// deregister before it destroys.)
pub(crate) fn check_abandoned(nic: &NicInner, dp: &Datapath, sq: &mut Sq) {
    let Some(q) = sq.held.as_mut() else {
        return;
    };
    let held = std::mem::take(&mut q.held);
    let panic = q.cfg.panic;
    let io = nic.iommu.session();
    let mut again = Vec::new();
    for h in held {
        let Some(f) = h.frame else {
            continue;
        };
        nic.fabric.recycle(f);
        again.clear();
        if regather(&io, dp, sq.pd, &h.rec, &mut again).is_ok() && again != h.rec.snapshot {
            nic.stats
                .tx_deferred_mismatches
                .fetch_add(1, Ordering::Relaxed);
            report(
                &format!(
                    "device model, deferred gather: SQ {:#x} WQE {}: gathered bytes changed \
                     while the send was held, found when the SQ was reset or destroyed: the \
                     buffer was rewritten or freed while no CQE covered the send. A TX drain \
                     is missing.",
                    sq.sqn, h.idx
                ),
                panic,
            );
        }
    }
}

/// Gathers a held send's data segments again into `out`, translating
/// their keys anew.
fn regather(
    io: &DmaSession<'_>,
    dp: &Datapath,
    pd: u32,
    rec: &Record,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut pieces = IovaPieces::new();
    for g in &rec.gathers {
        pieces.clear();
        let key = dp
            .mkey(g.lkey, pd)
            .map_err(|e| mkey_err(e, g.lkey, g.addr, g.len).reason)?;
        key.translate(g.addr, g.len, false, &mut pieces)
            .map_err(|e| mkey_err(e, g.lkey, g.addr, g.len).reason)?;
        for &(iova, n) in &pieces {
            io.read_append(iova, n as usize, out)
                .map_err(|f| f.to_string())?;
        }
    }
    Ok(())
}

/// A deferred-gather error: logged, and a panic if asked (not while
/// already unwinding).
fn report(msg: &str, panic: bool) {
    tracing::error!("{msg}");
    if panic && !std::thread::panicking() {
        panic!("{msg}");
    }
}

#[allow(clippy::too_many_arguments)]
fn fail_and_flush(
    nic: &NicInner,
    io: &DmaSession<'_>,
    sq: &mut Sq,
    idx: u16,
    opcode: u8,
    adv: u16,
    e: &TxError,
) {
    sq.error_cqe(nic, io, idx, opcode, e);
    sq.enter_error(&e.reason);
    sq.cc = sq.cc.wrapping_add(adv.max(1));
}

fn check_ctrl(
    sq: &Sq,
    idx: u16,
    opmod_idx_opcode: u32,
    qpn_ds: u32,
    ds: usize,
    left: u16,
) -> Result<(), TxError> {
    let wqe_idx = (opmod_idx_opcode >> 8) as u16;
    if wqe_idx != idx {
        return Err(err(
            CqeSyndrome::LocalQpOperation,
            vendor::BAD_INDEX,
            format!("WQE index {wqe_idx} in the control segment, expected {idx}"),
        ));
    }
    if qpn_ds >> 8 != sq.sqn {
        return Err(err(
            CqeSyndrome::LocalQpOperation,
            vendor::BAD_SQN,
            format!(
                "control segment names SQ {:#x}, not {:#x}",
                qpn_ds >> 8,
                sq.sqn
            ),
        ));
    }
    let wqebbs = (ds * 16).div_ceil(SEND_WQE_BB);
    if ds == 0 || wqebbs > SEND_WQE_MAX_WQEBBS || wqebbs > usize::from(left) {
        return Err(err(
            CqeSyndrome::LocalLength,
            vendor::BAD_DS,
            format!("DS {ds} ({wqebbs} WQEBBs) with {left} WQEBBs posted"),
        ));
    }
    if opmod_idx_opcode >> 24 != 0 {
        return Err(err(
            CqeSyndrome::LocalQpOperation,
            vendor::BAD_OPCODE,
            format!("opmod {:#x} not supported", opmod_idx_opcode >> 24),
        ));
    }
    Ok(())
}

/// Executes one well-framed WQE (`wqe` is exactly DS × 16 bytes).
fn execute(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    sq: &Sq,
    wqe: &[u8],
    opcode: u8,
    rec: Option<&mut Record>,
) -> Result<Option<Vec<u8>>, TxError> {
    match WqeOpcode::from_raw(opcode) {
        Some(WqeOpcode::Nop) => Ok(None),
        Some(WqeOpcode::Send) => send(nic, io, dp, sq, wqe, rec).map(Some),
        _ => Err(err(
            CqeSyndrome::LocalQpOperation,
            vendor::BAD_OPCODE,
            format!("opcode {opcode:#04x} not modeled (NOP and SEND are)"),
        )),
    }
}

fn send(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    sq: &Sq,
    wqe: &[u8],
    mut rec: Option<&mut Record>,
) -> Result<Vec<u8>, TxError> {
    if wqe.len() < 32 {
        return Err(err(
            CqeSyndrome::LocalLength,
            vendor::BAD_ETH_SEG,
            "SEND WQE without an Ethernet segment".into(),
        ));
    }
    // The layout includes 16 bytes of inline tail that a 2-DS WQE lacks.
    let mut eth_bytes = [0u8; 32];
    let n = (wqe.len() - 16).min(32);
    eth_bytes[..n].copy_from_slice(&wqe[16..16 + n]);
    let eth = View::<WqeEthSeg>::new(&eth_bytes).expect("32 bytes");
    let cs_flags = CsFlags::from_bits_retain(eth.get32(WqeEthSeg::CS_FLAGS) as u8);
    let inline = eth.get32(WqeEthSeg::INLINE_HDR_SZ) as usize;
    let inline_start = 16 + (WqeEthSeg::INLINE_HDR_START.bit() / 8) as usize;
    let seg_end = 16 + (0x0e + inline).div_ceil(16).max(1) * 16;
    if seg_end > wqe.len() {
        return Err(err(
            CqeSyndrome::LocalLength,
            vendor::BAD_ETH_SEG,
            format!(
                "inline header of {inline} bytes runs past the {}-byte WQE",
                wqe.len()
            ),
        ));
    }
    // A buffer the fabric delivered before (no allocation per frame).
    let mut frame = nic.fabric.frame_buf();
    frame.reserve(1024);
    frame.extend_from_slice(&wqe[inline_start..inline_start + inline]);
    let mut at = seg_end;
    let mut pieces = IovaPieces::new();
    while at < wqe.len() {
        let bc = be32(wqe, at);
        if bc & INLINE_SEG != 0 {
            let n = (bc & !INLINE_SEG) as usize;
            let end = at + 4 + n;
            if end > wqe.len() {
                return Err(err(
                    CqeSyndrome::LocalLength,
                    vendor::BAD_DATA_SEG,
                    format!("inline data segment of {n} bytes runs past the WQE"),
                ));
            }
            frame.extend_from_slice(&wqe[at + 4..end]);
            at += (4 + n).div_ceil(16) * 16;
            continue;
        }
        let lkey = be32(wqe, at + 4);
        let addr = be64(wqe, at + 8);
        let len = if bc == 0 { 1u64 << 31 } else { u64::from(bc) };
        let max = max_frame(dp.vport.mtu);
        if bc == 0 || frame.len() as u64 + len > max as u64 {
            return Err(err(
                CqeSyndrome::LocalLength,
                if bc == 0 {
                    vendor::ZERO_LENGTH
                } else {
                    vendor::BAD_LENGTH
                },
                format!(
                    "gather of {len} bytes makes the frame longer than {max} (vport MTU {} less the FCS)",
                    dp.vport.mtu
                ),
            ));
        }
        pieces.clear();
        let key = dp
            .mkey(lkey, sq.pd)
            .map_err(|e| mkey_err(e, lkey, addr, len))?;
        key.translate(addr, len, false, &mut pieces)
            .map_err(|e| mkey_err(e, lkey, addr, len))?;
        let start = frame.len();
        for &(iova, n) in &pieces {
            io.read_append(iova, n as usize, &mut frame)
                .map_err(|f| err(CqeSyndrome::LocalAccess, vendor::DMA_FAULT, f.to_string()))?;
        }
        if let Some(r) = rec.as_deref_mut() {
            r.gathers.push(Gather {
                lkey,
                addr,
                len,
                at: start,
            });
            r.snapshot.extend_from_slice(&frame[start..]);
        }
        at += 16;
    }
    if let Some(r) = rec {
        r.cs = cs_flags.bits();
    }
    let max = max_frame(dp.vport.mtu);
    if frame.len() < 14 || frame.len() > max {
        return Err(err(
            CqeSyndrome::LocalLength,
            vendor::BAD_LENGTH,
            format!("frame of {} bytes (needs 14..={max})", frame.len()),
        ));
    }
    let need = required_inline(sq.min_inline, &frame);
    if inline < need {
        return Err(err(
            CqeSyndrome::LocalQpOperation,
            vendor::INLINE_TOO_SHORT,
            format!(
                "inline header of {inline} bytes; the SQ's min_wqe_inline_mode {} needs {need}",
                sq.min_inline
            ),
        ));
    }
    if cs_flags.intersects(CsFlags::L3_CSUM | CsFlags::L4_CSUM) {
        packet::offload_checksums(
            &mut frame,
            cs_flags.contains(CsFlags::L3_CSUM),
            cs_flags.contains(CsFlags::L4_CSUM),
        );
    }
    if frame.len() < MIN_FRAME {
        frame.resize(MIN_FRAME, 0);
    }
    Ok(frame)
}

fn mkey_err(e: MkeyError, lkey: u32, addr: u64, len: u64) -> TxError {
    let (syndrome, v) = match e {
        MkeyError::NoKey | MkeyError::PdMismatch => {
            (CqeSyndrome::LocalProtection, vendor::BAD_LKEY)
        }
        _ => (CqeSyndrome::LocalProtection, vendor::MKEY_ACCESS),
    };
    err(
        syndrome,
        v,
        format!("lkey {lkey:#x} cannot read {len} bytes at {addr:#x}: {e:?}"),
    )
}

/// Bytes of the frame that must be inline for an inline mode (0 none, 1
/// L2, 2 IP, 3 L4). L2 uses rdma-core's 18 bytes (MACs + VLAN tag or
/// EtherType + 4), the others are computed from the headers present.
pub(crate) fn required_inline(mode: u8, frame: &[u8]) -> usize {
    if mode == 0 {
        return 0;
    }
    let l2 = ETH_L2_INLINE_HEADER_SIZE;
    if mode == 1 {
        return l2.min(frame.len());
    }
    let p = packet::parse(frame);
    let l3_end = match p.l3 {
        packet::L3::Ipv4 => p.l3_off + p.ihl_bytes,
        packet::L3::Ipv6 => p.l3_off + 40,
        packet::L3::None => return l2.min(frame.len()),
    };
    let end = if mode >= 3 {
        match p.l4 {
            packet::L4::Udp => p.l4_off + 8,
            packet::L4::Tcp => {
                let doff = frame.get(p.l4_off + 12).map_or(5, |b| usize::from(b >> 4));
                p.l4_off + doff.max(5) * 4
            }
            packet::L4::None => l3_end,
        }
    } else {
        l3_end
    };
    end.max(l2).min(frame.len())
}

/// Compares a BlueFlame copy with the WQE in memory (the model always
/// executes what is in memory).
fn check_bf(nic: &NicInner, io: &DmaSession<'_>, sq: &Sq, bf: &[u8]) {
    if bf.len() < 16 {
        return;
    }
    let idx = (be32(bf, 0) >> 8) as u16;
    // A BlueFlame write is at most half a BlueFlame register (256 bytes),
    // well under a WQE's largest size.
    let n = bf.len().div_ceil(SEND_WQE_BB).min(SEND_WQE_MAX_WQEBBS);
    let mut buf = [0u8; SEND_WQE_MAX_WQEBBS * SEND_WQE_BB];
    let mem = &mut buf[..n * SEND_WQE_BB];
    if sq.read_wqebbs(io, idx, mem).is_err() {
        return;
    }
    let ds = (be32(bf, 4) & 0x3f) as usize;
    let cmp = (ds * 16).min(bf.len()).min(mem.len());
    if mem[..cmp] != bf[..cmp] {
        nic.stats.bf_mismatches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            sqn = sq.sqn,
            idx,
            "BlueFlame copy differs from the WQE in memory"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_requirements() {
        let f = packet::udp_frame([2; 6], [4; 6], [1; 4], [2; 4], 1, 2, &[0; 10]);
        assert_eq!(required_inline(0, &f), 0);
        assert_eq!(required_inline(1, &f), 18);
        assert_eq!(required_inline(2, &f), 34);
        assert_eq!(required_inline(3, &f), 42);
        assert_eq!(required_inline(3, &f[..10]), 10);
    }
}
