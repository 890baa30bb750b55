//! No request waits forever (issue 30): a server that ends a session
//! tells its erpc-rs client, again when the client's packets keep coming;
//! Deterministic, on the simulated network (virtual time); a failing run
//! prints its seed and a one-line replay command.

mod common;

use common::app::{self, DEFER, ECHO, Op};
use common::scenarios::{N, connect, nodes_with};
use common::scenarios::{node_uri as uri, two_nodes as two};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::{RpcConfig, RpcError, SessionEventKind, Uri};

const FILE: &str = "liveness";

type W = SimWorld;

fn ops(t: u8, n: usize, len: usize) -> Vec<Op> {
    vec![
        Op {
            req_type: t,
            req_len: len,
            resp_len: len
        };
        n
    ]
}

fn issue(ns: &mut [N<W>], c: usize, ops: Vec<Op>) {
    ns[c].ctx.todo.extend(ops);
    let n = &mut ns[c];
    let k = n.ctx.todo.len();
    app::start(&mut n.rpc, &mut n.ctx, k);
}

fn events(n: &N<W>) -> Vec<SessionEventKind> {
    n.ctx.events.iter().map(|e| e.kind).collect()
}

fn run_steps(w: &mut W, ns: &mut [N<W>], steps: u64) {
    for _ in 0..steps {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

/// The server's application resets a session with requests in flight:
/// the client is told at once and its requests fail, instead of being
/// resent every retransmission timeout forever.
#[test]
fn a_session_the_server_resets_ends_at_its_client() {
    with_seeds(
        "a_session_the_server_resets_ends_at_its_client",
        FILE,
        &[1, 2],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 4, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 4
            });
            issue(&mut ns, 0, ops(DEFER, 3, 64));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 3
            });
            let srv = ns[1].rpc.session_nums()[0];
            ns[1].rpc.reset_session(srv).unwrap();
            run_until(&mut w, &mut ns, 1_000_000, "the client hears", |ns| {
                ns[0].ctx.failed == 3
            });
            assert!(
                ns[0].ctx.failures.iter().all(|e| matches!(
                    e,
                    RpcError::SessionEnded {
                        why: erpc::SessionEnd::ServerEnded,
                        ..
                    }
                )),
                "{:?}",
                ns[0].ctx.failures
            );
            assert!(
                events(&ns[0]).contains(&SessionEventKind::Ended(erpc::SessionEnd::ServerEnded))
            );
            assert_eq!(ns[0].rpc.num_sessions(), 0);
            assert_eq!(ns[1].rpc.stats().sm_end_notices, 1);
        },
    );
}

/// The notice of a server reset is lost: the client's next request to the
/// session brings it again.
#[test]
fn a_lost_end_notice_comes_again_with_the_clients_next_packet() {
    with_seeds(
        "a_lost_end_notice_comes_again_with_the_clients_next_packet",
        FILE,
        &[3],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 2, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 2
            });
            // The client's Nexus is unreachable while the server resets
            // the session (shorter than the failure timeout).
            let client = Uri::parse(&uri(0)).unwrap();
            w.net.sm_hub().set_cut_off(&client, true);
            let srv = ns[1].rpc.session_nums()[0];
            ns[1].rpc.reset_session(srv).unwrap();
            run_steps(&mut w, &mut ns, 200);
            w.net.sm_hub().set_cut_off(&client, false);
            assert_eq!(ns[0].rpc.num_sessions(), 1, "the notice was lost");
            issue(&mut ns, 0, ops(ECHO, 1, 64));
            run_until(&mut w, &mut ns, 1_000_000, "the client hears", |ns| {
                ns[0].ctx.failed == 1
            });
            assert!(matches!(
                ns[0].ctx.failures[0],
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::ServerEnded,
                    ..
                }
            ));
            assert!(ns[1].rpc.stats().sm_reclaim_notices_resent >= 1);
        },
    );
}

/// The server's Nexus declares the client failed on its own (here by
/// fault injection, as after losing its pings one way): the client, alive,
/// is told and does not resend forever.
#[test]
fn a_client_declared_failed_by_the_server_alone_is_told() {
    with_seeds(
        "a_client_declared_failed_by_the_server_alone_is_told",
        FILE,
        &[4],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 2, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 2
            });
            issue(&mut ns, 0, ops(DEFER, 2, 64));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            ns[1].rpc.fault_fail_remote(&uri(0)).unwrap();
            run_until(&mut w, &mut ns, 1_000_000, "the client hears", |ns| {
                ns[0].ctx.failed == 2
            });
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::ServerEnded,
                    ..
                }
            )));
        },
    );
}

const MS: u64 = 1_000_000;

fn with_stall(ms: u64) -> RpcConfig {
    RpcConfig {
        stall_timeout_ms: Some(ms),
        ..RpcConfig::default()
    }
}

/// Steps the world for `dur` ns of virtual time, polling only the nodes
/// in `polled` (the others' Rpcs do not run; their Nexuses do).
fn run_for(w: &mut W, ns: &mut [N<W>], dur: u64, polled: &[usize]) {
    let end = w.now_ns() + dur;
    while w.now_ns() < end {
        for &i in polled {
            ns[i].poll();
        }
        w.step();
    }
}

/// A handler that takes far longer than the stall bound, at an erpc-rs
/// server, never fails its request: the client's retransmissions are
/// answered "in progress", which the bound counts as progress.
#[test]
fn a_slow_handler_at_an_erpc_rs_server_never_stalls_its_request() {
    with_seeds(
        "a_slow_handler_at_an_erpc_rs_server_never_stalls_its_request",
        FILE,
        &[11, 12],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes_with(&mut w, 2, seed, with_stall(200));
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(DEFER, 2, 64));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            run_for(&mut w, &mut ns, 2_000 * MS, &[0, 1]);
            assert_eq!(ns[0].ctx.failed, 0, "{:?}", ns[0].ctx.failures);
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert!(c.in_progress_received > 0, "{c}");
            assert!(s.in_progress_sent >= c.in_progress_received, "{s}");
            assert_eq!(c.sessions_stalled, 0);
            let n = &mut ns[1];
            app::respond_deferred(&mut n.rpc, &mut n.ctx);
            run_until(&mut w, &mut ns, 100_000, "responses", |ns| {
                ns[0].ctx.completed == 2
            });
            assert_eq!(ns[1].ctx.handled, 2, "never run twice");
            assert!(
                events(&ns[0])
                    .iter()
                    .all(|e| *e == SessionEventKind::Connected)
            );
        },
    );
}

/// The server's Rpc stops running while its Nexus still answers pings:
/// nothing declares the server failed, and the stall bound ends the
/// client's requests (they were resent every retransmission timeout,
/// forever).
#[test]
fn requests_to_a_server_rpc_that_stopped_running_fail_at_the_stall_bound() {
    with_seeds(
        "requests_to_a_server_rpc_that_stopped_running_fail_at_the_stall_bound",
        FILE,
        &[13, 14],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes_with(&mut w, 2, seed, with_stall(2_000));
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 4, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 4
            });
            // From here on, only the client's Rpc runs.
            issue(&mut ns, 0, ops(ECHO, 3, 64));
            let t0 = w.now_ns();
            while ns[0].ctx.failed < 3 {
                assert!(w.now_ns() - t0 < 60_000 * MS, "still waiting after 60 s");
                ns[0].poll();
                w.step();
            }
            let took = w.now_ns() - t0;
            let cfg = ns[0].rpc.config();
            let slack = cfg.rto_us * 1_000 + 2 * cfg.pkt_loss_scan_us * 1_000 + MS;
            assert!(
                (2_000 * MS..=2_000 * MS + slack).contains(&took),
                "failed after {took} ns"
            );
            assert!(
                ns[0].ctx.failures.iter().all(|e| matches!(
                    e,
                    RpcError::SessionEnded {
                        why: erpc::SessionEnd::Stalled,
                        ..
                    }
                )),
                "{:?}",
                ns[0].ctx.failures
            );
            assert_eq!(
                events(&ns[0]).last(),
                Some(&SessionEventKind::Ended(erpc::SessionEnd::Stalled))
            );
            assert_eq!(ns[0].rpc.stats().sessions_stalled, 1);
            assert_eq!(ns[0].rpc.num_sessions(), 0);
            assert_eq!(
                ns[0].rpc.nexus().liveness_stats().failed_silent,
                0,
                "the server's Nexus answered every ping"
            );
        },
    );
}

/// Both ends stop for longer than the retransmission timeout (one
/// process descheduled, or two on a loaded machine) with requests sent
/// and unanswered. The client runs first: time in which its event loop
/// did not run is evidence against nobody, so nothing is resent.
#[test]
fn a_pause_of_both_ends_is_not_taken_for_loss() {
    with_seeds(
        "a_pause_of_both_ends_is_not_taken_for_loss",
        FILE,
        &[15, 16],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 8, 64));
            ns[0].poll();
            assert_eq!(ns[0].rpc.stats().tx_pkts, 8, "all sent at once");
            let rto = ns[0].rpc.config().rto_us * 1_000;
            w.net.advance(20 * rto);
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 8
            });
            let c = ns[0].rpc.stats();
            assert_eq!(c.retransmissions, 0, "{c}");
            assert!(c.pauses_discounted >= 1, "{c}");
            assert_eq!(ns[1].rpc.stats().dup_req_resp_resent, 0);
        },
    );
}

/// A client whose event loop stops for several stall bounds while its
/// request waits for a slow handler does not fail the request when it
/// runs again: the bound counts only time in which the client ran.
#[test]
fn a_paused_client_does_not_stall_its_own_requests() {
    with_seeds(
        "a_paused_client_does_not_stall_its_own_requests",
        FILE,
        &[17],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes_with(&mut w, 2, seed, with_stall(200));
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(DEFER, 1, 64));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 1
            });
            // The client is off the CPU for 1 s; the server runs.
            run_for(&mut w, &mut ns, 1_000 * MS, &[1]);
            let n = &mut ns[1];
            app::respond_deferred(&mut n.rpc, &mut n.ctx);
            run_until(&mut w, &mut ns, 100_000, "response", |ns| {
                ns[0].ctx.completed == 1
            });
            assert_eq!(ns[0].ctx.failed, 0, "{:?}", ns[0].ctx.failures);
            assert_eq!(ns[0].rpc.stats().sessions_stalled, 0);
        },
    );
}

/// A client stops in the middle of sending a multi-packet request (its
/// Rpc stops running; its Nexus answers pings, so it is not declared
/// failed): the server frees the half-received request after the stall
/// bound instead of pinning its buffer for ever, and tells the client
/// when it comes back.
#[test]
fn a_half_received_request_is_freed_after_the_stall_bound() {
    with_seeds(
        "a_half_received_request_is_freed_after_the_stall_bound",
        FILE,
        &[18, 19],
        |seed| {
            let mut w = W::new(seed);
            let cfg = RpcConfig {
                session_credits: 2,
                ..with_stall(500)
            };
            let mut ns = nodes_with(&mut w, 2, seed, cfg);
            connect(&mut w, &mut ns, 0, 1, 1);
            // 20 packets, at most two in flight.
            issue(&mut ns, 0, ops(ECHO, 1, 20 * 968));
            run_until(&mut w, &mut ns, 100_000, "begun", |ns| {
                ns[1].rpc.stats().rx_accepted >= 4
            });
            run_for(&mut w, &mut ns, 600 * MS, &[1]);
            let s = ns[1].rpc.stats();
            assert_eq!(s.reassemblies_expired, 1, "{s}");
            assert_eq!(s.reqs_failed_at_server, 1, "{s}");
            assert_eq!(ns[1].ctx.handled, 0);
            run_until(&mut w, &mut ns, 1_000_000, "told", |ns| {
                ns[0].ctx.failed == 1
            });
            assert!(
                matches!(
                    ns[0].ctx.failures[0],
                    RpcError::Server {
                        err: erpc::ServerError::Incomplete,
                        ..
                    }
                ),
                "{:?}",
                ns[0].ctx.failures
            );
            // The session goes on.
            issue(&mut ns, 0, ops(ECHO, 3, 3000));
            run_until(&mut w, &mut ns, 1_000_000, "more", |ns| {
                ns[0].ctx.completed == 3
            });
        },
    );
}

/// A client resets its session and its disconnect request is lost: the
/// request is sent again until the server answers, so the server does
/// not hold a session (its RX ring entries and buffers) that nobody uses
/// for ever.
#[test]
fn a_lost_disconnect_is_sent_again() {
    with_seeds("a_lost_disconnect_is_sent_again", FILE, &[23, 24], |seed| {
        let (mut w, mut ns) = two(seed);
        connect(&mut w, &mut ns, 0, 1, 1);
        issue(&mut ns, 0, ops(ECHO, 4, 64));
        run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
            ns[0].ctx.completed == 4
        });
        let server = Uri::parse(&uri(1)).unwrap();
        w.net.sm_hub().set_cut_off(&server, true);
        let sn = ns[0].ctx.sessions[0];
        ns[0].rpc.reset_session(sn).unwrap();
        run_steps(&mut w, &mut ns, 10);
        w.net.sm_hub().set_cut_off(&server, false);
        assert_eq!(ns[1].rpc.num_sessions(), 1, "the first disconnect was lost");
        run_until(&mut w, &mut ns, 1_000_000, "server session freed", |ns| {
            ns[1].rpc.num_sessions() == 0
        });
        assert_eq!(ns[0].rpc.num_sessions(), 0);
    });
}

/// A client forgets a session it used without the server hearing of it
/// (its disconnect was lost for longer than it retries). When the
/// server's RX ring is full and a new client asks for a session, the
/// long-idle served session is reclaimed for it, and its client, alive,
/// is told.
#[test]
fn a_long_idle_served_session_is_reclaimed_when_the_ring_is_full() {
    with_seeds(
        "a_long_idle_served_session_is_reclaimed_when_the_ring_is_full",
        FILE,
        &[25],
        |seed| {
            let mut w = W::new(seed);
            let cfg = RpcConfig {
                idle_session_reclaim_ms: Some(2_000),
                ..RpcConfig::default()
            };
            let mut ns: Vec<N<W>> = (0..3)
                .map(|i| {
                    // Keep-alive tolerates the SM outage below.
                    let nexus = app::register::<<W as World>::T>(w.nexus(&uri(i)))
                        .failure_timeout_ms(5_000)
                        .build()
                        .unwrap();
                    // The server's ring holds two sessions of 32 credits.
                    let t = w
                        .net
                        .add_transport_with_ring(if i == 1 { 64 } else { 4096 });
                    let rpc = erpc::Rpc::builder(&nexus, t, w.allocator(8 << 20))
                        .id(i as u8)
                        .config(cfg)
                        .session_handler(app::sm_handler)
                        .build()
                        .unwrap();
                    common::Node {
                        rpc,
                        ctx: app::Ctx::new(seed + i as u64),
                    }
                })
                .collect();
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut ns, 0, ops(ECHO, 4, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[0].ctx.completed == 4
            });
            // Client 0 forgets its session while every SM packet to the
            // server is lost for longer than its disconnect is retried.
            let server = Uri::parse(&uri(1)).unwrap();
            w.net.sm_hub().set_cut_off(&server, true);
            let sn = ns[0].ctx.sessions.remove(0);
            ns[0].rpc.reset_session(sn).unwrap();
            // (Its disconnect is retried for four failure timeouts.)
            run_for(&mut w, &mut ns, 2_500 * MS, &[0, 1, 2]);
            w.net.sm_hub().set_cut_off(&server, false);
            assert_eq!(ns[1].rpc.num_sessions(), 1, "the server never heard");
            // Client 2 takes the free half of the ring...
            connect(&mut w, &mut ns, 2, 1, 1);
            // ... and, once the forgotten session has been idle for the
            // reclaim time, the other half.
            run_for(&mut w, &mut ns, 2_000 * MS, &[0, 1, 2]);
            connect(&mut w, &mut ns, 2, 1, 1);
            let s = ns[1].rpc.stats();
            assert_eq!(
                (s.sessions_reclaimed, s.sessions_reclaimed_idle),
                (1, 1),
                "{s}"
            );
            assert_eq!(ns[1].rpc.num_sessions(), 2);
            issue(&mut ns, 2, ops(ECHO, 4, 64));
            run_until(&mut w, &mut ns, 100_000, "echoes", |ns| {
                ns[2].ctx.completed == 4
            });
        },
    );
}
