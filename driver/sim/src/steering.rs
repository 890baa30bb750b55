//! NIC RX flow steering: tables of groups (a mask over the outer headers)
//! and entries (values under that mask, an action, destinations).
//!
//! A packet's outer headers are turned into a match set once
//! ([`crate::packet::match_key`]); an entry matches when
//! `(key & group.mask) == (entry.value & group.mask)` (compared as words,
//! the masked value precomputed when the entry is set). Entries
//! are tried in flow-index order and the first match wins. A miss follows
//! the table's miss action (drop, or continue in `table_miss_id`); chains
//! are bounded.

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::packet::MATCH_SET_BYTES;
use crate::stats::DropReason;

/// Hops through forwarding tables before a packet is dropped as a loop.
pub(crate) const MAX_TABLE_HOPS: usize = 8;

/// A flow group.
#[derive(Debug, Clone)]
pub(crate) struct FlowGroup {
    pub start: u32,
    pub end: u32,
    pub mask: [u8; MATCH_SET_BYTES],
}

/// Where an entry sends a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    Tir(u32),
    Table(u32),
}

/// A match set as eight native-endian words, for word-wise masking (the
/// byte order does not matter: key, mask and value are converted alike).
pub(crate) type MatchWords = [u64; MATCH_SET_BYTES / 8];

/// `b` as [`MatchWords`].
pub(crate) fn match_words(b: &[u8; MATCH_SET_BYTES]) -> MatchWords {
    let mut w = [0u64; MATCH_SET_BYTES / 8];
    for (w, c) in w.iter_mut().zip(b.chunks_exact(8)) {
        *w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
    }
    w
}

/// A flow table entry.
#[derive(Debug, Clone)]
pub(crate) struct Fte {
    pub group: u32,
    /// Its group's mask (groups never change, and a group with entries
    /// cannot be destroyed), as words.
    mask: MatchWords,
    /// `value & mask`, as words: a key matches when `key & mask == masked`.
    masked: MatchWords,
    /// `flow_context.action` bits (0x2 drop, 0x4 forward).
    pub action: u16,
    pub flow_tag: u32,
    pub dests: Vec<Dest>,
}

/// A flow table.
#[derive(Debug, Clone)]
pub(crate) struct FlowTable {
    pub level: u8,
    pub log_size: u8,
    /// 0 default (drop), 1 go to `miss_table`.
    pub miss_action: u8,
    pub miss_table: u32,
    pub groups: BTreeMap<u32, FlowGroup>,
    pub entries: BTreeMap<u32, Fte>,
}

impl Fte {
    /// An entry of `group` (whose mask is `mask`).
    pub(crate) fn new(
        group: u32,
        mask: &[u8; MATCH_SET_BYTES],
        value: [u8; MATCH_SET_BYTES],
        action: u16,
        flow_tag: u32,
        dests: Vec<Dest>,
    ) -> Fte {
        let mask = match_words(mask);
        let mut masked = match_words(&value);
        for (v, m) in masked.iter_mut().zip(&mask) {
            *v &= m;
        }
        Fte {
            group,
            mask,
            masked,
            action,
            flow_tag,
            dests,
        }
    }

    /// Whether the packet with match set `key` matches (`key & group mask
    /// == value & group mask`, word by word).
    #[inline]
    fn matches(&self, key: &MatchWords) -> bool {
        key.iter()
            .zip(self.mask.iter().zip(&self.masked))
            .fold(0, |diff, (k, (m, v))| diff | ((k & m) ^ v))
            == 0
    }
}

impl FlowTable {
    /// The group whose index range holds `index`.
    pub(crate) fn group_of(&self, index: u32) -> Option<u32> {
        self.groups
            .iter()
            .find(|(_, g)| g.start <= index && index <= g.end)
            .map(|(id, _)| *id)
    }
}

/// All NIC RX tables of a function and the root pointer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Steering {
    pub tables: BTreeMap<u32, FlowTable>,
    pub root: Option<u32>,
}

/// The TIRs a packet goes to, (TIR, flow tag): inline for a few (one for
/// unicast; more only when entries forward to several TIRs or tables).
pub(crate) type Targets = SmallVec<[(u32, u32); 4]>;

/// Steering's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Deliver to these TIRs, with the entry's flow tag.
    Deliver(Targets),
    /// Drop.
    Drop(DropReason),
}

impl Steering {
    /// Groups and entries over every table.
    pub(crate) fn group_entry_counts(&self) -> (usize, usize) {
        self.tables.values().fold((0, 0), |(g, e), t| {
            (g + t.groups.len(), e + t.entries.len())
        })
    }

    /// True if an entry of any table forwards to `dest`.
    pub(crate) fn references(&self, dest: Dest) -> bool {
        self.tables
            .values()
            .any(|t| t.entries.values().any(|e| e.dests.contains(&dest)))
            || self.tables.values().any(
                |t| matches!(dest, Dest::Table(id) if t.miss_action == 1 && t.miss_table == id),
            )
    }

    /// Classifies a packet.
    pub(crate) fn lookup(&self, key: &[u8; MATCH_SET_BYTES]) -> Verdict {
        let Some(mut table) = self.root else {
            return Verdict::Drop(DropReason::NoSteeringRoot);
        };
        let key = match_words(key);
        let mut out = Targets::new();
        let mut pending: SmallVec<[u32; 4]> = SmallVec::new();
        for _ in 0..MAX_TABLE_HOPS {
            let Some(t) = self.tables.get(&table) else {
                return Verdict::Drop(DropReason::FlowMiss);
            };
            let hit = t.entries.values().find(|e| e.matches(&key));
            match hit {
                None if t.miss_action == 1 => table = t.miss_table,
                None => {
                    if out.is_empty() && pending.is_empty() {
                        return Verdict::Drop(DropReason::FlowMiss);
                    }
                    break;
                }
                Some(e) if e.action & 0x4 != 0 => {
                    for d in &e.dests {
                        match d {
                            Dest::Tir(t) => out.push((*t, e.flow_tag)),
                            Dest::Table(t) => pending.push(*t),
                        }
                    }
                    match pending.pop() {
                        Some(next) => table = next,
                        None => break,
                    }
                }
                Some(_) => {
                    if out.is_empty() {
                        return Verdict::Drop(DropReason::FlowDrop);
                    }
                    break;
                }
            }
        }
        if out.is_empty() {
            Verdict::Drop(DropReason::FlowMiss)
        } else {
            Verdict::Deliver(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> FlowTable {
        let mut mask = [0u8; MATCH_SET_BYTES];
        mask[0x1e] = 0xff;
        mask[0x1f] = 0xff;
        let mut groups = BTreeMap::new();
        groups.insert(
            100,
            FlowGroup {
                start: 0,
                end: 3,
                mask,
            },
        );
        let mut entries = BTreeMap::new();
        let mut value = [0u8; MATCH_SET_BYTES];
        value[0x1e..0x20].copy_from_slice(&31850u16.to_be_bytes());
        // Bits outside the group's mask never take part.
        value[0x08] = 0x42;
        entries.insert(0, Fte::new(100, &mask, value, 0x4, 7, vec![Dest::Tir(55)]));
        FlowTable {
            level: 0,
            log_size: 2,
            miss_action: 0,
            miss_table: 0,
            groups,
            entries,
        }
    }

    #[test]
    fn match_and_miss() {
        let mut s = Steering::default();
        let mut key = [0u8; MATCH_SET_BYTES];
        assert_eq!(s.lookup(&key), Verdict::Drop(DropReason::NoSteeringRoot));
        s.tables.insert(9, table());
        s.root = Some(9);
        assert_eq!(s.lookup(&key), Verdict::Drop(DropReason::FlowMiss));
        key[0x1e..0x20].copy_from_slice(&31850u16.to_be_bytes());
        key[0x08] = 0x99; // not in the mask
        assert_eq!(
            s.lookup(&key),
            Verdict::Deliver(Targets::from_slice(&[(55, 7)]))
        );
        assert!(s.references(Dest::Tir(55)));
        assert_eq!(s.group_of_test(), Some(100));
    }

    proptest::proptest! {
        /// The word-wise match with its precomputed masked value decides
        /// exactly as the byte-wise definition, for any mask, value and
        /// key (keys drawn near the value, so matches happen).
        #[test]
        fn word_match_is_the_byte_match(
            mask in proptest::collection::vec(proptest::prelude::any::<u8>(), MATCH_SET_BYTES),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), MATCH_SET_BYTES),
            flips in proptest::collection::vec((0..MATCH_SET_BYTES, proptest::prelude::any::<u8>()), 0..3),
            sparse in proptest::prelude::any::<bool>(),
        ) {
            let mut m = [0u8; MATCH_SET_BYTES];
            m.copy_from_slice(&mask);
            if sparse {
                // Mostly zero, as real group masks are.
                for (i, b) in m.iter_mut().enumerate() {
                    if i % 7 != 0 {
                        *b = 0;
                    }
                }
            }
            let mut v = [0u8; MATCH_SET_BYTES];
            v.copy_from_slice(&value);
            let mut key = v;
            for &(i, x) in &flips {
                key[i] ^= x;
            }
            let bytewise = m.iter().zip(key.iter().zip(v.iter())).all(|(m, (k, v))| k & m == v & m);
            let e = Fte::new(1, &m, v, 0x4, 0, vec![Dest::Tir(1)]);
            proptest::prop_assert_eq!(e.matches(&match_words(&key)), bytewise);
        }
    }

    impl Steering {
        fn group_of_test(&self) -> Option<u32> {
            self.tables.get(&9)?.group_of(3)
        }
    }
}
