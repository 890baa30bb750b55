//! The paper's session-scalability experiment on the simulated network
//! (issue 28): one server node of several Rpcs serves thousands of
//! sessions opened by many client nodes, all sending small RPCs with
//! congestion control on, in virtual time. Every RPC must complete exactly
//! once (each response carries its request's tag, checked, and the
//! servers ran exactly as many handlers as there were requests).
//!
//! The default is the paper's figure: 100 client nodes of 200 sessions
//! each, 20 000 sessions on a server node of 8 Rpcs (2 500 per Rpc, each
//! RX ring sized for them with `erpc::rx_ring_entries_for`). Virtual time
//! does not count CPU time: latencies are the network's (links, the
//! switch, pacing) and eRPC's protocol (credits, windows), not the cost of
//! running 108 event loops on one thread. What the machine pays per RPC is
//! counted separately (instructions, under callgrind; see BENCHMARKS.md).

use std::cell::Cell;
use std::rc::Rc;

use erpc::CcConfig;
use erpc::{Completion, Nexus, Request, Rpc, RpcConfig, SessionNum};
use erpc_sim::{PortConfig, SimConfig, SimNet, SimTransport};
use hdrhistogram::Histogram;
use mempool::{Fallback, PageSize, RegionOptions};
use serde::Serialize;

use crate::bench::BenchError;
use crate::cli::{JsonOut, Quit, Shape, SimNetwork, usage};

/// The request type (echoed).
const ECHO: u8 = 1;

/// What to run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ScaleConfig {
    /// Rpcs of the server node.
    pub server_rpcs: usize,
    /// Client nodes (one Rpc each).
    pub client_nodes: usize,
    /// Sessions each client node opens (spread over the server's Rpcs).
    pub sessions_per_client: usize,
    /// RPCs each session carries.
    pub rpcs_per_session: usize,
    /// RPCs each client node keeps in flight (over its sessions in turn).
    pub window: usize,
    /// Bytes of each request and response.
    pub size: usize,
    /// Rate of every link, Gbit/s.
    pub link_gbps: f64,
    /// Switch buffer per output port, bytes.
    pub buffer_bytes: u64,
    /// One-way propagation delay of every link, ns.
    pub delay_ns: u64,
    /// Seed of the simulated network.
    pub seed: u64,
}

impl Default for ScaleConfig {
    fn default() -> ScaleConfig {
        ScaleConfig {
            server_rpcs: 8,
            client_nodes: 100,
            sessions_per_client: 200,
            rpcs_per_session: 4,
            window: 64,
            size: 32,
            link_gbps: 25.0,
            buffer_bytes: 1 << 20,
            delay_ns: 1_000,
            seed: 1,
        }
    }
}

impl ScaleConfig {
    /// Sessions in all.
    pub fn sessions(&self) -> usize {
        self.client_nodes * self.sessions_per_client
    }

    /// Sessions each server Rpc holds (at most).
    pub fn sessions_per_server_rpc(&self) -> usize {
        self.sessions().div_ceil(self.server_rpcs)
    }
}

/// One server Rpc's share.
#[derive(Debug, Clone, Serialize)]
pub struct ServerRow {
    /// Rpc id.
    pub rpc_id: u8,
    /// Sessions it held.
    pub sessions: usize,
    /// RPCs it served.
    pub served: u64,
    /// The most RX ring slots it held at once, and the ring's size.
    pub ring_high_water: u64,
    /// RX ring entries.
    pub ring_entries: usize,
    /// Packets it dropped (any reason).
    pub drops: u64,
}

/// The client nodes, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct ClientSummary {
    /// RPCs completed per node: fewest and most.
    pub completed_min: u64,
    pub completed_max: u64,
    /// Median latency per node, µs: lowest and highest.
    pub p50_us_min: f64,
    pub p50_us_max: f64,
    /// p99 latency per node, µs: lowest and highest.
    pub p99_us_min: f64,
    pub p99_us_max: f64,
    /// The most RX ring slots any client held at once, and its ring size.
    pub ring_high_water: u64,
    pub ring_entries: usize,
    /// Go-back-N rollbacks, all clients.
    pub retransmissions: u64,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleResult {
    /// The configuration run.
    pub config: ScaleConfig,
    /// Per server Rpc.
    pub servers: Vec<ServerRow>,
    /// The clients.
    pub clients: ClientSummary,
    /// RPCs completed (all clients) and handlers run (all servers).
    pub completed: u64,
    pub handled: u64,
    /// Latency over all RPCs, µs of virtual time.
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Virtual time the RPCs took, µs, and the RPC rate it makes.
    pub virtual_us: f64,
    pub mrps_virtual: f64,
    /// Heap bytes per session end (client and server sessions together,
    /// measured over the connect phase by the caller's counting
    /// allocator; `None` without one).
    pub heap_per_session_end: Option<f64>,
    /// Wall-clock seconds the whole run took (setup included).
    pub wall_s: f64,
}

/// The application state of every Rpc.
#[derive(Default)]
struct App {
    /// Client: its sessions, and which one gets the next request.
    sessions: Vec<SessionNum>,
    next: usize,
    /// Client: requests still to send, in flight, completed, wrong.
    todo: usize,
    in_flight: usize,
    completed: u64,
    bad: u64,
    /// Client: enqueue time per tag, free tags, request size.
    sent_ns: Vec<u64>,
    free_tags: Vec<usize>,
    size: usize,
    lat: Option<Histogram<u64>>,
    clock: Option<erpc::Clock>,
    /// Server: handlers run.
    handled: u64,
    /// Errors, the first few.
    errors: Vec<String>,
    /// Shared count of RPCs completed by every client.
    total: Option<Rc<Cell<u64>>>,
}

fn echo(rpc: &mut Rpc<SimTransport, App>, app: &mut App, req: Request<'_>) {
    app.handled += 1;
    let Request { handle, data, .. } = req;
    match rpc.response_buffer(&handle, data.len()) {
        Ok(mut m) => {
            m.data_mut().copy_from_slice(data);
            if let Err(e) = rpc.enqueue_response(handle, m) {
                app.errors.push(format!("respond: {e}"));
            }
        }
        Err(e) => app.errors.push(format!("response buffer: {e}")),
    }
}

fn cont(rpc: &mut Rpc<SimTransport, App>, app: &mut App, c: Completion) {
    app.in_flight -= 1;
    let tag = c.tag;
    match c.result {
        Ok(()) => {
            // The response echoes the request: its first 8 bytes are the
            // request's tag, so a response can never be another's.
            let ok = c.resp.len() == app.size
                && c.resp.data()[..8] == (tag as u64).to_le_bytes()
                && c.req.data()[..8] == (tag as u64).to_le_bytes();
            if !ok {
                app.bad += 1;
            }
            app.completed += 1;
            if let Some(t) = &app.total {
                t.set(t.get() + 1);
            }
            if let (Some(h), Some(clock)) = (app.lat.as_mut(), app.clock.as_ref()) {
                let d = clock.now_ns().saturating_sub(app.sent_ns[tag]);
                let _ = h.record(d.max(1));
            }
        }
        Err(e) => {
            if app.errors.len() < 8 {
                app.errors.push(format!("request failed: {e}"));
            }
        }
    }
    app.free_tags.push(tag);
    issue(rpc, app, c.req, c.resp);
}

/// Sends the next request on the next session, reusing `req`/`resp`.
fn issue(
    rpc: &mut Rpc<SimTransport, App>,
    app: &mut App,
    mut req: erpc::MsgBuf,
    resp: erpc::MsgBuf,
) {
    if app.todo == 0 {
        rpc.free_msg_buffer(req);
        rpc.free_msg_buffer(resp);
        return;
    }
    app.todo -= 1;
    let tag = app.free_tags.pop().expect("a tag per request in flight");
    let sn = app.sessions[app.next % app.sessions.len()];
    app.next += 1;
    req.data_mut()[..8].copy_from_slice(&(tag as u64).to_le_bytes());
    if let Some(clock) = app.clock.as_ref() {
        app.sent_ns[tag] = clock.now_ns();
    }
    app.in_flight += 1;
    if let Err(e) = rpc.enqueue_request(sn, ECHO, req, resp, cont, tag) {
        app.in_flight -= 1;
        app.errors.push(format!("enqueue: {e}"));
        rpc.free_msg_buffer(e.req);
        rpc.free_msg_buffer(e.resp);
    }
}

struct Node {
    rpc: Rpc<SimTransport, App>,
    app: App,
    ep: usize,
}

fn poll_all(nodes: &mut [Node]) {
    for n in nodes.iter_mut() {
        n.rpc.run_event_loop_once(&mut n.app);
    }
}

fn step(net: &SimNet) {
    let now = net.now_ns();
    let d = match net.next_event_ns() {
        Some(t) if t > now => (t - now).clamp(500, 20_000),
        _ => 500,
    };
    net.advance(d);
}

fn region() -> RegionOptions {
    // Virtual time: the page size of message buffers changes nothing
    // measured, and the shared hugepages are left to others.
    RegionOptions {
        page_size: PageSize::Small4K,
        fallback: Fallback::SmallPages,
    }
}

fn lat_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// Runs the experiment. `heap_now`, if given, reads the process's net
/// heap bytes (a counting allocator of the caller's), to report heap per
/// session end over the connect phase.
pub fn run_scale(
    c: &ScaleConfig,
    heap_now: Option<&dyn Fn() -> i64>,
) -> Result<ScaleResult, BenchError> {
    let wall = std::time::Instant::now();
    if c.server_rpcs == 0 || c.server_rpcs > usize::from(erpc::MAX_RPC_ID) + 1 {
        return Err(BenchError::Usage(format!(
            "--server-rpcs {}: must be 1 to 255",
            c.server_rpcs
        )));
    }
    if c.size < 8 || c.size > transport::MAX_DATA_PER_PKT {
        return Err(BenchError::Usage(format!(
            "--size {}: the scale experiment sends single-packet RPCs of 8 to {} bytes",
            c.size,
            transport::MAX_DATA_PER_PKT
        )));
    }
    let setup =
        |what: String| move |e: &dyn std::fmt::Display| BenchError::Run(format!("{what}: {e}"));
    let net = SimNet::new(SimConfig {
        seed: c.seed,
        port: PortConfig::new((c.link_gbps * 1e9) as u64, c.buffer_bytes),
        link: erpc_sim::delayed_link(c.delay_ns, 0),
        ..SimConfig::default()
    });
    let cfg = RpcConfig {
        cc: CcConfig {
            link_gbps: c.link_gbps,
            ..CcConfig::default()
        },
        ..RpcConfig::default()
    };
    let credits = cfg.session_credits;
    let server_ring = erpc::rx_ring_entries_for(c.sessions_per_server_rpc(), credits).max(4096);
    let client_ring = erpc::rx_ring_entries_for(c.sessions_per_client, credits).max(4096);
    // The server node: one Nexus, `server_rpcs` Rpcs.
    let server_nexus = Nexus::builder("server:31850")
        .sm_link(net.sm_link())
        .clock(net.erpc_clock())
        .seed(c.seed)
        .handler::<SimTransport, App>(ECHO, echo)
        .build()
        .map_err(|e| setup("the server's Nexus".into())(&e))?;
    let mut nodes: Vec<Node> = Vec::with_capacity(c.server_rpcs + c.client_nodes);
    for id in 0..c.server_rpcs {
        let t = net.add_transport_with_ring(server_ring);
        let ep = nodes.len();
        let alloc = erpc_sim::sim_allocator(8 << 20, region())
            .map_err(|e| setup(format!("buffers of server Rpc {id}"))(&e))?;
        let rpc = Rpc::builder(&server_nexus, t, alloc)
            .id(id as u8)
            .config(cfg)
            .build()
            .map_err(|e| setup(format!("server Rpc {id}"))(&e))?;
        nodes.push(Node {
            rpc,
            app: App::default(),
            ep,
        });
    }
    let total = Rc::new(Cell::new(0u64));
    for i in 0..c.client_nodes {
        let uri = format!("client-{i}:31850");
        let nexus = Nexus::builder(&uri)
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .seed(c.seed.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64 + 1))
            .build()
            .map_err(|e| setup(format!("Nexus {uri}"))(&e))?;
        let t = net.add_transport_with_ring(client_ring);
        let ep = nodes.len();
        let alloc = erpc_sim::sim_allocator(8 << 20, region())
            .map_err(|e| setup(format!("buffers of client {i}"))(&e))?;
        let rpc = Rpc::builder(&nexus, t, alloc)
            .config(cfg)
            .build()
            .map_err(|e| setup(format!("Rpc of client {i}"))(&e))?;
        let app = App {
            size: c.size,
            lat: Some(lat_hist()),
            clock: Some(net.erpc_clock()),
            total: Some(total.clone()),
            sent_ns: vec![0; c.window],
            free_tags: (0..c.window).collect(),
            ..App::default()
        };
        nodes.push(Node { rpc, app, ep });
    }
    let clients = c.server_rpcs..nodes.len();
    // Heap from here on: the sessions' (rings and buffers are made above).
    let heap0 = heap_now.map(|f| f());
    for (i, n) in nodes[clients.clone()].iter_mut().enumerate() {
        for k in 0..c.sessions_per_client {
            let sn = n
                .rpc
                .create_session("server:31850", (k % c.server_rpcs) as u8)
                .map_err(|e| setup(format!("session {k} of client {i}"))(&e))?;
            n.app.sessions.push(sn);
        }
    }
    let mut steps = 0u64;
    while !nodes[clients.clone()]
        .iter()
        .all(|n| n.app.sessions.iter().all(|&sn| n.rpc.is_connected(sn)))
    {
        poll_all(&mut nodes);
        step(&net);
        steps += 1;
        if steps > 100_000_000 {
            return Err(BenchError::Run("sessions did not connect".into()));
        }
    }
    let heap_per_session_end = match (heap0, heap_now) {
        (Some(h0), Some(f)) => Some((f() - h0) as f64 / (2 * c.sessions()) as f64),
        _ => None,
    };
    // Traffic: every client keeps `window` requests in flight.
    let t0 = net.now_ns();
    for n in nodes[clients.clone()].iter_mut() {
        n.app.todo = c.sessions_per_client * c.rpcs_per_session;
        for _ in 0..c.window.min(n.app.todo) {
            let req = n
                .rpc
                .alloc_msg_buffer(c.size)
                .map_err(|e| setup("a request buffer".into())(&e))?;
            let resp = n
                .rpc
                .alloc_msg_buffer(c.size)
                .map_err(|e| setup("a response buffer".into())(&e))?;
            issue(&mut n.rpc, &mut n.app, req, resp);
        }
    }
    let want = (c.sessions() * c.rpcs_per_session) as u64;
    let mut last_progress = (total.get(), net.now_ns());
    while total.get() < want {
        poll_all(&mut nodes);
        step(&net);
        if let Some(e) = nodes.iter().find_map(|n| n.app.errors.first()) {
            return Err(BenchError::Run(e.clone()));
        }
        if total.get() != last_progress.0 {
            last_progress = (total.get(), net.now_ns());
        } else if net.now_ns() - last_progress.1 > 10_000_000_000 {
            return Err(BenchError::Run(format!(
                "no RPC completed for 10 s of virtual time: {} of {want} done",
                total.get()
            )));
        }
    }
    let virtual_ns = net.now_ns() - t0;
    // Let the last responses' slots settle, then count.
    for _ in 0..1000 {
        poll_all(&mut nodes);
        step(&net);
    }
    let mut all = lat_hist();
    let mut per_node = Vec::new();
    let (mut bad, mut retransmissions) = (0u64, 0u64);
    let mut client_hw = 0u64;
    for n in &nodes[clients.clone()] {
        let h = n.app.lat.as_ref().expect("clients record latency");
        all.add(h)
            .map_err(|e| BenchError::Run(format!("latency histogram: {e}")))?;
        per_node.push((n.app.completed, us(h, 0.5), us(h, 0.99)));
        bad += n.app.bad;
        retransmissions += n.rpc.stats().retransmissions;
        client_hw = client_hw.max(net.rx_high_water(n.ep).0);
    }
    if bad != 0 {
        return Err(BenchError::Run(format!(
            "{bad} responses were not their request's"
        )));
    }
    let servers: Vec<ServerRow> = nodes[..c.server_rpcs]
        .iter()
        .map(|n| {
            let (hw, entries) = net.rx_high_water(n.ep);
            ServerRow {
                rpc_id: n.rpc.rpc_id(),
                sessions: n.rpc.num_sessions(),
                served: n.app.handled,
                ring_high_water: hw,
                ring_entries: entries,
                drops: n.rpc.stats().total_drops(),
            }
        })
        .collect();
    let handled: u64 = servers.iter().map(|s| s.served).sum();
    let completed = total.get();
    if handled != completed {
        return Err(BenchError::Run(format!(
            "{completed} RPCs completed but {handled} handlers ran: not exactly once"
        )));
    }
    let fold = |f: fn(&(u64, f64, f64)) -> f64| {
        per_node
            .iter()
            .map(f)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            })
    };
    let (p50_min, p50_max) = fold(|x| x.1);
    let (p99_min, p99_max) = fold(|x| x.2);
    Ok(ScaleResult {
        config: *c,
        clients: ClientSummary {
            completed_min: per_node.iter().map(|x| x.0).min().unwrap_or(0),
            completed_max: per_node.iter().map(|x| x.0).max().unwrap_or(0),
            p50_us_min: p50_min,
            p50_us_max: p50_max,
            p99_us_min: p99_min,
            p99_us_max: p99_max,
            ring_high_water: client_hw,
            ring_entries: client_ring,
            retransmissions,
        },
        servers,
        completed,
        handled,
        p50_us: us(&all, 0.5),
        p99_us: us(&all, 0.99),
        p999_us: us(&all, 0.999),
        virtual_us: virtual_ns as f64 / 1e3,
        mrps_virtual: completed as f64 / (virtual_ns as f64 / 1e9) / 1e6,
        heap_per_session_end,
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

/// `erpc-bench scale`: session scalability (the paper's 20 000 sessions):
/// client nodes of many sessions each against one server node of several
/// Rpcs, small RPCs with congestion control on, on the simulated network
/// (virtual time); every RPC checked exactly once.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Client nodes (one Rpc each).
    #[arg(long, default_value_t = 100)]
    pub client_nodes: usize,
    /// Sessions each client node opens (spread over the server's Rpcs).
    #[arg(long, default_value_t = 200)]
    pub sessions_per_client: usize,
    /// Rpcs of the server node.
    #[arg(long, default_value_t = 8)]
    pub server_rpcs: usize,
    /// RPCs each session carries.
    #[arg(long, default_value_t = 4)]
    pub rpcs_per_session: usize,
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub net: SimNetwork,
    #[command(flatten)]
    pub out: JsonOut,
}

impl ScaleArgs {
    /// Checks the flags and runs the experiment, printing its report;
    /// `heap_now`, if given, reads the process's net heap bytes (for the
    /// heap per session).
    pub fn run(&self, heap_now: Option<&dyn Fn() -> i64>) -> Result<(), Quit> {
        if !(1..=10_000).contains(&self.client_nodes) {
            return usage(format!(
                "--client-nodes {}: must be 1 to 10000",
                self.client_nodes
            ));
        }
        if !(1..=65_000).contains(&self.sessions_per_client) {
            return usage(format!(
                "--sessions-per-client {}: must be 1 to 65000 (16-bit session numbers)",
                self.sessions_per_client
            ));
        }
        if !(1..=1_000_000).contains(&self.rpcs_per_session) {
            return usage(format!(
                "--rpcs-per-session {}: must be 1 to 1000000",
                self.rpcs_per_session
            ));
        }
        if !(1..=1024).contains(&self.shape.window) {
            return usage(format!("--window {}: must be 1 to 1024", self.shape.window));
        }
        self.net.check_link_gbps()?;
        let c = ScaleConfig {
            server_rpcs: self.server_rpcs,
            client_nodes: self.client_nodes,
            sessions_per_client: self.sessions_per_client,
            rpcs_per_session: self.rpcs_per_session,
            window: self.shape.window,
            size: self.shape.size,
            link_gbps: self.net.link_gbps,
            buffer_bytes: self.net.buffer_kib * 1024,
            delay_ns: self.net.link_delay_ns,
            ..ScaleConfig::default()
        };
        let r = run_scale(&c, heap_now)?;
        print!("{}", report(&r));
        self.out.write(&r)
    }
}

/// The report, as `erpc-bench scale` prints it.
pub fn report(r: &ScaleResult) -> String {
    use std::fmt::Write;
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "erpc-bench: session scalability on the simulated network (virtual time), congestion control on"
    );
    let _ = writeln!(
        s,
        "{} sessions: {} client nodes x {} sessions -> 1 server node of {} Rpcs; {} RPCs of {} B per session, {} in flight per client; {} Gbit/s links, {} us delay",
        c.sessions(),
        c.client_nodes,
        c.sessions_per_client,
        c.server_rpcs,
        c.rpcs_per_session,
        c.size,
        c.window,
        c.link_gbps,
        c.delay_ns as f64 / 1e3
    );
    let _ = writeln!(
        s,
        "server Rpc  sessions    served  ring high-water / entries  drops"
    );
    for sv in &r.servers {
        let _ = writeln!(
            s,
            "{:>10}  {:>8}  {:>8}  {:>15} / {:<8}  {:>5}",
            sv.rpc_id, sv.sessions, sv.served, sv.ring_high_water, sv.ring_entries, sv.drops
        );
    }
    let cl = &r.clients;
    let _ = writeln!(
        s,
        "client nodes: {}..{} RPCs each; p50 {:.1}..{:.1} us, p99 {:.1}..{:.1} us per node; ring high-water {} of {}; {} retransmissions",
        cl.completed_min,
        cl.completed_max,
        cl.p50_us_min,
        cl.p50_us_max,
        cl.p99_us_min,
        cl.p99_us_max,
        cl.ring_high_water,
        cl.ring_entries,
        cl.retransmissions
    );
    let _ = writeln!(
        s,
        "total: {} RPCs completed, {} handlers run (exactly once), p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us of virtual time; {:.2} M RPCs/s virtual",
        r.completed, r.handled, r.p50_us, r.p99_us, r.p999_us, r.mrps_virtual
    );
    if let Some(h) = r.heap_per_session_end {
        let _ = writeln!(
            s,
            "heap per session end (client or server, measured over the connect phase): {h:.0} bytes"
        );
    }
    let _ = writeln!(s, "wall clock: {:.1} s (setup included)", r.wall_s);
    s
}
