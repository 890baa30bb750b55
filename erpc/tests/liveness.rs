//! No request waits forever (issue 30): a server that ends a session
//! tells its erpc-rs client, again when the client's packets keep coming;
//! Deterministic, on the simulated network (virtual time); a failing run
//! prints its seed and a one-line replay command.

mod common;

use common::app::{self, DEFER, ECHO, Op};
use common::scenarios::{N, connect, nodes_with};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::{RpcConfig, RpcError, SessionEventKind, Uri};

const FILE: &str = "liveness";

type W = SimWorld;

fn uri(i: usize) -> String {
    format!("node-{i}:31850")
}

fn two(seed: u64) -> (W, Vec<N<W>>) {
    let mut w = W::new(seed);
    let ns = nodes_with(&mut w, 2, seed, RpcConfig::default());
    (w, ns)
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
                ns[0]
                    .ctx
                    .failures
                    .iter()
                    .all(|e| matches!(e, RpcError::ServerEnded { .. })),
                "{:?}",
                ns[0].ctx.failures
            );
            assert!(events(&ns[0]).contains(&SessionEventKind::ServerEnded));
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
                RpcError::ServerEnded { .. }
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
            assert!(
                ns[0]
                    .ctx
                    .failures
                    .iter()
                    .all(|e| matches!(e, RpcError::ServerEnded { .. }))
            );
        },
    );
}
