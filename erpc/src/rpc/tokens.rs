//! Connect tokens of server sessions that are gone.
//!
//! A connect request can arrive late (a duplicate the network held back,
//! a retry that crossed the response). If it arrives after its session was
//! disconnected, the server must not create a session from it: nobody owns
//! that session, it would hold its RX ring reservation forever, and enough
//! of them lock every client out. So the server remembers the token of
//! every server session it freed, for [`TOKEN_MEMORY_MS`] (far longer than
//! a client retries a connect), in a table bounded to [`MAX_TOKEN_MEMORY`]
//! entries (the oldest are forgotten first), and ignores connect requests
//! that carry a remembered token. The C++ eRPC remembers every token
//! forever; the bound keeps a long-lived server's memory flat.

use std::collections::{HashMap, VecDeque};

/// How long a freed session's token is remembered.
pub(crate) const TOKEN_MEMORY_MS: u64 = 10_000;
/// Most tokens remembered.
pub(crate) const MAX_TOKEN_MEMORY: usize = 1 << 16;

const _: () = assert!(TOKEN_MEMORY_MS >= 10 * crate::consts::FAILURE_TIMEOUT_MS);

/// Tokens of freed server sessions, with their retirement time.
#[derive(Debug, Default)]
pub(crate) struct RetiredTokens {
    at: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl RetiredTokens {
    /// Remembers `token` from `now_ns` on.
    pub(crate) fn retire(&mut self, token: u64, now_ns: u64) {
        self.expire(now_ns);
        if self.order.len() >= MAX_TOKEN_MEMORY
            && let Some((t, at)) = self.order.pop_front()
            && self.at.get(&t) == Some(&at)
        {
            self.at.remove(&t);
        }
        self.at.insert(token, now_ns);
        self.order.push_back((token, now_ns));
    }

    /// True if `token` belonged to a session freed recently.
    pub(crate) fn contains(&mut self, token: u64, now_ns: u64) -> bool {
        self.expire(now_ns);
        self.at.contains_key(&token)
    }

    /// Forgets the tokens whose memory time is over, and gives back the
    /// room of a table that emptied out (the Rpc calls this at its loss
    /// scan interval too, so a quiet server's memory shrinks back).
    pub(crate) fn expire(&mut self, now_ns: u64) {
        let ttl = TOKEN_MEMORY_MS * 1_000_000;
        let mut expired = false;
        while let Some(&(t, at)) = self.order.front() {
            if now_ns.saturating_sub(at) < ttl {
                break;
            }
            expired = true;
            self.order.pop_front();
            if self.at.get(&t) == Some(&at) {
                self.at.remove(&t);
            }
        }
        if expired {
            shrink_if_sparse_map(&mut self.at);
            shrink_if_sparse_deque(&mut self.order);
        }
    }

    /// Tokens remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }
}

/// Gives back most of a map's room once it holds a quarter of it or less
/// (a table that a burst filled, in a quiet time).
pub(crate) fn shrink_if_sparse_map<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > SHRINK_FLOOR && m.len() * 4 <= m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}

/// [`shrink_if_sparse_map`] for a queue.
pub(crate) fn shrink_if_sparse_deque<T>(q: &mut VecDeque<T>) {
    if q.capacity() > SHRINK_FLOOR && q.len() * 4 <= q.capacity() {
        q.shrink_to(q.len() * 2);
    }
}

/// [`shrink_if_sparse_map`] for a list.
pub(crate) fn shrink_if_sparse<T>(v: &mut Vec<T>) {
    if v.capacity() > SHRINK_FLOOR && v.len() * 4 <= v.capacity() {
        v.shrink_to(v.len() * 2);
    }
}

/// Tables this small are never shrunk.
const SHRINK_FLOOR: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn remembered_for_the_memory_time_then_forgotten() {
        let mut r = RetiredTokens::default();
        r.retire(7, 0);
        assert!(r.contains(7, (TOKEN_MEMORY_MS - 1) * MS));
        assert!(!r.contains(8, 0));
        assert!(!r.contains(7, TOKEN_MEMORY_MS * MS));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn bounded_oldest_first_and_re_retiring_refreshes() {
        let mut r = RetiredTokens::default();
        for t in 0..MAX_TOKEN_MEMORY as u64 + 10 {
            r.retire(t, 1);
        }
        assert_eq!(r.len(), MAX_TOKEN_MEMORY);
        assert!(!r.contains(0, 1) && !r.contains(9, 1));
        assert!(r.contains(10, 1));
        // A token retired again lives from its latest retirement.
        let mut r = RetiredTokens::default();
        r.retire(1, 0);
        r.retire(1, 5_000 * MS);
        assert!(r.contains(1, (TOKEN_MEMORY_MS + 1) * MS));
        assert!(!r.contains(1, (TOKEN_MEMORY_MS + 5_000) * MS));
    }
}
