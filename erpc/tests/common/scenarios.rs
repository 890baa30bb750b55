//! World-generic scenario helpers shared by the simulated-network and the
//! device-model test suites.
#![allow(dead_code)]

use std::collections::VecDeque;

use erpc::{RpcConfig, SessionEventKind};

use netsim::Rng;

use super::app::{self, Ctx, ECHO, NESTED, Op, SIZED};
use super::{Node, SimWorld, World, run_until};

pub type N<W> = Node<<W as World>::T, Ctx>;

/// The URI of node `i`'s Nexus.
pub fn node_uri(i: usize) -> String {
    format!("node-{i}:31850")
}

/// Two nodes with the default config on the simulated network of `seed`.
pub fn two_nodes(seed: u64) -> (SimWorld, Vec<N<SimWorld>>) {
    let mut w = SimWorld::new(seed);
    let ns = nodes_with(&mut w, 2, seed, RpcConfig::default());
    (w, ns)
}

/// `n` nodes, each in its own Nexus ([`node_uri`]), Rpc id `i`.
pub fn nodes<W: World>(w: &mut W, n: usize, seed: u64) -> Vec<N<W>> {
    nodes_with(w, n, seed, RpcConfig::default())
}

/// As [`nodes`] with an Rpc config; the Nexus's failure timeout follows
/// the config's.
pub fn nodes_with<W: World>(w: &mut W, n: usize, seed: u64, cfg: RpcConfig) -> Vec<N<W>> {
    (0..n)
        .map(|i| {
            let nexus = app::register::<W::T>(w.nexus(&node_uri(i)))
                .failure_timeout_ms(cfg.failure_timeout_ms)
                .build()
                .expect("nexus");
            Node::new(
                w,
                &nexus,
                i as u8,
                Ctx::new(seed ^ (i as u64) << 32),
                cfg,
                Some(app::sm_handler::<W::T>),
            )
        })
        .collect()
}

/// Client `c` opens `k` sessions to server `s` and waits for them.
pub fn connect<W: World>(w: &mut W, ns: &mut [N<W>], c: usize, s: usize, k: usize) {
    let rpc_id = ns[s].rpc.rpc_id();
    for _ in 0..k {
        let sn = ns[c]
            .rpc
            .create_session(&format!("node-{s}:31850"), rpc_id)
            .expect("create_session");
        ns[c].ctx.sessions.push(sn);
    }
    run_until(w, ns, 100_000, "connect", |ns| {
        ns[c]
            .ctx
            .sessions
            .iter()
            .all(|&sn| ns[c].rpc.is_connected(sn))
    });
}

pub fn check_done<W: World>(ns: &[N<W>]) {
    for (i, n) in ns.iter().enumerate() {
        assert!(
            n.ctx.errors.is_empty(),
            "node {i}: {:?}",
            &n.ctx.errors[..n.ctx.errors.len().min(5)]
        );
        assert_eq!(n.ctx.bad_data, 0, "node {i}");
        assert_eq!(n.ctx.failed, 0, "node {i}");
    }
}

/// Runs `ops` from node 0 to node 1 with `window` in flight. On a lossless
/// world it also checks that nothing was dropped or retransmitted; on a
/// lossy one that loss recovery had work to do.
pub fn client_server<W: World>(
    w: &mut W,
    seed: u64,
    ops: VecDeque<Op>,
    window: usize,
    sessions: usize,
) {
    let mut ns = nodes(w, 2, seed);
    connect(w, &mut ns, 0, 1, sessions);
    let total = ops.len() as u64;
    ns[0].ctx.todo = ops;
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, window);
    }
    run_until(w, &mut ns, 2_000_000, "requests", |ns| {
        ns[0].ctx.completed + ns[0].ctx.failed == total
    });
    check_done::<W>(&ns);
    if std::env::var_os("ERPC_VERBOSE").is_some() {
        eprintln!(
            "t={} ns client: {}\nserver: {}",
            w.now_ns(),
            ns[0].rpc.stats(),
            ns[1].rpc.stats()
        );
    }
    assert_eq!(ns[0].ctx.completed, total);
    // Exactly once: every request completed, and at-most-once execution.
    assert_eq!(ns[1].ctx.handled + ns[1].rpc.stats().bg_jobs, total);
    if w.lossless() {
        assert_eq!(ns[0].rpc.stats().total_drops(), 0, "{}", ns[0].rpc.stats());
        assert_eq!(ns[1].rpc.stats().total_drops(), 0, "{}", ns[1].rpc.stats());
        assert_eq!(ns[0].rpc.stats().retransmissions, 0);
    } else if total >= 100 {
        assert!(
            ns[0].rpc.stats().retransmissions > 0,
            "{}",
            ns[0].rpc.stats()
        );
    }
    // Every credit came back.
    for &sn in &ns[0].ctx.sessions {
        assert_eq!(ns[0].rpc.session_credits(sn), Some(erpc::SESSION_CREDITS));
    }
}

/// The `nested_rpcs` scenario on any world.
pub fn nested_rpcs<W: World>(w: &mut W, seed: u64) {
    let mut ns = nodes(w, 3, seed);
    connect(w, &mut ns, 0, 1, 1);
    connect(w, &mut ns, 1, 2, 1);
    ns[1].ctx.downstream = Some(ns[1].ctx.sessions[0]);
    ns[1].ctx.sessions.clear();
    let mut rng = Rng::new(seed);
    let ops = app::random_ops(&mut rng, 300, &[NESTED], &[12, 900, 968, 969, 5000, 70_000]);
    ns[0].ctx.todo = ops;
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, 12);
    }
    run_until(w, &mut ns, 2_000_000, "nested", |ns| {
        ns[0].ctx.completed == 300
    });
    check_done::<W>(&ns);
    assert_eq!(ns[1].ctx.handled, 300);
    assert_eq!(ns[2].ctx.handled, 300);
    // Single-packet nested requests were copied out of the RX ring.
    assert!(ns[1].rpc.stats().deferred_copies > 0);
}

/// The `session_create_destroy_churn` scenario on any world.
pub fn session_create_destroy_churn<W: World>(w: &mut W, seed: u64) {
    let mut ns = nodes(w, 2, seed);
    let mut rng = Rng::new(seed);
    for round in 0..30 {
        let k = 1 + rng.below(4) as usize;
        ns[0].ctx.sessions.clear();
        connect(w, &mut ns, 0, 1, k);
        let before = ns[0].ctx.completed;
        ns[0].ctx.todo = app::random_ops(&mut rng, 20, &[ECHO, SIZED], &[12, 968, 3000]);
        {
            let n = &mut ns[0];
            app::start(&mut n.rpc, &mut n.ctx, 10);
        }
        run_until(w, &mut ns, 200_000, "round", |ns| {
            ns[0].ctx.completed == before + 20
        });
        let sessions = ns[0].ctx.sessions.clone();
        for &sn in &sessions {
            ns[0].rpc.destroy_session(sn).expect("destroy");
            // A second destroy is refused: already disconnecting.
            assert!(ns[0].rpc.destroy_session(sn).is_err());
        }
        run_until(w, &mut ns, 200_000, "disconnect", |ns| {
            sessions
                .iter()
                .all(|&sn| ns[0].rpc.session_state(sn).is_none())
        });
        assert_eq!(ns[0].rpc.num_sessions(), 0, "round {round}");
        assert_eq!(ns[1].rpc.num_sessions(), 0, "round {round}");
    }
    check_done::<W>(&ns);
    let disconnected = ns[0]
        .ctx
        .events
        .iter()
        .filter(|e| e.kind == SessionEventKind::Disconnected)
        .count();
    assert_eq!(disconnected, ns[0].ctx.connected());
    // Buffers all came back: only the control buffer is in use.
    let a = ns[1].rpc.alloc_stats();
    let in_use: u64 = a.classes.iter().map(|c| c.in_use).sum();
    assert_eq!(in_use, 1, "server buffers leaked: {a:?}");
}

/// The `few_credits_stall_and_resume` scenario on any world.
pub fn few_credits_stall_and_resume<W: World>(w: &mut W, seed: u64) {
    let cfg = RpcConfig {
        session_credits: 2,
        ..RpcConfig::default()
    };
    let mut ns = nodes_with(w, 2, seed, cfg);
    connect(w, &mut ns, 0, 1, 1);
    let mut rng = Rng::new(seed);
    ns[0].ctx.todo = app::random_ops(&mut rng, 200, &[SIZED, ECHO], &[12, 969, 5000, 40_000]);
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, 16);
    }
    run_until(w, &mut ns, 2_000_000, "few credits", |ns| {
        ns[0].ctx.completed == 200
    });
    check_done::<W>(&ns);
    let sn = ns[0].ctx.sessions[0];
    assert_eq!(ns[0].rpc.session_credits(sn), Some(2));
    if w.lossless() {
        assert_eq!(
            ns[0].rpc.stats().total_drops() + ns[1].rpc.stats().total_drops(),
            0
        );
    }
}

/// Multi-packet requests and responses on a lossless network with
/// `credits` per session: every RPC sends each of its packets exactly
/// once — the client its request packets and one RFR per response packet
/// after the first, the server a credit return per request packet but the
/// last and its response packets — whichever path grants the credits (the
/// general `kick`, the stall queue, or an acknowledgement handing its
/// credit straight to the next packet). Nothing is dropped, stale or
/// retransmitted.
pub fn packets_sent_exactly_once<W: World>(w: &mut W, seed: u64, credits: usize) {
    assert!(w.lossless(), "the packet counts hold on a lossless network");
    let cfg = RpcConfig {
        session_credits: credits,
        ..RpcConfig::default()
    };
    let mut ns = nodes_with(w, 2, seed, cfg);
    connect(w, &mut ns, 0, 1, 1);
    let mut rng = Rng::new(seed);
    let ops = app::random_ops(
        &mut rng,
        60,
        &[SIZED, ECHO],
        &[12, 968, 969, 5000, 40_000, 200_000],
    );
    let pkts = |len: usize| len.div_ceil(transport::MAX_DATA_PER_PKT).max(1) as u64;
    let client_pkts: u64 = ops
        .iter()
        .map(|op| pkts(op.req_len) + pkts(op.resp_len) - 1)
        .sum();
    let server_pkts: u64 = ops
        .iter()
        .map(|op| pkts(op.req_len) - 1 + pkts(op.resp_len))
        .sum();
    let total = ops.len() as u64;
    ns[0].ctx.todo = ops;
    {
        let n = &mut ns[0];
        // Two of the slots busy at a time: they share the credits.
        app::start(&mut n.rpc, &mut n.ctx, 2);
    }
    run_until(w, &mut ns, 2_000_000, "packets sent once", |ns| {
        ns[0].ctx.completed == total
    });
    check_done::<W>(&ns);
    let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
    assert_eq!(
        c.total_drops() + s.total_drops(),
        0,
        "client {c}\nserver {s}"
    );
    assert_eq!(c.retransmissions, 0, "{c}");
    assert_eq!(c.tx_stale + s.tx_stale, 0, "client {c}\nserver {s}");
    assert_eq!(c.tx_pkts, client_pkts, "client {c}");
    assert_eq!(s.tx_pkts, server_pkts, "server {s}");
    assert_eq!(
        ns[0].rpc.session_credits(ns[0].ctx.sessions[0]),
        Some(credits)
    );
}

/// An N-to-1 incast: what to run.
#[derive(Debug, Clone, Copy)]
pub struct Incast {
    /// Senders (nodes 1..=senders); node 0 receives.
    pub senders: usize,
    /// Requests each sender streams.
    pub requests: usize,
    /// Bytes per request (the response is small).
    pub req_bytes: usize,
    /// Requests each sender keeps in flight.
    pub window: usize,
    /// Sender `i` (from 0) starts `i × stagger_ns` after the first.
    pub stagger_ns: u64,
    /// One more node (the last) sends 32-byte echo requests to the
    /// receiver, one at a time, for as long as the senders stream: an
    /// uncongested sender whose round trips cross the receiver's queue.
    pub probe: bool,
    /// Every node's Rpc configuration (congestion control on or off).
    pub cfg: RpcConfig,
}

/// What an incast did.
#[derive(Debug, Clone)]
pub struct IncastReport {
    /// The switch's output queue towards the receiver, at the end.
    pub queue: erpc_sim::QueueStats,
    /// Requests completed at the senders.
    pub completed: u64,
    /// Requests the receiver's handler ran (the probe's not counted).
    pub handled: u64,
    /// Go-back-N rollbacks at the senders.
    pub retransmissions: u64,
    /// Timely rate computations at the senders.
    pub timely_updates: u64,
    /// Virtual time from the first request to the last completion.
    pub elapsed_ns: u64,
    /// Request bytes delivered per second of that time, in bits.
    pub goodput_bps: f64,
    /// The queue towards the receiver at every arrival, from the first
    /// request on.
    pub trace: Vec<erpc_sim::QueueSample>,
    /// Virtual time of the first request.
    pub t0_ns: u64,
    /// The probe's round trips: (completion time, RTT), ns.
    pub probe_rtts: Vec<(u64, u64)>,
}

/// The probe's echo requests.
fn probe_ops(n: usize) -> VecDeque<Op> {
    (0..n)
        .map(|_| Op {
            req_type: ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect()
}

/// Round trips of 32-byte echo requests from node 1 to node 0 with nothing
/// else on the network: (completion time, RTT) of each, ns.
pub fn lone_probe<W: World>(w: &mut W, seed: u64, cfg: RpcConfig, rpcs: usize) -> Vec<(u64, u64)> {
    let mut ns = nodes_with(w, 2, seed, cfg);
    connect(w, &mut ns, 1, 0, 1);
    ns[1].ctx.todo = probe_ops(rpcs);
    {
        let n = &mut ns[1];
        app::start(&mut n.rpc, &mut n.ctx, 1);
    }
    let mut rtts = Vec::new();
    let mut last = (ns[1].ctx.completed, w.now_ns());
    for _ in 0..10_000_000u64 {
        if ns[1].ctx.completed == rpcs as u64 {
            break;
        }
        for n in ns.iter_mut() {
            n.poll();
        }
        if ns[1].ctx.completed != last.0 {
            assert_eq!(ns[1].ctx.completed, last.0 + 1, "one at a time");
            rtts.push((w.now_ns(), w.now_ns() - last.1));
            last = (ns[1].ctx.completed, w.now_ns());
        }
        w.step();
    }
    check_done::<W>(&ns);
    assert_eq!(ns[1].ctx.completed, rpcs as u64);
    rtts
}

/// Runs an incast on any world: every sender opens one session to node 0
/// and streams its requests with `window` in flight; the receiver answers
/// each with 16 bytes. With `probe`, one more node sends small echo
/// requests one at a time and its round trips are recorded (each is the
/// time between two completions: the next request leaves as the previous
/// one completes). Checks that every request completed exactly once
/// with the right bytes (through loss recovery, when the switch dropped
/// some); the caller checks the queue.
pub fn incast<W: World>(w: &mut W, seed: u64, p: Incast) -> IncastReport {
    let probe = p.senders + 1;
    let count = p.senders + 1 + usize::from(p.probe);
    let mut ns = nodes_with(w, count, seed, p.cfg);
    for c in 1..count {
        connect(w, &mut ns, c, 0, 1);
    }
    w.trace_queue(0, 1 << 20);
    let t0 = w.now_ns();
    for n in ns.iter_mut().skip(1).take(p.senders) {
        n.ctx.todo = (0..p.requests)
            .map(|_| Op {
                req_type: SIZED,
                req_len: p.req_bytes,
                resp_len: 16,
            })
            .collect();
    }
    let per = p.requests as u64;
    let mut started = 0;
    let mut probe_rtts = Vec::new();
    let mut probe_last = (0u64, t0);
    let mut steps = 0u64;
    while !ns[1..=p.senders]
        .iter()
        .all(|n| n.ctx.completed + n.ctx.failed == per)
    {
        while started < p.senders && w.now_ns() >= t0 + started as u64 * p.stagger_ns {
            let n = &mut ns[1 + started];
            app::start(&mut n.rpc, &mut n.ctx, p.window);
            started += 1;
        }
        if p.probe {
            let n = &mut ns[probe];
            if n.ctx.todo.is_empty() {
                n.ctx.todo = probe_ops(16);
            }
            if n.ctx.in_flight == 0 {
                app::start(&mut n.rpc, &mut n.ctx, 1);
                probe_last = (n.ctx.completed, w.now_ns());
            }
        }
        for n in ns.iter_mut() {
            n.poll();
        }
        if p.probe {
            let done = ns[probe].ctx.completed;
            if done != probe_last.0 {
                assert_eq!(done, probe_last.0 + 1, "one probe at a time");
                probe_rtts.push((w.now_ns(), w.now_ns() - probe_last.1));
                probe_last = (done, w.now_ns());
            }
        }
        w.step();
        steps += 1;
        assert!(
            steps < 20_000_000,
            "incast: not done at t = {} ns",
            w.now_ns()
        );
    }
    let elapsed_ns = w.now_ns() - t0;
    // The probe stops; the last one completes.
    if p.probe {
        ns[probe].ctx.todo.clear();
        run_until(w, &mut ns, 1_000_000, "probe", |ns| {
            ns[probe].ctx.in_flight == 0
        });
    }
    check_done::<W>(&ns);
    let completed: u64 = ns[1..=p.senders].iter().map(|n| n.ctx.completed).sum();
    let senders = &ns[1..=p.senders];
    let retransmissions = senders.iter().map(|n| n.rpc.stats().retransmissions).sum();
    let timely_updates = senders.iter().map(|n| n.rpc.stats().timely_updates).sum();
    // Let the last frames (credit returns, stray duplicates) drain.
    for _ in 0..100 {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
    let total = per * p.senders as u64;
    let probes = if p.probe { ns[probe].ctx.completed } else { 0 };
    IncastReport {
        queue: w.queue(0),
        completed,
        handled: ns[0].ctx.handled + ns[0].rpc.stats().bg_jobs - probes,
        retransmissions,
        timely_updates,
        elapsed_ns,
        goodput_bps: (total * p.req_bytes as u64 * 8) as f64 * 1e9 / elapsed_ns.max(1) as f64,
        trace: w.queue_trace(0),
        t0_ns: t0,
        probe_rtts,
    }
}

/// Client `c` opens `k` sessions to server `s`, 256 at a time, waits for
/// them, sends one echo on each (`window` in flight), and checks that
/// every one completed with the right bytes and that both Rpcs hold the
/// sessions (issue 28: thousands of sessions per Rpc).
pub fn many_sessions<W: World>(
    w: &mut W,
    ns: &mut [N<W>],
    c: usize,
    s: usize,
    k: usize,
    window: usize,
) {
    let rpc_id = ns[s].rpc.rpc_id();
    let uri = format!("node-{s}:31850");
    let mut left = k;
    while left > 0 {
        let n = left.min(256);
        left -= n;
        for _ in 0..n {
            let sn = ns[c]
                .rpc
                .create_session(&uri, rpc_id)
                .expect("create_session");
            ns[c].ctx.sessions.push(sn);
        }
        run_until(w, ns, 1_000_000, "connect", |ns| {
            ns[c]
                .ctx
                .sessions
                .iter()
                .rev()
                .take(n)
                .all(|&sn| ns[c].rpc.is_connected(sn))
        });
    }
    assert_eq!(ns[c].rpc.num_sessions(), k);
    assert_eq!(ns[s].rpc.num_sessions(), k);
    let before = ns[c].ctx.completed;
    ns[c].ctx.todo = (0..k)
        .map(|_| Op {
            req_type: ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    {
        let n = &mut ns[c];
        app::start(&mut n.rpc, &mut n.ctx, window);
    }
    run_until(w, ns, 10_000_000, "one echo per session", |ns| {
        ns[c].ctx.completed + ns[c].ctx.failed == before + k as u64
    });
    check_done::<W>(ns);
    assert_eq!(ns[s].ctx.handled, k as u64);
}
