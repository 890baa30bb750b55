//! After warm-up, the request/response path allocates nothing on the heap:
//! client and server Rpcs, single- and multi-packet messages, credit
//! returns, RFRs, the session backlog, background handlers (inline), and
//! the simulated network itself. A counting global allocator counts the
//! allocations made on this test's thread while counting is on.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::app::{self, BG_SIZED, Ctx, ECHO, SIZED};
use common::{Node, SimWorld, World, run_until};
use erpc::RpcConfig;
use netsim::Rng;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; the
// counter is an atomic and the flag a const-initialised thread local,
// neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn no_heap_allocation_per_request_after_warm_up() {
    let seed = common::seed_or(5);
    let mut w = SimWorld::new(seed);
    let mut ns: Vec<Node<<SimWorld as World>::T, Ctx>> = (0..2)
        .map(|i| {
            // Keep-alive pings (the SM thread's work in production, inline
            // in the simulated SM hub here) allocate a little every ping
            // interval; they are not per request, so keep them out of the
            // counted window.
            let nexus = app::register::<<SimWorld as World>::T>(w.nexus(&format!("n{i}:1")))
                .failure_timeout_ms(3_600_000)
                .build()
                .unwrap();
            let mut ctx = Ctx::new(seed + i as u64);
            ctx.reuse_buffers = true;
            Node::new(
                &mut w,
                &nexus,
                0,
                ctx,
                RpcConfig::default(),
                Some(app::sm_handler),
            )
        })
        .collect();
    let sn = ns[0].rpc.create_session("n1:1", 0).unwrap();
    ns[0].ctx.sessions.push(sn);
    run_until(&mut w, &mut ns, 100_000, "connect", |ns| {
        ns[0].rpc.is_connected(sn)
    });
    let sizes = [12, 100, 968, 969, 3000, 9000];
    let mut rng = Rng::new(seed);
    let mut round = |w: &mut SimWorld, ns: &mut Vec<Node<_, Ctx>>, n: usize, counting: bool| {
        let ops = app::random_ops(&mut rng, n, &[ECHO, SIZED, BG_SIZED], &sizes);
        let before = ns[0].ctx.completed;
        ns[0].ctx.todo.extend(ops);
        COUNTING.with(|c| c.set(counting));
        {
            let n0 = &mut ns[0];
            app::start(&mut n0.rpc, &mut n0.ctx, 24);
        }
        run_until(w, ns, 10_000_000, "round", |ns| {
            ns[0].ctx.completed == before + n as u64
        });
        COUNTING.with(|c| c.set(false));
    };
    // Warm-up: pools, free lists, queues and backlogs reach their sizes.
    for _ in 0..3 {
        round(&mut w, &mut ns, 3000, false);
    }
    ALLOCS.store(0, Ordering::Relaxed);
    // `todo` already has the capacity for this round's ops.
    round(&mut w, &mut ns, 3000, true);
    let allocs = ALLOCS.load(Ordering::Relaxed);
    assert!(ns[0].ctx.errors.is_empty(), "{:?}", ns[0].ctx.errors);
    assert_eq!(ns[0].ctx.bad_data, 0);
    assert_eq!(
        allocs, 0,
        "{allocs} heap allocations in 3000 requests after warm-up"
    );
}
