//! Deterministic in-process simulation: a seeded, single-threaded network
//! of [`SimTransport`] endpoints on a shared [`VirtualClock`], plus an
//! in-memory session-management hub ([`SimSmHub`]) stepped by the same
//! clock.
//!
//! Frames are real Ethernet/IPv4/UDP frames (headers built with
//! `transport::wire`, validated on arrival); each link can lose, duplicate,
//! reorder, corrupt and delay them, from the seed. Nothing moves until
//! [`SimNet::advance`] is called, so a scenario that polls its Rpcs and
//! advances the clock in one thread replays exactly from its seed.
//!
//! The RX ring has the shape of a NIC ring ([`transport::RxRing`]): packets
//! land in slots, the Rpc reads them in place, and slots come back with
//! `post_recvs`; a full ring drops (and counts) arrivals.

pub mod fuzz;
mod ring;
mod sm_hub;

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::net::Ipv4Addr;
use std::rc::Rc;
use std::sync::Arc;

use transport::wire::{FrameTemplate, build_headroom, parse_frame};
use transport::{
    HEADROOM_BYTES, MTU, RoutingInfo, RxRing, Transport, TransportError, TransportStats, TxItem,
};

pub use crate::clock::VirtualClock;
pub use sm_hub::{SimSmHub, SmHubConfig, SmHubStats};

use crate::rng::Rng;
use ring::RingMem;

/// Most frames [`SimNet::capture`] keeps between takes.
const CAPTURE_MAX: usize = 1 << 16;

/// Fault injection and timing of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkConfig {
    /// One-way delay.
    pub delay_ns: u64,
    /// Extra random delay in `0..=jitter_ns` (order is kept unless a
    /// packet is picked for reordering).
    pub jitter_ns: u64,
    /// Loss probability, per million packets.
    pub loss_ppm: u32,
    /// Duplication probability, per million.
    pub dup_ppm: u32,
    /// Probability that a packet may overtake earlier ones, per million.
    pub reorder_ppm: u32,
    /// Probability that a bit of the frame is flipped on the wire, per
    /// million. As on a real Ethernet link, the receiving port's frame
    /// check sequence catches it and the frame is dropped (counted as
    /// `fcs_errors`): to eRPC a corrupted frame is a lost one.
    pub corrupt_ppm: u32,
    /// Probability, per million, that one byte after the IPv4 header is
    /// flipped *past* the frame check (a faulty switch or NIC) and the
    /// frame is delivered. eRPC, like the C++ eRPC, sends UDP checksum 0
    /// and relies on the Ethernet FCS, so such damage reaches it: header
    /// damage is dropped by its consistency checks, payload damage is
    /// delivered. For robustness tests that check nothing but survival.
    pub corrupt_undetected_ppm: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay_ns: 1_000,
            jitter_ns: 0,
            loss_ppm: 0,
            dup_ppm: 0,
            reorder_ppm: 0,
            corrupt_ppm: 0,
            corrupt_undetected_ppm: 0,
        }
    }
}

/// Settings of a simulated network.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Default link behaviour (overridable per pair of endpoints).
    pub link: LinkConfig,
    /// RX ring entries per endpoint.
    pub ring_entries: usize,
    /// Largest TX burst (the postlist).
    pub tx_burst_max: usize,
    /// Session-management hub settings.
    pub sm: SmHubConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            link: LinkConfig::default(),
            ring_entries: crate::consts::RX_RING_ENTRIES_DEFAULT,
            tx_burst_max: 16,
            sm: SmHubConfig::default(),
        }
    }
}

/// Network-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames handed to the network.
    pub sent: u64,
    /// Frames written into an RX ring.
    pub delivered: u64,
    /// Frames lost on purpose.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Frames allowed to overtake.
    pub reordered: u64,
    /// Frames damaged on the wire and dropped by the receiver's frame
    /// check.
    pub fcs_errors: u64,
    /// Frames damaged past the frame check and delivered.
    pub corrupted_undetected: u64,
    /// Arrivals dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Frames to an address no endpoint has.
    pub no_such_endpoint: u64,
    /// Frames from or to an endpoint that is down (crashed).
    pub endpoint_down: u64,
    /// `tx_burst` calls refused on purpose (a full send queue).
    pub tx_refused_bursts: u64,
}

struct InFlight {
    deliver_ns: u64,
    seq: u64,
    dst: usize,
    len: usize,
    /// Damaged on the wire: the receiver's frame check drops it.
    fcs_bad: bool,
    frame: Box<[u8]>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.deliver_ns, self.seq) == (o.deliver_ns, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.deliver_ns, self.seq).cmp(&(o.deliver_ns, o.seq))
    }
}

struct Endpoint {
    routing: RoutingInfo,
    ring: Rc<RingMem>,
    written: u64,
    reported: u64,
    reposted: u64,
    stats: TransportStats,
    /// Crashed: sends nothing, receives nothing.
    down: bool,
    /// `tx_burst` calls still to refuse (fault injection).
    refuse_bursts: u32,
    /// Restarts so far; a transport of an earlier incarnation is inert.
    generation: u32,
    /// Copies of the frames that reached this endpoint (`SimNet::capture`).
    captured: Option<Vec<Box<[u8]>>>,
}

struct NetInner {
    rng: Rng,
    cfg: SimConfig,
    endpoints: Vec<Endpoint>,
    links: Vec<Vec<Option<LinkConfig>>>,
    last_deliver_ns: Vec<Vec<u64>>,
    inflight: BinaryHeap<Reverse<InFlight>>,
    pool: Vec<Box<[u8]>>,
    seq: u64,
    stats: NetStats,
}

impl NetInner {
    fn link(&self, src: usize, dst: usize) -> LinkConfig {
        self.links[src][dst].unwrap_or(self.cfg.link)
    }

    fn frame_buf(&mut self) -> Box<[u8]> {
        self.pool
            .pop()
            .unwrap_or_else(|| vec![0u8; MTU].into_boxed_slice())
    }

    fn send(&mut self, now_ns: u64, src: usize, dst: usize, frame: Box<[u8]>, len: usize) {
        self.stats.sent += 1;
        if self.endpoints[src].down {
            self.stats.endpoint_down += 1;
            self.pool.push(frame);
            return;
        }
        let l = self.link(src, dst);
        if self.rng.chance_ppm(l.loss_ppm) {
            self.stats.lost += 1;
            self.pool.push(frame);
            return;
        }
        if self.rng.chance_ppm(l.dup_ppm) {
            self.stats.duplicated += 1;
            let mut copy = self.frame_buf();
            copy[..len].copy_from_slice(&frame[..len]);
            self.enqueue(now_ns, src, dst, copy, len, &l);
        }
        self.enqueue(now_ns, src, dst, frame, len, &l);
    }

    fn enqueue(
        &mut self,
        now_ns: u64,
        src: usize,
        dst: usize,
        mut frame: Box<[u8]>,
        len: usize,
        l: &LinkConfig,
    ) {
        let fcs_bad = self.rng.chance_ppm(l.corrupt_ppm);
        if self.rng.chance_ppm(l.corrupt_undetected_ppm) && len > HEADROOM_BYTES {
            self.stats.corrupted_undetected += 1;
            let at = HEADROOM_BYTES + self.rng.below((len - HEADROOM_BYTES) as u64) as usize;
            frame[at] ^= 1 << self.rng.below(8);
        }
        let jitter = if l.jitter_ns > 0 {
            self.rng.below(l.jitter_ns + 1)
        } else {
            0
        };
        let mut at = now_ns + l.delay_ns + jitter;
        if self.rng.chance_ppm(l.reorder_ppm) {
            self.stats.reordered += 1;
            at = now_ns + self.rng.below(l.delay_ns + jitter + 1);
        } else {
            at = at.max(self.last_deliver_ns[src][dst]);
            self.last_deliver_ns[src][dst] = at;
        }
        self.seq += 1;
        self.inflight.push(Reverse(InFlight {
            deliver_ns: at,
            seq: self.seq,
            dst,
            len,
            fcs_bad,
            frame,
        }));
    }

    fn deliver_due(&mut self, now_ns: u64) {
        while let Some(Reverse(top)) = self.inflight.peek() {
            if top.deliver_ns > now_ns {
                break;
            }
            let Some(Reverse(p)) = self.inflight.pop() else {
                break;
            };
            if p.fcs_bad {
                self.stats.fcs_errors += 1;
                self.endpoints[p.dst].stats.rx_errors += 1;
            } else {
                self.deliver(p.dst, &p.frame[..p.len]);
            }
            self.pool.push(p.frame);
        }
    }

    fn deliver(&mut self, dst: usize, frame: &[u8]) {
        let ep = &mut self.endpoints[dst];
        if ep.down {
            self.stats.endpoint_down += 1;
            return;
        }
        if let Some(c) = ep.captured.as_mut()
            && c.len() < CAPTURE_MAX
        {
            c.push(frame.into());
        }
        let entries = ep.ring.entries() as u64;
        if ep.written - ep.reposted >= entries {
            self.stats.rx_ring_full += 1;
            ep.stats.rx_errors += 1;
            return;
        }
        ep.stats.rx_pkts += 1;
        ep.stats.rx_bytes += frame.len() as u64;
        let idx = (ep.written % entries) as usize;
        match parse_frame(frame) {
            Ok(p) => {
                if p.dst_ip != ep.routing.ipv4 || p.dst_port != ep.routing.udp_port {
                    ep.stats.rx_not_for_us += 1;
                    return;
                }
                ep.ring.write(idx, Some(p.payload));
            }
            Err(e) => {
                use transport::FrameError as F;
                match e {
                    F::Short => ep.stats.rx_short += 1,
                    F::Oversize => ep.stats.rx_oversize += 1,
                    F::BadEthertype => ep.stats.rx_bad_ethertype += 1,
                    F::BadIp => ep.stats.rx_bad_ip += 1,
                    F::BadUdp => ep.stats.rx_bad_udp += 1,
                }
                ep.ring.write(idx, None);
            }
        }
        ep.written += 1;
        self.stats.delivered += 1;
    }
}

/// A simulated network: endpoints, links, a virtual clock and an SM hub.
#[derive(Clone)]
pub struct SimNet {
    inner: Rc<RefCell<NetInner>>,
    clock: VirtualClock,
    hub: Arc<SimSmHub>,
}

impl fmt::Debug for SimNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.inner.borrow();
        write!(
            f,
            "SimNet {{ now {} ns, {} endpoints, {} in flight, {:?} }}",
            self.clock.now_ns(),
            n.endpoints.len(),
            n.inflight.len(),
            n.stats
        )
    }
}

impl SimNet {
    /// A network with no endpoints, at time 0.
    pub fn new(cfg: SimConfig) -> SimNet {
        let clock = VirtualClock::new();
        let hub = Arc::new(SimSmHub::new(clock.clone(), cfg.seed ^ 0x5353_4d5f, cfg.sm));
        SimNet {
            inner: Rc::new(RefCell::new(NetInner {
                rng: Rng::new(cfg.seed),
                cfg,
                endpoints: Vec::new(),
                links: Vec::new(),
                last_deliver_ns: Vec::new(),
                inflight: BinaryHeap::with_capacity(1 << 14),
                pool: Vec::with_capacity(1 << 14),
                seq: 0,
                stats: NetStats::default(),
            })),
            clock,
            hub,
        }
    }

    /// The shared virtual clock.
    pub fn clock(&self) -> VirtualClock {
        self.clock.clone()
    }

    /// The [`crate::Clock`] to give each Nexus.
    pub fn erpc_clock(&self) -> crate::Clock {
        crate::Clock::Virtual(self.clock.clone())
    }

    /// The SM hub, as a Nexus SM link.
    pub fn sm_link(&self) -> Arc<dyn crate::SmLink> {
        self.hub.clone()
    }

    /// The SM hub itself (counters, fault settings).
    pub fn sm_hub(&self) -> &Arc<SimSmHub> {
        &self.hub
    }

    /// Current simulated time.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Adds an endpoint (a NIC port with its RX ring).
    pub fn add_transport(&self) -> SimTransport {
        let mut n = self.inner.borrow_mut();
        let ep = n.endpoints.len();
        assert!(ep < 60_000, "too many simulated endpoints");
        let ip = u32::from(Ipv4Addr::new(10, 0, 0, 0)) + ep as u32 + 1;
        let routing = RoutingInfo {
            mac: [0x02, 0, 0, 0, (ep >> 8) as u8, ep as u8],
            ipv4: Ipv4Addr::from(ip),
            udp_port: 20_000 + ep as u16,
            rxq_id: 0,
            // Steered by exact UDP port, like our mlx5 transport: a table
            // of one (a C++ DPDK peer divides by it).
            rss_table_size: 1,
        };
        let ring = RingMem::new(n.cfg.ring_entries);
        n.endpoints.push(Endpoint {
            routing,
            ring: ring.clone(),
            written: 0,
            reported: 0,
            reposted: 0,
            stats: TransportStats::default(),
            down: false,
            refuse_bursts: 0,
            generation: 0,
            captured: None,
        });
        for row in n.links.iter_mut() {
            row.push(None);
        }
        let count = n.endpoints.len();
        n.links.push(vec![None; count]);
        for row in n.last_deliver_ns.iter_mut() {
            row.push(0);
        }
        n.last_deliver_ns.push(vec![0; count]);
        let tx_burst_max = n.cfg.tx_burst_max;
        SimTransport {
            net: self.inner.clone(),
            clock: self.clock.clone(),
            ep,
            generation: 0,
            ring: Some(SimRing(ring)),
            routing,
            tx_burst_max,
        }
    }

    /// Crashes endpoint `ep`: from now on it sends and receives nothing
    /// (frames in flight to it are lost on arrival). Its transport stays
    /// usable as an object, so the process owning it can be torn down.
    pub fn crash(&self, ep: usize) {
        self.inner.borrow_mut().endpoints[ep].down = true;
    }

    /// Restarts crashed endpoint `ep` as a new NIC port at the same
    /// address (a restarted process binding the same port): an empty RX
    /// ring, new counters. Frames of the previous incarnation still in
    /// flight arrive at the new one.
    pub fn restart(&self, ep: usize) -> SimTransport {
        let mut n = self.inner.borrow_mut();
        let ring = RingMem::new(n.cfg.ring_entries);
        let e = &mut n.endpoints[ep];
        e.ring = ring.clone();
        e.written = 0;
        e.reported = 0;
        e.reposted = 0;
        e.stats = TransportStats::default();
        e.down = false;
        e.refuse_bursts = 0;
        e.generation += 1;
        let generation = e.generation;
        let routing = e.routing;
        let tx_burst_max = n.cfg.tx_burst_max;
        SimTransport {
            net: self.inner.clone(),
            clock: self.clock.clone(),
            ep,
            generation,
            ring: Some(SimRing(ring)),
            routing,
            tx_burst_max,
        }
    }

    /// Starts (`true`) or stops keeping a copy of every frame that
    /// reaches endpoint `ep`, exactly as it arrives (before validation and
    /// whether or not its RX ring has room), for [`SimNet::take_captured`]:
    /// a test that plays a peer (a C++ eRPC process) on a bare endpoint
    /// reads what is sent to it, headers and all. At most 65536 frames are
    /// kept between takes. Off by default (no cost).
    pub fn capture(&self, ep: usize, on: bool) {
        let mut n = self.inner.borrow_mut();
        let e = &mut n.endpoints[ep];
        match (on, e.captured.is_some()) {
            (true, false) => e.captured = Some(Vec::new()),
            (false, true) => e.captured = None,
            _ => {}
        }
    }

    /// The frames captured at endpoint `ep` since the last call, in
    /// arrival order.
    pub fn take_captured(&self, ep: usize) -> Vec<Box<[u8]>> {
        self.inner.borrow_mut().endpoints[ep]
            .captured
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Makes the next `bursts` `tx_burst` calls of endpoint `ep` accept
    /// nothing, as a NIC whose send queue is full.
    pub fn refuse_tx(&self, ep: usize, bursts: u32) {
        self.inner.borrow_mut().endpoints[ep].refuse_bursts = bursts;
    }

    /// Overrides the behaviour of the link from endpoint `src` to `dst`.
    pub fn set_link(&self, src: usize, dst: usize, cfg: LinkConfig) {
        self.inner.borrow_mut().links[src][dst] = Some(cfg);
    }

    /// The default link behaviour.
    pub fn default_link(&self) -> LinkConfig {
        self.inner.borrow().cfg.link
    }

    /// Changes the default link behaviour (pairs without an override).
    pub fn set_default_link(&self, cfg: LinkConfig) {
        self.inner.borrow_mut().cfg.link = cfg;
    }

    /// Moves time forward by `ns` and delivers every data frame and SM
    /// packet due by then.
    pub fn advance(&self, ns: u64) {
        self.clock.advance_ns(ns);
        let now = self.clock.now_ns();
        self.inner.borrow_mut().deliver_due(now);
        self.hub.deliver_due(now);
    }

    /// Time of the next pending delivery (data or SM), if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        let d = self.inner.borrow().inflight.peek().map(|r| r.0.deliver_ns);
        match (d, self.hub.next_event_ns()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Schedules an arbitrary frame (all headers included, at most an
    /// MTU) for endpoint `dst`, as if it came off the wire now (fuzzing,
    /// fault tests).
    pub fn inject_frame(&self, dst: usize, frame: &[u8]) {
        let now = self.clock.now_ns();
        let mut n = self.inner.borrow_mut();
        let len = frame.len().min(MTU);
        let mut f = n.frame_buf();
        f[..len].copy_from_slice(&frame[..len]);
        n.seq += 1;
        let seq = n.seq;
        n.inflight.push(Reverse(InFlight {
            deliver_ns: now,
            seq,
            dst,
            len,
            fcs_bad: false,
            frame: f,
        }));
    }

    /// Schedules `payload` (eRPC header + data) for endpoint `dst` in a
    /// valid Ethernet/IPv4/UDP frame from a stranger.
    pub fn inject_payload(&self, dst: usize, payload: &[u8]) {
        let routing = self.inner.borrow().endpoints[dst].routing;
        let len = (HEADROOM_BYTES + payload.len()).min(MTU);
        let mut f = [0u8; MTU];
        let t = FrameTemplate {
            dst_mac: routing.mac,
            src_mac: [2, 9, 9, 9, 9, 9],
            src_ip: Ipv4Addr::new(10, 9, 9, 9),
            dst_ip: routing.ipv4,
            src_port: 9,
            dst_port: routing.udp_port,
        };
        build_headroom(&t, &mut f, len);
        f[HEADROOM_BYTES..len].copy_from_slice(&payload[..len - HEADROOM_BYTES]);
        self.inject_frame(dst, &f[..len]);
    }

    /// Data frames in flight.
    pub fn in_flight(&self) -> usize {
        self.inner.borrow().inflight.len()
    }

    /// RX ring slots of endpoint `ep` holding packets not yet given back
    /// with `post_recvs` (0 when the Rpc leaked no ring entry).
    pub fn rx_held(&self, ep: usize) -> u64 {
        let n = self.inner.borrow();
        let e = &n.endpoints[ep];
        e.written - e.reposted
    }

    /// Network counters.
    pub fn stats(&self) -> NetStats {
        self.inner.borrow().stats
    }
}

/// A destination on the simulated network.
#[derive(Debug, Clone)]
pub struct SimRoute {
    ep: usize,
    template: FrameTemplate,
}

/// Read handle of a simulated RX ring (one per transport).
pub struct SimRing(Rc<RingMem>);

impl fmt::Debug for SimRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimRing({} entries)", self.0.entries())
    }
}

impl RxRing for SimRing {
    fn entries(&self) -> usize {
        self.0.entries()
    }

    fn packet(&self, idx: usize) -> Option<&[u8]> {
        self.0.packet(idx)
    }
}

/// One endpoint of a [`SimNet`]: a [`Transport`] whose frames cross the
/// simulated network.
pub struct SimTransport {
    net: Rc<RefCell<NetInner>>,
    clock: VirtualClock,
    ep: usize,
    generation: u32,
    /// The ring handle, until `take_rx_ring` hands it out.
    ring: Option<SimRing>,
    routing: RoutingInfo,
    tx_burst_max: usize,
}

impl fmt::Debug for SimTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimTransport {{ ep {}, {} }}", self.ep, self.routing)
    }
}

impl SimTransport {
    /// Endpoint index in its network.
    pub fn endpoint(&self) -> usize {
        self.ep
    }

    /// False once the endpoint was restarted: this transport belongs to
    /// the crashed incarnation and sends and receives nothing.
    fn current(&self, n: &NetInner) -> bool {
        n.endpoints[self.ep].generation == self.generation
    }
}

impl Transport for SimTransport {
    type Route = SimRoute;
    type Ring = SimRing;

    fn local_routing_info(&self) -> RoutingInfo {
        self.routing
    }

    fn resolve(&self, info: &RoutingInfo) -> Result<SimRoute, TransportError> {
        let n = self.net.borrow();
        let Some(ep) = n
            .endpoints
            .iter()
            .position(|e| e.routing.ipv4 == info.ipv4 && e.routing.udp_port == info.udp_port)
        else {
            return Err(TransportError::Resolve {
                info: *info,
                why: "no simulated endpoint has this address".into(),
            });
        };
        // Toward a peer that uses RSS (a C++ DPDK receiver), the source
        // port its RSS maps to its queue, as the real transports pick it.
        let src_port = match transport::rss::source_port(self.routing.ipv4, info) {
            Ok(p) => p.unwrap_or(self.routing.udp_port),
            Err(e) => {
                return Err(TransportError::Resolve {
                    info: *info,
                    why: e.to_string(),
                });
            }
        };
        Ok(SimRoute {
            ep,
            template: FrameTemplate {
                dst_mac: info.mac,
                src_mac: self.routing.mac,
                src_ip: self.routing.ipv4,
                dst_ip: info.ipv4,
                src_port,
                dst_port: info.udp_port,
            },
        })
    }

    fn fill_headroom(&self, route: &SimRoute, headroom: &mut [u8], frame_len: usize) {
        build_headroom(&route.template, headroom, frame_len);
    }

    fn tx_burst(&mut self, items: &[TxItem<'_, SimRoute>]) -> usize {
        let now = self.clock.now_ns();
        let mut n = self.net.borrow_mut();
        if !self.current(&n) {
            return items.len();
        }
        if n.endpoints[self.ep].refuse_bursts > 0 {
            n.endpoints[self.ep].refuse_bursts -= 1;
            n.endpoints[self.ep].stats.tx_refused += items.len() as u64;
            n.stats.tx_refused_bursts += 1;
            return 0;
        }
        for it in items {
            if it.drop {
                n.endpoints[self.ep].stats.tx_dropped_on_purpose += 1;
                continue;
            }
            let len = it.frame_len();
            if len > MTU {
                n.endpoints[self.ep].stats.tx_errors += 1;
                continue;
            }
            let mut f = n.frame_buf();
            f[..it.pkt.len()].copy_from_slice(it.pkt);
            f[it.pkt.len()..len].copy_from_slice(it.data);
            let st = &mut n.endpoints[self.ep].stats;
            st.tx_pkts += 1;
            st.tx_bytes += len as u64;
            n.send(now, self.ep, it.route.ep, f, len);
        }
        n.endpoints[self.ep].stats.tx_doorbells += 1;
        items.len()
    }

    fn tx_burst_max(&self) -> usize {
        self.tx_burst_max
    }

    fn tx_flush(&mut self) {}

    fn rx_burst(&mut self) -> usize {
        let mut n = self.net.borrow_mut();
        if !self.current(&n) {
            return 0;
        }
        let ep = &mut n.endpoints[self.ep];
        let k = ep.written - ep.reported;
        ep.reported = ep.written;
        k as usize
    }

    fn post_recvs(&mut self, ring: &mut SimRing, k: usize) {
        let mut n = self.net.borrow_mut();
        if !self.current(&n) {
            return;
        }
        let ep = &mut n.endpoints[self.ep];
        assert!(
            Rc::ptr_eq(&ring.0, &ep.ring),
            "post_recvs: the ring handle belongs to another transport"
        );
        let entries = ep.ring.entries() as u64;
        for _ in 0..k {
            assert!(
                ep.reposted < ep.reported,
                "post_recvs beyond received packets"
            );
            ep.ring.repost((ep.reposted % entries) as usize);
            ep.reposted += 1;
        }
    }

    fn take_rx_ring(&mut self) -> Option<SimRing> {
        self.ring.take()
    }

    fn stats(&self) -> TransportStats {
        self.net.borrow().endpoints[self.ep].stats
    }
}

/// An allocator for the simulated network or kernel UDP (identity DMA
/// mapping: no device sees the memory), reserving `initial_bytes` up
/// front. Where its memory comes from is the caller's decision
/// (`region.fallback`); a missing hugepage is an error that names the
/// shortfall and the command that fixes it.
pub fn sim_allocator(
    initial_bytes: usize,
    region: mempool::RegionOptions,
) -> Result<mempool::Allocator, mempool::AllocError> {
    use mempool::{Allocator, AllocatorConfig, IdentityMapper};
    Allocator::new(
        Arc::new(IdentityMapper::new()),
        AllocatorConfig {
            initial_bytes,
            region,
            ..AllocatorConfig::default()
        },
    )
}

/// The allocator of a test (or a test-like benchmark) on the simulated
/// network: 2 MiB hugepages when enough are free; otherwise, outside CI
/// (`ERPC_CI` unset), 4 KiB pages with a note on stderr that names the
/// test's opt-in. In CI a shortage is an error. Tools and examples decide
/// for themselves and call [`sim_allocator`].
pub fn test_allocator(initial_bytes: usize) -> mempool::Allocator {
    use mempool::{Fallback, RegionOptions};
    let pages = (initial_bytes as u64).div_ceil(2 << 20).max(1) + 8;
    let fallback = if mempool::hugepages_available(pages) {
        Fallback::Never
    } else if std::env::var_os("ERPC_CI").is_some() {
        panic!("ERPC_CI is set and fewer than {pages} free 2 MiB hugepages remain");
    } else {
        eprintln!(
            "note: fewer than {pages} free 2 MiB hugepages; this test opts in to 4 KiB pages \
             (Fallback::SmallPages)"
        );
        Fallback::SmallPages
    };
    let region = RegionOptions {
        fallback,
        ..RegionOptions::default()
    };
    match sim_allocator(initial_bytes, region) {
        Ok(a) => a,
        Err(e) => panic!("test allocator of {initial_bytes} bytes: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport::PKTHDR_BYTES;

    fn send(t: &mut SimTransport, route: &SimRoute, n: usize, payload: &[u8]) {
        let mut frame = vec![0u8; HEADROOM_BYTES + payload.len()];
        let len = frame.len();
        t.fill_headroom(route, &mut frame[..HEADROOM_BYTES], len);
        frame[HEADROOM_BYTES..].copy_from_slice(payload);
        let item = TxItem {
            route,
            pkt: &frame,
            pkt_iova: 0,
            data: &[],
            data_iova: 0,
            lkey: 0,
            drop: false,
        };
        for _ in 0..n {
            assert_eq!(t.tx_burst(std::slice::from_ref(&item)), 1);
        }
    }

    fn pair(cfg: SimConfig) -> (SimNet, SimTransport, SimTransport, SimRoute) {
        let net = SimNet::new(cfg);
        let a = net.add_transport();
        let b = net.add_transport();
        let r = a.resolve(&b.local_routing_info()).unwrap();
        (net, a, b, r)
    }

    #[test]
    fn delivers_after_the_delay_into_ring_order() {
        let (net, mut a, mut b, r) = pair(SimConfig::default());
        send(&mut a, &r, 3, &[7u8; 20]);
        assert_eq!(b.rx_burst(), 0);
        net.advance(999);
        assert_eq!(b.rx_burst(), 0, "not before the 1 µs delay");
        net.advance(1);
        assert_eq!(b.rx_burst(), 3);
        let mut ring = b.take_rx_ring().unwrap();
        for i in 0..3 {
            assert_eq!(ring.packet(i).unwrap(), &[7u8; 20][..]);
        }
        b.post_recvs(&mut ring, 3);
        assert_eq!(b.stats().rx_pkts, 3);
        assert_eq!(a.stats().tx_pkts, 3);
        assert!(a.resolve(&RoutingInfo::default()).is_err());
    }

    #[test]
    fn loss_duplication_and_full_rings_are_counted() {
        let cfg = SimConfig {
            seed: 9,
            ring_entries: 64,
            link: LinkConfig {
                loss_ppm: 500_000,
                dup_ppm: 200_000,
                ..LinkConfig::default()
            },
            ..SimConfig::default()
        };
        let (net, mut a, mut b, r) = pair(cfg);
        send(&mut a, &r, 1000, &[1u8; PKTHDR_BYTES]);
        net.advance(10_000);
        let s = net.stats();
        assert_eq!(s.sent, 1000);
        assert!((400..600).contains(&s.lost), "{s:?}");
        assert!(s.duplicated > 50, "{s:?}");
        // Nothing was reposted: the ring holds 64, the rest are dropped.
        assert_eq!(b.rx_burst(), 64);
        assert_eq!(s.delivered, 64);
        assert_eq!(s.rx_ring_full, 1000 - s.lost + s.duplicated - 64);
    }

    #[test]
    fn malformed_frames_read_as_none_and_jitter_keeps_order() {
        let cfg = SimConfig {
            link: LinkConfig {
                jitter_ns: 5_000,
                ..LinkConfig::default()
            },
            ..SimConfig::default()
        };
        let (net, mut a, mut b, r) = pair(cfg);
        for i in 0..50u8 {
            send(&mut a, &r, 1, &[i; 16]);
        }
        net.advance(100_000);
        net.inject_frame(b.endpoint(), &[0u8; 30]);
        net.advance(1);
        assert_eq!(b.rx_burst(), 51);
        let mut ring = b.take_rx_ring().unwrap();
        for i in 0..50u8 {
            assert_eq!(ring.packet(usize::from(i)).unwrap()[0], i, "order kept");
        }
        assert!(ring.packet(50).is_none());
        assert_eq!(b.stats().rx_short, 1);
        b.post_recvs(&mut ring, 51);
    }
}
