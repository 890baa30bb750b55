//! The send path: bursts of WQEs, one doorbell per burst, the TX CQ polled
//! only when a signaled WQE is due.

use std::time::Duration;

use crate::barrier;
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::codes::{CqeOpcode, QueueState, WqeOpcode};
use crate::prm::cqe::Cqe;
use crate::prm::wqe::{
    self, ETH_L2_INLINE_HEADER_SIZE, FmCeSe, SEND_WQE_BB, SEND_WQE_DS, WqeCtrlSeg, WqeDataSeg,
    WqeEthSeg,
};

use super::{CQE_BYTES, DBR_SQ, DBR_TX_CQ, MAX_WQEBBS, OP_OWN, QueueSet, SendQueue, TxFrame};

impl<B: HwBackend> QueueSet<B> {
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
        // The preconditions above, checked in debug builds (the release
        // datapath pays nothing for them).
        let n = frames.len() as u32;
        debug_assert!(n > 0, "an empty burst has no WQE to ring for");
        debug_assert!(!self.inline, "one WQEBB per frame: no inline header");
        debug_assert!(
            self.sq.pi.wrapping_sub(self.sq.ci) + n <= self.sq.mask + 1,
            "the SQ has room for the whole burst"
        );
        debug_assert_eq!(
            signal_at,
            self.sq.batch - 1 - self.sq.since_signal.min(self.sq.batch - 1),
            "the WQE to signal is the one the unsignaled count makes due"
        );
        debug_assert!(
            signal_at >= n || signal_at + self.sq.batch >= n,
            "at most one WQE of the burst asks for a completion"
        );
        debug_assert!(
            signal_at >= n || self.sq.signaled.is_none(),
            "the previous signaled WQE has completed"
        );
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
        debug_assert!(self.sq.since_signal < self.sq.batch);
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
        debug_assert!(wqebbs <= MAX_WQEBBS, "the WQE fits its buffer");
        debug_assert!(
            self.sq.pi.wrapping_sub(self.sq.ci) + wqebbs <= self.sq.mask + 1,
            "the caller made room in the SQ"
        );
        debug_assert!(
            !signal || self.sq.signaled.is_none(),
            "one signaled WQE outstanding at a time"
        );
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
        debug_assert!(self.sq.since_signal < self.sq.batch);
        base
    }

    /// Doorbell: WQEs → barrier → doorbell record → barrier → MMIO write of
    /// the last WQE's first 8 bytes (or the whole WQE via BlueFlame).
    #[inline]
    fn ring_sq_doorbell(&mut self, last_off: usize, last_wqebbs: u32, single: bool) {
        self.publish_sq_pi();
        let ring = &self.sq.ring;
        debug_assert!(
            last_off.is_multiple_of(SEND_WQE_BB) && last_off < ring.len(),
            "the last WQE starts at a WQEBB of the ring"
        );
        debug_assert!((1..=MAX_WQEBBS).contains(&last_wqebbs));
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
                debug_assert!(
                    pi_after.wrapping_sub(self.sq.ci) <= self.sq.pi.wrapping_sub(self.sq.ci),
                    "a completion frees only WQEBBs that were posted"
                );
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
