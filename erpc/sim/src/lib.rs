//! Deterministic in-process simulation: a seeded, single-threaded network
//! of [`SimTransport`] endpoints on a shared [`VirtualClock`], plus an
//! in-memory session-management hub ([`SimSmHub`]) stepped by the same
//! clock.
//!
//! The network is the project's one network model ([`netsim`]): each
//! endpoint is a NIC port on one switch, with its own link. Frames are real
//! Ethernet/IPv4/UDP frames (headers built with `transport::wire`,
//! validated on arrival). By default links are infinitely fast and the
//! switch's buffers unlimited; [`SimConfig::port`] (or
//! [`SimNet::set_port_config`]) gives links a rate and the switch a
//! drop-tail buffer per output port, so that an incast builds a real queue
//! in virtual time ([`SimNet::queue`]). Each endpoint's link can lose,
//! duplicate, reorder, corrupt and delay what the endpoint sends
//! ([`LinkFaults`] from [`delayed_link`], applied in the endpoint → switch direction, so a frame
//! meets its sender's faults once), from the seed. Nothing moves until
//! [`SimNet::advance`] is called, so a scenario that polls its Rpcs and
//! advances the clock in one thread replays exactly from its seed.
//!
//! The RX ring has the shape of a NIC ring ([`transport::RxRing`]): packets
//! land in slots, the Rpc reads them in place, and slots come back with
//! `post_recvs`; a full ring drops (and counts) arrivals.
//!
//! # Deferred DMA
//!
//! By default a packet's bytes are copied inside `tx_burst`, so a buffer
//! that eRPC frees or rewrites while a real NIC could still read it (sends
//! are unsignaled: only `tx_flush` says the NIC let go) goes unnoticed.
//! [`SimConfig::deferred_dma`] turns on a NIC that reads later: each send
//! is copied as it is at `tx_burst` (a snapshot) and read again at the
//! endpoint's next `tx_flush`, at a later `tx_burst` once a seeded number
//! of later sends were posted, or at the first [`SimNet::advance`] past a
//! seeded delay ([`DeferredDma`]); never inside the `tx_burst` that posted
//! it, always in order. What is read then goes on the wire; bytes that
//! differ from the snapshot mean the buffer was rewritten, or freed (the
//! allocators of [`SimNet::allocator`] poison freed blocks in this mode),
//! while the NIC still owned it: a missing TX drain, counted in
//! [`NetStats::dma_mismatches`] and, by default, a panic that names the
//! packet. Memory must be registered with the network's IOMMU
//! ([`SimNet::allocator`], [`SimNet::iommu`]); a read of memory
//! unregistered meanwhile is a DMA fault ([`NetStats::dma_faults`]). The
//! details are in the `dma` module's documentation.

mod dma;
pub mod fuzz;
mod nic;
mod ring;
mod sm_hub;

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::net::Ipv4Addr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use netsim::{Direction, NetConfig, Network, PortId};
use transport::wire::{FrameTemplate, Headroom, build_headroom, parse_frame};
use transport::{
    HEADROOM_BYTES, MTU, RoutingInfo, RxRing, Transport, TransportError, TransportStats, TxItem,
};

pub use dma::{DeferredDma, SimIommu};
use erpc::VirtualClock;
pub use netsim::{LinkFaults, PortConfig, QueueSample, QueueStats};
pub use nic::{SimRing, SimRoute, SimTransport};
pub use sm_hub::{FORGER_URI, SimSmHub, SmHubConfig, SmHubStats};

use ring::RingMem;

/// Most frames [`SimNet::capture`] keeps between takes.
const MAX_CAPTURE: usize = 1 << 16;

/// A link of the simulated network with propagation delay `delay_ns` and
/// up to `jitter_ns` more per frame, and no fault: the base to give
/// faults on, as in `LinkFaults { loss: 0.01, ..delayed_link(2_000, 0) }`.
/// A frame picked for reordering is held back by `delay_ns + jitter_ns`,
/// and one damaged past the frame check (`corrupt`) is damaged after
/// eRPC's headroom (the Ethernet, IPv4 and UDP headers), so that what
/// reaches eRPC is its own header or payload.
pub const fn delayed_link(delay_ns: u64, jitter_ns: u64) -> LinkFaults {
    LinkFaults {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_delay: Duration::from_nanos(delay_ns + jitter_ns),
        fcs_error: 0.0,
        corrupt: 0.0,
        corrupt_from: HEADROOM_BYTES,
        delay: Duration::from_nanos(delay_ns),
        jitter: Duration::from_nanos(jitter_ns),
        down: false,
    }
}

/// The simulated network's default link (`SimConfig::default().link`): 1 µs
/// of propagation delay, no jitter, no fault.
pub const DEFAULT_LINK: LinkFaults = delayed_link(1_000, 0);

/// Settings of a simulated network.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Default link behaviour (overridable per endpoint): [`DEFAULT_LINK`]
    /// unless set.
    pub link: LinkFaults,
    /// Link rate and switch buffer of every endpoint's port (unlimited by
    /// default: an infinitely fast network).
    pub port: PortConfig,
    /// RX ring entries per endpoint.
    pub ring_entries: usize,
    /// Largest TX burst (the postlist).
    pub tx_burst_max: usize,
    /// Session-management hub settings.
    pub sm: SmHubConfig,
    /// The NIC reads sent packets later, and freed buffers are poisoned
    /// (see the module doc). Off by default.
    pub deferred_dma: Option<DeferredDma>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            link: DEFAULT_LINK,
            port: PortConfig::default(),
            ring_entries: erpc::RX_RING_ENTRIES_DEFAULT,
            tx_burst_max: 16,
            sm: SmHubConfig::default(),
            deferred_dma: None,
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
    /// Frames held back so that later ones overtook them.
    pub reordered: u64,
    /// Frames damaged on the wire and dropped by the frame check.
    pub fcs_errors: u64,
    /// Frames damaged past the frame check and delivered.
    pub corrupted_undetected: u64,
    /// Frames the switch dropped because its buffer towards the
    /// destination was full.
    pub queue_drops: u64,
    /// Arrivals dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Frames to an address no endpoint has.
    pub no_such_endpoint: u64,
    /// Frames from or to an endpoint that is down (crashed).
    pub endpoint_down: u64,
    /// `tx_burst` calls refused on purpose (a full send queue).
    pub tx_refused_bursts: u64,
    /// Deferred DMA: sends read after their `tx_burst`.
    pub dma_deferred: u64,
    /// Deferred DMA: sends whose bytes changed between `tx_burst` and the
    /// NIC's read (a buffer reused before a drain).
    pub dma_mismatches: u64,
    /// Deferred DMA: sends in memory not registered with the network's
    /// IOMMU, at `tx_burst` or (unregistered meanwhile) at the read.
    pub dma_faults: u64,
    /// Deferred DMA: pending sends forgotten because their endpoint
    /// restarted (the crashed process's queue died with it).
    pub dma_discarded: u64,
}

/// One endpoint: the device plugged into a port of the network model.
struct Endpoint {
    routing: RoutingInfo,
    ring: Rc<RingMem>,
    written: u64,
    reported: u64,
    reposted: u64,
    /// The most slots held at once (`written - reposted`).
    held_high_water: u64,
    stats: TransportStats,
    /// Crashed: sends nothing, receives nothing.
    down: bool,
    /// `tx_burst` calls still to refuse (fault injection).
    refuse_bursts: u32,
    /// Restarts so far; a transport of an earlier incarnation is inert.
    generation: u32,
    /// The link was set explicitly (a new default does not apply).
    link_set: bool,
    /// Copies of the frames that reached this endpoint (`SimNet::capture`).
    captured: Option<Vec<Box<[u8]>>>,
    /// Deferred DMA: what the NIC has not read yet.
    dma: Option<dma::DmaQueue>,
}

/// Counters the network model does not keep.
#[derive(Debug, Default)]
struct Extra {
    sent: u64,
    delivered: u64,
    rx_ring_full: u64,
    endpoint_down: u64,
    tx_refused_bursts: u64,
    dma_deferred: u64,
    dma_mismatches: u64,
    dma_faults: u64,
    dma_discarded: u64,
    /// The first deferred-DMA mismatch or fault.
    dma_first: Option<String>,
}

impl Extra {
    /// Records a deferred-DMA error; panics (unless `panic` is off or the
    /// thread is already unwinding) with its message.
    fn dma_error(&mut self, fault: bool, msg: String, panic: bool) {
        if fault {
            self.dma_faults += 1;
        } else {
            self.dma_mismatches += 1;
        }
        tracing::error!("{msg}");
        if self.dma_first.is_none() {
            self.dma_first = Some(msg.clone());
        }
        if panic && !std::thread::panicking() {
            panic!("{msg}");
        }
    }
}

struct NetInner {
    net: Network<Endpoint>,
    cfg: SimConfig,
    extra: Extra,
    iommu: Arc<SimIommu>,
}

/// A frame of endpoint `ep` leaves its NIC towards endpoint `dst`: looped
/// back to itself, or onto its link.
fn send_frame(
    net: &mut Network<Endpoint>,
    extra: &mut Extra,
    ep: usize,
    dst: usize,
    now: u64,
    f: Vec<u8>,
) {
    let me = port(ep);
    extra.sent += 1;
    if net.device(me).down {
        extra.endpoint_down += 1;
        net.recycle(f);
        return;
    }
    if dst == ep {
        // To itself: the NIC loops the frame back without the wire.
        deliver(extra, net.device_mut(me), &f);
        net.recycle(f);
        return;
    }
    net.transmit(now, me, f, &mut into_ring(extra));
}

/// Deferred DMA: the NIC of endpoint `ep` reads the pending sends that
/// are due (all of them at a flush) and sends what it reads.
fn read_due(
    net: &mut Network<Endpoint>,
    extra: &mut Extra,
    iommu: &SimIommu,
    ep: usize,
    now: u64,
    at_burst: bool,
    flush: bool,
) {
    loop {
        let Some(q) = net.device_mut(port(ep)).dma.as_mut() else {
            return;
        };
        let Some(p) = q.pop_due(now, at_burst, flush) else {
            return;
        };
        let (poison, panic) = (q.cfg().poison, q.cfg().panic);
        extra.dma_deferred += 1;
        let mut f = net.frame_buf();
        let r = dma::read(iommu, ep, &p, now, poison, &mut f);
        let dst = p.dst;
        net.recycle(p.snapshot);
        match r {
            Ok(()) => {}
            Err(dma::ReadError::Mismatch(m)) => extra.dma_error(false, m, panic),
            Err(dma::ReadError::Fault(m)) => {
                net.recycle(f);
                extra.dma_error(true, m, panic);
                continue;
            }
        }
        send_frame(net, extra, ep, dst, now, f);
    }
}

/// The seed of endpoint `ep`'s deferred-DMA draws in its `generation`.
fn dma_seed(seed: u64, ep: usize, generation: u32) -> u64 {
    seed ^ 0xd3a_0000_0000 ^ ((ep as u64) << 16) ^ (u64::from(generation) << 40)
}

/// A frame arrives at endpoint `ep`.
#[inline]
fn deliver(x: &mut Extra, ep: &mut Endpoint, frame: &[u8]) {
    if ep.down {
        x.endpoint_down += 1;
        return;
    }
    if let Some(c) = ep.captured.as_mut()
        && c.len() < MAX_CAPTURE
    {
        c.push(frame.into());
    }
    let entries = ep.ring.entries() as u64;
    if ep.written - ep.reposted >= entries {
        x.rx_ring_full += 1;
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
    ep.held_high_water = ep.held_high_water.max(ep.written - ep.reposted);
    x.delivered += 1;
}

/// The delivery callback of the network model: into the endpoint's ring.
fn into_ring(x: &mut Extra) -> impl FnMut(PortId, &mut Endpoint, &mut Vec<u8>) -> bool + '_ {
    |_, ep, frame| {
        deliver(x, ep, frame);
        true
    }
}

impl NetInner {
    fn run_until(&mut self, now_ns: u64) {
        let NetInner { net, extra, .. } = self;
        net.run_until(now_ns, &mut into_ring(extra));
    }
}

/// A simulated network: endpoints, links, a switch, a virtual clock and an
/// SM hub.
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
            "SimNet {{ now {} ns, {} endpoints, {} in flight }}",
            self.clock.now_ns(),
            n.net.port_count(),
            n.net.pending(),
        )
    }
}

impl SimNet {
    /// A network with no endpoints, at time 0.
    pub fn new(cfg: SimConfig) -> SimNet {
        let clock = VirtualClock::new();
        let hub = Arc::new(SimSmHub::new(clock.clone(), cfg.seed ^ 0x5353_4d5f, cfg.sm));
        let net = Network::new(NetConfig {
            seed: cfg.seed,
            faults: LinkFaults::default(),
            port: cfg.port,
            // Every endpoint's MAC is known: a frame to another MAC is a
            // frame to an address no endpoint has.
            flood_unknown_unicast: false,
            event_log_capacity: 0,
        });
        SimNet {
            inner: Rc::new(RefCell::new(NetInner {
                net,
                cfg,
                extra: Extra::default(),
                iommu: Arc::new(SimIommu::new()),
            })),
            clock,
            hub,
        }
    }

    /// The shared virtual clock.
    pub fn clock(&self) -> VirtualClock {
        self.clock.clone()
    }

    /// The [`erpc::Clock`] to give each Nexus.
    pub fn erpc_clock(&self) -> erpc::Clock {
        erpc::Clock::Virtual(self.clock.clone())
    }

    /// The SM hub, as a Nexus SM link.
    pub fn sm_link(&self) -> Arc<dyn erpc::sm::SmLink> {
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

    /// Adds an endpoint (a NIC port with its RX ring of
    /// [`SimConfig::ring_entries`]).
    pub fn add_transport(&self) -> SimTransport {
        let entries = self.inner.borrow().cfg.ring_entries;
        self.add_transport_with_ring(entries)
    }

    /// Adds an endpoint whose RX ring has `entries` slots (a power of two;
    /// e.g. `erpc::rx_ring_entries_for(sessions, credits)`).
    pub fn add_transport_with_ring(&self, entries: usize) -> SimTransport {
        assert!(
            entries.is_power_of_two(),
            "ring entries must be a power of two"
        );
        let mut n = self.inner.borrow_mut();
        let ep = n.net.port_count();
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
        let ring = RingMem::new(entries);
        let seed = n.cfg.seed;
        let dma = n
            .cfg
            .deferred_dma
            .map(|d| dma::DmaQueue::new(d, dma_seed(seed, ep, 0)));
        let port = n.net.add_port(
            Some(routing.mac),
            Endpoint {
                routing,
                ring: ring.clone(),
                written: 0,
                reported: 0,
                reposted: 0,
                held_high_water: 0,
                stats: TransportStats::default(),
                down: false,
                refuse_bursts: 0,
                generation: 0,
                link_set: false,
                captured: None,
                dma,
            },
        );
        let faults = n.cfg.link;
        n.net.set_faults(port, Some(Direction::ToSwitch), faults);
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
        self.inner.borrow_mut().net.device_mut(port(ep)).down = true;
    }

    /// Restarts crashed endpoint `ep` as a new NIC port at the same
    /// address (a restarted process binding the same port): an empty RX
    /// ring, new counters. Frames of the previous incarnation still in
    /// flight arrive at the new one.
    pub fn restart(&self, ep: usize) -> SimTransport {
        let mut n = self.inner.borrow_mut();
        let tx_burst_max = n.cfg.tx_burst_max;
        let e = n.net.device_mut(port(ep));
        let ring = RingMem::new(e.ring.entries());
        e.ring = ring.clone();
        e.written = 0;
        e.reported = 0;
        e.reposted = 0;
        e.held_high_water = 0;
        e.stats = TransportStats::default();
        e.down = false;
        e.refuse_bursts = 0;
        e.generation += 1;
        let generation = e.generation;
        let routing = e.routing;
        // The crashed process's sends die with its queue.
        let seed = n.cfg.seed;
        let NetInner { net, extra, .. } = &mut *n;
        if let Some(q) = net.device_mut(port(ep)).dma.as_mut() {
            let cfg = *q.cfg();
            extra.dma_discarded += q.clear().count() as u64;
            *q = dma::DmaQueue::new(cfg, dma_seed(seed, ep, generation));
        }
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
        let e = n.net.device_mut(port(ep));
        match (on, e.captured.is_some()) {
            (true, false) => e.captured = Some(Vec::new()),
            (false, true) => e.captured = None,
            _ => {}
        }
    }

    /// The frames captured at endpoint `ep` since the last call, in
    /// arrival order.
    pub fn take_captured(&self, ep: usize) -> Vec<Box<[u8]>> {
        self.inner
            .borrow_mut()
            .net
            .device_mut(port(ep))
            .captured
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Makes the next `bursts` `tx_burst` calls of endpoint `ep` accept
    /// nothing, as a NIC whose send queue is full.
    pub fn refuse_tx(&self, ep: usize, bursts: u32) {
        self.inner
            .borrow_mut()
            .net
            .device_mut(port(ep))
            .refuse_bursts = bursts;
    }

    /// Sets the behaviour of endpoint `ep`'s link for what `ep` sends
    /// (endpoint → switch).
    pub fn set_link(&self, ep: usize, cfg: LinkFaults) {
        let mut n = self.inner.borrow_mut();
        n.net.device_mut(port(ep)).link_set = true;
        n.net.set_faults(port(ep), Some(Direction::ToSwitch), cfg);
    }

    /// Sets the behaviour of endpoint `ep`'s link for what it receives
    /// (switch → endpoint; clean and without delay unless set here).
    pub fn set_link_to(&self, ep: usize, cfg: LinkFaults) {
        self.inner
            .borrow_mut()
            .net
            .set_faults(port(ep), Some(Direction::ToDevice), cfg);
    }

    /// The default link behaviour.
    pub fn default_link(&self) -> LinkFaults {
        self.inner.borrow().cfg.link
    }

    /// Changes the default link behaviour (of every endpoint whose link
    /// was not set with [`SimNet::set_link`], and of endpoints added
    /// later).
    pub fn set_default_link(&self, cfg: LinkFaults) {
        let mut n = self.inner.borrow_mut();
        n.cfg.link = cfg;
        for i in 0..n.net.port_count() {
            if !n.net.device(port(i)).link_set {
                n.net.set_faults(port(i), Some(Direction::ToSwitch), cfg);
            }
        }
    }

    /// Sets endpoint `ep`'s link rate and the switch's buffer towards it.
    pub fn set_port_config(&self, ep: usize, cfg: PortConfig) {
        self.inner.borrow_mut().net.set_port_config(port(ep), cfg);
    }

    /// The switch's output queue towards endpoint `ep` now: occupancy,
    /// high-water marks, drops.
    pub fn queue(&self, ep: usize) -> QueueStats {
        let now = self.clock.now_ns();
        self.inner
            .borrow()
            .net
            .queue(port(ep), now)
            .unwrap_or_default()
    }

    /// Records the output queue towards `ep` at every arrival (up to
    /// `capacity` samples); [`SimNet::queue_trace`] reads them.
    pub fn set_queue_trace(&self, ep: usize, capacity: usize) {
        self.inner
            .borrow_mut()
            .net
            .set_queue_trace(port(ep), capacity);
    }

    /// The recorded samples of the output queue towards `ep`.
    pub fn queue_trace(&self, ep: usize) -> Vec<QueueSample> {
        self.inner.borrow().net.queue_trace(port(ep)).to_vec()
    }

    /// Captures every frame endpoint `ep` sends and receives into `out`
    /// (pcap, virtual-time stamps).
    pub fn set_pcap(&self, ep: usize, out: impl Write + Send + 'static) -> std::io::Result<()> {
        self.inner
            .borrow_mut()
            .net
            .set_pcap(port(ep), Box::new(out))
    }

    /// Flushes every pcap writer.
    pub fn flush_pcaps(&self) -> std::io::Result<()> {
        self.inner.borrow_mut().net.flush_pcaps()
    }

    /// Moves time forward by `ns` and delivers every data frame and SM
    /// packet due by then.
    pub fn advance(&self, ns: u64) {
        self.clock.advance_ns(ns);
        let now = self.clock.now_ns();
        let mut n = self.inner.borrow_mut();
        if n.cfg.deferred_dma.is_some() {
            // The NICs read what is due by now (before delivery: a frame
            // read now goes on the wire now).
            let NetInner {
                net, extra, iommu, ..
            } = &mut *n;
            for ep in 0..net.port_count() {
                read_due(net, extra, iommu, ep, now, false, false);
            }
        }
        n.run_until(now);
        drop(n);
        self.hub.deliver_due(now);
    }

    /// Time of the next pending delivery (data or SM), if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        let n = self.inner.borrow();
        let reads = n
            .net
            .devices()
            .filter_map(|e| e.dma.as_ref().and_then(|q| q.next_due_ns()))
            .min();
        let d = match (n.net.next_event_ns(), reads) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        drop(n);
        match (d, self.hub.next_event_ns()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Delivers an arbitrary frame (all headers included, at most an MTU)
    /// to endpoint `dst` now, as if it came from the switch (fuzzing, fault
    /// tests).
    pub fn inject_frame(&self, dst: usize, frame: &[u8]) {
        let now = self.clock.now_ns();
        let mut n = self.inner.borrow_mut();
        let NetInner { net, extra, .. } = &mut *n;
        let mut f = net.frame_buf();
        f.extend_from_slice(&frame[..frame.len().min(MTU)]);
        net.inject(now, port(dst), f, &mut into_ring(extra));
    }

    /// Delivers `payload` (eRPC header + data) to endpoint `dst` in a valid
    /// Ethernet/IPv4/UDP frame from a stranger.
    pub fn inject_payload(&self, dst: usize, payload: &[u8]) {
        let routing = self.inner.borrow().net.device(port(dst)).routing;
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

    /// Data frames in flight (hops waiting in the event queue).
    pub fn in_flight(&self) -> usize {
        self.inner.borrow().net.pending()
    }

    /// RX ring slots of endpoint `ep` holding packets not yet given back
    /// with `post_recvs` (0 when the Rpc leaked no ring entry).
    pub fn rx_held(&self, ep: usize) -> u64 {
        let n = self.inner.borrow();
        let e = n.net.device(port(ep));
        e.written - e.reposted
    }

    /// The most RX ring slots endpoint `ep` held at once (packets arrived
    /// and not yet given back), and the ring's size: how close the ring
    /// came to overflowing.
    pub fn rx_high_water(&self, ep: usize) -> (u64, usize) {
        let n = self.inner.borrow();
        let e = n.net.device(port(ep));
        (e.held_high_water, e.ring.entries())
    }

    /// Network counters.
    pub fn stats(&self) -> NetStats {
        let n = self.inner.borrow();
        let s = n.net.stats();
        let x = &n.extra;
        NetStats {
            sent: x.sent,
            delivered: x.delivered,
            lost: s.ports.lost,
            duplicated: s.ports.duplicated,
            reordered: s.ports.reordered,
            fcs_errors: s.ports.fcs_errors,
            corrupted_undetected: s.ports.corrupted,
            queue_drops: s.ports.queue_drops,
            rx_ring_full: x.rx_ring_full,
            no_such_endpoint: s.unknown_unicast_drops,
            endpoint_down: x.endpoint_down,
            tx_refused_bursts: x.tx_refused_bursts,
            dma_deferred: x.dma_deferred,
            dma_mismatches: x.dma_mismatches,
            dma_faults: x.dma_faults,
            dma_discarded: x.dma_discarded,
        }
    }

    /// Deferred DMA: the network's IOMMU, which the memory of every send
    /// must be registered with ([`SimNet::allocator`] does it).
    pub fn iommu(&self) -> Arc<SimIommu> {
        self.inner.borrow().iommu.clone()
    }

    /// The deferred-DMA settings, if the mode is on.
    pub fn deferred_dma(&self) -> Option<DeferredDma> {
        self.inner.borrow().cfg.deferred_dma
    }

    /// Deferred DMA: the first mismatch or fault, in words.
    pub fn dma_first_error(&self) -> Option<String> {
        self.inner.borrow().extra.dma_first.clone()
    }

    /// Sends endpoint `ep`'s NIC has not read yet (deferred DMA).
    pub fn dma_pending(&self, ep: usize) -> usize {
        self.inner
            .borrow()
            .net
            .device(port(ep))
            .dma
            .as_ref()
            .map_or(0, |q| q.len())
    }

    /// An allocator for an Rpc on this network, reserving `initial_bytes`
    /// up front with [`test_allocator`]'s choice of pages. Without deferred
    /// DMA it is [`test_allocator`]'s; with it, its memory is registered
    /// with the network's IOMMU and freed blocks are poisoned with
    /// [`DeferredDma::poison`].
    pub fn allocator(&self, initial_bytes: usize) -> mempool::Allocator {
        let n = self.inner.borrow();
        match n.cfg.deferred_dma {
            None => test_allocator(initial_bytes),
            Some(d) => test_allocator_with(initial_bytes, n.iommu.clone(), Some(d.poison)),
        }
    }

    /// The network model's own counters for endpoint `ep`'s port.
    pub fn port_stats(&self, ep: usize) -> netsim::PortStats {
        self.inner
            .borrow()
            .net
            .port_stats(port(ep))
            .unwrap_or_default()
    }
}

fn port(ep: usize) -> PortId {
    PortId(ep as u32)
}

/// The allocator for the simulated network: [`erpc::host_allocator`]
/// (the simulated NIC, like kernel UDP, copies packets, so no device reads
/// the memory), under the name the simulation's users know. Over kernel
/// UDP call [`erpc::host_allocator`], which does not need this feature.
pub fn sim_allocator(
    initial_bytes: usize,
    region: mempool::RegionOptions,
) -> Result<mempool::Allocator, mempool::AllocError> {
    erpc::host_allocator(initial_bytes, region)
}

pub use erpc::test_allocator;
use erpc::test_allocator_with;

#[cfg(test)]
mod tests;

/// Runs a seeded test body `f` for each of `defaults`, or for the seed in
/// `ERPC_SEED` alone when it is set; a failing seed prints the one-line
/// command that replays it (`cargo test -p {package} --test {file} --
/// {test} --exact` with that seed).
pub fn with_seeds(package: &str, file: &str, test: &str, defaults: &[u64], f: impl Fn(u64)) {
    let seeds: Vec<u64> = match std::env::var("ERPC_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => defaults.to_vec(),
    };
    for seed in seeds {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed)));
        if let Err(e) = r {
            eprintln!(
                "\n*** {test} failed with seed {seed}\n*** replay: ERPC_SEED={seed} cargo test -p {package} --test {file} -- {test} --exact\n"
            );
            std::panic::resume_unwind(e);
        }
    }
}
