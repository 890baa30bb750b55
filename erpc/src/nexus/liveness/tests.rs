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

fn new(inc: u64) -> Liveness {
    Liveness::new(Uri::new("a", 1), inc, 500 * MS, 42)
}

fn tracked(t: Track) -> Option<PeerFailure> {
    match t {
        Track::Tracked(f) => f,
        Track::Stale => panic!("stale"),
    }
}

/// Ticks at `now` and answers every ping due as the peer with
/// incarnation `inc` and live Rpcs `bm` would (from its address).
fn answer_pings(
    l: &mut Liveness,
    now: u64,
    inc: u64,
    bm: &[u8; EXT_RPC_BITMAP_BYTES],
    failed: &mut Vec<PeerFailure>,
) -> usize {
    let mut pings = Vec::new();
    l.tick(now, &all_rpcs(), &mut pings, failed);
    for (_, p) in &pings {
        let r = ping_resp(&SmPkt::decode(p).unwrap(), inc, bm);
        l.heard_pong(
            &r.server,
            r.uniq_token,
            &r.server.rpc_bitmap(),
            true,
            now,
            failed,
        );
    }
    pings.len()
}

#[test]
fn incarnations_grow_with_creation_time_whatever_the_random_bits() {
    assert_ne!(incarnation_at(0, 0), 0);
    assert!(incarnation_at(1, 0) > incarnation_at(0, u64::MAX));
    let t = 1_800_000_000_000; // ms since the epoch, in 2027
    assert!(incarnation_at(t + 1, 0) > incarnation_at(t, u64::MAX));
    assert!(incarnation_at(t, u64::MAX) < 1 << 62);
}

#[test]
fn silent_peer_fails_after_the_timeout_and_pings_go_out_meanwhile() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    assert_eq!(l.track(&b, 3, 99, false, 0), Track::Tracked(None));
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
    let tokens: std::collections::BTreeSet<u64> = pings
        .iter()
        .map(|(_, p)| SmPkt::decode(p).unwrap().uniq_token)
        .collect();
    assert_eq!(tokens.len(), 11, "a fresh random token per ping");
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
fn a_paused_sm_thread_does_not_fail_its_peers_but_a_dead_peer_still_fails() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, false, 0);
    let mut failed = Vec::new();
    for k in 1..=20 {
        answer_pings(&mut l, k * 50 * MS, 99, &all_rpcs(), &mut failed);
    }
    // The Nexus's own thread is off the CPU for 700 ms (more than the
    // 500 ms failure timeout): its first tick after that judges nobody.
    let mut pings = Vec::new();
    l.tick(1_700 * MS, &all_rpcs(), &mut pings, &mut failed);
    assert!(failed.is_empty(), "the pause is not the peer's silence");
    assert_eq!(l.stats().pauses_discounted, 1);
    assert_eq!(pings.len(), 1, "a ping goes out at once");
    // The peer answers from now on: alive.
    for k in 1..=20 {
        answer_pings(
            &mut l,
            1_700 * MS + k * 50 * MS,
            99,
            &all_rpcs(),
            &mut failed,
        );
    }
    assert!(failed.is_empty());
    assert_eq!(
        l.stats().pauses_discounted,
        1,
        "regular ticks discount nothing"
    );
    // Then it dies: declared failed once it has been silent for the
    // timeout while this Nexus was running.
    let mut t = 2_700 * MS;
    while failed.is_empty() {
        t += 10 * MS;
        l.tick(t, &all_rpcs(), &mut pings, &mut failed);
    }
    assert_eq!(t, 3_210 * MS);
    assert_eq!(failed[0].uri, b);
    assert_eq!(l.stats().failed_silent, 1);
}

#[test]
fn answers_keep_a_peer_alive_and_untrack_stops_pinging() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, false, 0);
    l.track(&b, 3, 99, false, 0);
    let mut failed = Vec::new();
    for k in 1..100 {
        answer_pings(&mut l, k * 50 * MS, 99, &all_rpcs(), &mut failed);
    }
    assert!(failed.is_empty());
    assert_eq!(l.stats().pongs_received, 99);
    l.untrack(&b, 3, 99);
    assert_eq!(l.stats().tracked, 1);
    l.untrack(&b, 3, 99);
    assert_eq!(l.stats().tracked, 0);
    let mut pings = Vec::new();
    l.tick(10_000 * MS, &all_rpcs(), &mut pings, &mut failed);
    assert!(pings.is_empty() && failed.is_empty());
}

#[test]
fn a_newer_incarnation_from_the_peer_fails_the_old_one() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, false, 0);
    let mut failed = Vec::new();
    l.heard_ping(&ep(&b, 100), true, &mut failed);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].incarnation, 99);
    // Sessions to the new incarnation are tracked afresh; a newer one
    // named by a connect request from the peer's address replaces it.
    assert_eq!(l.track(&b, 3, 100, false, 2 * MS), Track::Tracked(None));
    let f = tracked(l.track(&b, 3, 101, true, 3 * MS)).unwrap();
    assert_eq!(f.incarnation, 100);
    assert_eq!(l.stats().failed_restarted, 2);
}

/// Issue 30: one packet claiming the peer, with another incarnation,
/// failed every session to it. Now only a newer incarnation from the
/// peer's address does; stale ones (a dead process's packets, late or
/// replayed) and unverified ones change nothing.
#[test]
fn forged_and_stale_incarnations_change_nothing() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, true, 0);
    let mut failed = Vec::new();
    // Claims the peer, from elsewhere: newer or older, request or
    // response.
    l.heard_ping(&ep(&b, 100), false, &mut failed);
    l.heard_ping(&ep(&b, 98), false, &mut failed);
    // From the peer's address, but older (a replay of the process
    // that ran there before), or without an incarnation.
    l.heard_ping(&ep(&b, 98), true, &mut failed);
    l.heard_ping(&ep(&b, 0), true, &mut failed);
    assert!(failed.is_empty(), "{failed:?}");
    // A session made with an older incarnation, or with a newer one
    // from a packet that does not come from the peer, is stale and
    // fails alone.
    assert!(!l.may_track(&b, 98, true));
    assert_eq!(l.track(&b, 3, 98, true, MS), Track::Stale);
    assert!(!l.may_track(&b, 100, false));
    assert_eq!(l.track(&b, 3, 100, false, MS), Track::Stale);
    assert!(l.may_track(&b, 99, false));
    assert!(l.may_track(&Uri::new("c", 3), 5, false), "untracked");
    // A ping response: only from the peer's address, only for a
    // token we sent, only once.
    let mut pings = Vec::new();
    l.tick(2 * MS, &all_rpcs(), &mut pings, &mut failed);
    let req = SmPkt::decode(&pings[0].1).unwrap();
    let empty = [0u8; EXT_RPC_BITMAP_BYTES];
    let newer = ping_resp(&req, 100, &empty);
    l.heard_pong(
        &newer.server,
        req.uniq_token,
        &empty,
        false,
        3 * MS,
        &mut failed,
    );
    l.heard_pong(
        &newer.server,
        req.uniq_token ^ 1,
        &empty,
        true,
        3 * MS,
        &mut failed,
    );
    let older = ping_resp(&req, 98, &empty);
    l.heard_pong(
        &older.server,
        req.uniq_token,
        &empty,
        true,
        3 * MS,
        &mut failed,
    );
    l.heard_pong(
        &newer.server,
        req.uniq_token,
        &empty,
        true,
        3 * MS,
        &mut failed,
    );
    assert!(failed.is_empty(), "{failed:?}");
    let s = l.stats();
    assert_eq!(
        (
            s.unverified_source,
            s.unmatched_tokens,
            s.stale_incarnations
        ),
        (3, 2, 5),
        "{s:?}"
    );
    assert_eq!(
        (s.failed_restarted, s.failed_rpc_gone, s.tracked),
        (0, 0, 1)
    );
    // None of them kept the peer alive either: it fails for silence
    // (ticking as the SM thread does: a longer gap is discounted).
    for t in 1..=60 {
        l.tick(t * 10 * MS, &all_rpcs(), &mut pings, &mut failed);
    }
    assert_eq!(failed.len(), 1);
    assert_eq!(l.stats().failed_silent, 1);
}

#[test]
fn a_response_to_a_ping_we_sent_may_reveal_a_restart() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, false, 0);
    let mut failed = Vec::new();
    answer_pings(&mut l, MS, 100, &all_rpcs(), &mut failed);
    assert_eq!(failed.len(), 1);
    assert_eq!((failed[0].incarnation, failed[0].rpc_id), (99, None));
    assert_eq!(l.stats().failed_restarted, 1);
}

#[test]
fn a_dropped_remote_rpc_fails_only_its_sessions_and_only_for_newer_pings() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    let mut pings = Vec::new();
    let mut failed = Vec::new();
    l.track(&b, 3, 99, false, 0);
    // A ping that left before the sessions to Rpc 4 existed.
    l.tick(5 * MS, &all_rpcs(), &mut pings, &mut failed);
    l.track(&b, 3, 99, false, 10 * MS);
    l.track(&b, 4, 99, false, 10 * MS);
    l.tick(60 * MS, &all_rpcs(), &mut pings, &mut failed);
    assert_eq!(pings.len(), 2);
    let mut only4 = [0u8; EXT_RPC_BITMAP_BYTES];
    set_bit(&mut only4, 4);
    let early = SmPkt::decode(&pings[0].1).unwrap();
    let r = ping_resp(&early, 99, &only4);
    // Rpc 3 was tracked at 0, before that ping: it is gone.
    l.heard_pong(&r.server, r.uniq_token, &only4, true, 61 * MS, &mut failed);
    assert_eq!(
        failed,
        vec![PeerFailure {
            uri: b.clone(),
            incarnation: 99,
            rpc_id: Some(3)
        }]
    );
    failed.clear();
    // Rpc 4's session is younger than that ping: only a later one
    // proves anything about it.
    let mut none = [0u8; EXT_RPC_BITMAP_BYTES];
    set_bit(&mut none, 200);
    let mut l2 = new(7);
    l2.track(&b, 4, 99, false, 10 * MS);
    let mut p2 = Vec::new();
    l2.tick(5 * MS, &all_rpcs(), &mut p2, &mut failed);
    let old = SmPkt::decode(&p2[0].1).unwrap();
    let r = ping_resp(&old, 99, &none);
    l2.heard_pong(&r.server, r.uniq_token, &none, true, 20 * MS, &mut failed);
    assert!(failed.is_empty());
    assert_eq!(l2.stats().tracked, 1, "Rpc 4 is still tracked");
    assert_eq!(l.stats().tracked, 1, "Rpc 4 is still tracked");
}

/// The answer to any ping sent within the failure timeout is taken
/// (the earliest one too), once.
#[test]
fn every_ping_within_the_failure_timeout_may_be_answered_once() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, true, 0);
    let (mut pings, mut failed) = (Vec::new(), Vec::new());
    for k in 0..=10 {
        l.tick(k * 50 * MS, &all_rpcs(), &mut pings, &mut failed);
    }
    assert_eq!(pings.len(), 11);
    assert!(pings.len() <= OUTSTANDING_PINGS);
    let first = SmPkt::decode(&pings[0].1).unwrap();
    let r = ping_resp(&first, 99, &all_rpcs());
    for _ in 0..2 {
        l.heard_pong(
            &r.server,
            r.uniq_token,
            &all_rpcs(),
            true,
            500 * MS,
            &mut failed,
        );
    }
    assert!(failed.is_empty());
    assert_eq!(l.stats().pongs_received, 1);
    assert_eq!(l.stats().unmatched_tokens, 1, "a token is taken once");
}

/// A ping request proves nothing about liveness (a recorded one could
/// be replayed from a dead peer's address forever): only answers to
/// our pings keep a peer alive.
#[test]
fn ping_requests_never_keep_a_peer_alive() {
    let b = Uri::new("b", 2);
    let mut l = new(7);
    l.track(&b, 3, 99, true, 0);
    let (mut pings, mut failed) = (Vec::new(), Vec::new());
    for k in 0..=12 {
        l.heard_ping(&ep(&b, 99), true, &mut failed);
        l.tick(k * 50 * MS, &all_rpcs(), &mut pings, &mut failed);
    }
    assert_eq!(failed.len(), 1);
    assert_eq!(l.stats().failed_silent, 1);
}

/// An incarnation taken from a connect request whose source could not
/// be checked (a forger claiming a peer we did not track yet) gives
/// way to the peer's own, older or newer, from its address.
#[test]
fn an_unconfirmed_incarnation_gives_way_to_the_peers_own() {
    let b = Uri::new("b", 2);
    let mut failed = Vec::new();
    for forged in [50, 500] {
        let mut l = new(7);
        assert_eq!(l.track(&b, 3, forged, false, 0), Track::Tracked(None));
        // Another unverified one does not replace it.
        assert!(!l.may_track(&b, forged + 1, false));
        // The real one, from its address, does (failing the forged
        // session).
        assert!(l.may_track(&b, 99, true));
        let f = tracked(l.track(&b, 3, 99, true, MS)).unwrap();
        assert_eq!(f.incarnation, forged);
        // Now it is confirmed: older ones are stale.
        assert!(!l.may_track(&b, 98, true));
        // The same through a ping response to an unconfirmed entry.
        let mut l = new(7);
        l.track(&b, 3, forged, false, 0);
        answer_pings(&mut l, MS, 99, &all_rpcs(), &mut failed);
        assert_eq!(failed.pop().unwrap().incarnation, forged);
    }
}

#[test]
fn ping_response_echoes_the_token_and_carries_the_responder() {
    let mut pings = Vec::new();
    let mut l = new(7);
    l.track(&Uri::new("b", 2), 0, 99, false, 0);
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
