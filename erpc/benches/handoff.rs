//! The worker hand-off: what it costs to run a handler on a worker thread
//! instead of in the dispatch thread.
//!
//! ```sh
//! cargo bench -p erpc --bench handoff            # everything
//! cargo bench -p erpc --bench handoff -- rings   # the queues alone
//! cargo bench -p erpc --bench handoff -- rpc     # through eRPC
//! ```
//!
//! * `rings`: a round trip between two threads through a pair of queues,
//!   the far thread spinning, carrying a 128-byte value (the size of an
//!   eRPC job): eRPC's single-producer single-consumer ring
//!   (`nexus/spsc.rs`, compiled into this benchmark), crossbeam's
//!   `ArrayQueue` (multi-producer multi-consumer), `std::sync::mpsc`
//!   polled with `try_recv`, and `std::sync::mpsc` with the far thread
//!   blocked in `recv` (what the workers did before issue 29); rounds
//!   alternate between the queues. Also the cost of a push and a pop on
//!   one thread (the operations alone, no cache-line transfer). The
//!   reference for the choice of queue (BENCHMARKS.md, "Worker hand-off").
//! * `rpc`: latency of a zero-work handler through eRPC at window 1 on
//!   the simulated network (one thread polls both Rpcs and steps the
//!   network, wall-clock time per RPC), in the dispatch thread and on one
//!   worker thread, in alternating rounds of the same run; the difference
//!   is the hand-off (dispatch enqueue → worker starts → the finished job
//!   back in the dispatch Rpc), with the request copy it needs. Worker
//!   idle policies: spin, and spin-then-park after 0 (a park before every
//!   job: the OS wake-up the old channel-based workers paid every time).

#[path = "../src/nexus/spsc.rs"]
#[allow(dead_code, unused_imports)]
mod spsc;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use erpc::{Completion, MsgBuf, Nexus, Request, Rpc, WorkerIdle};
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};

/// The value the queues carry: the size of an eRPC job.
#[derive(Debug, Clone, Copy)]
struct Payload([u64; 16]);

const _: () = assert!(std::mem::size_of::<Payload>() == 128);

fn pct(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Round trips through a pair of queues: `send`/`recv` on this thread,
/// `echo` on a spinning thread. Returns sorted round-trip times in ns.
fn ping_pong<S, R>(
    n: usize,
    mut send: S,
    mut recv: R,
    echo: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
) -> Vec<u64>
where
    S: FnMut(Payload),
    R: FnMut() -> Option<Payload>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || echo(s));
    let mut lat = Vec::with_capacity(n);
    let mut v = Payload([0; 16]);
    for i in 0..n + n / 10 {
        v.0[0] = i as u64;
        let t0 = Instant::now();
        send(v);
        let back = loop {
            if let Some(b) = recv() {
                break b;
            }
            std::hint::spin_loop();
        };
        let dt = t0.elapsed().as_nanos() as u64;
        assert_eq!(back.0[0], i as u64);
        if i >= n / 10 {
            lat.push(dt);
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Unblock an echo thread that waits in `recv`.
    send(v);
    t.join().unwrap();
    lat.sort_unstable();
    lat
}

/// Nanoseconds per push + pop on one thread (no other thread touches the
/// queue: the operations' own cost, without cache-line transfers).
fn same_thread(
    n: usize,
    mut push: impl FnMut(Payload),
    mut pop: impl FnMut() -> Option<Payload>,
) -> f64 {
    let mut v = Payload([0; 16]);
    let t0 = Instant::now();
    for i in 0..n {
        v.0[0] = i as u64;
        push(black_box(v));
        black_box(pop());
    }
    t0.elapsed().as_nanos() as f64 / n as f64
}

const QUEUES: [&str; 4] = [
    "erpc link ring (in place, one ring)",
    "crossbeam ArrayQueue",
    "std mpsc sync_channel, polled",
    "std mpsc, far end blocked in recv",
];

/// One round trip measurement of queue `k`: sorted latencies, and the
/// same-thread cost per push + pop (NaN where it does not apply).
fn one_queue(k: usize, n: usize) -> (Vec<u64>, f64) {
    let cap = 256;
    match k {
        0 => {
            // One link: out through the ring, worked on in place, back.
            let (o, mut w) = spsc::ring::<Payload>(cap);
            let o = std::cell::RefCell::new(o);
            let lat = {
                let o2 = &o;
                ping_pong(
                    n,
                    |v| o2.borrow_mut().push(v).expect("room"),
                    || o2.borrow_mut().pop(),
                    move |stop| {
                        while !stop.load(Ordering::Relaxed) {
                            w.process(|v| {
                                black_box(v);
                            });
                        }
                    },
                )
            };
            let (mut o, mut w) = spsc::ring::<Payload>(cap);
            let s = {
                let mut v = Payload([0; 16]);
                let t0 = Instant::now();
                for i in 0..n * 10 {
                    v.0[0] = i as u64;
                    o.push(black_box(v)).expect("room");
                    w.process(|v| {
                        black_box(v);
                    });
                    black_box(o.pop());
                }
                t0.elapsed().as_nanos() as f64 / (n * 10) as f64
            };
            (lat, s)
        }
        1 => {
            use crossbeam_queue::ArrayQueue;
            let a = Arc::new(ArrayQueue::<Payload>::new(cap));
            let b = Arc::new(ArrayQueue::<Payload>::new(cap));
            let (a2, b2) = (a.clone(), b.clone());
            let lat = ping_pong(
                n,
                move |v| a.push(v).expect("room"),
                move || b.pop(),
                move |stop| {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(v) = a2.pop() {
                            let _ = b2.push(v);
                        }
                    }
                },
            );
            let q = ArrayQueue::<Payload>::new(cap);
            let s = same_thread(n * 10, |v| q.push(v).expect("room"), || q.pop());
            (lat, s)
        }
        2 => {
            use std::sync::mpsc::sync_channel;
            let (atx, arx) = sync_channel::<Payload>(cap);
            let (btx, brx) = sync_channel::<Payload>(cap);
            let lat = ping_pong(
                n,
                move |v| atx.try_send(v).expect("room"),
                move || brx.try_recv().ok(),
                move |stop| {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(v) = arx.try_recv() {
                            let _ = btx.try_send(v);
                        }
                    }
                },
            );
            let (tx, rx) = sync_channel::<Payload>(cap);
            let s = same_thread(
                n * 10,
                |v| tx.try_send(v).expect("room"),
                || rx.try_recv().ok(),
            );
            (lat, s)
        }
        _ => {
            use std::sync::mpsc::sync_channel;
            let (atx, arx) = sync_channel::<Payload>(cap);
            let (btx, brx) = sync_channel::<Payload>(cap);
            let lat = ping_pong(
                n / 10,
                move |v| atx.try_send(v).expect("room"),
                move || brx.try_recv().ok(),
                move |stop| {
                    while let Ok(v) = arx.recv() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let _ = btx.try_send(v);
                    }
                },
            );
            (lat, f64::NAN)
        }
    }
}

fn rings(rounds: usize, n: usize) {
    println!(
        "## queues: round trip between two threads, 128-byte values \
         ({rounds} rounds of {n} round trips per queue, queues alternating)"
    );
    let mut lats: Vec<Vec<u64>> = vec![Vec::new(); QUEUES.len()];
    let mut same: Vec<Vec<f64>> = vec![Vec::new(); QUEUES.len()];
    let mut p50s: Vec<Vec<u64>> = vec![Vec::new(); QUEUES.len()];
    for _ in 0..rounds {
        for k in 0..QUEUES.len() {
            let (l, s) = one_queue(k, n);
            p50s[k].push(pct(&l, 0.5));
            lats[k].extend(l);
            same[k].push(s);
        }
    }
    println!(
        "{:<36} {:>8} {:>8} {:>9} {:>12} {:>18}  per-round p50s",
        "queue", "p50 ns", "p99 ns", "p99.9 ns", "/ spsc p50", "push+pop ns (1 thr)"
    );
    for l in lats.iter_mut() {
        l.sort_unstable();
    }
    let base = pct(&lats[0], 0.5) as f64;
    for k in 0..QUEUES.len() {
        let mut s = same[k].clone();
        s.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{:<36} {:>8} {:>8} {:>9} {:>12.2} {:>18.1}  {:?}",
            QUEUES[k],
            pct(&lats[k], 0.5),
            pct(&lats[k], 0.99),
            pct(&lats[k], 0.999),
            pct(&lats[k], 0.5) as f64 / base,
            s[s.len() / 2],
            p50s[k]
        );
    }
}

// ------------------------------------------------------------ through eRPC

const ZERO: u8 = 1;

struct Ctx {
    session: u16,
    done: bool,
    bufs: Option<(MsgBuf, MsgBuf)>,
}

fn dispatch_zero(rpc: &mut Rpc<SimTransport, Ctx>, _c: &mut Ctx, req: Request<'_>) {
    let mut m = rpc.response_buffer(&req.handle, 8).expect("resp");
    m.data_mut().copy_from_slice(&req.data[..8]);
    rpc.enqueue_response(req.handle, m).expect("respond");
}

fn cont(_rpc: &mut Rpc<SimTransport, Ctx>, c: &mut Ctx, comp: Completion) {
    assert!(comp.result.is_ok());
    c.done = true;
    c.bufs = Some((comp.req, comp.resp));
}

/// Per-RPC wall-clock latencies (ns) at window 1: `n` RPCs, a zero-work
/// handler in dispatch (`workers == None`) or on one worker thread.
fn rpc_latencies(
    net: &SimNet,
    pair: &mut [(Rpc<SimTransport, Ctx>, Ctx); 2],
    n: usize,
) -> Vec<u64> {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let (req, resp) = pair[0].1.bufs.take().expect("buffers");
        let session = pair[0].1.session;
        pair[0].1.done = false;
        let t0 = Instant::now();
        pair[0]
            .0
            .enqueue_request(session, ZERO, req, resp, cont, 0)
            .expect("enqueue");
        while !pair[0].1.done {
            for (r, c) in pair.iter_mut() {
                r.run_event_loop_once(c);
            }
            net.advance(100);
        }
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    lat
}

fn rpc_pair(
    net: &SimNet,
    name: &str,
    bg: Option<WorkerIdle>,
) -> [(Rpc<SimTransport, Ctx>, Ctx); 2] {
    let make = |uri: &str, server: bool| {
        let mut b = Nexus::builder(uri)
            .sm_link(net.sm_link())
            .clock(net.erpc_clock());
        if server {
            b = match bg {
                None => b.handler::<SimTransport, Ctx>(ZERO, dispatch_zero),
                Some(idle) => b
                    .bg_handler(ZERO, |req, resp| resp.write(&req[..8]))
                    .workers(1)
                    .worker_idle(idle),
            };
        }
        let nexus = b.build().unwrap();
        let mut rpc = Rpc::builder(&nexus, net.add_transport(), test_allocator(8 << 20))
            .build()
            .unwrap();
        let bufs = (
            rpc.alloc_msg_buffer(8).unwrap(),
            rpc.alloc_msg_buffer(8).unwrap(),
        );
        (
            rpc,
            Ctx {
                session: 0,
                done: false,
                bufs: Some(bufs),
            },
        )
    };
    let client = make(&format!("{name}-c:1"), false);
    let server = make(&format!("{name}-s:1"), true);
    let mut pair = [client, server];
    pair[0].1.session = pair[0].0.create_session(&format!("{name}-s:1"), 0).unwrap();
    while !pair[0].0.is_connected(pair[0].1.session) {
        for (r, c) in pair.iter_mut() {
            r.run_event_loop_once(c);
        }
        net.advance(1000);
    }
    pair
}

fn rpc_section(rounds: usize, per_round: usize) {
    println!(
        "## through eRPC: zero-work handler, window 1, simulated network, wall clock \
         ({rounds} rounds of {per_round} RPCs per kind, kinds alternating)"
    );
    let net = SimNet::new(SimConfig::default());
    let kinds: [(&str, Option<WorkerIdle>); 3] = [
        ("dispatch handler", None),
        ("worker, spin", Some(WorkerIdle::Spin)),
        (
            "worker, park after 0",
            Some(WorkerIdle::SpinThenPark {
                after: Duration::ZERO,
            }),
        ),
    ];
    let mut lats: Vec<Vec<u64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for (k, (_, bg)) in kinds.iter().enumerate() {
            let mut pair = rpc_pair(&net, &format!("r{round}k{k}"), *bg);
            // Warm-up (not recorded).
            rpc_latencies(&net, &mut pair, per_round / 10);
            lats[k].extend(rpc_latencies(&net, &mut pair, per_round));
        }
    }
    println!(
        "{:<24} {:>8} {:>8} {:>8}   {:>14} {:>14}",
        "handler", "p50 ns", "p99 ns", "p99.9 ns", "p50 - dispatch", "p99 - dispatch"
    );
    for l in lats.iter_mut() {
        l.sort_unstable();
    }
    let (d50, d99) = (pct(&lats[0], 0.5), pct(&lats[0], 0.99));
    for ((name, _), l) in kinds.iter().zip(&lats) {
        println!(
            "{name:<24} {:>8} {:>8} {:>8}   {:>14} {:>14}",
            pct(l, 0.5),
            pct(l, 0.99),
            pct(l, 0.999),
            pct(l, 0.5) as i64 - d50 as i64,
            pct(l, 0.99) as i64 - d99 as i64
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let all = args.is_empty();
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if all || args.iter().any(|a| a == "rings") {
        rings(7, 50_000);
    }
    if all || args.iter().any(|a| a == "rpc") {
        rpc_section(5, 20_000);
    }
}
