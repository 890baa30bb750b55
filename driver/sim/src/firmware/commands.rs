//! Every modeled command: length checks, HCA-state gating, validation with
//! PRM statuses, and the object state machines.
//!
//! Status conventions used throughout:
//! * unknown or unmodeled opcode → BAD_OPCODE (0x02);
//! * input/output shorter than the command needs → BAD_INPUT_LENGTH (0x50)
//!   / BAD_OUTPUT_LENGTH (0x51);
//! * a field out of range, unsupported, misaligned or inconsistent →
//!   BAD_PARAMETER (0x03);
//! * a command the HCA state does not allow → BAD_SYSTEM_STATE (0x04);
//! * an object number that does not exist for this function, including
//!   one that belongs to another function → BAD_RESOURCE (0x05);
//! * destroying an object still referenced → RESOURCE_BUSY (0x06);
//! * a resource limit → LIMITS_EXCEEDED (0x08);
//! * a state transition from the wrong current state →
//!   BAD_RESOURCE_STATE (0x09);
//! * not enough pages for INIT_HCA → NO_RESOURCES (0x0f).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mlx5::prm::cmd::*;
use mlx5::prm::codes::{CmdStatus, Opcode, cap_type, manage_pages_op_mod, reg, wq_type};
use mlx5::prm::ctx::*;
use mlx5::prm::wqe::{MPWQE_LOG_STRIDE_SZ_BASE, decode_log_num_strides};
use mlx5::prm::{Layout, View, ViewMut};

use crate::fabric::Space8;
use crate::nic::{FIRST_UAR, NicInner};
use crate::objects::{Datapath, Mkey, MkeyKind, QCounter, Tir, Tis};
use crate::packet::{MATCH_SET_BYTES, supported_match_mask};
use crate::queues::{Cq, Eq, Ring};
use crate::rx::{Rq, Striding};
use crate::stats::WqState;
use crate::steering::{Dest, FlowGroup, FlowTable, Fte};
use crate::tx::Sq;
use crate::util::{be32, lock};

use super::caps::CAP_BYTES;
use super::pages::{self, PAGE_FILL};
use super::{Firmware, HcaState, Reject, Why};

type R = Result<(), Reject>;

fn rej(status: CmdStatus, why: Why, reason: impl Into<String>) -> Reject {
    Reject::new(status, why, reason)
}

fn param(why: Why, reason: impl Into<String>) -> Reject {
    rej(CmdStatus::BadParameter, why, reason)
}

/// Minimum input and output bytes of every modeled command.
fn lengths(op: Opcode) -> Option<(usize, usize)> {
    use Opcode::*;
    Some(match op {
        EnableHca
        | DisableHca
        | SetIssi
        | QueryPages
        | ManagePages
        | AccessReg
        | InitHca
        | TeardownHca
        | AllocUar
        | DeallocUar
        | AllocPd
        | DeallocPd
        | AllocTransportDomain
        | DeallocTransportDomain
        | DestroyMkey
        | DestroyEq
        | DestroyCq
        | DestroySq
        | DestroyRq
        | DestroyTis
        | DestroyTir
        | AllocQCounter
        | DeallocQCounter
        | Nop
        | QueryVportState => (0x10, 0x10),
        QueryIssi => (0x10, QueryIssiOut::BYTES),
        QueryHcaCap => (0x10, QueryHcaCapOut::BYTES),
        SetHcaCap => (SetHcaCapIn::BYTES, 0x10),
        CreateMkey => (CreateMkeyIn::BYTES, 0x10),
        CreateEq => (CreateEqIn::BYTES, 0x10),
        QueryEq => (0x10, QueryEqOut::BYTES),
        CreateCq => (CreateCqIn::BYTES, 0x10),
        QueryCq => (0x10, QueryCqOut::BYTES),
        ModifyCq => (ModifyCqIn::BYTES, 0x10),
        CreateSq => (CreateSqIn::BYTES, 0x10),
        ModifySq => (ModifySqIn::BYTES, 0x10),
        QuerySq => (0x10, QuerySqOut::BYTES),
        CreateRq => (CreateRqIn::BYTES, 0x10),
        ModifyRq => (ModifyRqIn::BYTES, 0x10),
        QueryRq => (0x10, QueryRqOut::BYTES),
        CreateTis => (CreateTisIn::BYTES, 0x10),
        CreateTir => (CreateTirIn::BYTES, 0x10),
        CreateFlowTable => (CreateFlowTableIn::BYTES, 0x10),
        DestroyFlowTable => (DestroyFlowTableIn::BYTES, 0x10),
        CreateFlowGroup => (CreateFlowGroupIn::BYTES, 0x10),
        DestroyFlowGroup => (DestroyFlowGroupIn::BYTES, 0x10),
        SetFlowTableEntry => (SetFteIn::BYTES, 0x10),
        DeleteFlowTableEntry => (DeleteFteIn::BYTES, 0x10),
        SetFlowTableRoot => (SetFlowTableRootIn::BYTES, 0x10),
        QueryNicVportContext => (0x10, QueryNicVportContextOut::BYTES),
        ModifyNicVportContext => (ModifyNicVportContextIn::BYTES, 0x10),
        QueryQCounter => (QueryQCounterIn::BYTES, QueryQCounterOut::BYTES),
        _ => return None,
    })
}

/// Which commands each HCA state allows.
fn gate(op: Opcode, hca: HcaState) -> R {
    use HcaState::*;
    use Opcode::*;
    let ok = match op {
        EnableHca => hca == Disabled,
        Nop | QueryIssi => true,
        DisableHca | QueryHcaCap | QueryPages | ManagePages => hca != Disabled,
        SetIssi | SetHcaCap => hca == Enabled,
        AccessReg => matches!(hca, Enabled | Initialized),
        InitHca => matches!(hca, Enabled | TornDown),
        _ => hca == Initialized,
    };
    if ok {
        Ok(())
    } else {
        Err(rej(
            CmdStatus::BadSystemState,
            Why::HcaState,
            format!("{} not allowed while the HCA is {hca:?}", op.name()),
        ))
    }
}

/// Runs one command. `out` is the whole output (outlen bytes, zeroed);
/// status and syndrome are filled in by the caller.
pub(crate) fn execute(
    nic: &NicInner,
    fw: &mut Firmware,
    dp: &mut Datapath,
    op: u16,
    op_mod: u16,
    inp: &[u8],
    out: &mut [u8],
) -> R {
    let Some(opcode) = Opcode::from_raw(op) else {
        return Err(rej(
            CmdStatus::BadOpcode,
            Why::BadOpcode,
            format!("unknown opcode {op:#06x}"),
        ));
    };
    let Some((min_in, min_out)) = lengths(opcode) else {
        return Err(rej(
            CmdStatus::BadOpcode,
            Why::BadOpcode,
            format!("{} ({op:#x}) is not modeled", opcode.name()),
        ));
    };
    if inp.len() < min_in {
        return Err(rej(
            CmdStatus::BadInputLength,
            Why::InputLength,
            format!(
                "{}: input {} bytes, needs {min_in}",
                opcode.name(),
                inp.len()
            ),
        ));
    }
    if out.len() < min_out {
        return Err(rej(
            CmdStatus::BadOutputLength,
            Why::OutputLength,
            format!(
                "{}: output {} bytes, needs {min_out}",
                opcode.name(),
                out.len()
            ),
        ));
    }
    let uid = be32(inp, 0) & 0xffff;
    if uid != 0 {
        return Err(param(
            Why::Reserved,
            format!("uid {uid:#x}: user contexts are not modeled"),
        ));
    }
    gate(opcode, fw.hca)?;
    let mut c = Ctx {
        nic,
        fw,
        dp,
        op_mod,
        inp,
        out,
    };
    use Opcode::*;
    match opcode {
        EnableHca => c.enable_hca(),
        DisableHca => c.disable_hca(),
        QueryIssi => c.query_issi(),
        SetIssi => c.set_issi(),
        QueryPages => c.query_pages(),
        ManagePages => c.manage_pages(),
        AccessReg => c.access_reg(),
        QueryHcaCap => c.query_hca_cap(),
        SetHcaCap => c.set_hca_cap(),
        InitHca => c.init_hca(),
        TeardownHca => c.teardown_hca(),
        AllocUar => c.alloc_uar(),
        DeallocUar => c.dealloc_uar(),
        AllocPd => c.alloc_pd_td(true),
        DeallocPd => c.dealloc_pd_td(true),
        AllocTransportDomain => c.alloc_pd_td(false),
        DeallocTransportDomain => c.dealloc_pd_td(false),
        CreateMkey => c.create_mkey(),
        DestroyMkey => c.destroy_mkey(),
        CreateEq => c.create_eq(),
        DestroyEq => c.destroy_eq(),
        QueryEq => c.query_eq(),
        CreateCq => c.create_cq(),
        DestroyCq => c.destroy_cq(),
        QueryCq => c.query_cq(),
        ModifyCq => c.modify_cq(),
        CreateSq => c.create_sq(),
        ModifySq => c.modify_sq(),
        DestroySq => c.destroy_sq(),
        QuerySq => c.query_sq(),
        CreateRq => c.create_rq(),
        ModifyRq => c.modify_rq(),
        DestroyRq => c.destroy_rq(),
        QueryRq => c.query_rq(),
        CreateTis => c.create_tis(),
        DestroyTis => c.destroy_tis(),
        CreateTir => c.create_tir(),
        DestroyTir => c.destroy_tir(),
        CreateFlowTable => c.create_flow_table(),
        DestroyFlowTable => c.destroy_flow_table(),
        CreateFlowGroup => c.create_flow_group(),
        DestroyFlowGroup => c.destroy_flow_group(),
        SetFlowTableEntry => c.set_fte(),
        DeleteFlowTableEntry => c.delete_fte(),
        SetFlowTableRoot => c.set_root(),
        QueryNicVportContext => c.query_vport_ctx(),
        ModifyNicVportContext => c.modify_vport_ctx(),
        QueryVportState => c.query_vport_state(),
        AllocQCounter => c.alloc_q_counter(),
        DeallocQCounter => c.dealloc_q_counter(),
        QueryQCounter => c.query_q_counter(),
        Nop => Ok(()),
        _ => Err(rej(
            CmdStatus::BadOpcode,
            Why::BadOpcode,
            format!("{} is not modeled", opcode.name()),
        )),
    }
}

struct Ctx<'a> {
    nic: &'a NicInner,
    fw: &'a mut Firmware,
    dp: &'a mut Datapath,
    op_mod: u16,
    inp: &'a [u8],
    out: &'a mut [u8],
}

/// Checks that `v` fits `max` (an inclusive range check helper).
fn range(name: &str, v: u64, lo: u64, hi: u64) -> R {
    if v < lo || v > hi {
        return Err(param(
            Why::OutOfRange,
            format!("{name} = {v} outside {lo}..={hi}"),
        ));
    }
    Ok(())
}

fn must_be_zero(name: &str, v: u64) -> R {
    if v != 0 {
        return Err(param(
            Why::NotSupported,
            format!("{name} = {v}: not supported by the model (must be 0)"),
        ));
    }
    Ok(())
}

impl Ctx<'_> {
    fn iv<S: Layout>(&self) -> Result<View<'_, S>, Reject> {
        View::<S>::new(self.inp).ok_or_else(|| {
            rej(
                CmdStatus::BadInputLength,
                Why::InputLength,
                format!("input shorter than {} bytes", S::BYTES),
            )
        })
    }

    fn ov<S: Layout>(&mut self) -> Result<ViewMut<'_, S>, Reject> {
        let n = self.out.len();
        ViewMut::<S>::new(self.out).ok_or_else(|| {
            rej(
                CmdStatus::BadOutputLength,
                Why::OutputLength,
                format!("output of {n} bytes shorter than {}", S::BYTES),
            )
        })
    }

    fn function(&self) -> u32 {
        self.nic.function
    }

    fn limit(&self, what: &str, have: usize, max: u32) -> R {
        if have as u64 >= u64::from(max) {
            return Err(rej(
                CmdStatus::LimitsExceeded,
                Why::Limit,
                format!("{what}: {have} exist, limit {max}"),
            ));
        }
        Ok(())
    }

    /// BAD_RESOURCE for a 24-bit number this function does not hold.
    fn missing(&self, what: &str, n: u32) -> Reject {
        let owner = lock(&self.nic.fabric.registry).owner24(n);
        match owner {
            Some(f) if f != self.function() => rej(
                CmdStatus::BadResource,
                Why::OtherFunction,
                format!(
                    "{what} {n:#x} belongs to function {f}, not {}",
                    self.function()
                ),
            ),
            _ => rej(
                CmdStatus::BadResource,
                Why::NoObject,
                format!("no {what} {n:#x}"),
            ),
        }
    }

    fn missing8(&self, what: &str, space: Space8, n: u32) -> Reject {
        let owner = u8::try_from(n)
            .ok()
            .and_then(|b| lock(&self.nic.fabric.registry).owner8(space, b));
        match owner {
            Some(f) if f != self.function() => rej(
                CmdStatus::BadResource,
                Why::OtherFunction,
                format!(
                    "{what} {n} belongs to function {f}, not {}",
                    self.function()
                ),
            ),
            _ => rej(
                CmdStatus::BadResource,
                Why::NoObject,
                format!("no {what} {n}"),
            ),
        }
    }

    fn alloc24(&self) -> Result<u32, Reject> {
        lock(&self.nic.fabric.registry)
            .alloc24(self.function())
            .ok_or_else(|| {
                rej(
                    CmdStatus::NoResources,
                    Why::Limit,
                    "object numbers exhausted",
                )
            })
    }

    fn free24(&self, n: u32) {
        lock(&self.nic.fabric.registry).free24(n);
    }

    fn need_uar(&self, n: u32) -> R {
        if self.dp.uars.contains(&n) {
            Ok(())
        } else {
            Err(rej(
                CmdStatus::BadResource,
                Why::NoObject,
                format!("UAR {n} is not allocated by this function"),
            ))
        }
    }

    fn need_pd(&self, n: u32) -> R {
        if self.dp.pds.contains(&n) {
            Ok(())
        } else {
            Err(self.missing("PD", n))
        }
    }

    fn need_td(&self, n: u32) -> R {
        if self.dp.tds.contains(&n) {
            Ok(())
        } else {
            Err(self.missing("transport domain", n))
        }
    }

    fn need_cq(&self, n: u32) -> Result<Arc<Mutex<Cq>>, Reject> {
        self.dp
            .cqs
            .get(&n)
            .cloned()
            .ok_or_else(|| self.missing("CQ", n))
    }

    fn need_eq(&self, n: u32) -> Result<Arc<Mutex<Eq>>, Reject> {
        self.dp
            .eqs
            .get(&n)
            .cloned()
            .ok_or_else(|| self.missing8("EQ", Space8::Eq, n))
    }

    fn need_sq(&self, n: u32) -> Result<Arc<Mutex<Sq>>, Reject> {
        self.dp
            .sqs
            .get(&n)
            .cloned()
            .ok_or_else(|| self.missing("SQ", n))
    }

    fn need_rq(&self, n: u32) -> Result<Arc<Mutex<Rq>>, Reject> {
        self.dp
            .rqs
            .get(&n)
            .cloned()
            .ok_or_else(|| self.missing("RQ", n))
    }

    fn busy(&self, what: String) -> Reject {
        rej(CmdStatus::ResourceBusy, Why::InUse, what)
    }

    /// A doorbell record: 8-byte aligned and mapped.
    fn check_dbr(&self, dbr: u64) -> R {
        if dbr % 8 != 0 {
            return Err(param(
                Why::Alignment,
                format!("doorbell record {dbr:#x} is not 8-byte aligned"),
            ));
        }
        if !self.nic.iommu.is_mapped(dbr, 8) {
            return Err(param(
                Why::Unmapped,
                format!("doorbell record {dbr:#x} is not mapped"),
            ));
        }
        Ok(())
    }

    /// Reads a PAS list at input offset `pas_at` for a ring of `bytes` in
    /// pages of `4 KiB << log_page_size`.
    fn ring(&self, pas_at: usize, bytes: u64, log_page_size: u64) -> Result<Ring, Reject> {
        range("log_page_size", log_page_size, 0, 18)?;
        let shift = 12 + log_page_size as u32;
        let n = Ring::pages_for(bytes, shift) as usize;
        let need = pas_at + 8 * n;
        if self.inp.len() < need {
            return Err(rej(
                CmdStatus::BadInputLength,
                Why::InputLength,
                format!(
                    "{n} PAS entries needed for {bytes} bytes in {} KiB pages: input must be {need} bytes, is {}",
                    (1u64 << shift) / 1024,
                    self.inp.len()
                ),
            ));
        }
        let mut pages = Vec::with_capacity(n);
        let psz = 1u64 << shift;
        for i in 0..n {
            let a = crate::util::be64(self.inp, pas_at + 8 * i);
            if a & 0xfff != 0 {
                return Err(param(
                    Why::Alignment,
                    format!("PAS entry {i} = {a:#x} is not 4 KiB aligned"),
                ));
            }
            let len = psz.min(bytes - i as u64 * psz);
            if !self.nic.iommu.is_mapped(a, len as usize) {
                return Err(param(
                    Why::Unmapped,
                    format!("PAS entry {i}: {len} bytes at {a:#x} are not mapped"),
                ));
            }
            pages.push(a);
        }
        Ok(Ring::new(pages, shift, bytes))
    }

    // ---------------------------------------------------------------- HCA

    fn function_id_zero(&self, ec: u64, func: u64) -> R {
        if ec != 0 || func != 0 {
            return Err(param(
                Why::NotSupported,
                format!(
                    "function_id {func} / embedded_cpu_function {ec}: only the own function (0) is modeled"
                ),
            ));
        }
        Ok(())
    }

    fn enable_hca(&mut self) -> R {
        let v = self.iv::<EnableHcaIn>()?;
        self.function_id_zero(
            v.get(EnableHcaIn::EMBEDDED_CPU_FUNCTION),
            v.get(EnableHcaIn::FUNCTION_ID),
        )?;
        self.fw.hca = HcaState::Enabled;
        Ok(())
    }

    fn disable_hca(&mut self) -> R {
        let v = self.iv::<DisableHcaIn>()?;
        self.function_id_zero(
            v.get(DisableHcaIn::EMBEDDED_CPU_FUNCTION),
            v.get(DisableHcaIn::FUNCTION_ID),
        )?;
        let leaked = release_all(self.nic, self.dp);
        let pages = self.fw.pages.held.len();
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
            self.nic.stats.pages_held.store(0, Ordering::Relaxed);
        }
        if leaked > 0 {
            tracing::warn!(leaked, "DISABLE_HCA with objects alive (leaked)");
        }
        self.fw.hca = HcaState::Disabled;
        self.fw.issi = 0;
        self.fw.pages.regular = 0;
        self.fw.page_events.clear();
        self.fw.caps = super::caps::Caps::new(&self.nic.cfg);
        self.dp.cqe_version = 1;
        Ok(())
    }

    fn query_issi(&mut self) -> R {
        let issi = self.fw.issi;
        let mut o = self.ov::<QueryIssiOut>()?;
        o.set(QueryIssiOut::CURRENT_ISSI, u64::from(issi))
            .set(QueryIssiOut::SUPPORTED_ISSI_DW0, 0b11);
        Ok(())
    }

    fn set_issi(&mut self) -> R {
        let v = self.iv::<SetIssiIn>()?.get(SetIssiIn::CURRENT_ISSI);
        range("current_issi", v, 0, 1)?;
        self.fw.issi = v as u16;
        Ok(())
    }

    fn query_pages(&mut self) -> R {
        let v = self.iv::<QueryPagesIn>()?;
        self.function_id_zero(
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
        let mut o = self.ov::<QueryPagesOut>()?;
        o.set(QueryPagesOut::FUNCTION_ID, 0)
            .set(QueryPagesOut::NUM_PAGES, u64::from(n as u32));
        Ok(())
    }

    fn manage_pages(&mut self) -> R {
        let v = self.iv::<ManagePagesIn>()?;
        self.function_id_zero(
            v.get(ManagePagesIn::EMBEDDED_CPU_FUNCTION),
            v.get(ManagePagesIn::FUNCTION_ID),
        )?;
        let n = v.get(ManagePagesIn::INPUT_NUM_ENTRIES) as usize;
        match self.op_mod {
            manage_pages_op_mod::CANNOT_GIVE => Ok(()),
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
                    if self.fw.pages.held.contains(&a) || pages.contains(&a) {
                        return Err(param(Why::Duplicate, format!("page {a:#x} given twice")));
                    }
                    pages.push(a);
                }
                for a in pages {
                    let _ = self.nic.iommu.fill(a, 4096, PAGE_FILL);
                    self.fw.pages.held.insert(a);
                }
                self.nic
                    .stats
                    .pages_held
                    .store(self.fw.pages.held.len() as u64, Ordering::Relaxed);
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
                let k = n.min(self.fw.pages.surplus(self.fw.hca));
                let give_back: Vec<u64> = self.fw.pages.held.iter().copied().take(k).collect();
                for (i, a) in give_back.iter().enumerate() {
                    self.fw.pages.held.remove(a);
                    self.out[0x10 + 8 * i..0x18 + 8 * i].copy_from_slice(&a.to_be_bytes());
                }
                let mut o = self.ov::<ManagePagesOut>()?;
                o.set(ManagePagesOut::OUTPUT_NUM_ENTRIES, k as u64);
                self.nic
                    .stats
                    .pages_held
                    .store(self.fw.pages.held.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            m => Err(param(Why::OpMod, format!("MANAGE_PAGES op_mod {m}"))),
        }
    }

    fn access_reg(&mut self) -> R {
        let v = self.iv::<AccessRegisterIn>()?;
        let id = v.get(AccessRegisterIn::REGISTER_ID) as u16;
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

    fn query_hca_cap(&mut self) -> R {
        let ty = self.op_mod >> 1;
        let current = self.op_mod & 1 == 1;
        let block = match (ty, current) {
            (cap_type::GENERAL, true) => &self.fw.caps.gen_cur,
            (cap_type::GENERAL, false) => &self.fw.caps.gen_max,
            (cap_type::ETHERNET_OFFLOADS, true) => &self.fw.caps.eth_cur,
            (cap_type::ETHERNET_OFFLOADS, false) => &self.fw.caps.eth_max,
            _ => {
                return Err(param(
                    Why::NotSupported,
                    format!(
                        "capability type {ty:#x} is not modeled (general 0 and Ethernet 1 are)"
                    ),
                ));
            }
        };
        self.out[0x10..0x10 + CAP_BYTES].copy_from_slice(block);
        Ok(())
    }

    fn set_hca_cap(&mut self) -> R {
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
        self.function_id_zero(
            v.get(SetHcaCapIn::OTHER_FUNCTION),
            v.get(SetHcaCapIn::FUNCTION_ID),
        )?;
        let block = &self.inp[0x10..0x10 + CAP_BYTES];
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

    fn init_hca(&mut self) -> R {
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
        self.dp.hca_up = true;
        let regular = self.fw.pages.regular_default;
        self.fw.pages.regular = 0;
        if regular > 0 {
            pages::request(self.nic, self.fw, self.dp, regular as i32);
        }
        Ok(())
    }

    fn teardown_hca(&mut self) -> R {
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
        self.fw.hca = HcaState::TornDown;
        self.fw.page_events.clear();
        Ok(())
    }

    // ------------------------------------------------------ simple objects

    fn alloc_uar(&mut self) -> R {
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

    fn dealloc_uar(&mut self) -> R {
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

    fn alloc_pd_td(&mut self, pd: bool) -> R {
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

    fn dealloc_pd_td(&mut self, pd: bool) -> R {
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

    fn create_mkey(&mut self) -> R {
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
            0 => MkeyKind::Pa {
                length64: m.get(Mkc::LENGTH64) == 1,
                start,
                len,
            },
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

    fn destroy_mkey(&mut self) -> R {
        let n = self.iv::<DestroyMkeyIn>()?.get32(DestroyMkeyIn::MKEY_INDEX);
        if self.dp.mkeys.remove(&n).is_none() {
            return Err(self.missing("mkey", n));
        }
        self.free24(n);
        Ok(())
    }

    // ------------------------------------------------------------------ EQ

    fn create_eq(&mut self) -> R {
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

    fn destroy_eq(&mut self) -> R {
        let n = self.iv::<DestroyEqIn>()?.get32(DestroyEqIn::EQ_NUMBER);
        self.need_eq(n)?;
        if self.dp.cqs.values().any(|c| lock(c).eqn == n) {
            return Err(self.busy(format!("EQ {n} is the completion EQ of a CQ")));
        }
        self.dp.eqs.remove(&n);
        lock(&self.nic.fabric.registry).free8(Space8::Eq, n as u8);
        Ok(())
    }

    fn query_eq(&mut self) -> R {
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

    fn create_cq(&mut self) -> R {
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

    fn destroy_cq(&mut self) -> R {
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

    fn query_cq(&mut self) -> R {
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

    fn modify_cq(&mut self) -> R {
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

    fn device_inline_mode(&self) -> u8 {
        match self.fw.caps.wqe_inline_mode() {
            0 => 1,
            1 => self.dp.vport.min_inline,
            _ => 0,
        }
    }

    /// Common WQ checks; returns (pd, dbr, log_wq_sz, log_wq_stride).
    fn check_wq(&self, w: View<'_, Wq>) -> Result<(u32, u64, u8, u8), Reject> {
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

    fn create_sq(&mut self) -> R {
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
        let min_inline = s.get(Sqc::MIN_WQE_INLINE_MODE) as u8;
        range("sqc.min_wqe_inline_mode", u64::from(min_inline), 0, 3)?;
        let dev = self.device_inline_mode();
        if min_inline < dev {
            return Err(param(
                Why::Mismatch,
                format!(
                    "sqc.min_wqe_inline_mode {min_inline} is below the device/vport requirement {dev}"
                ),
            ));
        }
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
        };
        self.dp.sqs.insert(sqn, Arc::new(Mutex::new(sq)));
        self.ov::<CreateSqOut>()?
            .set(CreateSqOut::SQN, u64::from(sqn));
        Ok(())
    }

    fn transition(
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

    fn modify_sq(&mut self) -> R {
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
        }
        sq.state = new;
        Ok(())
    }

    fn destroy_sq(&mut self) -> R {
        let n = self.iv::<DestroySqIn>()?.get32(DestroySqIn::SQN);
        self.need_sq(n)?;
        self.dp.sqs.remove(&n);
        self.free24(n);
        Ok(())
    }

    fn query_sq(&mut self) -> R {
        let n = self.iv::<QuerySqIn>()?.get32(QuerySqIn::SQN);
        let sq = self.need_sq(n)?;
        let sq = lock(&sq);
        let mut o = self.ov::<QuerySqOut>()?;
        let mut s = o.sub(QuerySqOut::SQ_CONTEXT);
        s.set(Sqc::FLUSH_IN_ERROR_EN, u64::from(sq.flush_in_error))
            .set(Sqc::MIN_WQE_INLINE_MODE, u64::from(sq.min_inline))
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

    fn create_rq(&mut self) -> R {
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
        self.dp.rqs.insert(rqn, Arc::new(Mutex::new(rq)));
        self.ov::<CreateRqOut>()?
            .set(CreateRqOut::RQN, u64::from(rqn));
        Ok(())
    }

    fn modify_rq(&mut self) -> R {
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

    fn destroy_rq(&mut self) -> R {
        let n = self.iv::<DestroyRqIn>()?.get32(DestroyRqIn::RQN);
        self.need_rq(n)?;
        if self.dp.tirs.values().any(|t| t.rqn == n) {
            return Err(self.busy(format!("RQ {n:#x} is the inline RQ of a TIR")));
        }
        self.dp.rqs.remove(&n);
        self.free24(n);
        Ok(())
    }

    fn query_rq(&mut self) -> R {
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
            .set(Rqc::COUNTER_SET_ID, u64::from(rq.counter_id));
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

    // ------------------------------------------------------------- TIS/TIR

    fn create_tis(&mut self) -> R {
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

    fn destroy_tis(&mut self) -> R {
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

    fn create_tir(&mut self) -> R {
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

    fn destroy_tir(&mut self) -> R {
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

    // ------------------------------------------------------------ steering

    fn nic_rx(&self, table_type: u64) -> R {
        if table_type != 0 {
            return Err(param(
                Why::NotSupported,
                format!("table_type {table_type}: only NIC RX (0) is modeled"),
            ));
        }
        Ok(())
    }

    fn table_of(&self, id: u32) -> Result<&FlowTable, Reject> {
        self.dp
            .steering
            .tables
            .get(&id)
            .ok_or_else(|| self.missing("flow table", id))
    }

    fn create_flow_table(&mut self) -> R {
        let v = self.iv::<CreateFlowTableIn>()?;
        self.nic_rx(v.get(CreateFlowTableIn::TABLE_TYPE))?;
        must_be_zero("other_vport", v.get(CreateFlowTableIn::OTHER_VPORT))?;
        must_be_zero("vport_number", v.get(CreateFlowTableIn::VPORT_NUMBER))?;
        let c = v.sub(CreateFlowTableIn::FLOW_TABLE_CONTEXT);
        must_be_zero("reformat_en", c.get(FlowTableContext::REFORMAT_EN))?;
        must_be_zero("decap_en", c.get(FlowTableContext::DECAP_EN))?;
        let log_size = c.get(FlowTableContext::LOG_SIZE);
        range(
            "log_size",
            log_size,
            0,
            u64::from(self.nic.cfg.limits.log_max_ft_size),
        )?;
        let level = c.get(FlowTableContext::LEVEL) as u8;
        let miss_action = c.get(FlowTableContext::TABLE_MISS_ACTION) as u8;
        let miss_table = c.get32(FlowTableContext::TABLE_MISS_ID);
        match miss_action {
            0 => {}
            1 => {
                let t = self.table_of(miss_table)?;
                if t.level <= level {
                    return Err(param(
                        Why::Mismatch,
                        format!(
                            "miss table {miss_table:#x} level {} must be above {level}",
                            t.level
                        ),
                    ));
                }
            }
            a => return Err(param(Why::NotSupported, format!("table_miss_action {a}"))),
        }
        self.limit(
            "flow tables",
            self.dp.steering.tables.len(),
            self.nic.cfg.limits.max_flow_tables,
        )?;
        let id = self.alloc24()?;
        self.dp.steering.tables.insert(
            id,
            FlowTable {
                level,
                log_size: log_size as u8,
                miss_action,
                miss_table,
                groups: Default::default(),
                entries: Default::default(),
            },
        );
        self.ov::<CreateFlowTableOut>()?
            .set(CreateFlowTableOut::TABLE_ID, u64::from(id));
        Ok(())
    }

    fn destroy_flow_table(&mut self) -> R {
        let v = self.iv::<DestroyFlowTableIn>()?;
        self.nic_rx(v.get(DestroyFlowTableIn::TABLE_TYPE))?;
        let id = v.get32(DestroyFlowTableIn::TABLE_ID);
        let t = self.table_of(id)?;
        if self.dp.steering.root == Some(id) {
            return Err(self.busy(format!("flow table {id:#x} is the root")));
        }
        if !t.groups.is_empty() {
            return Err(self.busy(format!(
                "flow table {id:#x} still has {} groups",
                t.groups.len()
            )));
        }
        if self.dp.steering.references(Dest::Table(id)) {
            return Err(self.busy(format!("flow table {id:#x} is another table's destination")));
        }
        self.dp.steering.tables.remove(&id);
        self.free24(id);
        Ok(())
    }

    fn create_flow_group(&mut self) -> R {
        let v = self.iv::<CreateFlowGroupIn>()?;
        self.nic_rx(v.get(CreateFlowGroupIn::TABLE_TYPE))?;
        must_be_zero("group_type", v.get(CreateFlowGroupIn::GROUP_TYPE))?;
        let id = v.get32(CreateFlowGroupIn::TABLE_ID);
        let start = v.get32(CreateFlowGroupIn::START_FLOW_INDEX);
        let end = v.get32(CreateFlowGroupIn::END_FLOW_INDEX);
        let enable = v.get(CreateFlowGroupIn::MATCH_CRITERIA_ENABLE);
        if enable & !1 != 0 {
            return Err(param(
                Why::NotSupported,
                format!(
                    "match_criteria_enable {enable:#x}: only outer headers (bit 0) are modeled"
                ),
            ));
        }
        let off = CreateFlowGroupIn::MATCH_CRITERIA.byte() + FteMatchParam::OUTER_HEADERS.byte();
        let mut mask = [0u8; MATCH_SET_BYTES];
        if enable & 1 != 0 {
            mask.copy_from_slice(&self.inp[off..off + MATCH_SET_BYTES]);
        }
        let ok = supported_match_mask();
        if let Some(i) = (0..MATCH_SET_BYTES).find(|&i| mask[i] & !ok[i] != 0) {
            return Err(param(
                Why::NotSupported,
                format!(
                    "match criteria byte {i:#x} of the outer headers selects bits the model does not match on"
                ),
            ));
        }
        let t = self.table_of(id)?;
        let size = 1u64 << t.log_size;
        if start > end || u64::from(end) >= size {
            return Err(param(
                Why::OutOfRange,
                format!("flow index range {start}..={end} outside a table of {size}"),
            ));
        }
        if let Some((g, _)) = t
            .groups
            .iter()
            .find(|(_, g)| start <= g.end && g.start <= end)
        {
            return Err(param(
                Why::Mismatch,
                format!("range {start}..={end} overlaps group {g:#x}"),
            ));
        }
        let gid = self.alloc24()?;
        if let Some(t) = self.dp.steering.tables.get_mut(&id) {
            t.groups.insert(gid, FlowGroup { start, end, mask });
        }
        self.ov::<CreateFlowGroupOut>()?
            .set(CreateFlowGroupOut::GROUP_ID, u64::from(gid));
        Ok(())
    }

    fn destroy_flow_group(&mut self) -> R {
        let v = self.iv::<DestroyFlowGroupIn>()?;
        self.nic_rx(v.get(DestroyFlowGroupIn::TABLE_TYPE))?;
        let id = v.get32(DestroyFlowGroupIn::TABLE_ID);
        let gid = v.get32(DestroyFlowGroupIn::GROUP_ID);
        let t = self.table_of(id)?;
        if !t.groups.contains_key(&gid) {
            return Err(self.missing("flow group", gid));
        }
        if t.entries.values().any(|e| e.group == gid) {
            return Err(self.busy(format!("flow group {gid:#x} still has entries")));
        }
        if let Some(t) = self.dp.steering.tables.get_mut(&id) {
            t.groups.remove(&gid);
        }
        self.free24(gid);
        Ok(())
    }

    fn set_fte(&mut self) -> R {
        let v = self.iv::<SetFteIn>()?;
        self.nic_rx(v.get(SetFteIn::TABLE_TYPE))?;
        if self.op_mod > 1 {
            return Err(param(
                Why::OpMod,
                format!("SET_FLOW_TABLE_ENTRY op_mod {}", self.op_mod),
            ));
        }
        let id = v.get32(SetFteIn::TABLE_ID);
        let index = v.get32(SetFteIn::FLOW_INDEX);
        let fc = v.sub(SetFteIn::FLOW_CONTEXT);
        let group = fc.get32(FlowContext::GROUP_ID);
        let action = fc.get(FlowContext::ACTION) as u16;
        let flow_tag = fc.get32(FlowContext::FLOW_TAG);
        let ndest = fc.get(FlowContext::DESTINATION_LIST_SIZE) as usize;
        must_be_zero(
            "flow_counter_list_size",
            fc.get(FlowContext::FLOW_COUNTER_LIST_SIZE),
        )?;
        let t = self.table_of(id)?;
        if u64::from(index) >= 1u64 << t.log_size {
            return Err(param(
                Why::OutOfRange,
                format!(
                    "flow_index {index} outside a table of {}",
                    1u64 << t.log_size
                ),
            ));
        }
        match t.group_of(index) {
            Some(g) if g == group => {}
            Some(g) => {
                return Err(param(
                    Why::Mismatch,
                    format!("flow_index {index} is in group {g:#x}, the entry names {group:#x}"),
                ));
            }
            None => {
                return Err(param(
                    Why::Mismatch,
                    format!("flow_index {index} is in no group"),
                ));
            }
        }
        let exists = t.entries.contains_key(&index);
        if self.op_mod == 0 && exists {
            return Err(param(
                Why::Duplicate,
                format!("entry {index} already exists (use op_mod 1)"),
            ));
        }
        if self.op_mod == 1 && !exists {
            return Err(param(
                Why::NoObject,
                format!("entry {index} does not exist"),
            ));
        }
        let my_level = t.level;
        let dests = match action {
            0x2 => {
                if ndest != 0 {
                    return Err(param(Why::Mismatch, "drop action with destinations"));
                }
                Vec::new()
            }
            0x4 => {
                if ndest == 0 {
                    return Err(param(Why::Mismatch, "forward action without destinations"));
                }
                let base = SetFteIn::FLOW_CONTEXT.byte() + FlowContext::DESTINATION.byte();
                let need = base + 8 * ndest;
                if self.inp.len() < need {
                    return Err(rej(
                        CmdStatus::BadInputLength,
                        Why::InputLength,
                        format!(
                            "{ndest} destinations need {need} input bytes, got {}",
                            self.inp.len()
                        ),
                    ));
                }
                let mut d = Vec::with_capacity(ndest);
                for i in 0..ndest {
                    let w = be32(self.inp, base + 8 * i);
                    let (ty, n) = ((w >> 24) as u8, w & 0x00ff_ffff);
                    match ty {
                        mlx5::prm::codes::flow::DEST_TIR => {
                            if !self.dp.tirs.contains_key(&n) {
                                return Err(self.missing("TIR", n));
                            }
                            d.push(Dest::Tir(n));
                        }
                        mlx5::prm::codes::flow::DEST_FLOW_TABLE => {
                            let t2 = self.table_of(n)?;
                            if t2.level <= my_level {
                                return Err(param(
                                    Why::Mismatch,
                                    format!(
                                        "destination table {n:#x} level {} must be above {my_level}",
                                        t2.level
                                    ),
                                ));
                            }
                            d.push(Dest::Table(n));
                        }
                        other => {
                            return Err(param(
                                Why::NotSupported,
                                format!(
                                    "destination type {other:#x}: TIR (2) and flow table (1) are modeled"
                                ),
                            ));
                        }
                    }
                }
                d
            }
            a => {
                return Err(param(
                    Why::NotSupported,
                    format!("flow action {a:#x}: drop (0x2) and forward (0x4) are modeled"),
                ));
            }
        };
        let off = SetFteIn::FLOW_CONTEXT.byte() + FlowContext::MATCH_VALUE.byte();
        let mut value = [0u8; MATCH_SET_BYTES];
        value.copy_from_slice(&self.inp[off..off + MATCH_SET_BYTES]);
        if let Some(t) = self.dp.steering.tables.get_mut(&id) {
            t.entries.insert(
                index,
                Fte {
                    group,
                    value,
                    action,
                    flow_tag,
                    dests,
                },
            );
        }
        Ok(())
    }

    fn delete_fte(&mut self) -> R {
        let v = self.iv::<DeleteFteIn>()?;
        self.nic_rx(v.get(DeleteFteIn::TABLE_TYPE))?;
        let id = v.get32(DeleteFteIn::TABLE_ID);
        let index = v.get32(DeleteFteIn::FLOW_INDEX);
        self.table_of(id)?;
        let removed = self
            .dp
            .steering
            .tables
            .get_mut(&id)
            .and_then(|t| t.entries.remove(&index));
        if removed.is_none() {
            return Err(param(
                Why::NoObject,
                format!("no entry {index} in flow table {id:#x}"),
            ));
        }
        Ok(())
    }

    fn set_root(&mut self) -> R {
        let v = self.iv::<SetFlowTableRootIn>()?;
        self.nic_rx(v.get(SetFlowTableRootIn::TABLE_TYPE))?;
        must_be_zero("underlay_qpn", v.get(SetFlowTableRootIn::UNDERLAY_QPN))?;
        match self.op_mod {
            0 => {
                let id = v.get32(SetFlowTableRootIn::TABLE_ID);
                self.table_of(id)?;
                self.dp.steering.root = Some(id);
                Ok(())
            }
            1 => {
                self.dp.steering.root = None;
                Ok(())
            }
            m => Err(param(
                Why::OpMod,
                format!("SET_FLOW_TABLE_ROOT op_mod {m} (0 set, 1 disconnect)"),
            )),
        }
    }

    // --------------------------------------------------------------- vport

    fn own_vport(&self, other: u64, num: u64) -> R {
        if other != 0 || num != 0 {
            return Err(param(
                Why::NotSupported,
                format!(
                    "other_vport {other} vport {num}: only the own vport is modeled (no e-switch)"
                ),
            ));
        }
        Ok(())
    }

    fn query_vport_ctx(&mut self) -> R {
        let v = self.iv::<QueryNicVportContextIn>()?;
        self.own_vport(
            v.get(QueryNicVportContextIn::OTHER_VPORT),
            v.get(QueryNicVportContextIn::VPORT_NUMBER),
        )?;
        let list_type = v.get(QueryNicVportContextIn::ALLOWED_LIST_TYPE);
        let vp = self.dp.vport.clone();
        let base = QueryNicVportContextOut::NIC_VPORT_CONTEXT.byte();
        let list_at = base + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
        let room = self.out.len().saturating_sub(list_at) / 8;
        let n = if list_type == 0 {
            vp.uc_list.len().min(room)
        } else {
            0
        };
        {
            let mut o = self.ov::<QueryNicVportContextOut>()?;
            let mut c = o.sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT);
            c.set(
                NicVportContext::MIN_WQE_INLINE_MODE,
                u64::from(vp.min_inline),
            )
            .set(
                NicVportContext::DISABLE_MC_LOCAL_LB,
                u64::from(vp.disable_mc_lb),
            )
            .set(
                NicVportContext::DISABLE_UC_LOCAL_LB,
                u64::from(vp.disable_uc_lb),
            )
            .set(NicVportContext::ROCE_EN, u64::from(vp.roce_en))
            .set(NicVportContext::MTU, u64::from(vp.mtu))
            .set(NicVportContext::PROMISC_UC, u64::from(vp.promisc_uc))
            .set(NicVportContext::PROMISC_MC, u64::from(vp.promisc_mc))
            .set(NicVportContext::PROMISC_ALL, u64::from(vp.promisc_all))
            .set(NicVportContext::ALLOWED_LIST_TYPE, list_type)
            .set(NicVportContext::ALLOWED_LIST_SIZE, n as u64);
            let m = vp.mac;
            let mut a = c.sub(NicVportContext::PERMANENT_ADDRESS);
            a.set(
                MacAddressLayout::MAC_ADDR_47_32,
                u64::from(u16::from_be_bytes([m[0], m[1]])),
            )
            .set(
                MacAddressLayout::MAC_ADDR_31_0,
                u64::from(u32::from_be_bytes([m[2], m[3], m[4], m[5]])),
            );
        }
        for (i, mac) in vp.uc_list.iter().take(n).enumerate() {
            let at = list_at + 8 * i + 2;
            self.out[at..at + 6].copy_from_slice(mac);
        }
        Ok(())
    }

    fn modify_vport_ctx(&mut self) -> R {
        let v = self.iv::<ModifyNicVportContextIn>()?;
        self.own_vport(
            v.get(ModifyNicVportContextIn::OTHER_VPORT),
            v.get(ModifyNicVportContextIn::VPORT_NUMBER),
        )?;
        let sel = v.sub(ModifyNicVportContextIn::FIELD_SELECT);
        let c = v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT);
        let mut vp = self.dp.vport.clone();
        if sel.get(ModifyNicVportFieldSelect::ROCE_EN) == 1 {
            if c.get(NicVportContext::ROCE_EN) == 1 {
                return Err(param(
                    Why::NotSupported,
                    "roce_en: the device reports roce = 0",
                ));
            }
            vp.roce_en = false;
        }
        if sel.get(ModifyNicVportFieldSelect::MIN_INLINE) == 1 {
            let m = c.get(NicVportContext::MIN_WQE_INLINE_MODE);
            range("min_wqe_inline_mode", m, 0, 3)?;
            vp.min_inline = m as u8;
        }
        if sel.get(ModifyNicVportFieldSelect::MTU) == 1 {
            let m = c.get(NicVportContext::MTU);
            range("mtu", m, 68, 9978)?;
            vp.mtu = m as u16;
        }
        if sel.get(ModifyNicVportFieldSelect::PROMISC) == 1 {
            vp.promisc_uc = c.get(NicVportContext::PROMISC_UC) == 1;
            vp.promisc_mc = c.get(NicVportContext::PROMISC_MC) == 1;
            vp.promisc_all = c.get(NicVportContext::PROMISC_ALL) == 1;
        }
        if sel.get(ModifyNicVportFieldSelect::PERMANENT_ADDRESS) == 1 {
            let a = c.sub(NicVportContext::PERMANENT_ADDRESS);
            let hi = (a.get32(MacAddressLayout::MAC_ADDR_47_32) as u16).to_be_bytes();
            let lo = a.get32(MacAddressLayout::MAC_ADDR_31_0).to_be_bytes();
            vp.mac = [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]];
        }
        if sel.get(ModifyNicVportFieldSelect::ADDRESSES_LIST) == 1 {
            let ty = c.get(NicVportContext::ALLOWED_LIST_TYPE);
            if ty != 0 {
                return Err(param(
                    Why::NotSupported,
                    format!("allowed_list_type {ty}: only unicast (0)"),
                ));
            }
            let n = c.get(NicVportContext::ALLOWED_LIST_SIZE) as usize;
            let max = 1usize << self.nic.cfg.limits.log_max_uc_list;
            if n > max {
                return Err(rej(
                    CmdStatus::LimitsExceeded,
                    Why::Limit,
                    format!("{n} unicast addresses, limit {max}"),
                ));
            }
            let at = ModifyNicVportContextIn::NIC_VPORT_CONTEXT.byte()
                + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
            let need = at + 8 * n;
            if self.inp.len() < need {
                return Err(rej(
                    CmdStatus::BadInputLength,
                    Why::InputLength,
                    format!(
                        "{n} addresses need {need} input bytes, got {}",
                        self.inp.len()
                    ),
                ));
            }
            vp.uc_list = (0..n)
                .map(|i| {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&self.inp[at + 8 * i + 2..at + 8 * i + 8]);
                    m
                })
                .collect();
        }
        self.dp.vport = vp;
        Ok(())
    }

    fn query_vport_state(&mut self) -> R {
        let v = self.iv::<QueryVportStateIn>()?;
        self.own_vport(
            v.get(QueryVportStateIn::OTHER_VPORT),
            v.get(QueryVportStateIn::VPORT_NUMBER),
        )?;
        let up = !self.nic.fabric.link_is_down(self.nic.port);
        let mut o = self.ov::<QueryVportStateOut>()?;
        o.set(QueryVportStateOut::ADMIN_STATE, 2)
            .set(QueryVportStateOut::STATE, u64::from(up));
        Ok(())
    }

    // ---------------------------------------------------------- Q counters

    fn alloc_q_counter(&mut self) -> R {
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

    fn dealloc_q_counter(&mut self) -> R {
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

    fn query_q_counter(&mut self) -> R {
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
}

/// Destroys every object of the function (teardown / disable) and frees
/// its numbers; returns how many there were.
pub(crate) fn release_all(nic: &NicInner, dp: &mut Datapath) -> usize {
    let total = dp.counts().total();
    {
        let mut reg = lock(&nic.fabric.registry);
        for n in dp.numbers24() {
            reg.free24(n);
        }
        for n in dp.eqs.keys() {
            reg.free8(Space8::Eq, *n as u8);
        }
        for n in dp.qcounters.keys() {
            reg.free8(Space8::QCounter, *n as u8);
        }
    }
    let vport = dp.vport.clone();
    let cqe_version = dp.cqe_version;
    *dp = Datapath::new(vport);
    dp.cqe_version = cqe_version;
    if total > 0 {
        nic.stats
            .objects_leaked
            .fetch_add(total as u64, Ordering::Relaxed);
    }
    total
}
