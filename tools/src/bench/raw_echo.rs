//! The reference of every eRPC point: a raw echo of eRPC-sized frames
//! over the same transport, with no eRPC.

use std::collections::VecDeque;
use std::time::Instant;

use arrayvec::ArrayVec;
use hdrhistogram::Histogram;
use mempool::Allocator;
use transport::{MAX_DATA_PER_PKT, PKTHDR_BYTES, RxRing, Transport, TxItem};

use super::points::MeasureClock;
use super::settings::Stall;
use super::workload::histogram;
use super::{
    BenchError, Knobs, Point, Progress, RAW_ECHO_PORT, STALL_ROUNDS, Stop, Testbed,
    packets_per_direction, sessions_per_node,
};

/// Data bytes of the raw echo's largest frames: eRPC's packet for
/// single-packet messages, a full MTU otherwise (its other frames have
/// the sizes of eRPC's: see [`raw_echo`]).
pub fn raw_echo_data_bytes(size: usize) -> usize {
    size.min(MAX_DATA_PER_PKT)
}

/// Request frames one node of the raw echo keeps on the wire at once for
/// point `p`, given `ring_entries` RX slots per node: every frame of the
/// window's messages, but no more than eRPC's credits allow (a session's
/// credits bound the requests and requests for response it has
/// unanswered, and the point opens [`sessions_per_node`] sessions), nor
/// more than half the RX ring (a node receives the peer's requests and the
/// answers to its own; the raw echo has no loss recovery, so it must not
/// overrun the ring). Never below the window: a one-packet point keeps its
/// whole window on the wire, as eRPC does.
pub fn raw_echo_frames_in_flight(p: Point, ring_entries: usize) -> usize {
    let k = packets_per_direction(p.size);
    (p.window * k)
        .min(sessions_per_node(p) * erpc::SESSION_CREDITS)
        .min(ring_entries / 2)
        .max(p.window)
}

/// The raw-echo reference of one eRPC point, between two transports of a
/// testbed (no eRPC): see [`raw_echo`].
pub fn raw_echo_on<W: Testbed>(
    w: &W,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<RawEcho, BenchError> {
    let mut a = w.transport(0, RAW_ECHO_PORT, &Knobs::default())?;
    let mut b = w.transport(1, RAW_ECHO_PORT + 1, &Knobs::default())?;
    let (mut aa, mut ab) = (w.allocator(0, 2 << 20)?, w.allocator(1, 2 << 20)?);
    raw_echo(
        [&mut a, &mut b],
        [&mut aa, &mut ab],
        p,
        stop,
        progress,
        || w.step(),
    )
}

/// What a raw echo measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawEcho {
    /// Round trips completed per second by both nodes together.
    pub round_trips_per_sec: f64,
    /// Median round-trip time, µs, from the request's batch being queued
    /// to its response (as eRPC's latency is timed).
    pub median_us: f64,
    /// Round trips completed while measuring, both nodes together (as
    /// [`Outcome::completed`](super::Outcome::completed) counts RPCs).
    pub round_trips: u64,
}

/// First payload byte of a raw-echo packet: a request (answered) or a
/// response (completes a round trip).
const RAW_REQ: u8 = 0;
const RAW_RESP: u8 = 1;

/// The three frame sizes of a raw-echo message (see [`raw_echo_frame`]).
const FULL: usize = 0;
const LAST: usize = 1;
const SMALL: usize = 2;

/// Which of the pre-built frames (`FULL`, `LAST` or `SMALL`) is frame `j`
/// of a message of `n` data packets, each way: the frame eRPC sends there.
/// Requests: the request's `n` data packets (all full but the last), then
/// `n − 1` header-only requests for response. Answers: a header-only
/// credit return for each request packet but the last, then the
/// response's `n` data packets.
fn raw_echo_frame(n: usize, j: usize, answer: bool) -> usize {
    let data = |i: usize| if i + 1 < n { FULL } else { LAST };
    match (answer, j < n, j + 1 < n) {
        (false, true, _) => data(j),
        (false, false, _) => SMALL,
        (true, _, true) => SMALL,
        (true, _, false) => data(j + 1 - n),
    }
}

/// Frame bytes of `FULL`, `LAST` and `SMALL` for messages of `size` bytes.
fn raw_echo_frame_bytes(size: usize) -> [usize; 3] {
    let n = size.div_ceil(MAX_DATA_PER_PKT).max(1);
    [
        PKTHDR_BYTES + MAX_DATA_PER_PKT,
        PKTHDR_BYTES + (size - (n - 1) * MAX_DATA_PER_PKT),
        PKTHDR_BYTES,
    ]
}

/// One node of the raw echo: what eRPC's node does with packets, without
/// eRPC. Its request and answer frames are pre-built, one per size
/// (headers filled once), and sent as often as needed.
struct EchoNode<'a, T: Transport> {
    t: &'a mut T,
    ring: T::Ring,
    head: usize,
    route: T::Route,
    /// Request frames and answer frames, by `FULL`, `LAST`, `SMALL`, with
    /// their lengths.
    req: [mempool::Buffer; 3],
    resp: [mempool::Buffer; 3],
    lens: [usize; 3],
    /// Data packets per message ([`raw_echo_frame`]'s `n`).
    data_pkts: usize,
    /// Frame index (in its message) of the next request frame to send, and
    /// of the next answer.
    req_idx: usize,
    ans_idx: usize,
    /// Messages (round trips) issued and not yet answered in full.
    in_flight: usize,
    /// Request and response frames queued for the next flush (refused
    /// ones stay).
    queued_req: usize,
    queued_resp: usize,
    /// Frames per message each way ([`packets_per_direction`]).
    frames_per_msg: usize,
    /// Request frames sent and not yet answered, and the most allowed
    /// ([`raw_echo_frames_in_flight`]).
    frames_out: usize,
    frames_cap: usize,
    /// Response frames received of the oldest message in flight.
    resp_frames: usize,
    /// Round trips completed.
    done: u64,
    /// Send time of each request in flight, oldest first (the peer answers
    /// in arrival order and the network keeps it), and the round-trip
    /// times: the same clock reads and histogram records per request as
    /// eRPC's `issue` and continuation, so that the reference also carries
    /// the benchmark's own timing work, and the raw echo's latency is
    /// known.
    sent: VecDeque<Instant>,
    lat: Histogram<u64>,
}

impl<'a, T: Transport> EchoNode<'a, T> {
    /// Node of transport `t`, sending to `route`: takes its RX ring and
    /// builds its six frames (requests and answers of each size) in
    /// buffers from `alloc`, for point `p`.
    fn new(
        t: &'a mut T,
        route: T::Route,
        alloc: &mut Allocator,
        p: Point,
    ) -> Result<EchoNode<'a, T>, BenchError> {
        let lens = raw_echo_frame_bytes(p.size);
        let ring = t
            .take_rx_ring()
            .ok_or_else(|| BenchError::Run("raw echo: the RX ring was taken".into()))?;
        // Six frames: requests and answers of each size.
        let mut bufs: ArrayVec<mempool::Buffer, 6> = ArrayVec::new();
        for &len in lens.iter().chain(&lens) {
            match alloc.alloc(len) {
                Ok(b) => bufs.push(b),
                Err(e) => {
                    for b in bufs {
                        alloc.free(b);
                    }
                    return Err(BenchError::setup("raw echo: packet buffer", e));
                }
            }
        }
        let frames_cap = raw_echo_frames_in_flight(p, ring.entries());
        for (k, b) in bufs.iter_mut().enumerate() {
            let (len, kind) = (lens[k % 3], if k < 3 { RAW_REQ } else { RAW_RESP });
            let s = b.as_mut_slice();
            t.fill_headroom(&route, &mut s[..transport::HEADROOM_BYTES], len);
            s[transport::HEADROOM_BYTES..len].fill(0);
            s[transport::HEADROOM_BYTES] = kind;
        }
        let mut bufs = bufs.into_iter();
        let mut three = || -> [mempool::Buffer; 3] {
            std::array::from_fn(|_| bufs.next().expect("six buffers"))
        };
        let (req, resp) = (three(), three());
        Ok(EchoNode {
            t,
            ring,
            head: 0,
            route,
            req,
            resp,
            lens,
            data_pkts: p.size.div_ceil(MAX_DATA_PER_PKT).max(1),
            req_idx: 0,
            ans_idx: 0,
            in_flight: 0,
            queued_req: 0,
            queued_resp: 0,
            frames_per_msg: packets_per_direction(p.size),
            frames_out: 0,
            frames_cap,
            resp_frames: 0,
            done: 0,
            sent: VecDeque::with_capacity(p.window),
            lat: histogram(),
        })
    }

    /// Queues a batch of request messages if the window allows (eRPC's
    /// `issue`).
    fn issue(&mut self, p: Point) {
        if self.in_flight + p.batch <= p.window {
            self.in_flight += p.batch;
            self.queued_req += p.batch * self.frames_per_msg;
            let now = Instant::now();
            for _ in 0..p.batch {
                self.sent.push_back(now);
            }
        }
    }

    /// One event-loop iteration: an RX burst (each request frame queues a
    /// response frame; the last response frame of a message completes a
    /// round trip), then the TX flush in bursts of the transport's
    /// maximum, requests first and no more of them than the frame limit
    /// allows; what the transport refuses stays queued.
    fn poll(&mut self) {
        let n = self.t.rx_burst();
        if n > 0 {
            let entries = self.ring.entries();
            for k in 0..n {
                match self
                    .ring
                    .packet((self.head + k) % entries)
                    .and_then(|p| p.first())
                {
                    Some(&RAW_REQ) => self.queued_resp += 1,
                    Some(&RAW_RESP) if self.frames_out > 0 => {
                        self.frames_out -= 1;
                        self.resp_frames += 1;
                        if self.resp_frames == self.frames_per_msg {
                            self.resp_frames = 0;
                            self.in_flight -= 1;
                            self.done += 1;
                            if let Some(t) = self.sent.pop_front() {
                                let ns = t.elapsed().as_nanos() as u64;
                                let _ = self.lat.record(ns.max(1));
                            }
                        }
                    }
                    // Malformed, foreign or a response to nothing: not a
                    // round trip.
                    _ => {}
                }
            }
            self.head = (self.head + n) % entries;
            self.t.post_recvs(&mut self.ring, n);
        }
        let chunk = self.t.tx_burst_max().min(16);
        loop {
            let room = self.frames_cap - self.frames_out;
            let nreq = self.queued_req.min(room).min(chunk);
            if nreq + self.queued_resp == 0 {
                break;
            }
            let k = (nreq + self.queued_resp).min(chunk);
            let (route, req, resp, lens) = (&self.route, &self.req, &self.resp, &self.lens);
            let (n, fpm, ri, ai) = (
                self.data_pkts,
                self.frames_per_msg,
                self.req_idx,
                self.ans_idx,
            );
            // Only the `k` items sent are built (building all 16 for a
            // burst of one or two made the reference slower than the
            // point it measures at B = 1).
            let items: ArrayVec<TxItem<'_, T::Route>, 16> = (0..k)
                .map(|j| {
                    let (bufs, f) = if j < nreq {
                        (req, raw_echo_frame(n, (ri + j) % fpm, false))
                    } else {
                        (resp, raw_echo_frame(n, (ai + j - nreq) % fpm, true))
                    };
                    let buf = &bufs[f];
                    TxItem::contiguous(route, &buf.as_slice()[..lens[f]], buf.iova(), buf.lkey())
                })
                .collect();
            let sent = self.t.tx_burst(&items).min(k);
            let sent_req = sent.min(nreq);
            self.queued_req -= sent_req;
            self.frames_out += sent_req;
            self.queued_resp -= sent - sent_req;
            self.req_idx = (self.req_idx + sent_req) % fpm;
            self.ans_idx = (self.ans_idx + sent - sent_req) % fpm;
            if sent < k {
                break;
            }
        }
    }
}

/// The like-for-like reference of an eRPC point: two nodes, each both
/// client and server as in eRPC's run, each sending request messages in
/// batches of `p.batch` with at most `p.window` in flight and answering
/// the other's, polled and flushed the way the eRPC event loop does (one
/// RX burst, then one TX flush, per node per iteration, `step` after
/// both), after the same warm-up as the eRPC point, until the same `stop`.
///
/// A message is the packets an RPC of `p.size` bytes puts on the wire each
/// way ([`packets_per_direction`]: one for a one-packet RPC; for an
/// N-packet one, 2N − 1, eRPC's requests and requests for response one way
/// and its credit returns and responses back), each frame of the size
/// eRPC's is (full data packets, the last one's size, header-only control
/// packets), each request frame answered by one frame,
/// with as many request frames unanswered as eRPC's credits allow
/// ([`raw_echo_frames_in_flight`]) and without eRPC's wait for the first
/// response packet before the requests for the rest: the same packets, at
/// least eRPC's parallelism, none of its protocol work. Returns round
/// trips completed per second of the measured interval by both nodes
/// together, counted as eRPC counts RPCs; eRPC's RPC rate divided by this
/// is at most 1 unless the measurement is wrong (or the machine changed
/// between the two).
///
/// The reference has no loss recovery: it must run on a lossless link
/// (erpc-bench applies `--loss` to the eRPC points only).
pub fn raw_echo<T: Transport>(
    t: [&mut T; 2],
    mut alloc: [&mut Allocator; 2],
    p: Point,
    stop: Stop,
    progress: &Progress,
    mut step: impl FnMut(),
) -> Result<RawEcho, BenchError> {
    let [ta, tb] = t;
    let routes = [
        ta.resolve(&tb.local_routing_info()),
        tb.resolve(&ta.local_routing_info()),
    ];
    let mut nodes: Vec<EchoNode<'_, T>> = Vec::with_capacity(2);
    let mut failed = None;
    for (i, (t, route)) in [ta, tb].into_iter().zip(routes).enumerate() {
        let route =
            route.map_err(|e| BenchError::setup(format!("raw echo: resolving node {i}'s peer"), e));
        match route.and_then(|route| EchoNode::new(t, route, alloc[i], p)) {
            Ok(n) => nodes.push(n),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let mut elapsed = 0.0;
    if failed.is_none() {
        // The same warm-up as the eRPC point it is the reference of
        // (first touches of ring and buffer memory, caches, the clock
        // speed settling), then the same measured interval (or, counted,
        // no warm-up and the same count).
        stop.phase(progress, &format!("raw echo, B = {}", p.batch));
        let mut clock = MeasureClock::new(stop.warmup());
        let mut stall = Stall::new();
        loop {
            if clock.tick(progress) {
                for n in nodes.iter_mut() {
                    n.done = 0;
                    n.lat.reset();
                }
            }
            if let Some(m) = clock.measured() {
                let done: u64 = nodes.iter().map(|n| n.done).sum();
                if stop.reached(m, done, 0) {
                    break;
                }
                if let Stop::Count(n) = stop
                    && stall.stalled(done, 64)
                {
                    failed = Some(BenchError::Run(format!(
                        "raw echo, B = {}: no round trip completed in {STALL_ROUNDS} \
                         event-loop rounds ({done} of the {n} counted)",
                        p.batch
                    )));
                    break;
                }
            }
            for _ in 0..64 {
                for n in nodes.iter_mut() {
                    n.issue(p);
                    n.poll();
                }
                step();
            }
        }
        elapsed = clock.measured().unwrap_or_default().as_secs_f64();
        progress.clear();
    }
    let done: u64 = nodes.iter().map(|n| n.done).sum();
    let mut lat = histogram();
    for n in &nodes {
        // Same bounds on both sides: `add` cannot fail.
        let _ = lat.add(&n.lat);
    }
    for (i, n) in nodes.into_iter().enumerate() {
        for b in n.req.into_iter().chain(n.resp) {
            alloc[i].free(b);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if done == 0 {
        let within = match stop {
            Stop::Time { dur, .. } => format!("{:.1} s", dur.as_secs_f64()),
            Stop::Count(_) => "the run".into(),
        };
        return Err(BenchError::Run(format!(
            "raw echo: no message of {} bytes came back in {within}",
            p.size
        )));
    }
    Ok(RawEcho {
        round_trips_per_sec: done as f64 / elapsed,
        median_us: lat.value_at_quantile(0.5) as f64 / 1000.0,
        round_trips: done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{DeviceModel, ratio_to_raw};
    use crate::memory::MemoryPlan;

    #[test]
    fn multi_packet_rpcs_are_compared_per_packet() {
        assert_eq!(packets_per_direction(0), 1);
        assert_eq!(packets_per_direction(32), 1);
        assert_eq!(packets_per_direction(MAX_DATA_PER_PKT), 1);
        assert_eq!(packets_per_direction(MAX_DATA_PER_PKT + 1), 3);
        assert_eq!(packets_per_direction(2000), 5);
        assert_eq!(raw_echo_data_bytes(2000), MAX_DATA_PER_PKT);
        assert_eq!(ratio_to_raw(100.0, 1000.0), Some(0.1));
        assert_eq!(ratio_to_raw(100.0, 0.0), None);
    }

    /// The raw echo's frames are eRPC's: for 3 data packets, requests
    /// full, full, last, then two header-only requests for response;
    /// answers two header-only credit returns, then full, full, last.
    #[test]
    fn raw_echo_frames_have_the_sizes_of_erpcs() {
        let req: Vec<usize> = (0..5).map(|j| raw_echo_frame(3, j, false)).collect();
        let ans: Vec<usize> = (0..5).map(|j| raw_echo_frame(3, j, true)).collect();
        assert_eq!(req, [FULL, FULL, LAST, SMALL, SMALL]);
        assert_eq!(ans, [SMALL, SMALL, FULL, FULL, LAST]);
        assert_eq!(raw_echo_frame(1, 0, false), LAST);
        assert_eq!(raw_echo_frame(1, 0, true), LAST);
        let size = 2 * MAX_DATA_PER_PKT + 7;
        assert_eq!(packets_per_direction(size), 5);
        assert_eq!(
            raw_echo_frame_bytes(size),
            [
                PKTHDR_BYTES + MAX_DATA_PER_PKT,
                PKTHDR_BYTES + 7,
                PKTHDR_BYTES
            ]
        );
        assert_eq!(raw_echo_frame_bytes(32)[LAST], PKTHDR_BYTES + 32);
        assert_eq!(raw_echo_frame_bytes(0)[LAST], PKTHDR_BYTES);
    }

    #[test]
    fn the_raw_echo_keeps_as_many_frames_on_the_wire_as_erpc_may() {
        let p = |window, size| Point {
            batch: 1,
            window,
            size,
            min_rpcs: 0,
        };
        // One packet: the window, whatever the ring (as before).
        assert_eq!(raw_echo_frames_in_flight(p(60, 32), 4096), 60);
        assert_eq!(raw_echo_frames_in_flight(p(1024, 32), 512), 1024);
        // 4 KiB: k frames a message; one session's credits bound 8 messages.
        let k = packets_per_direction(4096);
        assert!(k > 1);
        assert_eq!(
            raw_echo_frames_in_flight(p(8, 4096), 4096),
            (8 * k).min(erpc::SESSION_CREDITS)
        );
        // Two sessions for a window of 16: twice the credits.
        assert_eq!(
            raw_echo_frames_in_flight(p(16, 4096), 4096),
            (16 * k).min(2 * erpc::SESSION_CREDITS)
        );
        // Half the ring at most.
        assert_eq!(raw_echo_frames_in_flight(p(1024, 4096), 1024), 1024);
        assert_eq!(raw_echo_frames_in_flight(p(512, 4096), 512), 512);
        assert_eq!(raw_echo_frames_in_flight(p(64, 4096), 64), 64);
    }

    /// A multi-packet raw echo moves whole messages: every round trip is
    /// `packets_per_direction` frames each way on the device model's wire,
    /// and it completes with its frame limit below the window's frames.
    #[test]
    fn a_multi_packet_raw_echo_moves_every_frame_of_each_message() {
        let size = 4096;
        let k = packets_per_direction(size) as u64;
        let plan = MemoryPlan::decide("bench unit test", crate::memory::default_bench_pages());
        let dm = DeviceModel::new(plan, None, false).unwrap();
        let p = Point {
            batch: 8,
            window: 8,
            size,
            min_rpcs: 0,
        };
        let r = raw_echo_on(&dm, p, Stop::Count(500), &Progress::hidden()).unwrap();
        assert!(r.round_trips >= 500, "{r:?}");
        let frames: u64 = dm.nics().iter().map(|n| n.stats().tx_frames).sum();
        // Both nodes' round trips, each 2k frames; at most the window's
        // messages (both nodes) still on the wire at the end.
        let min = r.round_trips * 2 * k;
        let max = (r.round_trips + 2 * 8) * 2 * k;
        assert!((min..=max).contains(&frames), "{frames} frames for {r:?}");
        assert_eq!(
            dm.nics()
                .iter()
                .map(|n| n.drops(mlx5_sim::DropReason::OutOfBuffer))
                .sum::<u64>(),
            0
        );
    }
}
