//! What the typed layer costs: 32-byte RPCs through the raw API, through
//! typed closure calls, and through `async` calls, in the same run, on the
//! device model (two software ConnectX NICs, one thread) and over kernel
//! UDP (loopback, one thread), each node client and server of the other with
//! `WINDOW` calls in flight. Rates are RPCs completed per wall-clock
//! second by both nodes; each mode runs `REPS` times, interleaved, and
//! the medians are compared with the raw API's.
//!
//! ```sh
//! cargo bench -p erpc-typed --bench typed_rpc                 # both transports
//! cargo bench -p erpc-typed --bench typed_rpc -- devmodel     # one of devmodel, udp, sim
//! ERPC_BENCH_MS=2000 ERPC_BENCH_REPS=5 cargo bench -p erpc-typed --bench typed_rpc
//! # instructions per RPC (deterministic, simulated network):
//! bash erpc/typed/benches/callgrind_typed.sh
//! ```
//!
//! The payload is 32 bytes in all modes: raw, a 32-byte msgbuf echoed;
//! typed, 32 bytes as `serde_bytes` (postcard adds a length byte: 33
//! bytes; the response also carries the layer's status byte: 34).
//! `raw34` is the raw API with those wire sizes (a 33-byte request, a
//! 34-byte response): over kernel UDP, where a run of same-sized
//! datagrams to one peer is one GSO `sendmsg`, the raw echo sends its
//! requests and responses together and the typed layer cannot, so
//! `/ raw34` is the layer's own cost and `/ raw` includes that. Every
//! response is checked: raw by comparing its first 8 bytes with the
//! request's, typed by decoding it and comparing the request's number
//! with the one the window position expects. The closure continuation
//! captures nothing (a capturing one is boxed: a malloc and a free per
//! call).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use erpc::{Completion, Nexus, NexusBuilder, Request, Rpc, RpcConfig};
use erpc_sim::{SimConfig, SimNet, SimTransport};
use erpc_typed::{CallError, Ctx, Endpoint, EndpointConfig, Method, Service};
use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
use serde::{Deserialize, Serialize};
use transport::Transport;

const REQ: u8 = 1;
const MSG: usize = 32;
/// Calls in flight per node.
const WINDOW: usize = 32;

/// The typed request and response: 32 opaque bytes, as the raw API's
/// (serde_bytes: postcard writes a length byte and copies the 32 bytes; a
/// plain `[u8; 32]` is a serde tuple of 32 `u8`s, encoded byte by byte).
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Debug)]
struct Small(#[serde(with = "serde_bytes")] [u8; MSG]);

impl Small {
    fn new(n: u64) -> Small {
        let mut b = [0x5a; MSG];
        b[..8].copy_from_slice(&n.to_le_bytes());
        Small(b)
    }
    fn num(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes"))
    }
}

impl Method for Small {
    const REQ_TYPE: u8 = REQ;
    type Resp = Small;
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Raw,
    /// The raw API with the typed layer's wire sizes: a 33-byte request
    /// and a 34-byte response. Over kernel UDP a run of datagrams of one
    /// size to one peer goes as one GSO `sendmsg`; the raw echo's requests
    /// and responses share a size, the typed layer's differ by its status
    /// byte, so this is the reference that separates the layer's own cost
    /// from that.
    RawWire,
    Typed,
    Async,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::RawWire => "raw34",
            Mode::Typed => "typed",
            Mode::Async => "async",
        }
    }

    /// The raw modes' request and response sizes.
    fn raw_sizes(self) -> (usize, usize) {
        match self {
            Mode::RawWire => (MSG + 1, MSG + 2),
            _ => (MSG, MSG),
        }
    }
}

// ------------------------------------------------------------- raw API

struct RawCtx {
    session: u16,
    completed: u64,
    bad: u64,
}

/// Answers with the request's bytes and `EXTRA` more (0: an echo).
fn raw_handler<T: Transport, const EXTRA: usize>(
    rpc: &mut Rpc<T, RawCtx>,
    _c: &mut RawCtx,
    req: Request<'_>,
) {
    let n = req.data.len();
    let mut m = rpc
        .response_buffer(&req.handle, n + EXTRA)
        .expect("response buffer");
    m.data_mut()[..n].copy_from_slice(req.data);
    rpc.enqueue_response(req.handle, m).expect("respond");
}

fn raw_cont<T: Transport>(rpc: &mut Rpc<T, RawCtx>, c: &mut RawCtx, comp: Completion) {
    if comp.result.is_err() || comp.resp.data()[..8] != comp.req.data()[..8] {
        c.bad += 1;
    }
    c.completed += 1;
    let mut req = comp.req;
    let n = u64::from_le_bytes(req.data()[..8].try_into().expect("8 bytes")) + WINDOW as u64;
    req.data_mut()[..8].copy_from_slice(&n.to_le_bytes());
    rpc.enqueue_request(c.session, REQ, req, comp.resp, raw_cont::<T>, 0)
        .expect("enqueue");
}

// ------------------------------------------------------ typed closures

#[derive(Default)]
struct TypedCtx {
    session: u16,
    completed: u64,
    bad: u64,
    /// The number each window position waits for.
    expect: [u64; WINDOW],
}

fn issue<T: Transport + 'static>(ctx: &mut Ctx<'_, T, TypedCtx>, n: u64) {
    let s = ctx.session;
    ctx.expect[n as usize % WINDOW] = n;
    ctx.call_then(s, Small::new(n), on_small::<T>)
        .expect("call");
}

fn on_small<T: Transport + 'static>(ctx: &mut Ctx<'_, T, TypedCtx>, r: Result<Small, CallError>) {
    let n = match r {
        Ok(s) if ctx.expect[s.num() as usize % WINDOW] == s.num() => s.num(),
        _ => {
            ctx.bad += 1;
            return;
        }
    };
    ctx.completed += 1;
    issue(ctx, n + WINDOW as u64);
}

fn service<T: Transport + 'static>() -> Service<T, TypedCtx> {
    Service::new().handle(|_ctx, s: Small| s)
}

// ------------------------------------------------------------- nodes

/// One node of a run: an Rpc (raw) or an endpoint (typed, async), both
/// client and server.
enum Node<T: Transport + 'static> {
    Raw(Box<Rpc<T, RawCtx>>, RawCtx, (usize, usize)),
    Typed(Endpoint<T, TypedCtx>),
    Async(Endpoint<T, TypedCtx>, Rc<Cell<u64>>, Rc<Cell<u64>>),
}

impl<T: Transport + 'static> Node<T> {
    fn register(mode: Mode, b: NexusBuilder) -> NexusBuilder {
        match mode {
            Mode::Raw => b.handler::<T, RawCtx>(REQ, raw_handler::<T, 0>),
            Mode::RawWire => b.handler::<T, RawCtx>(REQ, raw_handler::<T, 1>),
            Mode::Typed | Mode::Async => service::<T>().register(b),
        }
    }

    fn new(mode: Mode, nexus: &Arc<Nexus>, t: T, alloc: Allocator) -> Node<T> {
        let cfg = RpcConfig::default();
        match mode {
            Mode::Raw | Mode::RawWire => Node::Raw(
                Box::new(
                    Rpc::builder(nexus, t, alloc)
                        .config(cfg)
                        .build()
                        .expect("rpc"),
                ),
                RawCtx {
                    session: 0,
                    completed: 0,
                    bad: 0,
                },
                mode.raw_sizes(),
            ),
            Mode::Typed | Mode::Async => {
                let ecfg = EndpointConfig {
                    rpc: cfg,
                    // The raw run keeps WINDOW in the core (8 in slots,
                    // the rest in its backlog): so do these.
                    max_in_flight: WINDOW,
                    default_timeout: None,
                };
                let ep = Endpoint::new(
                    nexus,
                    0,
                    t,
                    alloc,
                    ecfg,
                    &service::<T>(),
                    TypedCtx::default(),
                )
                .expect("endpoint");
                if mode == Mode::Typed {
                    Node::Typed(ep)
                } else {
                    Node::Async(ep, Rc::default(), Rc::default())
                }
            }
        }
    }

    fn connect(&mut self, uri: &str) {
        match self {
            Node::Raw(rpc, c, _) => c.session = rpc.create_session(uri, 0).expect("session"),
            Node::Typed(ep) | Node::Async(ep, ..) => {
                let s = ep.with(|ctx| ctx.create_session(uri, 0)).expect("session");
                ep.app().session = s;
            }
        }
    }

    fn connected(&mut self) -> bool {
        match self {
            Node::Raw(rpc, c, _) => rpc.is_connected(c.session),
            Node::Typed(ep) | Node::Async(ep, ..) => {
                let s = ep.app().session;
                ep.with(|ctx| ctx.rpc().is_connected(s))
            }
        }
    }

    /// Starts the window of calls.
    fn start(&mut self) {
        match self {
            Node::Raw(rpc, c, (req_len, resp_len)) => {
                for i in 0..WINDOW {
                    let mut req = rpc.alloc_msg_buffer(*req_len).expect("msgbuf");
                    req.data_mut().fill(0);
                    req.data_mut()[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    let resp = rpc.alloc_msg_buffer(*resp_len).expect("msgbuf");
                    rpc.enqueue_request(c.session, REQ, req, resp, raw_cont::<T>, 0)
                        .expect("enqueue");
                }
            }
            Node::Typed(ep) => ep.with(|ctx| {
                for i in 0..WINDOW {
                    issue(ctx, i as u64);
                }
            }),
            Node::Async(ep, done, bad) => {
                let s = ep.app().session;
                for i in 0..WINDOW {
                    let api = ep.client();
                    let (done, bad) = (done.clone(), bad.clone());
                    ep.spawn(async move {
                        let mut n = i as u64;
                        loop {
                            match api.call(s, Small::new(n)).await {
                                Ok(r) if r.num() == n => {}
                                _ => bad.set(bad.get() + 1),
                            }
                            done.set(done.get() + 1);
                            n += WINDOW as u64;
                        }
                    });
                }
            }
        }
    }

    fn run_once(&mut self) {
        match self {
            Node::Raw(rpc, c, _) => rpc.run_event_loop_once(c),
            Node::Typed(ep) | Node::Async(ep, ..) => ep.run_once(),
        }
    }

    fn completed(&self) -> u64 {
        match self {
            Node::Raw(_, c, _) => c.completed,
            Node::Typed(ep) => ep.app().completed,
            Node::Async(_, d, _) => d.get(),
        }
    }

    fn bad(&self) -> u64 {
        match self {
            Node::Raw(_, c, _) => c.bad,
            Node::Typed(ep) => ep.app().bad,
            Node::Async(_, _, b) => b.get(),
        }
    }
}

fn region() -> RegionOptions {
    // 4 KiB pages where hugepages are short: said once, on stderr.
    static NOTE: std::sync::Once = std::sync::Once::new();
    let fallback = if mempool::hugepages_available(64) {
        Fallback::Never
    } else {
        NOTE.call_once(|| eprintln!("note: few free 2 MiB hugepages; using 4 KiB pages"));
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..RegionOptions::default()
    }
}

/// Two nodes in one thread, stepped by `step`; runs for `dur` after
/// `warmup` (or, with `count`, until both together completed `count`
/// RPCs, no warm-up: for callgrind). Returns RPCs per second.
fn one_thread<T: Transport + 'static>(
    mut nodes: Vec<Node<T>>,
    uris: [&str; 2],
    step: &dyn Fn(),
    dur: Duration,
    count: Option<u64>,
) -> (f64, u64) {
    for (i, n) in nodes.iter_mut().enumerate() {
        n.connect(uris[1 - i]);
    }
    let mut guard = 0u64;
    while !nodes.iter_mut().all(|n| n.connected()) {
        for n in nodes.iter_mut() {
            n.run_once();
        }
        step();
        guard += 1;
        assert!(guard < 10_000_000, "no connection");
    }
    for n in nodes.iter_mut() {
        n.start();
    }
    let total = |nodes: &[Node<T>]| nodes.iter().map(Node::completed).sum::<u64>();
    if let Some(c) = count {
        while total(&nodes) < c {
            for n in nodes.iter_mut() {
                n.run_once();
            }
            step();
        }
        return (0.0, total(&nodes));
    }
    let warm = Instant::now();
    while warm.elapsed() < dur / 4 {
        for n in nodes.iter_mut() {
            n.run_once();
        }
        step();
    }
    let base = total(&nodes);
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        for n in nodes.iter_mut() {
            n.run_once();
        }
        step();
    }
    let done = total(&nodes) - base;
    let bad: u64 = nodes.iter().map(Node::bad).sum();
    assert_eq!(bad, 0, "responses that did not match their requests");
    (done as f64 / t0.elapsed().as_secs_f64(), done)
}

// ------------------------------------------------ simulated network

fn sim_run(mode: Mode, dur: Duration, count: Option<u64>) -> (f64, u64) {
    let net = SimNet::new(SimConfig::default());
    let uris = ["n0:31850", "n1:31850"];
    let nodes: Vec<Node<SimTransport>> = uris
        .iter()
        .map(|u| {
            let nexus = Node::<SimTransport>::register(mode, Nexus::builder(u))
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .build()
                .expect("nexus");
            let alloc = erpc::host_allocator(8 << 20, region()).expect("allocator");
            Node::new(mode, &nexus, net.add_transport(), alloc)
        })
        .collect();
    one_thread(nodes, uris, &|| net.advance(100), dur, count)
}

// ------------------------------------------------------- device model

fn devmodel_run(mode: Mode, dur: Duration, count: Option<u64>) -> (f64, u64) {
    use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
    use transport::mlx5::{Mlx5Config, Mlx5Transport};

    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: true,
        ..Default::default()
    });
    let net = SimNet::new(SimConfig::default()); // SM and the clock
    let uris = ["n0:31850", "n1:31850"];
    let mut devices = Vec::new();
    let mut nics = Vec::new();
    let nodes: Vec<Node<Mlx5Transport<SimBackend>>> = uris
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let nic = SimNic::new(
                &fabric,
                NicConfig {
                    mac: [2, 0, 0, 0, 0, i as u8 + 1],
                    ..Default::default()
                },
            );
            let dev = mlx5::Device::open(
                nic.backend(),
                mlx5::DeviceConfig {
                    region: region(),
                    ..Default::default()
                },
            )
            .expect("device bring-up");
            let cfg = Mlx5Config::new(
                std::net::Ipv4Addr::new(10, 0, 0, i as u8 + 1),
                mlx5::QueueConfig {
                    udp_port: 31850 + i as u16,
                    ..Default::default()
                },
            );
            let t = Mlx5Transport::new(&dev, cfg).expect("transport");
            let alloc = Allocator::new(
                dev.dma_mapper(),
                AllocatorConfig {
                    initial_bytes: 8 << 20,
                    region: region(),
                    ..Default::default()
                },
            )
            .expect("allocator");
            let nexus = Node::<Mlx5Transport<SimBackend>>::register(mode, Nexus::builder(u))
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .build()
                .expect("nexus");
            let node = Node::new(mode, &nexus, t, alloc);
            devices.push(dev);
            nics.push(nic);
            node
        })
        .collect();
    let step = Duration::from_nanos(500);
    let r = one_thread(
        nodes,
        uris,
        &|| {
            net.advance(step.as_nanos() as u64);
            fabric.advance(step);
        },
        dur,
        count,
    );
    drop(devices);
    drop(nics);
    r
}

// -------------------------------------------------------------- UDP

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Two nodes over loopback UDP (SM too), stepped by one thread: on two
/// shared vCPUs two spinning threads measure the scheduler (runs collapse
/// when one is descheduled; BENCHMARKS.md, small_rpc), one thread measures
/// the per-RPC work, kernel included.
fn udp_run(mode: Mode, dur: Duration, count: Option<u64>) -> (f64, u64) {
    use transport::udp::{UdpConfig, UdpTransport};
    let uris: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let nodes: Vec<Node<UdpTransport>> = uris
        .iter()
        .map(|u| {
            let nexus = Node::<UdpTransport>::register(mode, Nexus::builder(u))
                .workers(0)
                .build()
                .expect("nexus");
            let t = UdpTransport::new(&UdpConfig::loopback()).expect("udp");
            let alloc = erpc::host_allocator(8 << 20, region()).expect("allocator");
            Node::new(mode, &nexus, t, alloc)
        })
        .collect();
    one_thread(nodes, [&uris[0], &uris[1]], &|| {}, dur, count)
}

// -------------------------------------------------------------- main

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn section(name: &str, reps: usize, run: &dyn Fn(Mode) -> (f64, u64)) {
    println!("## {name}");
    let modes = [Mode::Raw, Mode::RawWire, Mode::Typed, Mode::Async];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for rep in 0..reps {
        for (k, &m) in modes.iter().enumerate() {
            let (r, n) = run(m);
            println!(
                "  rep {rep} {:<6} {:>8.3} Mrps ({n} RPCs)",
                m.name(),
                r / 1e6
            );
            rates[k].push(r);
        }
    }
    let raw = median(rates[0].clone());
    let raw34 = median(rates[1].clone());
    println!(
        "{:<8} {:>12} {:>8} {:>8}   runs (Mrps)",
        "API", "median Mrps", "/ raw", "/ raw34"
    );
    for (k, m) in modes.iter().enumerate() {
        let med = median(rates[k].clone());
        let runs: Vec<String> = rates[k].iter().map(|r| format!("{:.3}", r / 1e6)).collect();
        println!(
            "{:<8} {:>12.3} {:>8.3} {:>8.3}   {}",
            m.name(),
            med / 1e6,
            med / raw,
            med / raw34,
            runs.join(" ")
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("callgrind") {
        // `callgrind MODE N [devmodel]`: the simulated network (or the
        // device model) until both nodes completed N RPCs (deterministic:
        // virtual time).
        let mode = match args.get(1).map(String::as_str) {
            Some("raw") => Mode::Raw,
            Some("raw34") => Mode::RawWire,
            Some("typed") => Mode::Typed,
            Some("async") => Mode::Async,
            other => {
                eprintln!(
                    "usage: typed_rpc callgrind raw|raw34|typed|async N [sim|devmodel|udp] (got {other:?})"
                );
                std::process::exit(2);
            }
        };
        let n = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
        let (_, done) = match args.get(3).map(String::as_str) {
            Some("devmodel") => devmodel_run(mode, Duration::ZERO, Some(n)),
            Some("udp") => udp_run(mode, Duration::ZERO, Some(n)),
            _ => sim_run(mode, Duration::ZERO, Some(n)),
        };
        println!("callgrind run: {} {done} RPCs", mode.name());
        return;
    }
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let dur = Duration::from_millis(env("ERPC_BENCH_MS", 1000));
    let reps = env("ERPC_BENCH_REPS", 3) as usize;
    let want = |s: &str| args.is_empty() && s != "sim" || args.iter().any(|a| a == s);
    println!(
        "typed_rpc: {MSG}-byte RPCs, {WINDOW} in flight per node, both nodes client and server; \
         {reps} interleaved runs of {} ms per API",
        dur.as_millis()
    );
    if want("devmodel") {
        section(
            "device model (2 software ConnectX NICs, mlx5 transport, 1 thread)",
            reps,
            &|m| devmodel_run(m, dur, None),
        );
    }
    if want("udp") {
        section("kernel UDP (loopback, SM over UDP, 1 thread)", reps, &|m| {
            udp_run(m, dur, None)
        });
    }
    if want("sim") {
        section("eRPC simulated network (1 thread)", reps, &|m| {
            sim_run(m, dur, None)
        });
    }
}
