//! Session management and the data path against stale, hostile and
//! long-lived traffic (issue 12): request numbers across the 44-bit wrap,
//! late duplicate connect requests, forged connect floods, transport-type
//! and credit negotiation. Deterministic, on the simulated network; a
//! failing run prints its seed and a one-line replay command.

mod common;

use common::app::{self, Ctx, ECHO, Op, SIZED};
use common::scenarios::{N, check_done, connect, nodes};
use common::{Node, SimWorld, World, run_until, with_seeds};
use erpc::wire::MAX_REQ_NUM;
use erpc::{DropReason, RpcConfig, RpcError, SessionEventKind};
use netsim::Rng;
use transport::Transport;

const FILE: &str = "hardening";

type W = SimWorld;

/// A request-number base that leaves each slot `k` requests before the
/// 44-bit wrap (slot `i` starts at `base + i`; its first request is
/// `base + i + 8`).
fn base_below_wrap(k: u64) -> u64 {
    MAX_REQ_NUM + 1 - 8 * (k + 1)
}

#[test]
fn request_numbers_wrap_past_2_pow_44_between_erpc_rs_peers() {
    with_seeds(
        "request_numbers_wrap_past_2_pow_44_between_erpc_rs_peers",
        FILE,
        &[1, 2],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            // The client proposes a base 3 requests per slot below the
            // wrap; the erpc-rs server adopts it.
            ns[0].rpc.fault_set_req_base(Some(base_below_wrap(3)));
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            let srv = ns[1].rpc.session_nums()[0];
            let nums = ns[1].rpc.session_info(srv).unwrap().req_nums;
            assert_eq!(nums[0], base_below_wrap(3), "server adopted the base");
            // Single- and multi-packet requests and responses (credit
            // returns and requests for response) across the wrap.
            let mut rng = Rng::new(seed);
            ns[0].ctx.todo = app::random_ops(&mut rng, 400, &[ECHO, SIZED], &[12, 968, 969, 5000]);
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 16);
            }
            run_until(
                &mut w,
                &mut ns,
                1_000_000,
                "requests across the wrap",
                |ns| ns[0].ctx.completed + ns[0].ctx.failed == 400,
            );
            check_done::<W>(&ns);
            assert_eq!(ns[1].ctx.handled, 400, "each request ran exactly once");
            assert_eq!(ns[0].rpc.stats().total_drops(), 0, "{}", ns[0].rpc.stats());
            assert_eq!(ns[1].rpc.stats().total_drops(), 0, "{}", ns[1].rpc.stats());
            // Every slot went round: its numbers are small again, still its own.
            let info = ns[0].rpc.session_info(sn).unwrap();
            for (i, &n) in info.req_nums.iter().enumerate() {
                assert!(n < 8 * 400, "slot {i} at {n}: did not wrap");
                assert_eq!(n % 8, i as u64);
            }
            assert_eq!(
                ns[1].rpc.session_info(srv).unwrap().req_nums,
                info.req_nums,
                "both ends agree"
            );
        },
    );
}

/// Closed-loop requests that stop at the first failure (the session is gone).
fn issue_until_failure(n: &mut N<W>, count: usize) {
    n.ctx.todo = (0..count)
        .map(|_| Op {
            req_type: ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    app::start(&mut n.rpc, &mut n.ctx, 1);
}

#[test]
fn a_session_to_a_cpp_peer_ends_cleanly_instead_of_wrapping() {
    with_seeds(
        "a_session_to_a_cpp_peer_ends_cleanly_instead_of_wrapping",
        FILE,
        &[3],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 1, seed);
            // The server presents itself exactly as a C++ eRPC process:
            // no extensions, request numbers from its own base.
            let nexus = app::register::<<W as World>::T>(w.nexus("cpp:31850"))
                .sm_extensions(false)
                .build()
                .unwrap();
            ns.push(Node::new(
                &mut w,
                &nexus,
                1,
                Ctx::new(seed),
                RpcConfig::default(),
                Some(app::sm_handler),
            ));
            let base = base_below_wrap(2);
            ns[0].rpc.fault_set_req_base(Some(base));
            ns[1].rpc.fault_set_req_base(Some(base));
            let sn = ns[0].rpc.create_session("cpp:31850", 1).unwrap();
            ns[0].ctx.sessions.push(sn);
            run_until(&mut w, &mut ns, 100_000, "connect", |ns| {
                ns[0].rpc.is_connected(sn)
            });
            // One request at a time on slot 0: two fit below the wrap.
            issue_until_failure(&mut ns[0], 3);
            run_until(&mut w, &mut ns, 100_000, "exhaustion", |ns| {
                ns[0].ctx.failed == 1
            });
            assert_eq!(ns[0].ctx.completed, 2);
            assert_eq!(
                ns[1].ctx.handled, 2,
                "nothing past the wrap reached the server"
            );
            assert_eq!(
                ns[0].ctx.failures,
                vec![RpcError::SessionEnded {
                    session: sn,
                    why: erpc::SessionEnd::ReqNumsExhausted
                }]
            );
            run_until(&mut w, &mut ns, 1000, "event", |ns| {
                ns[0]
                    .ctx
                    .events
                    .iter()
                    .any(|e| e.kind == SessionEventKind::Ended(erpc::SessionEnd::ReqNumsExhausted))
            });
            assert_eq!(ns[0].rpc.session_state(sn), None, "the session is gone");
            assert_eq!(ns[1].rpc.stats().drops(DropReason::StaleReqNum), 0);
            // A new session starts over and works.
            ns[0].rpc.fault_set_req_base(None);
            ns[1].rpc.fault_set_req_base(None);
            ns[0].ctx.errors.clear();
            ns[0].ctx.failed = 0;
            ns[0].ctx.sessions.clear();
            let before = ns[0].ctx.completed;
            let sn = ns[0].rpc.create_session("cpp:31850", 1).unwrap();
            ns[0].ctx.sessions.push(sn);
            issue_until_failure(&mut ns[0], 20);
            run_until(&mut w, &mut ns, 100_000, "new session", |ns| {
                ns[0].ctx.completed == before + 20
            });
            check_done::<W>(&ns);
        },
    );
}

/// Node `i` ("node-i:31850", Rpc id `i`) with its own config and SM
/// extensions on or off.
fn node_with(w: &mut W, i: usize, seed: u64, cfg: RpcConfig, extensions: bool) -> N<W> {
    let nexus = app::register::<<W as World>::T>(w.nexus(&format!("node-{i}:31850")))
        .sm_extensions(extensions)
        .failure_timeout_ms(cfg.failure_timeout_ms)
        .build()
        .unwrap();
    Node::new(
        w,
        &nexus,
        i as u8,
        Ctx::new(seed ^ (i as u64) << 32),
        cfg,
        Some(app::sm_handler),
    )
}

fn credits(c: usize) -> RpcConfig {
    RpcConfig {
        session_credits: c,
        ..RpcConfig::default()
    }
}

#[test]
fn clients_never_use_more_credits_than_the_server_reserved() {
    with_seeds(
        "clients_never_use_more_credits_than_the_server_reserved",
        FILE,
        &[11],
        |seed| {
            // 64-entry rings: two clients with 64 credits each would put
            // 128 packets at once into the server's ring.
            let mut w = W::with_config(erpc_sim::SimConfig {
                seed,
                ring_entries: 64,
                ..erpc_sim::SimConfig::default()
            });
            let mut ns = vec![
                node_with(&mut w, 0, seed, credits(8), true),
                node_with(&mut w, 1, seed, credits(64), true),
                node_with(&mut w, 2, seed, credits(64), true),
            ];
            connect(&mut w, &mut ns, 1, 0, 1);
            connect(&mut w, &mut ns, 2, 0, 1);
            for c in [1, 2] {
                let sn = ns[c].ctx.sessions[0];
                assert_eq!(
                    ns[c].rpc.session_credits(sn),
                    Some(8),
                    "granted by the server"
                );
                assert_eq!(ns[c].rpc.rx_ring_unreserved(), (64 - 8, 64));
            }
            assert_eq!(ns[0].rpc.rx_ring_unreserved(), (64 - 16, 64));
            // Large requests from both clients at once.
            for c in [1, 2] {
                ns[c].ctx.todo = (0..20)
                    .map(|_| Op {
                        req_type: SIZED,
                        req_len: 60 * 968,
                        resp_len: 40 * 968,
                    })
                    .collect();
                let n = &mut ns[c];
                app::start(&mut n.rpc, &mut n.ctx, 8);
            }
            run_until(&mut w, &mut ns, 2_000_000, "large requests", |ns| {
                ns[1].ctx.completed == 20 && ns[2].ctx.completed == 20
            });
            check_done::<W>(&ns);
            assert_eq!(w.net.stats().rx_ring_full, 0, "{:?}", w.net.stats());
            for n in &ns {
                assert_eq!(n.rpc.stats().retransmissions, 0);
                n.rpc.check_credit_invariant().unwrap();
            }
        },
    );
}

#[test]
fn credits_toward_a_cpp_peer_are_its_32_both_ways() {
    with_seeds(
        "credits_toward_a_cpp_peer_are_its_32_both_ways",
        FILE,
        &[12],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = vec![
                // A server presenting itself as C++: it reserves 32 for
                // any client, whatever its own configuration says.
                node_with(&mut w, 0, seed, credits(8), false),
                // An erpc-rs client configured for 64.
                node_with(&mut w, 1, seed, credits(64), true),
            ];
            connect(&mut w, &mut ns, 1, 0, 1);
            let sn = ns[1].ctx.sessions[0];
            assert_eq!(ns[1].rpc.session_credits(sn), Some(32));
            assert_eq!(ns[1].rpc.rx_ring_unreserved().0, 4096 - 32);
            assert_eq!(ns[0].rpc.rx_ring_unreserved().0, 4096 - 32);
            ns[1].ctx.todo = app::random_ops(&mut Rng::new(seed), 100, &[SIZED], &[12, 50_000]);
            {
                let n = &mut ns[1];
                app::start(&mut n.rpc, &mut n.ctx, 8);
            }
            run_until(&mut w, &mut ns, 2_000_000, "requests", |ns| {
                ns[1].ctx.completed == 100
            });
            check_done::<W>(&ns);
            assert_eq!(ns[1].rpc.session_credits(sn), Some(32));
            // Everything given back when the session goes.
            ns[1].rpc.destroy_session(sn).unwrap();
            run_until(&mut w, &mut ns, 100_000, "disconnect", |ns| {
                ns[0].rpc.num_sessions() == 0 && ns[1].rpc.num_sessions() == 0
            });
            assert_eq!(ns[0].rpc.rx_ring_unreserved().0, 4096);
            assert_eq!(ns[1].rpc.rx_ring_unreserved().0, 4096);
        },
    );
}

/// Polls every node and steps the world `steps` times.
fn run_steps(w: &mut W, ns: &mut [N<W>], steps: u64) {
    for _ in 0..steps {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

#[test]
fn a_late_duplicate_connect_request_never_creates_a_session() {
    with_seeds(
        "a_late_duplicate_connect_request_never_creates_a_session",
        FILE,
        &[21],
        |seed| {
            use erpc::wire::{SmPkt, SmPktType};
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            let server = erpc::Uri::new("node-1", 31850);
            w.net.sm_hub().tap(&server);
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            ns[0].rpc.destroy_session(sn).unwrap();
            run_until(&mut w, &mut ns, 100_000, "disconnect", |ns| {
                ns[0].rpc.num_sessions() == 0 && ns[1].rpc.num_sessions() == 0
            });
            let req = w
                .net
                .sm_hub()
                .take_tapped(&server)
                .into_iter()
                .find(|b| SmPkt::decode(b).unwrap().pkt_type == SmPktType::ConnectReq)
                .expect("the connect request reached the server");
            // The network delivers the connect request again, late.
            for k in 0..3 {
                w.net.sm_hub().inject(&server, &req);
                run_steps(&mut w, &mut ns, 200);
                assert_eq!(ns[1].rpc.num_sessions(), 0, "copy {k} made a session");
                assert_eq!(ns[1].rpc.stats().sm_stale_connect, k + 1);
            }
            // Still ignored near the end of the token memory (10 s).
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut ns, 9_000);
            w.net.sm_hub().inject(&server, &req);
            run_steps(&mut w, &mut ns, 10);
            assert_eq!(ns[1].rpc.num_sessions(), 0);
            assert_eq!(ns[1].rpc.stats().sm_stale_connect, 4);
            assert_eq!(ns[1].rpc.rx_ring_unreserved().0, 4096);
        },
    );
}

#[test]
fn delayed_and_duplicated_sm_packets_leave_no_orphan_sessions() {
    // The SM hub delays each packet by up to 200 ms on its own (so they
    // overtake each other) and duplicates half of them, while a client
    // opens, uses and closes sessions: late copies of connect requests
    // arrive after their session was closed.
    with_seeds(
        "delayed_and_duplicated_sm_packets_leave_no_orphan_sessions",
        FILE,
        &[31, 32],
        |seed| {
            let mut w = W::with_config(erpc_sim::SimConfig {
                seed,
                sm: erpc_sim::SmHubConfig {
                    delay_ns: 1_000_000,
                    jitter_ns: 200_000_000,
                    loss_ppm: 0,
                    dup_ppm: 500_000,
                },
                ..erpc_sim::SimConfig::default()
            });
            w.step_ns = 20_000;
            // Connects may take up to two 200 ms trips.
            let cfg = RpcConfig {
                failure_timeout_ms: 2_000,
                ..RpcConfig::default()
            };
            let mut ns = common::scenarios::nodes_with(&mut w, 2, seed, cfg);
            let mut rng = Rng::new(seed);
            for _ in 0..12 {
                ns[0].ctx.sessions.clear();
                connect(&mut w, &mut ns, 0, 1, 1 + rng.below(3) as usize);
                let before = ns[0].ctx.completed;
                ns[0].ctx.todo = app::random_ops(&mut rng, 10, &[ECHO, SIZED], &[12, 3000]);
                {
                    let n = &mut ns[0];
                    app::start(&mut n.rpc, &mut n.ctx, 4);
                }
                run_until(&mut w, &mut ns, 1_000_000, "round", |ns| {
                    ns[0].ctx.completed == before + 10
                });
                let sessions = ns[0].ctx.sessions.clone();
                for &sn in &sessions {
                    ns[0].rpc.destroy_session(sn).unwrap();
                }
                run_until(&mut w, &mut ns, 1_000_000, "disconnect", |ns| {
                    ns[0].rpc.num_sessions() == 0
                });
            }
            // Every late copy has arrived by now.
            run_steps(&mut w, &mut ns, 50_000);
            check_done::<W>(&ns);
            assert!(w.net.sm_hub().stats().duplicated > 20);
            assert_eq!(ns[1].rpc.num_sessions(), 0, "orphan server sessions");
            assert_eq!(ns[1].rpc.rx_ring_unreserved().0, 4096);
            assert_eq!(ns[0].rpc.num_sessions(), 0);
        },
    );
}

/// A connect request as a C++ client would send it (no extensions), from
/// the client URI `host:1`, with routing info that resolves (an endpoint of
/// the network), to Rpc `rpc_id` at `to`.
fn forged_connect(
    host: &str,
    token: u64,
    routing: transport::RoutingInfo,
    to: &erpc::Uri,
    rpc_id: u8,
) -> [u8; erpc::wire::SM_PKT_BYTES] {
    use erpc::wire::{SmEndpoint, SmPkt, SmPktType};
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
        err: erpc::SmErr::NoError,
        uniq_token: token,
        client,
        server,
    }
    .encode()
}

#[test]
fn connect_requests_are_limited_per_source() {
    with_seeds(
        "connect_requests_are_limited_per_source",
        FILE,
        &[41],
        |seed| {
            let mut w = W::new(seed);
            let cfg = RpcConfig {
                connect_burst_per_source: Some(8),
                connects_per_sec_per_source: 4,
                ..RpcConfig::default()
            };
            let mut ns = vec![
                node_with(&mut w, 0, seed, cfg, true),
                node_with(&mut w, 1, seed, RpcConfig::default(), true),
            ];
            let server = erpc::Uri::new("node-0", 31850);
            let routing = w.net.add_transport().local_routing_info();
            let flood = |w: &mut W, from: u64, n: u64| {
                for t in from..from + n {
                    let p = forged_connect("forger", 0x1000 + t, routing, &server, 0);
                    w.net.sm_hub().inject(&server, &p);
                }
            };
            flood(&mut w, 0, 100);
            run_steps(&mut w, &mut ns, 200);
            assert_eq!(ns[0].rpc.num_sessions(), 8, "the burst");
            assert_eq!(ns[0].rpc.stats().sm_connect_rate_limited, 92);
            // Four a second after that.
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut ns, 1_000);
            flood(&mut w, 100, 10);
            run_steps(&mut w, &mut ns, 10);
            assert_eq!(ns[0].rpc.num_sessions(), 12);
            // Retransmissions of an admitted request are not charged.
            let again = forged_connect("forger", 0x1000, routing, &server, 0);
            w.net.sm_hub().inject(&server, &again);
            run_steps(&mut w, &mut ns, 10);
            assert_eq!(ns[0].rpc.stats().sm_dup_connect, 1);
            // Other sources are not slowed.
            w.step_ns = 500;
            connect(&mut w, &mut ns, 1, 0, 3);
            assert_eq!(ns[0].rpc.num_sessions(), 15);
        },
    );
}

#[test]
fn a_server_full_of_forged_sessions_reclaims_them_for_real_clients() {
    with_seeds(
        "a_server_full_of_forged_sessions_reclaims_them_for_real_clients",
        FILE,
        &[42],
        |seed| {
            // 1024-entry rings and 32 credits: 32 sessions per Rpc.
            let mut w = W::with_config(erpc_sim::SimConfig {
                seed,
                ring_entries: 1024,
                ..erpc_sim::SimConfig::default()
            });
            let mut ns = nodes(&mut w, 2, seed);
            let server = erpc::Uri::new("node-0", 31850);
            let routing = w.net.add_transport().local_routing_info();
            // 32 forgers (one request each, under every per-source limit)
            // take the whole ring, and never send a request.
            let forger0 = erpc::Uri::new("forger-0", 1);
            w.net.sm_hub().tap(&forger0);
            for k in 0..32u64 {
                let p = forged_connect(&format!("forger-{k}"), 0x2000 + k, routing, &server, 0);
                w.net.sm_hub().inject(&server, &p);
            }
            run_steps(&mut w, &mut ns, 100);
            assert_eq!(ns[0].rpc.num_sessions(), 32);
            assert_eq!(ns[0].rpc.rx_ring_unreserved().0, 0);
            // A real client is refused while they are young...
            let sn = ns[1].rpc.create_session("node-0:31850", 0).unwrap();
            run_until(&mut w, &mut ns, 100_000, "refusal", |ns| {
                !ns[1].ctx.events.is_empty()
            });
            assert_eq!(
                ns[1].ctx.events[0].kind,
                SessionEventKind::Ended(erpc::SessionEnd::ConnectFailed(
                    erpc::SmErr::RingExhausted
                ))
            );
            assert_eq!(ns[1].rpc.session_state(sn), None);
            // ... and served once they are old enough to be reclaimed.
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut ns, 10_000);
            w.step_ns = 500;
            ns[1].ctx.events.clear();
            connect(&mut w, &mut ns, 1, 0, 1);
            assert_eq!(ns[0].rpc.stats().sessions_reclaimed, 1, "one, the oldest");
            assert_eq!(ns[0].rpc.num_sessions(), 32);
            ns[1].ctx.todo = app::random_ops(&mut Rng::new(seed), 50, &[ECHO, SIZED], &[12, 5000]);
            {
                let n = &mut ns[1];
                app::start(&mut n.rpc, &mut n.ctx, 4);
            }
            run_until(&mut w, &mut ns, 1_000_000, "requests", |ns| {
                ns[1].ctx.completed == 50
            });
            check_done::<W>(&ns);
            // The forger presented itself as a C++ client: it got its
            // connect response, and no notice (C++ could not take one).
            assert_eq!(w.net.sm_hub().take_tapped(&forger0).len(), 1);
            // Reclaiming can be turned off.
            let off = RpcConfig {
                unused_session_reclaim_ms: None,
                ..RpcConfig::default()
            };
            let mut strict = vec![node_with(&mut w, 5, seed, off, true)];
            let strict_uri = erpc::Uri::new("node-5", 31850);
            for k in 0..32u64 {
                let p = forged_connect(&format!("f-{k}"), 0x3000 + k, routing, &strict_uri, 5);
                w.net.sm_hub().inject(&strict_uri, &p);
            }
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut strict, 20_000);
            let sm_tx = strict[0].rpc.stats().sm_tx;
            let p = forged_connect("late", 0x4000, routing, &strict_uri, 5);
            w.net.sm_hub().inject(&strict_uri, &p);
            run_steps(&mut w, &mut strict, 10);
            assert_eq!(strict[0].rpc.stats().sessions_reclaimed, 0);
            assert_eq!(strict[0].rpc.num_sessions(), 32);
            assert_eq!(strict[0].rpc.stats().sm_tx, sm_tx + 1, "refused");
        },
    );
}

/// `k` requests over every session of node `c`, round robin, to completion.
fn use_sessions(w: &mut W, ns: &mut [N<W>], c: usize, k: usize) {
    let before = ns[c].ctx.completed;
    ns[c].ctx.todo = (0..k)
        .map(|_| Op {
            req_type: ECHO,
            req_len: 16,
            resp_len: 16,
        })
        .collect();
    {
        let n = &mut ns[c];
        app::start(&mut n.rpc, &mut n.ctx, k);
    }
    run_until(w, ns, 1_000_000, "use sessions", |ns| {
        ns[c].ctx.completed == before + k as u64
    });
}

#[test]
fn an_unused_session_is_reclaimed_only_when_the_ring_is_short_and_its_client_is_told() {
    with_seeds(
        "an_unused_session_is_reclaimed_only_when_the_ring_is_short_and_its_client_is_told",
        FILE,
        &[43, 44],
        |seed| {
            let mut w = W::with_config(erpc_sim::SimConfig {
                seed,
                ring_entries: 1024,
                ..erpc_sim::SimConfig::default()
            });
            // Node 0 serves; node 1 holds one idle session; node 2 uses 30;
            // node 3 comes later.
            let mut ns = nodes(&mut w, 4, seed);
            connect(&mut w, &mut ns, 1, 0, 1);
            let idle = ns[1].ctx.sessions[0];
            connect(&mut w, &mut ns, 2, 0, 30);
            use_sessions(&mut w, &mut ns, 2, 60);
            // Long after the reclaim age, with room left: nothing happens.
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut ns, 11_000);
            w.step_ns = 500;
            connect(&mut w, &mut ns, 3, 0, 1);
            assert_eq!(ns[0].rpc.stats().sessions_reclaimed, 0);
            assert!(ns[1].rpc.is_connected(idle));
            // The ring is full now: the next session takes the idle one's
            // place (node 3's own session is young; node 2's served).
            connect(&mut w, &mut ns, 3, 0, 1);
            assert_eq!(ns[0].rpc.stats().sessions_reclaimed, 1);
            run_until(&mut w, &mut ns, 100_000, "notice", |ns| {
                ns[1].rpc.session_state(idle).is_none()
            });
            assert!(
                ns[1].ctx.events.contains(&erpc::SessionEvent {
                    session: idle,
                    kind: SessionEventKind::Ended(erpc::SessionEnd::ServerReclaimed)
                }),
                "{:?}",
                ns[1].ctx.events
            );
            // Sessions that served requests were kept and still work.
            use_sessions(&mut w, &mut ns, 2, 30);
            check_done::<W>(&ns);
            assert_eq!(ns[0].rpc.num_sessions(), 32);
        },
    );
}

#[test]
fn a_lost_reclaim_notice_comes_again_with_the_clients_next_packet() {
    with_seeds(
        "a_lost_reclaim_notice_comes_again_with_the_clients_next_packet",
        FILE,
        &[45],
        |seed| {
            let mut w = W::with_config(erpc_sim::SimConfig {
                seed,
                ring_entries: 1024,
                ..erpc_sim::SimConfig::default()
            });
            let mut ns = nodes(&mut w, 3, seed);
            connect(&mut w, &mut ns, 1, 0, 1);
            let idle = ns[1].ctx.sessions[0];
            connect(&mut w, &mut ns, 2, 0, 31);
            use_sessions(&mut w, &mut ns, 2, 31);
            w.step_ns = 1_000_000;
            run_steps(&mut w, &mut ns, 11_000);
            w.step_ns = 500;
            // Node 1 hears no SM while node 2 asks for one more session.
            let uri1 = erpc::Uri::new("node-1", 31850);
            w.net.sm_hub().set_cut_off(&uri1, true);
            let sn = ns[2].rpc.create_session("node-0:31850", 0).unwrap();
            run_until(&mut w, &mut ns, 100_000, "connect", |ns| {
                ns[2].rpc.is_connected(sn)
            });
            w.net.sm_hub().set_cut_off(&uri1, false);
            assert_eq!(ns[0].rpc.stats().sessions_reclaimed, 1);
            assert!(ns[1].rpc.is_connected(idle), "the notice was lost");
            // Node 1 sends a request on its session: the server has no
            // session of that number, tells node 1 again, and the request
            // fails rather than hanging.
            ns[1].ctx.todo = [Op {
                req_type: ECHO,
                req_len: 16,
                resp_len: 16,
            }]
            .into();
            {
                let n = &mut ns[1];
                app::start(&mut n.rpc, &mut n.ctx, 1);
            }
            run_until(&mut w, &mut ns, 1_000_000, "failure", |ns| {
                ns[1].ctx.failed == 1
            });
            assert_eq!(
                ns[1].ctx.failures,
                vec![RpcError::SessionEnded {
                    session: idle,
                    why: erpc::SessionEnd::ServerReclaimed
                }]
            );
            assert!(ns[0].rpc.stats().sm_reclaim_notices_resent >= 1);
            assert_eq!(ns[1].rpc.session_state(idle), None);
            assert_eq!(ns[0].ctx.handled, 31, "the request never ran");
        },
    );
}

/// A dispatch handler that panics unwinds out of `run_event_loop_once` to
/// the application (eRPC does not catch it: the handler runs on the
/// application's thread). An application that catches the panic and then
/// drops its Rpc must not hit a second panic in the drop: the slot the
/// handler left `InHandler` is freed like any other.
#[test]
fn an_rpc_dropped_after_its_dispatch_handler_panicked_frees_everything() {
    const PANICS: u8 = 200;
    fn h_panic<T: transport::Transport>(
        _: &mut erpc::Rpc<T, common::app::Ctx>,
        _: &mut common::app::Ctx,
        _: erpc::Request<'_>,
    ) {
        panic!("a dispatch handler panics (injected)");
    }
    common::with_seeds(
        "an_rpc_dropped_after_its_dispatch_handler_panicked_frees_everything",
        "hardening",
        &[3],
        |seed| {
            let mut w = common::SimWorld::new(seed);
            let mut ns: Vec<common::scenarios::N<common::SimWorld>> = (0..2)
                .map(|i| {
                    let b = common::app::register::<erpc_sim::SimTransport>(common::World::nexus(
                        &mut w,
                        &format!("node-{i}:31850"),
                    ))
                    .handler::<erpc_sim::SimTransport, common::app::Ctx>(PANICS, h_panic);
                    let nexus = b.build().expect("nexus");
                    common::Node::new(
                        &mut w,
                        &nexus,
                        i as u8,
                        common::app::Ctx::new(seed),
                        erpc::RpcConfig::default(),
                        Some(common::app::sm_handler::<erpc_sim::SimTransport>),
                    )
                })
                .collect();
            common::scenarios::connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            let req = ns[0].rpc.alloc_msg_buffer(16).expect("alloc");
            let resp = ns[0].rpc.alloc_msg_buffer(16).expect("alloc");
            ns[0]
                .rpc
                .enqueue_request(sn, PANICS, req, resp, common::app::client_cont::<_>, 0)
                .expect("enqueue");
            let mut panicked = false;
            for _ in 0..100_000 {
                ns[0].poll();
                let server = &mut ns[1];
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.poll()));
                if r.is_err() {
                    panicked = true;
                    break;
                }
                common::World::step(&mut w);
            }
            assert!(panicked, "the handler ran");
            // The server's application gives up on its Rpc: dropping it
            // must not panic again.
            let server = ns.pop().expect("two nodes");
            drop(server);
        },
    );
}
