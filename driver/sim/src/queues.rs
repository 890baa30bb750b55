//! Rings in host memory (described by PAS page lists), and the EQ and CQ
//! writers: entry body first, ownership byte last with a release store.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mlx5::prm::codes::{EventType, HealthSyndrome};
use mlx5::prm::cqe::{CQE_OPCODE_SHIFT, Cqe64, Eqe, EqeCqErr};
use mlx5::prm::{View, ViewMut};

use crate::dma::{Dma, DmaFault, FaultKind};
use crate::nic::NicInner;
use crate::stats::{CqInfo, EqInfo};
use crate::util::lock;

/// A buffer made of equal pages given by a PAS list.
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    pages: Vec<u64>,
    page_shift: u32,
    bytes: u64,
}

impl Ring {
    /// `bytes` of ring over `pages` of `1 << page_shift` bytes each.
    pub(crate) fn new(pages: Vec<u64>, page_shift: u32, bytes: u64) -> Ring {
        Ring {
            pages,
            page_shift,
            bytes,
        }
    }

    /// Pages needed for `bytes` with `page_shift`.
    pub(crate) fn pages_for(bytes: u64, page_shift: u32) -> u64 {
        bytes.div_ceil(1u64 << page_shift)
    }

    fn oob(&self, off: u64, len: usize, write: bool) -> DmaFault {
        DmaFault {
            iova: off,
            len,
            write,
            kind: FaultKind::Unmapped,
        }
    }

    /// Device address of byte `off` and the bytes left in its page.
    pub(crate) fn iova_of(&self, off: u64) -> Option<(u64, u64)> {
        if off >= self.bytes {
            return None;
        }
        let psz = 1u64 << self.page_shift;
        let page = *self.pages.get((off >> self.page_shift) as usize)?;
        let in_page = off & (psz - 1);
        Some((page + in_page, psz - in_page))
    }

    /// Reads `buf.len()` bytes at ring offset `off` (no wrap).
    pub(crate) fn read(&self, io: &impl Dma, off: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let mut done = 0usize;
        while done < buf.len() {
            let (iova, left) = self
                .iova_of(off + done as u64)
                .ok_or_else(|| self.oob(off, buf.len(), false))?;
            let n = (left as usize).min(buf.len() - done);
            io.read(iova, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at ring offset `off` (no wrap).
    pub(crate) fn write(&self, io: &impl Dma, off: u64, data: &[u8]) -> Result<(), DmaFault> {
        let mut done = 0usize;
        while done < data.len() {
            let (iova, left) = self
                .iova_of(off + done as u64)
                .ok_or_else(|| self.oob(off, data.len(), true))?;
            let n = (left as usize).min(data.len() - done);
            io.write(iova, &data[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Release-stores one byte at `off`.
    pub(crate) fn store_u8(&self, io: &impl Dma, off: u64, v: u8) -> Result<(), DmaFault> {
        let (iova, _) = self.iova_of(off).ok_or_else(|| self.oob(off, 1, true))?;
        io.store_u8_release(iova, v)
    }

    /// Release-stores a big-endian u16 at `off` (2-byte aligned).
    pub(crate) fn store_be16(&self, io: &impl Dma, off: u64, v: u16) -> Result<(), DmaFault> {
        let (iova, _) = self.iova_of(off).ok_or_else(|| self.oob(off, 2, true))?;
        io.store_be16_release(iova, v)
    }
}

/// Mask of 24-bit counters.
pub(crate) const MASK24: u32 = 0x00ff_ffff;

/// Byte offsets in a CQE of the two 16-bit fields a reader snapshots
/// (written with release stores, after the body).
const CQE_WQE_ID_OFF: usize = (Cqe64::WQE_ID.bit() / 8) as usize;
const CQE_WQE_COUNTER_OFF: usize = (Cqe64::WQE_COUNTER.bit() / 8) as usize;

/// An event queue.
#[derive(Debug)]
pub(crate) struct Eq {
    pub eqn: u32,
    pub ring: Ring,
    pub log_size: u8,
    pub uar: u32,
    pub intr: u16,
    pub mask: u64,
    pub pc: u32,
    pub ci: u32,
    pub armed: bool,
    pub status: u8,
    pub overruns: u64,
}

/// Why an EQE was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EqPostError {
    /// The EQ is full (consumer index not advanced).
    Overrun,
    /// Writing the entry faulted.
    Dma(DmaFault),
}

impl Eq {
    pub(crate) fn entries(&self) -> u32 {
        1 << self.log_size
    }

    pub(crate) fn subscribed(&self, t: EventType) -> bool {
        self.mask & (1u64 << (t as u8)) != 0
    }

    /// Writes one EQE. An overrun of an EQ that takes asynchronous events
    /// is a fatal health condition (syndrome 0xc), as on hardware.
    pub(crate) fn post(
        &mut self,
        nic: &NicInner,
        io: &impl Dma,
        typ: EventType,
        sub_type: u8,
        data: &[u8; 28],
    ) -> Result<(), EqPostError> {
        let n = self.entries();
        if self.pc.wrapping_sub(self.ci) & MASK24 >= n || self.status != 0 {
            self.overruns += 1;
            self.status = 0xa;
            nic.stats.eq_overruns.fetch_add(1, Ordering::Relaxed);
            if typ != EventType::Completion {
                nic.health
                    .set_syndrome(HealthSyndrome::AsyncEqOverrun as u8);
            }
            tracing::warn!(eqn = self.eqn, event = %typ, "EQ overrun: event lost");
            return Err(EqPostError::Overrun);
        }
        let slot = u64::from(self.pc & (n - 1));
        let mut e = [0u8; 64];
        {
            let mut v = ViewMut::<Eqe>::new(&mut e).expect("64 bytes");
            v.set(Eqe::TYPE, typ as u64)
                .set(Eqe::SUB_TYPE, u64::from(sub_type));
        }
        e[0x20..0x3c].copy_from_slice(data);
        let owner = ((self.pc >> self.log_size) & 1) as u8;
        let off = slot * 64;
        self.ring
            .write(io, off, &e[..0x3f])
            .and_then(|_| self.ring.store_u8(io, off + 0x3f, owner))
            .map_err(EqPostError::Dma)?;
        self.pc = (self.pc + 1) & MASK24;
        nic.stats.eqes.fetch_add(1, Ordering::Relaxed);
        if self.armed {
            self.armed = false;
            nic.stats.interrupts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// EQ doorbell: new consumer index, optionally arming.
    pub(crate) fn doorbell(&mut self, nic: &NicInner, ci: u32, arm: bool) {
        self.ci = ci & MASK24;
        if arm {
            if self.ci != self.pc {
                nic.stats.interrupts.fetch_add(1, Ordering::Relaxed);
            } else {
                self.armed = true;
            }
        }
    }

    pub(crate) fn info(&self) -> EqInfo {
        EqInfo {
            eqn: self.eqn,
            entries: self.entries(),
            producer: self.pc,
            consumer: self.ci,
            armed: self.armed,
            event_mask: self.mask,
            overruns: self.overruns,
        }
    }
}

/// A completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub cqn: u32,
    pub ring: Ring,
    pub log_size: u8,
    /// 64 or 128.
    pub cqe_bytes: u32,
    pub oi: bool,
    pub dbr: u64,
    pub eqn: u32,
    pub eq: Arc<Mutex<Eq>>,
    pub uar: u32,
    pub pc: u32,
    pub last_ci: u32,
    /// 0 OK, 9 overflow, 0xa write failure.
    pub status: u8,
    /// Armed: `Some(solicited_only)`.
    pub armed: Option<bool>,
    pub period: u16,
    pub max_count: u16,
    pub dropped: u64,
}

/// What happened to a CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqPost {
    Written,
    /// The CQ is (or just went) in error; the CQE is lost.
    Lost,
}

impl Cq {
    pub(crate) fn entries(&self) -> u32 {
        1 << self.log_size
    }

    /// Writes one 64-byte CQE: every byte except `wqe_id`, `wqe_counter`
    /// and `op_own`, then `wqe_counter`, then `wqe_id` (atomic big-endian
    /// u16 stores, so a reader that double-reads `wqe_id` around
    /// `wqe_counter` sees a consistent pair or a stale one, never a torn
    /// one that runs ahead), then `op_own` with the owner bit, last, with a
    /// release store. Without overrun-ignore, the consumer counter is read
    /// from the doorbell record first and a full CQ overflows: status 0x9,
    /// a CQ-error EQE (if the EQ takes them), and no more CQEs.
    pub(crate) fn post(&mut self, nic: &NicInner, io: &impl Dma, cqe: &[u8; 64]) -> CqPost {
        if self.status != 0 {
            self.dropped += 1;
            return CqPost::Lost;
        }
        let n = self.entries();
        if !self.oi {
            match io.load_be32_acquire(self.dbr) {
                Ok(ci) => self.last_ci = ci & MASK24,
                Err(_) => {
                    self.fail(nic, io, 0xa, 2);
                    return CqPost::Lost;
                }
            }
            if self.pc.wrapping_sub(self.last_ci) & MASK24 >= n {
                self.fail(nic, io, 0x9, 1);
                nic.stats.cq_overruns.fetch_add(1, Ordering::Relaxed);
                return CqPost::Lost;
            }
        }
        let slot = u64::from(self.pc & (n - 1));
        let off = slot * u64::from(self.cqe_bytes) + u64::from(self.cqe_bytes - 64);
        let owner = ((self.pc >> self.log_size) & 1) as u8;
        let (wqe_id, counter) = (CQE_WQE_ID_OFF, CQE_WQE_COUNTER_OFF);
        let v = View::<Cqe64>::new(cqe).expect("64 bytes");
        let wqe_counter = v.get32(Cqe64::WQE_COUNTER) as u16;
        let wqe_id_v = v.get32(Cqe64::WQE_ID) as u16;
        let op_own = (cqe[0x3f] & !1) | owner;
        // The CQE lies in one ring page (4 KiB aligned, CQEs aligned to
        // their size), so it is normally written under one translation;
        // if that page is not mapped whole the single accesses below
        // fault exactly where they did.
        let written = self.ring.iova_of(off).and_then(|(iova, left)| {
            (left >= 64).then_some(())?;
            io.with_span(iova, 64, true, |s| {
                s.write(0, &cqe[..wqe_id]);
                s.write(4, &cqe[4..counter]);
                s.write(0x3e, &cqe[0x3e..0x3f]);
                s.store_be16_release(counter, wqe_counter);
                s.store_be16_release(wqe_id, wqe_id_v);
                s.store_u8_release(0x3f, op_own);
            })
        });
        let r = match written {
            Some(()) => Ok(()),
            None => self.write_cqe_slowly(io, off, cqe, wqe_counter, wqe_id_v, op_own),
        };
        if r.is_err() {
            self.fail(nic, io, 0xa, 2);
            return CqPost::Lost;
        }
        self.pc = (self.pc + 1) & MASK24;
        if let Some(solicited_only) = self.armed {
            let se = cqe[0x3f] & 0x2 != 0;
            let op = cqe[0x3f] >> CQE_OPCODE_SHIFT;
            let error = op == 0xd || op == 0xe;
            if !solicited_only || se || error {
                self.armed = None;
                self.completion_event(nic, io);
            }
        }
        CqPost::Written
    }

    /// [`Cq::post`]'s writes one access at a time, in the same order (the
    /// CQE's page is not mapped whole, or bus mastering is off): stops at
    /// the first fault.
    fn write_cqe_slowly(
        &self,
        io: &impl Dma,
        off: u64,
        cqe: &[u8; 64],
        wqe_counter: u16,
        wqe_id_v: u16,
        op_own: u8,
    ) -> Result<(), DmaFault> {
        let (wqe_id, counter) = (CQE_WQE_ID_OFF, CQE_WQE_COUNTER_OFF);
        self.ring
            .write(io, off, &cqe[..wqe_id])
            .and_then(|_| self.ring.write(io, off + 4, &cqe[4..counter]))
            .and_then(|_| self.ring.write(io, off + 0x3e, &cqe[0x3e..0x3f]))
            .and_then(|_| self.ring.store_be16(io, off + counter as u64, wqe_counter))
            .and_then(|_| self.ring.store_be16(io, off + wqe_id as u64, wqe_id_v))
            .and_then(|_| self.ring.store_u8(io, off + 0x3f, op_own))
    }

    fn completion_event(&self, nic: &NicInner, io: &impl Dma) {
        let mut data = [0u8; 28];
        data[0x18..0x1c].copy_from_slice(&self.cqn.to_be_bytes());
        let _ = lock(&self.eq).post(nic, io, EventType::Completion, 0, &data);
    }

    /// Moves the CQ to error with `status` and reports it on the EQ.
    fn fail(&mut self, nic: &NicInner, io: &impl Dma, status: u8, syndrome: u8) {
        self.status = status;
        self.dropped += 1;
        tracing::warn!(cqn = self.cqn, status, "CQ error");
        let mut eq = lock(&self.eq);
        if eq.subscribed(EventType::CqError) {
            let mut data = [0u8; 28];
            {
                let mut v = ViewMut::<EqeCqErr>::new(&mut data).expect("28 bytes");
                v.set(EqeCqErr::CQN, u64::from(self.cqn))
                    .set(EqeCqErr::SYNDROME, u64::from(syndrome));
            }
            let _ = eq.post(nic, io, EventType::CqError, 0, &data);
        }
    }

    /// CQ arm doorbell.
    pub(crate) fn arm(&mut self, nic: &NicInner, io: &impl Dma, ci: u32, solicited_only: bool) {
        self.last_ci = ci & MASK24;
        if self.pc != self.last_ci && !solicited_only {
            self.completion_event(nic, io);
        } else {
            self.armed = Some(solicited_only);
        }
    }

    pub(crate) fn info(&self) -> CqInfo {
        CqInfo {
            cqn: self.cqn,
            entries: self.entries(),
            producer: self.pc,
            consumer: self.last_ci,
            overrun_ignore: self.oi,
            status: self.status,
            eqn: self.eqn,
            dropped: self.dropped,
        }
    }
}

/// Builds a CQE's `op_own` byte without the owner bit.
pub(crate) fn op_own(opcode: u8, se: bool) -> u8 {
    (opcode << CQE_OPCODE_SHIFT) | if se { 2 } else { 0 }
}
