//! Session scale (issue 28): thousands of sessions per Rpc, the heap an
//! idle session costs, and session churn that leaves nothing behind.
//! Deterministic, on the simulated network; a failing run prints its seed
//! and a one-line replay command.
//!
//! A counting global allocator keeps the net heap bytes allocated on each
//! test's thread, per *account*: the test charges each Rpc's event loop
//! and calls to that Rpc's account, so client and server sessions are
//! measured apart, and the simulated network's own memory to neither.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::app::{self, Ctx, ECHO, Op};
use common::scenarios::N;
use common::{Node, SimWorld, World, with_seeds};
use erpc::RpcConfig;
use erpc_sim::SimConfig;

const FILE: &str = "scale";

type W = SimWorld;

// ------------------------------------------------------------ heap count

/// Accounts: 0 charges nobody; 1 the client, 2 the server.
const ACCOUNTS: usize = 3;
const NOBODY: usize = 0;
const CLIENT: usize = 1;
const SERVER: usize = 2;

thread_local! {
    static ACCOUNT: Cell<usize> = const { Cell::new(NOBODY) };
    /// Net heap bytes per account, of this thread (tests run in parallel,
    /// each in a thread of its own).
    static NET_BYTES: [Cell<i64>; ACCOUNTS] = const { [const { Cell::new(0) }; ACCOUNTS] };
    /// Net heap bytes of this thread (one test, its simulated network
    /// included), whoever's call allocated or freed them: an account's net
    /// bytes count what its calls allocated minus what they freed (a
    /// packet the client sends and the network frees counts for the
    /// client); at a quiet moment this total is what is really held.
    static TOTAL_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn charge(delta: i64) {
    TOTAL_BYTES.with(|t| t.set(t.get() + delta));
    let a = ACCOUNT.with(|c| c.get());
    if a != NOBODY {
        NET_BYTES.with(|n| n[a].set(n[a].get() + delta));
    }
}

struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; the
// counters are atomics and the account a const-initialised thread local,
// neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        charge(l.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        charge(-(l.size() as i64));
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        charge(l.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        charge(n as i64 - l.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with its heap charged to `account`.
fn charged<R>(account: usize, f: impl FnOnce() -> R) -> R {
    let prev = ACCOUNT.with(|c| c.replace(account));
    let r = f();
    ACCOUNT.with(|c| c.set(prev));
    r
}

fn net_bytes(account: usize) -> i64 {
    NET_BYTES.with(|n| n[account].get())
}

// ------------------------------------------------------------- harness

/// A client (node 0) and a server (node 1), each in its own Nexus, with
/// the Rpc config `cfg` and an RX ring of `ring` entries.
fn pair(seed: u64, ring: usize, cfg: RpcConfig) -> (W, Vec<N<W>>) {
    let mut w = W::with_config(SimConfig {
        seed,
        ring_entries: ring,
        ..SimConfig::default()
    });
    let ns = (0..2)
        .map(|i| {
            let nexus = app::register::<<W as World>::T>(w.nexus(&format!("node-{i}:31850")))
                .build()
                .expect("nexus");
            charged([CLIENT, SERVER][i], || {
                Node::new(
                    &mut w,
                    &nexus,
                    0,
                    Ctx::new(seed ^ (i as u64) << 32),
                    cfg,
                    Some(app::sm_handler::<<W as World>::T>),
                )
            })
        })
        .collect();
    (w, ns)
}

/// Polls both nodes (each charged to its account) and steps the world
/// until `done`; panics after `max_steps`.
fn run(w: &mut W, ns: &mut [N<W>], max_steps: u64, what: &str, done: impl Fn(&[N<W>]) -> bool) {
    for _ in 0..max_steps {
        if done(ns) {
            return;
        }
        charged(CLIENT, || ns[0].poll());
        charged(SERVER, || ns[1].poll());
        w.step();
    }
    panic!(
        "{what}: not done after {max_steps} steps (t = {} ns)",
        w.now_ns()
    );
}

/// Polls both nodes and steps the world for `ms` of virtual time.
fn idle(w: &mut W, ns: &mut [N<W>], ms: u64) {
    let until = w.now_ns() + ms * 1_000_000;
    while w.now_ns() < until {
        charged(CLIENT, || ns[0].poll());
        charged(SERVER, || ns[1].poll());
        w.step();
    }
}

/// Opens `k` sessions from node 0 to node 1 (charged to the client), 64
/// at a time (so that the simulated SM network's queues, whose memory is
/// charged to whoever sends, stay small), and waits until all are
/// connected.
fn open(w: &mut W, ns: &mut [N<W>], k: usize) {
    let mut left = k;
    while left > 0 {
        let n = left.min(64);
        left -= n;
        for _ in 0..n {
            let sn = charged(CLIENT, || ns[0].rpc.create_session("node-1:31850", 0))
                .expect("create_session");
            ns[0].ctx.sessions.push(sn);
        }
        let want = ns[0].ctx.sessions.len();
        run(w, ns, 10_000_000, "connect", |ns| {
            ns[0].rpc.num_sessions() == want
                && ns[0]
                    .ctx
                    .sessions
                    .iter()
                    .rev()
                    .take(n)
                    .all(|&sn| ns[0].rpc.is_connected(sn))
        });
    }
}

/// One echo per session (the test app sends each next request on the
/// next session), `window` in flight at a time, and wait for them.
fn one_rpc_per_session(w: &mut W, ns: &mut [N<W>], window: usize) {
    let k = ns[0].ctx.sessions.len();
    let before = ns[0].ctx.completed;
    ns[0].ctx.todo = (0..k)
        .map(|_| Op {
            req_type: ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    charged(CLIENT, || {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, window);
    });
    run(w, ns, 10_000_000, "one RPC per session", |ns| {
        ns[0].ctx.completed + ns[0].ctx.failed == before + k as u64
    });
    assert_eq!(ns[0].ctx.failed, 0, "{:?}", &ns[0].ctx.errors[..1]);
    assert_eq!(ns[0].ctx.bad_data, 0);
}

// --------------------------------------------------------------- tests

/// Heap bytes per idle session, client and server: the growth of each
/// side's heap from 1 000 to 3 000 idle sessions that each served a
/// request, divided by 2 000 (so that what does not grow with sessions,
/// such as the spare pools' fixed slack, cancels).
#[test]
fn an_idle_session_costs_at_most_2_kib_of_heap() {
    with_seeds(
        "an_idle_session_costs_at_most_2_kib_of_heap",
        FILE,
        &[1],
        |seed| {
            let (k1, k2) = (1000, 3000);
            let cfg = RpcConfig::default();
            let ring = (k2 + 16) * cfg.session_credits;
            let (mut w, mut ns) = pair(seed, ring.next_power_of_two(), cfg);
            let at = |w: &mut W, ns: &mut Vec<N<W>>, k: usize| {
                let more = k - ns[0].ctx.sessions.len();
                open(w, ns, more);
                one_rpc_per_session(w, ns, 16);
                // Let the sessions go idle: the loss scan retires their active
                // state and trims the spare pools.
                idle(w, ns, 200);
                (net_bytes(CLIENT), net_bytes(SERVER))
            };
            at(&mut w, &mut ns, 16);
            let (c1, s1) = at(&mut w, &mut ns, k1);
            let (c2, s2) = at(&mut w, &mut ns, k2);
            let per_client = (c2 - c1) as f64 / (k2 - k1) as f64;
            let per_server = (s2 - s1) as f64 / (k2 - k1) as f64;
            eprintln!(
                "heap per idle session: client {per_client:.0} bytes, server {per_server:.0} bytes"
            );
            assert!(
                per_client <= 2048.0,
                "client session: {per_client:.0} bytes"
            );
            assert!(
                per_server <= 2048.0,
                "server session: {per_server:.0} bytes"
            );
        },
    );
}

/// Everything a churn must give back, on both nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    heap: i64,
    sessions: [usize; 2],
    ring_unreserved: [usize; 2],
    alloc_in_use: [usize; 2],
    pools: [erpc::ActivePools; 2],
}

fn held(ns: &[N<W>]) -> Held {
    Held {
        heap: TOTAL_BYTES.with(|t| t.get()),
        sessions: [ns[0].rpc.num_sessions(), ns[1].rpc.num_sessions()],
        ring_unreserved: [
            ns[0].rpc.rx_ring_unreserved().0,
            ns[1].rpc.rx_ring_unreserved().0,
        ],
        alloc_in_use: [
            ns[0].rpc.alloc_stats().in_use_bytes,
            ns[1].rpc.alloc_stats().in_use_bytes,
        ],
        pools: [ns[0].rpc.active_pools(), ns[1].rpc.active_pools()],
    }
}

/// One session's life: connect, one echo, disconnect.
fn churn_one(w: &mut W, ns: &mut Vec<N<W>>) {
    let sn =
        charged(CLIENT, || ns[0].rpc.create_session("node-1:31850", 0)).expect("create_session");
    // The test application's own records must not grow either.
    ns[0].ctx.sessions.clear();
    ns[0].ctx.events.clear();
    ns[0].ctx.sessions.push(sn);
    run(w, ns, 1_000_000, "connect", |ns| ns[0].rpc.is_connected(sn));
    one_rpc_per_session(w, ns, 1);
    charged(CLIENT, || ns[0].rpc.destroy_session(sn)).expect("destroy_session");
    run(w, ns, 1_000_000, "disconnect", |ns| {
        ns[0].rpc.session_state(sn).is_none() && ns[1].rpc.num_sessions() == 0
    });
}

/// Creating and destroying sessions one after another, `ERPC_CHURN`
/// times (default 100 000), leaves heap, RX ring reservations, session
/// numbers, message buffers, the active-session pools and the timing
/// wheel's buckets where they were, once the server's memory of retired
/// tokens and the session-number quarantine have expired.
#[test]
fn session_churn_leaves_nothing_behind() {
    with_seeds("session_churn_leaves_nothing_behind", FILE, &[2], |seed| {
        let n: usize = std::env::var("ERPC_CHURN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        let (mut w, mut ns) = pair(seed, 4096, RpcConfig::default());
        for _ in 0..100 {
            churn_one(&mut w, &mut ns);
        }
        idle(&mut w, &mut ns, 11_000);
        let before = held(&ns);
        for _ in 0..n {
            churn_one(&mut w, &mut ns);
        }
        idle(&mut w, &mut ns, 11_000);
        let after = held(&ns);
        eprintln!("before {before:?}\nafter  {after:?}");
        // The heap may differ by what a shrunk table keeps (a few hundred
        // bytes), never by anything per session: 100 000 sessions leave
        // far more than this if one byte stays behind per session.
        assert!(
            after.heap <= before.heap + 4096,
            "{n} sessions created and destroyed left {} bytes of heap behind",
            after.heap - before.heap
        );
        assert_eq!(
            Held {
                heap: before.heap,
                ..after
            },
            before,
            "{n} sessions created and destroyed"
        );
    });
}

/// An Rpc holds 2 500 sessions at 32 credits each on the simulated network
/// when its ring is sized for them (`erpc::rx_ring_entries_for`): a client
/// opens them all to one server Rpc and each carries an RPC.
#[test]
fn an_rpc_holds_2500_sessions() {
    with_seeds("an_rpc_holds_2500_sessions", FILE, &[3], |seed| {
        let k = 2500;
        let ring = erpc::rx_ring_entries_for(k, erpc::SESSION_CREDITS);
        let mut w = W::with_config(SimConfig {
            seed,
            ring_entries: ring,
            ..SimConfig::default()
        });
        let mut ns = common::scenarios::nodes(&mut w, 2, seed);
        assert_eq!(ns[1].rpc.rx_ring_unreserved(), (ring, ring));
        common::scenarios::many_sessions(&mut w, &mut ns, 0, 1, k, 64);
        let (free, total) = ns[1].rpc.rx_ring_unreserved();
        assert_eq!(
            total - free,
            k * erpc::SESSION_CREDITS,
            "each reserves its credits"
        );
        assert_eq!(ns[0].rpc.stats().total_drops(), 0, "{}", ns[0].rpc.stats());
        assert_eq!(ns[1].rpc.stats().total_drops(), 0, "{}", ns[1].rpc.stats());
    });
}
