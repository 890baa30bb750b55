//! A linearizability checker for key-value histories.
//!
//! A history is a list of operations, each with the time its client
//! invoked it and the time the answer arrived (or none: the client never
//! learned the outcome, so the operation may or may not have taken
//! effect). A key-value map is linearizable if and only if each key,
//! checked on its own as a register, is (linearizability is local,
//! Herlihy and Wing), so the history is split by key and every key is
//! searched with the Wing–Gong algorithm with Lowe's memoisation of
//! (linearized set, register state): linearize any operation whose call
//! comes before every pending return, backtrack at a return whose
//! operation has not been linearized.
//!
//! Operations without an answer get a return after everything else: a
//! write that never took effect then linearizes last, where nothing can
//! observe it; a read without an answer says nothing and is dropped.
//!
//! Calls and returns with equal timestamps count as concurrent (a return
//! at `t` does not precede a call at `t`): the permissive reading, since
//! the simulation's clock moves in steps.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// What an operation did to one key's register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegOp {
    /// Wrote a value (identified by a number unique to that write).
    Put(u64),
    /// Read: the value found (`None`: the key was absent).
    Get(Option<u64>),
}

/// One operation of a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistOp {
    /// Key (any identifier).
    pub key: u64,
    /// What it did.
    pub op: RegOp,
    /// When the client invoked it.
    pub call_ns: u64,
    /// When the answer arrived; `None`: never (outcome unknown).
    pub ret_ns: Option<u64>,
}

/// Why a history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The key whose operations admit no linearization.
    pub key: u64,
    /// That key's operations, in call order.
    pub ops: Vec<HistOp>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {}: no linearization of its {} operations:",
            self.key,
            self.ops.len()
        )?;
        for o in &self.ops {
            let ret = o.ret_ns.map_or("-".to_owned(), |r| r.to_string());
            writeln!(f, "  [{:>12} .. {:>12}] {:?}", o.call_ns, ret, o.op)?;
        }
        Ok(())
    }
}

/// Checks a history; `Err` names the first key (in key order) with no
/// linearization. `max_states` bounds the memo per key (the search is
/// exponential in the worst case): a key that exceeds it is reported as a
/// violation too, with the operations, so a test never passes unchecked.
pub fn check(history: &[HistOp], max_states: usize) -> Result<CheckStats, Violation> {
    let mut by_key: BTreeMap<u64, Vec<HistOp>> = BTreeMap::new();
    for o in history {
        if o.ret_ns.is_none() && matches!(o.op, RegOp::Get(_)) {
            continue;
        }
        by_key.entry(o.key).or_default().push(*o);
    }
    let mut stats = CheckStats::default();
    for (key, mut ops) in by_key {
        ops.sort_by_key(|o| (o.call_ns, o.ret_ns.unwrap_or(u64::MAX)));
        match check_register(&ops, max_states) {
            Some(states) => {
                stats.keys += 1;
                stats.ops += ops.len();
                stats.states += states;
            }
            None => return Err(Violation { key, ops }),
        }
    }
    Ok(stats)
}

/// What a successful check covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Keys checked.
    pub keys: usize,
    /// Operations checked.
    pub ops: usize,
    /// Search states visited (memo entries).
    pub states: usize,
}

const NONE: usize = usize::MAX;

/// One event in the doubly linked list of calls and returns.
#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// For a call: the index of its return event.
    ret: usize,
    prev: usize,
    next: usize,
}

/// Wing–Gong with memoisation on one register; `Some(states visited)` if
/// linearizable, `None` if not (or the memo grew past `max_states`).
fn check_register(ops: &[HistOp], max_states: usize) -> Option<usize> {
    let n = ops.len();
    if n == 0 {
        return Some(0);
    }
    // Events sorted by time; at equal times calls first (concurrent).
    let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (i, o) in ops.iter().enumerate() {
        order.push((o.call_ns, 0, i));
        order.push((o.ret_ns.unwrap_or(u64::MAX), 1, i));
    }
    order.sort_unstable();
    // Event 0 is the head sentinel.
    let mut ev: Vec<Event> = Vec::with_capacity(2 * n + 1);
    ev.push(Event {
        op: NONE,
        is_call: false,
        ret: NONE,
        prev: NONE,
        next: NONE,
    });
    let mut call_of = vec![NONE; n];
    for (k, &(_, kind, i)) in order.iter().enumerate() {
        let idx = k + 1;
        ev.push(Event {
            op: i,
            is_call: kind == 0,
            ret: NONE,
            prev: idx - 1,
            next: if k + 1 < order.len() { idx + 1 } else { NONE },
        });
        if kind == 0 {
            call_of[i] = idx;
        } else {
            ev[call_of[i]].ret = idx;
        }
    }
    ev[0].next = 1;

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut memo: HashSet<(Vec<u64>, Option<u64>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<u64>)> = Vec::new();
    let mut state: Option<u64> = None;
    let mut e = ev[0].next;

    let unlink = |ev: &mut Vec<Event>, i: usize| {
        let (p, nx) = (ev[i].prev, ev[i].next);
        ev[p].next = nx;
        if nx != NONE {
            ev[nx].prev = p;
        }
    };
    let relink = |ev: &mut Vec<Event>, i: usize| {
        let (p, nx) = (ev[i].prev, ev[i].next);
        ev[p].next = i;
        if nx != NONE {
            ev[nx].prev = i;
        }
    };

    loop {
        if e == NONE {
            return Some(memo.len());
        }
        if ev[e].is_call {
            let i = ev[e].op;
            let (ok, next_state) = match ops[i].op {
                RegOp::Put(v) => (true, Some(v)),
                RegOp::Get(v) => (v == state, state),
            };
            if ok {
                linearized[i / 64] |= 1 << (i % 64);
                if memo.insert((linearized.clone(), next_state)) {
                    if memo.len() > max_states {
                        return None;
                    }
                    stack.push((e, state));
                    state = next_state;
                    // Lift the call and its return out of the list.
                    let r = ev[e].ret;
                    unlink(&mut ev, e);
                    unlink(&mut ev, r);
                    e = ev[0].next;
                    continue;
                }
                linearized[i / 64] &= !(1 << (i % 64));
            }
            e = ev[e].next;
        } else {
            // A return whose call is not linearized: backtrack.
            let (c, s) = stack.pop()?;
            state = s;
            let i = ev[c].op;
            linearized[i / 64] &= !(1 << (i % 64));
            let r = ev[c].ret;
            relink(&mut ev, r);
            relink(&mut ev, c);
            e = ev[c].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: u64, op: RegOp, call: u64, ret: Option<u64>) -> HistOp {
        HistOp {
            key,
            op,
            call_ns: call,
            ret_ns: ret,
        }
    }
    use RegOp::{Get, Put};

    #[test]
    fn sequential_histories() {
        let h = [
            op(1, Get(None), 0, Some(1)),
            op(1, Put(7), 2, Some(3)),
            op(1, Get(Some(7)), 4, Some(5)),
            op(2, Put(8), 0, Some(9)),
        ];
        let s = check(&h, 1 << 20).unwrap();
        assert_eq!((s.keys, s.ops), (2, 4));
        // A stale read after a completed write is not linearizable.
        let bad = [
            op(1, Put(7), 0, Some(1)),
            op(1, Put(9), 2, Some(3)),
            op(1, Get(Some(7)), 4, Some(5)),
        ];
        let v = check(&bad, 1 << 20).unwrap_err();
        assert_eq!(v.key, 1);
        assert!(v.to_string().contains("no linearization"), "{v}");
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // Two overlapping writes; reads after both may see either, but two
        // later reads must agree.
        let base = [op(1, Put(1), 0, Some(10)), op(1, Put(2), 5, Some(15))];
        for v in [1, 2] {
            let mut h = base.to_vec();
            h.push(op(1, Get(Some(v)), 20, Some(21)));
            h.push(op(1, Get(Some(v)), 22, Some(23)));
            assert!(check(&h, 1 << 20).is_ok());
        }
        let mut h = base.to_vec();
        h.push(op(1, Get(Some(1)), 20, Some(21)));
        h.push(op(1, Get(Some(2)), 22, Some(23)));
        assert!(check(&h, 1 << 20).is_err());
        // A read concurrent with a write may see the old or the new value.
        let h = [
            op(1, Put(1), 0, Some(1)),
            op(1, Put(2), 2, Some(10)),
            op(1, Get(Some(1)), 3, Some(4)),
            op(1, Get(Some(2)), 5, Some(6)),
        ];
        assert!(check(&h, 1 << 20).is_ok());
        // ... but not back again.
        let h = [
            op(1, Put(1), 0, Some(1)),
            op(1, Put(2), 2, Some(10)),
            op(1, Get(Some(2)), 3, Some(4)),
            op(1, Get(Some(1)), 5, Some(6)),
        ];
        assert!(check(&h, 1 << 20).is_err());
    }

    #[test]
    fn unanswered_writes_may_or_may_not_have_happened() {
        // A write without an answer: reads may see it ...
        let h = [
            op(1, Put(1), 0, Some(1)),
            op(1, Put(2), 2, None),
            op(1, Get(Some(2)), 5, Some(6)),
        ];
        assert!(check(&h, 1 << 20).is_ok());
        // ... or not ...
        let h = [
            op(1, Put(1), 0, Some(1)),
            op(1, Put(2), 2, None),
            op(1, Get(Some(1)), 5, Some(6)),
        ];
        assert!(check(&h, 1 << 20).is_ok());
        // ... but once seen it cannot disappear, and a lost
        // acknowledged write is caught.
        let h = [
            op(1, Put(1), 0, Some(1)),
            op(1, Put(2), 2, None),
            op(1, Get(Some(2)), 5, Some(6)),
            op(1, Get(Some(1)), 7, Some(8)),
        ];
        assert!(check(&h, 1 << 20).is_err());
        let lost = [op(1, Put(1), 0, Some(1)), op(1, Get(None), 5, Some(6))];
        assert!(check(&lost, 1 << 20).is_err());
        // Unanswered reads carry no information.
        let h = [op(1, Put(1), 0, Some(1)), op(1, Get(Some(99)), 2, None)];
        assert!(check(&h, 1 << 20).is_ok());
    }

    #[test]
    fn a_long_concurrent_history_is_checked_quickly() {
        // 4 clients, 200 rounds of overlapping writes and reads on one key,
        // generated from a sequential execution (so it is linearizable).
        let mut h = Vec::new();
        let mut reg = None;
        let mut t = 0;
        for round in 0..200u64 {
            for c in 0..4u64 {
                let id = round * 4 + c + 1;
                // Each op spans a window overlapping its neighbours; its
                // effect happens at t + 2 in this order.
                let o = if (round + c) % 3 == 0 {
                    RegOp::Get(reg)
                } else {
                    reg = Some(id);
                    RegOp::Put(id)
                };
                h.push(op(7, o, t, Some(t + 5)));
                t += 2;
            }
        }
        let s = check(&h, 1 << 22).unwrap();
        assert_eq!(s.ops, 800);
    }

    #[test]
    fn the_memo_bound_is_reported_not_passed() {
        // Many concurrent writes and an impossible read: the search has to
        // exhaust every order; with a tiny memo it stops and reports.
        let mut h: Vec<HistOp> = (0..12).map(|i| op(3, Put(i), 0, Some(100))).collect();
        h.push(op(3, Get(Some(99)), 200, Some(201)));
        assert!(check(&h, 16).is_err());
        assert!(check(&h, 1 << 20).is_err());
    }
}
