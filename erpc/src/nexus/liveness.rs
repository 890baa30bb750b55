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
//!   reveal it; a changed incarnation fails every session made with the
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
//! Nothing here is on the data path: it runs in the SM thread (UDP) or in
//! the simulated SM hub, under one mutex.

use std::collections::BTreeMap;

use super::Uri;
use crate::sm_types::{
    EXT_RPC_BITMAP_BYTES, SM_PKT_BYTES, SmEndpoint, SmErr, SmPkt, SmPktType, TransportType,
};

/// A remote Nexus (or one Rpc of it) that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
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
    /// Fault injection.
    Injected,
}

#[derive(Debug)]
struct RemoteRpc {
    refs: u32,
    /// When the first live session to it was tracked (our clock).
    since_ns: u64,
}

#[derive(Debug)]
struct Peer {
    incarnation: u64,
    last_heard_ns: u64,
    last_ping_ns: Option<u64>,
    rpcs: BTreeMap<u8, RemoteRpc>,
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
    /// Remote Nexuses tracked now.
    pub tracked: u64,
}

/// The keep-alive state of one Nexus.
#[derive(Debug)]
pub(crate) struct Liveness {
    local: Uri,
    incarnation: u64,
    failure_timeout_ns: u64,
    ping_interval_ns: u64,
    peers: BTreeMap<Uri, Peer>,
    stats: LivenessStats,
}

impl Liveness {
    pub(crate) fn new(local: Uri, incarnation: u64, failure_timeout_ns: u64) -> Liveness {
        debug_assert_ne!(incarnation, 0);
        Liveness {
            local,
            incarnation,
            failure_timeout_ns,
            ping_interval_ns: (failure_timeout_ns / crate::consts::PINGS_PER_FAILURE_TIMEOUT)
                .max(1),
            peers: BTreeMap::new(),
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

    fn count(&mut self, cause: FailCause) {
        match cause {
            FailCause::Silent => self.stats.failed_silent += 1,
            FailCause::Restarted => self.stats.failed_restarted += 1,
            FailCause::Injected => self.stats.failed_injected += 1,
        }
    }

    /// A live session to Rpc `rpc_id` of the Nexus at `uri` (incarnation
    /// `inc`, non-zero) exists from now on. Returns a failure if `uri` was
    /// known with another incarnation (the process restarted).
    pub(crate) fn track(
        &mut self,
        uri: &Uri,
        rpc_id: u8,
        inc: u64,
        now_ns: u64,
    ) -> Option<PeerFailure> {
        debug_assert_ne!(inc, 0, "only erpc-rs peers are tracked");
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
            last_heard_ns: now_ns,
            // Ping at the next tick.
            last_ping_ns: None,
            rpcs: BTreeMap::new(),
        });
        let r = p.rpcs.entry(rpc_id).or_insert(RemoteRpc {
            refs: 0,
            since_ns: now_ns,
        });
        r.refs += 1;
        failed
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
                let ping = ping_req(&self.local, self.incarnation, uri, now_ns, bitmap);
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

    /// A ping response (or request) from `from`: it is alive. Returns the
    /// failures it reveals (a restart, Rpcs gone).
    pub(crate) fn heard(
        &mut self,
        from: &SmEndpoint,
        ping_sent_ns: Option<u64>,
        bitmap: Option<&[u8; EXT_RPC_BITMAP_BYTES]>,
        now_ns: u64,
        failed: &mut Vec<PeerFailure>,
    ) {
        let Some(uri) = from.uri() else { return };
        let inc = from.incarnation();
        let Some(p) = self.peers.get_mut(&uri) else {
            return;
        };
        if inc != 0 && inc != p.incarnation {
            let p = self.peers.remove(&uri).expect("present");
            self.count(FailCause::Restarted);
            failed.push(PeerFailure {
                uri,
                incarnation: p.incarnation,
                rpc_id: None,
            });
            return;
        }
        self.stats.pongs_received += u64::from(ping_sent_ns.is_some());
        p.last_heard_ns = p.last_heard_ns.max(now_ns);
        let (Some(sent), Some(bitmap)) = (ping_sent_ns, bitmap) else {
            return;
        };
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

/// A keep-alive ping from `local` to `to`. The token carries the send time
/// on our clock (echoed in the response); the client endpoint carries our
/// incarnation and live-Rpc bitmap. Rpc ids and session numbers are the
/// invalid ones.
fn ping_req(
    local: &Uri,
    inc: u64,
    to: &Uri,
    now_ns: u64,
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
        uniq_token: now_ns,
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
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ep(uri: &Uri, inc: u64) -> SmEndpoint {
        let mut e = SmEndpoint {
            sm_udp_port: uri.port,
            ..SmEndpoint::default()
        };
        e.set_hostname(&uri.host).unwrap();
        e.set_incarnation(inc);
        e
    }

    fn all_rpcs() -> [u8; EXT_RPC_BITMAP_BYTES] {
        [0xff; EXT_RPC_BITMAP_BYTES]
    }

    #[test]
    fn silent_peer_fails_after_the_timeout_and_pings_go_out_meanwhile() {
        let a = Uri::new("a", 1);
        let b = Uri::new("b", 2);
        let mut l = Liveness::new(a, 7, 500 * MS);
        assert!(l.track(&b, 3, 99, 0).is_none());
        let (mut pings, mut failed) = (Vec::new(), Vec::new());
        let mut t = 0;
        while t <= 500 * MS {
            l.tick(t, &all_rpcs(), &mut pings, &mut failed);
            t += 10 * MS;
        }
        assert!(failed.is_empty(), "not before the timeout");
        assert_eq!(pings.len(), 11, "one ping per 50 ms");
        let (to, p) = &pings[0];
        let p = &SmPkt::decode(p).unwrap();
        assert_eq!(to, &b);
        assert_eq!(p.pkt_type, SmPktType::PingReq);
        assert_eq!(p.client.incarnation(), 7);
        assert_eq!(p.client.uri().unwrap(), Uri::new("a", 1));
        l.tick(510 * MS, &all_rpcs(), &mut pings, &mut failed);
        assert_eq!(
            failed,
            vec![PeerFailure {
                uri: b.clone(),
                incarnation: 99,
                rpc_id: None
            }]
        );
        assert_eq!(l.stats().failed_silent, 1);
        assert_eq!(l.stats().tracked, 0);
    }

    #[test]
    fn answers_keep_a_peer_alive_and_untrack_stops_pinging() {
        let b = Uri::new("b", 2);
        let mut l = Liveness::new(Uri::new("a", 1), 7, 500 * MS);
        l.track(&b, 3, 99, 0);
        l.track(&b, 3, 99, 0);
        let (mut pings, mut failed) = (Vec::new(), Vec::new());
        for k in 1..100 {
            let now = k * 50 * MS;
            pings.clear();
            l.tick(now, &all_rpcs(), &mut pings, &mut failed);
            for (_, p) in &pings {
                let r = ping_resp(&SmPkt::decode(p).unwrap(), 99, &all_rpcs());
                l.heard(
                    &r.server,
                    Some(r.uniq_token),
                    Some(&r.server.rpc_bitmap()),
                    now,
                    &mut failed,
                );
            }
        }
        assert!(failed.is_empty());
        l.untrack(&b, 3, 99);
        assert_eq!(l.stats().tracked, 1);
        l.untrack(&b, 3, 99);
        assert_eq!(l.stats().tracked, 0);
        pings.clear();
        l.tick(10_000 * MS, &all_rpcs(), &mut pings, &mut failed);
        assert!(pings.is_empty() && failed.is_empty());
    }

    #[test]
    fn a_new_incarnation_fails_the_old_one() {
        let b = Uri::new("b", 2);
        let mut l = Liveness::new(Uri::new("a", 1), 7, 500 * MS);
        l.track(&b, 3, 99, 0);
        let mut failed = Vec::new();
        l.heard(&ep(&b, 100), None, None, MS, &mut failed);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].incarnation, 99);
        // Sessions to the new incarnation are tracked afresh; one made with
        // a stale incarnation after that fails the newer one.
        assert!(l.track(&b, 3, 100, 2 * MS).is_none());
        let f = l.track(&b, 3, 101, 3 * MS).unwrap();
        assert_eq!(f.incarnation, 100);
        assert_eq!(l.stats().failed_restarted, 2);
        // A C++-style answer (no incarnation) is not a restart.
        failed.clear();
        l.heard(&ep(&b, 0), None, None, 4 * MS, &mut failed);
        assert!(failed.is_empty());
    }

    #[test]
    fn a_dropped_remote_rpc_fails_only_its_sessions_and_only_for_newer_pings() {
        let b = Uri::new("b", 2);
        let mut l = Liveness::new(Uri::new("a", 1), 7, 500 * MS);
        l.track(&b, 3, 99, 10 * MS);
        l.track(&b, 4, 99, 10 * MS);
        let mut only4 = [0u8; EXT_RPC_BITMAP_BYTES];
        set_bit(&mut only4, 4);
        let mut failed = Vec::new();
        // A response to a ping sent before the session existed proves nothing.
        l.heard(
            &ep(&b, 99),
            Some(5 * MS),
            Some(&only4),
            20 * MS,
            &mut failed,
        );
        assert!(failed.is_empty());
        l.heard(
            &ep(&b, 99),
            Some(15 * MS),
            Some(&only4),
            20 * MS,
            &mut failed,
        );
        assert_eq!(
            failed,
            vec![PeerFailure {
                uri: b.clone(),
                incarnation: 99,
                rpc_id: Some(3)
            }]
        );
        assert_eq!(l.stats().tracked, 1, "Rpc 4 is still tracked");
    }

    #[test]
    fn ping_response_echoes_the_token_and_carries_the_responder() {
        let mut pings = Vec::new();
        let mut l = Liveness::new(Uri::new("a", 1), 7, 500 * MS);
        l.track(&Uri::new("b", 2), 0, 99, 0);
        l.tick(0, &all_rpcs(), &mut pings, &mut Vec::new());
        let mut bm = [0u8; EXT_RPC_BITMAP_BYTES];
        set_bit(&mut bm, 200);
        let req = SmPkt::decode(&pings[0].1).unwrap();
        let r = ping_resp(&req, 99, &bm);
        assert_eq!(r.pkt_type, SmPktType::PingResp);
        assert_eq!(r.uniq_token, req.uniq_token);
        assert_eq!(r.server.incarnation(), 99);
        assert!(bit(&r.server.rpc_bitmap(), 200) && !bit(&r.server.rpc_bitmap(), 3));
        assert_eq!(SmPkt::decode(&r.encode()), Ok(r));
    }
}
