//! Destroying a queue set's objects, in reverse creation order.

use crate::device::{destroy_u24, input};
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::ViewMut;
use crate::prm::cmd::*;
use crate::prm::codes::{Opcode, flow};

use super::{QObj, QueueSet};

impl<B: HwBackend> QueueSet<B> {
    /// Destroys every object now and reports the first failure.
    pub fn close(mut self) -> Result<(), Error> {
        self.destroy()
    }

    pub(super) fn destroy(&mut self) -> Result<(), Error> {
        let mut first = None;
        let inner = self.dev.clone();
        while let Some(o) = self.created.pop() {
            let mut ctl = inner.lock();
            let (bar, pool) = (&inner.bar, &inner.pool);
            let r = match o {
                QObj::Fte(index) => {
                    let table = ctl.flow.as_ref().map(|f| f.table_id).unwrap_or(0);
                    let mut inp = input::<DeleteFteIn>(Opcode::DeleteFlowTableEntry, 0, 0);
                    ViewMut::<DeleteFteIn>::new(&mut inp)
                        .expect("sized")
                        .set(DeleteFteIn::TABLE_TYPE, flow::TABLE_TYPE_NIC_RX as u64)
                        .set(DeleteFteIn::TABLE_ID, table as u64)
                        .set(DeleteFteIn::FLOW_INDEX, index as u64);
                    let r = ctl.exec(bar, pool, &inp, 16).map(|_| ());
                    if let Some(f) = ctl.flow.as_mut() {
                        f.ports[index as usize] = None;
                    }
                    r
                }
                QObj::Tir(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DestroyTir,
                    DestroyTirIn::TIRN,
                    n,
                ),
                QObj::Rq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroyRq, DestroyRqIn::RQN, n)
                }
                QObj::QCounter(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DeallocQCounter,
                    DeallocQCounterIn::COUNTER_SET_ID,
                    n,
                ),
                QObj::Sq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroySq, DestroySqIn::SQN, n)
                }
                QObj::Tis(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DestroyTis,
                    DestroyTisIn::TISN,
                    n,
                ),
                QObj::Cq(n) => {
                    destroy_u24(bar, pool, &mut ctl, Opcode::DestroyCq, DestroyCqIn::CQN, n)
                }
                QObj::Uar(n) => destroy_u24(
                    bar,
                    pool,
                    &mut ctl,
                    Opcode::DeallocUar,
                    DeallocUarIn::UAR,
                    n,
                ),
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "queue-set teardown step failed");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl<B: HwBackend> Drop for QueueSet<B> {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::error!(error = %e, "queue-set teardown on drop failed");
        }
    }
}
