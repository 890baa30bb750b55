//! Failure detection, session reset and reconnect, on the deterministic
//! simulated network (virtual time; a crash is an endpoint and a Nexus cut
//! off, then dropped without a word). A failing run prints its seed and a
//! one-line replay command.

mod common;

use std::sync::Arc;

use common::app::{self, Ctx, DEFER, ECHO, Op, SIZED};
use common::scenarios::{N, check_done, connect};
use common::scenarios::{node_uri as uri, two_nodes as two};
use common::{Node, SimWorld, World, run_until, with_seeds};
use erpc::wire::{PktHdr, PktType};
use erpc::{
    DropReason, Nexus, RespondError, RpcConfig, RpcError, SessionEventKind, SessionState, Uri,
};

const FILE: &str = "failure";
const MS: u64 = 1_000_000;

type W = SimWorld;

/// Crashes node `i`: its data endpoint and its Nexus go silent, then the
/// process (Rpc and Nexus) is dropped; whatever it tries to send on the
/// way out is lost.
fn crash(w: &mut W, ns: &mut Vec<N<W>>, i: usize) -> N<W> {
    w.net.crash(i);
    w.net
        .sm_hub()
        .set_cut_off(&Uri::parse(&uri(i)).unwrap(), true);
    ns.remove(i)
}

/// A new process at node `i`'s address and URI (a restart), appended.
fn restart(w: &mut W, ns: &mut Vec<N<W>>, i: usize, seed: u64) {
    w.net
        .sm_hub()
        .set_cut_off(&Uri::parse(&uri(i)).unwrap(), false);
    let t = w.net.restart(i);
    let nexus = app::register::<<W as World>::T>(w.nexus(&uri(i)))
        .build()
        .unwrap();
    let rpc = erpc::Rpc::builder(&nexus, t, w.allocator(8 << 20))
        .id(i as u8)
        .session_handler(app::sm_handler)
        .build()
        .unwrap();
    ns.push(Node {
        rpc,
        ctx: Ctx::new(seed ^ 0xdead),
    });
}

fn issue(w: &mut W, ns: &mut [N<W>], c: usize, ops: Vec<Op>) {
    let _ = w;
    ns[c].ctx.todo.extend(ops);
    let n = &mut ns[c];
    let k = n.ctx.todo.len();
    app::start(&mut n.rpc, &mut n.ctx, k);
}

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

fn bufs_in_use<T: transport::Transport, C>(rpc: &erpc::Rpc<T, C>) -> u64 {
    rpc.alloc_stats().classes.iter().map(|c| c.in_use).sum()
}

fn events(n: &N<W>) -> Vec<SessionEventKind> {
    n.ctx.events.iter().map(|e| e.kind).collect()
}

#[test]
fn a_dead_peer_fails_outstanding_requests_after_the_failure_timeout() {
    with_seeds(
        "a_dead_peer_fails_outstanding_requests_after_the_failure_timeout",
        FILE,
        &[1, 2],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 2);
            let baseline = bufs_in_use(&ns[0].rpc);
            // 10 requests the server holds, 30 more waiting in the backlogs.
            issue(&mut w, &mut ns, 0, ops(DEFER, 40, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 16
            });
            let t0 = w.now_ns();
            let dead = crash(&mut w, &mut ns, 1);
            drop(dead);
            run_until(&mut w, &mut ns, 10_000_000, "failed", |ns| {
                ns[0].ctx.failed == 40
            });
            let took = w.now_ns() - t0;
            // The failure timeout, plus at most a ping interval and a tick.
            assert!(
                (500 * MS..=560 * MS).contains(&took),
                "detected after {took} ns"
            );
            assert!(
                ns[0].ctx.failures.iter().all(|e| matches!(
                    e,
                    RpcError::SessionEnded {
                        why: erpc::SessionEnd::PeerFailed,
                        ..
                    }
                )),
                "{:?}",
                ns[0].ctx.failures
            );
            assert_eq!(
                events(&ns[0])
                    .iter()
                    .filter(|&&k| k == SessionEventKind::Ended(erpc::SessionEnd::PeerFailed))
                    .count(),
                2
            );
            assert_eq!(ns[0].rpc.num_sessions(), 0);
            assert_eq!(bufs_in_use(&ns[0].rpc), baseline, "every buffer back");
            let l = ns[0].rpc.nexus().liveness_stats();
            assert_eq!((l.failed_silent, l.tracked), (1, 0), "{l:?}");
            assert!(l.pings_sent >= 9);
            assert_eq!(ns[0].rpc.stats().sessions_peer_failed, 2);
        },
    );
}

#[test]
fn server_sessions_of_a_failed_client_are_freed_once_their_handlers_respond() {
    with_seeds(
        "server_sessions_of_a_failed_client_are_freed_once_their_handlers_respond",
        FILE,
        &[3],
        |seed| {
            let (mut w, mut ns) = two(seed);
            let baseline = bufs_in_use(&ns[1].rpc);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(DEFER, 3, 2000));
            issue(&mut w, &mut ns, 0, ops(ECHO, 2, 5000));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 3
            });
            let ssn = ns[1].rpc.session_nums()[0];
            let client = crash(&mut w, &mut ns, 0);
            drop(client);
            // ns[0] is the server now.
            run_until(&mut w, &mut ns, 10_000_000, "reset", |ns| {
                ns[0].rpc.num_sessions() == 0
            });
            assert_eq!(ns[0].rpc.session_state(ssn), Some(SessionState::Resetting));
            let r = {
                let n = &mut ns[0];
                app::respond_deferred(&mut n.rpc, &mut n.ctx)
            };
            assert_eq!(r.len(), 3);
            assert!(
                r.iter()
                    .all(|x| matches!(x, Err(RespondError::SessionReset { .. }))),
                "{r:?}"
            );
            assert_eq!(
                ns[0].rpc.session_state(ssn),
                None,
                "freed after the last handler"
            );
            assert_eq!(bufs_in_use(&ns[0].rpc), baseline, "no buffer leaked");
            assert_eq!(ns[0].rpc.stats().resps_discarded, 3);
        },
    );
}

/// An eRPC data packet (header only) as payload.
fn pkt(t: PktType, session: u16, req_num: u64, pkt_num: u16, msg_size: u32) -> Vec<u8> {
    let h = PktHdr {
        req_type: ECHO,
        msg_size,
        dest_session_num: session,
        pkt_type: t,
        pkt_num,
        req_num,
    };
    let mut b = vec![0u8; transport::ERPC_HDR_BYTES + msg_size.min(968) as usize];
    h.write_to(&mut b).expect("fields in range");
    b
}

#[test]
fn a_restarted_peer_gets_new_sessions_and_old_packets_are_dropped() {
    with_seeds(
        "a_restarted_peer_gets_new_sessions_and_old_packets_are_dropped",
        FILE,
        &[4, 5],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(ECHO, 20, 100));
            run_until(&mut w, &mut ns, 100_000, "first", |ns| {
                ns[0].ctx.completed == 20
            });
            let old_sn = ns[0].ctx.sessions[0];
            let old_server_sn = ns[1].rpc.session_nums()[0];
            drop(crash(&mut w, &mut ns, 1));
            run_until(&mut w, &mut ns, 10_000_000, "detected", |ns| {
                ns[0]
                    .ctx
                    .events
                    .iter()
                    .any(|e| e.kind == SessionEventKind::Ended(erpc::SessionEnd::PeerFailed))
            });
            restart(&mut w, &mut ns, 1, seed);
            ns[0].ctx.sessions.clear();
            connect(&mut w, &mut ns, 0, 1, 1);
            let new_sn = ns[0].ctx.sessions[0];
            issue(&mut w, &mut ns, 0, ops(ECHO, 20, 100));
            run_until(&mut w, &mut ns, 100_000, "second", |ns| {
                ns[0].ctx.completed == 40
            });
            check_done::<W>(&ns);
            // Packets of the previous incarnation: responses to the old
            // session, responses to the new session number with the request
            // numbers a base-0 session would use, requests to the restarted
            // server's old session. All dropped, counted, never delivered.
            let before_c = ns[0].rpc.stats().total_drops();
            let before_s = ns[1].rpc.stats().total_drops();
            for r in 8..24u64 {
                w.net
                    .inject_payload(0, &pkt(PktType::Resp, old_sn, r, 0, 100));
                w.net
                    .inject_payload(0, &pkt(PktType::Resp, new_sn, r, 0, 100));
                w.net
                    .inject_payload(1, &pkt(PktType::Req, old_server_sn, r + 8, 0, 100));
            }
            for _ in 0..5 {
                for n in ns.iter_mut() {
                    n.poll();
                }
                w.step();
            }
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert_eq!(c.total_drops() - before_c, 32, "{c}");
            assert_eq!(s.total_drops() - before_s, 16, "{s}");
            assert!(s.drops(DropReason::UnknownSession) + s.drops(DropReason::StaleReqNum) >= 16);
            assert_eq!(ns[0].ctx.completed, 40);
            check_done::<W>(&ns);
        },
    );
}

#[test]
fn a_peer_restarted_within_the_failure_timeout_is_noticed_by_its_incarnation() {
    with_seeds(
        "a_peer_restarted_within_the_failure_timeout_is_noticed_by_its_incarnation",
        FILE,
        &[6],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(DEFER, 4, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 4
            });
            let t0 = w.now_ns();
            drop(crash(&mut w, &mut ns, 1));
            restart(&mut w, &mut ns, 1, seed);
            run_until(&mut w, &mut ns, 10_000_000, "failed", |ns| {
                ns[0].ctx.failed == 4
            });
            let took = w.now_ns() - t0;
            // The next ping's answer carries the new incarnation.
            assert!(took < 60 * MS, "noticed after {took} ns");
            assert_eq!(ns[0].rpc.nexus().liveness_stats().failed_restarted, 1);
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::PeerFailed,
                    ..
                }
            )));
        },
    );
}

#[test]
fn a_dropped_remote_rpc_fails_the_sessions_to_it() {
    with_seeds(
        "a_dropped_remote_rpc_fails_the_sessions_to_it",
        FILE,
        &[7],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(DEFER, 2, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            // The server's Rpc goes away; its process (Nexus) lives on.
            let server = ns.remove(1);
            let nexus: Arc<Nexus> = server.rpc.nexus().clone();
            drop(server);
            let t0 = w.now_ns();
            run_until(&mut w, &mut ns, 10_000_000, "failed", |ns| {
                ns[0].ctx.failed == 2
            });
            assert!(w.now_ns() - t0 < 120 * MS, "two ping intervals at most");
            assert_eq!(ns[0].rpc.nexus().liveness_stats().failed_rpc_gone, 1);
            assert_eq!(ns[0].rpc.num_sessions(), 0);
            drop(nexus);
        },
    );
}

#[test]
fn fault_injection_fails_a_remote_and_resets_sessions() {
    with_seeds(
        "fault_injection_fails_a_remote_and_resets_sessions",
        FILE,
        &[8],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 2);
            let (a, b) = (ns[0].ctx.sessions[0], ns[0].ctx.sessions[1]);
            // reset_session: requests fail with SessionReset, the server is told.
            ns[0].ctx.sessions = vec![a];
            issue(&mut w, &mut ns, 0, ops(DEFER, 3, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 3
            });
            ns[0].rpc.fault_reset_session(a).unwrap();
            assert_eq!(ns[0].rpc.session_state(a), None, "gone at once");
            assert!(ns[0].rpc.reset_session(a).is_err());
            run_until(&mut w, &mut ns, 100_000, "reset", |ns| {
                ns[0].ctx.failed == 3
            });
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::Reset,
                    ..
                }
            )));
            assert!(events(&ns[0]).contains(&SessionEventKind::Ended(erpc::SessionEnd::Reset)));
            // The one-shot disconnect reached the server: its session waits
            // for the held handlers, then goes.
            run_until(&mut w, &mut ns, 100_000, "server", |ns| {
                ns[1].rpc.num_sessions() == 1
            });
            let r = {
                let n = &mut ns[1];
                app::respond_deferred(&mut n.rpc, &mut n.ctx)
            };
            assert!(r.iter().all(Result::is_err));
            // fault_fail_remote: the other session fails as if the peer died.
            ns[0].ctx.sessions = vec![b];
            ns[0].ctx.failures.clear();
            issue(&mut w, &mut ns, 0, ops(DEFER, 2, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            ns[0].rpc.fault_fail_remote(&uri(1)).unwrap();
            run_until(&mut w, &mut ns, 100_000, "failed", |ns| {
                ns[0].ctx.failed == 5
            });
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::PeerFailed,
                    ..
                }
            )));
            assert_eq!(ns[0].rpc.num_sessions(), 0);
            assert_eq!(ns[0].rpc.nexus().liveness_stats().failed_injected, 1);
            // Dropping the next packets of a session is repaired by loss recovery.
            ns[0].ctx.sessions.clear();
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            ns[0].rpc.fault_drop_tx(sn, 5).unwrap();
            issue(&mut w, &mut ns, 0, ops(SIZED, 4, 3000));
            run_until(&mut w, &mut ns, 1_000_000, "dropped", |ns| {
                ns[0].ctx.completed == 4
            });
            assert_eq!(ns[0].rpc.stats().tx_fault_dropped, 5);
        },
    );
}

#[test]
fn a_connect_to_a_dead_peer_times_out_and_its_requests_fail() {
    with_seeds(
        "a_connect_to_a_dead_peer_times_out_and_its_requests_fail",
        FILE,
        &[9],
        |seed| {
            let (mut w, mut ns) = two(seed);
            let sn = ns[0].rpc.create_session("nobody:31850", 0).unwrap();
            ns[0].ctx.sessions = vec![sn];
            issue(&mut w, &mut ns, 0, ops(ECHO, 3, 10));
            let t0 = w.now_ns();
            run_until(&mut w, &mut ns, 10_000_000, "timeout", |ns| {
                ns[0].ctx.failed == 3
            });
            assert!((500 * MS..510 * MS).contains(&(w.now_ns() - t0)));
            assert_eq!(
                events(&ns[0]),
                vec![SessionEventKind::Ended(erpc::SessionEnd::ConnectTimedOut)]
            );
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::ConnectTimedOut,
                    ..
                }
            )));
            assert_eq!(ns[0].rpc.stats().sm_timeouts, 1);
            assert_eq!(ns[0].rpc.num_sessions(), 0);
        },
    );
}

/// A Nexus that presents itself as the C++ eRPC does (no erpc-rs
/// extensions: never pinged, no "in progress" notices), with `cfg`.
fn unpingable_pair(seed: u64, cfg: RpcConfig) -> (W, Vec<N<W>>) {
    let mut w = W::new(seed);
    let client_nexus = app::register::<<W as World>::T>(w.nexus(&uri(0)))
        .build()
        .unwrap();
    let server_nexus = app::register::<<W as World>::T>(w.nexus(&uri(1)))
        .sm_extensions(false)
        .build()
        .unwrap();
    let ns = vec![
        Node::new(
            &mut w,
            &client_nexus,
            0,
            Ctx::new(seed),
            cfg,
            Some(app::sm_handler),
        ),
        Node::new(
            &mut w,
            &server_nexus,
            1,
            Ctx::new(seed + 1),
            cfg,
            Some(app::sm_handler),
        ),
    ];
    (w, ns)
}

#[test]
fn sessions_to_an_unpingable_peer_fail_at_the_stall_bound() {
    // A peer that cannot be pinged (a C++ eRPC process) is never declared
    // failed; when it dies, its requests fail at the stall bound.
    with_seeds(
        "sessions_to_an_unpingable_peer_fail_at_the_stall_bound",
        FILE,
        &[10],
        |seed| {
            let (mut w, mut ns) = unpingable_pair(seed, RpcConfig::default());
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(ECHO, 10, 100));
            run_until(&mut w, &mut ns, 100_000, "works", |ns| {
                ns[0].ctx.completed == 10
            });
            assert_eq!(
                ns[0].rpc.nexus().liveness_stats().tracked,
                0,
                "never pinged"
            );
            issue(&mut w, &mut ns, 0, ops(DEFER, 2, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            drop(crash(&mut w, &mut ns, 1));
            let t0 = w.now_ns();
            run_until(&mut w, &mut ns, 10_000_000, "failed", |ns| {
                ns[0].ctx.failed == 2
            });
            let took = w.now_ns() - t0;
            let bound = erpc::STALL_TIMEOUT_MS * MS;
            assert!((bound..=bound + 10 * MS).contains(&took), "{took}");
            assert!(ns[0].ctx.failures.iter().all(|e| matches!(
                e,
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::Stalled,
                    ..
                }
            )));
        },
    );
}

#[test]
fn a_handler_slower_than_the_failure_timeout_at_an_unpingable_peer_completes() {
    // A C++ eRPC server's handler that runs for 2 s (four failure
    // timeouts) is not a dead peer: the request completes, once.
    with_seeds(
        "a_handler_slower_than_the_failure_timeout_at_an_unpingable_peer_completes",
        FILE,
        &[10],
        |seed| {
            let (mut w, mut ns) = unpingable_pair(seed, RpcConfig::default());
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(DEFER, 2, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2
            });
            let t0 = w.now_ns();
            while w.now_ns() - t0 < 2_000 * MS {
                for n in ns.iter_mut() {
                    n.poll();
                }
                w.step();
            }
            assert_eq!(ns[0].ctx.failed, 0, "{:?}", ns[0].ctx.failures);
            let n = &mut ns[1];
            app::respond_deferred(&mut n.rpc, &mut n.ctx);
            run_until(&mut w, &mut ns, 100_000, "done", |ns| {
                ns[0].ctx.completed == 2
            });
            assert_eq!(ns[1].ctx.handled, 2);
            assert_eq!(
                ns[1].rpc.stats().in_progress_sent,
                0,
                "a C++ client is never sent one"
            );
        },
    );
}

#[test]
fn destroying_a_session_to_a_cpp_server_mid_request_disconnects_once_its_slots_finished() {
    // A C++ eRPC server asserts that every slot of a session it is asked
    // to disconnect is finished. Destroying a session with requests
    // running there fails them to the application at once, and sends the
    // disconnect only after their responses came back.
    with_seeds(
        "destroying_a_session_to_a_cpp_server_mid_request_disconnects_once_its_slots_finished",
        FILE,
        &[21, 22],
        |seed| {
            let (mut w, mut ns) = unpingable_pair(seed, RpcConfig::default());
            connect(&mut w, &mut ns, 0, 1, 1);
            issue(&mut w, &mut ns, 0, ops(DEFER, 2, 100));
            issue(&mut w, &mut ns, 0, ops(ECHO, 1, 3000));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 2 && ns[0].ctx.completed == 1
            });
            // One more waits in the backlog behind a full window.
            issue(&mut w, &mut ns, 0, ops(DEFER, 7, 100));
            run_until(&mut w, &mut ns, 100_000, "window full", |ns| {
                ns[1].ctx.deferred.len() == 8
            });
            let sn = ns[0].ctx.sessions[0];
            ns[0].rpc.destroy_session(sn).unwrap();
            run_until(&mut w, &mut ns, 100_000, "failed locally", |ns| {
                ns[0].ctx.failed == 9
            });
            assert!(
                ns[0]
                    .ctx
                    .failures
                    .iter()
                    .all(|e| matches!(e, RpcError::SessionDestroyed { .. }))
            );
            assert_eq!(
                ns[0].rpc.session_state(sn),
                Some(erpc::SessionState::DisconnectInProgress)
            );
            let t0 = w.now_ns();
            while w.now_ns() - t0 < 100 * MS {
                for n in ns.iter_mut() {
                    n.poll();
                }
                w.step();
            }
            let srv = ns[1].rpc.session_nums()[0];
            assert_eq!(
                ns[1].rpc.session_state(srv),
                Some(erpc::SessionState::Connected),
                "no disconnect while requests of the session run"
            );
            let n = &mut ns[1];
            app::respond_deferred(&mut n.rpc, &mut n.ctx);
            run_until(&mut w, &mut ns, 1_000_000, "disconnected", |ns| {
                ns[1].rpc.num_sessions() == 0 && ns[0].rpc.num_sessions() == 0
            });
            assert_eq!(
                events(&ns[0]),
                vec![SessionEventKind::Connected, SessionEventKind::Disconnected]
            );
            let c = ns[0].rpc.stats();
            assert_eq!((c.sessions_drained, c.drained_reqs), (1, 8), "{c}");
            assert_eq!(c.reqs_completed, c.reqs_enqueued, "{c}");
            assert_eq!(ns[1].rpc.stats().resps_discarded, 0);
            // Nothing leaked at the client: its allocator is back to empty.
            assert_eq!(ns[0].rpc.num_sessions(), 0);
        },
    );
}

#[test]
fn a_held_request_shows_how_long_each_end_has_waited() {
    with_seeds(
        "a_held_request_shows_how_long_each_end_has_waited",
        FILE,
        &[21],
        |seed| {
            let (mut w, mut ns) = two(seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            issue(&mut w, &mut ns, 0, ops(DEFER, 1, 100));
            run_until(&mut w, &mut ns, 100_000, "held", |ns| {
                ns[1].ctx.deferred.len() == 1
            });
            // 50 ms of virtual time with the server's handler holding the
            // request (its client's retransmissions get "in progress"
            // answers, so nothing fails).
            let held_at = w.now_ns();
            while w.now_ns() < held_at + 50 * MS {
                w.step();
                for n in ns.iter_mut() {
                    n.poll();
                }
            }
            let c = ns[0].rpc.session_info(sn).unwrap();
            let busy: Vec<_> = c.slots.iter().filter(|s| s.waited_ns.is_some()).collect();
            assert_eq!(busy.len(), 1, "{:?}", c.slots);
            assert!(
                busy[0].state == "in_flight" || busy[0].state == "waiting",
                "{:?}",
                busy[0]
            );
            assert!(busy[0].tx_pkts.is_some() && busy[0].rx_pkts.is_some());
            assert!(c.quiet_ns.is_some());
            let idle = c.slots.iter().filter(|s| s.state == "idle").count();
            assert_eq!(idle, 7, "{:?}", c.slots);
            let srv_sn = ns[1].rpc.session_nums()[0];
            let s = ns[1].rpc.session_info(srv_sn).unwrap();
            let held: Vec<_> = s.slots.iter().filter(|s| s.waited_ns.is_some()).collect();
            assert_eq!(held.len(), 1, "{:?}", s.slots);
            assert_eq!(held[0].state, "deferred");
            // The handler has had it since before `held_at`.
            let waited = held[0].waited_ns.unwrap();
            assert!(waited >= 50 * MS, "server slot waited {waited} ns");
            assert!(waited <= w.now_ns(), "{waited}");
            // Once answered, no slot waits.
            let r = {
                let n = &mut ns[1];
                app::respond_deferred(&mut n.rpc, &mut n.ctx)
            };
            assert!(r.iter().all(Result::is_ok));
            run_until(&mut w, &mut ns, 100_000, "done", |ns| {
                ns[0].ctx.completed == 1
            });
            let c = ns[0].rpc.session_info(sn).unwrap();
            assert!(
                c.slots.iter().all(|s| s.waited_ns.is_none()),
                "{:?}",
                c.slots
            );
        },
    );
}
