//! The Carousel timing wheel (Saeed et al., SIGCOMM 2017), as eRPC uses it
//! to pace the packets of rate-limited sessions.
//!
//! A ring of slots, each [`WheelConfig::slot_ns`] wide (0.5 µs), covering
//! the horizon (the time the slowest session, at Timely's minimum rate,
//! needs to send its credits' worth of packets: 32 × 1 KiB / 15 MB/s ≈
//! 2.2 ms). A packet is inserted into the slot of its departure time and
//! comes out, in insertion order within a slot and in slot order across
//! slots, once the clock has passed the slot ([`TimingWheel::reap`] moves
//! due slots to the ready queue; the Rpc sends from there).
//!
//! Entries name a packet (session, slot, packet number, request number and
//! the slot's rollback generation), like the C++ wheel's `(sslot, pkt_num)`;
//! they hold no buffer. A go-back-N rollback bumps the slot's generation, so
//! entries of the rolled-back request are dropped when they come out
//! instead of being sent a second time (the paper's rule).
//!
//! Each slot holds a chain of buckets of [`BUCKET_CAP`] entries. Buckets
//! come from a pool sized in advance ([`TimingWheel::reserve`], when a
//! session is created: every entry in the wheel holds one of its
//! session's credits, so the pool never runs dry); inserting and reaping
//! allocate nothing. If the pool is empty anyway, `insert` hands the entry
//! back and the caller sends it at once (counted as an overflow). A
//! departure time past the horizon goes into the last slot (counted).

use std::collections::VecDeque;

/// Entries per bucket (as in the C++ wheel).
pub(crate) const BUCKET_CAP: usize = 5;
const NIL: u32 = u32::MAX;

/// One paced packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WheelEnt {
    /// Request number of the request the packet belongs to.
    pub req_num: u64,
    /// Client session.
    pub session: u16,
    /// Packet number (request packet or RFR).
    pub pkt_num: u16,
    /// Session slot.
    pub slot: u8,
    /// The slot's rollback generation when the packet was inserted.
    pub generation: u8,
}

const EMPTY: WheelEnt = WheelEnt {
    req_num: 0,
    session: 0,
    pkt_num: 0,
    slot: 0,
    generation: 0,
};

#[derive(Debug, Clone)]
struct Bucket {
    ents: [WheelEnt; BUCKET_CAP],
    len: u8,
    next: u32,
}

impl Bucket {
    const fn new() -> Bucket {
        Bucket {
            ents: [EMPTY; BUCKET_CAP],
            len: 0,
            next: NIL,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Head {
    /// Last bucket of the slot's chain (the slot's own bucket at first).
    last: u32,
}

/// Geometry of a wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelConfig {
    /// Width of a slot (0.5 µs).
    pub slot_ns: u64,
    /// The longest a packet may be scheduled ahead.
    pub horizon_ns: u64,
}

impl WheelConfig {
    /// Slots: one more than the horizon needs.
    pub fn slots(&self) -> usize {
        1 + self.horizon_ns.div_ceil(self.slot_ns.max(1)) as usize
    }
}

/// Wheel counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WheelStats {
    /// Packets inserted.
    pub inserted: u64,
    /// Packets moved to the ready queue.
    pub reaped: u64,
    /// Inserts beyond the horizon, placed in the last slot.
    pub clamped: u64,
    /// Inserts refused for lack of buckets (sent at once by the caller).
    pub overflow: u64,
    /// Times the idle wheel was moved forward to the present in one step.
    pub rebases: u64,
}

/// A timing wheel on a nanosecond clock.
#[derive(Debug)]
pub(crate) struct TimingWheel {
    cfg: WheelConfig,
    heads: Vec<Head>,
    /// Buckets: the first `heads.len()` are the slots' own; the rest are
    /// the pool.
    buckets: Vec<Bucket>,
    free: Vec<u32>,
    cur: usize,
    /// Packets in slot `cur` may leave once the clock reaches this time;
    /// slot `cur + i` (around the ring) at `cur_tx_ns + i × slot_ns`. One
    /// time for the whole ring, so catching up with the clock is O(1).
    cur_tx_ns: u64,
    /// Entries in slots (not yet in the ready queue).
    count: usize,
    /// Entries whose slot has passed, oldest first.
    ready: VecDeque<WheelEnt>,
    stats: WheelStats,
}

impl TimingWheel {
    /// An empty wheel whose first slot ends one slot width after `now_ns`.
    pub(crate) fn new(cfg: WheelConfig, now_ns: u64) -> TimingWheel {
        let n = cfg.slots();
        let heads = (0..n).map(|i| Head { last: i as u32 }).collect();
        TimingWheel {
            cfg,
            heads,
            buckets: vec![Bucket::new(); n],
            free: Vec::new(),
            cur: 0,
            cur_tx_ns: now_ns + cfg.slot_ns,
            count: 0,
            ready: VecDeque::new(),
            stats: WheelStats::default(),
        }
    }

    /// Makes room for `entries` more packets in the wheel at once without
    /// allocating later (called when a session is created, with its
    /// credits).
    pub(crate) fn reserve(&mut self, entries: usize) {
        let buckets = entries.div_ceil(BUCKET_CAP) + 1;
        let start = self.buckets.len();
        self.buckets.resize(start + buckets, Bucket::new());
        self.free.extend((start..start + buckets).map(|i| i as u32));
        self.ready.reserve(entries);
    }

    /// Keeps room for `reservations` [`TimingWheel::reserve`]s of
    /// `entries` each and gives the rest of the bucket pool back, if the
    /// wheel is empty (nothing is scheduled or ready); returns whether it
    /// did. (The Rpc reserves per active session and shrinks the pool
    /// when fewer sessions are active, so that the pool follows the
    /// sessions with requests, not the most there ever were.)
    pub(crate) fn shrink_to(&mut self, reservations: usize, entries: usize) -> bool {
        if !self.is_empty() {
            return false;
        }
        let own = self.heads.len();
        let keep = own + reservations * (entries.div_ceil(BUCKET_CAP) + 1);
        if self.buckets.len() > keep {
            self.buckets.truncate(keep);
            self.buckets.shrink_to_fit();
            self.free.clear();
            self.free.extend((own..keep).map(|i| i as u32));
            self.free.shrink_to_fit();
        }
        self.ready.shrink_to(reservations * entries);
        true
    }

    /// Buckets in the pool (beyond each slot's own), free or in use.
    #[cfg(feature = "testing")]
    pub(crate) fn pool_buckets(&self) -> usize {
        self.buckets.len() - self.heads.len()
    }

    /// Counters.
    pub(crate) fn stats(&self) -> WheelStats {
        self.stats
    }

    /// Packets in the wheel or in its ready queue.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.count + self.ready.len()
    }

    /// True if nothing is scheduled or ready.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves every slot whose time has come (its time ≤ `now_ns`) to the
    /// ready queue. `now_ns` must not decrease between calls.
    pub(crate) fn reap(&mut self, now_ns: u64) {
        if self.count == 0 {
            self.rebase_if_behind(now_ns);
            return;
        }
        let n = self.heads.len();
        while self.cur_tx_ns <= now_ns {
            self.reap_slot(self.cur);
            self.cur_tx_ns += self.cfg.slot_ns;
            self.cur = if self.cur + 1 == n { 0 } else { self.cur + 1 };
            if self.count == 0 {
                self.rebase_if_behind(now_ns);
                return;
            }
        }
    }

    /// An empty wheel that fell behind the clock (idle for longer than a
    /// slot) jumps to the present at once instead of walking every slot.
    fn rebase_if_behind(&mut self, now_ns: u64) {
        if self.cur_tx_ns > now_ns {
            return;
        }
        self.stats.rebases += 1;
        self.cur_tx_ns = now_ns + self.cfg.slot_ns;
    }

    fn reap_slot(&mut self, ws: usize) {
        let mut b = ws as u32;
        while b != NIL {
            let bucket = &mut self.buckets[b as usize];
            let len = usize::from(bucket.len);
            for e in &bucket.ents[..len] {
                self.ready.push_back(*e);
            }
            self.count -= len;
            self.stats.reaped += len as u64;
            let next = bucket.next;
            bucket.len = 0;
            bucket.next = NIL;
            if b as usize != ws {
                self.free.push(b);
            }
            b = next;
        }
        self.heads[ws].last = ws as u32;
    }

    /// Schedules `ent` to leave at `desired_ns` (≥ `now_ns`; beyond the
    /// horizon it goes into the last slot). Returns the entry back if no
    /// bucket is left (the caller sends it now).
    pub(crate) fn insert(
        &mut self,
        ent: WheelEnt,
        now_ns: u64,
        desired_ns: u64,
    ) -> Result<(), WheelEnt> {
        self.reap(now_ns);
        let n = self.heads.len();
        let cur_tx = self.cur_tx_ns;
        let delta = if desired_ns <= cur_tx {
            0
        } else {
            let d = 1 + ((desired_ns - cur_tx) / self.cfg.slot_ns) as usize;
            if d >= n {
                self.stats.clamped += 1;
                n - 1
            } else {
                d
            }
        };
        let ws = (self.cur + delta) % n;
        let last = self.heads[ws].last as usize;
        if usize::from(self.buckets[last].len) == BUCKET_CAP {
            let Some(nb) = self.free.pop() else {
                self.stats.overflow += 1;
                return Err(ent);
            };
            self.buckets[last].next = nb;
            self.heads[ws].last = nb;
        }
        let last = self.heads[ws].last as usize;
        let b = &mut self.buckets[last];
        b.ents[usize::from(b.len)] = ent;
        b.len += 1;
        self.count += 1;
        self.stats.inserted += 1;
        Ok(())
    }

    /// Takes the next packet whose time has come (after [`TimingWheel::reap`]).
    #[inline]
    pub(crate) fn pop_ready(&mut self) -> Option<WheelEnt> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(k: u64) -> WheelEnt {
        WheelEnt {
            req_num: k,
            session: 1,
            pkt_num: k as u16,
            slot: 0,
            generation: 0,
        }
    }

    fn cfg() -> WheelConfig {
        WheelConfig {
            slot_ns: 500,
            horizon_ns: 2_184_500,
        }
    }

    fn drain(w: &mut TimingWheel, now: u64) -> Vec<u64> {
        w.reap(now);
        std::iter::from_fn(|| w.pop_ready())
            .map(|e| e.req_num)
            .collect()
    }

    #[test]
    fn geometry_matches_the_cpp_wheel() {
        // 32 credits × 1024 B at 15 MB/s = 2184.5 µs: 4370 slots + 1.
        assert_eq!(cfg().slots(), 4370);
    }

    #[test]
    fn packets_leave_in_departure_order_once_due() {
        let mut w = TimingWheel::new(cfg(), 0);
        w.reserve(64);
        // Inserted out of order, 0.2 µs .. 20 µs ahead.
        for (k, t) in [(3, 3_000), (1, 200), (2, 1_400), (5, 20_000), (4, 3_100)] {
            w.insert(ent(k), 0, t).unwrap();
        }
        assert_eq!(w.len(), 5);
        assert_eq!(
            drain(&mut w, 499),
            Vec::<u64>::new(),
            "nothing before its slot ends"
        );
        assert_eq!(drain(&mut w, 500), vec![1]);
        assert_eq!(drain(&mut w, 2_000), vec![2]);
        // 3 and 4 share a slot: insertion order.
        assert_eq!(drain(&mut w, 10_000), vec![3, 4]);
        assert_eq!(drain(&mut w, 20_499), Vec::<u64>::new());
        assert_eq!(drain(&mut w, 20_500), vec![5]);
        assert!(w.is_empty());
        let s = w.stats();
        assert_eq!((s.inserted, s.reaped, s.clamped, s.overflow), (5, 5, 0, 0));
    }

    #[test]
    fn a_departure_in_the_past_or_now_goes_to_the_current_slot() {
        let mut w = TimingWheel::new(cfg(), 1_000_000);
        w.reserve(8);
        w.insert(ent(1), 1_000_000, 1_000_000).unwrap();
        w.insert(ent(2), 1_000_000, 1_000_100).unwrap();
        assert_eq!(drain(&mut w, 1_000_500), vec![1, 2]);
    }

    #[test]
    fn horizon_clamps_and_the_wheel_wraps() {
        let mut w = TimingWheel::new(cfg(), 0);
        w.reserve(64);
        w.insert(ent(1), 0, 10_000_000).unwrap();
        assert_eq!(w.stats().clamped, 1);
        // Lands in the last slot: leaves before the horizon passes.
        assert!(drain(&mut w, 2_184_000).is_empty());
        assert_eq!(drain(&mut w, 2_185_000), vec![1]);
        // Many laps of the ring keep the order.
        let mut now = 2_185_000;
        let mut k = 10;
        for _ in 0..10_000 {
            now += 700;
            w.insert(ent(k), now, now + 1_500_000).unwrap();
            k += 1;
        }
        let out = drain(&mut w, now + 2_000_000);
        assert_eq!(out, (10..k).collect::<Vec<_>>());
    }

    #[test]
    fn an_empty_wheel_gives_its_spare_buckets_back() {
        let mut w = TimingWheel::new(cfg(), 0);
        for _ in 0..10 {
            w.reserve(32);
        }
        assert_eq!(w.pool_buckets(), 10 * 8);
        for k in 0..100 {
            w.insert(ent(k), 0, 1_000).unwrap();
        }
        assert!(!w.shrink_to(1, 32), "not while packets wait");
        assert_eq!(drain(&mut w, 10_000).len(), 100);
        assert!(w.shrink_to(2, 32));
        assert_eq!(w.pool_buckets(), 2 * 8);
        // What is left still holds two reservations' worth.
        for k in 0..64 {
            w.insert(ent(k), 10_000, 11_000).unwrap();
        }
        assert_eq!(drain(&mut w, 20_000).len(), 64);
        assert_eq!(w.stats().overflow, 0);
    }

    #[test]
    fn full_buckets_chain_and_an_empty_pool_overflows() {
        let mut w = TimingWheel::new(cfg(), 0);
        // No reserve: the slot's own bucket holds 5, then the pool is empty.
        for k in 0..5 {
            w.insert(ent(k), 0, 100).unwrap();
        }
        assert_eq!(w.insert(ent(5), 0, 100), Err(ent(5)));
        assert_eq!(w.stats().overflow, 1);
        w.reserve(20);
        for k in 5..25 {
            w.insert(ent(k), 0, 100).unwrap();
        }
        assert_eq!(drain(&mut w, 500), (0..25).collect::<Vec<_>>());
        // Buckets went back to the pool: the same again needs no reserve.
        for k in 0..25 {
            w.insert(ent(k), 500, 600).unwrap();
        }
        assert_eq!(drain(&mut w, 1_000).len(), 25);
    }

    #[test]
    fn an_idle_wheel_catches_up_in_one_step() {
        let mut w = TimingWheel::new(cfg(), 0);
        w.reserve(8);
        // An hour idle.
        let now = 3_600 * 1_000_000_000u64;
        w.insert(ent(1), now, now + 1_000).unwrap();
        assert_eq!(w.stats().rebases, 1);
        assert!(drain(&mut w, now + 1_000).is_empty());
        assert_eq!(drain(&mut w, now + 1_500), vec![1]);
    }
}
