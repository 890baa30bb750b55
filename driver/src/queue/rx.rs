//! The receive path: no per-packet CQE read; packets are counted from the
//! positions in the overrunning RX CQ, and striding WQEs are reposted whole.

use crate::barrier;
use crate::hw::HwBackend;
use crate::prm::Layout;
use crate::prm::wqe::{self, MprqWqe, WqeDataSeg, WqeSrqNextSeg};

use super::{
    CQE_BYTES, DBR_RQ, HDS_IP_EXT, QueueSet, RxCqeFlags, RxRingView, RxWqeIdMode, WQE_COUNTER,
    WQE_ID,
};

impl<B: HwBackend> QueueSet<B> {
    /// Snapshots (wqe id, stride index) in RX CQE `i`, with the torn-read
    /// guard: wqe id, stride index, wqe id again, each load ordered after
    /// the one before it. Only load-load order is needed (the two id reads
    /// bracket the counter read), so the barriers are [`barrier::from_device`]:
    /// free on x86, whose loads are not reordered with older loads (the C++
    /// eRPC's compiler-only `memory_barrier` here), `dmb oshld` on aarch64.
    /// A full fence cost one `mfence` per poll, about half of the idle
    /// event-loop iteration's time on the device model.
    #[inline]
    pub(super) fn rx_snapshot_raw(&self, i: usize) -> (u16, u16) {
        let ring = &self.rx_cq.ring;
        let off = i * CQE_BYTES;
        loop {
            let id = ring.load_be16(off + WQE_ID);
            barrier::from_device();
            let ctr = ring.load_be16(off + WQE_COUNTER);
            barrier::from_device();
            if ring.load_be16(off + WQE_ID) == id {
                return (id, ctr);
            }
        }
    }

    /// The position in RX CQE `i`, reading `wqe_id` as a free-running
    /// counter.
    #[inline]
    pub(super) fn rx_snapshot(&self, i: usize) -> u32 {
        let (id, ctr) = self.rx_snapshot_raw(i);
        ((u32::from(id) << self.rq.log_strides) + u32::from(ctr)) & (self.rx_cq.cycle - 1)
    }

    /// Strides posted to the RQ and not yet reported: the most packets the
    /// NIC can have delivered that `rx_burst` has not counted.
    #[inline]
    fn rx_outstanding(&self) -> u32 {
        (self.rq.head << self.rq.log_strides).wrapping_sub(self.rq.reported)
    }

    /// WQEs that may be posted ahead of the last reported packet. While
    /// `wqe_id` could be a ring index, one WQE of the ring stays unposted:
    /// then a slot the NIC has not rewritten yet (it still holds a packet
    /// from the previous lap, up to 7 CQEs back) reads as at least
    /// `ring - 7` strides ahead, which is more than can be outstanding, and
    /// is ignored, exactly as a free-running reading ignores it.
    #[inline]
    fn rx_wqes_ahead(&self) -> u32 {
        let n = 1u32 << self.rq.log_wqes;
        match self.rx_cq.mode {
            RxWqeIdMode::FreeRunning => n,
            _ => n - 1,
        }
    }

    /// Counts packets that arrived since the last call. They occupy ring
    /// slots `[head, head + n)` (mod the ring size), where `head` is the sum
    /// of all earlier results; read them through [`QueueSet::rx_ring`].
    #[inline]
    pub fn rx_burst(&mut self) -> usize {
        let entries = self.cfg.rx_ring_entries() as u32;
        let slot_mask = entries as usize - 1;
        let outstanding = self.rx_outstanding();
        let mut total = 0u32;
        for _ in 0..self.rx_cq.entries {
            let room = outstanding - total;
            let Some((delta, raw)) = self.rx_delta(room) else {
                break;
            };
            debug_assert!((1..=room).contains(&delta), "a CQE counts 1..=room packets");
            // The CQE read is that of the last of the `delta` packets; the
            // ones before it (their CQEs overwritten) have no known flags.
            let flags = self.rx_cqe_flags();
            let first = self.rq.recv_head + total as usize;
            for k in 0..delta as usize - 1 {
                self.rx_cq.flags[(first + k) & slot_mask] = RxCqeFlags::UNKNOWN;
            }
            self.rx_cq.flags[(first + delta as usize - 1) & slot_mask] = flags;
            self.rx_cq.last_raw = raw;
            total += delta;
            self.rx_cq.prev = self.rx_cq.prev.wrapping_add(delta) & (self.rx_cq.cycle - 1);
            self.rx_cq.idx = (self.rx_cq.idx + 1) & (self.rx_cq.entries - 1);
        }
        if total > 0 {
            self.rq.recv_head = (self.rq.recv_head + total as usize) & slot_mask;
            self.rq.reported = self.rq.reported.wrapping_add(total);
            debug_assert!(
                total <= outstanding,
                "reported only strides that were posted"
            );
            self.stats.rx_pkts += u64::from(total);
            self.stats.rx_bursts += 1;
            if self.rq.to_post >= 1 << self.rq.log_strides {
                self.repost();
            }
        }
        total as usize
    }

    /// The checksum and header-type flags of the RX CQE at `rx_cq.idx`,
    /// whose position was just read, or
    /// [`RxCqeFlags::UNKNOWN`] if they may belong to a later packet.
    ///
    /// The CQ overruns: while the flags are read, the NIC may be rewriting
    /// the slot with the CQE one lap (8 packets) later, and a position
    /// re-read cannot tell, because the device writes the position after
    /// the body. But it writes CQEs in order, each complete (`wqe_id` after
    /// the rest) before the next: so if, after the flags were read, the
    /// slot before still holds the CQE consumed before this one (its
    /// `wqe_id` read first), the rewrite of this slot had not begun when
    /// the flags were read. Otherwise the flags are not trusted.
    #[inline]
    fn rx_cqe_flags(&self) -> RxCqeFlags {
        let ring = &self.rx_cq.ring;
        let idx = self.rx_cq.idx;
        // The position of this CQE was read (with a full barrier) before.
        let f = ring.load_be16(idx * CQE_BYTES + HDS_IP_EXT);
        barrier::from_device();
        let before = ((idx + self.rx_cq.entries - 1) & (self.rx_cq.entries - 1)) * CQE_BYTES;
        let id = ring.load_be16(before + WQE_ID);
        barrier::from_device();
        let ctr = ring.load_be16(before + WQE_COUNTER);
        if (u32::from(id) << 16 | u32::from(ctr)) == self.rx_cq.last_raw {
            RxCqeFlags::from_cqe(f)
        } else {
            RxCqeFlags::UNKNOWN
        }
    }

    /// What the NIC reported in the CQE of the frame in RX ring slot `idx`,
    /// as read by the [`QueueSet::rx_burst`] that reported the slot last:
    /// [`RxCqeFlags::UNKNOWN`] when that frame's own CQE could not be read
    /// (the overrunning CQ had already reused it), or it may not be the
    /// frame's. Unknown is the safe answer: check in software.
    #[inline]
    pub fn rx_cqe_flags_of(&self, idx: usize) -> RxCqeFlags {
        self.rx_cq.flags[idx & (self.rx_cq.flags.len() - 1)]
    }

    /// Packets new in the next RX CQE (at most `room`) and its raw position
    /// (`wqe_id` << 16 | `wqe_counter`), or `None` if it holds nothing new
    /// (or a stale position from the previous lap).
    #[inline]
    fn rx_delta(&mut self, room: u32) -> Option<(u32, u32)> {
        let (id, ctr) = self.rx_snapshot_raw(self.rx_cq.idx);
        let raw = (u32::from(id) << 16) | u32::from(ctr);
        let ls = self.rq.log_strides;
        let wqes = 1u32 << self.rq.log_wqes;
        let ring = wqes << ls;
        let prev = self.rx_cq.prev;
        let valid = |d: u32| d != 0 && d <= room;
        if self.rx_cq.mode != RxWqeIdMode::RingIndex {
            let cur = ((u32::from(id) << ls) + u32::from(ctr)) & (self.rx_cq.cycle - 1);
            let d = cur.wrapping_sub(prev) & (self.rx_cq.cycle - 1);
            if valid(d) {
                if self.rx_cq.mode == RxWqeIdMode::Undetermined && u32::from(id) >= wqes {
                    self.rx_cq.mode = RxWqeIdMode::FreeRunning;
                    tracing::debug!(
                        rqn = self.rq.rqn,
                        "striding RQ wqe_id is a free-running counter"
                    );
                }
                return Some((d, raw));
            }
            if self.rx_cq.mode == RxWqeIdMode::FreeRunning || u32::from(id) >= wqes {
                return None;
            }
        }
        // A ring index (known, or the first packet past the first lap).
        let cur = ((u32::from(id) & (wqes - 1)) << ls) + u32::from(ctr);
        let d = cur.wrapping_sub(prev) & (ring - 1);
        if !valid(d) {
            return None;
        }
        if self.rx_cq.mode == RxWqeIdMode::Undetermined {
            self.rx_cq.mode = RxWqeIdMode::RingIndex;
            tracing::debug!(rqn = self.rq.rqn, "striding RQ wqe_id is a ring index");
        }
        Some((d, raw))
    }

    /// Gives `n` ring slots back (in ring order). Each time a whole WQE's
    /// worth of strides is back, that WQE is reposted.
    #[inline]
    pub fn post_recvs(&mut self, n: usize) {
        self.rq.to_post += n;
        // Every ring slot is the NIC's (posted, not reported), the
        // application's (reported, not given back) or waiting here.
        debug_assert!(
            self.rq.to_post + self.rx_outstanding() as usize <= self.cfg.rx_ring_entries(),
            "gave back more ring slots than rx_burst reported"
        );
        if self.rq.to_post >= 1 << self.rq.log_strides {
            self.repost();
        }
    }

    /// Posts every WQE whose strides are back, as far as the number of
    /// WQEs allowed ahead permits; rings the doorbell if any was posted.
    pub(super) fn repost(&mut self) {
        let per_wqe = 1usize << self.rq.log_strides;
        let ahead = self.rx_wqes_ahead();
        let mut posted = false;
        while self.rq.to_post >= per_wqe
            && !at_post_limit(self.rq.head, self.rq.reported, self.rq.log_strides, ahead)
        {
            self.write_rq_wqe();
            self.rq.to_post -= per_wqe;
            self.stats.rx_reposts += 1;
            posted = true;
        }
        // WQEs posted beyond the one holding the last reported packet,
        // counted in strides (which wrap with `reported`).
        debug_assert!(
            (self.rx_outstanding() + (self.rq.reported & (per_wqe as u32 - 1)))
                >> self.rq.log_strides
                <= self.rx_wqes_ahead(),
            "no more WQEs posted ahead than the wqe_id reading allows"
        );
        if posted {
            self.ring_rq_doorbell();
        }
    }

    fn write_rq_wqe(&mut self) {
        let slot = (self.rq.head & ((1 << self.rq.log_wqes) - 1)) as usize;
        let off = slot * MprqWqe::BYTES;
        let wqe_bytes = (1usize << self.rq.log_strides) * self.rq.stride;
        debug_assert!(off + MprqWqe::BYTES <= self.rq.wqes.len());
        debug_assert!((slot + 1) * wqe_bytes <= self.rq.data.len());
        let d = off + MprqWqe::DSEG.byte();
        self.rq.wqes.write_be32(
            off + MprqWqe::NSEG.byte() + WqeSrqNextSeg::NEXT_WQE_INDEX.dword(),
            0,
        );
        self.rq
            .wqes
            .write_be32(d + WqeDataSeg::BYTE_COUNT.dword(), wqe_bytes as u32);
        self.rq
            .wqes
            .write_be32(d + WqeDataSeg::LKEY.dword(), self.lkey);
        self.rq.wqes.write_be64(
            d + WqeDataSeg::ADDR.dword(),
            self.rq.data.iova_at(slot * wqe_bytes),
        );
        self.rq.head = self.rq.head.wrapping_add(1);
    }

    fn ring_rq_doorbell(&self) {
        barrier::to_device();
        self.dbr
            .write_be32(DBR_RQ + 4 * wqe::RCV_DBR, self.rq.head & 0xffff);
    }

    /// The RX ring reader.
    pub fn rx_ring(&self) -> RxRingView {
        RxRingView {
            data: self.rq.data.clone(),
            stride: self.rq.stride,
            entries: self.cfg.rx_ring_entries(),
        }
    }
}

/// Whether `head` WQEs posted (a count that wraps at 2^32) have reached
/// the most that may be posted: `ahead` WQEs beyond the one holding the
/// last of `reported` strides (which wraps at 2^32 too). Compared in
/// strides, where the two counters wrap together: in WQEs, `reported >>
/// log_strides` wraps at 2^(32 - log_strides) while `head` wraps at 2^32,
/// so after 2^32 strides (minutes at line rate) the limit would never be
/// met and every free WQE would be posted, defeating the stale-CQE guard
/// of the ring-index readings (see `rx_wqes_ahead`). The strides posted
/// never exceed the limit by construction, so equality mod 2^32 is
/// reaching it.
#[inline]
fn at_post_limit(head: u32, reported: u32, log_strides: u32, ahead: u32) -> bool {
    let per_wqe = 1u32 << log_strides;
    head << log_strides == (reported & !(per_wqe - 1)).wrapping_add(ahead << log_strides)
}

#[cfg(test)]
mod tests {
    use super::at_post_limit;

    /// The limit, on true (unwrapped) counts: posted WQEs against the WQE
    /// of the last reported stride plus `ahead`.
    fn reached(head: u64, reported: u64, log_strides: u32, ahead: u64) -> bool {
        head == (reported >> log_strides) + ahead
    }

    /// Around the 2^32-stride wrap (and far from it) the wrapped counters
    /// give the true answer for every head from the last reported WQE to
    /// the limit; the WQE-unit comparison this replaced did not past the
    /// wrap.
    #[test]
    fn the_post_limit_holds_across_the_counters_wrap() {
        for log_strides in [0, 3, 6, 9] {
            for ahead in [1u64, 7, 8, 255] {
                for base in [
                    0u64,
                    1 << 20,
                    (1 << 32) - 4096,
                    1 << 32,
                    (1 << 32) + 4096,
                    5 << 32,
                ] {
                    for reported in base..base + 64 {
                        let first = reported >> log_strides;
                        for head in first..=first + ahead {
                            assert_eq!(
                                at_post_limit(
                                    head as u32,
                                    reported as u32,
                                    log_strides,
                                    ahead as u32
                                ),
                                reached(head, reported, log_strides, ahead),
                                "log_strides {log_strides} ahead {ahead} reported {reported} head {head}"
                            );
                        }
                    }
                }
            }
        }
        // The old reading, past the wrap: never at the limit.
        let (log_strides, ahead, reported) = (3u32, 7u32, (1u64 << 32) + 16);
        let head = ((reported >> log_strides) + u64::from(ahead)) as u32;
        let old = (reported as u32 >> log_strides).wrapping_add(ahead);
        assert_ne!(head, old);
        assert!(at_post_limit(head, reported as u32, log_strides, ahead));
    }
}
