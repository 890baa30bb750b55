//! `erpc-bench incast`: N-to-1 incast on eRPC's simulated
//! network (virtual time), with congestion control on and off.
//!
//! N senders each stream large requests (1 MB by default, two in flight)
//! to one receiver, whose link is the bottleneck; an extra, uncongested
//! sender issues small RPCs (32 bytes, one at a time) to the same
//! receiver through the whole run. Every endpoint has a link of the same
//! rate into one switch whose output buffer towards each port is
//! drop-tail. The experiment reports
//!
//! * total goodput: request payload bytes of all senders over the virtual
//!   time from the first request to the last completion, as a fraction of
//!   the receiver's link rate (the best possible is below 1: every 1024-byte
//!   frame carries a 58-byte header and 24 bytes of Ethernet overhead on
//!   the wire, see [`max_goodput_fraction`]);
//! * the small RPCs' RTT p50/p99 against the RTT of the same RPCs with no
//!   incast, measured in the same run (`erpc-bench incast` runs that
//!   reference first);
//! * the switch queue towards the receiver: its high-water mark, its mean
//!   as seen by arriving frames, and drops;
//! * go-back-N rollbacks and the senders' Timely rates at the end.
//!
//! Everything runs in one thread on a virtual clock, so a run is exactly
//! reproducible from its seed and independent of the machine's load.
//! `ERPC_INCAST_DEBUG=1` prints, per run, the queue's arrivals, drops and
//! high-water mark per millisecond and every sender's final Timely rate,
//! rollbacks and wheel counters (on stderr).

use std::cell::Cell;
use std::rc::Rc;

use erpc::CcConfig;
use erpc::{Completion, Nexus, Request, Rpc, RpcConfig, SessionNum};
use erpc_sim::{PortConfig, SimConfig, SimNet, SimTransport};
use hdrhistogram::Histogram;
use mempool::{Fallback, PageSize, RegionOptions};
use serde::Serialize;

use crate::bench::BenchError;

mod experiment;

pub use experiment::{
    IncastArgs, IncastExperiment, IncastReport, SwiftSettings, header_line, incast_experiment,
    row_line,
};

/// Request type of the large requests (answered with 16 bytes).
const BULK: u8 = 1;
/// Request type of the small RPCs (echoed).
const SMALL: u8 = 2;
/// Bytes of a bulk response.
const BULK_RESP: usize = 16;

/// What to run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IncastConfig {
    /// Bulk senders (0: only the small RPCs, the uncongested reference).
    pub senders: usize,
    /// Bytes of each bulk request.
    pub req_bytes: usize,
    /// Bulk requests each sender sends in total.
    pub requests_per_sender: usize,
    /// Bulk requests each sender keeps in flight.
    pub window: usize,
    /// Bytes of each small request and response.
    pub small_bytes: usize,
    /// Small RPCs of the reference run (`senders == 0`).
    pub reference_rpcs: u64,
    /// A small RPC is sent every `small_interval_ns` (or when the previous
    /// one completes, if later): the RTTs sample the run evenly in time,
    /// not more often when the queue is short.
    pub small_interval_ns: u64,
    /// The steady-state window starts this long after the first request,
    /// ns, and ends when the first sender has sent all its requests.
    pub warmup_ns: u64,
    /// Rate of every link, Gbit/s.
    pub link_gbps: f64,
    /// Switch buffer per output port, bytes.
    pub buffer_bytes: u64,
    /// One-way propagation delay of every link (device → switch), ns.
    pub delay_ns: u64,
    /// Virtual time between two polls of every Rpc, ns.
    pub step_ns: u64,
    /// Seed of the simulated network.
    pub seed: u64,
    /// Congestion control of every Rpc (`link_gbps` is set to the links').
    #[serde(skip)]
    pub cc: CcConfig,
    /// Whether `cc` is enabled (for the report).
    pub cc_enabled: bool,
}

impl IncastConfig {
    /// The defaults of `erpc-bench incast` for `senders`
    /// senders: 1 MB requests, two in flight per sender, about 400 MB in
    /// total (at least 4 per sender), 25 Gbit/s links, 1 µs propagation
    /// delay, a small RPC every 10 µs, 20 ms of warm-up (Timely's
    /// start-up oscillation after the first synchronised burst lasts
    /// about that long).
    pub fn new(senders: usize, cc: CcConfig, buffer_bytes: u64) -> IncastConfig {
        IncastConfig {
            senders,
            req_bytes: 1 << 20,
            requests_per_sender: 400usize.div_ceil(senders.max(1)).max(4),
            window: 2,
            small_bytes: 32,
            reference_rpcs: 5_000,
            small_interval_ns: 10_000,
            warmup_ns: 20_000_000,
            link_gbps: 25.0,
            buffer_bytes,
            delay_ns: 1_000,
            step_ns: 100,
            seed: 1,
            cc_enabled: cc.enabled,
            cc,
        }
    }
}

/// Payload bytes per wire byte of a full data frame: the goodput a
/// perfectly used link gives (about 0.92 with 1024-byte frames).
pub fn max_goodput_fraction() -> f64 {
    let data = transport::MTU - transport::PKTHDR_BYTES;
    data as f64 / netsim::wire_bytes(transport::MTU) as f64
}

/// What one incast run measured.
#[derive(Debug, Clone, Serialize)]
pub struct IncastResult {
    /// Bulk senders.
    pub senders: usize,
    /// Congestion control on.
    pub cc: bool,
    /// Bulk request bytes completed.
    pub bulk_bytes: u64,
    /// Virtual time from the first bulk request to the last completion, ns.
    pub elapsed_ns: u64,
    /// Bulk payload bits per second.
    pub goodput_gbps: f64,
    /// `goodput_gbps` over the receiver's link rate.
    pub goodput_fraction: f64,
    /// Bulk goodput in the steady-state window (after the warm-up, while
    /// every sender still had requests to send), Gbit/s: the receiver's
    /// accepted request packets (duplicates are not accepted) times the
    /// payload per packet. `None` if the first sender finished before the
    /// warm-up ended.
    pub steady_gbps: Option<f64>,
    /// `steady_gbps` over the link rate.
    pub steady_fraction: Option<f64>,
    /// Length of the steady-state window (the whole run without one), ns.
    pub window_ns: u64,
    /// Small RPCs completed in the window.
    pub small_rpcs: u64,
    /// Their RTT, µs: median.
    pub small_p50_us: f64,
    /// 99th percentile.
    pub small_p99_us: f64,
    /// Largest.
    pub small_max_us: f64,
    /// 99th percentile over the whole run (start-up included).
    pub small_all_p99_us: f64,
    /// The switch's output buffer towards the receiver, bytes.
    pub buffer_bytes: u64,
    /// Most bytes queued towards the receiver at once (whole run).
    pub queue_max_bytes: u64,
    /// Most bytes queued in the window.
    pub queue_max_steady_bytes: u64,
    /// Mean bytes queued in the window, as seen by the arriving frames.
    pub queue_mean_bytes: f64,
    /// Frames the switch dropped towards the receiver (whole run).
    pub drops: u64,
    /// Drops in the window.
    pub drops_steady: u64,
    /// Go-back-N rollbacks of the bulk senders.
    pub retransmissions: u64,
    /// Timely rate computations of the bulk senders.
    pub timely_updates: u64,
    /// Packets the bulk senders paced through the timing wheel.
    pub wheel_inserted: u64,
    /// Of those, placed at the horizon because their departure was later.
    pub wheel_clamped: u64,
    /// Wheel entries dropped when due (their request was rolled back).
    pub wheel_stale: u64,
    /// The bulk senders' Timely rates at the end, Gbit/s: smallest.
    pub rate_min_gbps: f64,
    /// Largest.
    pub rate_max_gbps: f64,
}

/// Per-Rpc application state.
#[derive(Default)]
struct App {
    session: Option<SessionNum>,
    /// Bulk requests still to issue.
    todo: usize,
    completed: u64,
    failed: u64,
    bad: u64,
    /// Small RPCs: the time the one in flight was sent, and the RTTs.
    sent_at: u64,
    small_done: u64,
    small_in_flight: bool,
    small_stop: bool,
    small_interval_ns: u64,
    /// The next small request, waiting for its send time.
    small_next: Option<(erpc::MsgBuf, erpc::MsgBuf)>,
    /// (completion time, RTT) of every small RPC, ns.
    rtts: Vec<(u64, u64)>,
    /// Shared completion clock of the bulk senders (last completion).
    last_done: Option<Rc<Cell<u64>>>,
}

fn h_bulk(rpc: &mut Rpc<SimTransport, App>, app: &mut App, req: Request<'_>) {
    let Request { handle, data, .. } = req;
    // The first and last bytes carry the sender's marker; the rest is not
    // looked at (a 1 MB check per request would only slow the simulation).
    if data.first() != data.last() {
        app.bad += 1;
    }
    let m = rpc
        .response_buffer(&handle, BULK_RESP)
        .expect("a response buffer");
    if rpc.enqueue_response(handle, m).is_err() {
        app.bad += 1;
    }
}

fn h_small(rpc: &mut Rpc<SimTransport, App>, app: &mut App, req: Request<'_>) {
    let Request { handle, data, .. } = req;
    let mut m = rpc
        .response_buffer(&handle, data.len())
        .expect("a response buffer");
    m.data_mut().copy_from_slice(data);
    if rpc.enqueue_response(handle, m).is_err() {
        app.bad += 1;
    }
}

fn bulk_cont(rpc: &mut Rpc<SimTransport, App>, app: &mut App, c: Completion) {
    match c.result {
        Ok(()) => {
            app.completed += 1;
            if let Some(d) = &app.last_done {
                d.set(d.get().max(rpc.now_ns()));
            }
        }
        Err(_) => app.failed += 1,
    }
    if app.todo > 0 {
        app.todo -= 1;
        let (req, resp) = (c.req, c.resp);
        send_bulk(rpc, app, req, resp);
    } else {
        rpc.free_msg_buffer(c.req);
        rpc.free_msg_buffer(c.resp);
    }
}

fn send_bulk(
    rpc: &mut Rpc<SimTransport, App>,
    app: &mut App,
    req: erpc::MsgBuf,
    resp: erpc::MsgBuf,
) {
    let sn = app.session.expect("connected");
    if let Err(e) = rpc.enqueue_request(sn, BULK, req, resp, bulk_cont, 0) {
        app.failed += 1;
        rpc.free_msg_buffer(e.req);
        rpc.free_msg_buffer(e.resp);
    }
}

fn small_cont(rpc: &mut Rpc<SimTransport, App>, app: &mut App, c: Completion) {
    app.small_in_flight = false;
    match c.result {
        Ok(()) => {
            let rtt = rpc.now_ns() - app.sent_at;
            if c.resp.data().first() != Some(&0x5a) {
                app.bad += 1;
            }
            app.rtts.push((rpc.now_ns(), rtt));
            app.small_done += 1;
        }
        Err(_) => app.failed += 1,
    }
    if app.small_stop {
        rpc.free_msg_buffer(c.req);
        rpc.free_msg_buffer(c.resp);
    } else {
        app.small_next = Some((c.req, c.resp));
        small_tick(rpc, app);
    }
}

/// Sends the next small request if its time has come.
fn small_tick(rpc: &mut Rpc<SimTransport, App>, app: &mut App) {
    if rpc.now_ns() >= app.sent_at + app.small_interval_ns
        && let Some((req, resp)) = app.small_next.take()
    {
        send_small(rpc, app, req, resp);
    }
}

fn send_small(
    rpc: &mut Rpc<SimTransport, App>,
    app: &mut App,
    req: erpc::MsgBuf,
    resp: erpc::MsgBuf,
) {
    let sn = app.session.expect("connected");
    app.sent_at = rpc.now_ns();
    app.small_in_flight = true;
    if let Err(e) = rpc.enqueue_request(sn, SMALL, req, resp, small_cont, 0) {
        app.failed += 1;
        app.small_in_flight = false;
        rpc.free_msg_buffer(e.req);
        rpc.free_msg_buffer(e.resp);
    }
}

struct Node {
    rpc: Rpc<SimTransport, App>,
    app: App,
}

/// Steps the network: at least `step_ns`; when nothing is due that soon,
/// up to the next delivery (at most 20 µs, so timers are checked).
fn step(net: &SimNet, step_ns: u64) {
    let now = net.now_ns();
    let d = match net.next_event_ns() {
        Some(t) if t > now => (t - now).clamp(step_ns, step_ns.max(20_000)),
        _ => step_ns,
    };
    net.advance(d);
}

fn poll_all(nodes: &mut [Node]) {
    for n in nodes.iter_mut() {
        n.rpc.run_event_loop_once(&mut n.app);
        if n.app.small_next.is_some() {
            small_tick(&mut n.rpc, &mut n.app);
        }
    }
}

fn region() -> RegionOptions {
    // Virtual time: the page size of message buffers changes nothing
    // measured, and the shared hugepages are left to others.
    RegionOptions {
        page_size: PageSize::Small4K,
        fallback: Fallback::SmallPages,
    }
}

/// Runs one incast (or, with `senders == 0`, only the small RPCs).
pub fn run_incast(c: &IncastConfig) -> Result<IncastResult, BenchError> {
    let port = PortConfig::new((c.link_gbps * 1e9) as u64, c.buffer_bytes);
    let net = SimNet::new(SimConfig {
        seed: c.seed,
        port,
        link: erpc_sim::delayed_link(c.delay_ns, 0),
        ..SimConfig::default()
    });
    let cfg = RpcConfig {
        cc: CcConfig {
            link_gbps: c.link_gbps,
            ..c.cc
        },
        ..RpcConfig::default()
    };
    let setup =
        |what: String| move |e: &dyn std::fmt::Display| BenchError::Run(format!("{what}: {e}"));
    // Node 0 receives; nodes 1..=senders stream; the last sends small RPCs.
    let count = c.senders + 2;
    let mut nodes: Vec<Node> = Vec::with_capacity(count);
    for i in 0..count {
        let uri = format!("node-{i}:31850");
        let nexus = Nexus::builder(&uri)
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .seed(c.seed.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64))
            .handler::<SimTransport, App>(BULK, h_bulk)
            .handler::<SimTransport, App>(SMALL, h_small)
            .build()
            .map_err(|e| setup(format!("Nexus {uri}"))(&e))?;
        let initial = if i == 0 {
            // Reassembly and response buffers for every sender's window.
            (c.senders * c.window.min(erpc::SESSION_REQ_WINDOW) + 1) * (c.req_bytes + 4096)
                + (8 << 20)
        } else {
            c.window * (c.req_bytes + 4096) + (8 << 20)
        };
        let alloc = erpc_sim::sim_allocator(initial, region())
            .map_err(|e| setup(format!("buffers of node {i}"))(&e))?;
        let rpc = Rpc::builder(&nexus, net.add_transport(), alloc)
            .config(cfg)
            .build()
            .map_err(|e| setup(format!("Rpc of node {i}"))(&e))?;
        nodes.push(Node {
            rpc,
            app: App::default(),
        });
    }
    for (i, n) in nodes.iter_mut().enumerate().skip(1) {
        let sn = n
            .rpc
            .create_session("node-0:31850", 0)
            .map_err(|e| setup(format!("session of node {i}"))(&e))?;
        n.app.session = Some(sn);
    }
    let mut steps = 0u64;
    while !(1..count).all(|i| {
        let sn = nodes[i].app.session.expect("created");
        nodes[i].rpc.is_connected(sn)
    }) {
        poll_all(&mut nodes);
        step(&net, c.step_ns);
        steps += 1;
        if steps > 10_000_000 {
            return Err(BenchError::Run("sessions did not connect".into()));
        }
    }
    net.set_queue_trace(0, 1 << 24);
    let t0 = net.now_ns();
    let last_done = Rc::new(Cell::new(t0));
    // Start the bulk senders.
    for n in nodes[1..=c.senders].iter_mut() {
        let (rpc, app) = (&mut n.rpc, &mut n.app);
        app.last_done = Some(last_done.clone());
        app.todo = c.requests_per_sender;
        for k in 0..c.window.min(c.requests_per_sender) {
            let mut req = rpc
                .alloc_msg_buffer(c.req_bytes)
                .map_err(|e| setup("a bulk request".into())(&e))?;
            let marker = (k as u8).wrapping_add(1);
            let d = req.data_mut();
            d[0] = marker;
            let last = d.len() - 1;
            d[last] = marker;
            let resp = rpc
                .alloc_msg_buffer(BULK_RESP)
                .map_err(|e| setup("a bulk response".into())(&e))?;
            app.todo -= 1;
            send_bulk(rpc, app, req, resp);
        }
    }
    // Start the small RPCs.
    {
        let n = nodes.last_mut().expect("nodes");
        let (rpc, app) = (&mut n.rpc, &mut n.app);
        app.small_interval_ns = c.small_interval_ns;
        let mut req = rpc
            .alloc_msg_buffer(c.small_bytes)
            .map_err(|e| setup("a small request".into())(&e))?;
        req.data_mut().fill(0x5a);
        let resp = rpc
            .alloc_msg_buffer(c.small_bytes)
            .map_err(|e| setup("a small response".into())(&e))?;
        send_small(rpc, app, req, resp);
    }
    let total = (c.senders * c.requests_per_sender) as u64;
    let bulk_done = |nodes: &[Node]| -> u64 {
        nodes[1..=c.senders]
            .iter()
            .map(|n| n.app.completed + n.app.failed)
            .sum()
    };
    // A generous limit: 50 times the time the bytes take at link rate, and
    // 10 ms more.
    let budget_ns = (total as f64 * c.req_bytes as f64 * 8.0 / c.link_gbps * 50.0) as u64
        + c.reference_rpcs * 100_000
        + 10_000_000;
    // The steady-state window: from `warmup_ns` after the start until the
    // first sender has all its requests completed; at each end, the
    // receiver's accepted packets and the small RPCs it answered.
    let win_start_at = t0 + c.warmup_ns;
    let mut win_start: Option<(u64, u64, u64)> = None;
    let mut win_end: Option<(u64, u64, u64)> = None;
    let mark = |nodes: &[Node], t: u64| {
        let small = nodes.last().expect("nodes").app.small_done
            + u64::from(nodes.last().expect("nodes").app.small_in_flight);
        (t, nodes[0].rpc.stats().rx_accepted, small)
    };
    loop {
        let now = net.now_ns();
        if c.senders > 0 && win_start.is_none() && now >= win_start_at {
            win_start = Some(mark(&nodes, now));
        }
        if c.senders > 0
            && win_end.is_none()
            && nodes[1..=c.senders]
                .iter()
                .any(|n| n.app.completed + n.app.failed == c.requests_per_sender as u64)
        {
            win_end = Some(mark(&nodes, now));
        }
        let done = if c.senders == 0 {
            nodes.last().expect("nodes").app.small_done >= c.reference_rpcs
        } else {
            bulk_done(&nodes) >= total
        };
        if done {
            break;
        }
        if net.now_ns() - t0 > budget_ns {
            return Err(BenchError::Run(format!(
                "incast of {} senders: {} of {total} requests done after {} ms of virtual time",
                c.senders,
                bulk_done(&nodes),
                (net.now_ns() - t0) / 1_000_000
            )));
        }
        poll_all(&mut nodes);
        step(&net, c.step_ns);
    }
    let end = if c.senders == 0 {
        net.now_ns()
    } else {
        last_done.get()
    };
    let elapsed_ns = (end - t0).max(1);
    // Stop the small RPCs and let everything drain.
    nodes.last_mut().expect("nodes").app.small_stop = true;
    for _ in 0..100_000 {
        if !nodes.last().expect("nodes").app.small_in_flight {
            break;
        }
        poll_all(&mut nodes);
        step(&net, c.step_ns);
    }
    let failed: u64 = nodes.iter().map(|n| n.app.failed).sum();
    let bad: u64 = nodes.iter().map(|n| n.app.bad).sum();
    if failed + bad > 0 {
        return Err(BenchError::Run(format!(
            "incast of {} senders: {failed} RPCs failed, {bad} bad messages",
            c.senders
        )));
    }
    if let Some((req, resp)) = nodes.last_mut().expect("nodes").app.small_next.take() {
        let rpc = &mut nodes.last_mut().expect("nodes").rpc;
        rpc.free_msg_buffer(req);
        rpc.free_msg_buffer(resp);
    }
    let q = net.queue(0);
    let trace = net.queue_trace(0);
    if std::env::var_os("ERPC_INCAST_DEBUG").is_some() {
        // Drops and the queue per millisecond.
        let mut per_ms: std::collections::BTreeMap<u64, (u64, u64, u64)> = Default::default();
        for s in &trace {
            let e = per_ms.entry((s.time_ns - t0) / 1_000_000).or_default();
            if s.dropped {
                e.0 += 1;
            } else {
                e.1 += 1;
                e.2 = e.2.max(s.bytes);
            }
        }
        for (ms, (d, a, m)) in per_ms {
            eprintln!(
                "ms {ms:>4}: {a:>6} frames, {d:>6} drops, max queue {:>5} KB",
                m / 1024
            );
        }
        for n in &nodes[1..=c.senders] {
            let sn = n.app.session.expect("connected");
            eprintln!(
                "sender: {:?} Gbit/s, {} rtx, wheel {:?}",
                n.rpc.session_info(sn).and_then(|s| s.cc_rate_gbps),
                n.rpc.stats().retransmissions,
                n.rpc.wheel_stats()
            );
        }
    }
    // The steady-state window (the whole run for the reference, or when
    // the first sender finished before the warm-up ended).
    let (w0, w1) = match (win_start, win_end) {
        (Some(a), Some(b)) if b.0 > a.0 => (Some(a), Some(b)),
        _ => (None, None),
    };
    let (ws, we) = match (w0, w1) {
        (Some(a), Some(b)) => (a.0, b.0),
        _ => (t0, end),
    };
    let in_win = |t: u64| t >= ws && t < we;
    let win_trace: Vec<_> = trace.iter().filter(|s| in_win(s.time_ns)).collect();
    let accepted: Vec<_> = win_trace.iter().filter(|s| !s.dropped).collect();
    let queue_mean_bytes = if accepted.is_empty() {
        0.0
    } else {
        accepted.iter().map(|s| s.bytes as f64).sum::<f64>() / accepted.len() as f64
    };
    let data_per_pkt = transport::MTU - transport::PKTHDR_BYTES;
    let pkts_per_req = c.req_bytes.div_ceil(data_per_pkt).max(1);
    let steady_gbps = match (w0, w1) {
        (Some(a), Some(b)) => {
            let pkts = (b.1 - a.1).saturating_sub(b.2 - a.2);
            Some(pkts as f64 * c.req_bytes as f64 / pkts_per_req as f64 * 8.0 / (b.0 - a.0) as f64)
        }
        _ => None,
    };
    let senders = &nodes[1..=c.senders];
    let rates: Vec<f64> = senders
        .iter()
        .filter_map(|n| {
            n.rpc
                .session_info(n.app.session.expect("connected"))
                .and_then(|s| s.cc_rate_gbps)
        })
        .collect();
    let small = nodes.last().expect("nodes");
    let hist = |win: bool| {
        let mut h =
            Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("histogram bounds");
        for &(t, rtt) in &small.app.rtts {
            if !win || in_win(t) {
                h.saturating_record(rtt);
            }
        }
        h
    };
    let h = hist(true);
    let h_all = hist(false);
    let us = |ns: u64| ns as f64 / 1e3;
    let bulk_bytes = total * c.req_bytes as u64;
    let goodput_gbps = bulk_bytes as f64 * 8.0 / elapsed_ns as f64;
    Ok(IncastResult {
        senders: c.senders,
        cc: c.cc.enabled,
        bulk_bytes,
        elapsed_ns,
        goodput_gbps,
        goodput_fraction: goodput_gbps / c.link_gbps,
        steady_gbps,
        steady_fraction: steady_gbps.map(|g| g / c.link_gbps),
        window_ns: we - ws,
        small_rpcs: h.len(),
        small_p50_us: us(h.value_at_quantile(0.5)),
        small_p99_us: us(h.value_at_quantile(0.99)),
        small_max_us: us(h.max()),
        small_all_p99_us: us(h_all.value_at_quantile(0.99)),
        buffer_bytes: c.buffer_bytes,
        queue_max_bytes: q.max_bytes,
        queue_max_steady_bytes: win_trace.iter().map(|s| s.bytes).max().unwrap_or(0),
        queue_mean_bytes,
        drops: q.drops,
        drops_steady: win_trace.iter().filter(|s| s.dropped).count() as u64,
        retransmissions: senders.iter().map(|n| n.rpc.stats().retransmissions).sum(),
        timely_updates: senders.iter().map(|n| n.rpc.stats().timely_updates).sum(),
        wheel_inserted: senders
            .iter()
            .filter_map(|n| n.rpc.wheel_stats())
            .map(|w| w.inserted)
            .sum(),
        wheel_clamped: senders
            .iter()
            .filter_map(|n| n.rpc.wheel_stats())
            .map(|w| w.clamped)
            .sum(),
        wheel_stale: senders.iter().map(|n| n.rpc.stats().wheel_stale).sum(),
        rate_min_gbps: rates.iter().copied().fold(f64::INFINITY, f64::min),
        rate_max_gbps: rates.iter().copied().fold(0.0, f64::max),
    })
}

impl IncastConfig {
    /// The same with links of `gbps`.
    pub fn with_link(self, gbps: f64) -> IncastConfig {
        IncastConfig {
            link_gbps: gbps,
            ..self
        }
    }

    /// The same with a one-way propagation delay of `ns` on every link.
    pub fn with_delay(self, ns: u64) -> IncastConfig {
        IncastConfig {
            delay_ns: ns,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small incast in virtual time: without CC the senders' credits
    /// fill a 64 KiB buffer and the switch drops at the tail (loss recovery
    /// completes every request); with CC at the links' rate every request
    /// completes too; the reference run measures a few µs.
    #[test]
    fn a_small_incast_fills_the_buffer_without_cc() {
        let small = |senders, cc| IncastConfig {
            req_bytes: 64 * 1024,
            requests_per_sender: 4,
            reference_rpcs: 200,
            warmup_ns: 100_000,
            ..IncastConfig::new(senders, cc, 64 * 1024).with_link(10.0)
        };
        let r = run_incast(&small(0, CcConfig::default())).unwrap();
        assert!(r.small_rpcs >= 200 && r.small_p99_us < 10.0, "{r:?}");
        assert_eq!(r.drops, 0);
        let off = run_incast(&small(4, CcConfig::disabled())).unwrap();
        assert_eq!(off.bulk_bytes, 4 * 4 * 64 * 1024);
        assert!(off.queue_max_bytes > 63 * 1024, "{off:?}");
        assert!(off.drops > 0 && off.retransmissions > 0, "{off:?}");
        assert!(off.goodput_fraction <= max_goodput_fraction(), "{off:?}");
        let on = run_incast(&small(4, CcConfig::default())).unwrap();
        assert!(on.timely_updates > 0, "{on:?}");
        assert!(on.goodput_fraction > 0.0 && on.goodput_fraction <= max_goodput_fraction());
    }
}
