//! Admission of server sessions: what keeps forged or abandoned connect
//! requests from locking clients out of an Rpc.
//!
//! Session management has no authentication (neither has the C++ eRPC):
//! anyone who can send a UDP datagram to the SM port can ask for a session,
//! and every session reserves its credits' worth of the Rpc's RX ring. The
//! defences, each bounded and each counted in [`crate::RpcStats`]:
//!
//! * **A source is the sending host, not what the packet claims.** Every
//!   limit below is keyed on the host a connect request really came from
//!   (its UDP source address without the port, as the SM link reports it;
//!   the sending Nexus's host in the simulated hub), never on the client
//!   URI it names, which anyone can vary at will.
//! * **Connect requests per source.** Each source has a token bucket of
//!   `RpcConfig::connect_burst_per_source` requests (by default the
//!   sessions the RX ring holds, at least 256, so that one client can
//!   always fill its share of an empty Rpc at once), refilled at
//!   `connects_per_sec_per_source`. Only requests that would create a
//!   session are charged (retries of a known token are answered from the
//!   token table for free); over the limit they are dropped unanswered, and
//!   the client's retry comes back later. The table keeps the
//!   [`MAX_SOURCES`] most recently seen sources (first in, first out).
//! * **RX ring per source** (opt-in). With
//!   `RpcConfig::ring_entries_per_source` set, the server sessions of one
//!   source hold at most that many RX ring entries, so that one host,
//!   however patient, always leaves room for others; a request beyond it
//!   is refused with "RX ring exhausted". It is off by default because one
//!   client host using a whole Rpc is a legitimate deployment; without it,
//!   a host that fills the ring is bounded by its connect rate, and the
//!   sessions it leaves idle are reclaimed (below).
//! * **A floor on credits.** An erpc-rs client asks for its session
//!   credits, and the server reserves that many ring entries; a client
//!   asking for 1 could hold thousands of sessions. The server grants at
//!   least `RpcConfig::min_session_credits` (default 8, and never more
//!   than its own `session_credits`); the client still uses no more than
//!   it asked for.
//! * **Reclaiming sessions nobody uses.** When a new session (server or
//!   client) finds the RX ring short, the Rpc reclaims server sessions that
//!   have never received a request and are older than
//!   `RpcConfig::unused_session_reclaim_ms`, oldest first, until there is
//!   room. Reclaiming never happens while the ring has room, and never to a
//!   session that served a request, so a legitimate client that connects
//!   and stays idle keeps its session as long as the Rpc is not full.
//!
//! * **Reclaiming sessions nobody uses any more.** If that is not enough,
//!   server sessions of erpc-rs clients that served requests but received
//!   none for `RpcConfig::idle_session_reclaim_ms` (default 60 s) and run
//!   none are reclaimed, least recently used first (found by one walk of
//!   the sessions, at most once a second). This frees sessions whose
//!   client forgot them without a delivered disconnect. C++ clients'
//!   served sessions are never reclaimed (they cannot be told).
//!
//! What a reclaimed session's client sees: an erpc-rs client (its endpoint
//! carries the SM extensions) is told with a connect response carrying
//! "server disconnected" (C++ clients ignore such a response for a
//! connected session); it resets the session with
//! [`SessionEnd::ServerReclaimed`](crate::SessionEnd::ServerReclaimed), the end its event and
//! its failed requests report. None of them ran: the server had
//! received no request on the session. If that notice is lost, the client's
//! next data packet to the reclaimed session number brings it again (at
//! most once per SM retry interval), because the number stays reserved for
//! the reclaimed session for [`RECLAIM_MEMORY_MS`] ([`MAX_NOTICES`] at
//! most). A C++ client gets no notice (it has no way to take one): a
//! request on a reclaimed session is never answered, and the C++ client
//! does not detect it. So a C++ client that keeps an unused session for
//! longer than the reclaim time, to a server that fills up meanwhile, must
//! open a new session; `unused_session_reclaim_ms: None` turns reclaiming
//! off.
//!
//! The same notice goes out whenever the server ends a session its
//! erpc-rs client did not disconnect ([`Rpc::notify_server_end`]: the
//! server's application reset it, or the client was declared failed,
//! perhaps wrongly, from one side): otherwise the client would resend its
//! requests forever to a session that is gone. The record is kept for
//! [`NOTICE_MEMORY_MS`] and consulted when a data packet finds no live
//! session under its number; the number itself is not reserved (it comes
//! back after the usual quarantine). A reason byte in the notice's server
//! endpoint (`sm_types::EXT_END_REASON`) tells the client which it was:
//! reclaimed unused (nothing ran), or
//! [`SessionEnd::ServerEnded`](crate::SessionEnd::ServerEnded) (a request may have run).

use std::collections::{HashMap, VecDeque};

use transport::Transport;

use super::{Rpc, SessionNum};
use crate::nexus::SmSource;
use crate::session::{Role, SessionState};
use crate::sm_types::{SmErr, SmPkt, SmPktType};

/// Sources whose connect-request buckets are kept.
pub(crate) const MAX_SOURCES: usize = 4096;
/// How long a reclaimed session's number stays reserved so that a late
/// packet of its client brings the notice again.
pub(crate) const RECLAIM_MEMORY_MS: u64 = 600_000;
/// Sessions the server ended remembered, reclaimed ones included (the
/// oldest go first, a reclaimed one's number back to the free list).
pub(crate) const MAX_NOTICES: usize = 1024;

/// Token buckets of connect requests, per source host.
#[derive(Debug, Default)]
pub(crate) struct ConnectLimiter {
    /// Source → (tokens in billionths, last refill).
    buckets: HashMap<SmSource, (u64, u64)>,
    /// Sources in the order they were first seen (for eviction).
    order: VecDeque<SmSource>,
}

/// Bucket units per connect request (a nanosecond at one request a second).
const TOKEN: u64 = 1_000_000_000;

impl ConnectLimiter {
    /// Charges one connect request of `src` at `now_ns`; false if its
    /// bucket is empty. `burst` 0 means no limit.
    pub(crate) fn allow(&mut self, src: &SmSource, now_ns: u64, burst: u32, per_sec: u32) -> bool {
        if burst == 0 {
            return true;
        }
        let full = u64::from(burst) * TOKEN;
        if !self.buckets.contains_key(src) {
            if self.order.len() >= MAX_SOURCES
                && let Some(old) = self.order.pop_front()
            {
                self.buckets.remove(&old);
            }
            self.order.push_back(src.clone());
            self.buckets.insert(src.clone(), (full, now_ns));
        }
        let (tokens, last) = self.buckets.get_mut(src).expect("inserted above");
        // per_sec requests a second: per_sec units a nanosecond.
        let refill = now_ns
            .saturating_sub(*last)
            .saturating_mul(u64::from(per_sec));
        *tokens = tokens.saturating_add(refill).min(full);
        *last = now_ns;
        if *tokens < TOKEN {
            return false;
        }
        *tokens -= TOKEN;
        true
    }

    /// Sources tracked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

/// The server sessions each source host holds, with their ring
/// reservations. Entries of sessions that are gone (or gave their
/// reservation back) are dropped lazily, when their source is looked at
/// again or when the table grows past [`MAX_SOURCES`] sources, so nothing
/// outside admission needs to report a session's end.
#[derive(Debug, Default)]
pub(crate) struct SourceShares {
    /// Source → (session, its client's token, ring entries reserved).
    by_source: HashMap<SmSource, Vec<(SessionNum, u64, usize)>>,
}

/// A server session ended without its erpc-rs client's disconnect
/// (reclaimed, reset by the server's application, or its client declared
/// failed): its number and the notice to send again when the client's
/// packets come.
#[derive(Debug)]
pub(crate) struct Notice {
    session: SessionNum,
    notice: SmPkt,
    at_ns: u64,
    last_sent_ns: u64,
    /// The number stays reserved for the record (a reclaimed session's:
    /// no new session takes it while a late packet may come); otherwise
    /// the number goes back after its quarantine and the record is only
    /// consulted while no session has it.
    reserved: bool,
}

/// How long the record of a session ended by the server (not reclaimed)
/// is kept: its client's packets stop within the stall bound at most.
pub(crate) const NOTICE_MEMORY_MS: u64 = 60_000;

/// Connect responses sent again per never-used server session (see
/// `Rpc::probe_unserved`): the last at 32 SM retry intervals (3.2 s by
/// default).
pub(crate) const UNSERVED_PROBES: u8 = 6;
/// An `unserved` entry whose session is not probed (any more).
const NOT_PROBED: u8 = u8::MAX;

impl<T: Transport, C> Rpc<T, C> {
    /// Rate-limits a connect request from host `src` that would create a
    /// session.
    pub(crate) fn admit_connect(&mut self, src: &SmSource) -> bool {
        let now = self.clock.now_ns();
        let ok = self.connect_limiter.allow(
            src,
            now,
            self.connect_burst,
            self.config.connects_per_sec_per_source,
        );
        if !ok {
            self.stats.sm_connect_rate_limited += 1;
        }
        ok
    }

    /// The credits a server session reserves for a client that asked for
    /// `asked` (0 from an old erpc-rs client: the C++ 32): at most our own
    /// `session_credits`, at least `min_session_credits` (itself at most
    /// `session_credits`).
    pub(crate) fn credits_to_grant(&self, asked: u32) -> u32 {
        let asked = if asked == 0 {
            crate::consts::SESSION_CREDITS as u32
        } else {
            asked
        };
        let own = self.config.session_credits as u32;
        let floor = (self.config.min_session_credits as u32).min(own);
        asked.min(own).max(floor)
    }

    /// Whether a new server session of host `src` may reserve `credits`
    /// more ring entries (see the module documentation); counts a refusal.
    pub(crate) fn source_has_room(&mut self, src: &SmSource, credits: usize) -> bool {
        let cap = self.ring_share_per_source;
        if cap == 0 {
            return true;
        }
        let held = self.source_held(src);
        if held + credits <= cap {
            return true;
        }
        self.stats.sm_connect_source_full += 1;
        false
    }

    /// Ring entries the live server sessions of `src` hold (dropping the
    /// entries of sessions that no longer hold theirs).
    fn source_held(&mut self, src: &SmSource) -> usize {
        let Some(mut v) = self.source_shares.by_source.remove(src) else {
            return 0;
        };
        v.retain(|&(sn, token, _)| self.holds_reservation(sn, token));
        let held = v.iter().map(|&(_, _, c)| c).sum();
        if !v.is_empty() {
            self.source_shares.by_source.insert(src.clone(), v);
        }
        held
    }

    fn holds_reservation(&self, sn: SessionNum, token: u64) -> bool {
        self.session(sn).is_some_and(|s| {
            s.role == Role::Server && s.state == SessionState::Connected && s.uniq_token == token
        })
    }

    /// Server session `sn` (client token `token`) of host `src` was just
    /// created with `credits` ring entries.
    pub(crate) fn note_source_share(
        &mut self,
        src: &SmSource,
        sn: SessionNum,
        token: u64,
        credits: usize,
    ) {
        if self.ring_share_per_source == 0 {
            return;
        }
        if self.source_shares.by_source.len() >= MAX_SOURCES
            && !self.source_shares.by_source.contains_key(src)
        {
            // Forget what no longer holds anything (every entry is a live
            // session otherwise, and sessions are bounded).
            let mut all = std::mem::take(&mut self.source_shares.by_source);
            all.retain(|_, v| {
                v.retain(|&(sn, token, _)| self.holds_reservation(sn, token));
                !v.is_empty()
            });
            self.source_shares.by_source = all;
        }
        self.source_shares
            .by_source
            .entry(src.clone())
            .or_default()
            .push((sn, token, credits));
    }

    /// Makes room for `credits` RX ring entries by reclaiming unused
    /// server sessions (see the module documentation). True if there is
    /// room now.
    pub(crate) fn make_ring_room(&mut self, credits: usize) -> bool {
        if self.ring_entries_available >= credits {
            return true;
        }
        let now = self.clock.now_ns();
        if let Some(idle_ms) = self.config.unused_session_reclaim_ms {
            let idle_ns = idle_ms * 1_000_000;
            while self.ring_entries_available < credits {
                // The oldest server session that may still be unused: the
                // queue is in creation order (entries of sessions that
                // served a request or are gone are dropped as they come
                // up), so finding it costs O(1) amortised, not a walk of
                // all sessions.
                self.drop_stale_unserved();
                let Some(&(sn, _, _)) = self.unserved.front() else {
                    break;
                };
                let old_enough = self
                    .session(sn)
                    .is_some_and(|s| now.saturating_sub(s.created_ns) >= idle_ns);
                if !old_enough {
                    // Every later one is younger.
                    break;
                }
                self.unserved.pop_front();
                self.reclaim(sn, now, "never received a request");
            }
        }
        if self.ring_entries_available >= credits {
            return true;
        }
        self.reclaim_idle_served(credits, now)
    }

    /// The last resort of [`Rpc::make_ring_room`]: server sessions of
    /// erpc-rs clients that served requests but received none for
    /// `RpcConfig::idle_session_reclaim_ms` and run none, least recently
    /// used first (a client that forgot its session without a delivered
    /// disconnect, e.g. after declaring this server failed from its side
    /// alone, would otherwise hold it for ever; the client, if alive, is
    /// told with the reclaim notice). Candidates come from one walk of the
    /// sessions, at most once a second, and are checked again when used.
    /// A C++ client's session is never reclaimed this way: it could not be
    /// told, and it does not detect a session that stopped answering.
    fn reclaim_idle_served(&mut self, credits: usize, now: u64) -> bool {
        let Some(idle_ms) = self.config.idle_session_reclaim_ms else {
            return false;
        };
        let idle_ns = idle_ms.saturating_mul(1_000_000);
        let idle_since = |s: &crate::session::Session<T, C>| -> Option<u64> {
            let svs = s.half.as_server()?;
            let quiet = s.state == SessionState::Connected
                && s.remote_incarnation != 0
                && s.served_any
                && svs
                    .iter()
                    .all(|sv| !sv.busy() && sv.state != crate::session::SrvState::Receiving);
            let last = svs
                .iter()
                .map(|sv| sv.progress_ns)
                .max()
                .unwrap_or(0)
                .max(s.created_ns);
            (quiet && now.saturating_sub(last) >= idle_ns).then_some(last)
        };
        while self.ring_entries_available < credits {
            if self.idle_candidates.is_empty() {
                if self.last_idle_walk_ns != 0
                    && now.saturating_sub(self.last_idle_walk_ns) < 1_000_000_000
                {
                    return false;
                }
                self.last_idle_walk_ns = now.max(1);
                let mut found: Vec<(u64, SessionNum, u64)> = self
                    .sessions
                    .iter()
                    .flatten()
                    .filter_map(|s| idle_since(s).map(|t| (t, s.local_num, s.uniq_token)))
                    .collect();
                // Least recently used last: popped first.
                found.sort_unstable_by(|a, b| b.cmp(a));
                self.idle_candidates = found;
                if self.idle_candidates.is_empty() {
                    return false;
                }
            }
            let Some((_, sn, token)) = self.idle_candidates.pop() else {
                return false;
            };
            let still = self
                .session(sn)
                .is_some_and(|s| s.uniq_token == token && idle_since(s).is_some());
            if still {
                self.stats.sessions_reclaimed_idle += 1;
                self.reclaim(sn, now, "received no request for the idle reclaim time");
            }
        }
        true
    }

    /// Server session `sn` (client token `token`) was just created: it is
    /// a reclaim candidate until it serves a request.
    pub(crate) fn note_unserved(&mut self, sn: SessionNum, token: u64) {
        self.unserved.push_back((sn, token, 0));
    }

    /// Sends a never-used server session's connect response again, at
    /// the session's ages of one SM retry interval times 1, 2, 4 … 2^(n-1)
    /// (n = [`UNSERVED_PROBES`]), to an erpc-rs client. The client that
    /// asked for the session ignores it (or takes it as the answer to a
    /// connect whose response was lost); a client that never asked (a
    /// forged or replayed connect request named it) disowns the session
    /// with a disconnect (`disown_server_session`). One lost disconnect
    /// would otherwise leave that session until the ring runs short; with
    /// n chances it goes unless every probe or answer is lost. Called at
    /// the loss-scan interval; looks at the sessions once per SM retry
    /// interval, newest first, and stops at the first that had all its
    /// probes (every older one had them too).
    pub(crate) fn probe_unserved(&mut self, now: u64) {
        if self.unserved.is_empty() || now < self.next_probe_round_ns {
            return;
        }
        let base = self.config.sm_retry_ms.max(1) * 1_000_000;
        self.next_probe_round_ns = now + base;
        for k in (0..self.unserved.len()).rev() {
            let (sn, token, sent) = self.unserved[k];
            if sent == UNSERVED_PROBES {
                break;
            }
            if sent == NOT_PROBED {
                continue;
            }
            let probe = self.session(sn).and_then(|s| {
                let live = s.role == Role::Server
                    && s.state == SessionState::Connected
                    && s.uniq_token == token
                    && !s.served_any
                    && s.remote_incarnation != 0;
                live.then(|| {
                    let age = now.saturating_sub(s.created_ns);
                    let due = (0..UNSERVED_PROBES)
                        .take_while(|&i| age >= base << i)
                        .count() as u8;
                    let pkt = SmPkt {
                        pkt_type: SmPktType::ConnectResp,
                        err: SmErr::NoError,
                        uniq_token: s.uniq_token,
                        client: s.client_endpoint(),
                        server: s.server_endpoint(),
                    };
                    (due, pkt)
                })
            });
            let Some((due, pkt)) = probe else {
                // Served, gone or a C++ client's: never probed.
                self.unserved[k].2 = NOT_PROBED;
                continue;
            };
            if due > sent {
                self.unserved[k].2 = due;
                self.stats.sm_unserved_probes += 1;
                self.send_sm(&pkt);
            }
        }
    }

    /// Drops the front entries of the unserved queue that no longer name
    /// a connected, never-served server session (also at the loss-scan
    /// interval, so that the queue holds only the sessions created after
    /// the oldest unserved one).
    pub(crate) fn drop_stale_unserved(&mut self) {
        while let Some(&(sn, token, _)) = self.unserved.front() {
            let live = self.session(sn).is_some_and(|s| {
                s.role == Role::Server
                    && s.state == SessionState::Connected
                    && s.uniq_token == token
                    && !s.served_any
            });
            if live {
                return;
            }
            self.unserved.pop_front();
        }
        super::tokens::shrink_if_sparse_deque(&mut self.unserved);
    }

    /// Frees unused server session `sn`, telling an erpc-rs client.
    fn reclaim(&mut self, sn: SessionNum, now: u64, why: &'static str) {
        let s = self.session(sn).expect("a candidate");
        let notice = (s.remote_incarnation != 0).then(|| {
            let mut server = s.server_endpoint();
            server.set_end_reason(crate::sm_types::END_RECLAIMED);
            SmPkt {
                pkt_type: SmPktType::ConnectResp,
                err: SmErr::SrvDisconnected,
                uniq_token: s.uniq_token,
                client: s.client_endpoint(),
                server,
            }
        });
        tracing::info!(
            session = sn,
            client = %s.client_endpoint(),
            why,
            "RX ring short: reclaiming a server session"
        );
        self.stats.sessions_reclaimed += 1;
        self.retire_server_session(sn);
        let Some(notice) = notice else { return };
        self.send_sm(&notice);
        // Keep the number for this session: a late packet of its client
        // must find the record, not a new session.
        if let Some(k) = self.free_session_nums.iter().rposition(|&(n, _)| n == sn) {
            self.free_session_nums.remove(k);
        }
        self.keep_notice(sn, notice, true, now);
    }

    /// The server is ending server session `sn` itself (its application
    /// reset it, or its client was declared failed): an erpc-rs client is
    /// told now, and again when its packets keep coming (see
    /// [`Rpc::renotify`]), so that it never waits for answers that cannot
    /// come. A C++ client cannot be told. Call before the session goes.
    pub(crate) fn notify_server_end(&mut self, sn: SessionNum) {
        let Some(s) = self.session(sn) else { return };
        if s.role != Role::Server || s.remote_incarnation == 0 || s.state != SessionState::Connected
        {
            return;
        }
        let mut server = s.server_endpoint();
        server.set_end_reason(crate::sm_types::END_BY_SERVER);
        let notice = SmPkt {
            pkt_type: SmPktType::ConnectResp,
            err: SmErr::SrvDisconnected,
            uniq_token: s.uniq_token,
            client: s.client_endpoint(),
            server,
        };
        self.stats.sm_end_notices += 1;
        self.send_sm(&notice);
        let now = self.now_ns;
        self.keep_notice(sn, notice, false, now);
    }

    fn keep_notice(&mut self, sn: SessionNum, notice: SmPkt, reserved: bool, now: u64) {
        self.expire_notices(now);
        if self.notices.len() >= MAX_NOTICES {
            self.release_oldest_notice(now);
        }
        self.notices.push_back(Notice {
            session: sn,
            notice,
            at_ns: now,
            last_sent_ns: now,
            reserved,
        });
    }

    fn release_oldest_notice(&mut self, now: u64) {
        if let Some(r) = self.notices.pop_front()
            && r.reserved
        {
            self.free_session_nums.push_back((r.session, now));
        }
    }

    /// Forgets expired records (also at the loss-scan interval).
    pub(crate) fn expire_notices(&mut self, now: u64) {
        while self.notices.front().is_some_and(|r| {
            let memory_ms = if r.reserved {
                RECLAIM_MEMORY_MS
            } else {
                NOTICE_MEMORY_MS
            };
            now.saturating_sub(r.at_ns) >= memory_ms * 1_000_000
        }) {
            self.release_oldest_notice(now);
        }
        super::tokens::shrink_if_sparse_deque(&mut self.notices);
    }

    /// A data packet for session number `sn`, which has no live session
    /// (none, or one the server is ending): if it belonged to a session
    /// the server ended, tell its client again (at most once per SM retry
    /// interval per session).
    #[cold]
    pub(crate) fn renotify(&mut self, sn: SessionNum) {
        let now = self.now_ns;
        self.expire_notices(now);
        let retry_ns = self.config.sm_retry_ms * 1_000_000;
        let Some(r) = self.notices.iter_mut().rev().find(|r| r.session == sn) else {
            return;
        };
        if now.saturating_sub(r.last_sent_ns) < retry_ns {
            return;
        }
        r.last_sent_ns = now;
        let notice = r.notice;
        self.stats.sm_reclaim_notices_resent += 1;
        self.send_sm(&notice);
    }

    /// A connect response that answers none of our connects (nor an
    /// abandoned one): an erpc-rs server made a session for us that we
    /// never asked for — a forged connect request naming us, or one of
    /// ours replayed to a server that has no memory of its token (it
    /// restarted). Nobody would ever use or disconnect that session, so
    /// we disconnect it, once (the server retires only a session with the
    /// response's token, which a forger of this response cannot know for a
    /// session we use). A duplicate response for one of our connected
    /// sessions is not one of these.
    pub(crate) fn disown_server_session(&mut self, pkt: &SmPkt) {
        if pkt.err != SmErr::NoError
            || pkt.server.incarnation() == 0
            || !self.nexus.sm_extensions()
            || pkt.server.session_num == crate::consts::INVALID_SESSION_NUM
        {
            return;
        }
        let ours = self.session(pkt.client.session_num).is_some_and(|s| {
            s.role == Role::Client
                && s.uniq_token == pkt.uniq_token
                && s.remote_num == pkt.server.session_num
                && s.remote_incarnation == pkt.server.incarnation()
        });
        let Some(to) = pkt.server.uri() else { return };
        if ours {
            return;
        }
        let mut d = *pkt;
        d.pkt_type = SmPktType::DisconnectReq;
        self.stats.sm_disowned += 1;
        self.stats.sm_tx += 1;
        self.nexus.sm_send(&to, &d.encode());
    }

    /// An SM response saying the server reclaimed (or otherwise ended) a
    /// connected client session. True if it was for one of ours.
    pub(crate) fn handle_server_disconnected(&mut self, pkt: &SmPkt) -> bool {
        let sn = pkt.client.session_num;
        let ours = self.session(sn).is_some_and(|s| {
            s.role == Role::Client
                && s.state == SessionState::Connected
                && s.uniq_token == pkt.uniq_token
                && s.remote_num == pkt.server.session_num
        });
        if !ours {
            return false;
        }
        // The notice says why (a server that predates the reason byte
        // sends it only for reclaims).
        let cause = if pkt.server.end_reason() == crate::sm_types::END_BY_SERVER {
            super::reset::ResetCause::ServerEnded
        } else {
            super::reset::ResetCause::ServerReclaimed
        };
        tracing::info!(
            session = sn,
            server = %pkt.server,
            ?cause,
            "the server ended the session"
        );
        self.reset_client_session(sn, cause);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn src(host: &str) -> SmSource {
        SmSource::Sim(crate::nexus::Uri::new(host, 0))
    }

    #[test]
    fn a_source_is_its_host_whatever_its_port() {
        let a: std::net::SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let b: std::net::SocketAddr = "10.0.0.1:31850".parse().unwrap();
        assert_eq!(SmSource::Udp(a).host(), SmSource::Udp(b).host());
        assert_ne!(
            SmSource::Udp(a).host(),
            SmSource::Udp("10.0.0.2:4000".parse().unwrap()).host()
        );
        let u = |h, p| SmSource::Sim(crate::nexus::Uri::new(h, p));
        assert_eq!(u("x", 1).host(), u("x", 2).host());
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let mut l = ConnectLimiter::default();
        let a = src("a");
        let b = src("b");
        for _ in 0..8 {
            assert!(l.allow(&a, 0, 8, 4));
        }
        assert!(!l.allow(&a, 0, 8, 4), "burst used up");
        assert!(l.allow(&b, 0, 8, 4), "other sources unaffected");
        // 4 a second: one more after 250 ms, not before.
        assert!(!l.allow(&a, S / 4 - 1, 8, 4));
        assert!(l.allow(&a, S / 4, 8, 4));
        assert!(!l.allow(&a, S / 4, 8, 4));
        // Refills to the burst, no further.
        for _ in 0..8 {
            assert!(l.allow(&a, 100 * S, 8, 4));
        }
        assert!(!l.allow(&a, 100 * S, 8, 4));
        // Burst 0: no limit.
        for _ in 0..1000 {
            assert!(l.allow(&a, 100 * S, 0, 0));
        }
    }

    #[test]
    fn the_source_table_is_bounded() {
        let mut l = ConnectLimiter::default();
        for i in 0..MAX_SOURCES + 100 {
            assert!(l.allow(&src(&format!("h{i}")), 0, 1, 0));
        }
        assert_eq!(l.len(), MAX_SOURCES);
        // The first sources were forgotten (and start with a full bucket).
        assert!(l.allow(&src("h0"), 0, 1, 0));
        assert!(!l.allow(&src(&format!("h{}", MAX_SOURCES + 99)), 0, 1, 0));
    }
}
