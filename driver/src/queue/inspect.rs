//! A queue set's publication for the debug endpoint (see
//! [`crate::inspect`]): what its thread copies when a client asks.

use crate::dma::DmaMem;
use crate::hw::HwBackend;
use crate::inspect::{QueueIds, QueueSetRaw, QueueSetSoftware, RING_COPY_MAX, RawRing};
use crate::prm::Layout;
use crate::prm::wqe::{MprqWqe, SEND_WQE_BB};

use super::{CQE_BYTES, QueueSet};

/// Copies `count` entries of `entry` bytes starting at ring index `first`
/// (wrapping), with volatile 8-byte reads: the NIC may be writing some of
/// them, so an entry can be torn; the copy is for display only.
fn copy_ring(mem: &DmaMem, entry: usize, entries: usize, first: usize, count: usize) -> RawRing {
    let mut bytes = Vec::with_capacity(count * entry);
    for k in 0..count {
        let off = ((first + k) % entries) * entry;
        for i in (0..entry).step_by(8) {
            bytes.extend_from_slice(&mem.read_be64(off + i).to_be_bytes());
        }
    }
    RawRing {
        entry_bytes: entry as u32,
        ring_entries: entries as u32,
        first: first as u32,
        bytes,
    }
}

/// The whole ring if it is small, else the `RING_COPY_MAX` entries before
/// `producer`.
fn window(mem: &DmaMem, entry: usize, entries: usize, producer: u32) -> RawRing {
    if entries <= RING_COPY_MAX {
        copy_ring(mem, entry, entries, 0, entries)
    } else {
        let first = (producer as usize).wrapping_sub(RING_COPY_MAX) % entries;
        copy_ring(mem, entry, entries, first, RING_COPY_MAX)
    }
}

impl<B: HwBackend> QueueSet<B> {
    /// Object numbers.
    pub(crate) fn inspect_ids(&self) -> QueueIds {
        QueueIds {
            sqn: self.sq.sqn,
            rqn: self.rq.rqn,
            tx_cqn: self.tx_cq.cqn,
            rx_cqn: self.rx_cq.cqn,
            tisn: self.tisn,
            tirn: self.tirn,
            uar: self.uar,
            flow_index: self.flow_index,
            counter_set_id: self.counter_set_id,
        }
    }

    /// The software state as the debug endpoint shows it; `rings` adds
    /// whole rings.
    pub fn inspect_software(&self, rings: bool) -> QueueSetSoftware {
        self.inspect_raw(rings).view()
    }

    /// The copy the queue set's thread publishes: counters, indexes and
    /// raw descriptors, no formatting.
    pub(crate) fn inspect_raw(&self, rings: bool) -> QueueSetRaw {
        let sq_wqebbs = self.sq.mask + 1;
        let tx_cq_entries = 1usize << self.tx_cq.log;
        let rq_wqes = 1usize << self.rq.log_wqes;
        QueueSetRaw {
            software: QueueSetSoftware {
                snapshot: self.snapshot(),
                sq_wqebbs,
                unsignaled_batch: self.sq.batch,
                blueflame: self.cfg.blueflame,
                inline_l2: self.inline,
                bf_register: (self.sq.bf_offset + self.sq.bf_toggle) as u64,
                bf_half_bytes: self.sq.bf_half as u32,
                rq_wqes: rq_wqes as u32,
                rq_strides_per_wqe: 1 << self.rq.log_strides,
                rq_stride_bytes: self.rq.stride as u32,
                rx_strides_reported: self.rq.reported,
                rx_cq_entries: self.rx_cq.entries as u32,
                tx_cq_entries: tx_cq_entries as u32,
                rx_cqes: Vec::new(),
                rings: None,
            },
            rx_cqes: copy_ring(
                &self.rx_cq.ring,
                CQE_BYTES,
                self.rx_cq.entries,
                0,
                self.rx_cq.entries,
            ),
            rings: rings.then(|| {
                [
                    window(&self.sq.ring, SEND_WQE_BB, sq_wqebbs as usize, self.sq.pi),
                    window(&self.rq.wqes, MprqWqe::BYTES, rq_wqes, self.rq.head),
                    window(&self.tx_cq.ring, CQE_BYTES, tx_cq_entries, self.tx_cq.ci),
                ]
            }),
        }
    }

    /// Publishes the software state if a client asked (called from the
    /// control service, every `control_interval` polls).
    #[cold]
    pub(super) fn inspect_if_wanted(&mut self) {
        let Some(p) = self.inspect.as_ref() else {
            return;
        };
        if !p.wanted() {
            return;
        }
        let pending = p.begin();
        let v = self.inspect_raw(pending.rings);
        if let Some(p) = self.inspect.as_mut() {
            p.publish(pending, v);
        }
    }
}
