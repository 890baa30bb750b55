//! Background handlers that fail (`rpc/bg.rs`, `nexus/workers.rs`): a
//! handler that panics, a response the server has no memory for, an Rpc
//! dropped while its handler runs. Each failure case runs three ways: with
//! no workers (handlers inline in the event loop), with stepped workers
//! (the worker hand-off, run by the test's thread), both deterministic on
//! the simulated network (a failing run prints its seed and a replay
//! command), and with real worker threads, where the test never advances
//! virtual time while a worker holds a job, so the outcome does not depend
//! on how fast the worker thread runs.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::app::{self, BG_SIZED, Ctx, Op};
use common::scenarios::{N, connect};
use common::{Node, SimWorld, World, with_seeds};
use erpc::{Nexus, NexusBuilder, RpcConfig, RpcError, ServerError, WorkerIdle};

const FILE: &str = "workers";

type W = SimWorld;

/// Panics after counting itself.
const PANICS: u8 = 60;

/// How the server runs its background handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Inline,
    Stepped,
    Threads,
}

const MODES: [Mode; 3] = [Mode::Inline, Mode::Stepped, Mode::Threads];

fn ops(req_type: u8, lens: &[(usize, usize)]) -> std::collections::VecDeque<Op> {
    lens.iter()
        .map(|&(req_len, resp_len)| Op {
            req_type,
            req_len,
            resp_len,
        })
        .collect()
}

/// The test handlers plus a panicking one (counting its runs in `runs`).
fn builder(w: &mut W, uri: &str, runs: &Arc<AtomicU64>, mode: Mode) -> NexusBuilder {
    let r = runs.clone();
    let b =
        app::register::<<W as World>::T>(w.nexus(uri)).bg_handler(PANICS, move |_req, _resp| {
            r.fetch_add(1, Ordering::SeqCst);
            panic!("a background handler panics on purpose");
        });
    match mode {
        Mode::Inline => b.workers(0),
        Mode::Stepped => b.stepped_workers(1),
        Mode::Threads => b.workers(1).worker_idle(WorkerIdle::Spin),
    }
}

/// Node 0 a client, node 1 a server running background handlers as `mode`
/// says, with an allocator of at most `server_bytes` if given.
fn client_server(
    w: &mut W,
    seed: u64,
    mode: Mode,
    runs: &Arc<AtomicU64>,
    server_bytes: Option<usize>,
) -> Vec<N<W>> {
    let client = app::register::<<W as World>::T>(w.nexus("node-0:31850"))
        .build()
        .unwrap();
    let server = builder(w, "node-1:31850", runs, mode).build().unwrap();
    let mut ns = vec![Node::new(
        w,
        &client,
        0,
        Ctx::new(seed),
        RpcConfig::default(),
        Some(app::sm_handler),
    )];
    ns.push(match server_bytes {
        None => Node::new(
            w,
            &server,
            1,
            Ctx::new(seed ^ 1),
            RpcConfig::default(),
            Some(app::sm_handler),
        ),
        Some(max_bytes) => small_node(w, &server, max_bytes, seed),
    });
    connect(w, &mut ns, 0, 1, 1);
    ns
}

/// A server node whose allocator can never hold more than `max_bytes`.
fn small_node(w: &mut W, nexus: &Arc<Nexus>, max_bytes: usize, seed: u64) -> N<W> {
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
    let rpc = erpc::Rpc::builder(nexus, w.transport(), alloc)
        .id(1)
        .session_handler(app::sm_handler)
        .build()
        .unwrap();
    Node {
        rpc,
        ctx: Ctx::new(seed ^ 1),
    }
}

/// Polls the nodes and steps virtual time until `done`, running the
/// server's workers as `mode` says: stepped workers each step; with
/// worker threads, time stands still while a worker holds a job.
fn run(
    w: &mut W,
    ns: &mut [N<W>],
    mode: Mode,
    max_steps: u64,
    what: &str,
    done: impl Fn(&[N<W>]) -> bool,
) {
    let server = ns[1].rpc.nexus().clone();
    for _ in 0..max_steps {
        for n in ns.iter_mut() {
            n.poll();
        }
        if done(ns) {
            return;
        }
        step_workers(&server, mode);
        w.step();
    }
    panic!("{what} ({mode:?}): not done after {max_steps} steps");
}

fn step_workers(server: &Nexus, mode: Mode) {
    match mode {
        Mode::Inline => {}
        Mode::Stepped => {
            server.step_workers();
        }
        Mode::Threads => {
            // Wait for the workers to finish what they hold (an event the
            // test caused; no time bound).
            while server.worker_stats().iter().any(|s| s.load != 0) {
                std::thread::yield_now();
            }
        }
    }
}

#[test]
fn a_panicking_handler_fails_its_request_and_the_session_lives_on() {
    with_seeds(
        "a_panicking_handler_fails_its_request_and_the_session_lives_on",
        FILE,
        &[1],
        |seed| {
            for mode in MODES {
                let mut w = W::new(seed);
                let runs = Arc::new(AtomicU64::new(0));
                let mut ns = client_server(&mut w, seed, mode, &runs, None);
                // A panic between working requests, single- and
                // multi-packet, on one session with a window of 2.
                let mut todo = ops(BG_SIZED, &[(32, 32), (3000, 5000)]);
                todo.extend(ops(PANICS, &[(16, 16)]));
                todo.extend(ops(BG_SIZED, &[(40, 2000), (12, 0)]));
                todo.extend(ops(PANICS, &[(2000, 16)]));
                todo.extend(ops(BG_SIZED, &[(100, 100)]));
                ns[0].ctx.todo = todo;
                {
                    let n = &mut ns[0];
                    app::start(&mut n.rpc, &mut n.ctx, 2);
                }
                run(
                    &mut w,
                    &mut ns,
                    mode,
                    2_000_000,
                    "every request completes",
                    |ns| ns[0].ctx.completed + ns[0].ctx.failed == 7,
                );
                assert_eq!(ns[0].ctx.completed, 5, "{mode:?}: {:?}", ns[0].ctx.errors);
                assert_eq!(ns[0].ctx.failed, 2, "{mode:?}");
                assert_eq!(ns[0].ctx.bad_data, 0, "{mode:?}: {:?}", ns[0].ctx.errors);
                let sn = ns[0].ctx.sessions[0];
                for e in &ns[0].ctx.failures {
                    assert_eq!(
                        *e,
                        RpcError::Server {
                            session: sn,
                            err: ServerError::HandlerPanicked
                        },
                        "{mode:?}"
                    );
                }
                assert_eq!(runs.load(Ordering::SeqCst), 2, "{mode:?}: each ran once");
                let s = ns[1].rpc.stats();
                assert_eq!(s.bg_panics, 2, "{mode:?}");
                assert_eq!(s.reqs_failed_at_server, 2, "{mode:?}");
                let nexus = ns[1].rpc.nexus().clone();
                if mode != Mode::Inline {
                    let ws = nexus.worker_stats();
                    assert_eq!((ws[0].jobs, ws[0].panics), (7, 2), "{mode:?}");
                }
                ns[0].rpc.check_credit_invariant().unwrap();
                // Dropping the server Rpc does not wait for anything.
                drop(ns);
            }
        },
    );
}

#[test]
fn a_lost_status_packet_never_runs_a_panicking_handler_twice() {
    with_seeds(
        "a_lost_status_packet_never_runs_a_panicking_handler_twice",
        FILE,
        &[2],
        |seed| {
            for mode in [Mode::Inline, Mode::Stepped] {
                let mut w = W::new(seed);
                let runs = Arc::new(AtomicU64::new(0));
                let mut ns = client_server(&mut w, seed, mode, &runs, None);
                let srv = ns[1].rpc.session_nums()[0];
                // The first two status packets are lost: the client
                // retransmits, and the duplicates get the status again.
                ns[1].rpc.fault_drop_tx(srv, 2).unwrap();
                ns[0].ctx.todo = ops(PANICS, &[(24, 24)]);
                {
                    let n = &mut ns[0];
                    app::start(&mut n.rpc, &mut n.ctx, 1);
                }
                run(
                    &mut w,
                    &mut ns,
                    mode,
                    1_000_000,
                    "the request fails",
                    |ns| ns[0].ctx.failed == 1,
                );
                assert_eq!(runs.load(Ordering::SeqCst), 1, "{mode:?}");
                let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
                assert_eq!(c.retransmissions, 2, "{mode:?}: {c}");
                assert_eq!(s.status_sent, 3, "{mode:?}");
                assert_eq!(s.bg_panics, 1, "{mode:?}");
            }
        },
    );
}

#[test]
fn a_cpp_style_client_is_not_answered_and_the_handler_runs_once() {
    with_seeds(
        "a_cpp_style_client_is_not_answered_and_the_handler_runs_once",
        FILE,
        &[3],
        |seed| {
            let mut w = W::new(seed);
            let runs = Arc::new(AtomicU64::new(0));
            let server = builder(&mut w, "node-1:31850", &runs, Mode::Stepped)
                .build()
                .unwrap();
            // The client presents itself as a C++ eRPC process.
            let client = app::register::<<W as World>::T>(w.nexus("cpp:31850"))
                .sm_extensions(false)
                .build()
                .unwrap();
            let mut ns = vec![
                Node::new(
                    &mut w,
                    &client,
                    0,
                    Ctx::new(seed),
                    RpcConfig::default(),
                    Some(app::sm_handler),
                ),
                Node::new(
                    &mut w,
                    &server,
                    1,
                    Ctx::new(seed),
                    RpcConfig::default(),
                    Some(app::sm_handler),
                ),
            ];
            let sn = ns[0].rpc.create_session("node-1:31850", 1).unwrap();
            ns[0].ctx.sessions.push(sn);
            run(&mut w, &mut ns, Mode::Stepped, 100_000, "connect", |ns| {
                ns[0].rpc.is_connected(sn)
            });
            // The panicking request, then working ones on the other slots.
            let mut todo = ops(PANICS, &[(16, 16)]);
            todo.extend(ops(BG_SIZED, &[(32, 32); 4]));
            ns[0].ctx.todo = todo;
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 2);
            }
            run(
                &mut w,
                &mut ns,
                Mode::Stepped,
                1_000_000,
                "the other requests",
                |ns| ns[0].ctx.completed == 4,
            );
            // 20 ms more: four retransmission timeouts of the failed one.
            for _ in 0..40_000 {
                for n in ns.iter_mut() {
                    n.poll();
                }
                server.step_workers();
                w.step();
            }
            assert!(ns[0].rpc.stats().retransmissions >= 2);
            assert_eq!(ns[0].ctx.failed, 0, "nothing tells a C++ client");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
            let s = ns[1].rpc.stats();
            assert_eq!(s.status_sent, 0);
            assert_eq!(s.bg_panics, 1);
            assert_eq!(s.reqs_failed_at_server, 1);
        },
    );
}

#[test]
fn a_response_the_server_has_no_memory_for_fails_and_the_next_one_runs() {
    with_seeds(
        "a_response_the_server_has_no_memory_for_fails_and_the_next_one_runs",
        FILE,
        &[4],
        |seed| {
            for mode in MODES {
                let mut w = W::new(seed);
                let runs = Arc::new(AtomicU64::new(0));
                // 4 MiB for the server: a 3 MB response (a 4 MiB block)
                // cannot be copied into a msgbuf there.
                let mut ns = client_server(&mut w, seed, mode, &runs, Some(4 << 20));
                ns[0].ctx.todo = ops(BG_SIZED, &[(16, 3_000_000), (16, 100_000), (16, 8)]);
                {
                    let n = &mut ns[0];
                    app::start(&mut n.rpc, &mut n.ctx, 1);
                }
                run(
                    &mut w,
                    &mut ns,
                    mode,
                    4_000_000,
                    "every request completes",
                    |ns| ns[0].ctx.completed + ns[0].ctx.failed == 3,
                );
                let sn = ns[0].ctx.sessions[0];
                assert_eq!(
                    ns[0].ctx.failures,
                    vec![RpcError::Server {
                        session: sn,
                        err: ServerError::OutOfMemory
                    }],
                    "{mode:?}"
                );
                assert_eq!(ns[0].ctx.completed, 2, "{mode:?}: the next ones run");
                assert_eq!(ns[0].ctx.bad_data, 0, "{mode:?}");
                assert_eq!(ns[1].rpc.stats().reqs_failed_at_server, 1, "{mode:?}");
                ns[0].rpc.check_credit_invariant().unwrap();
            }
        },
    );
}

/// A gate a handler waits at until the test opens it.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, u64)>,
    cv: Condvar,
}

impl Gate {
    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        s.1 += 1;
        self.cv.notify_all();
        while !s.0 {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn wait_for_arrival(&self) {
        let mut s = self.state.lock().unwrap();
        while s.1 == 0 {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn open(&self) {
        self.state.lock().unwrap().0 = true;
        self.cv.notify_all();
    }
}

#[test]
fn dropping_an_rpc_does_not_wait_for_a_handler_that_never_returns() {
    const HELD: u8 = 61;
    let mut w = W::new(5);
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let client = app::register::<<W as World>::T>(w.nexus("node-0:31850"))
        .build()
        .unwrap();
    let server = app::register::<<W as World>::T>(w.nexus("node-1:31850"))
        .bg_handler(HELD, move |_req, resp| {
            g.pass();
            resp.write(b"late");
        })
        .workers(1)
        .worker_drop_wait(Duration::from_millis(1))
        .build()
        .unwrap();
    let mut ns = vec![
        Node::new(&mut w, &client, 0, Ctx::new(5), RpcConfig::default(), None),
        Node::new(&mut w, &server, 1, Ctx::new(6), RpcConfig::default(), None),
    ];
    connect(&mut w, &mut ns, 0, 1, 1);
    ns[0].ctx.todo = ops(HELD, &[(16, 16)]);
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, 1);
    }
    while server.worker_stats()[0].load == 0 {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
    gate.wait_for_arrival();
    // The handler is held until the drop returned: the drop can only
    // return by giving up on it.
    let srv = ns.pop().unwrap();
    let leaked = srv.rpc.stats().bg_jobs;
    drop(srv);
    gate.open();
    assert_eq!(leaked, 1);
    // The worker lives on: a new Rpc of the same Nexus is served by it.
    ns.push(Node::new(
        &mut w,
        &server,
        2,
        Ctx::new(7),
        RpcConfig::default(),
        None,
    ));
    let sn = ns[0].rpc.create_session("node-1:31850", 2).unwrap();
    run(&mut w, &mut ns, Mode::Threads, 100_000, "connect", |ns| {
        ns[0].rpc.is_connected(sn)
    });
    ns[0].ctx.sessions = vec![sn];
    ns[0].ctx.todo = ops(BG_SIZED, &[(32, 64)]);
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, 1);
    }
    run(
        &mut w,
        &mut ns,
        Mode::Threads,
        1_000_000,
        "the request",
        |ns| ns[0].ctx.completed == 1,
    );
    assert_eq!(server.worker_stats()[0].jobs, 2);
}
