//! Deterministic simulation testing: a seed sweep over random clusters on
//! a faulty network, with invariants checked after every run.
//!
//! Each seed draws a cluster (2–4 nodes, each a client and a server), link
//! faults (loss up to 10 %, duplication, reordering, corruption, delay
//! jitter), a lossy, duplicating, reordering SM network, a request mix
//! (dispatch, burst, deferred and background handlers; sizes from 0 bytes to the
//! largest message), random session create/destroy churn, and sometimes a
//! node crash followed by a restart (before or after the failure timeout).
//! On the simulated network, seeds also draw the faults that end requests
//! without a crash: an Rpc dropped and re-created on its live Nexus (its
//! peers' pings never notice), a node's data path cut while its SM keeps
//! working, a one-way SM partition (a node's SM packets lost, what it
//! receives not), `reset_session` at random at clients and servers, a
//! deferred handler that never answers (until the teardown), and a
//! background handler that panics.
//! On a third of the seeds with a lossless SM network (simulated network)
//! an attacker on it also forges and replays packets
//! (`SimSmHub::set_forgery`).
//! Everything runs in one thread on a virtual clock, so a seed replays
//! exactly.
//!
//! Invariants: every request a surviving client enqueued completes exactly
//! once, with exactly the handler's bytes or an error; a request whose
//! response arrived ran its handler exactly once, and no handler ever runs
//! twice for one request; no continuation waits longer than
//! [`WAIT_BOUND_NS`] of virtual time (the stall bound is
//! [`STALL_MS`], the failure timeout 500 ms) unless its handler was one
//! that never answers; the credit invariant holds throughout; after the
//! run (all sessions destroyed) no session, buffer, RX ring reservation or
//! RX ring entry is left anywhere.
//!
//! `ERPC_DST_SEEDS` sets the number of seeds (default 1000 on the simulated
//! network; a tenth of that, at least 20, on the device model);
//! `ERPC_DST_SEED` replays one. A failure prints the one-line replay
//! command.

mod common;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use erpc::{
    Completion, MAX_MSG_BYTES, Nexus, NexusBuilder, ReqHandle, Request, Rpc, RpcConfig, RpcError,
    SessionEvent, SessionEventKind, SessionNum, Uri,
};
use erpc_sim::{DeferredDma, LinkFaults, SimConfig, SimNet, SmHubConfig};
use netsim::Rng;
use transport::Transport;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// The stall bound of every Rpc in the sweep.
const STALL_MS: u64 = 1_000;
/// The longest any continuation may wait (issue to completion), except
/// for requests whose handler never answers: the stall bound, the
/// failure timeout and a connect timeout, with room for slow transfers
/// of the largest message on a lossy 0.2 Gbit/s link.
const WAIT_BOUND_NS: u64 = 10_000 * MS;
/// A deferred request's delay field that means "never answer" (until the
/// teardown).
const NEVER: u32 = u32::MAX;
/// A background request's delay field that makes its handler panic.
const PANIC: u32 = u32::MAX - 1;

// ------------------------------------------------------------ the world

/// A network the sweep runs on.
trait Net {
    type T: Transport + 'static;
    fn new(seed: u64, faults: &Faults, nodes: usize) -> Self;
    /// A transport for node `i` (first start, or restart after a crash).
    fn transport(&mut self, i: usize) -> Self::T;
    /// An allocator for the transport made last.
    fn allocator(&mut self) -> mempool::Allocator;
    fn nexus(&mut self, uri: &str, seed: u64) -> NexusBuilder;
    /// Node `i`'s process crashes: its port and its Nexus go silent.
    fn crash(&mut self, i: usize);
    /// Moves time to the next event, at most `max_ns` ahead.
    fn step(&mut self, max_ns: u64);
    fn now_ns(&self) -> u64;
    /// RX ring slots node `i`'s transport holds (not yet given back).
    fn rx_held(&self, i: usize) -> u64;
    /// Something was sent: keep time moving in small steps.
    fn busy_hint(&mut self) {}
    /// Cuts (`true`) or restores node `i`'s data path, both ways, its SM
    /// untouched. False where this network cannot.
    fn data_cut(&mut self, _i: usize, _cut: bool) -> bool {
        false
    }
    /// Drops (`true`) or passes again what node `i`'s Nexus sends on SM
    /// (a one-way partition). False where this network cannot.
    fn sm_mute(&mut self, _i: usize, _mute: bool) -> bool {
        false
    }
    /// A new transport at node `i`'s address for a new Rpc on its live
    /// Nexus (the old Rpc is gone). None where this network cannot.
    fn rpc_transport(&mut self, _i: usize) -> Option<Self::T> {
        None
    }
    /// Sends the NIC read after their `tx_burst` (deferred DMA), so far.
    fn dma_deferred(&self) -> u64 {
        0
    }
}

/// Fault settings of one seed.
#[derive(Debug, Clone, Copy)]
struct Faults {
    link: LinkFaults,
    sm: SmHubConfig,
    /// An attacker on the SM network forging and replaying this many
    /// packets per million (`SimSmHub::set_forgery`; simulated network
    /// only).
    forge_ppm: Option<u32>,
}

/// The simulated network; with `DMA`, in its deferred-DMA mode (the NIC
/// reads a send after `tx_burst`, at a later send, a flush or a seeded
/// delay, and a buffer reused or freed before a TX drain panics).
struct SimNetWorld<const DMA: bool> {
    net: SimNet,
    started: Vec<bool>,
    link: LinkFaults,
}

impl<const DMA: bool> Net for SimNetWorld<DMA> {
    type T = erpc_sim::SimTransport;

    fn new(seed: u64, f: &Faults, nodes: usize) -> Self {
        // How many later sends a send may wait for varies by seed: 0 (read
        // at the next burst), a few, or many.
        let deferred_dma = DMA.then(|| DeferredDma {
            max_later_sends: [0, 4, 64][(seed % 3) as usize],
            ..DeferredDma::default()
        });
        let net = SimNet::new(SimConfig {
            seed,
            link: f.link,
            sm: f.sm,
            deferred_dma,
            ..SimConfig::default()
        });
        if let Some(ppm) = f.forge_ppm {
            net.sm_hub().set_forgery(ppm);
        }
        SimNetWorld {
            net,
            started: vec![false; nodes],
            link: f.link,
        }
    }

    fn transport(&mut self, i: usize) -> Self::T {
        if self.started[i] {
            self.net.sm_hub().set_cut_off(&node_uri(i), false);
            self.net.restart(i)
        } else {
            self.started[i] = true;
            let t = self.net.add_transport();
            assert_eq!(t.endpoint(), i);
            t
        }
    }

    fn allocator(&mut self) -> mempool::Allocator {
        self.net.allocator(4 << 20)
    }

    fn nexus(&mut self, uri: &str, seed: u64) -> NexusBuilder {
        Nexus::builder(uri)
            .sm_link(self.net.sm_link())
            .clock(self.net.erpc_clock())
            .seed(seed)
    }

    fn crash(&mut self, i: usize) {
        self.net.crash(i);
        self.net.sm_hub().set_cut_off(&node_uri(i), true);
    }

    fn step(&mut self, max_ns: u64) {
        let now = self.net.now_ns();
        let d = match self.net.next_event_ns() {
            Some(t) if t > now => (t - now).min(max_ns),
            Some(_) => 1,
            None => max_ns,
        };
        self.net.advance(d.max(1));
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn rx_held(&self, i: usize) -> u64 {
        self.net.rx_held(i)
    }

    fn data_cut(&mut self, i: usize, cut: bool) -> bool {
        let clean = erpc_sim::delayed_link(0, 0);
        let dead = |l: LinkFaults| LinkFaults { loss: 1.0, ..l };
        if cut {
            self.net.set_link(i, dead(self.link));
            self.net.set_link_to(i, dead(clean));
        } else {
            self.net.set_link(i, self.link);
            self.net.set_link_to(i, clean);
        }
        true
    }

    fn sm_mute(&mut self, i: usize, mute: bool) -> bool {
        self.net.sm_hub().set_mute(&node_uri(i), mute);
        true
    }

    fn rpc_transport(&mut self, i: usize) -> Option<Self::T> {
        self.net.crash(i);
        Some(self.net.restart(i))
    }

    fn dma_deferred(&self) -> u64 {
        self.net.stats().dma_deferred
    }
}

/// The device model: one software ConnectX per node on a deterministic
/// fabric, brought up by the mlx5 driver; the mlx5 transport on it. A
/// crash takes the node's link down and drops its process (the driver's
/// teardown runs, as the kernel's reset of a VFIO device would); a restart
/// brings the same NIC up again. SM stays on the simulated hub, whose
/// virtual clock moves with the fabric's. With `DMA`, each NIC gathers a
/// send's data later than its doorbell (`NicConfig::deferred_tx`) and
/// freed buffers are poisoned: a missing TX drain fails the seed.
struct DevNet<const DMA: bool> {
    seed: u64,
    net: SimNet,
    fabric: mlx5_sim::Fabric,
    nics: Vec<mlx5_sim::SimNic>,
    faults: mlx5_sim::LinkFaults,
    last: Option<mlx5::Device<mlx5_sim::SimBackend>>,
    /// Frames the fabric moved at the last step (busy: small steps).
    busy: bool,
}

impl<const DMA: bool> Net for DevNet<DMA> {
    type T = transport::mlx5::Mlx5Transport<mlx5_sim::SimBackend>;

    fn new(seed: u64, f: &Faults, _nodes: usize) -> Self {
        DevNet {
            seed,
            net: SimNet::new(SimConfig {
                seed,
                sm: f.sm,
                ..SimConfig::default()
            }),
            fabric: mlx5_sim::Fabric::new(mlx5_sim::FabricConfig {
                seed,
                deterministic: true,
                ..Default::default()
            }),
            nics: Vec::new(),
            // The same faults in the same place (what a node sends) as on
            // the simulated network: one network model under both.
            faults: f.link,
            last: None,
            busy: true,
        }
    }

    fn transport(&mut self, i: usize) -> Self::T {
        if i == self.nics.len() {
            let nic = mlx5_sim::SimNic::new(
                &self.fabric,
                mlx5_sim::NicConfig {
                    mac: [0x02, 0, 0, 0, 0x20, i as u8 + 1],
                    deferred_tx: DMA.then(|| mlx5_sim::DeferredTx {
                        max_later_wqes: [0, 4, 32][(self.seed % 3) as usize],
                        seed: self.seed ^ i as u64,
                        ..mlx5_sim::DeferredTx::default()
                    }),
                    ..Default::default()
                },
            );
            self.fabric
                .set_link_faults_dir(nic.port(), mlx5_sim::Direction::ToSwitch, self.faults);
            self.nics.push(nic);
        } else {
            self.net.sm_hub().set_cut_off(&node_uri(i), false);
            // Up again: the crash took both directions down.
            self.fabric
                .set_link_faults(self.nics[i].port(), mlx5_sim::LinkFaults::default());
            self.fabric.set_link_faults_dir(
                self.nics[i].port(),
                mlx5_sim::Direction::ToSwitch,
                self.faults,
            );
        }
        let dev = mlx5::Device::open(
            self.nics[i].backend(),
            mlx5::DeviceConfig {
                region: common::devmodel::region(),
                ..Default::default()
            },
        )
        .expect("driver bring-up on the device model");
        let t = transport::mlx5::Mlx5Transport::new(
            &dev,
            transport::mlx5::Mlx5Config::new(
                Ipv4Addr::new(10, 30, 0, i as u8 + 1),
                mlx5::QueueConfig {
                    udp_port: 31850 + i as u16,
                    ..Default::default()
                },
            ),
        )
        .expect("mlx5 transport");
        self.last = Some(dev);
        t
    }

    fn allocator(&mut self) -> mempool::Allocator {
        let dev = self.last.take().expect("transport() first");
        mempool::Allocator::new(
            dev.dma_mapper(),
            mempool::AllocatorConfig {
                initial_bytes: 4 << 20,
                region: common::devmodel::region(),
                poison_on_free: DMA.then_some(0xa5),
                ..Default::default()
            },
        )
        .expect("allocator")
    }

    fn nexus(&mut self, uri: &str, seed: u64) -> NexusBuilder {
        Nexus::builder(uri)
            .sm_link(self.net.sm_link())
            .clock(self.net.erpc_clock())
            .seed(seed)
    }

    fn crash(&mut self, i: usize) {
        self.fabric.set_link_faults(
            self.nics[i].port(),
            mlx5_sim::LinkFaults {
                down: true,
                ..self.faults
            },
        );
        self.net.sm_hub().set_cut_off(&node_uri(i), true);
    }

    fn step(&mut self, max_ns: u64) {
        // Small steps while frames move, else up to the next SM delivery or
        // hop the fabric holds.
        let d = if self.busy { 500 } else { max_ns };
        let now = self.net.now_ns();
        let d = [self.net.next_event_ns(), self.fabric.next_event_ns()]
            .into_iter()
            .flatten()
            .filter(|&t| t > now)
            .fold(d, |d, t| d.min(t - now));
        self.net.advance(d.max(1));
        if DMA {
            // Held sends whose delay has passed are read at the step.
            for nic in &self.nics {
                nic.release_deferred_tx();
            }
        }
        self.busy = self.fabric.advance(Duration::from_nanos(d.max(1))) > 0;
    }

    fn dma_deferred(&self) -> u64 {
        self.nics.iter().map(|n| n.stats().tx_deferred_reads).sum()
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn rx_held(&self, _i: usize) -> u64 {
        // The mlx5 ring's accounting is checked by the transport's own
        // conformance suite.
        0
    }

    fn busy_hint(&mut self) {
        self.busy = true;
    }
}

fn node_uri(i: usize) -> Uri {
    Uri::new(&format!("node-{i}"), 31850)
}

// ------------------------------------------------------------- the app

/// Handler kinds (request types).
const H_DISPATCH: u8 = 1;
const H_DEFER: u8 = 2;
const H_BG: u8 = 3;
/// A burst handler (`NexusBuilder::burst_handler`): half the requests
/// drawn as dispatch ones (odd ids), so the random stream is unchanged.
/// Most are answered at once; some are kept and answered later (as
/// `H_DEFER`'s), a few not taken at all (they fail, `Declined`).
const H_BURST: u8 = 4;
/// Request header: id (8), response length (4), defer delay in µs (4).
const REQ_HDR: usize = 16;

fn pattern(key: u64, i: usize) -> u8 {
    let x = key
        .wrapping_add(i as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i as u8)
}

fn fill(buf: &mut [u8], key: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(key, i);
    }
}

fn resp_key(id: u64) -> u64 {
    id ^ 0x5555_aaaa_5555_aaaa
}

fn parse(d: &[u8]) -> Option<(u64, usize, u64)> {
    if d.len() < REQ_HDR {
        return None;
    }
    let id = u64::from_le_bytes(d[..8].try_into().ok()?);
    let len = u32::from_le_bytes(d[8..12].try_into().ok()?) as usize;
    let delay = u64::from(u32::from_le_bytes(d[12..16].try_into().ok()?));
    let body_ok = d[REQ_HDR..]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(id, i));
    body_ok.then_some((id, len, delay))
}

#[derive(Debug, Default)]
struct ReqRec {
    client: usize,
    /// Void when the client crashed with the request outstanding.
    void: bool,
    done: u32,
    ok: bool,
    /// Issued and completed, virtual ns.
    issued_ns: u64,
    done_ns: u64,
    /// Its handler never answers (until the teardown).
    held: bool,
}

/// World-wide bookkeeping, shared by every node's context.
#[derive(Default)]
struct Book {
    /// Frames may be damaged past the frame check: payload and handler-run
    /// checks are off (nothing can detect such damage).
    lax: bool,
    /// Handler runs per request id (all kinds; background ones are merged
    /// in from `bg_runs`).
    runs: RefCell<HashMap<u64, u32>>,
    bg_runs: Arc<Mutex<HashMap<u64, u32>>>,
    reqs: RefCell<HashMap<u64, ReqRec>>,
    violations: RefCell<Vec<String>>,
    next_id: Cell<u64>,
}

impl Book {
    fn violation(&self, v: String) {
        self.violations.borrow_mut().push(v);
    }

    /// A violation only when frames cannot be damaged undetected.
    fn data_violation(&self, v: String) {
        if !self.lax {
            self.violation(v);
        }
    }

    fn runs(&self, id: u64) -> u32 {
        self.runs.borrow().get(&id).copied().unwrap_or(0)
            + self.bg_runs.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
}

struct Ctx {
    node: usize,
    book: Rc<Book>,
    /// Live client sessions: (session, server node).
    sessions: Vec<(SessionNum, usize)>,
    /// Deferred requests: handle, id, response length, due time.
    deferred: Vec<(ReqHandle, u64, usize, u64)>,
    now_ns: u64,
    outstanding: usize,
    /// Of those, requests whose handler never answers.
    held: usize,
}

fn sm_handler<T: Transport>(_rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, ev: SessionEvent) {
    if ev.kind != SessionEventKind::Connected {
        ctx.sessions.retain(|&(s, _)| s != ev.session);
    }
}

fn count_run(book: &Book, id: u64) {
    let mut r = book.runs.borrow_mut();
    let n = r.entry(id).or_insert(0);
    *n += 1;
    if *n > 1 {
        book.data_violation(format!("handler of request {id:#x} ran {n} times"));
    }
}

fn respond<T: Transport>(rpc: &mut Rpc<T, Ctx>, h: ReqHandle, id: u64, len: usize) {
    // A length from a request damaged past the frame check may be absurd.
    let len = if len <= MAX_MSG_BYTES { len } else { 0 };
    let mut m = match rpc.response_buffer(&h, len) {
        Ok(m) => m,
        Err(e) => panic!("response buffer of {len} bytes: {e}"),
    };
    fill(m.data_mut(), resp_key(id));
    // A response to a session that was reset meanwhile is refused: fine.
    let _ = rpc.enqueue_response(h, m);
}

fn h_dispatch<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    let Some((id, len, _)) = parse(req.data) else {
        ctx.book
            .data_violation(format!("node {}: corrupt request delivered", ctx.node));
        return respond(rpc, req.handle, 0, 0);
    };
    count_run(&ctx.book, id);
    respond(rpc, req.handle, id, len);
}

fn h_defer<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    let Some((id, len, delay)) = parse(req.data) else {
        ctx.book
            .data_violation(format!("node {}: corrupt request delivered", ctx.node));
        return respond(rpc, req.handle, 0, 0);
    };
    count_run(&ctx.book, id);
    // A delay damaged past the frame check may be absurd: 2 ms at most, as
    // requests are made, or never (until the teardown).
    let due = if delay == u64::from(NEVER) {
        u64::MAX
    } else {
        ctx.now_ns + delay.min(2000) * US
    };
    ctx.deferred.push((req.handle, id, len, due));
}

fn h_burst<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, b: &mut erpc::Burst<'_>) {
    for i in 0..b.len() {
        let Some((id, len, delay)) = parse(b.data(i)) else {
            ctx.book
                .data_violation(format!("node {}: corrupt request delivered", ctx.node));
            respond(rpc, b.take(i), 0, 0);
            continue;
        };
        if delay % 400 == 3 {
            // Not taken: the request fails without running.
            continue;
        }
        count_run(&ctx.book, id);
        let h = b.take(i);
        if delay < 100 {
            ctx.deferred.push((h, id, len, ctx.now_ns + delay * US));
        } else {
            respond(rpc, h, id, len);
        }
    }
}

fn bg_handler(runs: Arc<Mutex<HashMap<u64, u32>>>) -> impl Fn(&[u8], &mut erpc::BgResponse<'_>) {
    move |data, resp| match parse(data) {
        Some((id, len, delay)) => {
            *runs.lock().unwrap().entry(id).or_insert(0) += 1;
            if delay == u64::from(PANIC) {
                panic!("dst: a background handler panics (injected)");
            }
            // A length damaged past the frame check may be absurd.
            let len = if len <= MAX_MSG_BYTES { len } else { 0 };
            fill(resp.buf(len), resp_key(id));
        }
        None => resp.write(b"CORRUPT"),
    }
}

fn cont<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, c: Completion) {
    let id = c.tag as u64;
    ctx.outstanding -= 1;
    let book = ctx.book.clone();
    if book.reqs.borrow().get(&id).is_some_and(|r| r.held) {
        ctx.held -= 1;
    }
    {
        let mut reqs = book.reqs.borrow_mut();
        let Some(rec) = reqs.get_mut(&id) else {
            book.violation(format!("completion for unknown request {id:#x}"));
            return;
        };
        rec.done += 1;
        rec.done_ns = ctx.now_ns;
        if rec.done > 1 {
            book.violation(format!("request {id:#x} completed {} times", rec.done));
        }
        if rec.client != ctx.node {
            book.violation(format!("request {id:#x} completed at the wrong node"));
        }
        match c.result {
            Ok(()) => {
                rec.ok = true;
                let d = c.resp.data();
                let want_len = u32::from_le_bytes(c.req.data()[8..12].try_into().unwrap()) as usize;
                let good = d.len() == want_len
                    && d.iter()
                        .enumerate()
                        .all(|(i, &b)| b == pattern(resp_key(id), i));
                if !good {
                    book.data_violation(format!(
                        "request {id:#x}: response of {} bytes is not the handler's {} bytes",
                        d.len(),
                        want_len
                    ));
                }
            }
            Err(RpcError::ResponseTooLarge { .. }) => {
                book.data_violation(format!("request {id:#x}: response too large"))
            }
            Err(_) => {}
        }
    }
    if c.req.len() < 8 || u64::from_le_bytes(c.req.data()[..8].try_into().unwrap()) != id {
        book.violation(format!("request {id:#x}: request buffer came back changed"));
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

// ------------------------------------------------------------ the run

struct Node<T: Transport> {
    rpc: Rpc<T, Ctx>,
    ctx: Ctx,
    /// Buffers in use right after creation (the control buffer).
    baseline: u64,
}

fn in_use<T: Transport, C>(rpc: &Rpc<T, C>) -> u64 {
    rpc.alloc_stats().classes.iter().map(|c| c.in_use).sum()
}

struct Plan {
    /// Congestion control of every Rpc: on (three seeds in four), with
    /// each bypass on or off, sometimes on a slow link so pacing matters.
    cc: erpc::CcConfig,
    /// Retransmission timeout: the default 5 ms, or 1 ms (shorter than the
    /// timing wheel's horizon, so rollbacks find packets in the wheel).
    rto_us: u64,
    /// Frames may be damaged past the frame check (data not checked).
    undetected: bool,
    nodes: usize,
    faults: Faults,
    requests: usize,
    window: usize,
    max_size: usize,
    huge: bool,
    crash: Option<(usize, u64, u64)>,
    churn_ppm: u32,
    /// The faults below are drawn from their own generator, so that the
    /// rest of a seed's plan is what it was before they existed. Where the
    /// network cannot inject one (the device model), it is skipped.
    /// An Rpc-only restart: (node, at).
    rpc_restart: Option<(usize, u64)>,
    /// A data-path cut, SM untouched: (node, at, for).
    data_cut: Option<(usize, u64, u64)>,
    /// A one-way SM partition (the node's SM sends lost): (node, at, for).
    sm_mute: Option<(usize, u64, u64)>,
    /// `reset_session` of a random session, per node and step.
    reset_ppm: u32,
    /// Deferred requests whose handler never answers, per mille.
    never_per_mille: u64,
    /// Background requests whose handler panics, per mille.
    panic_per_mille: u64,
}

fn plan(seed: u64) -> Plan {
    let mut r = Rng::new(seed ^ 0xd57);
    let pick = |r: &mut Rng, max: u32| -> u32 {
        match r.below(3) {
            0 => 0,
            1 => r.below(u64::from(max / 10) + 1) as u32,
            _ => r.below(u64::from(max) + 1) as u32,
        }
    };
    let loss = pick(&mut r, 100_000);
    // Drawn in this order (delay, jitter, then the faults) so that a seed
    // keeps the plan it had when these were given in parts per million.
    let ppm = |v: u32| f64::from(v) / 1e6;
    let delay_ns = 1_000 + r.below(4_000);
    let jitter_ns = r.below(5_000);
    let link = LinkFaults {
        loss: ppm(loss),
        duplicate: ppm(pick(&mut r, 50_000)),
        reorder: ppm(pick(&mut r, 50_000)),
        fcs_error: ppm(pick(&mut r, 10_000)),
        ..erpc_sim::delayed_link(delay_ns, jitter_ns)
    };
    // Some seeds also damage frames past the Ethernet frame check. eRPC
    // (UDP checksum 0, as in C++) cannot detect payload damage, so those
    // seeds check survival, exactly-once completion and leaks, not bytes.
    let undetected = r.below(10) == 0;
    let mut link = link;
    if undetected {
        link.corrupt = ppm(1 + r.below(5_000) as u32);
    }
    let sm = SmHubConfig {
        delay_ns: 5_000 + r.below(50_000),
        jitter_ns: r.below(50_000),
        loss_ppm: pick(&mut r, 50_000),
        dup_ppm: pick(&mut r, 100_000),
    };
    let nodes = 2 + r.below(3) as usize;
    let crash = (r.below(3) == 0).then(|| {
        let who = r.below(nodes as u64) as usize;
        let at = r.below(20 * MS);
        // Back before the failure timeout, or well after it.
        let down = if r.below(2) == 0 {
            MS + r.below(300 * MS)
        } else {
            600 * MS + r.below(400 * MS)
        };
        (who, at, down)
    });
    let cc = erpc::CcConfig {
        enabled: r.below(4) != 0,
        timely_bypass: r.below(2) == 0,
        wheel_bypass: r.below(2) == 0,
        batch_timestamps: r.below(2) == 0,
        link_gbps: [25.0, 1.0, 0.2][r.below(3) as usize],
        ..erpc::CcConfig::default()
    };
    let rto_us = if r.below(3) == 0 { 1_000 } else { 5_000 };
    Plan {
        cc,
        rto_us,
        undetected,
        nodes,
        // A third of the seeds have an attacker on the SM network (drawn
        // from the seed, not from `r`, so the other draws stay as they
        // were). A server session made by a forged connect request goes
        // when the client it names disowns it; a lost disown (SM loss, a
        // crash's SM cut-off) is made good by the server's probes of
        // never-used sessions (`RpcStats::sm_unserved_probes`).
        faults: Faults {
            link,
            sm,
            forge_ppm: seed
                .is_multiple_of(3)
                .then(|| 50_000 + (seed / 3 % 8) as u32 * 50_000),
        },
        requests: 40 + r.below(160) as usize,
        window: 1 + r.below(24) as usize,
        max_size: match r.below(10) {
            0..=5 => 968,
            6..=8 => 20_000,
            _ => 300_000,
        },
        huge: loss <= 10_000 && r.below(20) == 0,
        crash,
        churn_ppm: pick(&mut r, 20_000),
        rpc_restart: None,
        data_cut: None,
        sm_mute: None,
        reset_ppm: 0,
        never_per_mille: 0,
        panic_per_mille: 0,
    }
    .with_liveness_faults(seed)
}

impl Plan {
    fn with_liveness_faults(mut self, seed: u64) -> Plan {
        let mut r = Rng::new(seed ^ 0x11fe_2e55);
        let nodes = self.nodes as u64;
        let window = |r: &mut Rng| (r.below(30 * MS), 50 * MS + r.below(2_950 * MS));
        if r.below(6) == 0 {
            self.rpc_restart = Some((r.below(nodes) as usize, r.below(30 * MS)));
        }
        if r.below(6) == 0 {
            let (at, dur) = window(&mut r);
            self.data_cut = Some((r.below(nodes) as usize, at, dur));
        }
        if r.below(6) == 0 {
            let (at, dur) = window(&mut r);
            self.sm_mute = Some((r.below(nodes) as usize, at, dur));
        }
        if r.below(4) == 0 {
            self.reset_ppm = 1 + r.below(5_000) as u32;
        }
        if r.below(4) == 0 {
            self.never_per_mille = 1 + r.below(50);
        }
        if r.below(4) == 0 {
            self.panic_per_mille = 1 + r.below(20);
        }
        self
    }
}

fn start_node<N: Net>(
    net: &mut N,
    i: usize,
    generation: u64,
    book: &Rc<Book>,
    cc: erpc::CcConfig,
    rto_us: u64,
) -> Node<N::T> {
    let t = net.transport(i);
    let nexus = net
        .nexus(&node_uri(i).to_string(), (i as u64) << 32 | generation)
        .handler::<N::T, Ctx>(H_DISPATCH, h_dispatch::<N::T>)
        .handler::<N::T, Ctx>(H_DEFER, h_defer::<N::T>)
        .burst_handler::<N::T, Ctx>(H_BURST, h_burst::<N::T>)
        .bg_handler(H_BG, bg_handler(book.bg_runs.clone()))
        .build()
        .expect("nexus");
    new_rpc(net, &nexus, t, i, book, cc, rto_us)
}

/// An Rpc on `nexus` with transport `t`, for node `i`.
fn new_rpc<N: Net>(
    net: &mut N,
    nexus: &Arc<Nexus>,
    t: N::T,
    i: usize,
    book: &Rc<Book>,
    cc: erpc::CcConfig,
    rto_us: u64,
) -> Node<N::T> {
    let alloc = net.allocator();
    let rpc = Rpc::builder(nexus, t, alloc)
        .config(RpcConfig {
            cc,
            rto_us,
            pkt_loss_scan_us: rto_us / 10,
            stall_timeout_ms: Some(STALL_MS),
            ..RpcConfig::default()
        })
        .session_handler(sm_handler::<N::T>)
        .build()
        .expect("rpc");
    let baseline = in_use(&rpc);
    Node {
        rpc,
        ctx: Ctx {
            node: i,
            book: book.clone(),
            sessions: Vec::new(),
            deferred: Vec::new(),
            now_ns: 0,
            outstanding: 0,
            held: 0,
        },
        baseline,
    }
}

fn open_session<T: Transport + 'static>(n: &mut Node<T>, server: usize) {
    let sn = n
        .rpc
        .create_session(&node_uri(server).to_string(), 0)
        .expect("create_session");
    n.ctx.sessions.push((sn, server));
}

fn issue<T: Transport + 'static>(n: &mut Node<T>, r: &mut Rng, p: &Plan, huge: &mut bool) {
    if n.ctx.sessions.is_empty() {
        return;
    }
    let (sn, _) = n.ctx.sessions[r.below(n.ctx.sessions.len() as u64) as usize];
    let book = n.ctx.book.clone();
    let id = book.next_id.get();
    book.next_id.set(id + 1);
    let size = |r: &mut Rng| -> usize {
        match r.below(4) {
            0 => r.below(64) as usize,
            _ => r.below(p.max_size as u64 + 1) as usize,
        }
    };
    let (mut req_len, mut resp_len) = (size(r).max(REQ_HDR), size(r));
    if *huge {
        *huge = false;
        if r.below(2) == 0 {
            req_len = MAX_MSG_BYTES;
        } else {
            resp_len = MAX_MSG_BYTES;
        }
    }
    let kind = match [H_DISPATCH, H_DISPATCH, H_DEFER, H_BG][r.below(4) as usize] {
        H_DISPATCH if id % 2 == 1 => H_BURST,
        k => k,
    };
    let mut delay = r.below(2000) as u32;
    let mut held = false;
    if kind == H_DEFER && r.below(1000) < p.never_per_mille {
        delay = NEVER;
        held = true;
    } else if kind == H_BG && r.below(1000) < p.panic_per_mille {
        delay = PANIC;
    }
    let mut req = n.rpc.alloc_msg_buffer(req_len).expect("alloc request");
    let d = req.data_mut();
    d[..8].copy_from_slice(&id.to_le_bytes());
    d[8..12].copy_from_slice(&(resp_len as u32).to_le_bytes());
    d[12..16].copy_from_slice(&delay.to_le_bytes());
    fill(&mut d[REQ_HDR..], id);
    let resp = n.rpc.alloc_msg_buffer(resp_len).expect("alloc response");
    book.reqs.borrow_mut().insert(
        id,
        ReqRec {
            client: n.ctx.node,
            issued_ns: n.ctx.now_ns,
            held,
            ..ReqRec::default()
        },
    );
    match n
        .rpc
        .enqueue_request(sn, kind, req, resp, cont::<T>, id as usize)
    {
        Ok(()) => {
            n.ctx.outstanding += 1;
            n.ctx.held += usize::from(held);
        }
        Err(e) => {
            // The session went away under us (reset, destroyed): not a
            // request then.
            book.reqs.borrow_mut().remove(&id);
            n.rpc.free_msg_buffer(e.req);
            n.rpc.free_msg_buffer(e.resp);
            n.ctx.sessions.retain(|&(s, _)| s != sn);
        }
    }
}

/// One seed on network `N`. Returns the violations (empty if clean).
/// What one seed did (for the sweep's summary line).
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// The longest a continuation waited (virtual ns), held ones aside.
    max_wait_ns: u64,
    ok: u64,
    failed: u64,
    void: u64,
    crashes: u64,
    retransmissions: u64,
    timely_updates: u64,
    wheel_inserted: u64,
    wheel_stale: u64,
    dma_deferred: u64,
}

fn run<N: Net>(seed: u64) -> (Vec<String>, Tally) {
    let p = plan(seed);
    if std::env::var_os("ERPC_VERBOSE").is_some() {
        eprintln!(
            "seed {seed}: {} nodes, {} requests, window {}, max size {}, huge {}, crash {:?}, churn {} ppm, {:?}, {:?}",
            p.nodes, p.requests, p.window, p.max_size, p.huge, p.crash, p.churn_ppm, p.faults, p.cc
        );
        eprintln!(
            "seed {seed}: rpc restart {:?}, data cut {:?}, SM mute {:?}, resets {} ppm, never {}/1000, panics {}/1000",
            p.rpc_restart, p.data_cut, p.sm_mute, p.reset_ppm, p.never_per_mille, p.panic_per_mille
        );
    }
    let mut net = N::new(seed, &p.faults, p.nodes);
    let book = Rc::new(Book {
        lax: p.undetected,
        ..Book::default()
    });
    let mut r = Rng::new(seed);
    let mut nodes: Vec<Option<Node<N::T>>> = (0..p.nodes)
        .map(|i| Some(start_node(&mut net, i, 0, &book, p.cc, p.rto_us)))
        .collect();
    let mut gens = vec![0u64; p.nodes];
    for i in 0..p.nodes {
        let k = 1 + r.below(2) as usize;
        for _ in 0..k {
            let s = (i + 1 + r.below(p.nodes as u64 - 1) as usize) % p.nodes;
            open_session(nodes[i].as_mut().unwrap(), s);
        }
    }
    let mut issued = vec![0usize; p.nodes];
    let mut huge = vec![p.huge; p.nodes];
    let mut crashed_at: Option<u64> = None;
    let mut restarted = false;
    let mut rpc_restarted = false;
    // Whether a cut or mute began, and whether it is over.
    let mut cut = (false, false);
    let mut mute = (false, false);
    let t0 = net.now_ns();
    let mut steps: u64 = 0;
    let step_limit: u64 = 40_000_000;
    loop {
        steps += 1;
        let now = net.now_ns();
        // Header damage past the frame check can stall a request for good
        // (e.g. a request whose size was damaged in its first packet):
        // nothing in eRPC or C++ eRPC can detect it. Such seeds stop
        // after 60 s of virtual time and go on to the teardown, which must
        // still fail every request left exactly once and free everything.
        if p.undetected && now - t0 > 60_000 * MS {
            break;
        }
        if steps > step_limit {
            book.violation(format!("stuck at t = {now} ns"));
            break;
        }
        // Crash and restart.
        if let Some((who, at, down)) = p.crash {
            if crashed_at.is_none() && now - t0 >= at {
                crashed_at = Some(now);
                net.crash(who);
                let dead = nodes[who].take().expect("alive");
                // Its own requests die with it.
                for rec in book.reqs.borrow_mut().values_mut() {
                    if rec.client == who && rec.done == 0 {
                        rec.void = true;
                    }
                }
                drop(dead);
            } else if !restarted && crashed_at.is_some_and(|c| now - c >= down) {
                restarted = true;
                gens[who] += 1;
                let mut n = start_node(&mut net, who, gens[who], &book, p.cc, p.rto_us);
                let s = (who + 1) % p.nodes;
                open_session(&mut n, s);
                nodes[who] = Some(n);
            }
        }
        // An Rpc dropped and re-created on its live Nexus, within one
        // ping interval: its peers' failure detection never notices.
        if let Some((who, at)) = p.rpc_restart
            && !rpc_restarted
            && now - t0 >= at
        {
            rpc_restarted = true;
            if nodes[who].is_some()
                && let Some(t) = net.rpc_transport(who)
            {
                let old = nodes[who].take().expect("checked");
                for rec in book.reqs.borrow_mut().values_mut() {
                    if rec.client == who && rec.done == 0 {
                        rec.void = true;
                    }
                }
                let nexus = old.rpc.nexus().clone();
                drop(old);
                let mut n = new_rpc(&mut net, &nexus, t, who, &book, p.cc, p.rto_us);
                n.ctx.now_ns = now;
                open_session(&mut n, (who + 1) % p.nodes);
                nodes[who] = Some(n);
            }
        }
        if let Some((who, at, dur)) = p.data_cut {
            if !cut.0 && now - t0 >= at {
                cut.0 = net.data_cut(who, true);
                cut.1 = !cut.0;
            } else if cut.0 && !cut.1 && now - t0 >= at + dur {
                net.data_cut(who, false);
                cut.1 = true;
            }
        }
        if let Some((who, at, dur)) = p.sm_mute {
            if !mute.0 && now - t0 >= at {
                mute.0 = net.sm_mute(who, true);
                mute.1 = !mute.0;
            } else if mute.0 && !mute.1 && now - t0 >= at + dur {
                net.sm_mute(who, false);
                mute.1 = true;
            }
        }
        let sent_before: u64 = nodes.iter().flatten().map(|n| n.rpc.stats().tx_pkts).sum();
        for (i, slot) in nodes.iter_mut().enumerate() {
            let Some(n) = slot.as_mut() else { continue };
            n.ctx.now_ns = now;
            // Deferred handlers respond when due.
            let mut k = 0;
            while k < n.ctx.deferred.len() {
                if n.ctx.deferred[k].3 <= now {
                    let (h, id, len, _) = n.ctx.deferred.swap_remove(k);
                    respond(&mut n.rpc, h, id, len);
                } else {
                    k += 1;
                }
            }
            // Closed loop with a window; churn.
            while issued[i] < p.requests
                && n.ctx.outstanding - n.ctx.held < p.window
                && !n.ctx.sessions.is_empty()
            {
                issued[i] += 1;
                issue(n, &mut r, &p, &mut huge[i]);
            }
            if p.reset_ppm != 0 && r.chance_ppm(p.reset_ppm) {
                // A client or a server session, at random.
                let all = n.rpc.session_nums();
                if !all.is_empty() {
                    let sn = all[r.below(all.len() as u64) as usize];
                    let _ = n.rpc.reset_session(sn);
                }
            }
            if r.chance_ppm(p.churn_ppm) {
                if r.below(2) == 0 && !n.ctx.sessions.is_empty() {
                    let k = r.below(n.ctx.sessions.len() as u64) as usize;
                    let (sn, _) = n.ctx.sessions[k];
                    if n.rpc.is_connected(sn) {
                        n.ctx.sessions.remove(k);
                        n.rpc.destroy_session(sn).expect("destroy");
                    }
                } else if n.ctx.sessions.len() < 4 {
                    let s = (i + 1 + r.below(p.nodes as u64 - 1) as usize) % p.nodes;
                    open_session(n, s);
                }
            }
            if n.ctx.sessions.is_empty() && issued[i] < p.requests {
                let s = (i + 1 + r.below(p.nodes as u64 - 1) as usize) % p.nodes;
                open_session(n, s);
            }
            n.rpc.run_event_loop_once(&mut n.ctx);
            if steps.is_multiple_of(64)
                && let Err(e) = n.rpc.check_credit_invariant()
            {
                book.violation(format!("node {i}: {e}"));
            }
        }
        let crash_pending =
            (p.crash.is_some() && !restarted) || (cut.0 && !cut.1) || (mute.0 && !mute.1);
        // Done when every request is answered but those whose handler
        // never answers (the teardown ends them).
        let all_done = !crash_pending
            && nodes.iter().enumerate().all(|(i, n)| {
                n.as_ref().is_none_or(|n| {
                    issued[i] >= p.requests
                        && n.ctx.outstanding == n.ctx.held
                        && n.ctx.deferred.iter().all(|d| d.3 == u64::MAX)
                })
            });
        if all_done {
            break;
        }
        let sent: u64 = nodes.iter().flatten().map(|n| n.rpc.stats().tx_pkts).sum();
        if sent != sent_before {
            net.busy_hint();
        }
        net.step(200 * US);
    }
    // Tear down: destroy every client session as soon as it is connected,
    // let deferred handlers respond, and wait for every session to go
    // (server sessions of a crashed client go by failure detection).
    for n in nodes.iter_mut().flatten() {
        n.ctx.sessions.clear();
    }
    let teardown_end = net.now_ns() + 5_000 * MS;
    loop {
        let now = net.now_ns();
        for n in nodes.iter_mut().flatten() {
            n.ctx.now_ns = now;
            for (h, id, len, _) in std::mem::take(&mut n.ctx.deferred) {
                respond(&mut n.rpc, h, id, len);
            }
            for sn in n.rpc.session_nums() {
                if n.rpc.session_is_client(sn) == Some(true) && n.rpc.is_connected(sn) {
                    n.rpc
                        .destroy_session(sn)
                        .expect("destroy a connected session");
                }
            }
            n.rpc.run_event_loop_once(&mut n.ctx);
        }
        if nodes
            .iter()
            .flatten()
            .all(|n| n.rpc.session_nums().is_empty())
            || now > teardown_end
        {
            break;
        }
        net.step(MS);
    }
    // Invariants.
    let runs_total = |id| book.runs(id);
    for (id, rec) in book.reqs.borrow().iter() {
        if rec.void {
            continue;
        }
        if rec.done != 1 {
            book.violation(format!(
                "request {id:#x} from node {} completed {} times",
                rec.client, rec.done
            ));
        }
        let waited = rec.done_ns.saturating_sub(rec.issued_ns);
        if !rec.held && !book.lax && waited > WAIT_BOUND_NS {
            book.violation(format!(
                "request {id:#x} from node {} waited {} ms for its continuation",
                rec.client,
                waited / MS
            ));
        }
        let n = runs_total(*id);
        if rec.ok && n != 1 {
            book.data_violation(format!(
                "request {id:#x} succeeded but its handler ran {n} times"
            ));
        }
    }
    for (id, n) in book.bg_runs.lock().unwrap().iter() {
        if *n > 1 {
            book.data_violation(format!("background handler of {id:#x} ran {n} times"));
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        let Some(n) = n else { continue };
        for sn in n.rpc.session_nums() {
            book.violation(format!(
                "node {i}: session left: {:?}",
                n.rpc.session_info(sn)
            ));
        }
        let (free, total) = n.rpc.rx_ring_unreserved();
        if free != total {
            book.violation(format!(
                "node {i}: {} RX ring entries still reserved",
                total - free
            ));
        }
        if in_use(&n.rpc) != n.baseline {
            book.violation(format!(
                "node {i}: {} buffers in use, {} at start",
                in_use(&n.rpc),
                n.baseline
            ));
        }
        if net.rx_held(i) != 0 {
            book.violation(format!("node {i}: {} RX ring entries held", net.rx_held(i)));
        }
    }
    let v = book.violations.borrow().clone();
    if std::env::var_os("ERPC_VERBOSE").is_some() {
        for n in nodes.iter().flatten() {
            eprintln!("node {}: {}", n.ctx.node, n.rpc.stats());
        }
    }
    let mut t = Tally {
        crashes: u64::from(crashed_at.is_some()),
        retransmissions: nodes
            .iter()
            .flatten()
            .map(|n| n.rpc.stats().retransmissions)
            .sum(),
        timely_updates: nodes
            .iter()
            .flatten()
            .map(|n| n.rpc.stats().timely_updates)
            .sum(),
        wheel_inserted: nodes
            .iter()
            .flatten()
            .filter_map(|n| n.rpc.wheel_stats())
            .map(|w| w.inserted)
            .sum(),
        wheel_stale: nodes
            .iter()
            .flatten()
            .map(|n| n.rpc.stats().wheel_stale)
            .sum(),
        dma_deferred: net.dma_deferred(),
        ..Tally::default()
    };
    for rec in book.reqs.borrow().values() {
        if !rec.void && !rec.held {
            t.max_wait_ns = t.max_wait_ns.max(rec.done_ns.saturating_sub(rec.issued_ns));
        }
        if rec.void {
            t.void += 1;
        } else if rec.ok {
            t.ok += 1;
        } else {
            t.failed += 1;
        }
    }
    (v, t)
}

// ---------------------------------------------------------- the sweep

fn seeds(default: u64) -> (u64, u64) {
    if let Some(s) = std::env::var("ERPC_DST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
        return (s, 1);
    }
    let n = std::env::var("ERPC_DST_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (1, n)
}

fn seeds_or(default: u64) -> (u64, u64) {
    if let Some(s) = std::env::var("ERPC_DST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return (s, 1);
    }
    (1, default)
}

fn sweep<N: Net>(test: &str, default: u64) {
    let (first, count) = seeds(default);
    sweep_range::<N>(test, first, count);
}

fn sweep_range<N: Net>(test: &str, first: u64, count: u64) -> Tally {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u64;
    let failures: Mutex<Vec<(u64, Vec<String>)>> = Mutex::new(Vec::new());
    let total: Mutex<Tally> = Mutex::new(Tally::default());
    let next = std::sync::atomic::AtomicU64::new(first);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seed >= first + count {
                        break;
                    }
                    let r = std::panic::catch_unwind(|| run::<N>(seed));
                    let v = match r {
                        Ok((v, t)) => {
                            let mut a = total.lock().unwrap();
                            a.ok += t.ok;
                            a.failed += t.failed;
                            a.void += t.void;
                            a.crashes += t.crashes;
                            a.retransmissions += t.retransmissions;
                            a.timely_updates += t.timely_updates;
                            a.wheel_inserted += t.wheel_inserted;
                            a.wheel_stale += t.wheel_stale;
                            a.max_wait_ns = a.max_wait_ns.max(t.max_wait_ns);
                            a.dma_deferred += t.dma_deferred;
                            v
                        }
                        Err(e) => vec![format!(
                            "panicked: {}",
                            e.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        )],
                    };
                    if !v.is_empty() {
                        failures.lock().unwrap().push((seed, v));
                    }
                }
            });
        }
    });
    let mut f = failures.into_inner().unwrap();
    f.sort_by_key(|x| x.0);
    if let Some((seed, v)) = f.first() {
        for (s, v) in &f {
            eprintln!("seed {s}: {} violation(s), first: {}", v.len(), v[0]);
        }
        panic!(
            "{} of {count} seeds failed; first seed {seed}:\n  {}\nreplay: ERPC_DST_SEED={seed} cargo test -p erpc --test dst -- {test} --exact",
            f.len(),
            v.iter().take(10).cloned().collect::<Vec<_>>().join("\n  ")
        );
    }
    let t = total.into_inner().unwrap();
    eprintln!(
        "{test}: {count} seeds clean: {} requests succeeded, {} failed with an error, {} died \
         with their client, {} crashes, {} go-back-N rollbacks, {} Timely updates, {} packets \
         paced by the wheel ({} dropped there by rollbacks), {} sends read late (deferred DMA); \
         the longest wait for a continuation {} ms (bound {} ms)",
        t.ok,
        t.failed,
        t.void,
        t.crashes,
        t.retransmissions,
        t.timely_updates,
        t.wheel_inserted,
        t.wheel_stale,
        t.dma_deferred,
        t.max_wait_ns / MS,
        WAIT_BOUND_NS / MS
    );
    assert!(t.ok > 0, "nothing succeeded: the sweep tested nothing");
    t
}

#[test]
fn sweep_simulated_network() {
    sweep::<SimNetWorld<false>>("sweep_simulated_network", 1000);
}

/// The sweep with the NIC reading every send later than `tx_burst`: a TX
/// drain missing before a buffer is reused or freed fails the seed. A
/// tenth of the seeds (at least 20) of the plain sweep.
#[test]
fn sweep_simulated_network_deferred_dma() {
    let seeds = std::env::var("ERPC_DST_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(100, |n| (n / 10).max(20));
    let (first, count) = seeds_or(seeds);
    let t = sweep_range::<SimNetWorld<true>>("sweep_simulated_network_deferred_dma", first, count);
    assert!(t.dma_deferred > 0, "no send was read late: the mode is off");
}

#[test]
fn sweep_device_model() {
    let seeds = std::env::var("ERPC_DST_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(100, |n| (n / 10).max(20));
    let (first, count) = seeds_or(seeds);
    sweep_range::<DevNet<false>>("sweep_device_model", first, count);
}

/// The device-model sweep with the NICs gathering every send later than
/// its doorbell: a TX drain missing before a buffer is reused or freed
/// fails the seed. A fifth of the device-model seeds (at least 10).
#[test]
fn sweep_device_model_deferred_dma() {
    let seeds = std::env::var("ERPC_DST_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(20, |n| (n / 50).max(10));
    let (first, count) = seeds_or(seeds);
    let t = sweep_range::<DevNet<true>>("sweep_device_model_deferred_dma", first, count);
    assert!(t.dma_deferred > 0, "no send was read late: the mode is off");
}

/// Seeds outside the default sweeps that once failed, run every time:
/// 1516 (simulated network) and 122 (device model) restart an Rpc while
/// SM packets are lost; the dropped Rpc's disconnects still in progress
/// and its retried ones were not handed to its Nexus, and a served server
/// session outlived the run.
#[test]
fn sweep_regressions() {
    sweep_range::<SimNetWorld<false>>("sweep_regressions", 1516, 1);
    sweep_range::<DevNet<false>>("sweep_regressions", 122, 1);
}
