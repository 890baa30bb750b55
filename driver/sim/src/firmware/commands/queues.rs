//! Queues: EQ, CQ, SQ and RQ, with their state machines.

use std::sync::{Arc, Mutex};

use mlx5::prm::View;
use mlx5::prm::cmd::*;
use mlx5::prm::codes::{CmdStatus, inline_mode, ts_format, ts_format_cap, wq_type};
use mlx5::prm::ctx::*;
use mlx5::prm::wqe::{MPWQE_LOG_STRIDE_SZ_BASE, decode_log_num_strides};

use crate::fabric::Space8;
use crate::queues::{Cq, Eq};
use crate::rx::{Rq, Striding};
use crate::stats::WqState;
use crate::tx::Sq;
use crate::util::lock;

use super::super::pages;
use super::super::{Reject, Why};
use super::{Ctx, R, must_be_zero, param, range, rej};

impl Ctx<'_> {
    // ------------------------------------------------------------------ EQ

    pub(super) fn create_eq(&mut self) -> R {
        let v = self.iv::<CreateEqIn>()?;
        let e = v.sub(CreateEqIn::EQC);
        let log_size = e.get(Eqc::LOG_EQ_SIZE);
        range(
            "eqc.log_eq_size",
            log_size,
            0,
            u64::from(self.nic.cfg.limits.log_max_eq_sz),
        )?;
        let uar = e.get32(Eqc::UAR_PAGE);
        self.need_uar(uar)?;
        let intr = e.get(Eqc::INTR);
        range(
            "eqc.intr",
            intr,
            0,
            u64::from(self.nic.cfg.msix_vectors.saturating_sub(1)),
        )?;
        // Every reference enables MSI-X (VFIO_DEVICE_SET_IRQS) before its
        // first CREATE_EQ; an EQ on a vector the host never enabled is
        // refused.
        if !lock(&self.nic.msix).enabled {
            return Err(param(
                Why::Interrupt,
                format!("eqc.intr {intr}: MSI-X is not enabled on the function"),
            ));
        }
        must_be_zero("eqc.page_offset", e.get(Eqc::PAGE_OFFSET))?;
        let mask = v.flex(CreateEqIn::EVENT_BITMASK, 0).unwrap_or(0);
        let ring = self.ring(
            CreateEqIn::PAS.byte(),
            64u64 << log_size,
            e.get(Eqc::LOG_PAGE_SIZE),
        )?;
        self.limit("EQs", self.dp.eqs.len(), self.nic.cfg.limits.max_eqs)?;
        let eqn = lock(&self.nic.fabric.registry)
            .alloc8(Space8::Eq, self.function(), 1)
            .ok_or_else(|| {
                rej(
                    CmdStatus::LimitsExceeded,
                    Why::Limit,
                    "EQ numbers exhausted",
                )
            })?;
        let eq = Eq {
            eqn: u32::from(eqn),
            ring,
            log_size: log_size as u8,
            uar,
            intr: intr as u16,
            mask,
            pc: 0,
            ci: 0,
            armed: false,
            status: 0,
            overruns: 0,
        };
        self.dp.eqs.insert(u32::from(eqn), Arc::new(Mutex::new(eq)));
        self.ov::<CreateEqOut>()?
            .set(CreateEqOut::EQ_NUMBER, u64::from(eqn));
        pages::flush_page_events(self.nic, self.fw, self.dp);
        Ok(())
    }

    pub(super) fn destroy_eq(&mut self) -> R {
        let n = self.iv::<DestroyEqIn>()?.get32(DestroyEqIn::EQ_NUMBER);
        self.need_eq(n)?;
        if self.dp.cqs.values().any(|c| lock(c).eqn == n) {
            return Err(self.busy(format!("EQ {n} is the completion EQ of a CQ")));
        }
        self.dp.eqs.remove(&n);
        lock(&self.nic.fabric.registry).free8(Space8::Eq, n as u8);
        Ok(())
    }

    pub(super) fn query_eq(&mut self) -> R {
        let n = self.iv::<QueryEqIn>()?.get32(QueryEqIn::EQ_NUMBER);
        let eq = self.need_eq(n)?;
        let eq = lock(&eq);
        let mut o = self.ov::<QueryEqOut>()?;
        o.set(QueryEqOut::EVENT_BITMASK, eq.mask);
        let mut c = o.sub(QueryEqOut::EQC);
        c.set(Eqc::STATUS, u64::from(eq.status))
            .set(Eqc::ST, if eq.armed { 0x9 } else { 0xa })
            .set(Eqc::LOG_EQ_SIZE, u64::from(eq.log_size))
            .set(Eqc::UAR_PAGE, u64::from(eq.uar))
            .set(Eqc::INTR, u64::from(eq.intr))
            .set(Eqc::CONSUMER_COUNTER, u64::from(eq.ci))
            .set(Eqc::PRODUCER_COUNTER, u64::from(eq.pc));
        Ok(())
    }

    // ------------------------------------------------------------------ CQ

    pub(super) fn create_cq(&mut self) -> R {
        let v = self.iv::<CreateCqIn>()?;
        let c = v.sub(CreateCqIn::CQC);
        must_be_zero("cq_umem_valid", v.get(CreateCqIn::CQ_UMEM_VALID))?;
        let cqe_bytes = match c.get(Cqc::CQE_SZ) {
            0 => 64u32,
            1 => 128,
            s => return Err(param(Why::OutOfRange, format!("cqc.cqe_sz {s}"))),
        };
        must_be_zero("cqc.cc (collapsed CQ)", c.get(Cqc::CC))?;
        must_be_zero(
            "cqc.cqe_comp_en (cap cqe_compression is 0)",
            c.get(Cqc::CQE_COMP_EN),
        )?;
        must_be_zero("cqc.page_offset", c.get(Cqc::PAGE_OFFSET))?;
        let oi = c.get(Cqc::OI) == 1;
        if oi && self.fw.caps.cur(CmdHcaCap::CQ_OI) == 0 {
            return Err(param(
                Why::NotSupported,
                "cqc.oi without the cq_oi capability",
            ));
        }
        let log_size = c.get(Cqc::LOG_CQ_SIZE);
        range(
            "cqc.log_cq_size",
            log_size,
            0,
            u64::from(self.nic.cfg.limits.log_max_cq_sz),
        )?;
        let uar = c.get32(Cqc::UAR_PAGE);
        self.need_uar(uar)?;
        let eqn = c.get32(Cqc::C_EQN);
        let eq = self.need_eq(eqn)?;
        let dbr = c.get(Cqc::DBR_ADDR);
        self.check_dbr(dbr)?;
        let ring = self.ring(
            CreateCqIn::PAS.byte(),
            u64::from(cqe_bytes) << log_size,
            c.get(Cqc::LOG_PAGE_SIZE),
        )?;
        self.limit("CQs", self.dp.cqs.len(), self.nic.cfg.limits.max_cqs)?;
        let cqn = self.alloc24()?;
        let cq = Cq {
            cqn,
            ring,
            log_size: log_size as u8,
            cqe_bytes,
            oi,
            dbr,
            eqn,
            eq,
            uar,
            pc: 0,
            last_ci: 0,
            status: 0,
            armed: None,
            period: c.get(Cqc::CQ_PERIOD) as u16,
            max_count: c.get(Cqc::CQ_MAX_COUNT) as u16,
            dropped: 0,
        };
        self.dp.cqs.insert(cqn, Arc::new(Mutex::new(cq)));
        self.ov::<CreateCqOut>()?
            .set(CreateCqOut::CQN, u64::from(cqn));
        Ok(())
    }

    pub(super) fn destroy_cq(&mut self) -> R {
        let n = self.iv::<DestroyCqIn>()?.get32(DestroyCqIn::CQN);
        self.need_cq(n)?;
        let used = self.dp.sqs.values().any(|s| lock(s).cqn == n)
            || self.dp.rqs.values().any(|r| lock(r).cqn == n);
        if used {
            return Err(self.busy(format!("CQ {n:#x} is used by an SQ or RQ")));
        }
        self.dp.cqs.remove(&n);
        self.free24(n);
        Ok(())
    }

    pub(super) fn query_cq(&mut self) -> R {
        let n = self.iv::<QueryCqIn>()?.get32(QueryCqIn::CQN);
        let cq = self.need_cq(n)?;
        let mut cq = lock(&cq);
        if let Ok(ci) = self.nic.iommu.load_be32_acquire(cq.dbr) {
            cq.last_ci = ci & crate::queues::MASK24;
        }
        let mut o = self.ov::<QueryCqOut>()?;
        let mut c = o.sub(QueryCqOut::CQC);
        c.set(Cqc::STATUS, u64::from(cq.status))
            .set(Cqc::CQE_SZ, u64::from(cq.cqe_bytes == 128))
            .set(Cqc::OI, u64::from(cq.oi))
            .set(Cqc::ST, if cq.armed.is_some() { 0x9 } else { 0xa })
            .set(Cqc::LOG_CQ_SIZE, u64::from(cq.log_size))
            .set(Cqc::UAR_PAGE, u64::from(cq.uar))
            .set(Cqc::CQ_PERIOD, u64::from(cq.period))
            .set(Cqc::CQ_MAX_COUNT, u64::from(cq.max_count))
            .set(Cqc::C_EQN, u64::from(cq.eqn))
            .set(Cqc::CONSUMER_COUNTER, u64::from(cq.last_ci))
            .set(Cqc::PRODUCER_COUNTER, u64::from(cq.pc))
            .set(Cqc::DBR_ADDR, cq.dbr);
        Ok(())
    }

    pub(super) fn modify_cq(&mut self) -> R {
        if self.op_mod != 0 {
            return Err(param(
                Why::OpMod,
                format!("MODIFY_CQ op_mod {} (resize is not modeled)", self.op_mod),
            ));
        }
        let v = self.iv::<ModifyCqIn>()?;
        let n = v.get32(ModifyCqIn::CQN);
        let sel = v.get32(ModifyCqIn::MODIFY_FIELD_SELECT);
        let c = v.sub(ModifyCqIn::CQC);
        const PERIOD: u32 = 1 << 0;
        const COUNT: u32 = 1 << 1;
        const OVERRUN: u32 = 1 << 2;
        if sel & !(PERIOD | COUNT | OVERRUN) != 0 {
            return Err(param(
                Why::NotSupported,
                format!("MODIFY_CQ field select {sel:#x}"),
            ));
        }
        let oi = c.get(Cqc::OI) == 1;
        if sel & OVERRUN != 0 && oi && self.fw.caps.cur(CmdHcaCap::CQ_OI) == 0 {
            return Err(param(
                Why::NotSupported,
                "cqc.oi without the cq_oi capability",
            ));
        }
        let (period, count) = (
            c.get(Cqc::CQ_PERIOD) as u16,
            c.get(Cqc::CQ_MAX_COUNT) as u16,
        );
        let cq = self.need_cq(n)?;
        let mut cq = lock(&cq);
        if sel & PERIOD != 0 {
            cq.period = period;
        }
        if sel & COUNT != 0 {
            cq.max_count = count;
        }
        if sel & OVERRUN != 0 {
            cq.oi = oi;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ SQ

    pub(super) fn device_inline_mode(&self) -> u8 {
        match self.fw.caps.wqe_inline_mode() {
            0 => 1,
            1 if self.nic.cfg.eth_virt => self.dp.vport.min_inline,
            // Without eth_virt the vport context does not define it: the
            // device's own requirement (DPDK's device-id fallback).
            1 => u8::from(matches!(self.nic.cfg.device_id, 0x1013..=0x1016)),
            _ => 0,
        }
    }

    /// Common WQ checks; returns (pd, dbr, log_wq_sz, log_wq_stride).
    pub(super) fn check_wq(&self, w: View<'_, Wq>) -> Result<(u32, u64, u8, u8), Reject> {
        must_be_zero("wq.wq_signature", w.get(Wq::WQ_SIGNATURE))?;
        must_be_zero("wq.dbr_umem_valid", w.get(Wq::DBR_UMEM_VALID))?;
        must_be_zero("wq.wq_umem_valid", w.get(Wq::WQ_UMEM_VALID))?;
        must_be_zero("wq.page_offset", w.get(Wq::PAGE_OFFSET))?;
        let pd = w.get32(Wq::PD);
        self.need_pd(pd)?;
        let dbr = w.get(Wq::DBR_ADDR);
        self.check_dbr(dbr)?;
        let log_sz = w.get(Wq::LOG_WQ_SZ);
        range(
            "wq.log_wq_sz",
            log_sz,
            0,
            u64::from(self.nic.cfg.limits.log_max_wq_sz),
        )?;
        Ok((pd, dbr, log_sz as u8, w.get(Wq::LOG_WQ_STRIDE) as u8))
    }

    pub(super) fn create_sq(&mut self) -> R {
        let v = self.iv::<CreateSqIn>()?;
        let s = v.sub(CreateSqIn::CTX);
        let w = s.sub(Sqc::WQ);
        if s.get(Sqc::STATE) != 0 {
            return Err(param(Why::ObjectState, "sqc.state must be RST at creation"));
        }
        must_be_zero(
            "sqc.allow_multi_pkt_send_wqe",
            s.get(Sqc::ALLOW_MULTI_PKT_SEND_WQE),
        )?;
        must_be_zero("sqc.cd_master", s.get(Sqc::CD_MASTER))?;
        let min_inline_field = s.get(Sqc::MIN_WQE_INLINE_MODE) as u8;
        range("sqc.min_wqe_inline_mode", u64::from(min_inline_field), 0, 3)?;
        let dev = self.device_inline_mode();
        // The field counts only when the Ethernet cap says the requirement
        // is in the vport context (Linux and DPDK set it only then); the
        // device enforces its own requirement either way.
        let min_inline = if self.fw.caps.wqe_inline_mode() == inline_mode::VPORT_CONTEXT
            && self.nic.cfg.eth_virt
        {
            if min_inline_field < dev {
                return Err(param(
                    Why::Mismatch,
                    format!(
                        "sqc.min_wqe_inline_mode {min_inline_field} is below the vport requirement {dev}"
                    ),
                ));
            }
            min_inline_field
        } else {
            dev
        };
        let ts_format = s.get(Sqc::TS_FORMAT) as u8;
        let real_time = check_ts_format("sqc.ts_format", ts_format, self.nic.cfg.sq_ts_format)?;
        let cqn = s.get32(Sqc::CQN);
        let cq = self.need_cq(cqn)?;
        let tis_n = s.get(Sqc::TIS_LST_SZ);
        if tis_n != 1 {
            return Err(param(
                Why::OutOfRange,
                format!("sqc.tis_lst_sz {tis_n}: exactly 1 TIS is modeled"),
            ));
        }
        let tisn = s.get32(Sqc::TIS_NUM_0);
        if !self.dp.tises.contains_key(&tisn) {
            return Err(self.missing("TIS", tisn));
        }
        let wt = w.get(Wq::WQ_TYPE) as u8;
        if wt != wq_type::CYCLIC {
            return Err(param(
                Why::NotSupported,
                format!("SQ wq_type {wt}: only cyclic (1)"),
            ));
        }
        let (pd, dbr, log_sz, stride) = self.check_wq(w)?;
        if stride != 6 {
            return Err(param(
                Why::OutOfRange,
                format!("SQ log_wq_stride {stride}, must be 6"),
            ));
        }
        let uar = w.get32(Wq::UAR_PAGE);
        self.need_uar(uar)?;
        let ring = self.ring(
            CreateSqIn::CTX.byte() + Sqc::WQ.byte() + Wq::PAS.byte(),
            64u64 << log_sz,
            w.get(Wq::LOG_WQ_PG_SZ),
        )?;
        self.limit("SQs", self.dp.sqs.len(), self.nic.cfg.limits.max_sqs)?;
        let sqn = self.alloc24()?;
        let sq = Sq {
            sqn,
            state: WqState::Rst,
            ring,
            log_sz,
            cq,
            cqn,
            tisn,
            pd,
            uar,
            dbr,
            min_inline,
            min_inline_field,
            ts_format,
            real_time,
            flush_in_error: s.get(Sqc::FLUSH_IN_ERROR_EN) == 1,
            user_index: s.get32(Sqc::USER_INDEX),
            cc: 0,
            sw_counter: 0,
            doorbells: 0,
            wqes: 0,
            cqes: 0,
            frames: 0,
            bytes: 0,
            errors: 0,
            last_error: None,
            fail_next: None,
            wqe_buf: vec![0u8; crate::tx::WQE_BUF_BYTES].into_boxed_slice(),
            held: self
                .nic
                .cfg
                .deferred_tx
                .map(|d| crate::tx::HeldQueue::new(d, sqn)),
        };
        self.dp.sqs.insert(sqn, Arc::new(Mutex::new(sq)));
        self.ov::<CreateSqOut>()?
            .set(CreateSqOut::SQN, u64::from(sqn));
        Ok(())
    }

    pub(super) fn transition(
        what: &str,
        n: u32,
        cur: WqState,
        claimed: u64,
        new: u64,
    ) -> Result<WqState, Reject> {
        let Some(claimed) = WqState::from_raw(claimed) else {
            return Err(param(
                Why::OutOfRange,
                format!("{what} current state {claimed}"),
            ));
        };
        let Some(new) = WqState::from_raw(new) else {
            return Err(param(Why::OutOfRange, format!("{what} new state {new}")));
        };
        if claimed != cur {
            return Err(rej(
                CmdStatus::BadResourceState,
                Why::ObjectState,
                format!("{what} {n:#x} is {cur:?}, the command says {claimed:?}"),
            ));
        }
        use WqState as S;
        let ok = matches!(
            (cur, new),
            (S::Rst, S::Rdy) | (S::Rdy, S::Rdy) | (S::Rdy, S::Err) | (_, S::Rst) | (S::Err, S::Err)
        );
        if !ok {
            return Err(rej(
                CmdStatus::BadResourceState,
                Why::ObjectState,
                format!("{what} {n:#x}: {cur:?} -> {new:?} is not a valid transition"),
            ));
        }
        Ok(new)
    }

    pub(super) fn modify_sq(&mut self) -> R {
        let v = self.iv::<ModifySqIn>()?;
        let n = v.get32(ModifySqIn::SQN);
        let bitmask = v.get(ModifySqIn::MODIFY_BITMASK);
        if bitmask != 0 {
            return Err(param(
                Why::NotSupported,
                format!("MODIFY_SQ modify_bitmask {bitmask:#x}: only state changes"),
            ));
        }
        let claimed = v.get(ModifySqIn::SQ_STATE);
        let new = v.sub(ModifySqIn::CTX).get(Sqc::STATE);
        let sq = self.need_sq(n)?;
        let mut sq = lock(&sq);
        let new = Self::transition("SQ", n, sq.state, claimed, new)?;
        if new == WqState::Rst {
            sq.cc = 0;
            sq.sw_counter = 0;
            // Held WQEs (deferred gather) die with the queue's state.
            crate::tx::check_abandoned(self.nic, self.dp, &mut sq);
        }
        sq.state = new;
        Ok(())
    }

    pub(super) fn destroy_sq(&mut self) -> R {
        let n = self.iv::<DestroySqIn>()?.get32(DestroySqIn::SQN);
        let sq = self.need_sq(n)?;
        crate::tx::check_abandoned(self.nic, self.dp, &mut lock(&sq));
        self.dp.sqs.remove(&n);
        self.free24(n);
        Ok(())
    }

    pub(super) fn query_sq(&mut self) -> R {
        let n = self.iv::<QuerySqIn>()?.get32(QuerySqIn::SQN);
        let sq = self.need_sq(n)?;
        let sq = lock(&sq);
        let mut o = self.ov::<QuerySqOut>()?;
        let mut s = o.sub(QuerySqOut::SQ_CONTEXT);
        s.set(Sqc::FLUSH_IN_ERROR_EN, u64::from(sq.flush_in_error))
            .set(Sqc::MIN_WQE_INLINE_MODE, u64::from(sq.min_inline_field))
            .set(Sqc::TS_FORMAT, u64::from(sq.ts_format))
            .set(Sqc::STATE, u64::from(sq.state.raw()))
            .set(Sqc::USER_INDEX, u64::from(sq.user_index))
            .set(Sqc::CQN, u64::from(sq.cqn))
            .set(Sqc::TIS_LST_SZ, 1)
            .set(Sqc::TIS_NUM_0, u64::from(sq.tisn));
        let mut w = s.sub(Sqc::WQ);
        w.set(Wq::WQ_TYPE, u64::from(wq_type::CYCLIC))
            .set(Wq::PD, u64::from(sq.pd))
            .set(Wq::UAR_PAGE, u64::from(sq.uar))
            .set(Wq::DBR_ADDR, sq.dbr)
            .set(Wq::HW_COUNTER, u64::from(sq.cc))
            .set(Wq::SW_COUNTER, u64::from(sq.sw_counter))
            .set(Wq::LOG_WQ_STRIDE, 6)
            .set(Wq::LOG_WQ_SZ, u64::from(sq.log_sz));
        Ok(())
    }

    // ------------------------------------------------------------------ RQ

    pub(super) fn create_rq(&mut self) -> R {
        let v = self.iv::<CreateRqIn>()?;
        let r = v.sub(CreateRqIn::CTX);
        let w = r.sub(Rqc::WQ);
        if r.get(Rqc::STATE) != 0 {
            return Err(param(Why::ObjectState, "rqc.state must be RST at creation"));
        }
        must_be_zero("rqc.mem_rq_type (RMP)", r.get(Rqc::MEM_RQ_TYPE))?;
        must_be_zero("rqc.rmpn", r.get(Rqc::RMPN))?;
        must_be_zero(
            "rqc.scatter_fcs (FCS is not modeled)",
            r.get(Rqc::SCATTER_FCS),
        )?;
        let ts_format = r.get(Rqc::TS_FORMAT) as u8;
        let real_time = check_ts_format("rqc.ts_format", ts_format, self.nic.cfg.rq_ts_format)?;
        let cqn = r.get32(Rqc::CQN);
        let cq = self.need_cq(cqn)?;
        let cs = r.get32(Rqc::COUNTER_SET_ID);
        let counter = if cs == 0 {
            None
        } else {
            let c = self
                .dp
                .qcounters
                .get(&cs)
                .cloned()
                .ok_or_else(|| self.missing8("Q counter", Space8::QCounter, cs))?;
            Some((cs, c))
        };
        let (pd, dbr, log_sz, log_wqe) = self.check_wq(w)?;
        let wt = w.get(Wq::WQ_TYPE) as u8;
        let striding = match wt {
            wq_type::CYCLIC => {
                range("RQ log_wq_stride", u64::from(log_wqe), 4, 10)?;
                None
            }
            wq_type::CYCLIC_STRIDING => {
                if self.fw.caps.cur(CmdHcaCap::STRIDING_RQ) == 0 {
                    return Err(param(
                        Why::NotSupported,
                        "striding RQ without the striding_rq capability",
                    ));
                }
                range("striding RQ log_wq_stride", u64::from(log_wqe), 5, 10)?;
                let enc = w.get32(Wq::LOG_WQE_NUM_OF_STRIDES);
                let log_num = decode_log_num_strides(enc).ok_or_else(|| {
                    param(
                        Why::OutOfRange,
                        format!("wq.log_wqe_num_of_strides {enc} is not a valid encoding"),
                    )
                })?;
                if log_num < 9 && self.fw.caps.cur(CmdHcaCap::EXT_STRIDE_NUM_RANGE) == 0 {
                    return Err(param(
                        Why::NotSupported,
                        format!("2^{log_num} strides per WQE needs ext_stride_num_range"),
                    ));
                }
                let log_stride = w.get32(Wq::LOG_WQE_STRIDE_SIZE) + MPWQE_LOG_STRIDE_SZ_BASE;
                let min = self.fw.caps.log_min_stride_wqe_sz();
                if log_num + log_stride < min {
                    return Err(param(
                        Why::OutOfRange,
                        format!(
                            "striding WQE of 2^{log_num} strides x 2^{log_stride} bytes is below the minimum WQE size 2^{min} (log_min_stride_wqe_sz)"
                        ),
                    ));
                }
                Some(Striding {
                    log_num_strides: log_num,
                    log_stride,
                    two_byte_shift: w.get(Wq::TWO_BYTE_SHIFT_EN) == 1,
                })
            }
            t => {
                return Err(param(
                    Why::NotSupported,
                    format!("RQ wq_type {t}: cyclic (1) and cyclic striding (3) are modeled"),
                ));
            }
        };
        let ring = self.ring(
            CreateRqIn::CTX.byte() + Rqc::WQ.byte() + Wq::PAS.byte(),
            1u64 << (u32::from(log_sz) + u32::from(log_wqe)),
            w.get(Wq::LOG_WQ_PG_SZ),
        )?;
        self.limit("RQs", self.dp.rqs.len(), self.nic.cfg.limits.max_rqs)?;
        let rqn = self.alloc24()?;
        let rq = Rq::new(
            rqn,
            ring,
            log_sz,
            log_wqe,
            striding,
            cq,
            cqn,
            counter,
            pd,
            dbr,
            r.get32(Rqc::USER_INDEX),
            r.get(Rqc::FLUSH_IN_ERROR_EN) == 1,
            r.get(Rqc::VSD) == 1,
        );
        let mut rq = rq;
        rq.ts_format = ts_format;
        rq.real_time = real_time;
        self.dp.rqs.insert(rqn, Arc::new(Mutex::new(rq)));
        self.ov::<CreateRqOut>()?
            .set(CreateRqOut::RQN, u64::from(rqn));
        Ok(())
    }

    pub(super) fn modify_rq(&mut self) -> R {
        let v = self.iv::<ModifyRqIn>()?;
        let n = v.get32(ModifyRqIn::RQN);
        let bitmask = v.get(ModifyRqIn::MODIFY_BITMASK);
        const VSD: u64 = 1 << 1;
        const COUNTER: u64 = 1 << 3;
        if bitmask & !(VSD | COUNTER) != 0 {
            return Err(param(
                Why::NotSupported,
                format!("MODIFY_RQ modify_bitmask {bitmask:#x}"),
            ));
        }
        let ctx = v.sub(ModifyRqIn::CTX);
        let claimed = v.get(ModifyRqIn::RQ_STATE);
        let new = ctx.get(Rqc::STATE);
        let cs = ctx.get32(Rqc::COUNTER_SET_ID);
        let counter = if bitmask & COUNTER != 0 && cs != 0 {
            Some(
                self.dp
                    .qcounters
                    .get(&cs)
                    .cloned()
                    .ok_or_else(|| self.missing8("Q counter", Space8::QCounter, cs))?,
            )
        } else {
            None
        };
        let rq = self.need_rq(n)?;
        let mut rq = lock(&rq);
        let new = Self::transition("RQ", n, rq.state, claimed, new)?;
        if bitmask & VSD != 0 {
            rq.vsd = ctx.get(Rqc::VSD) == 1;
        }
        if bitmask & COUNTER != 0 {
            rq.counter_id = cs;
            rq.counter = counter;
        }
        if new == WqState::Rst {
            rq.reset();
        }
        rq.state = new;
        Ok(())
    }

    pub(super) fn destroy_rq(&mut self) -> R {
        let n = self.iv::<DestroyRqIn>()?.get32(DestroyRqIn::RQN);
        self.need_rq(n)?;
        if self.dp.tirs.values().any(|t| t.rqn == n) {
            return Err(self.busy(format!("RQ {n:#x} is the inline RQ of a TIR")));
        }
        self.dp.rqs.remove(&n);
        self.free24(n);
        Ok(())
    }

    pub(super) fn query_rq(&mut self) -> R {
        let n = self.iv::<QueryRqIn>()?.get32(QueryRqIn::RQN);
        let rq = self.need_rq(n)?;
        let rq = lock(&rq);
        let mut o = self.ov::<QueryRqOut>()?;
        let mut r = o.sub(QueryRqOut::RQ_CONTEXT);
        r.set(Rqc::VSD, u64::from(rq.vsd))
            .set(Rqc::STATE, u64::from(rq.state.raw()))
            .set(Rqc::FLUSH_IN_ERROR_EN, u64::from(rq.flush_in_error))
            .set(Rqc::USER_INDEX, u64::from(rq.user_index))
            .set(Rqc::CQN, u64::from(rq.cqn))
            .set(Rqc::COUNTER_SET_ID, u64::from(rq.counter_id))
            .set(Rqc::TS_FORMAT, u64::from(rq.ts_format));
        let mut w = r.sub(Rqc::WQ);
        w.set(
            Wq::WQ_TYPE,
            u64::from(if rq.striding.is_some() {
                wq_type::CYCLIC_STRIDING
            } else {
                wq_type::CYCLIC
            }),
        )
        .set(Wq::PD, u64::from(rq.pd))
        .set(Wq::DBR_ADDR, rq.dbr)
        .set(Wq::HW_COUNTER, u64::from(rq.seq))
        .set(Wq::SW_COUNTER, u64::from(rq.sw_counter))
        .set(Wq::LOG_WQ_STRIDE, u64::from(rq.log_wqe))
        .set(Wq::LOG_WQ_SZ, u64::from(rq.log_sz));
        if let Some(s) = rq.striding {
            let enc = mlx5::prm::wqe::encode_log_num_strides(s.log_num_strides, true).unwrap_or(0);
            w.set(Wq::LOG_WQE_NUM_OF_STRIDES, u64::from(enc))
                .set(Wq::TWO_BYTE_SHIFT_EN, u64::from(s.two_byte_shift))
                .set(
                    Wq::LOG_WQE_STRIDE_SIZE,
                    u64::from(s.log_stride - MPWQE_LOG_STRIDE_SZ_BASE),
                );
        }
        Ok(())
    }
}

/// Checks a queue's `ts_format` against the device's `*_ts_format` cap and
/// says whether its CQE timestamps are real time. A device that offers
/// only real time (ConnectX-7 can) refuses free-running, and one without a
/// real-time clock refuses real time; DEFAULT is the device's own choice.
fn check_ts_format(name: &str, ts: u8, cap: u8) -> Result<bool, Reject> {
    let ok = match ts {
        ts_format::FREE_RUNNING => cap != ts_format_cap::REAL_TIME,
        ts_format::DEFAULT => true,
        ts_format::REAL_TIME => cap != ts_format_cap::FREE_RUNNING,
        _ => false,
    };
    if !ok {
        let caps = match cap {
            ts_format_cap::FREE_RUNNING => "free-running only",
            ts_format_cap::REAL_TIME => "real-time only",
            _ => "free-running and real-time",
        };
        return Err(param(
            Why::NotSupported,
            format!("{name} {ts}: the device's timestamp formats are {caps}"),
        ));
    }
    Ok(ts == ts_format::REAL_TIME || (ts == ts_format::DEFAULT && cap == ts_format_cap::REAL_TIME))
}
