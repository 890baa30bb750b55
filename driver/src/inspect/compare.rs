//! The software and firmware views of a queue set or the EQ, compared
//! field by field.

use serde::{Deserialize, Serialize};

use crate::prm::codes::QueueState;
use crate::queue::HwQueueState;

use super::QueueSetSoftware;

/// How a software value must relate to its firmware twin (JSON: an object
/// with `kind`, and `window` for `unordered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Relation {
    /// Must be equal.
    Equal,
    /// A counter the firmware may have moved past since the software view
    /// was published (software ≤ firmware, modulo the counter width).
    SoftwareBehind,
    /// A counter software moves first and tells the firmware later
    /// (firmware ≤ software).
    FirmwareBehind,
    /// Either may be ahead, by at most `window` (the ring size): one side
    /// reads the other lazily (the NIC reads an RQ doorbell record when it
    /// needs WQEs) and the software may move on after publishing.
    Unordered {
        /// The largest difference either way.
        window: u64,
    },
}

/// What a comparison found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareStatus {
    /// The same value.
    Same,
    /// Different, in the direction the relation allows (a counter moved
    /// between the two reads, or software is told later by design).
    Lagging,
    /// A difference the relation does not allow: worth a look.
    Differs,
}

/// One field of the software view next to the firmware's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comparison {
    /// Stable key (`sq.state`, `sq.producer`, ...).
    pub key: String,
    /// What it is.
    pub what: String,
    /// The software's value.
    pub software: u64,
    /// The firmware's value.
    pub firmware: u64,
    /// Counter width in bits (0 for states).
    pub bits: u32,
    /// The relation checked.
    pub relation: Relation,
    /// The outcome.
    pub status: CompareStatus,
}

impl Comparison {
    fn new(key: &str, what: &str, sw: u64, fw: u64, bits: u32, relation: Relation) -> Self {
        let mask = if bits == 0 || bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let (s, f) = (sw & mask, fw & mask);
        let half = if bits == 0 {
            0
        } else {
            1u64 << (bits.min(63) - 1)
        };
        // a ≤ b modulo 2^bits: b - a is less than half the range.
        let le = |a: u64, b: u64| bits != 0 && (b.wrapping_sub(a) & mask) < half;
        let dist = |a: u64, b: u64| b.wrapping_sub(a) & mask;
        let status = if s == f {
            CompareStatus::Same
        } else {
            match relation {
                Relation::Equal => CompareStatus::Differs,
                Relation::SoftwareBehind if le(s, f) => CompareStatus::Lagging,
                Relation::FirmwareBehind if le(f, s) => CompareStatus::Lagging,
                Relation::Unordered { window }
                    if bits != 0 && dist(s, f).min(dist(f, s)) <= window =>
                {
                    CompareStatus::Lagging
                }
                _ => CompareStatus::Differs,
            }
        };
        Comparison {
            key: key.into(),
            what: what.into(),
            software: s,
            firmware: f,
            bits,
            relation,
            status,
        }
    }
}

/// The queue-set fields whose firmware twin QUERY_* reports, compared.
/// The software view is published first and the firmware read after it,
/// so counters that move under traffic may show the firmware ahead
/// ([`CompareStatus::Lagging`]); on an idle queue set they are equal,
/// except where one side learns late by design (software sees send
/// completions only at signaled WQEs; the NIC reads an RQ doorbell record
/// only when it needs WQEs). [`CompareStatus::Differs`] is a difference
/// no timing explains: the NIC missed a doorbell, a queue is in another
/// state than the software believes, a counter is off by more than its
/// ring.
pub fn compare_queue_set(sw: &QueueSetSoftware, fw: &HwQueueState) -> Vec<Comparison> {
    use Relation::*;
    let s = &sw.snapshot;
    let sq_state = if s.sq_error.is_some() {
        QueueState::Err
    } else {
        QueueState::Rdy
    } as u64;
    let rq_consumed = u64::from(sw.rx_strides_reported / sw.rq_strides_per_wqe.max(1));
    vec![
        Comparison::new(
            "sq.state",
            "SQ state",
            sq_state,
            u64::from(fw.sq_state),
            0,
            Equal,
        ),
        Comparison::new(
            "sq.producer",
            "SQ producer counter (WQEBBs posted; firmware: doorbell record)",
            u64::from(s.sq_pi),
            u64::from(fw.sq_sw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "sq.completed",
            "SQ WQEBBs completed (software learns at signaled WQEs only)",
            u64::from(s.sq_ci),
            u64::from(fw.sq_hw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "rq.state",
            "RQ state",
            QueueState::Rdy as u64,
            u64::from(fw.rq_state),
            0,
            Equal,
        ),
        Comparison::new(
            "rq.producer",
            "RQ WQEs posted (firmware: the doorbell record as the NIC last read it)",
            u64::from(s.rq_head),
            u64::from(fw.rq_sw_counter),
            16,
            Unordered {
                window: u64::from(sw.rq_wqes),
            },
        ),
        Comparison::new(
            "rq.consumed",
            "RQ WQEs whose strides were all used (software: strides reported / strides per WQE)",
            rq_consumed,
            u64::from(fw.rq_hw_counter),
            16,
            SoftwareBehind,
        ),
        Comparison::new(
            "tx_cq.consumer",
            "TX CQ consumer index (firmware: the doorbell record as the NIC last read it)",
            u64::from(s.tx_cq_ci),
            u64::from(fw.tx_cq.0),
            24,
            Unordered {
                window: u64::from(sw.tx_cq_entries),
            },
        ),
        Comparison::new(
            "tx_cq.produced",
            "TX CQEs written (software: CQEs polled)",
            u64::from(s.tx_cq_ci),
            u64::from(fw.tx_cq.1),
            24,
            SoftwareBehind,
        ),
        Comparison::new(
            "rx_cq.produced",
            "RX CQEs written (software: packets counted; fillers add CQEs)",
            s.stats.rx_pkts,
            u64::from(fw.rx_cq.1),
            24,
            SoftwareBehind,
        ),
    ]
}

pub(super) fn compare_eq(ci: u32, fw: (u32, u32, u8)) -> Vec<Comparison> {
    vec![
        Comparison::new(
            "eq.consumer",
            "EQ consumer index (software tells firmware every 64 events)",
            u64::from(ci),
            u64::from(fw.0),
            24,
            Relation::FirmwareBehind,
        ),
        Comparison::new(
            "eq.produced",
            "EQ events written (software: events consumed)",
            u64::from(ci),
            u64::from(fw.1),
            24,
            Relation::SoftwareBehind,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_allow_only_the_stated_direction_modulo_the_width() {
        use CompareStatus::*;
        use Relation::*;
        let st = |sw, fw, bits, r| Comparison::new("k", "w", sw, fw, bits, r).status;
        assert_eq!(st(5, 5, 16, Equal), Same);
        assert_eq!(st(5, 6, 16, Equal), Differs);
        assert_eq!(st(5, 9, 16, SoftwareBehind), Lagging);
        assert_eq!(st(9, 5, 16, SoftwareBehind), Differs);
        assert_eq!(st(9, 5, 16, FirmwareBehind), Lagging);
        // Across the wrap of a 16-bit counter: software 0xfffe, firmware 3.
        assert_eq!(st(0xfffe, 3, 16, SoftwareBehind), Lagging);
        assert_eq!(st(3, 0xfffe, 16, SoftwareBehind), Differs);
        // The software counter is wider: only the low bits count.
        assert_eq!(st(0x1_0005, 5, 16, Equal), Same);
        assert_eq!(st(0x100_0000 + 7, 9, 24, SoftwareBehind), Lagging);
        // States have no order.
        assert_eq!(st(1, 3, 0, SoftwareBehind), Differs);
        // Either way within the window, across the wrap too.
        let w = Unordered { window: 8 };
        assert_eq!(st(7, 0, 16, w), Lagging);
        assert_eq!(st(0, 7, 16, w), Lagging);
        assert_eq!(st(0xfffe, 5, 16, w), Lagging);
        assert_eq!(st(0, 9, 16, w), Differs);
    }
}
