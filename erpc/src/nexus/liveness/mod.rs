//! Failure detection between Nexuses: keep-alive pings.
//!
//! Each Nexus pings every remote Nexus it has a live session with (client
//! or server side), [`PINGS_PER_FAILURE_TIMEOUT`] times per failure timeout,
//! with SM ping requests; the remote Nexus's SM router answers them itself
//! (no Rpc is involved). A remote that answers nothing for the failure
//! timeout is declared failed, and every Rpc of this Nexus resets its
//! sessions to it. Tracking is per remote URI, like the C++ heartbeat
//! manager, so a process with many sessions to one peer sends one ping
//! stream.
//!
//! Two more facts come back with every ping response (erpc-rs peers only,
//! in the endpoint's routing-info tail, see [`crate::sm_types::EXT_INCARNATION`]):
//!
//! * the remote Nexus's **incarnation**: a restarted process behind an
//!   unchanged URI answers pings at once, so silence alone would never
//!   reveal it; a newer incarnation fails every session made with the
//!   old one;
//! * the **Rpc ids registered** at the remote Nexus: an Rpc that was
//!   dropped while its process lives on fails the sessions to it (only for
//!   pings sent after the session was tracked, so a response that left
//!   before the Rpc registered cannot fail a new session).
//!
//! Peers that do not carry an incarnation (the C++ eRPC) are never pinged:
//! its SM thread indexes its Rpc table with the invalid Rpc id a ping
//! carries (one past the end) or throws when a ping reaches an Rpc. Their
//! sessions fall back to a data-path rule in the Rpc: a session whose
//! requests all made no progress for the failure timeout fails.
//!
//! # Forged and stale packets
//!
//! SM packets carry no authentication, and whatever a packet says about
//! its sender is a claim. So a packet changes what we believe of peer P
//! only under these rules:
//!
//! * **Its source is P's.** The SM link reports where a packet really came
//!   from (a UDP datagram's source address; the sending Nexus in the
//!   simulated hub) and whether that is P's resolved address (its IPv4
//!   address and SM port: erpc-rs sends session management from its SM
//!   socket). Packets that only *claim* P prove nothing: they neither keep
//!   P alive nor fail it.
//! * **A ping response answers a ping we sent.** Each ping carries a
//!   random 64-bit token, remembered per peer (the last
//!   [`OUTSTANDING_PINGS`]); a response is taken only for a remembered
//!   token, once, and its send time is ours, not the packet's.
//! * **Incarnations only move forward.** An incarnation is the Nexus's
//!   creation time (milliseconds since the Unix epoch, or microseconds of
//!   virtual time in a simulation) in its high bits and 20 random bits
//!   below ([`incarnation_at`]), so a restarted process has a larger one
//!   than its predecessor. A newer incarnation from P's address fails
//!   every session to the older one; an older one is a packet of a dead
//!   process (late, replayed or forged) and is ignored, and a session made
//!   with it fails alone ([`Track::Stale`]) without touching the live
//!   ones. If a host's clock steps back across a restart, the new process
//!   looks older: its peers ignore its incarnation until the old one stays
//!   silent for the failure timeout, and then take it.
//!
//! The C++ eRPC has no incarnation (the routing-info tail it sends is
//! zero) and is never pinged, so none of this applies to C++ peers; their
//! packets are routed as before.
//!
//! Nothing here is on the data path: it runs in the SM thread (UDP) or in
//! the simulated SM hub, under one mutex.

use std::collections::{BTreeMap, VecDeque};

use super::Uri;
use crate::rng::Rng;
use crate::sm_types::{
    EXT_RPC_BITMAP_BYTES, SM_PKT_BYTES, SmEndpoint, SmErr, SmPkt, SmPktType, TransportType,
};

/// A remote Nexus (or one Rpc of it) that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerFailure {
    /// The remote Nexus.
    pub uri: Uri,
    /// Its incarnation the failure applies to (0: any incarnation, as a
    /// fault injection that names only the URI).
    pub incarnation: u64,
    /// `Some(id)` if only that remote Rpc is gone; `None` for the process.
    pub rpc_id: Option<u8>,
}

/// Why a remote was declared failed (for counters and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailCause {
    /// No ping answered for the failure timeout.
    Silent,
    /// The URI answered with another incarnation (restarted process).
    Restarted,
    /// Fault injection (`Nexus::fault_fail_remote`, `testing` feature).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Injected,
}

#[derive(Debug)]
struct RemoteRpc {
    refs: u32,
    /// When the first live session to it was tracked (our clock).
    since_ns: u64,
}

/// Pings to one peer whose answers are still taken: a ping older than
/// this many ping intervals is past the failure timeout anyway.
pub(crate) const OUTSTANDING_PINGS: usize = crate::consts::PINGS_PER_FAILURE_TIMEOUT as usize + 2;
const _: () = assert!(
    OUTSTANDING_PINGS == 12,
    "LivenessStats::unmatched_tokens says 12"
);

/// Random bits below the creation time in an incarnation.
const INCARNATION_RANDOM_BITS: u32 = 20;

/// The incarnation of a Nexus created at `time` (milliseconds since the
/// Unix epoch, or microseconds of virtual time) with random bits `random`:
/// non-zero, and larger for a later creation time whatever the random
/// bits (see the module documentation).
pub(crate) fn incarnation_at(time: u64, random: u64) -> u64 {
    let mask = (1u64 << INCARNATION_RANDOM_BITS) - 1;
    ((time + 1) << INCARNATION_RANDOM_BITS) | (random & mask)
}

#[derive(Debug)]
struct Peer {
    incarnation: u64,
    /// The incarnation is confirmed: it came in a packet from the peer's
    /// address (or in a connect response to our token). An unconfirmed one
    /// (from a connect request we could not check the source of) gives way
    /// to any confirmed one, older or newer.
    confirmed: bool,
    last_heard_ns: u64,
    last_ping_ns: Option<u64>,
    /// When the last ping response taken from it arrived.
    last_pong_ns: Option<u64>,
    /// Pings sent and not answered yet: (token, send time), oldest first.
    outstanding: VecDeque<(u64, u64)>,
    rpcs: BTreeMap<u8, RemoteRpc>,
}

/// What [`Liveness::track`] made of a new session's remote incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Track {
    /// Tracked (with the failure of an older incarnation it replaced, if
    /// any).
    Tracked(Option<PeerFailure>),
    /// Not tracked: the incarnation is older than the one tracked (a dead
    /// process), or newer but from a packet whose source is not the
    /// peer's. The session must fail alone.
    Stale,
}

/// Liveness counters of one Nexus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LivenessStats {
    /// Ping requests sent.
    pub pings_sent: u64,
    /// Ping requests answered (from any Nexus).
    pub pings_answered: u64,
    /// Ping responses received from tracked peers.
    pub pongs_received: u64,
    /// Remotes declared failed for silence.
    pub failed_silent: u64,
    /// Remotes found restarted (new incarnation).
    pub failed_restarted: u64,
    /// Remote Rpcs found gone from a live Nexus.
    pub failed_rpc_gone: u64,
    /// Failures injected.
    pub failed_injected: u64,
    /// Ping requests and responses that claimed a tracked peer but did not
    /// come from its address (forged, or from a host we have not resolved):
    /// they neither kept it alive nor failed it.
    pub unverified_source: u64,
    /// Ping responses whose token answers no ping we sent to that peer
    /// (forged, replayed, duplicated, or older than the last 12 pings):
    /// ignored.
    pub unmatched_tokens: u64,
    /// Ping requests and responses, and new sessions, that carried an
    /// incarnation older than the one tracked (a dead process's packet,
    /// late or replayed), or a newer one from a source that is not the
    /// peer's: ignored (a new session with it fails alone).
    pub stale_incarnations: u64,
    /// Ticks that came more than a ping interval after the previous one
    /// (the SM thread was descheduled or blocked): the silence of that
    /// stretch was not held against any peer.
    pub pauses_discounted: u64,
    /// Remote Nexuses tracked now.
    pub tracked: u64,
}

/// One remote Nexus the keep-alive tracks, as of a moment (`*_ago_ns`:
/// nanoseconds before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLiveness {
    /// Its URI.
    pub uri: Uri,
    /// Its incarnation.
    pub incarnation: u64,
    /// Since the last ping response taken from it arrived (`None`: none
    /// yet).
    pub last_pong_ago_ns: Option<u64>,
    /// Since the moment it was last proven alive (the send time of the
    /// newest ping it answered, or when tracking began): it is declared
    /// failed when this passes the failure timeout.
    pub alive_ago_ns: u64,
    /// Since the last ping sent to it (`None`: none yet).
    pub last_ping_ago_ns: Option<u64>,
    /// Pings sent and not answered (the last 12 at most).
    pub pings_outstanding: usize,
    /// Its Rpcs this Nexus has live sessions with.
    pub rpcs: Vec<u8>,
}

/// The keep-alive state of one Nexus.
#[derive(Debug)]
pub(crate) struct Liveness {
    local: Uri,
    incarnation: u64,
    failure_timeout_ns: u64,
    ping_interval_ns: u64,
    peers: BTreeMap<Uri, Peer>,
    /// When `tick` last ran: a longer gap than a ping interval is time
    /// this Nexus did not watch, discounted (see `tick`).
    last_tick_ns: Option<u64>,
    /// Ping tokens.
    rng: Rng,
    stats: LivenessStats,
}

impl Liveness {
    pub(crate) fn new(
        local: Uri,
        incarnation: u64,
        failure_timeout_ns: u64,
        token_seed: u64,
    ) -> Liveness {
        debug_assert_ne!(incarnation, 0);
        Liveness {
            rng: Rng::new(token_seed),
            local,
            incarnation,
            failure_timeout_ns,
            ping_interval_ns: (failure_timeout_ns / crate::consts::PINGS_PER_FAILURE_TIMEOUT)
                .max(1),
            peers: BTreeMap::new(),
            last_tick_ns: None,
            stats: LivenessStats::default(),
        }
    }

    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub(crate) fn failure_timeout_ns(&self) -> u64 {
        self.failure_timeout_ns
    }

    /// How often `tick` has work to do.
    pub(crate) fn tick_interval_ns(&self) -> u64 {
        self.ping_interval_ns
    }

    pub(crate) fn stats(&self) -> LivenessStats {
        LivenessStats {
            tracked: self.peers.len() as u64,
            ..self.stats
        }
    }

    /// Every tracked peer as of `now_ns` (for the debug endpoint).
    pub(crate) fn peers(&self, now_ns: u64) -> Vec<PeerLiveness> {
        self.peers
            .iter()
            .map(|(uri, p)| PeerLiveness {
                uri: uri.clone(),
                incarnation: p.incarnation,
                last_pong_ago_ns: p.last_pong_ns.map(|t| now_ns.saturating_sub(t)),
                alive_ago_ns: now_ns.saturating_sub(p.last_heard_ns),
                last_ping_ago_ns: p.last_ping_ns.map(|t| now_ns.saturating_sub(t)),
                pings_outstanding: p.outstanding.len(),
                rpcs: p.rpcs.keys().copied().collect(),
            })
            .collect()
    }

    fn count(&mut self, cause: FailCause) {
        match cause {
            FailCause::Silent => self.stats.failed_silent += 1,
            FailCause::Restarted => self.stats.failed_restarted += 1,
            FailCause::Injected => self.stats.failed_injected += 1,
        }
    }

    /// Whether a session to the Nexus at `uri` made with incarnation `inc`
    /// (non-zero) could be tracked now: `uri` is not tracked, or with
    /// `inc`, or with an older incarnation and `verified` (the packet that
    /// named `inc` came from `uri`'s address). See [`Liveness::track`].
    pub(crate) fn may_track(&self, uri: &Uri, inc: u64, verified: bool) -> bool {
        match self.peers.get(uri) {
            None => true,
            Some(p) => p.incarnation == inc || (verified && (inc > p.incarnation || !p.confirmed)),
        }
    }

    /// A live session to Rpc `rpc_id` of the Nexus at `uri` (incarnation
    /// `inc`, non-zero) exists from now on. `verified`: the packet that
    /// named `inc` came from `uri`'s address, or answered a token only the
    /// peer could know (a connect response). If `uri` was tracked with an
    /// older incarnation (or an unconfirmed one) and `verified`, the old
    /// one failed (the process restarted); if it was tracked with a newer
    /// one, or the change is not verified, the session is
    /// [`Track::Stale`].
    pub(crate) fn track(
        &mut self,
        uri: &Uri,
        rpc_id: u8,
        inc: u64,
        verified: bool,
        now_ns: u64,
    ) -> Track {
        debug_assert_ne!(inc, 0, "only erpc-rs peers are tracked");
        if !self.may_track(uri, inc, verified) {
            self.stats.stale_incarnations += 1;
            return Track::Stale;
        }
        let mut failed = None;
        if let Some(p) = self.peers.get(uri)
            && p.incarnation != inc
        {
            failed = Some(PeerFailure {
                uri: uri.clone(),
                incarnation: p.incarnation,
                rpc_id: None,
            });
            self.peers.remove(uri);
            self.count(FailCause::Restarted);
        }
        let p = self.peers.entry(uri.clone()).or_insert_with(|| Peer {
            incarnation: inc,
            confirmed: false,
            last_heard_ns: now_ns,
            // Ping at the next tick.
            last_ping_ns: None,
            last_pong_ns: None,
            outstanding: VecDeque::new(),
            rpcs: BTreeMap::new(),
        });
        p.confirmed |= verified;
        let r = p.rpcs.entry(rpc_id).or_insert(RemoteRpc {
            refs: 0,
            since_ns: now_ns,
        });
        r.refs += 1;
        Track::Tracked(failed)
    }

    /// A session tracked with [`Liveness::track`] is gone.
    pub(crate) fn untrack(&mut self, uri: &Uri, rpc_id: u8, inc: u64) {
        let Some(p) = self.peers.get_mut(uri) else {
            return;
        };
        if p.incarnation != inc {
            return;
        }
        if let Some(r) = p.rpcs.get_mut(&rpc_id) {
            r.refs -= 1;
            if r.refs == 0 {
                p.rpcs.remove(&rpc_id);
            }
        }
        if p.rpcs.is_empty() {
            self.peers.remove(uri);
        }
    }

    /// Pings due now (appended to `pings`, encoded), and peers silent for
    /// the failure timeout. Allocates nothing unless a ping is due or a
    /// peer failed.
    pub(crate) fn tick(
        &mut self,
        now_ns: u64,
        bitmap: &[u8; EXT_RPC_BITMAP_BYTES],
        pings: &mut Vec<(Uri, [u8; SM_PKT_BYTES])>,
        failed: &mut Vec<PeerFailure>,
    ) {
        self.discount_pause(now_ns);
        let mut dead = Vec::new();
        let before = pings.len();
        for (uri, p) in self.peers.iter_mut() {
            if now_ns.saturating_sub(p.last_heard_ns) > self.failure_timeout_ns {
                dead.push(uri.clone());
                continue;
            }
            if p.last_ping_ns
                .is_none_or(|t| now_ns.saturating_sub(t) >= self.ping_interval_ns)
            {
                p.last_ping_ns = Some(now_ns);
                let token = self.rng.next_u64();
                if p.outstanding.len() >= OUTSTANDING_PINGS {
                    p.outstanding.pop_front();
                }
                p.outstanding.push_back((token, now_ns));
                let ping = ping_req(&self.local, self.incarnation, uri, token, bitmap);
                pings.push((uri.clone(), ping.encode()));
            }
        }
        self.stats.pings_sent += (pings.len() - before) as u64;
        for uri in dead {
            let p = self.peers.remove(&uri).expect("listed above");
            self.count(FailCause::Silent);
            failed.push(PeerFailure {
                uri,
                incarnation: p.incarnation,
                rpc_id: None,
            });
        }
    }

    /// The caller ticks at least once per ping interval. A longer gap
    /// means this Nexus itself did not run (its SM thread descheduled, as
    /// on a loaded machine, or the process stopped): pongs may be waiting
    /// unread, and no ping went out. That stretch is not evidence against
    /// any peer, so every peer's silence is counted from that much later
    /// (never later than now). A peer that really died is then declared
    /// failed one pause later than otherwise.
    fn discount_pause(&mut self, now_ns: u64) {
        let prev = self.last_tick_ns.replace(now_ns);
        let Some(prev) = prev else { return };
        let excess = now_ns
            .saturating_sub(prev)
            .saturating_sub(self.ping_interval_ns);
        if excess == 0 {
            return;
        }
        self.stats.pauses_discounted += 1;
        for p in self.peers.values_mut() {
            p.last_heard_ns = p.last_heard_ns.saturating_add(excess).min(now_ns);
        }
    }

    /// Checks the incarnation `inc` a ping request or response from
    /// `uri`'s address carries against the one tracked. `None`: the packet
    /// is stale (or carries none) and proves nothing; `Some(true)`: the
    /// peer restarted, or the incarnation we tracked was never its own
    /// (the old one failed, pushed to `failed`); `Some(false)`: the
    /// tracked incarnation, confirmed now.
    fn check_incarnation(
        &mut self,
        uri: &Uri,
        inc: u64,
        failed: &mut Vec<PeerFailure>,
    ) -> Option<bool> {
        let p = self.peers.get_mut(uri)?;
        if inc == p.incarnation {
            p.confirmed = true;
            return Some(false);
        }
        if inc == 0 || (inc < p.incarnation && p.confirmed) {
            self.stats.stale_incarnations += 1;
            return None;
        }
        let p = self.peers.remove(uri).expect("present");
        self.count(FailCause::Restarted);
        failed.push(PeerFailure {
            uri: uri.clone(),
            incarnation: p.incarnation,
            rpc_id: None,
        });
        Some(true)
    }

    /// A ping request from `from`; `verified`: its source is `from`'s
    /// address. From a tracked peer's address with a newer incarnation it
    /// reveals a restart (pushed to `failed`). It never proves the peer
    /// alive: a ping request answers nothing of ours, so a recorded one
    /// replayed from a dead peer's address would keep it alive forever.
    /// Only responses to our own pings do.
    pub(crate) fn heard_ping(
        &mut self,
        from: &SmEndpoint,
        verified: bool,
        failed: &mut Vec<PeerFailure>,
    ) {
        let Some(uri) = from.uri() else { return };
        if !self.peers.contains_key(&uri) {
            return;
        }
        if !verified {
            self.stats.unverified_source += 1;
            return;
        }
        self.check_incarnation(&uri, from.incarnation(), failed);
    }

    /// A ping response from `from` with `token` and the live-Rpc `bitmap`;
    /// `verified`: its source is `from`'s address. Taken only if it
    /// answers a ping we sent to that peer and have not seen answered:
    /// then the peer is alive, restarted (a newer incarnation), or missing
    /// some Rpcs; failures go to `failed`.
    pub(crate) fn heard_pong(
        &mut self,
        from: &SmEndpoint,
        token: u64,
        bitmap: &[u8; EXT_RPC_BITMAP_BYTES],
        verified: bool,
        now_ns: u64,
        failed: &mut Vec<PeerFailure>,
    ) {
        let Some(uri) = from.uri() else { return };
        let Some(p) = self.peers.get_mut(&uri) else {
            return;
        };
        if !verified {
            self.stats.unverified_source += 1;
            return;
        }
        let Some(k) = p.outstanding.iter().position(|&(t, _)| t == token) else {
            self.stats.unmatched_tokens += 1;
            return;
        };
        let (_, sent) = p.outstanding.remove(k).expect("found");
        match self.check_incarnation(&uri, from.incarnation(), failed) {
            Some(false) => {}
            Some(true) | None => return,
        }
        self.stats.pongs_received += 1;
        let p = self.peers.get_mut(&uri).expect("tracked");
        // It proves the peer alive after the ping left, not at arrival: a
        // response held back (or replayed once, its first copy lost)
        // cannot stretch a dead peer's life.
        p.last_heard_ns = p.last_heard_ns.max(sent.min(now_ns));
        p.last_pong_ns = Some(now_ns);
        let gone: Vec<u8> = p
            .rpcs
            .iter()
            .filter(|&(&id, r)| !bit(bitmap, id) && sent > r.since_ns)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            p.rpcs.remove(&id);
            self.stats.failed_rpc_gone += 1;
            failed.push(PeerFailure {
                uri: uri.clone(),
                incarnation: p.incarnation,
                rpc_id: Some(id),
            });
        }
        if p.rpcs.is_empty() {
            self.peers.remove(&uri);
        }
    }

    /// Fault injection: declare `uri` failed now.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn inject_failure(&mut self, uri: &Uri) -> PeerFailure {
        let incarnation = self.peers.remove(uri).map_or(0, |p| p.incarnation);
        self.count(FailCause::Injected);
        PeerFailure {
            uri: uri.clone(),
            // A URI we do not track (e.g. a C++ peer): fail any incarnation.
            incarnation,
            rpc_id: None,
        }
    }

    pub(crate) fn answered_ping(&mut self) {
        self.stats.pings_answered += 1;
    }
}

#[inline]
fn bit(bitmap: &[u8; EXT_RPC_BITMAP_BYTES], id: u8) -> bool {
    bitmap[usize::from(id / 8)] & (1 << (id % 8)) != 0
}

/// Sets bit `id` of a live-Rpc bitmap.
pub(crate) fn set_bit(bitmap: &mut [u8; EXT_RPC_BITMAP_BYTES], id: u8) {
    bitmap[usize::from(id / 8)] |= 1 << (id % 8);
}

/// A keep-alive ping from `local` to `to`. The token is random (echoed in
/// the response, which is taken only for a token we sent); the client
/// endpoint carries our incarnation and live-Rpc bitmap. Rpc ids and
/// session numbers are the invalid ones.
fn ping_req(
    local: &Uri,
    inc: u64,
    to: &Uri,
    token: u64,
    bitmap: &[u8; EXT_RPC_BITMAP_BYTES],
) -> SmPkt {
    let mut client = SmEndpoint {
        transport_type: TransportType::Raw,
        rpc_id: u8::MAX,
        sm_udp_port: local.port,
        ..SmEndpoint::default()
    };
    // URIs are checked to fit when they are made.
    let _ = client.set_hostname(&local.host);
    client.set_rpc_bitmap(bitmap);
    client.set_incarnation(inc);
    let mut server = SmEndpoint {
        transport_type: TransportType::Raw,
        rpc_id: u8::MAX,
        sm_udp_port: to.port,
        ..SmEndpoint::default()
    };
    let _ = server.set_hostname(&to.host);
    SmPkt {
        pkt_type: SmPktType::PingReq,
        err: SmErr::NoError,
        uniq_token: token,
        client,
        server,
    }
}

/// The answer to a ping request: the request echoed with the response
/// type, our incarnation and live-Rpc bitmap in the server endpoint.
pub(crate) fn ping_resp(req: &SmPkt, inc: u64, bitmap: &[u8; EXT_RPC_BITMAP_BYTES]) -> SmPkt {
    let mut r = req.response(SmErr::NoError);
    r.server.routing_info = [0; transport::ROUTING_INFO_BYTES];
    r.server.set_rpc_bitmap(bitmap);
    r.server.set_incarnation(inc);
    r
}

#[cfg(test)]
mod tests;
