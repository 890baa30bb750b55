//! The polled event queue: subscribed to page requests, CQ errors and port
//! changes, never armed, never interrupting. Its entries are read by owner
//! bit from the control path (and while any command is in flight), and its
//! consumer index is published with the non-arming doorbell.

use std::sync::Arc;

use crate::bar::Bar;
use crate::barrier;
use crate::dma::{DmaMem, DmaPool};
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::cqe::{Eqe, EqeDecoded};
use crate::prm::uar;

/// Entries in the EQ (rdma-core: 32 + 0x80 spare, rounded up).
pub const EQ_ENTRIES: usize = 256;
const EQE_BYTES: usize = 64;
const OWNER_OFF: usize = (Eqe::OWNER.bit() / 8) as usize;
/// The consumer index must be published at least this often (firmware's spare).
const CI_PUBLISH_EVERY: u32 = 0x40;

/// The event queue.
#[derive(Debug)]
pub struct EventQueue {
    mem: DmaMem,
    /// EQ number.
    pub eqn: u8,
    /// UAR index of its doorbell.
    pub uar: u32,
    ci: u32,
    unpublished: u32,
    /// Events seen, by type (index = event type).
    pub counts: [u64; 32],
    /// The last event, for the debug snapshot.
    pub last: Option<EqeDecoded>,
}

impl EventQueue {
    /// Allocates the buffer with every owner bit set (hardware writes owner
    /// 0 on its first pass).
    pub fn alloc_buffer(pool: &Arc<DmaPool>) -> Result<DmaMem, Error> {
        let mem = pool.alloc(EQ_ENTRIES * EQE_BYTES)?;
        for i in 0..EQ_ENTRIES {
            mem.write_u8(i * EQE_BYTES + OWNER_OFF, 1);
        }
        Ok(mem)
    }

    /// Wraps a created EQ.
    pub fn new(mem: DmaMem, eqn: u8, uar: u32) -> EventQueue {
        EventQueue {
            mem,
            eqn,
            uar,
            ci: 0,
            unpublished: 0,
            counts: [0; 32],
            last: None,
        }
    }

    /// The buffer (for CREATE_EQ's page list).
    pub fn buffer(&self) -> &DmaMem {
        &self.mem
    }

    /// Consumer index.
    pub fn ci(&self) -> u32 {
        self.ci
    }

    /// The next event, if hardware has written one.
    pub fn poll(&mut self) -> Option<EqeDecoded> {
        let slot = (self.ci as usize) & (EQ_ENTRIES - 1);
        let off = slot * EQE_BYTES;
        let pass = (self.ci as usize / EQ_ENTRIES) & 1;
        if (self.mem.load_owner(off + OWNER_OFF) & 1) as usize != pass {
            return None;
        }
        barrier::from_device();
        let mut raw = [0u8; EQE_BYTES];
        self.mem.read_bytes(off, &mut raw);
        let e = EqeDecoded::decode(&raw);
        self.ci = self.ci.wrapping_add(1);
        self.unpublished += 1;
        self.counts[(e.event_type as usize) & 31] += 1;
        self.last = Some(e);
        Some(e)
    }

    /// Publishes the consumer index without arming (if anything was consumed).
    pub fn publish<B: HwBackend>(&mut self, bar: &Bar<B>, force: bool) {
        if self.unpublished == 0 || (!force && self.unpublished < CI_PUBLISH_EVERY) {
            return;
        }
        barrier::to_device();
        bar.write32(
            self.uar as usize * uar::UAR_PAGE_BYTES + uar::EQ_DOORBELL_NO_ARM,
            uar::eq_doorbell_value(self.eqn, self.ci),
        );
        self.unpublished = 0;
    }
}
