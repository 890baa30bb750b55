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
//!
//! One file per family, as the driver is split: `hca` (HCA life cycle,
//! ISSI, pages, registers, capabilities), `objects` (UAR, PD, TD, mkey,
//! Q counter, TIS, TIR), `queues` (EQ, CQ, SQ, RQ), `steering` (NIC RX
//! flow tables) and `vport` (NIC vport context and state). This file
//! holds the dispatch, length and HCA-state checks, and shared helpers.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mlx5::prm::cmd::*;
use mlx5::prm::codes::{CmdStatus, Opcode};
use mlx5::prm::{Layout, View, ViewMut};

use crate::fabric::Space8;
use crate::nic::NicInner;
use crate::objects::Datapath;
use crate::queues::{Cq, Eq, Ring};
use crate::rx::Rq;
use crate::tx::Sq;
use crate::util::{be32, lock};

use super::{Firmware, HcaState, Reject, Why};

mod hca;
mod objects;
mod queues;
mod steering;
mod vport;

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
        SetL2TableEntry => (SetL2TableEntryIn::BYTES, 0x10),
        DeleteL2TableEntry => (DeleteL2TableEntryIn::BYTES, 0x10),
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
        SetL2TableEntry => c.set_l2_table_entry(),
        DeleteL2TableEntry => c.delete_l2_table_entry(),
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
        if !dbr.is_multiple_of(8) {
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
