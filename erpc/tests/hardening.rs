//! Session management and the data path against stale, hostile and
//! long-lived traffic (issue 12): request numbers across the 44-bit wrap,
//! late duplicate connect requests, forged connect floods, transport-type
//! and credit negotiation. Deterministic, on the simulated network; a
//! failing run prints its seed and a one-line replay command.

mod common;

use common::app::{self, Ctx, ECHO, Op, SIZED};
use common::scenarios::{N, check_done, connect, nodes};
use common::{Node, SimWorld, World, run_until, with_seeds};
use erpc::pkthdr::MAX_REQ_NUM;
use erpc::rng::Rng;
use erpc::{DropReason, RpcConfig, RpcError, SessionEventKind};

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
                vec![RpcError::ReqNumsExhausted { session: sn }]
            );
            run_until(&mut w, &mut ns, 1000, "event", |ns| {
                ns[0]
                    .ctx
                    .events
                    .iter()
                    .any(|e| e.kind == SessionEventKind::ReqNumsExhausted)
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
            let mut w = W::with_config(erpc::sim::SimConfig {
                seed,
                ring_entries: 64,
                ..erpc::sim::SimConfig::default()
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
            use erpc::sm_types::{SmPkt, SmPktType};
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
            let mut w = W::with_config(erpc::sim::SimConfig {
                seed,
                sm: erpc::sim::SmHubConfig {
                    delay_ns: 1_000_000,
                    jitter_ns: 200_000_000,
                    loss_ppm: 0,
                    dup_ppm: 500_000,
                },
                ..erpc::sim::SimConfig::default()
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
