//! Teardown: every object bring-up created, in reverse, then TEARDOWN_HCA,
//! the firmware pages back, DISABLE_HCA.

use std::sync::Arc;
use std::time::Duration;

use crate::bar::Bar;
use crate::dma::DmaPool;
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::cmd::*;
use crate::prm::codes::{Opcode, flow};
use crate::prm::{Layout, ViewMut};

use super::bring_up::enable_hca;
use super::fw_pages::take_pages;
use super::vport::set_vport_mac_list;
use super::{Ctl, FuncId, Obj, PAGE_RECLAIM_BUDGET, input, out_len};

/// Destroys one object by number (DEALLOC_*/DESTROY_* with the number at +0x08).
pub(crate) fn destroy_u24<I: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
    f: crate::prm::Field<I>,
    n: u32,
) -> Result<(), Error> {
    let mut inp = input::<I>(op, 0, 0);
    ViewMut::<I>::new(&mut inp).expect("sized").set(f, n as u64);
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// Takes back every page firmware holds, each for the function it was given
/// for, as Linux `mlx5_reclaim_startup_pages` does: firmware may return
/// pages a little at a time after TEARDOWN_HCA, so a TAKE that returns
/// nothing is retried (1 ms apart) until no page has come back for
/// [`PAGE_RECLAIM_BUDGET`]. Pages still held then are leaked (never reused:
/// the device may write them) and reported.
fn reclaim_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let step = Duration::from_millis(1);
    let mut idle = Duration::ZERO;
    while ctl.pages.given() > 0 {
        let mut progress = 0;
        for (key, n) in ctl.pages.by_function() {
            let func = FuncId::from_key(key);
            progress += take_pages(&mut ctl.cmdq, &mut ctl.pages, bar, pool, n, func)?;
        }
        if progress > 0 {
            idle = Duration::ZERO;
            continue;
        }
        if idle >= PAGE_RECLAIM_BUDGET {
            break;
        }
        bar.wait(step);
        idle += step;
    }
    if ctl.pages.given() > 0 {
        tracing::error!(
            device = %bar.name(),
            pages = ctl.pages.given(),
            by_function = ?ctl.pages.by_function(),
            waited = ?idle,
            "firmware kept pages after teardown; leaking them"
        );
        return Err(Error::Timeout {
            device: bar.name(),
            what: format!(
                "return of {} firmware pages (leaked, never reused)",
                ctl.pages.given()
            ),
            waited: idle,
        });
    }
    Ok(())
}

/// Tears down everything bring-up created, in reverse; then TEARDOWN_HCA,
/// reclaims every firmware page, DISABLE_HCA. Keeps going after failures
/// and returns the first.
pub(super) fn teardown<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            tracing::error!(error = %e, "teardown step failed");
            first.get_or_insert(e);
        }
    };
    while let Some(obj) = ctl.objects.pop() {
        let r = match obj {
            // Linux destroys the last NIC RX root table without
            // disconnecting it (firmware allows that); SET_FLOW_TABLE_ROOT
            // op_mod 1 exists only with the reset_root_to_default cap.
            Obj::FlowRoot if !ctl.reset_root_to_default => Ok(()),
            Obj::FlowRoot => {
                let mut inp = input::<SetFlowTableRootIn>(
                    Opcode::SetFlowTableRoot,
                    flow::SET_ROOT_OP_MOD_DISCONNECT,
                    0,
                );
                ViewMut::<SetFlowTableRootIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        SetFlowTableRootIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    );
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::FlowGroup(table, group) => {
                let mut inp = input::<DestroyFlowGroupIn>(Opcode::DestroyFlowGroup, 0, 0);
                ViewMut::<DestroyFlowGroupIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        DestroyFlowGroupIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    )
                    .set(DestroyFlowGroupIn::TABLE_ID, table as u64)
                    .set(DestroyFlowGroupIn::GROUP_ID, group as u64);
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::FlowTable(table) => {
                ctl.flow = None;
                let mut inp = input::<DestroyFlowTableIn>(Opcode::DestroyFlowTable, 0, 0);
                ViewMut::<DestroyFlowTableIn>::new(&mut inp)
                    .expect("sized")
                    .set(
                        DestroyFlowTableIn::TABLE_TYPE,
                        flow::TABLE_TYPE_NIC_RX as u64,
                    )
                    .set(DestroyFlowTableIn::TABLE_ID, table as u64);
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::Mkey(i) => destroy_u24(
                bar,
                pool,
                ctl,
                Opcode::DestroyMkey,
                DestroyMkeyIn::MKEY_INDEX,
                i,
            ),
            Obj::Td(t) => destroy_u24(
                bar,
                pool,
                ctl,
                Opcode::DeallocTransportDomain,
                DeallocTransportDomainIn::TRANSPORT_DOMAIN,
                t,
            ),
            Obj::Pd(p) => destroy_u24(bar, pool, ctl, Opcode::DeallocPd, DeallocPdIn::PD, p),
            Obj::Eq(e) => {
                let r = destroy_u24(
                    bar,
                    pool,
                    ctl,
                    Opcode::DestroyEq,
                    DestroyEqIn::EQ_NUMBER,
                    e as u32,
                );
                ctl.eq = None;
                r
            }
            Obj::L2Entry(index) => {
                let mut inp = input::<DeleteL2TableEntryIn>(Opcode::DeleteL2TableEntry, 0, 0);
                ViewMut::<DeleteL2TableEntryIn>::new(&mut inp)
                    .expect("sized")
                    .set(DeleteL2TableEntryIn::TABLE_INDEX, u64::from(index));
                ctl.exec(bar, pool, &inp, 16).map(|_| ())
            }
            Obj::VportMacList => set_vport_mac_list(bar, pool, ctl, &[]),
            Obj::Msix => bar.backend().disable_msix().map_err(|source| Error::Pci {
                device: bar.name(),
                what: "MSI-X disable (VFIO_DEVICE_SET_IRQS)",
                source,
            }),
            Obj::Uar(u) => destroy_u24(bar, pool, ctl, Opcode::DeallocUar, DeallocUarIn::UAR, u),
        };
        note(r);
    }
    if ctl.initialized {
        let mut inp = input::<TeardownHcaIn>(Opcode::TeardownHca, 0, 0);
        ViewMut::<TeardownHcaIn>::new(&mut inp)
            .expect("sized")
            .set(TeardownHcaIn::PROFILE, 0);
        note(
            ctl.exec(bar, pool, &inp, out_len::<TeardownHcaOut>(0))
                .map(|_| ()),
        );
        ctl.initialized = false;
    }
    if ctl.enabled {
        note(reclaim_pages(bar, pool, ctl));
        note(enable_hca(bar, pool, ctl, Opcode::DisableHca));
        ctl.enabled = false;
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
