//! HCA life cycle, ISSI, firmware pages, registers and capabilities.

use std::sync::atomic::Ordering;

use mlx5::prm::cmd::*;
use mlx5::prm::codes::{CmdStatus, cap_type, manage_pages_op_mod, reg};
use mlx5::prm::ctx::*;
use mlx5::prm::{Layout, View, ViewMut};

use super::super::caps::CAP_BYTES;
use super::super::pages::{self, PAGE_FILL};
use super::super::{HcaState, Why};
use super::{Ctx, R, param, range, rej, release_all};

impl Ctx<'_> {
    // ---------------------------------------------------------------- HCA

    /// The function a command names: 0 means "the caller" (as ENABLE_HCA
    /// and QUERY_PAGES are sent), or the function's own id; other
    /// functions (and embedded-CPU functions) are not modeled.
    pub(super) fn own_function(&self, ec: u64, func: u64) -> R {
        let own = u64::from(self.nic.cfg.function_id);
        if ec != 0 || (func != 0 && func != own) {
            return Err(param(
                Why::NotSupported,
                format!(
                    "function_id {func} / embedded_cpu_function {ec}: only the own function (0 or {own}) is modeled"
                ),
            ));
        }
        Ok(())
    }

    /// The function ENABLE/DISABLE_HCA and QUERY_PAGES name: 0 or the own
    /// id, with `embedded_cpu_function` exactly when the function is an
    /// ECPF (Linux sets it from the init segment's `embedded_cpu`).
    pub(super) fn own_ec_function(&self, ec: u64, func: u64) -> R {
        let ecpf = u64::from(self.nic.cfg.ecpf);
        if ec != ecpf {
            return Err(param(
                Why::Mismatch,
                format!(
                    "embedded_cpu_function {ec}: the function is {}an embedded-CPU function (init segment embedded_cpu = {ecpf})",
                    if ecpf == 1 { "" } else { "not " }
                ),
            ));
        }
        self.own_function(0, func)
    }

    pub(super) fn enable_hca(&mut self) -> R {
        let v = self.iv::<EnableHcaIn>()?;
        self.own_ec_function(
            v.get(EnableHcaIn::EMBEDDED_CPU_FUNCTION),
            v.get(EnableHcaIn::FUNCTION_ID),
        )?;
        self.fw.hca = HcaState::Enabled;
        Ok(())
    }

    pub(super) fn disable_hca(&mut self) -> R {
        let v = self.iv::<DisableHcaIn>()?;
        self.own_ec_function(
            v.get(DisableHcaIn::EMBEDDED_CPU_FUNCTION),
            v.get(DisableHcaIn::FUNCTION_ID),
        )?;
        let leaked = release_all(self.nic, self.dp);
        let pages = self.fw.pages.total();
        if pages > 0 {
            tracing::warn!(
                pages,
                "DISABLE_HCA with pages still given to firmware (leaked)"
            );
            self.nic
                .stats
                .pages_leaked
                .fetch_add(pages as u64, Ordering::Relaxed);
            self.fw.pages.held.clear();
            self.fw.pages.host.clear();
            self.nic.stats.pages_held.store(0, Ordering::Relaxed);
        }
        if leaked > 0 {
            tracing::warn!(leaked, "DISABLE_HCA with objects alive (leaked)");
        }
        self.fw.hca = HcaState::Disabled;
        self.dp.link_up_at_ns = None;
        self.fw.issi = 0;
        self.fw.pages.regular = 0;
        self.fw.pages.host_demand = 0;
        self.fw.page_events.clear();
        self.fw.caps = super::super::caps::Caps::new(&self.nic.cfg);
        self.dp.cqe_version = 1;
        Ok(())
    }

    pub(super) fn query_issi(&mut self) -> R {
        let issi = self.fw.issi;
        let mut o = self.ov::<QueryIssiOut>()?;
        o.set(QueryIssiOut::CURRENT_ISSI, u64::from(issi))
            .set(QueryIssiOut::SUPPORTED_ISSI_DW0, 0b11);
        Ok(())
    }

    pub(super) fn set_issi(&mut self) -> R {
        let v = self.iv::<SetIssiIn>()?.get(SetIssiIn::CURRENT_ISSI);
        range("current_issi", v, 0, 1)?;
        self.fw.issi = v as u16;
        Ok(())
    }

    pub(super) fn query_pages(&mut self) -> R {
        let v = self.iv::<QueryPagesIn>()?;
        self.own_ec_function(
            v.get(QueryPagesIn::EMBEDDED_CPU_FUNCTION),
            v.get(QueryPagesIn::FUNCTION_ID),
        )?;
        let p = &self.fw.pages;
        let held = p.held.len() as i64;
        let n: i64 = match self.op_mod {
            1 => (i64::from(p.boot) - held).max(0),
            2 => (i64::from(p.boot) + i64::from(p.init) - held).max(0),
            3 => p.target(self.fw.hca) - held,
            m => {
                return Err(param(
                    Why::OpMod,
                    format!("QUERY_PAGES op_mod {m} (1 boot, 2 init, 3 regular)"),
                ));
            }
        };
        let n = n.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        let own = u64::from(self.nic.cfg.function_id);
        let ecpf = u64::from(self.nic.cfg.ecpf);
        let mut o = self.ov::<QueryPagesOut>()?;
        o.set(QueryPagesOut::FUNCTION_ID, own)
            .set(QueryPagesOut::EMBEDDED_CPU_FUNCTION, ecpf)
            .set(QueryPagesOut::NUM_PAGES, u64::from(n as u32));
        Ok(())
    }

    pub(super) fn manage_pages(&mut self) -> R {
        let v = self.iv::<ManagePagesIn>()?;
        // Pages are for the function QUERY_PAGES and the page-request EQE
        // named; the driver must echo it (rdma-core, Linux pagealloc.c).
        let (ec, func) = (
            v.get(ManagePagesIn::EMBEDDED_CPU_FUNCTION),
            v.get(ManagePagesIn::FUNCTION_ID),
        );
        let own = u64::from(self.nic.cfg.function_id);
        let ecpf = u64::from(self.nic.cfg.ecpf);
        // On an ECPF, firmware also asks for the host PF's pages
        // (function 0, ec 0): they are kept apart and must be taken back
        // for that function.
        let host = ecpf == 1 && ec == 0 && func == 0;
        if !host && (ec != ecpf || func != own) {
            return Err(param(
                Why::Mismatch,
                format!(
                    "MANAGE_PAGES for function {func} (ec {ec}); firmware asked for function {own} (ec {ecpf})"
                ),
            ));
        }
        let n = v.get(ManagePagesIn::INPUT_NUM_ENTRIES) as usize;
        match self.op_mod {
            manage_pages_op_mod::CANNOT_GIVE => {
                // The driver cannot supply what was asked: the firmware
                // stops waiting for those pages (a held command fails; see
                // `cmdq`) and lowers its demand to what it holds.
                if self.fw.hca == HcaState::Initialized {
                    let p = &mut self.fw.pages;
                    if host {
                        p.host_demand = p.host.len() as u32;
                    } else {
                        let floor = i64::from(p.boot) + i64::from(p.init);
                        p.regular = (p.held.len() as i64 - floor).max(0) as u32;
                    }
                }
                Ok(())
            }
            manage_pages_op_mod::GIVE => {
                let need = 0x10 + 8 * n;
                if self.inp.len() < need {
                    return Err(rej(
                        CmdStatus::BadInputLength,
                        Why::InputLength,
                        format!(
                            "MANAGE_PAGES GIVE of {n} pages needs {need} input bytes, got {}",
                            self.inp.len()
                        ),
                    ));
                }
                let mut pages = Vec::with_capacity(n);
                for i in 0..n {
                    let a = crate::util::be64(self.inp, 0x10 + 8 * i);
                    if a & 0xfff != 0 {
                        return Err(param(
                            Why::Alignment,
                            format!("page {i} at {a:#x} is not 4 KiB aligned"),
                        ));
                    }
                    if !self.nic.iommu.is_mapped(a, 4096) {
                        return Err(param(
                            Why::Unmapped,
                            format!("page {i} at {a:#x} is not mapped"),
                        ));
                    }
                    if self.fw.pages.held.contains(&a)
                        || self.fw.pages.host.contains(&a)
                        || pages.contains(&a)
                    {
                        return Err(param(Why::Duplicate, format!("page {a:#x} given twice")));
                    }
                    pages.push(a);
                }
                for a in pages {
                    let _ = self.nic.iommu.fill(a, 4096, PAGE_FILL);
                    if host {
                        self.fw.pages.host.insert(a);
                    } else {
                        self.fw.pages.held.insert(a);
                    }
                }
                self.nic
                    .stats
                    .pages_held
                    .store(self.fw.pages.total() as u64, Ordering::Relaxed);
                Ok(())
            }
            manage_pages_op_mod::TAKE => {
                let need = 0x10 + 8 * n;
                if self.out.len() < need {
                    return Err(rej(
                        CmdStatus::BadOutputLength,
                        Why::OutputLength,
                        format!(
                            "MANAGE_PAGES TAKE of {n} pages needs {need} output bytes, got {}",
                            self.out.len()
                        ),
                    ));
                }
                let now = self.nic.now_ns();
                let delay = self.nic.cfg.page_release_delay.as_nanos() as u64;
                let p = &mut self.fw.pages;
                let (k, set) = if host {
                    let k = p.reclaimable_host(self.fw.hca, self.fw.torn_down_at, now, delay);
                    (n.min(k), &mut p.host)
                } else {
                    let k = p.reclaimable(self.fw.hca, self.fw.torn_down_at, now, delay);
                    (n.min(k), &mut p.held)
                };
                let give_back: Vec<u64> = set.iter().copied().take(k).collect();
                for (i, a) in give_back.iter().enumerate() {
                    set.remove(a);
                    self.out[0x10 + 8 * i..0x18 + 8 * i].copy_from_slice(&a.to_be_bytes());
                }
                let mut o = self.ov::<ManagePagesOut>()?;
                o.set(ManagePagesOut::OUTPUT_NUM_ENTRIES, k as u64);
                self.nic
                    .stats
                    .pages_held
                    .store(self.fw.pages.total() as u64, Ordering::Relaxed);
                Ok(())
            }
            m => Err(param(Why::OpMod, format!("MANAGE_PAGES op_mod {m}"))),
        }
    }

    pub(super) fn access_reg(&mut self) -> R {
        let v = self.iv::<AccessRegisterIn>()?;
        let id = v.get(AccessRegisterIn::REGISTER_ID) as u16;
        if id == reg::HOST_ENDIANNESS && self.nic.cfg.vf {
            // A PF register: Linux `set_hca_ctrl` and FreeBSD skip it on
            // VFs.
            return Err(param(
                Why::NotSupported,
                "HOST_ENDIANNESS (0x7004) belongs to the physical function; this is a VF",
            ));
        }
        if id != reg::HOST_ENDIANNESS {
            return Err(param(
                Why::NotSupported,
                format!("register {id:#06x} is not modeled (HOST_ENDIANNESS 0x7004 is)"),
            ));
        }
        match self.op_mod {
            0 => {
                if self.inp.len() < 0x20 {
                    return Err(rej(
                        CmdStatus::BadInputLength,
                        Why::InputLength,
                        "HOST_ENDIANNESS write needs 16 register bytes",
                    ));
                }
                let mut r = [0u8; 16];
                r.copy_from_slice(&self.inp[0x10..0x20]);
                self.fw.host_endianness = Some(r);
                Ok(())
            }
            1 => {
                if self.out.len() < 0x20 {
                    return Err(rej(
                        CmdStatus::BadOutputLength,
                        Why::OutputLength,
                        "HOST_ENDIANNESS read needs 16 register bytes of output",
                    ));
                }
                let r = self.fw.host_endianness.unwrap_or_default();
                self.out[0x10..0x20].copy_from_slice(&r);
                Ok(())
            }
            m => Err(param(Why::OpMod, format!("ACCESS_REG op_mod {m}"))),
        }
    }

    pub(super) fn query_hca_cap(&mut self) -> R {
        let ty = self.op_mod >> 1;
        let current = self.op_mod & 1 == 1;
        let block = match (ty, current) {
            (cap_type::GENERAL, true) => &self.fw.caps.gen_cur,
            (cap_type::GENERAL, false) => &self.fw.caps.gen_max,
            (cap_type::ETHERNET_OFFLOADS, true) => &self.fw.caps.eth_cur,
            (cap_type::ETHERNET_OFFLOADS, false) => &self.fw.caps.eth_max,
            (cap_type::NIC_FLOW_TABLE, _) => &self.fw.caps.flow_table,
            (cap_type::GENERAL_2, _) if self.fw.caps.gen2.is_some() => {
                self.fw.caps.gen2.as_ref().expect("checked")
            }
            _ => {
                return Err(param(
                    Why::NotSupported,
                    format!(
                        "capability type {ty:#x} is not modeled (general 0, Ethernet 1, NIC flow table 7 and, with hca_cap_2, general-2 0x20 are)"
                    ),
                ));
            }
        };
        self.out[0x10..0x10 + CAP_BYTES].copy_from_slice(block);
        if ty == cap_type::GENERAL {
            // The rest of the 4 KiB capability union is reserved: firmware
            // does not promise zeros there on output (and refuses anything
            // but zeros on input, see SET_HCA_CAP).
            let tail = 0x10 + CmdHcaCap::BYTES..0x10 + CAP_BYTES;
            for (i, b) in self.out[tail].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(0x3b) | 0x40;
            }
        }
        Ok(())
    }

    pub(super) fn set_hca_cap(&mut self) -> R {
        if self.op_mod >> 1 != cap_type::GENERAL {
            return Err(param(
                Why::NotSupported,
                format!(
                    "SET_HCA_CAP of capability type {:#x}: only general (0) is settable",
                    self.op_mod >> 1
                ),
            ));
        }
        let v = self.iv::<SetHcaCapIn>()?;
        self.own_function(
            v.get(SetHcaCapIn::OTHER_FUNCTION),
            v.get(SetHcaCapIn::FUNCTION_ID),
        )?;
        let block = &self.inp[0x10..0x10 + CAP_BYTES];
        if let Some(i) = block[CmdHcaCap::BYTES..].iter().position(|b| *b != 0) {
            return Err(param(
                Why::Reserved,
                format!(
                    "SET_HCA_CAP general: byte {:#x} of the capability is past cmd_hca_cap (reserved, must be 0)",
                    CmdHcaCap::BYTES + i
                ),
            ));
        }
        if let Err((field, val, max)) = self.fw.caps.check_set(block) {
            return Err(param(
                Why::OutOfRange,
                format!("SET_HCA_CAP {field} = {val} exceeds the device maximum {max}"),
            ));
        }
        self.fw.caps.gen_cur.copy_from_slice(block);
        self.dp.cqe_version = self.fw.caps.cur(CmdHcaCap::CQE_VERSION) as u8;
        Ok(())
    }

    pub(super) fn init_hca(&mut self) -> R {
        let p = &self.fw.pages;
        let need = p.boot as usize + p.init as usize;
        if p.held.len() < need {
            return Err(rej(
                CmdStatus::NoResources,
                Why::Pages,
                format!(
                    "INIT_HCA needs {need} boot+init pages, firmware holds {}",
                    p.held.len()
                ),
            ));
        }
        self.fw.hca = HcaState::Initialized;
        self.fw.torn_down_at = None;
        self.dp.link_up_at_ns = Some(
            self.nic
                .now_ns()
                .saturating_add(self.nic.cfg.link_up_delay.as_nanos() as u64),
        );
        let q = View::<CmdHcaCap>::new(&self.fw.caps.gen_max)
            .expect("4 KiB")
            .get(CmdHcaCap::MAX_QP_CNT);
        ViewMut::<CmdHcaCap>::new(&mut self.fw.caps.gen_cur)
            .expect("4 KiB")
            .set(CmdHcaCap::MAX_QP_CNT, q);
        self.dp.hca_up = true;
        let regular = self.fw.pages.regular_default;
        self.fw.pages.regular = 0;
        if regular > 0 {
            pages::request(self.nic, self.fw, self.dp, regular as i32);
        }
        self.fw.pages.host_demand = 0;
        if self.nic.cfg.ecpf && self.nic.cfg.host_pf_pages > 0 {
            pages::request_host(self.nic, self.fw, self.dp, self.nic.cfg.host_pf_pages);
        }
        Ok(())
    }

    pub(super) fn teardown_hca(&mut self) -> R {
        let profile = self.iv::<TeardownHcaIn>()?.get(TeardownHcaIn::PROFILE);
        match profile {
            0 | 1 => {}
            2 => {
                return Err(param(
                    Why::NotSupported,
                    "TEARDOWN_HCA profile 2 (prepare fast teardown): fast_teardown is 0",
                ));
            }
            p => return Err(param(Why::OutOfRange, format!("TEARDOWN_HCA profile {p}"))),
        }
        let leaked = release_all(self.nic, self.dp);
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "TEARDOWN_HCA with objects alive; destroyed (leaked)"
            );
        }
        self.dp.hca_up = false;
        self.dp.link_up_at_ns = None;
        self.fw.hca = HcaState::TornDown;
        self.fw.torn_down_at = Some(self.nic.now_ns());
        self.fw.page_events.clear();
        Ok(())
    }
}
