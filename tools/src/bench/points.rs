//! eRPC's measured points on a [`Testbed`](super::Testbed): connect the
//! two nodes, warm up, measure, drain.

use std::time::{Duration, Instant};

use erpc::{Rpc, RpcConfig};
use mlx5::QueueConfig;
use transport::Transport;
use transport::mlx5::Mlx5Transport;

use crate::memory::node_bytes;

use super::settings::Stall;
use super::workload::{first_error, summarize};
use super::{
    BenchError, CONNECT_ROUNDS, Ctx, DATA_PORT, DRAIN_ROUNDS, Outcome, Point, Progress,
    STALL_ROUNDS, Stop, Testbed, UDP_CONNECT_TIMEOUT, issue, new_ctx, register, sessions_per_node,
};

/// What a run can switch off to measure it (the factor analysis): the
/// Rpc's settings, the queue sets' and the mlx5 transport's postlist. The
/// default is everything on, as a user would run it.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// The Rpcs' settings (congestion control and its bypasses, zero-copy
    /// RX, preallocated responses).
    pub rpc: RpcConfig,
    /// The queue sets' settings (the UDP port is set per node).
    pub queue: QueueConfig,
    /// Frames per doorbell.
    pub postlist: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            rpc: RpcConfig::default(),
            queue: QueueConfig::default(),
            postlist: transport::mlx5::POSTLIST,
        }
    }
}

/// eRPC at one point on a testbed, for `dur` after `warmup`.
pub fn erpc_on<W: Testbed>(
    w: &W,
    knobs: &Knobs,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Outcome, BenchError>
where
    W::B: 'static,
{
    erpc_until(w, knobs, p, Stop::Time { dur, warmup }, progress)
}

/// eRPC at one point on a testbed until `stop`.
pub fn erpc_until<W: Testbed>(
    w: &W,
    knobs: &Knobs,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<Outcome, BenchError>
where
    W::B: 'static,
{
    type R<B> = Rpc<Mlx5Transport<B>, Ctx>;
    let mut nexuses = Vec::new();
    for i in 0..2 {
        let n = register::<Mlx5Transport<W::B>>(w.nexus(&format!("node{i}:31850")))
            .build()
            .map_err(|e| BenchError::setup(format!("Nexus of node {i}"), e))?;
        nexuses.push(n);
    }
    let uris: Vec<String> = nexuses.iter().map(|n| n.uri().to_string()).collect();
    let mut nodes: Vec<(R<W::B>, Ctx)> = Vec::new();
    for (i, nexus) in nexuses.iter().enumerate() {
        let mut rpc = Rpc::builder(
            nexus,
            w.transport(i, DATA_PORT + i as u16, knobs)?,
            w.allocator(i, node_bytes(p.size, p.window))?,
        )
        .id(i as u8)
        .config(knobs.rpc)
        .build()
        .map_err(|e| BenchError::setup(format!("Rpc of node {i}"), e))?;
        let c = new_ctx(&mut rpc, p)?;
        nodes.push((rpc, c));
    }
    let out = run_points(&mut nodes, &uris, p, stop, progress, || w.step());
    // Let requests in flight complete before the buffers go back (under
    // heavy loss a large message needs seconds of retransmissions).
    let done_before: u64 = nodes.iter().map(|(_, c)| c.completed).sum();
    for _ in 0..DRAIN_ROUNDS {
        if nodes.iter().all(|(_, c)| c.in_flight == 0) {
            break;
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        w.step();
    }
    let mut out = out?;
    out.drained = nodes.iter().map(|(_, c)| c.completed).sum::<u64>() - done_before;
    out.unfinished = nodes.iter().map(|(_, c)| c.in_flight as u64).sum();
    out.queues = nodes
        .iter()
        .map(|(r, _)| r.transport().queue_set().snapshot())
        .collect();
    out.retransmissions = nodes.iter().map(|(r, _)| r.stats().retransmissions).sum();
    out.tx_flushes = nodes.iter().map(|(r, _)| r.stats().tx_flushes).sum();
    for (r, c) in nodes.iter_mut() {
        while let Some((a, b)) = c.pool.pop() {
            r.free_msg_buffer(a);
            r.free_msg_buffer(b);
        }
    }
    Ok(out)
}

/// Connects the nodes to each other, warms up, measures.
pub(super) fn run_points<T: Transport + 'static>(
    nodes: &mut [(Rpc<T, Ctx>, Ctx)],
    uris: &[String],
    p: Point,
    stop: Stop,
    progress: &Progress,
    mut step: impl FnMut(),
) -> Result<Outcome, BenchError> {
    for (i, (rpc, ctx)) in nodes.iter_mut().enumerate() {
        let peer = 1 - i;
        for _ in 0..sessions_per_node(p) {
            let sn = rpc.create_session(&uris[peer], peer as u8).map_err(|e| {
                BenchError::setup(format!("session from node {i} to node {peer}"), e)
            })?;
            ctx.sessions.push(sn);
        }
    }
    let t = Instant::now();
    let virtual_time = nodes[0].0.nexus().clock().is_virtual();
    for round in 0.. {
        if nodes
            .iter()
            .all(|(r, c)| c.sessions.iter().all(|&sn| r.is_connected(sn)))
        {
            break;
        }
        let gave_up = if virtual_time {
            round >= CONNECT_ROUNDS
        } else {
            t.elapsed() >= UDP_CONNECT_TIMEOUT
        };
        if gave_up {
            let states: Vec<String> = nodes
                .iter()
                .enumerate()
                .map(|(i, (r, c))| {
                    let st: Vec<_> = c.sessions.iter().map(|&sn| r.session_state(sn)).collect();
                    format!("node {i}: {st:?}")
                })
                .collect();
            return Err(BenchError::Run(format!(
                "sessions did not connect ({})",
                states.join(", ")
            )));
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        step();
    }
    stop.phase(progress, &format!("B = {}", p.batch));
    let mut clock = MeasureClock::new(stop.warmup());
    let mut stall = Stall::new();
    loop {
        if clock.tick(progress) {
            for (_, c) in nodes.iter_mut() {
                c.completed = 0;
                c.lat.reset();
            }
        }
        if let Some(m) = clock.measured() {
            let done: u64 = nodes.iter().map(|(_, c)| c.completed).sum();
            if stop.reached(m, done, p.min_rpcs) {
                break;
            }
            if let Stop::Count(n) = stop
                && stall.stalled(done, 64)
            {
                progress.clear();
                return Err(BenchError::Run(format!(
                    "B = {}: no RPC completed in {STALL_ROUNDS} event-loop rounds \
                     ({done} of the {n} counted)",
                    p.batch
                )));
            }
        }
        for _ in 0..64 {
            for (r, c) in nodes.iter_mut() {
                issue(r, c, p);
                r.run_event_loop_once(c);
            }
            step();
        }
        if let Some(e) = first_error(nodes.iter_mut().map(|(_, c)| c)) {
            progress.clear();
            return Err(e);
        }
    }
    let elapsed = clock.measured().unwrap_or_default();
    progress.clear();
    Ok(summarize(
        &nodes.iter().map(|(_, c)| c).collect::<Vec<_>>(),
        elapsed,
    ))
}

/// The wall clock of one measured run: `warmup`, then the measured
/// interval (an eRPC point and its raw-echo reference keep time alike).
pub(super) struct MeasureClock {
    start: Instant,
    warmup: Duration,
    /// When the measured interval began.
    t0: Option<Instant>,
}

impl MeasureClock {
    pub(super) fn new(warmup: Duration) -> MeasureClock {
        MeasureClock {
            start: Instant::now(),
            warmup,
            t0: None,
        }
    }

    /// Advances the progress bar; true exactly once, when the warm-up
    /// has just ended (the caller zeroes its counters then).
    pub(super) fn tick(&mut self, progress: &Progress) -> bool {
        let now = Instant::now();
        progress.tick(now - self.start);
        if self.t0.is_none() && now - self.start >= self.warmup {
            self.t0 = Some(now);
            return true;
        }
        false
    }

    /// Time since the measured interval began (`None` while warming up).
    pub(super) fn measured(&self) -> Option<Duration> {
        self.t0.map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{DeviceModel, raw_echo_on};
    use crate::memory::MemoryPlan;

    /// A counted run on the device model stops on its count alone, and the
    /// same count is the same work: the same RPCs and round trips
    /// completed every time (what tools/bench-callgrind.sh relies on).
    #[test]
    fn counted_runs_on_the_device_model_are_the_same_work_every_time() {
        let p = |batch| Point {
            batch,
            window: 60,
            size: 32,
            min_rpcs: 0,
        };
        let plan = MemoryPlan::decide("bench unit test", crate::memory::default_bench_pages());
        let progress = Progress::hidden();
        let run = || -> (Vec<u64>, Vec<u64>) {
            let dm = DeviceModel::new(plan.clone(), None, false).unwrap();
            let mut erpc = Vec::new();
            let mut raw = Vec::new();
            for b in [1, 8] {
                let r = raw_echo_on(&dm, p(b), Stop::Count(3000), &progress).unwrap();
                raw.push(r.round_trips);
                let o =
                    erpc_until(&dm, &Knobs::default(), p(b), Stop::Count(3000), &progress).unwrap();
                assert_eq!(o.unfinished, 0);
                erpc.push(o.completed);
            }
            (erpc, raw)
        };
        let (erpc, raw) = run();
        for n in erpc.iter().chain(&raw) {
            // At most one check (64 rounds) past the count: with 120
            // requests in flight, well under 64 * 120 more.
            assert!((3000..3000 + 64 * 120).contains(n), "{erpc:?} {raw:?}");
        }
        assert_eq!(run(), (erpc, raw));
    }
}
