//! The RX engine: place a steered frame into the next free stride(s) of the
//! current striding-RQ WQE (or the next WQE of a cyclic RQ) and write the
//! CQE.
//!
//! Striding RQ, per the facts sheet §6.4/6.5: a packet starts at a stride
//! boundary and takes `ceil(len / stride)` strides; if that is more than the
//! current WQE has left, a filler CQE (`byte_cnt` = filler flag | leftover
//! strides << 16) consumes the rest and the packet goes to the next WQE. The
//! CQE carries `wqe_id` = the WQE's free-running 16-bit sequence number,
//! `wqe_counter` = the packet's first stride, `byte_cnt` = strides << 16 |
//! bytes. Packet data is written before the CQE, whose owner byte is
//! written last with a release store ([`crate::queues::Cq::post`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mlx5::prm::ViewMut;
use mlx5::prm::codes::{CqeOpcode, CqeSyndrome};
use mlx5::prm::cqe::{Cqe64, ErrCqe, MPWRQ_FILLER, MPWRQ_STRIDES_SHIFT};
use mlx5::prm::wqe::RCV_DBR;

use crate::dma::{Dma, DmaFault, DmaSession};
use crate::nic::NicInner;
use crate::objects::{Datapath, IovaPieces, QCounter};
use crate::packet::{self, Parsed};
use crate::queues::{Cq, CqPost, Ring, op_own};
use crate::stats::{DropReason, RqInfo, WqState};
use crate::util::{be32, be64};

/// Striding-RQ geometry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Striding {
    pub log_num_strides: u32,
    pub log_stride: u32,
    pub two_byte_shift: bool,
}

/// A receive queue.
#[derive(Debug)]
pub(crate) struct Rq {
    pub rqn: u32,
    pub state: WqState,
    pub ring: Ring,
    /// log2 WQEs.
    pub log_sz: u8,
    /// log2 bytes per WQE slot.
    pub log_wqe: u8,
    pub striding: Option<Striding>,
    pub cq: Arc<Mutex<Cq>>,
    pub cqn: u32,
    pub counter: Option<Arc<QCounter>>,
    pub counter_id: u32,
    pub pd: u32,
    pub dbr: u64,
    pub user_index: u32,
    pub flush_in_error: bool,
    pub vsd: bool,
    /// `rqc.ts_format` as written.
    pub ts_format: u8,
    /// CQE timestamps in real-time format.
    pub real_time: bool,
    /// WQEs consumed (free-running).
    pub seq: u32,
    pub stride_idx: u32,
    pub sw_counter: u16,
    /// Translation of the current striding WQE's buffer: (seq, pieces).
    cur: Option<(u32, IovaPieces)>,
    pub packets: u64,
    pub bytes: u64,
    pub oob: u64,
    pub fillers: u64,
    pub cqes: u64,
    /// CQEs posted, written or lost (added to the NIC's `rx_cqes` by the
    /// caller once per batch).
    pub cqe_posts: u64,
}

/// Why a receive WQE could not be used.
#[derive(Debug)]
enum WqeError {
    Dma(DmaFault),
    Protection(String),
    Length(String),
}

impl Rq {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rqn: u32,
        ring: Ring,
        log_sz: u8,
        log_wqe: u8,
        striding: Option<Striding>,
        cq: Arc<Mutex<Cq>>,
        cqn: u32,
        counter: Option<(u32, Arc<QCounter>)>,
        pd: u32,
        dbr: u64,
        user_index: u32,
        flush_in_error: bool,
        vsd: bool,
    ) -> Rq {
        let (counter_id, counter) = match counter {
            Some((id, c)) => (id, Some(c)),
            None => (0, None),
        };
        Rq {
            rqn,
            state: WqState::Rst,
            ring,
            log_sz,
            log_wqe,
            striding,
            cq,
            cqn,
            counter,
            counter_id,
            pd,
            dbr,
            user_index,
            flush_in_error,
            vsd,
            ts_format: 0,
            real_time: false,
            seq: 0,
            stride_idx: 0,
            sw_counter: 0,
            cur: None,
            packets: 0,
            bytes: 0,
            oob: 0,
            fillers: 0,
            cqes: 0,
            cqe_posts: 0,
        }
    }

    /// Back to the reset state (counters of the ring start over).
    pub(crate) fn reset(&mut self) {
        self.seq = 0;
        self.stride_idx = 0;
        self.cur = None;
    }

    pub(crate) fn info(&self) -> RqInfo {
        RqInfo {
            rqn: self.rqn,
            state: self.state,
            striding: self.striding.is_some(),
            wqes: 1 << self.log_sz,
            hw_counter: self.seq,
            sw_counter: self.sw_counter,
            stride_index: self.stride_idx,
            cqn: self.cqn,
            packets: self.packets,
            bytes: self.bytes,
            out_of_buffer: self.oob,
            fillers: self.fillers,
            cqes: self.cqes,
        }
    }

    /// The CQE `wqe_id` of the current WQE: its free-running sequence
    /// number, or its ring index, as the device profile says.
    fn wqe_id(&self, nic: &NicInner) -> u16 {
        match nic.cfg.wqe_id_mode {
            crate::nic::WqeIdMode::FreeRunning => self.seq as u16,
            crate::nic::WqeIdMode::RingIndex => (self.seq & ((1 << self.log_sz) - 1)) as u16,
        }
    }

    fn wqe_off(&self, seq: u32) -> u64 {
        u64::from(seq & ((1 << self.log_sz) - 1)) << self.log_wqe
    }

    fn out_of_buffer(&mut self) -> DropReason {
        self.oob += 1;
        if let Some(c) = &self.counter {
            c.out_of_buffer.fetch_add(1, Ordering::Relaxed);
        }
        DropReason::OutOfBuffer
    }

    /// Translates the data segment at `off` of the WQE slot for `seq`.
    #[allow(clippy::too_many_arguments)]
    fn translate_dseg(
        &self,
        io: &DmaSession<'_>,
        dp: &Datapath,
        seq: u32,
        dseg_off: u64,
        need: u64,
        out: &mut IovaPieces,
    ) -> Result<Option<u64>, WqeError> {
        let mut d = [0u8; 16];
        self.ring
            .read(io, self.wqe_off(seq) + dseg_off, &mut d)
            .map_err(WqeError::Dma)?;
        let bc = u64::from(be32(&d, 0) & 0x7fff_ffff);
        let lkey = be32(&d, 4);
        let addr = be64(&d, 8);
        if lkey == 0x100 || (bc == 0 && need == 0) {
            return Ok(None);
        }
        if bc < need {
            return Err(WqeError::Length(format!(
                "receive WQE {seq} buffer of {bc} bytes, {need} needed"
            )));
        }
        let len = if need == 0 { bc } else { need };
        dp.mkey(lkey, self.pd)
            .and_then(|k| k.translate(addr, len, true, out))
            .map_err(|e| {
                WqeError::Protection(format!(
                    "receive WQE {seq}: lkey {lkey:#x} cannot write {len} bytes at {addr:#x}: {e:?}"
                ))
            })?;
        Ok(Some(len))
    }
}

/// Writes `data` at byte `off` of a buffer made of `pieces`.
fn write_pieces(
    io: &DmaSession<'_>,
    pieces: &[(u64, u64)],
    mut off: u64,
    mut data: &[u8],
) -> Result<(), DmaFault> {
    for &(iova, n) in pieces {
        if data.is_empty() {
            break;
        }
        if off >= n {
            off -= n;
            continue;
        }
        let take = ((n - off) as usize).min(data.len());
        io.write(iova + off, &data[..take])?;
        data = &data[take..];
        off = 0;
    }
    Ok(())
}

/// The position and length fields of a receive CQE.
#[derive(Debug, Clone, Copy)]
struct Place {
    byte_cnt: u32,
    wqe_id: u16,
    wqe_counter: u16,
    flow_tag: u32,
}

/// A received frame's CQE.
fn rx_cqe(
    dp: &Datapath,
    rq: &Rq,
    parsed: &Parsed,
    vlan_tci: Option<u16>,
    at: Place,
    now: u64,
) -> [u8; 64] {
    let mut c = [0u8; 64];
    let mut v = ViewMut::<Cqe64>::new(&mut c).expect("64 bytes");
    let mut hdr = packet::cqe_hdr_type(parsed) & !1;
    if let Some(tci) = vlan_tci {
        hdr |= 1;
        v.set(Cqe64::VLAN_INFO, u64::from(tci));
    }
    v.set(Cqe64::WQE_ID, u64::from(at.wqe_id))
        .set(Cqe64::HDS_IP_EXT, u64::from(packet::cqe_csum_flags(parsed)))
        .set(Cqe64::L4_HDR_TYPE_ETC, u64::from(hdr))
        .set(Cqe64::BYTE_CNT, u64::from(at.byte_cnt))
        .set(Cqe64::TIMESTAMP, now)
        .set(Cqe64::SOP_DROP_QPN, u64::from(at.flow_tag & 0x00ff_ffff))
        .set(Cqe64::WQE_COUNTER, u64::from(at.wqe_counter))
        .set(
            Cqe64::OP_OWN,
            u64::from(op_own(CqeOpcode::RespSend as u8, false)),
        );
    if dp.cqe_version == 1 {
        v.set(Cqe64::SRQN_UIDX, u64::from(rq.user_index & 0x00ff_ffff));
    }
    c
}

fn post(
    nic: &NicInner,
    io: &DmaSession<'_>,
    rq: &mut Rq,
    cq: &mut Cq,
    cqe: &[u8; 64],
) -> Result<(), DropReason> {
    let r = cq.post(nic, io, cqe);
    rq.cqe_posts += 1;
    match r {
        CqPost::Written => {
            rq.cqes += 1;
            Ok(())
        }
        CqPost::Lost => Err(DropReason::CqError),
    }
}

fn wqe_failed(
    nic: &NicInner,
    io: &DmaSession<'_>,
    rq: &mut Rq,
    cq: &mut Cq,
    e: WqeError,
    wqe_counter: u16,
) -> DropReason {
    let (syndrome, reason) = match e {
        WqeError::Dma(f) => (CqeSyndrome::LocalAccess, f.to_string()),
        WqeError::Protection(s) => (CqeSyndrome::LocalProtection, s),
        WqeError::Length(s) => (CqeSyndrome::LocalLength, s),
    };
    tracing::debug!(rqn = rq.rqn, %reason, "receive WQE error; RQ to error");
    let mut c = [0u8; 64];
    {
        let mut v = ViewMut::<ErrCqe>::new(&mut c).expect("64 bytes");
        v.set(ErrCqe::SYNDROME, syndrome as u64)
            .set(ErrCqe::S_WQE_OPCODE_QPN, u64::from(rq.rqn))
            .set(ErrCqe::WQE_COUNTER, u64::from(wqe_counter))
            .set(
                ErrCqe::OP_OWN,
                u64::from(op_own(CqeOpcode::RespErr as u8, false)),
            );
    }
    nic.stats.error_cqes.fetch_add(1, Ordering::Relaxed);
    let _ = post(nic, io, rq, cq, &c);
    rq.state = WqState::Err;
    DropReason::RqWqeError
}

/// Delivers `frame` into `rq` (whose CQ is `cq`, locked by the caller).
#[allow(clippy::too_many_arguments)]
pub(crate) fn deliver(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    rq: &mut Rq,
    cq: &mut Cq,
    frame: &[u8],
    parsed: &Parsed,
    flow_tag: u32,
) -> Result<(), DropReason> {
    if rq.state != WqState::Rdy {
        return Err(DropReason::RqNotReady);
    }
    let posted = match io.load_be32_acquire(rq.dbr + 4 * RCV_DBR as u64) {
        Ok(v) => v as u16,
        Err(_) => return Err(DropReason::DmaFault),
    };
    rq.sw_counter = posted;
    // VLAN stripping unless `vsd`, into a frame buffer of the fabric's
    // pool (no allocation per frame), given back after delivery.
    match parsed.vlan {
        Some((_, tci)) if !rq.vsd && frame.len() >= 18 => {
            let mut f = nic.fabric.frame_buf();
            f.extend_from_slice(&frame[..12]);
            f.extend_from_slice(&frame[16..]);
            let r = deliver_data(nic, io, dp, rq, cq, posted, &f, parsed, Some(tci), flow_tag);
            nic.fabric.recycle(f);
            r
        }
        _ => deliver_data(nic, io, dp, rq, cq, posted, frame, parsed, None, flow_tag),
    }
}

#[allow(clippy::too_many_arguments)]
fn deliver_data(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    rq: &mut Rq,
    cq: &mut Cq,
    posted: u16,
    data: &[u8],
    parsed: &Parsed,
    tci: Option<u16>,
    flow_tag: u32,
) -> Result<(), DropReason> {
    let len = data.len();
    match rq.striding {
        Some(s) => deliver_striding(nic, io, dp, rq, cq, s, posted, data, parsed, tci, flow_tag),
        None => deliver_cyclic(
            nic, io, dp, rq, cq, posted, data, len, parsed, tci, flow_tag,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn deliver_striding(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    rq: &mut Rq,
    cq: &mut Cq,
    s: Striding,
    posted: u16,
    data: &[u8],
    parsed: &Parsed,
    tci: Option<u16>,
    flow_tag: u32,
) -> Result<(), DropReason> {
    let stride = 1u64 << s.log_stride;
    let nstrides = 1u32 << s.log_num_strides;
    let shift = if s.two_byte_shift { 2 } else { 0 };
    let need = (data.len() as u64 + shift).div_ceil(stride).max(1) as u32;
    if need > nstrides || data.len() > 0xffff {
        return Err(DropReason::PacketTooLarge);
    }
    // At most two WQEs are looked at: the current one (maybe closed by a
    // filler) and the next.
    for _ in 0..2 {
        if posted.wrapping_sub(rq.seq as u16) == 0 {
            return Err(rq.out_of_buffer());
        }
        if rq.cur.as_ref().is_none_or(|(seq, _)| *seq != rq.seq) {
            let mut pieces = IovaPieces::new();
            let whole = stride << s.log_num_strides;
            match rq.translate_dseg(io, dp, rq.seq, 0x10, whole, &mut pieces) {
                Ok(_) => rq.cur = Some((rq.seq, pieces)),
                Err(e) => {
                    let idx = rq.stride_idx as u16;
                    return Err(wqe_failed(nic, io, rq, cq, e, idx));
                }
            }
        }
        let left = nstrides - rq.stride_idx;
        if need <= left {
            break;
        }
        // Filler: close the WQE.
        let byte_cnt = MPWRQ_FILLER | (left << MPWRQ_STRIDES_SHIFT);
        let at = Place {
            byte_cnt,
            wqe_id: rq.wqe_id(nic),
            wqe_counter: rq.stride_idx as u16,
            flow_tag: 0,
        };
        let c = rx_cqe(dp, rq, parsed, None, at, nic.cqe_timestamp(rq.real_time));
        rq.fillers += 1;
        nic.stats.filler_cqes.fetch_add(1, Ordering::Relaxed);
        post(nic, io, rq, cq, &c)?;
        rq.seq = rq.seq.wrapping_add(1);
        rq.stride_idx = 0;
    }
    let Some((_, pieces)) = rq.cur.as_ref() else {
        return Err(DropReason::RqWqeError);
    };
    let off = u64::from(rq.stride_idx) * stride + shift;
    if let Err(f) = write_pieces(io, pieces, off, data) {
        let idx = rq.stride_idx as u16;
        return Err(wqe_failed(nic, io, rq, cq, WqeError::Dma(f), idx));
    }
    let byte_cnt = (need << MPWRQ_STRIDES_SHIFT) | data.len() as u32;
    let at = Place {
        byte_cnt,
        wqe_id: rq.wqe_id(nic),
        wqe_counter: rq.stride_idx as u16,
        flow_tag,
    };
    let c = rx_cqe(dp, rq, parsed, tci, at, nic.cqe_timestamp(rq.real_time));
    rq.stride_idx += need;
    if rq.stride_idx == nstrides {
        rq.seq = rq.seq.wrapping_add(1);
        rq.stride_idx = 0;
    }
    rq.packets += 1;
    rq.bytes += data.len() as u64;
    post(nic, io, rq, cq, &c)
}

#[allow(clippy::too_many_arguments)]
fn deliver_cyclic(
    nic: &NicInner,
    io: &DmaSession<'_>,
    dp: &Datapath,
    rq: &mut Rq,
    cq: &mut Cq,
    posted: u16,
    data: &[u8],
    len: usize,
    parsed: &Parsed,
    tci: Option<u16>,
    flow_tag: u32,
) -> Result<(), DropReason> {
    if posted.wrapping_sub(rq.seq as u16) == 0 {
        return Err(rq.out_of_buffer());
    }
    let seq = rq.seq;
    let nseg = (1u64 << rq.log_wqe) / 16;
    let mut pieces = IovaPieces::new();
    let mut room = 0u64;
    for i in 0..nseg {
        match rq.translate_dseg(io, dp, seq, i * 16, 0, &mut pieces) {
            Ok(Some(n)) => room += n,
            Ok(None) => break,
            Err(e) => return Err(wqe_failed(nic, io, rq, cq, e, seq as u16)),
        }
    }
    rq.seq = rq.seq.wrapping_add(1);
    if (len as u64) > room || len > 0xffff {
        let e = WqeError::Length(format!(
            "packet of {len} bytes, receive WQE {seq} holds {room}"
        ));
        return Err(wqe_failed(nic, io, rq, cq, e, seq as u16));
    }
    if let Err(f) = write_pieces(io, &pieces, 0, data) {
        return Err(wqe_failed(nic, io, rq, cq, WqeError::Dma(f), seq as u16));
    }
    let at = Place {
        byte_cnt: len as u32,
        wqe_id: 0,
        wqe_counter: seq as u16,
        flow_tag,
    };
    let c = rx_cqe(dp, rq, parsed, tci, at, nic.cqe_timestamp(rq.real_time));
    rq.packets += 1;
    rq.bytes += len as u64;
    post(nic, io, rq, cq, &c)
}
