//! Issue 30, "No forged packet breaks a session": session management has
//! no authentication, so a packet's claims about its sender are only
//! believed when it comes from the sender's address, answers a ping we
//! sent, and names an incarnation no older than the one we know; and
//! admission limits are keyed on the host a connect request comes from.
//!
//! Every test runs on the simulated network and its SM hub, whose packets
//! carry their true source (as UDP datagrams carry their source address);
//! `SimSmHub::inject_from` delivers bytes from any source, as a forger's
//! datagram arrives, and `SimSmHub::set_forgery` adds an attacker that
//! forges and replays packets at random.

mod common;

use common::app::{self, ECHO, SIZED};
use common::scenarios::{N, check_done, connect, nodes, nodes_with};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::wire::{EXT_RPC_BITMAP_BYTES, SM_PKT_BYTES, SmEndpoint, SmPkt, SmPktType};
use erpc::{RpcConfig, SessionEventKind, SmErr, Uri};
use netsim::Rng;
use transport::Transport;

type W = SimWorld;
const FILE: &str = "forged_sm";
const MS: u64 = 1_000_000;

fn uri(i: usize) -> Uri {
    Uri::new(&format!("node-{i}"), 31850)
}

fn forger() -> Uri {
    Uri::new("forger", 6666)
}

/// Hands `bytes` to the Nexus at `to` as if they came from `from`.
fn forge(w: &W, from: &Uri, to: &Uri, bytes: &[u8; SM_PKT_BYTES]) {
    w.net.sm_hub().inject_from(from, to, bytes);
}

/// Polls and steps `steps` times.
fn run_steps(w: &mut W, ns: &mut [N<W>], steps: usize) {
    for _ in 0..steps {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

/// An endpoint naming the Nexus at `u` with incarnation `inc` (Rpc id and
/// session number invalid, as in pings).
fn endpoint(u: &Uri, inc: u64) -> SmEndpoint {
    let mut e = SmEndpoint {
        sm_udp_port: u.port,
        rpc_id: u8::MAX,
        ..SmEndpoint::default()
    };
    e.set_hostname(&u.host).unwrap();
    e.set_incarnation(inc);
    e
}

fn ping_req(claimed: &Uri, inc: u64, to: &Uri) -> [u8; SM_PKT_BYTES] {
    SmPkt {
        pkt_type: SmPktType::PingReq,
        err: SmErr::NoError,
        uniq_token: 0x5eed,
        client: endpoint(claimed, inc),
        server: endpoint(to, 0),
    }
    .encode()
}

/// A ping response naming `claimed` with no live Rpcs and `token`.
fn ping_resp(claimed: &Uri, inc: u64, to: &Uri, token: u64) -> [u8; SM_PKT_BYTES] {
    let mut server = endpoint(claimed, 0);
    server.set_rpc_bitmap(&[0; EXT_RPC_BITMAP_BYTES]);
    server.set_incarnation(inc);
    SmPkt {
        pkt_type: SmPktType::PingResp,
        err: SmErr::NoError,
        uniq_token: token,
        client: endpoint(to, 0),
        server,
    }
    .encode()
}

/// Node `i` alone ("node-i:31850", Rpc id `i`) with `cfg`.
fn node(w: &mut W, i: usize, seed: u64, cfg: RpcConfig) -> N<W> {
    let nexus = app::register::<<W as World>::T>(w.nexus(&format!("node-{i}:31850")))
        .build()
        .unwrap();
    common::Node::new(
        w,
        &nexus,
        i as u8,
        app::Ctx::new(seed ^ (i as u64) << 32),
        cfg,
        Some(app::sm_handler),
    )
}

/// Client node 0 keeps its sessions to server node 1 busy with `ops`
/// small requests, four at a time.
fn start_load(ns: &mut [N<W>], ops: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    ns[0].ctx.todo = app::random_ops(&mut rng, ops, &[ECHO, SIZED], &[12, 968, 5000]);
    let n = &mut ns[0];
    app::start(&mut n.rpc, &mut n.ctx, 4);
}

/// Nothing was reset: every session is still connected, no session event
/// but `Connected` was reported, no request failed, and neither Nexus
/// failed the other.
fn assert_untouched(ns: &[N<W>], sessions: usize) {
    for (i, n) in ns.iter().enumerate() {
        assert!(
            n.ctx
                .events
                .iter()
                .all(|e| e.kind == SessionEventKind::Connected),
            "node {i}: {:?}",
            n.ctx.events
        );
        let l = n.rpc.nexus().liveness_stats();
        assert_eq!(
            (l.failed_restarted, l.failed_rpc_gone, l.failed_silent),
            (0, 0, 0),
            "node {i}: {l:?}"
        );
        assert_eq!(n.rpc.stats().sessions_reset, 0, "node {i}");
        assert_eq!(n.rpc.stats().sessions_peer_failed, 0, "node {i}");
    }
    assert!(
        ns[0]
            .ctx
            .sessions
            .iter()
            .all(|&s| ns[0].rpc.is_connected(s))
    );
    assert_eq!(ns[0].rpc.num_sessions(), sessions);
    assert_eq!(ns[1].rpc.num_sessions(), sessions);
    check_done::<W>(ns);
}

/// One packet of each kind that used to reset every session to a peer:
/// ping requests and responses naming it with another incarnation, a ping
/// response with no live Rpcs and a made-up token, connect requests naming
/// the client with another incarnation; each either from the peer's own
/// address with a stale incarnation (a dead process's packet replayed
/// there) or from elsewhere with a newer one. None resets anything, and
/// every request completes.
#[test]
fn forged_and_stale_sm_packets_reset_no_session() {
    with_seeds(
        "forged_and_stale_sm_packets_reset_no_session",
        FILE,
        &[1, 2],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            // Record the client's connect requests as they reach the server.
            w.net.sm_hub().tap(&uri(1));
            connect(&mut w, &mut ns, 0, 1, 2);
            let genuine = w
                .net
                .sm_hub()
                .take_tapped(&uri(1))
                .into_iter()
                .map(|b| SmPkt::decode(&b).unwrap())
                .find(|p| p.pkt_type == SmPktType::ConnectReq)
                .expect("a connect request");
            start_load(&mut ns, 400, seed);
            run_steps(&mut w, &mut ns, 200);
            let (c, s) = (uri(0), uri(1));
            let inc_c = ns[0].rpc.nexus().incarnation();
            let inc_s = ns[1].rpc.nexus().incarnation();
            let newer = |inc: u64| inc + (7 << 20);
            // At the client, about the server.
            forge(&w, &forger(), &c, &ping_req(&s, newer(inc_s), &c));
            forge(&w, &s, &c, &ping_req(&s, inc_s - 1, &c));
            forge(&w, &s, &c, &ping_resp(&s, inc_s, &c, u64::MAX));
            forge(&w, &s, &c, &ping_resp(&s, inc_s - 1, &c, u64::MAX));
            forge(&w, &forger(), &c, &ping_resp(&s, newer(inc_s), &c, 1));
            // At the server, about the client: a connect request of a dead
            // incarnation replayed from the client's address, and one of a
            // "newer" one from elsewhere.
            let mut old = genuine;
            old.uniq_token ^= 0xdead;
            old.client.set_incarnation(inc_c - 1);
            forge(&w, &c, &s, &old.encode());
            let mut new = genuine;
            new.uniq_token ^= 0xbeef;
            new.client.set_incarnation(newer(inc_c));
            forge(&w, &forger(), &s, &new.encode());
            // Past several ping rounds and the failure timeout.
            w.step_ns = 100_000;
            run_until(&mut w, &mut ns, 200_000, "requests", |ns| {
                ns[0].ctx.completed == 400
            });
            let t = w.now_ns();
            while w.now_ns() < t + 700 * MS {
                run_steps(&mut w, &mut ns, 100);
            }
            assert_untouched(&ns, 2);
            assert_eq!(ns[0].ctx.completed, 400);
            assert!(ns[1].rpc.stats().sm_connect_stale_incarnation >= 2);
            let l = ns[0].rpc.nexus().liveness_stats();
            assert!(l.unverified_source >= 2, "{l:?}");
            assert!(l.stale_incarnations >= 1, "{l:?}");
            assert!(ns[0].rpc.nexus().sm_stats().pongs_ignored >= 3);
            // The client kept pinging and heard answers throughout.
            assert!(l.pongs_received >= 10, "{l:?}");
        },
    );
}

/// What the attacker test saw over its seeds.
#[derive(Default)]
struct Seen {
    forged: u64,
    unverified: u64,
    stale: u64,
    unmatched: u64,
    stale_connects: u64,
}

/// The same through the hub's attacker: for a third of the SM packets it
/// also delivers a forged or replayed one (see `SimSmHub::set_forgery`),
/// over a reordering, duplicating SM network, for two seconds of traffic
/// between three nodes, with sessions coming and going. No session is
/// reset and every request completes. `ERPC_FORGED_SEEDS=N` sweeps N
/// seeds (default 8).
#[test]
fn an_attacker_on_the_sm_network_resets_no_session() {
    let replay = std::env::var("ERPC_SEED").is_ok();
    let seeds: Vec<u64> = match std::env::var("ERPC_FORGED_SEEDS").ok() {
        Some(n) => (1..=n.parse::<u64>().expect("ERPC_FORGED_SEEDS=count")).collect(),
        None => (1..=8).collect(),
    };
    let seen = std::cell::RefCell::new(Seen::default());
    with_seeds(
        "an_attacker_on_the_sm_network_resets_no_session",
        FILE,
        &seeds,
        |seed| {
            let mut w = W::new(seed);
            w.net.sm_hub().set_config(erpc_sim::SmHubConfig {
                delay_ns: 20_000,
                jitter_ns: 200_000,
                loss_ppm: 0,
                dup_ppm: 50_000,
            });
            w.net.sm_hub().set_forgery(300_000);
            let mut ns = nodes(&mut w, 3, seed);
            // Node 0 and node 2 are clients of node 1; node 1 a client of
            // node 2 as well, so every pair pings both ways.
            connect(&mut w, &mut ns, 0, 1, 2);
            connect(&mut w, &mut ns, 2, 1, 1);
            connect(&mut w, &mut ns, 1, 2, 1);
            let mut rng = Rng::new(seed);
            for n in ns.iter_mut() {
                n.ctx.todo = app::random_ops(&mut rng, 300, &[ECHO, SIZED], &[12, 968, 3000]);
                app::start(&mut n.rpc, &mut n.ctx, 2);
            }
            // Spread the requests over two seconds, a few at a time, while
            // node 2 opens and closes idle sessions to node 0 (more
            // connect requests for the attacker to forge).
            w.step_ns = 200_000;
            let mut steps = 0u64;
            let mut churn: Vec<erpc::SessionNum> = Vec::new();
            let mut churned = 0;
            while ns.iter().any(|n| n.ctx.completed < 300) || w.now_ns() < 2_000 * MS {
                for n in ns.iter_mut() {
                    n.poll();
                    if n.ctx.in_flight == 0 && !n.ctx.todo.is_empty() {
                        app::start(&mut n.rpc, &mut n.ctx, 1);
                    }
                }
                if steps.is_multiple_of(250) && churned < 30 {
                    churn.push(ns[2].rpc.create_session("node-0:31850", 0).unwrap());
                    churned += 1;
                }
                churn.retain(|&sn| {
                    if ns[2].rpc.is_connected(sn) {
                        ns[2].rpc.destroy_session(sn).unwrap();
                        false
                    } else {
                        true
                    }
                });
                w.step();
                steps += 1;
                assert!(steps < 200_000, "requests did not finish");
            }
            // The last churned sessions go too.
            let mut left = 0;
            while !churn.is_empty()
                || ns[2].rpc.num_sessions() != 2
                || ns[0].rpc.num_sessions() != 2
                || ns[1].rpc.num_sessions() != 4
            {
                for n in ns.iter_mut() {
                    n.poll();
                }
                churn.retain(|&sn| {
                    if ns[2].rpc.is_connected(sn) {
                        ns[2].rpc.destroy_session(sn).unwrap();
                        false
                    } else {
                        ns[2].rpc.session_state(sn).is_some()
                    }
                });
                w.step();
                left += 1;
                assert!(
                    left < 100_000,
                    "sessions left: node 0 {:?}, node 1 {:?}, node 2 {:?}",
                    (0..64)
                        .filter_map(|k| ns[0].rpc.session_info(k))
                        .collect::<Vec<_>>(),
                    (0..64)
                        .filter_map(|k| ns[1].rpc.session_info(k))
                        .collect::<Vec<_>>(),
                    (0..64)
                        .filter_map(|k| ns[2].rpc.session_info(k))
                        .collect::<Vec<_>>()
                );
            }
            for (i, n) in ns.iter().enumerate() {
                assert!(
                    n.ctx.events.iter().all(|e| matches!(
                        e.kind,
                        SessionEventKind::Connected | SessionEventKind::Disconnected
                    )),
                    "node {i}: {:?}",
                    n.ctx.events
                );
                assert_eq!(n.ctx.completed, 300, "node {i}");
                assert!(n.ctx.sessions.iter().all(|&s| n.rpc.is_connected(s)));
                let l = n.rpc.nexus().liveness_stats();
                assert_eq!(l.failed_silent + l.failed_rpc_gone, 0, "node {i}: {l:?}");
            }
            check_done::<W>(&ns);
            // Forged connect requests may have made server sessions for
            // clients that never asked (counted as restarts, and as peer
            // failures of those sessions, when the real client's
            // incarnation replaces theirs); each failed alone and is gone
            // (the session counts above). The real sessions never were:
            // their clients saw no event but Connected and Disconnected,
            // and every request completed.
            let mut seen = seen.borrow_mut();
            seen.forged += w.net.sm_hub().stats().forged;
            for n in &ns {
                let l = n.rpc.nexus().liveness_stats();
                seen.unverified += l.unverified_source;
                seen.stale += l.stale_incarnations;
                seen.unmatched += l.unmatched_tokens;
                seen.stale_connects += n.rpc.stats().sm_connect_stale_incarnation;
            }
        },
    );
    // The forgeries reached every check (over the default sweep).
    if !replay && seeds.len() >= 8 {
        let s = seen.borrow();
        assert!(s.forged > 400, "{}", s.forged);
        assert!(s.unverified > 0 && s.stale > 0 && s.unmatched > 0);
        assert!(s.stale_connects > 0);
    }
}

/// A forged connect request naming a client URI.
fn forged_connect(
    host: &str,
    token: u64,
    routing: transport::RoutingInfo,
    to: &Uri,
    rpc_id: u8,
) -> [u8; SM_PKT_BYTES] {
    let mut client = SmEndpoint {
        sm_udp_port: 1,
        rpc_id: 0,
        session_num: 0,
        routing_info: routing.to_bytes(),
        ..SmEndpoint::default()
    };
    client.set_hostname(host).unwrap();
    let mut server = SmEndpoint {
        sm_udp_port: to.port,
        rpc_id,
        ..SmEndpoint::default()
    };
    server.set_hostname(&to.host).unwrap();
    SmPkt {
        pkt_type: SmPktType::ConnectReq,
        err: SmErr::NoError,
        uniq_token: token,
        client,
        server,
    }
    .encode()
}

/// Connect limits count what a host sends, whatever client URIs its
/// packets claim: one forger claiming 100 different clients gets one
/// burst.
#[test]
fn connect_limits_are_keyed_on_the_source_host_not_the_claimed_uri() {
    with_seeds(
        "connect_limits_are_keyed_on_the_source_host_not_the_claimed_uri",
        FILE,
        &[3],
        |seed| {
            let mut w = W::new(seed);
            let cfg = RpcConfig {
                connect_burst_per_source: Some(8),
                connects_per_sec_per_source: 4,
                ..RpcConfig::default()
            };
            let mut ns = nodes_with(&mut w, 2, seed, cfg);
            let routing = w.net.add_transport().local_routing_info();
            for k in 0..100u64 {
                let p = forged_connect(&format!("claimed-{k}"), 0x1000 + k, routing, &uri(0), 0);
                forge(&w, &forger(), &uri(0), &p);
            }
            run_steps(&mut w, &mut ns, 200);
            assert_eq!(ns[0].rpc.num_sessions(), 8, "one burst for the one host");
            assert_eq!(ns[0].rpc.stats().sm_connect_rate_limited, 92);
            // A real client on another host is not slowed.
            connect(&mut w, &mut ns, 1, 0, 3);
            assert_eq!(ns[0].rpc.num_sessions(), 11);
        },
    );
}

/// A client asking for one credit per session gets (and costs the server)
/// the configured minimum, so it cannot hold thousands of sessions; it
/// still uses no more than it asked for.
#[test]
fn a_server_grants_at_least_the_minimum_credits() {
    with_seeds(
        "a_server_grants_at_least_the_minimum_credits",
        FILE,
        &[4],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            let one = RpcConfig {
                session_credits: 1,
                ..RpcConfig::default()
            };
            let mut c = node(&mut w, 2, seed, one);
            c.ctx
                .sessions
                .push(c.rpc.create_session(&uri(0).to_string(), 0).unwrap());
            ns.push(c);
            run_until(&mut w, &mut ns, 100_000, "connect", |ns| {
                ns[2].rpc.is_connected(ns[2].ctx.sessions[0])
            });
            let sn = ns[2].ctx.sessions[0];
            assert_eq!(ns[2].rpc.session_credits(sn), Some(1), "what it asked for");
            assert_eq!(
                ns[0].rpc.rx_ring_unreserved().0,
                4096 - erpc::MIN_SESSION_CREDITS,
                "the server reserved the minimum"
            );
            ns[2].ctx.todo = app::random_ops(&mut Rng::new(seed), 50, &[ECHO], &[12, 5000]);
            let n = &mut ns[2];
            app::start(&mut n.rpc, &mut n.ctx, 2);
            run_until(&mut w, &mut ns, 1_000_000, "requests", |ns| {
                ns[2].ctx.completed == 50
            });
            check_done::<W>(&ns);
            // A server configured with fewer credits than the minimum
            // grants its own (2), not the minimum.
            let two = RpcConfig {
                session_credits: 2,
                ..RpcConfig::default()
            };
            let mut s = node(&mut w, 3, seed, two);
            let sn = ns[2].rpc.create_session("node-3:31850", 3).unwrap();
            let mut all = vec![ns.remove(2), s];
            run_until(&mut w, &mut all, 100_000, "connect", |ns| {
                ns[0].rpc.is_connected(sn)
            });
            s = all.pop().unwrap();
            assert_eq!(s.rpc.rx_ring_unreserved().0, 4096 - 2);
            assert_eq!(all[0].rpc.session_credits(sn), Some(1));
        },
    );
}

/// With `ring_entries_per_source`, one host, however many client URIs it
/// claims, holds at most its share of the ring: a real client on another
/// host still gets a session.
#[test]
fn one_host_cannot_take_the_whole_ring() {
    with_seeds("one_host_cannot_take_the_whole_ring", FILE, &[5], |seed| {
        // 1024-entry rings and 32 credits: 32 sessions per Rpc, of which
        // one host may hold 30.
        let mut w = W::with_config(erpc_sim::SimConfig {
            seed,
            ring_entries: 1024,
            ..erpc_sim::SimConfig::default()
        });
        let cfg = RpcConfig {
            ring_entries_per_source: Some(1024 - 2 * 32),
            ..RpcConfig::default()
        };
        let mut ns = nodes_with(&mut w, 2, seed, cfg);
        let routing = w.net.add_transport().local_routing_info();
        for k in 0..40u64 {
            let p = forged_connect(&format!("claimed-{k}"), 0x2000 + k, routing, &uri(0), 0);
            forge(&w, &forger(), &uri(0), &p);
        }
        run_steps(&mut w, &mut ns, 100);
        assert_eq!(ns[0].rpc.num_sessions(), 30, "all but two sessions' room");
        assert_eq!(ns[0].rpc.stats().sm_connect_source_full, 10);
        connect(&mut w, &mut ns, 1, 0, 2);
        assert_eq!(ns[0].rpc.num_sessions(), 32);
        ns[1].ctx.todo = app::random_ops(&mut Rng::new(seed), 50, &[ECHO, SIZED], &[12, 5000]);
        let n = &mut ns[1];
        app::start(&mut n.rpc, &mut n.ctx, 4);
        run_until(&mut w, &mut ns, 1_000_000, "requests", |ns| {
            ns[1].ctx.completed == 50
        });
        check_done::<W>(&ns);
    });
}

/// Node 0 connects two sessions to node 1; returns a copy of one of its
/// genuine connect requests (its real URI and incarnation) with the
/// forger's `token`: what a forger on the SM network would send.
fn connect_and_forge_a_copy(w: &mut W, ns: &mut [N<W>], token: u64) -> SmPkt {
    w.net.sm_hub().tap(&uri(1));
    connect(w, ns, 0, 1, 2);
    let mut forged = w
        .net
        .sm_hub()
        .take_tapped(&uri(1))
        .into_iter()
        .map(|b| SmPkt::decode(&b).unwrap())
        .find(|p| p.pkt_type == SmPktType::ConnectReq)
        .expect("a connect request");
    forged.uniq_token = token;
    forged
}

/// A forged connect request naming a live erpc-rs client, with its real
/// incarnation and a token of the forger's, makes the server create a
/// session; its response goes to the client named, which never asked for
/// it and disconnects it. The client's own sessions are untouched.
#[test]
fn a_session_made_by_a_forged_connect_is_disowned_by_its_client() {
    with_seeds(
        "a_session_made_by_a_forged_connect_is_disowned_by_its_client",
        FILE,
        &[6],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            let forged = connect_and_forge_a_copy(&mut w, &mut ns, 0xf0f0_f0f0);
            forge(&w, &forger(), &uri(1), &forged.encode());
            run_steps(&mut w, &mut ns, 100);
            assert_eq!(ns[0].rpc.stats().sm_disowned, 1);
            assert_eq!(ns[1].rpc.num_sessions(), 2, "the forged session is gone");
            start_load(&mut ns, 100, seed);
            run_until(&mut w, &mut ns, 1_000_000, "requests", |ns| {
                ns[0].ctx.completed == 100
            });
            assert_untouched(&ns, 2);
        },
    );
}

/// As above, but the client's disconnect of the forged session is lost
/// (its SM packets are dropped for a while): the server sends the
/// never-used session's connect response again at growing intervals
/// (`RpcStats::sm_unserved_probes`), the client disowns it again, and the
/// session goes. Without the probes it would stay until the ring ran
/// short.
#[test]
fn a_forged_session_goes_even_when_its_disown_is_lost() {
    with_seeds(
        "a_forged_session_goes_even_when_its_disown_is_lost",
        FILE,
        &[7],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            let forged = connect_and_forge_a_copy(&mut w, &mut ns, 0x0f0f_0f0f);
            // Everything node 0 sends on the SM network is lost from now.
            w.net.sm_hub().set_mute(&uri(0), true);
            forge(&w, &forger(), &uri(1), &forged.encode());
            run_until(&mut w, &mut ns, 10_000_000, "the first disown", |ns| {
                ns[0].rpc.stats().sm_disowned == 1
            });
            run_steps(&mut w, &mut ns, 100);
            assert_eq!(ns[1].rpc.num_sessions(), 3, "the disown was lost");
            w.net.sm_hub().set_mute(&uri(0), false);
            let start = w.now_ns();
            run_until(
                &mut w,
                &mut ns,
                100_000_000,
                "the forged session to go",
                |ns| ns[1].rpc.num_sessions() == 2,
            );
            assert!(ns[1].rpc.stats().sm_unserved_probes >= 1);
            assert!(ns[0].rpc.stats().sm_disowned >= 2);
            // Within the probes' schedule (the last at 32 SM retry
            // intervals of the session's age).
            assert!(
                w.now_ns() - start <= 3_300 * MS,
                "{} ms",
                (w.now_ns() - start) / MS
            );
            // The genuine sessions were probed as well (never used yet),
            // and ignored by their client.
            start_load(&mut ns, 100, seed);
            run_until(&mut w, &mut ns, 1_000_000, "requests", |ns| {
                ns[0].ctx.completed == 100
            });
            assert_untouched(&ns, 2);
        },
    );
}
