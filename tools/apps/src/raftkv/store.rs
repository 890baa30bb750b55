//! The replica's Raft log: an in-memory implementation of raft-rs's
//! [`Storage`] trait (the paper's Raft experiment keeps its log in memory
//! too), with the state machine's snapshots.
//!
//! raft-rs's own `MemStorage` is a test fixture: its snapshots carry no
//! application data, and after `compact` it cannot answer the term of the
//! entry before the first one, which raft needs for log matching. This
//! store keeps the log as entries after a *dummy* position (index and term
//! of the last discarded entry) and, separately, the latest snapshot (the
//! state machine at some applied index, at or after the dummy), so a log
//! can keep a tail of entries behind its snapshot: a follower slightly
//! behind gets entries, not a snapshot.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// The log, hard state and latest snapshot of one replica.
#[derive(Debug, Default)]
pub struct KvStore {
    hard_state: HardState,
    conf_state: ConfState,
    /// Index and term of the entry before `entries[0]`.
    dummy_index: u64,
    dummy_term: u64,
    entries: Vec<Entry>,
    snapshot: Snapshot,
}

impl KvStore {
    /// A store for a new cluster of `voters` (every replica starts with the
    /// same configuration and an empty log).
    pub fn new(voters: &[u64]) -> KvStore {
        let conf_state = ConfState::from((voters.to_vec(), Vec::<u64>::new()));
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().set_conf_state(conf_state.clone());
        KvStore {
            conf_state,
            snapshot,
            ..Default::default()
        }
    }

    /// The hard state (term, vote, commit).
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Persists a hard state from a `Ready`.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Persists a new commit index (from a `LightReady`).
    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    fn first(&self) -> u64 {
        self.dummy_index + 1
    }

    fn last(&self) -> u64 {
        self.dummy_index + self.entries.len() as u64
    }

    /// Entries held now (for stats).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Index of the latest snapshot.
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// Appends entries from a `Ready`, replacing any conflicting suffix.
    ///
    /// # Panics
    /// If the entries start inside the discarded prefix or leave a gap:
    /// raft never asks for that, so it would be a bug.
    pub fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else {
            return;
        };
        assert!(
            first.index > self.dummy_index && first.index <= self.last() + 1,
            "append at {} to a log holding ({}, {}]",
            first.index,
            self.dummy_index,
            self.last()
        );
        let keep = (first.index - self.first()) as usize;
        self.entries.truncate(keep);
        self.entries.extend_from_slice(ents);
    }

    /// Installs a snapshot received from the leader: the log restarts
    /// after it.
    pub fn apply_snapshot(&mut self, snap: Snapshot) {
        let meta = snap.get_metadata();
        self.dummy_index = meta.index;
        self.dummy_term = meta.term;
        self.entries.clear();
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.conf_state = meta.get_conf_state().clone();
        self.snapshot = snap;
    }

    /// Records a snapshot of the state machine at `index` (applied, so
    /// in the log) holding `data`, and discards the entries up to
    /// `index - keep` (a tail stays for followers slightly behind).
    pub fn snapshot_and_compact(&mut self, index: u64, data: Vec<u8>, keep: u64) {
        let term = self.term(index).expect("a snapshot of an applied entry");
        let mut snap = Snapshot::default();
        snap.set_data(data.into());
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        self.snapshot = snap;
        let upto = index.saturating_sub(keep);
        if upto > self.dummy_index {
            let term = self.term(upto).expect("within the log");
            let n = (upto - self.dummy_index) as usize;
            self.entries.drain(..n);
            self.dummy_index = upto;
            self.dummy_term = term;
        }
    }
}

impl Storage for KvStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.dummy_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.first()) as usize;
        let hi = (high - self.first()) as usize;
        let mut ents = self.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.dummy_index {
            return Ok(self.dummy_term);
        }
        if idx < self.dummy_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The log is compacted only behind a snapshot, so the latest one
        // covers every discarded entry; one older than asked for means a
        // new one is being made.
        if self.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    #[test]
    fn append_truncates_conflicts_and_compaction_keeps_a_tail() {
        let mut s = KvStore::new(&[1, 2, 3]);
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (1, 0));
        assert_eq!(s.term(0).unwrap(), 0);
        s.append(&[ent(1, 1), ent(2, 1), ent(3, 1)]);
        s.append(&[ent(3, 2), ent(4, 2)]);
        assert_eq!(s.last_index().unwrap(), 4);
        assert_eq!(s.term(3).unwrap(), 2);
        assert_eq!(
            s.entries(2, 5, None, GetEntriesContext::empty(false))
                .unwrap()
                .len(),
            3
        );
        s.snapshot_and_compact(4, vec![9; 10], 2);
        assert_eq!(s.first_index().unwrap(), 3);
        assert_eq!(s.term(2).unwrap(), 1, "the dummy keeps its term");
        assert!(matches!(
            s.term(1),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert!(matches!(
            s.entries(2, 4, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let snap = s.snapshot(0, 2).unwrap();
        assert_eq!(
            (snap.get_metadata().index, snap.get_metadata().term),
            (4, 2)
        );
        assert_eq!(snap.get_data(), &[9; 10]);
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
        assert!(s.snapshot(5, 2).is_err());
        // A received snapshot replaces the log.
        let mut f = KvStore::new(&[1, 2, 3]);
        f.append(&[ent(1, 1)]);
        f.apply_snapshot(snap);
        assert_eq!((f.first_index().unwrap(), f.last_index().unwrap()), (5, 4));
        assert_eq!(f.term(4).unwrap(), 2);
        assert_eq!(f.hard_state().commit, 4);
        f.append(&[ent(5, 2)]);
        assert_eq!(f.last_index().unwrap(), 5);
    }
}
