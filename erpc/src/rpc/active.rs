//! Active client sessions: what a session needs only while it has
//! requests, so that an idle session costs little and nothing periodic
//! walks all sessions.
//!
//! A client session becomes *active* when a request starts on one of its
//! slots ([`Rpc::activate`], out of line, from `start_request`): it joins
//! the Rpc's active list, which is all the loss scan visits, and under
//! congestion control it takes a TX timestamp array from the Rpc's pool
//! (a fresh one only when more sessions are active than ever before) and
//! the timing wheel gets room for its credits (likewise only at a new
//! high). The loss scan retires a session it finds with no request in
//! flight: the timestamps go back to the pool and the session leaves the
//! list. So the scan, the timestamps and the wheel's buckets all scale
//! with the sessions that have requests, not with the sessions open
//! (issue 28: 20 000 sessions per node), and session churn leaves none of
//! them behind.
//!
//! Invariant: a session number is in the list exactly when its session
//! exists with `active` set; an active session under congestion control
//! holds a timestamp array of its own, every other session the shared
//! empty one. `free_session` and `destroy_session` take a session out.

use std::cell::Cell;
use std::rc::Rc;

use transport::Transport;

use super::{Rpc, SessionNum};

/// The Rpc's active client sessions and their pooled resources.
pub(crate) struct Active {
    /// Session numbers of the active client sessions.
    list: Vec<SessionNum>,
    /// Spare TX timestamp arrays (congestion control on).
    ts_pool: Vec<Rc<[Cell<u64>]>>,
    /// The array of every session without one of its own.
    empty: Rc<[Cell<u64>]>,
    /// Timestamp cells per slot (a power of two at least the credits).
    ts_cap: usize,
    /// Active sessions the timing wheel has room for (the most ever).
    wheel_sessions: usize,
}

impl Active {
    pub(crate) fn new(ts_cap: usize) -> Active {
        Active {
            list: Vec::new(),
            ts_pool: Vec::new(),
            empty: Rc::new([]),
            ts_cap,
            wheel_sessions: 0,
        }
    }

    /// The shared empty timestamp array (no allocation).
    pub(crate) fn empty_ts(&self) -> Rc<[Cell<u64>]> {
        self.empty.clone()
    }

    /// Spare timestamp arrays, and the most sessions ever active (the
    /// timing wheel has room for that many).
    #[cfg(feature = "testing")]
    pub(crate) fn pooled(&self) -> (usize, usize) {
        (self.ts_pool.len(), self.wheel_sessions)
    }

    /// Active sessions now.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Active session number `k` of the list.
    #[inline]
    pub(crate) fn get(&self, k: usize) -> SessionNum {
        self.list[k]
    }

    /// Takes session `sn` out of the list (a rare path: the session is
    /// being freed or destroyed), giving its timestamp array back.
    pub(crate) fn remove(&mut self, sn: SessionNum, ts: Rc<[Cell<u64>]>) {
        if let Some(k) = self.list.iter().position(|&x| x == sn) {
            self.list.swap_remove(k);
        }
        self.give_back(ts);
    }

    /// Takes entry `k` out of the list, giving `ts` back.
    fn remove_at(&mut self, k: usize, ts: Rc<[Cell<u64>]>) {
        self.list.swap_remove(k);
        self.give_back(ts);
    }

    fn give_back(&mut self, ts: Rc<[Cell<u64>]>) {
        if !ts.is_empty() {
            self.ts_pool.push(ts);
        }
    }

    /// Frees spare timestamp arrays beyond what the sessions active now
    /// would need again, at most [`TRIM_PER_SCAN`] (called once per loss
    /// scan: after a burst of activity across many sessions the pool
    /// shrinks back, at a bounded cost per scan, instead of keeping its
    /// peak).
    fn trim(&mut self) {
        let keep = self.list.len() + POOL_SLACK;
        if self.ts_pool.len() > keep {
            let n = (self.ts_pool.len() - keep).min(TRIM_PER_SCAN);
            self.ts_pool.truncate(self.ts_pool.len() - n);
        }
    }
}

/// Spare timestamp arrays the pool keeps beyond the active sessions.
const POOL_SLACK: usize = 64;
/// Most spare arrays one loss scan frees (32 000 a second at the default
/// scan interval).
const TRIM_PER_SCAN: usize = 16;

impl<T: Transport, C> Rpc<T, C> {
    /// Client session `sn` starts a request and was idle: it joins the
    /// active list and takes what an active session needs. Allocates only
    /// when more sessions are active than ever before.
    #[cold]
    #[inline(never)]
    pub(crate) fn activate(&mut self, sn: SessionNum) {
        let cc = self.pacing.cc_on();
        let a = &mut self.active;
        let ts = if cc {
            if a.list.len() >= a.wheel_sessions {
                a.wheel_sessions += 1;
                if let Some(w) = self.wheel.as_mut() {
                    // Every packet in the wheel holds one of its active
                    // session's credits.
                    w.reserve(self.config.session_credits);
                }
            }
            a.ts_pool
                .pop()
                .unwrap_or_else(|| super::cc::new_ts_array(a.ts_cap))
        } else {
            a.empty.clone()
        };
        let Some(s) = self.sessions.session_mut(sn) else {
            return;
        };
        debug_assert!(!s.active);
        s.active = true;
        s.tx_ts = ts;
        a.list.push(sn);
    }

    /// Client session `sn` leaves the active list now, if it is in it
    /// (`destroy_session`; its requests were just failed).
    pub(crate) fn deactivate(&mut self, sn: SessionNum) {
        let empty = self.active.empty_ts();
        let Some(s) = self.sessions.session_mut(sn) else {
            return;
        };
        if !s.active {
            return;
        }
        s.active = false;
        let ts = std::mem::replace(&mut s.tx_ts, empty);
        // No queued packet may point at the timestamps any more.
        self.tx.forget_session(sn, &mut self.stats.tx_stale);
        self.active.remove(sn, ts);
    }

    /// Once per loss scan: gives back what the sessions active now would
    /// not need again (spare timestamp arrays, at a bounded cost per scan;
    /// the timing wheel's spare buckets, when it is empty).
    pub(crate) fn trim_active(&mut self) {
        self.active.trim();
        let keep = self.active.len() + POOL_SLACK;
        if self.active.wheel_sessions > keep
            && let Some(w) = self.wheel.as_mut()
            && w.shrink_to(keep, self.config.session_credits)
        {
            self.active.wheel_sessions = keep;
        }
    }

    /// The loss scan found active session number `k` of the list with no
    /// request in flight (or gone from `Connected`): it leaves the list.
    /// The caller visits entry `k` again (another session moved there).
    pub(crate) fn retire_active(&mut self, k: usize) {
        let sn = self.active.get(k);
        let empty = self.active.empty_ts();
        let ts = match self.sessions.session_mut(sn) {
            Some(s) => {
                s.active = false;
                std::mem::replace(&mut s.tx_ts, empty)
            }
            None => empty,
        };
        // Nothing of an idle client session needs sending; no queued
        // packet may point at its timestamps once another session has
        // them.
        self.tx.forget_session(sn, &mut self.stats.tx_stale);
        self.active.remove_at(k, ts);
    }
}
