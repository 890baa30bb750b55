//! Simple objects: UARs, PDs, transport domains, mkeys, Q counters, TISes
//! and TIRs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mlx5::prm::cmd::*;
use mlx5::prm::codes::CmdStatus;
use mlx5::prm::ctx::*;

use crate::fabric::Space8;
use crate::nic::FIRST_UAR;
use crate::objects::{Mkey, MkeyKind, QCounter, Tir, Tis};
use crate::steering::Dest;
use crate::util::{be32, lock};

use super::super::Why;
use super::{Ctx, R, must_be_zero, param, range, rej};

impl Ctx<'_> {
    // ------------------------------------------------------ simple objects

    pub(super) fn alloc_uar(&mut self) -> R {
        let first = FIRST_UAR;
        let last = self.nic.cfg.bar_pages;
        let n = (first..last)
            .find(|u| !self.dp.uars.contains(u))
            .ok_or_else(|| {
                rej(
                    CmdStatus::LimitsExceeded,
                    Why::Limit,
                    format!("all {} UAR pages are allocated", last - first),
                )
            })?;
        self.dp.uars.insert(n);
        self.ov::<AllocUarOut>()?
            .set(AllocUarOut::UAR, u64::from(n));
        Ok(())
    }

    pub(super) fn dealloc_uar(&mut self) -> R {
        let n = self.iv::<DeallocUarIn>()?.get32(DeallocUarIn::UAR);
        self.need_uar(n)?;
        let used = self.dp.eqs.values().any(|e| lock(e).uar == n)
            || self.dp.cqs.values().any(|c| lock(c).uar == n)
            || self.dp.sqs.values().any(|s| lock(s).uar == n);
        if used {
            return Err(self.busy(format!("UAR {n} is used by an EQ, CQ or SQ")));
        }
        self.dp.uars.remove(&n);
        Ok(())
    }

    pub(super) fn alloc_pd_td(&mut self, pd: bool) -> R {
        let l = &self.nic.cfg.limits;
        if pd {
            self.limit("PDs", self.dp.pds.len(), l.max_pds)?;
        } else {
            self.limit("transport domains", self.dp.tds.len(), l.max_tds)?;
        }
        let n = self.alloc24()?;
        if pd {
            self.dp.pds.insert(n);
            self.ov::<AllocPdOut>()?.set(AllocPdOut::PD, u64::from(n));
        } else {
            self.dp.tds.insert(n);
            self.ov::<AllocTransportDomainOut>()?
                .set(AllocTransportDomainOut::TRANSPORT_DOMAIN, u64::from(n));
        }
        Ok(())
    }

    pub(super) fn dealloc_pd_td(&mut self, pd: bool) -> R {
        let n = be32(self.inp, 8) & 0x00ff_ffff;
        if pd {
            self.need_pd(n)?;
            let used = self.dp.mkeys.values().any(|k| k.pd == n)
                || self.dp.sqs.values().any(|s| lock(s).pd == n)
                || self.dp.rqs.values().any(|r| lock(r).pd == n);
            if used {
                return Err(self.busy(format!("PD {n:#x} is used by an mkey, SQ or RQ")));
            }
            self.dp.pds.remove(&n);
        } else {
            self.need_td(n)?;
            let used = self.dp.tises.values().any(|t| t.td == n)
                || self.dp.tirs.values().any(|t| t.td == n);
            if used {
                return Err(self.busy(format!("transport domain {n:#x} is used by a TIS or TIR")));
            }
            self.dp.tds.remove(&n);
        }
        self.free24(n);
        Ok(())
    }

    pub(super) fn create_mkey(&mut self) -> R {
        let v = self.iv::<CreateMkeyIn>()?;
        let m = v.sub(CreateMkeyIn::MKC);
        let pd = m.get32(Mkc::PD);
        self.need_pd(pd)?;
        must_be_zero("mkc.free", m.get(Mkc::FREE))?;
        let qpn = m.get32(Mkc::QPN);
        if qpn != 0x00ff_ffff {
            return Err(param(
                Why::NotSupported,
                format!("mkc.qpn {qpn:#x}: only 0xffffff (any) is modeled"),
            ));
        }
        let start = m.get(Mkc::START_ADDR);
        let len = m.get(Mkc::LEN);
        let kind = match m.get(Mkc::ACCESS_MODE_1_0) {
            0 => {
                let length64 = m.get(Mkc::LENGTH64) == 1;
                if !length64 && start.checked_add(len).is_none() {
                    return Err(param(
                        Why::OutOfRange,
                        format!("PA mkey of {len:#x} bytes from {start:#x} wraps past 2^64"),
                    ));
                }
                MkeyKind::Pa {
                    length64,
                    start,
                    len,
                }
            }
            1 => {
                let shift = m.get(Mkc::LOG_PAGE_SIZE);
                range("mkc.log_page_size (absolute)", shift, 12, 30)?;
                if m.get(Mkc::LENGTH64) == 1 {
                    return Err(param(Why::NotSupported, "length64 with an MTT mkey"));
                }
                let octwords = v.get(CreateMkeyIn::TRANSLATIONS_OCTWORD_ACTUAL_SIZE) as usize;
                let entries = octwords * 2;
                let need_in = 0x110 + 16 * octwords;
                if self.inp.len() < need_in {
                    return Err(rej(
                        CmdStatus::BadInputLength,
                        Why::InputLength,
                        format!(
                            "{octwords} MTT octwords need {need_in} input bytes, got {}",
                            self.inp.len()
                        ),
                    ));
                }
                let psz = 1u64 << shift;
                let base = start & !(psz - 1);
                let pages_needed = (start + len).saturating_sub(base).div_ceil(psz) as usize;
                if pages_needed > entries {
                    return Err(param(
                        Why::Mismatch,
                        format!(
                            "{len} bytes from {start:#x} need {pages_needed} MTT entries, {entries} given"
                        ),
                    ));
                }
                let mut pages = Vec::with_capacity(pages_needed);
                for i in 0..pages_needed {
                    let e = crate::util::be64(self.inp, 0x110 + 8 * i);
                    if e & 0xffc != 0 {
                        return Err(param(
                            Why::Alignment,
                            format!("MTT entry {i} = {e:#x} is not page aligned"),
                        ));
                    }
                    pages.push(e);
                }
                MkeyKind::Mtt {
                    start,
                    len,
                    page_shift: shift as u32,
                    pages,
                }
            }
            a => {
                return Err(param(
                    Why::NotSupported,
                    format!("mkey access mode {a}: only PA (0) and MTT (1) are modeled"),
                ));
            }
        };
        let key = Mkey {
            variant: m.get(Mkc::MKEY_7_0) as u8,
            pd,
            lr: m.get(Mkc::LR) == 1,
            lw: m.get(Mkc::LW) == 1,
            kind,
        };
        self.limit("mkeys", self.dp.mkeys.len(), self.nic.cfg.limits.max_mkeys)?;
        let n = self.alloc24()?;
        self.dp.mkeys.insert(n, key);
        self.ov::<CreateMkeyOut>()?
            .set(CreateMkeyOut::MKEY_INDEX, u64::from(n));
        Ok(())
    }

    pub(super) fn destroy_mkey(&mut self) -> R {
        let n = self.iv::<DestroyMkeyIn>()?.get32(DestroyMkeyIn::MKEY_INDEX);
        if self.dp.mkeys.remove(&n).is_none() {
            return Err(self.missing("mkey", n));
        }
        self.free24(n);
        Ok(())
    }

    // ---------------------------------------------------------- Q counters

    pub(super) fn alloc_q_counter(&mut self) -> R {
        self.limit(
            "Q counters",
            self.dp.qcounters.len(),
            self.nic.cfg.limits.max_q_counters,
        )?;
        let id = lock(&self.nic.fabric.registry)
            .alloc8(Space8::QCounter, self.function(), 1)
            .ok_or_else(|| {
                rej(
                    CmdStatus::LimitsExceeded,
                    Why::Limit,
                    "Q counter numbers exhausted",
                )
            })?;
        self.dp
            .qcounters
            .insert(u32::from(id), Arc::new(QCounter::default()));
        self.ov::<AllocQCounterOut>()?
            .set(AllocQCounterOut::COUNTER_SET_ID, u64::from(id));
        Ok(())
    }

    pub(super) fn dealloc_q_counter(&mut self) -> R {
        let id = self
            .iv::<DeallocQCounterIn>()?
            .get32(DeallocQCounterIn::COUNTER_SET_ID);
        if !self.dp.qcounters.contains_key(&id) {
            return Err(self.missing8("Q counter", Space8::QCounter, id));
        }
        if self.dp.rqs.values().any(|r| lock(r).counter_id == id) {
            return Err(self.busy(format!("Q counter {id} is used by an RQ")));
        }
        self.dp.qcounters.remove(&id);
        lock(&self.nic.fabric.registry).free8(Space8::QCounter, id as u8);
        Ok(())
    }

    pub(super) fn query_q_counter(&mut self) -> R {
        let v = self.iv::<QueryQCounterIn>()?;
        let id = v.get32(QueryQCounterIn::COUNTER_SET_ID);
        let clear = v.get(QueryQCounterIn::CLEAR) == 1;
        let c = self
            .dp
            .qcounters
            .get(&id)
            .cloned()
            .ok_or_else(|| self.missing8("Q counter", Space8::QCounter, id))?;
        let n = if clear {
            c.out_of_buffer.swap(0, Ordering::Relaxed)
        } else {
            c.out_of_buffer.load(Ordering::Relaxed)
        };
        self.ov::<QueryQCounterOut>()?
            .set(QueryQCounterOut::OUT_OF_BUFFER, n.min(u64::from(u32::MAX)));
        Ok(())
    }

    // ------------------------------------------------------------- TIS/TIR

    pub(super) fn create_tis(&mut self) -> R {
        let v = self.iv::<CreateTisIn>()?;
        let t = v.sub(CreateTisIn::CTX);
        must_be_zero("tisc.tls_en", t.get(Tisc::TLS_EN))?;
        let td = t.get32(Tisc::TRANSPORT_DOMAIN);
        self.need_td(td)?;
        self.limit("TISes", self.dp.tises.len(), self.nic.cfg.limits.max_tises)?;
        let n = self.alloc24()?;
        self.dp.tises.insert(n, Tis { td });
        self.ov::<CreateTisOut>()?
            .set(CreateTisOut::TISN, u64::from(n));
        Ok(())
    }

    pub(super) fn destroy_tis(&mut self) -> R {
        let n = self.iv::<DestroyTisIn>()?.get32(DestroyTisIn::TISN);
        if !self.dp.tises.contains_key(&n) {
            return Err(self.missing("TIS", n));
        }
        if self.dp.sqs.values().any(|s| lock(s).tisn == n) {
            return Err(self.busy(format!("TIS {n:#x} is used by an SQ")));
        }
        self.dp.tises.remove(&n);
        self.free24(n);
        Ok(())
    }

    pub(super) fn create_tir(&mut self) -> R {
        let v = self.iv::<CreateTirIn>()?;
        let t = v.sub(CreateTirIn::CTX);
        let disp = t.get(Tirc::DISP_TYPE);
        if disp != 0 {
            return Err(param(
                Why::NotSupported,
                format!("tirc.disp_type {disp}: only direct dispatch (0) is modeled (no RQTs)"),
            ));
        }
        must_be_zero("tirc.tunneled_offload_en", t.get(Tirc::TUNNELED_OFFLOAD_EN))?;
        let td = t.get32(Tirc::TRANSPORT_DOMAIN);
        self.need_td(td)?;
        let rqn = t.get32(Tirc::INLINE_RQN);
        self.need_rq(rqn)?;
        self.limit("TIRs", self.dp.tirs.len(), self.nic.cfg.limits.max_tirs)?;
        let n = self.alloc24()?;
        self.dp.tirs.insert(
            n,
            Tir {
                td,
                rqn,
                self_lb_block: t.get(Tirc::SELF_LB_BLOCK) as u8,
            },
        );
        self.ov::<CreateTirOut>()?
            .set(CreateTirOut::TIRN, u64::from(n));
        Ok(())
    }

    pub(super) fn destroy_tir(&mut self) -> R {
        let n = self.iv::<DestroyTirIn>()?.get32(DestroyTirIn::TIRN);
        if !self.dp.tirs.contains_key(&n) {
            return Err(self.missing("TIR", n));
        }
        if self.dp.steering.references(Dest::Tir(n)) {
            return Err(self.busy(format!("TIR {n:#x} is a flow table entry's destination")));
        }
        self.dp.tirs.remove(&n);
        self.free24(n);
        Ok(())
    }
}
