//! Firmware pages (MANAGE_PAGES and QUERY_PAGES) and the event-queue
//! service that answers firmware's page requests.

use std::sync::Arc;

use crate::bar::Bar;
use crate::cmd::{CmdQueue, SlotKind};
use crate::dma::DmaPool;
use crate::eq::EventQueue;
use crate::error::Error;
use crate::hw::HwBackend;
use crate::pages::FwPages;
use crate::prm::cmd::*;
use crate::prm::codes::{EventType, Opcode, manage_pages_op_mod};
use crate::prm::{View, ViewMut};

use super::{Ctl, FuncId, PAGES_PER_CMD, input, out_len};

/// Handles every pending EQE: page requests are answered from the pages
/// slot; CQ errors are recorded for the queue sets to report. A page
/// request the driver cannot meet for lack of memory is answered with
/// MANAGE_PAGES CANT_GIVE (Linux `page_notify_fail`), so that firmware
/// stops waiting for the pages; one the firmware itself refuses is
/// dropped (Linux `give_pages` in event context). Every pending event is
/// handled; the first failure is returned.
pub(super) fn service_events<B: HwBackend>(
    cmdq: &mut CmdQueue,
    eq: &mut EventQueue,
    pages: &mut FwPages,
    cq_errors: &mut Vec<(u32, u8)>,
    pages_refused: &mut u64,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
) -> Result<(), Error> {
    let mut handled = 0;
    let mut first = None;
    while let Some(e) = eq.poll() {
        handled += 1;
        if let Some((ec, id, n)) = e.page_request_for() {
            let func = FuncId { ec, id };
            tracing::debug!(num_pages = n, ?func, "firmware page request");
            let r = if n > 0 {
                match give_pages(cmdq, pages, bar, pool, n as usize, func, true) {
                    Err(e @ Error::FirmwarePages { .. }) => {
                        *pages_refused += 1;
                        tracing::error!(device = %bar.name(), error = %e, "firmware page request refused (CANT_GIVE)");
                        Ok(())
                    }
                    r => r,
                }
            } else if n < 0 {
                take_pages(cmdq, pages, bar, pool, n.unsigned_abs() as usize, func).map(|_| ())
            } else {
                Ok(())
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        } else if let Some((cqn, synd)) = e.cq_error() {
            tracing::warn!(cqn, syndrome = synd, "CQ error event");
            cq_errors.push((cqn, synd));
        } else if e.event_type != EventType::PortChange as u8 {
            tracing::debug!(event = %e, "unexpected event");
        }
        if handled >= 64 {
            break;
        }
    }
    eq.publish(bar, true);
    first.map_or(Ok(()), Err)
}

/// Fills in the function a MANAGE_PAGES is for.
fn set_func(v: &mut ViewMut<'_, ManagePagesIn>, func: FuncId) {
    v.set(ManagePagesIn::EMBEDDED_CPU_FUNCTION, u64::from(func.ec))
        .set(ManagePagesIn::FUNCTION_ID, u64::from(func.id));
}

/// MANAGE_PAGES GIVE of `n` pages for `func`, in batches. `event`: the
/// request came as an event (not QUERY_PAGES during bring-up); then, if
/// memory runs out, firmware is told with CANT_GIVE (Linux
/// `page_notify_fail`), and a GIVE the firmware refuses is dropped rather
/// than returned (Linux `give_pages`: an event's GIVE failed by firmware
/// is ignored).
fn give_pages<B: HwBackend>(
    cmdq: &mut CmdQueue,
    pages: &mut FwPages,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    n: usize,
    func: FuncId,
    event: bool,
) -> Result<(), Error> {
    // Every page first (as Linux `give_pages` does), so that a request
    // memory cannot meet leaves nothing half given.
    let all = match pages.take_for_firmware(pool, n, func.key()) {
        Ok(a) => a,
        Err(Error::Memory(source)) => {
            // What was reserved on the way is of no use now.
            pool.release_unused();
            if event {
                cant_give(cmdq, bar, pool, func);
            }
            return Err(Error::FirmwarePages {
                device: bar.name(),
                wanted: n,
                given: 0,
                source,
            });
        }
        Err(e) => return Err(e),
    };
    for (k, addrs) in all.chunks(PAGES_PER_CMD).enumerate() {
        let batch = addrs.len();
        let mut inp =
            input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::GIVE, batch * 8);
        {
            let mut v = ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized");
            v.set(ManagePagesIn::INPUT_NUM_ENTRIES, batch as u64);
            set_func(&mut v, func);
            for (i, a) in addrs.iter().enumerate() {
                assert!(v.set_flex(ManagePagesIn::PAS, i as u32, *a));
            }
        }
        if let Err(e) = cmdq.exec(
            bar,
            pool,
            SlotKind::Pages,
            &inp,
            out_len::<ManagePagesOut>(0),
            |_| {},
        ) {
            let given = k * PAGES_PER_CMD;
            pages.unwind(&all[given..]);
            pages.trim();
            if event && matches!(e, Error::Command { .. }) {
                tracing::warn!(device = %bar.name(), error = %e, given, wanted = n, ?func, "firmware refused the pages it asked for; dropping the rest of the request");
                return Ok(());
            }
            return Err(e);
        }
    }
    Ok(())
}

/// MANAGE_PAGES op_mod CANT_GIVE for `func`: the driver cannot supply the
/// pages firmware asked for. Best effort: a failure is only logged.
fn cant_give<B: HwBackend>(cmdq: &mut CmdQueue, bar: &Bar<B>, pool: &Arc<DmaPool>, func: FuncId) {
    let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::CANNOT_GIVE, 0);
    set_func(
        &mut ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized"),
        func,
    );
    if let Err(e) = cmdq.exec(
        bar,
        pool,
        SlotKind::Pages,
        &inp,
        out_len::<ManagePagesOut>(0),
        |_| {},
    ) {
        tracing::error!(device = %bar.name(), error = %e, "MANAGE_PAGES CANT_GIVE failed");
    }
}

/// MANAGE_PAGES TAKE of up to `n` pages from `func`; returns how many
/// came back.
pub(super) fn take_pages<B: HwBackend>(
    cmdq: &mut CmdQueue,
    pages: &mut FwPages,
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    n: usize,
    func: FuncId,
) -> Result<usize, Error> {
    let mut got = 0;
    let mut left = n;
    while left > 0 {
        let batch = left.min(PAGES_PER_CMD);
        let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::TAKE, 0);
        {
            let mut v = ViewMut::<ManagePagesIn>::new(&mut inp).expect("sized");
            v.set(ManagePagesIn::INPUT_NUM_ENTRIES, batch as u64);
            set_func(&mut v, func);
        }
        let out = cmdq.exec(
            bar,
            pool,
            SlotKind::Pages,
            &inp,
            out_len::<ManagePagesOut>(batch * 8),
            |_| {},
        )?;
        let v = View::<ManagePagesOut>::new(&out).expect("sized");
        let returned = (v.get32(ManagePagesOut::OUTPUT_NUM_ENTRIES) as usize).min(batch);
        for i in 0..returned {
            let addr = v.flex(ManagePagesOut::PAS, i as u32).unwrap_or(0);
            if let Err(bad) = pages.returned(addr) {
                tracing::error!(iova = bad.0, "firmware returned a page it was never given");
            }
        }
        got += returned;
        if returned < batch {
            break;
        }
        left -= batch;
    }
    Ok(got)
}

/// QUERY_PAGES for our own function: the function firmware names (to echo
/// in MANAGE_PAGES) and how many pages it wants.
fn query_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op_mod: u16,
) -> Result<(FuncId, i32), Error> {
    let mut inp = input::<QueryPagesIn>(Opcode::QueryPages, op_mod, 0);
    ViewMut::<QueryPagesIn>::new(&mut inp)
        .expect("sized")
        .set(QueryPagesIn::EMBEDDED_CPU_FUNCTION, u64::from(ctl.ecpf));
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryPagesOut>(0))?;
    let v = View::<QueryPagesOut>::new(&out).expect("sized");
    let func = FuncId {
        ec: v.get32(QueryPagesOut::EMBEDDED_CPU_FUNCTION) == 1,
        id: v.get32(QueryPagesOut::FUNCTION_ID) as u16,
    };
    Ok((func, v.get32(QueryPagesOut::NUM_PAGES) as i32))
}

/// QUERY_PAGES (`op_mod`: boot or init pages), then MANAGE_PAGES GIVE of
/// as many pages as firmware asks for, for the function it names (kept in
/// `ctl.func`).
pub(super) fn satisfy_pages<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op_mod: u16,
) -> Result<(), Error> {
    let (func, n) = query_pages(bar, pool, ctl, op_mod)?;
    ctl.func = func;
    if n > 0 {
        give_pages(
            &mut ctl.cmdq,
            &mut ctl.pages,
            bar,
            pool,
            n as usize,
            func,
            false,
        )?;
    }
    Ok(())
}
