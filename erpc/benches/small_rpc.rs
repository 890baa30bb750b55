//! Small-RPC rate and latency (the paper's Figure 4 setup, scaled to this
//! machine): 32-byte requests and responses, B requests per batch, at most
//! 60 in flight per thread, every thread both client and server. Each
//! transport is compared with a raw echo of 32-byte packets over the same
//! transport, measured in the same run.
//!
//! ```sh
//! cargo bench -p erpc --bench small_rpc            # everything
//! cargo bench -p erpc --bench small_rpc -- sim     # simulated network only
//! cargo bench -p erpc --bench small_rpc -- udp     # kernel UDP only
//! # instructions per RPC (eRPC code only), see BENCHMARKS.md:
//! valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!   target/release/deps/small_rpc-* callgrind 20000 [FACTOR]
//! # ... with K idle sessions on each node beside the measured one:
//! ERPC_IDLE_SESSIONS=20000 erpc/benches/callgrind_ir.sh
//! # the same per factor of the factor analysis:
//! erpc/benches/callgrind_factors.sh
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use erpc::{Clock, Completion, MsgBuf, Nexus, Request, Rpc, RpcConfig};
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
use transport::udp::{UdpConfig, UdpTransport};
use transport::{PKTHDR_BYTES, RxRing, Transport, TxItem};

const REQ: u8 = 1;
const MSG: usize = 32;
const WINDOW: usize = 60;
const LAT_SAMPLES: usize = 1 << 20;

struct Ctx {
    session: u16,
    /// Sessions that only sit there (`ERPC_IDLE_SESSIONS`).
    idle: Vec<u16>,
    in_flight: usize,
    completed: u64,
    pool: Vec<(MsgBuf, MsgBuf)>,
    sent_ns: [u64; 64],
    free_tags: Vec<usize>,
    lat_ns: Vec<u32>,
    record: bool,
    clock: Clock,
}

fn handler<T: Transport>(rpc: &mut Rpc<T, Ctx>, _c: &mut Ctx, req: Request<'_>) {
    let mut m = rpc.response_buffer(&req.handle, MSG).expect("resp");
    m.data_mut()[..8].copy_from_slice(&req.data[..8]);
    rpc.enqueue_response(req.handle, m).expect("respond");
}

fn cont<T: Transport>(_rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, comp: Completion) {
    c.in_flight -= 1;
    c.completed += 1;
    if c.record && c.lat_ns.len() < LAT_SAMPLES {
        let d = c.clock.now_ns() - c.sent_ns[comp.tag];
        c.lat_ns.push(d.min(u64::from(u32::MAX)) as u32);
    }
    c.free_tags.push(comp.tag);
    c.pool.push((comp.req, comp.resp));
}

fn new_ctx<T: Transport + 'static>(rpc: &mut Rpc<T, Ctx>, clock: Clock) -> Ctx {
    let pool = (0..WINDOW)
        .map(|_| {
            (
                rpc.alloc_msg_buffer(MSG).unwrap(),
                rpc.alloc_msg_buffer(MSG).unwrap(),
            )
        })
        .collect();
    Ctx {
        session: 0,
        idle: Vec::new(),
        in_flight: 0,
        completed: 0,
        pool,
        sent_ns: [0; 64],
        free_tags: (0..64).collect(),
        lat_ns: Vec::with_capacity(LAT_SAMPLES),
        record: false,
        clock,
    }
}

/// Issues a batch of `b` requests if the window allows.
fn issue<T: Transport>(rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, b: usize, window: usize) {
    if c.in_flight + b > window {
        return;
    }
    let now = c.clock.now_ns();
    for _ in 0..b {
        let (req, resp) = c.pool.pop().expect("pool sized to the window");
        let tag = c.free_tags.pop().expect("tags");
        c.sent_ns[tag] = now;
        c.in_flight += 1;
        rpc.enqueue_request(c.session, REQ, req, resp, cont::<T>, tag)
            .expect("enqueue");
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

// ------------------------------------------------------------ simulation

fn sim_nodes(net: &SimNet) -> Vec<(Rpc<SimTransport, Ctx>, Ctx)> {
    sim_nodes_with(net, RpcConfig::default())
}

fn sim_nodes_with(net: &SimNet, cfg: RpcConfig) -> Vec<(Rpc<SimTransport, Ctx>, Ctx)> {
    sim_nodes_as(net, cfg, Handler::Dispatch, 0)
}

/// Where the benchmark's handler runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Handler {
    /// In the dispatch thread (zero copy).
    Dispatch,
    /// On a worker: `Some(n)` stepped workers (the worker hand-off, run by
    /// the benchmark's thread), `None` inline in the event loop (0 workers).
    Background(Option<usize>),
}

/// The same response as `handler`, from a worker.
fn bg_handler(req: &[u8], resp: &mut erpc::BgResponse<'_>) {
    resp.buf(MSG)[..8].copy_from_slice(&req[..8]);
}

/// The two nodes with the handler `h`, each also holding `idle` sessions
/// beside the measured one (half client sessions to the other node, half
/// the other node's), each of which served one request and then went idle.
fn sim_nodes_as(
    net: &SimNet,
    cfg: RpcConfig,
    h: Handler,
    idle: usize,
) -> Vec<(Rpc<SimTransport, Ctx>, Ctx)> {
    let mut v: Vec<(Rpc<SimTransport, Ctx>, Ctx)> = (0..2)
        .map(|i| {
            let b = Nexus::builder(&format!("n{i}:1"));
            let b = match h {
                Handler::Dispatch => b.handler::<SimTransport, Ctx>(REQ, handler::<SimTransport>),
                Handler::Background(None) => b.bg_handler(REQ, bg_handler).workers(0),
                Handler::Background(Some(n)) => b.bg_handler(REQ, bg_handler).stepped_workers(n),
            };
            let nexus = b
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .build()
                .unwrap();
            let mut rpc = Rpc::builder(&nexus, net.add_transport(), test_allocator(8 << 20))
                .config(cfg)
                .build()
                .unwrap();
            let ctx = new_ctx(&mut rpc, net.erpc_clock());
            (rpc, ctx)
        })
        .collect();
    for (i, (rpc, ctx)) in v.iter_mut().enumerate() {
        ctx.session = rpc.create_session(&format!("n{}:1", 1 - i), 0).unwrap();
    }
    for _ in 0..10_000 {
        for (r, c) in v.iter_mut() {
            r.run_event_loop_once(c);
        }
        net.advance(1000);
    }
    assert!(v.iter().all(|(r, c)| r.is_connected(c.session)));
    // The idle sessions, a window's worth at a time, each serving one
    // request.
    let measured: Vec<u16> = v.iter().map(|(_, c)| c.session).collect();
    let mut left = idle / 2;
    while left > 0 {
        let n = left.min(WINDOW);
        left -= n;
        for (i, (rpc, ctx)) in v.iter_mut().enumerate() {
            for _ in 0..n {
                let sn = rpc.create_session(&format!("n{}:1", 1 - i), 0).unwrap();
                ctx.idle.push(sn);
            }
        }
        while !v
            .iter()
            .all(|(r, c)| c.idle.iter().all(|&s| r.is_connected(s)))
        {
            for (r, c) in v.iter_mut() {
                r.run_event_loop_once(c);
            }
            net.advance(1000);
        }
        for (r, c) in v.iter_mut() {
            let fresh: Vec<u16> = c.idle.iter().rev().take(n).copied().collect();
            for sn in fresh {
                c.session = sn;
                issue(r, c, 1, WINDOW);
            }
        }
        while v.iter().any(|(_, c)| c.in_flight > 0) {
            for (r, c) in v.iter_mut() {
                r.run_event_loop_once(c);
            }
            net.advance(1000);
        }
    }
    for ((_, c), sn) in v.iter_mut().zip(measured) {
        c.session = sn;
        c.completed = 0;
    }
    // Idle long enough for the loss scans to find them so.
    for _ in 0..10_000 {
        for (r, c) in v.iter_mut() {
            r.run_event_loop_once(c);
        }
        net.advance(1000);
    }
    v
}

/// RPCs per wall-clock second over the simulated network.
fn sim_rate(b: usize, dur: Duration) -> f64 {
    let net = SimNet::new(SimConfig::default());
    let mut v = sim_nodes(&net);
    let t0 = Instant::now();
    let mut iters = 0u64;
    while t0.elapsed() < dur {
        for (r, c) in v.iter_mut() {
            issue(r, c, b, WINDOW);
            r.run_event_loop_once(c);
        }
        net.advance(100);
        iters += 1;
        let _ = iters;
    }
    let done: u64 = v.iter().map(|(_, c)| c.completed).sum();
    done as f64 / t0.elapsed().as_secs_f64()
}

/// Raw echo of 32-byte packets over a pair of transports (the reference):
/// round trips per second with `WINDOW` packets in flight per side.
fn raw_echo<T: Transport>(a: &mut T, b: &mut T, mut between: impl FnMut(), dur: Duration) -> f64 {
    let ra = a.resolve(&b.local_routing_info()).unwrap();
    let rb = b.resolve(&a.local_routing_info()).unwrap();
    let mut frame_a = [0u8; PKTHDR_BYTES + MSG];
    let mut frame_b = [0u8; PKTHDR_BYTES + MSG];
    let flen = PKTHDR_BYTES + MSG;
    a.fill_headroom(&ra, &mut frame_a[..42], flen);
    b.fill_headroom(&rb, &mut frame_b[..42], flen);
    let mut ring_a = a.take_rx_ring().expect("the RX ring");
    let mut ring_b = b.take_rx_ring().expect("the RX ring");
    let item = |route, pkt| TxItem::unregistered(route, pkt, &[]);
    let burst_a: Vec<_> = (0..16).map(|_| item(&ra, &frame_a[..])).collect();
    let burst_b: Vec<_> = (0..16).map(|_| item(&rb, &frame_b[..])).collect();
    let (mut in_flight, mut done) = (0usize, 0u64);
    let (mut head_a, mut head_b) = (0usize, 0usize);
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        if in_flight + 16 <= WINDOW {
            in_flight += a.tx_burst(&burst_a);
        }
        let n = b.rx_burst();
        for k in 0..n {
            let _ = ring_b.packet((head_b + k) % ring_b.entries());
        }
        head_b += n;
        b.post_recvs(&mut ring_b, n);
        let mut left = n;
        while left > 0 {
            left -= b.tx_burst(&burst_b[..left.min(16)]);
        }
        between();
        let n = a.rx_burst();
        for k in 0..n {
            let _ = ring_a.packet((head_a + k) % ring_a.entries());
        }
        head_a += n;
        a.post_recvs(&mut ring_a, n);
        in_flight -= n;
        done += n as u64;
        between();
    }
    done as f64 / t0.elapsed().as_secs_f64()
}

fn sim_section(dur: Duration) {
    println!("## simulated network (one thread, both Rpcs; wall-clock rate)");
    let net = SimNet::new(SimConfig::default());
    let (mut a, mut b) = (net.add_transport(), net.add_transport());
    let raw = raw_echo(&mut a, &mut b, || net.advance(100), dur);
    println!(
        "raw echo (32 B, 60 in flight): {:.3} M round trips/s",
        raw / 1e6
    );
    for bsz in [1, 3, 8, 16] {
        let r = sim_rate(bsz, dur);
        println!(
            "B = {bsz:2}: {:.3} M RPCs/s (both nodes); eRPC / raw echo = {:.2}",
            r / 1e6,
            r / raw
        );
    }
}

// ------------------------------------------------------------------- UDP

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct UdpResult {
    rate: f64,
    lat_us: (f64, f64, f64),
}

/// Two threads, one Rpc each, each client of the other.
fn udp_run(b: usize, window: usize, dur: Duration) -> UdpResult {
    let uri = format!("127.0.0.1:{}", free_port());
    let nexus = Nexus::builder(&uri)
        .handler::<UdpTransport, Ctx>(REQ, handler::<UdpTransport>)
        .workers(0)
        .build()
        .unwrap();
    let ready = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2u8)
        .map(|id| {
            let (nexus, ready, stop, total, uri) = (
                nexus.clone(),
                ready.clone(),
                stop.clone(),
                total.clone(),
                uri.clone(),
            );
            std::thread::spawn(move || {
                let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
                let mut rpc: Rpc<UdpTransport, Ctx> =
                    Rpc::builder(&nexus, t, test_allocator(8 << 20))
                        .id(id)
                        .build()
                        .unwrap();
                let mut c = new_ctx(&mut rpc, nexus.clock().clone());
                ready.wait();
                c.session = rpc.create_session(&uri, 1 - id).unwrap();
                while !rpc.is_connected(c.session) {
                    rpc.run_event_loop_once(&mut c);
                }
                ready.wait();
                // Warm up, then measure.
                let t0 = Instant::now();
                let mut measuring = false;
                let mut base = 0;
                let mut t_start = t0;
                while !stop.load(Ordering::Relaxed) {
                    issue(&mut rpc, &mut c, b, window);
                    rpc.run_event_loop_once(&mut c);
                    if !measuring && t0.elapsed() > Duration::from_millis(200) {
                        measuring = true;
                        c.record = true;
                        base = c.completed;
                        t_start = Instant::now();
                    }
                }
                let rate = (c.completed - base) as f64 / t_start.elapsed().as_secs_f64();
                total.fetch_add(rate as u64, Ordering::Relaxed);
                // Keep serving briefly so the peer's last requests finish.
                rpc.run_event_loop(&mut c, Duration::from_millis(20));
                if std::env::var_os("ERPC_BENCH_DEBUG").is_some() {
                    eprintln!(
                        "rpc {id}: in flight {}, {}, refused {}, transport {:?}",
                        c.in_flight,
                        rpc.stats(),
                        rpc.stats().tx_refused,
                        rpc.transport().stats()
                    );
                }
                c.lat_ns
            })
        })
        .collect();
    std::thread::sleep(dur + Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<u32> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    lat.sort_unstable();
    UdpResult {
        rate: total.load(Ordering::Relaxed) as f64,
        lat_us: (
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
        ),
    }
}

/// Raw echo over two UDP transports on two threads: each thread sends
/// 32-byte datagrams (60 in flight) and echoes the other's, like the eRPC
/// runs where each thread is client and server.
fn udp_raw_echo_threads(dur: Duration) -> f64 {
    use std::sync::mpsc::channel;
    let (a_info, b_info) = (channel(), channel());
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(2));
    let chans = [(a_info.0, b_info.1), (b_info.0, a_info.1)];
    let threads: Vec<_> = chans
        .into_iter()
        .map(|(send_info, recv_info)| {
            let (stop, total, ready) = (stop.clone(), total.clone(), ready.clone());
            std::thread::spawn(move || {
                let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
                send_info.send(t.local_routing_info()).unwrap();
                let peer = t.resolve(&recv_info.recv().unwrap()).unwrap();
                let mut ring = t.take_rx_ring().expect("the RX ring");
                // Byte 0 of the eRPC header: 0 = request, 1 = echo.
                let req = [0u8; PKTHDR_BYTES + MSG];
                let mut rsp = [0u8; PKTHDR_BYTES + MSG];
                rsp[42] = 1;
                let item = |pkt| TxItem::unregistered(&peer, pkt, &[]);
                let reqs: Vec<_> = (0..16).map(|_| item(&req[..])).collect();
                let rsps: Vec<_> = (0..16).map(|_| item(&rsp[..])).collect();
                let (mut in_flight, mut done, mut head) = (0usize, 0u64, 0usize);
                ready.wait();
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if in_flight + 16 <= WINDOW {
                        in_flight += t.tx_burst(&reqs);
                    }
                    let n = t.rx_burst();
                    let mut echoes = 0;
                    for k in 0..n {
                        match ring.packet((head + k) % ring.entries()).map(|p| p[0]) {
                            Some(0) => echoes += 1,
                            _ => {
                                in_flight -= 1;
                                done += 1;
                            }
                        }
                    }
                    head += n;
                    t.post_recvs(&mut ring, n);
                    while echoes > 0 {
                        echoes -= t.tx_burst(&rsps[..echoes.min(16)]);
                    }
                }
                let rate = done as f64 / t0.elapsed().as_secs_f64();
                total.fetch_add(rate as u64, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64
}

fn udp_section(dur: Duration) {
    println!("## kernel UDP over loopback (2 threads, each client and server)");
    let raw = udp_raw_echo_threads(dur);
    println!(
        "raw echo (32 B, 60 in flight per thread, 2 threads each sender and echoer): \
         {:.3} M round trips/s",
        raw / 1e6
    );
    let r = udp_run(1, 1, dur);
    println!(
        "latency (B = 1, window 1): median {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs; {:.3} M RPCs/s; eRPC / raw echo = {:.2}",
        r.lat_us.0,
        r.lat_us.1,
        r.lat_us.2,
        r.rate / 1e6,
        r.rate / raw
    );
    let bs: Vec<usize> = std::env::var("ERPC_BENCH_B")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 3, 8, 16]);
    for bsz in bs {
        let r = udp_run(bsz, WINDOW, dur);
        println!(
            "B = {bsz:2}, 60 in flight: {:.3} M RPCs/s (both threads); eRPC / raw echo = {:.2}; latency median {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
            r.rate / 1e6,
            r.rate / raw,
            r.lat_us.0,
            r.lat_us.1,
            r.lat_us.2
        );
    }
}

/// The eRPC-level switches of the factor analysis, by name: the
/// configuration with that optimisation off (`all`: everything on).
/// The NIC-level ones (multi-packet RQ, unsignaled TX, doorbell batching)
/// live in the mlx5 transport and are not on the simulated network.
fn factor_config(name: &str) -> Option<RpcConfig> {
    let mut c = RpcConfig::default();
    match name {
        "all" => {}
        "batch-ts" => c.cc.batch_timestamps = false,
        "timely-bypass" => c.cc.timely_bypass = false,
        "wheel-bypass" => c.cc.wheel_bypass = false,
        "prealloc" => c.prealloc_responses = false,
        "zero-copy" => c.zero_copy_rx = false,
        "cc-off" => c.cc = erpc::CcConfig::disabled(),
        _ => return None,
    }
    Some(c)
}

/// A fixed amount of simulated work, for callgrind, with the factor
/// analysis' optimisation `factor` switched off; or (`bg`, `bg-inline`)
/// with everything on and the handler on a worker: one stepped worker per
/// node, which the loop runs after each event-loop iteration (the worker
/// hand-off, deterministic), or 0 workers (the handler inline in the
/// event loop).
fn callgrind_run(n: u64, factor: &str) {
    let (cfg, h) = match factor {
        "bg" => (RpcConfig::default(), Handler::Background(Some(1))),
        "bg-inline" => (RpcConfig::default(), Handler::Background(None)),
        f => match factor_config(f) {
            Some(cfg) => (cfg, Handler::Dispatch),
            None => {
                eprintln!(
                    "unknown factor {factor}: all, batch-ts, timely-bypass, wheel-bypass, \
                     prealloc, zero-copy, cc-off, bg, bg-inline"
                );
                std::process::exit(2);
            }
        },
    };
    // `ERPC_IDLE_SESSIONS=K`: each node holds K sessions beside the
    // measured one (issue 28: the cost of idle sessions).
    let idle: usize = std::env::var("ERPC_IDLE_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let net = SimNet::new(SimConfig {
        ring_entries: erpc::rx_ring_entries_for(idle + 1, cfg.session_credits)
            .max(erpc::RX_RING_ENTRIES_DEFAULT),
        ..SimConfig::default()
    });
    let mut v = sim_nodes_as(&net, cfg, h, idle);
    let target: u64 = n;
    let mut steps = 0u64;
    let stepped = matches!(h, Handler::Background(Some(_)));
    while v.iter().map(|(_, c)| c.completed).sum::<u64>() < target && steps < 100 * target {
        // Two loops, so that the dispatch one is the same code as before
        // stepped workers existed (the callgrind guard's count).
        if stepped {
            for (r, c) in v.iter_mut() {
                issue(r, c, 8, WINDOW);
                r.run_event_loop_once(c);
                r.nexus().step_workers();
            }
        } else {
            for (r, c) in v.iter_mut() {
                issue(r, c, 8, WINDOW);
                r.run_event_loop_once(c);
            }
        }
        net.advance(100);
        steps += 1;
    }
    let done: u64 = v.iter().map(|(_, c)| c.completed).sum();
    println!(
        "callgrind run: {done} RPCs (each node client and server), sessions per node {:?}",
        v.iter().map(|(r, _)| r.num_sessions()).collect::<Vec<_>>()
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("callgrind") {
        let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
        let factor = args.get(2).map_or("all", String::as_str);
        return callgrind_run(n, factor);
    }
    let dur = Duration::from_millis(
        std::env::var("ERPC_BENCH_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1500),
    );
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    if want("sim") {
        sim_section(dur);
    }
    if want("udp") {
        udp_section(dur);
    }
}
