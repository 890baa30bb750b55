//! The replicated state machine: a hash map of 16-byte keys to 64-byte
//! values, plus the table of the last sequence number applied per client
//! that makes a retried PUT apply at most once (Raft thesis §6.3: a
//! client whose leader died retries the same PUT at the new leader; both
//! copies may end up in the log, the second must not overwrite a later
//! write of another client).

use std::collections::HashMap;

use super::wire::{KEY_BYTES, Key, Put, VALUE_BYTES, Value};

/// The key-value map and the deduplication table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StateMachine {
    map: HashMap<Key, Value>,
    last_seq: HashMap<u64, u64>,
}

/// What applying a PUT did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The value was written.
    Written,
    /// A retry of a PUT already applied: nothing changed.
    Duplicate,
}

impl StateMachine {
    /// An empty map.
    pub fn new() -> StateMachine {
        StateMachine::default()
    }

    /// Applies a committed PUT.
    pub fn apply(&mut self, p: &Put) -> Applied {
        let last = self.last_seq.entry(p.client).or_insert(0);
        if p.seq <= *last {
            return Applied::Duplicate;
        }
        *last = p.seq;
        self.map.insert(p.key, p.value);
        Applied::Written
    }

    /// True if the PUT `(client, seq)` has been applied already.
    pub fn is_applied(&self, client: u64, seq: u64) -> bool {
        self.last_seq.get(&client).is_some_and(|&s| seq <= s)
    }

    /// The value of `key`.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.map.get(key)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Serializes the whole state (a snapshot's data).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            16 + self.map.len() * (KEY_BYTES + VALUE_BYTES) + self.last_seq.len() * 16,
        );
        b.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        for (k, v) in &self.map {
            b.extend_from_slice(k);
            b.extend_from_slice(v);
        }
        b.extend_from_slice(&(self.last_seq.len() as u64).to_le_bytes());
        for (c, s) in &self.last_seq {
            b.extend_from_slice(&c.to_le_bytes());
            b.extend_from_slice(&s.to_le_bytes());
        }
        b
    }

    /// Restores the state from a snapshot's data; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<StateMachine> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = b.get(at..at.checked_add(n)?)?;
            at += n;
            Some(s)
        };
        let n = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
        if n > b.len() / (KEY_BYTES + VALUE_BYTES) {
            return None;
        }
        let mut map = HashMap::with_capacity(n);
        for _ in 0..n {
            let k: Key = take(KEY_BYTES)?.try_into().ok()?;
            let v: Value = take(VALUE_BYTES)?.try_into().ok()?;
            map.insert(k, v);
        }
        let m = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
        if m > b.len() / 16 {
            return None;
        }
        let mut last_seq = HashMap::with_capacity(m);
        for _ in 0..m {
            let c = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let s = u64::from_le_bytes(take(8)?.try_into().ok()?);
            last_seq.insert(c, s);
        }
        (at == b.len()).then_some(StateMachine { map, last_seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(client: u64, seq: u64, k: u8, v: u8) -> Put {
        Put {
            client,
            seq,
            key: [k; 16],
            value: [v; 64],
        }
    }

    #[test]
    fn retries_apply_once_and_snapshots_round_trip() {
        let mut sm = StateMachine::new();
        assert_eq!(sm.apply(&put(1, 1, 5, 1)), Applied::Written);
        assert_eq!(sm.apply(&put(2, 1, 5, 2)), Applied::Written);
        // Client 1's retry of seq 1 arrives after client 2's write.
        assert_eq!(sm.apply(&put(1, 1, 5, 1)), Applied::Duplicate);
        assert_eq!(sm.get(&[5; 16]), Some(&[2; 64]));
        assert!(sm.is_applied(1, 1) && !sm.is_applied(1, 2));
        let b = sm.encode();
        assert_eq!(StateMachine::decode(&b), Some(sm.clone()));
        assert!(StateMachine::decode(&b[..b.len() - 1]).is_none());
        let mut huge = b.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(StateMachine::decode(&huge).is_none());
    }
}
