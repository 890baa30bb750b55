//! Status packets (`rpc/status.rs`): a request the server cannot run (no
//! handler, no memory) completes at an erpc-rs client with
//! `RpcError::Server` instead of being resent forever; duplicates get the
//! same answer and never run a handler; a C++-style client is never sent
//! one. Deterministic, on the simulated network; a failing run prints its
//! seed and a one-line replay command.

mod common;

use std::sync::Arc;

use common::app::{self, Ctx, ECHO, Op, SIZED};
use common::scenarios::{N, connect, nodes};
use common::{Node, SimWorld, World, run_until, with_seeds};
use erpc::{DropReason, RpcConfig, RpcError, ServerError};

const FILE: &str = "status";

type W = SimWorld;

/// A request type no test Nexus has a handler for.
const UNHANDLED: u8 = 200;

fn ops(req_type: u8, lens: &[usize]) -> std::collections::VecDeque<Op> {
    lens.iter()
        .map(|&n| Op {
            req_type,
            req_len: n,
            resp_len: n,
        })
        .collect()
}

fn run_steps(w: &mut W, ns: &mut [N<W>], steps: u64) {
    for _ in 0..steps {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

/// The failures a client saw, all of which must be `err` on its session.
fn all_failed_with(n: &N<W>, err: ServerError) {
    let sn = n.ctx.sessions[0];
    for e in &n.ctx.failures {
        assert_eq!(*e, RpcError::Server { session: sn, err }, "{e}");
    }
}

#[test]
fn a_request_without_a_handler_fails_at_an_erpc_rs_client() {
    with_seeds(
        "a_request_without_a_handler_fails_at_an_erpc_rs_client",
        FILE,
        &[1, 2],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            // Single- and multi-packet requests, interleaved with requests
            // that do have a handler: the failed ones must not disturb
            // their slots' next requests.
            let mut todo = ops(UNHANDLED, &[16, 968, 969, 5000, 100_000]);
            todo.extend(ops(ECHO, &[32, 3000]));
            todo.extend(ops(UNHANDLED, &[12]));
            todo.extend(ops(ECHO, &[40]));
            ns[0].ctx.todo = todo;
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 4);
            }
            run_until(
                &mut w,
                &mut ns,
                1_000_000,
                "every request completes",
                |ns| ns[0].ctx.completed + ns[0].ctx.failed == 9,
            );
            assert_eq!(ns[0].ctx.failed, 6);
            assert_eq!(ns[0].ctx.completed, 3);
            assert_eq!(ns[0].ctx.bad_data, 0);
            all_failed_with(&ns[0], ServerError::NoHandler);
            assert_eq!(ns[1].ctx.handled, 3, "only the echoes ran");
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert_eq!(c.status_received, 6);
            assert_eq!(s.reqs_failed_at_server, 6);
            assert!(s.status_sent >= 6);
            assert_eq!(c.retransmissions, 0, "lossless: nothing resent");
            ns[0].rpc.check_credit_invariant().unwrap();
            // The session is whole: more requests on it succeed.
            ns[0].ctx.todo = ops(SIZED, &[64, 2000]);
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 2);
            }
            run_until(&mut w, &mut ns, 1_000_000, "later requests", |ns| {
                ns[0].ctx.completed == 5
            });
            assert_eq!(ns[0].ctx.failed, 6);
        },
    );
}

#[test]
fn a_lost_status_packet_comes_again_and_no_handler_runs_twice() {
    with_seeds(
        "a_lost_status_packet_comes_again_and_no_handler_runs_twice",
        FILE,
        &[3],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let srv = ns[1].rpc.session_nums()[0];
            // The server's first two packets on the session (the status
            // packets of the first two tries) are lost.
            ns[1].rpc.fault_drop_tx(srv, 2).unwrap();
            ns[0].ctx.todo = ops(UNHANDLED, &[24]);
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 1);
            }
            run_until(&mut w, &mut ns, 1_000_000, "the request fails", |ns| {
                ns[0].ctx.failed == 1
            });
            all_failed_with(&ns[0], ServerError::NoHandler);
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert_eq!(c.retransmissions, 2, "{c}");
            assert_eq!(s.reqs_failed_at_server, 1, "failed once, answered thrice");
            assert_eq!(s.status_sent, 3);
            assert_eq!(ns[1].ctx.handled, 0);
            assert_eq!(s.drops(DropReason::NoHandler), 1);
        },
    );
}

#[test]
fn a_cpp_style_client_is_never_sent_a_status_packet() {
    with_seeds(
        "a_cpp_style_client_is_never_sent_a_status_packet",
        FILE,
        &[4],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 1, seed);
            // The client presents itself as a C++ eRPC process.
            let nexus = app::register::<<W as World>::T>(w.nexus("cpp:31850"))
                .sm_extensions(false)
                .build()
                .unwrap();
            ns.insert(
                0,
                Node::new(
                    &mut w,
                    &nexus,
                    1,
                    Ctx::new(seed),
                    RpcConfig::default(),
                    Some(app::sm_handler),
                ),
            );
            let sn = ns[0].rpc.create_session("node-0:31850", 0).unwrap();
            ns[0].ctx.sessions.push(sn);
            run_until(&mut w, &mut ns, 100_000, "connect", |ns| {
                ns[0].rpc.is_connected(sn)
            });
            ns[0].ctx.todo = ops(UNHANDLED, &[24]);
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 1);
            }
            // 20 ms: four retransmission timeouts.
            run_steps(&mut w, &mut ns, 40_000);
            let s = ns[1].rpc.stats();
            assert_eq!(s.status_sent, 0);
            assert_eq!(s.reqs_failed_at_server, 0);
            assert!(s.drops(DropReason::NoHandler) >= 2, "{s}");
            assert_eq!(ns[0].ctx.failed + ns[0].ctx.completed, 0);
            assert!(ns[0].rpc.stats().retransmissions >= 2);
        },
    );
}

/// A node whose allocator can never hold more than `max_bytes`.
fn small_node(w: &mut W, i: usize, seed: u64, max_bytes: usize) -> N<W> {
    let nexus = app::register::<<W as World>::T>(w.nexus(&format!("node-{i}:31850")))
        .build()
        .unwrap();
    let alloc = mempool::Allocator::new(
        Arc::new(mempool::IdentityMapper::new()),
        mempool::AllocatorConfig {
            initial_bytes: max_bytes,
            max_bytes,
            region: mempool::RegionOptions {
                fallback: mempool::Fallback::SmallPages,
                ..Default::default()
            },
            poison_on_free: None,
        },
    )
    .unwrap();
    let rpc = erpc::Rpc::builder(&nexus, w.transport(), alloc)
        .id(i as u8)
        .session_handler(app::sm_handler)
        .build()
        .unwrap();
    Node {
        rpc,
        ctx: Ctx::new(seed),
    }
}

#[test]
fn a_request_the_server_has_no_memory_for_fails_and_the_next_one_runs() {
    with_seeds(
        "a_request_the_server_has_no_memory_for_fails_and_the_next_one_runs",
        FILE,
        &[5],
        |seed| {
            let mut w = W::new(seed);
            let mut ns = nodes(&mut w, 1, seed);
            // The server's allocator holds 4 MiB: a 3 MB request (a 4 MiB
            // block) cannot be reassembled there.
            ns.push(small_node(&mut w, 1, seed, 4 << 20));
            connect(&mut w, &mut ns, 0, 1, 1);
            ns[0].ctx.todo = ops(SIZED, &[3_000_000]);
            ns[0].ctx.todo.extend(ops(SIZED, &[100_000]));
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 1);
            }
            run_until(&mut w, &mut ns, 4_000_000, "both requests complete", |ns| {
                ns[0].ctx.completed + ns[0].ctx.failed == 2
            });
            assert_eq!(ns[0].ctx.failed, 1);
            all_failed_with(&ns[0], ServerError::OutOfMemory);
            assert_eq!(ns[0].ctx.completed, 1, "the next request runs");
            assert_eq!(ns[0].ctx.bad_data, 0);
            assert_eq!(ns[1].ctx.handled, 1);
            assert!(ns[1].rpc.stats().drops(DropReason::OutOfMemory) >= 1);
            ns[0].rpc.check_credit_invariant().unwrap();
        },
    );
}
