//! The simulated Ethernet fabric: a learning switch with ports, one link per
//! port with seeded fault injection, per-port pcap, and the clock.
//!
//! # Delivery
//!
//! A frame sent by a NIC crosses its port's link (NIC → switch), the switch
//! (MAC learning; unknown unicast, broadcast and multicast are flooded to
//! every other port in port order), then the receiving port's link
//! (switch → NIC). Each link direction applies its [`LinkFaults`] with its
//! own random stream, derived from the fabric seed and the port number, so
//! the fate of frames on one link does not depend on traffic elsewhere.
//!
//! A hop without delay is taken synchronously, inside the sender's call
//! (inside the doorbell write that produced the frame), with no lock of the
//! sending NIC held. A delayed hop (fixed delay, or a frame held back to be
//! reordered) goes into the event queue and is taken when the clock reaches
//! its due time.
//!
//! # Clock and modes
//!
//! * **Deterministic** (`FabricConfig::deterministic`): the clock is
//!   virtual and moves only in [`Fabric::advance`] (which the model's
//!   `HwBackend::wait` calls). Everything runs on the caller's thread;
//!   with one driving thread a seed replays exactly: the same frames are
//!   lost, and pcap files are byte-identical. Calls from a thread other
//!   than the one that created the fabric are counted
//!   ([`FabricStats::foreign_thread_calls`]).
//! * **Threaded**: the clock is wall time since the fabric was made (plus
//!   any [`Fabric::advance`]); a pump thread delivers delayed frames when
//!   they are due. Any number of threads may ring doorbells on any NICs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::pcap::PcapWriter;
use crate::rng::Rng;
use crate::util::{lock, read, write};

/// A switch port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(pub u32);

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port {}", self.0)
    }
}

/// Faults applied to every frame crossing a link, in each direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by `reorder_delay`, so that
    /// later frames overtake it.
    pub reorder: f64,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
    /// Probability that one bit of the frame (past the Ethernet header) is
    /// flipped. Frames carry no FCS in the model, so a corrupted frame is
    /// delivered; the receiver's checksum flags in the CQE show it.
    pub corrupt: f64,
    /// Fixed one-way delay of the link.
    pub delay: Duration,
    /// Link down: every frame is dropped (and `QUERY_VPORT_STATE` says down).
    pub down: bool,
}

impl Default for LinkFaults {
    fn default() -> Self {
        LinkFaults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(20),
            corrupt: 0.0,
            delay: Duration::ZERO,
            down: false,
        }
    }
}

impl LinkFaults {
    fn is_clean(&self) -> bool {
        self.loss <= 0.0
            && self.duplicate <= 0.0
            && self.reorder <= 0.0
            && self.corrupt <= 0.0
            && self.delay.is_zero()
            && !self.down
    }
}

/// Fabric configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricConfig {
    /// Seed of every random stream.
    pub seed: u64,
    /// Virtual clock, single thread, exact replay (see the module doc).
    pub deterministic: bool,
    /// Faults of every new port's link.
    pub default_faults: LinkFaults,
    /// How many link events (losses, duplicates, ...) are kept for
    /// [`Fabric::link_events`]; older ones are discarded.
    pub event_log_capacity: usize,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            seed: 0,
            deterministic: true,
            default_faults: LinkFaults::default(),
            event_log_capacity: 1 << 16,
        }
    }
}

/// Direction of a link hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the port's device into the switch.
    ToSwitch,
    /// From the switch to the port's device.
    ToDevice,
}

/// What a link did to a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkEventKind {
    /// Dropped by `loss`.
    Lost,
    /// Dropped because the link is down.
    LinkDown,
    /// Delivered twice.
    Duplicated,
    /// Held back.
    Reordered,
    /// One bit flipped.
    Corrupted,
}

/// One thing a link did, for replay checks and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkEvent {
    /// Fabric-wide sequence number of the frame (assigned when it entered
    /// the fabric; deterministic in deterministic mode).
    pub frame_id: u64,
    /// The link's port.
    pub port: PortId,
    /// Which way the frame was going.
    pub direction: Direction,
    /// What happened.
    pub kind: LinkEventKind,
    /// Fabric clock.
    pub time_ns: u64,
}

/// Per-port counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames the device sent into the port.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Frames delivered to the device.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames lost on the link (both directions).
    pub lost: u64,
    /// Frames dropped because the link was down.
    pub link_down_drops: u64,
    /// Extra copies made by duplication.
    pub duplicated: u64,
    /// Frames held back for reordering.
    pub reordered: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// Hops that waited in the event queue.
    pub delayed: u64,
    /// Frames for this port dropped because nothing is plugged in (the
    /// device was dropped).
    pub no_device_drops: u64,
    /// Frames whose destination was the port they came from (dropped).
    pub hairpin_drops: u64,
}

/// Fabric-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Frames that entered the fabric.
    pub frames: u64,
    /// Frames flooded (unknown unicast, broadcast, multicast).
    pub flooded: u64,
    /// Frames waiting in the event queue now.
    pub pending: u64,
    /// Calls into a deterministic fabric from a thread other than its
    /// creator (each one is a replay hazard).
    pub foreign_thread_calls: u64,
    /// Fabric clock.
    pub now_ns: u64,
}

/// Something plugged into a port.
pub(crate) trait PortSink: Send + Sync {
    /// A frame arrives from the switch.
    fn receive(&self, frame: &[u8]);
}

#[derive(Debug, Default)]
struct PortCounters {
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    lost: AtomicU64,
    link_down_drops: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    delayed: AtomicU64,
    no_device_drops: AtomicU64,
    hairpin_drops: AtomicU64,
}

struct LinkDir {
    faults: LinkFaults,
    rng: Rng,
}

struct Port {
    id: PortId,
    sink: RwLock<Option<Weak<dyn PortSink>>>,
    to_switch: Mutex<LinkDir>,
    to_device: Mutex<LinkDir>,
    pcap: Mutex<Option<PcapWriter>>,
    c: PortCounters,
}

struct Event {
    due_ns: u64,
    seq: u64,
    hop: Hop,
    frame_id: u64,
    data: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum Hop {
    AtSwitch { from: u32 },
    AtDevice { to: u32 },
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.due_ns, self.seq) == (o.due_ns, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due_ns, self.seq).cmp(&(o.due_ns, o.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Event>>,
    seq: u64,
}

struct PumpShared {
    queue: Mutex<Queue>,
    cv: Condvar,
    stop: AtomicBool,
}

/// Object number spaces shared by every function of the fabric, so that a
/// number one function owns is never valid in another.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next24: u32,
    owners24: HashMap<u32, u32>,
    owners8: [HashMap<u8, u32>; 2],
    next_function: u32,
}

/// 8-bit object number spaces.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Space8 {
    Eq = 0,
    QCounter = 1,
}

impl Registry {
    /// A fresh 24-bit object number for `function` (unique across object
    /// types and functions).
    pub(crate) fn alloc24(&mut self, function: u32) -> Option<u32> {
        if self.next24 == 0 {
            self.next24 = 0x100;
        }
        for _ in 0..0x00ff_ff00u32 {
            let n = self.next24;
            self.next24 = if n >= 0x00ff_ffff { 0x100 } else { n + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = self.owners24.entry(n) {
                e.insert(function);
                return Some(n);
            }
        }
        None
    }

    pub(crate) fn free24(&mut self, n: u32) {
        self.owners24.remove(&n);
    }

    pub(crate) fn owner24(&self, n: u32) -> Option<u32> {
        self.owners24.get(&n).copied()
    }

    /// The lowest free number in an 8-bit space, from `first`.
    pub(crate) fn alloc8(&mut self, space: Space8, function: u32, first: u8) -> Option<u8> {
        let m = &mut self.owners8[space as usize];
        let n = (first..=u8::MAX).find(|n| !m.contains_key(n))?;
        m.insert(n, function);
        Some(n)
    }

    pub(crate) fn free8(&mut self, space: Space8, n: u8) {
        self.owners8[space as usize].remove(&n);
    }

    pub(crate) fn owner8(&self, space: Space8, n: u8) -> Option<u32> {
        self.owners8[space as usize].get(&n).copied()
    }

    pub(crate) fn new_function(&mut self) -> u32 {
        let f = self.next_function;
        self.next_function += 1;
        f
    }
}

pub(crate) struct FabricInner {
    cfg: FabricConfig,
    start: Instant,
    virt_ns: AtomicU64,
    owner_thread: ThreadId,
    foreign_calls: AtomicU64,
    ports: RwLock<Vec<Arc<Port>>>,
    macs: Mutex<HashMap<[u8; 6], u32>>,
    pump: Arc<PumpShared>,
    next_frame: AtomicU64,
    flooded: AtomicU64,
    events: Mutex<Vec<LinkEvent>>,
    pub(crate) registry: Mutex<Registry>,
}

impl Drop for FabricInner {
    fn drop(&mut self) {
        self.pump.stop.store(true, Ordering::Release);
        self.pump.cv.notify_all();
        for p in read(&self.ports).iter() {
            if let Some(w) = lock(&p.pcap).as_mut() {
                let _ = w.flush();
            }
        }
    }
}

/// The fabric: a switch, its ports and links, and the clock. Cheap to
/// clone (a handle).
#[derive(Clone)]
pub struct Fabric {
    pub(crate) inner: Arc<FabricInner>,
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Fabric(seed {}, {}, {} ports, t={} ns)",
            self.inner.cfg.seed,
            if self.inner.cfg.deterministic {
                "deterministic"
            } else {
                "threaded"
            },
            read(&self.inner.ports).len(),
            self.inner.now_ns()
        )
    }
}

impl Fabric {
    /// A fabric with no ports. In threaded mode this starts the pump
    /// thread (it stops when the last handle is gone).
    pub fn new(cfg: FabricConfig) -> Fabric {
        let pump = Arc::new(PumpShared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let inner = Arc::new(FabricInner {
            cfg,
            start: Instant::now(),
            virt_ns: AtomicU64::new(0),
            owner_thread: std::thread::current().id(),
            foreign_calls: AtomicU64::new(0),
            ports: RwLock::new(Vec::new()),
            macs: Mutex::new(HashMap::new()),
            pump: pump.clone(),
            next_frame: AtomicU64::new(0),
            flooded: AtomicU64::new(0),
            events: Mutex::new(Vec::new()),
            registry: Mutex::new(Registry::default()),
        });
        if !inner.cfg.deterministic {
            let weak = Arc::downgrade(&inner);
            let spawned = std::thread::Builder::new()
                .name("mlx5-sim-pump".into())
                .spawn(move || pump_thread(pump, weak));
            if let Err(e) = spawned {
                tracing::error!(%e, "cannot start the fabric pump thread; delayed frames will only move in Fabric::advance");
            }
        }
        Fabric { inner }
    }

    /// The configuration.
    pub fn config(&self) -> &FabricConfig {
        &self.inner.cfg
    }

    /// Fabric clock in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }

    /// Moves the clock forward by `d` and delivers every frame that is due
    /// (in deterministic mode this is the only way time passes). Returns
    /// the number of hops taken.
    pub fn advance(&self, d: Duration) -> usize {
        self.inner.check_thread();
        self.inner.advance_by(d)
    }

    /// Sets the faults of `port`'s link (both directions).
    pub fn set_link_faults(&self, port: PortId, faults: LinkFaults) {
        if let Some(p) = self.inner.port(port.0) {
            lock(&p.to_switch).faults = faults;
            lock(&p.to_device).faults = faults;
        }
    }

    /// Sets the faults of one direction of `port`'s link.
    pub fn set_link_faults_dir(&self, port: PortId, dir: Direction, faults: LinkFaults) {
        if let Some(p) = self.inner.port(port.0) {
            match dir {
                Direction::ToSwitch => lock(&p.to_switch).faults = faults,
                Direction::ToDevice => lock(&p.to_device).faults = faults,
            }
        }
    }

    /// The faults of `port`'s link (device → switch direction).
    pub fn link_faults(&self, port: PortId) -> Option<LinkFaults> {
        self.inner.port(port.0).map(|p| lock(&p.to_switch).faults)
    }

    /// Captures every frame the port sends and receives into `out`, in
    /// pcap format (stamped with the fabric clock).
    pub fn set_pcap(&self, port: PortId, out: impl Write + Send + 'static) -> io::Result<()> {
        let p = self
            .inner
            .port(port.0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no {port}")))?;
        let w = PcapWriter::new(Box::new(out))?;
        *lock(&p.pcap) = Some(w);
        Ok(())
    }

    /// Captures `port` into a pcap file at `path`.
    pub fn pcap_to_file(&self, port: PortId, path: impl AsRef<Path>) -> io::Result<()> {
        let f = std::fs::File::create(path)?;
        self.set_pcap(port, io::BufWriter::new(f))
    }

    /// Flushes every pcap writer.
    pub fn flush_pcaps(&self) -> io::Result<()> {
        for p in read(&self.inner.ports).iter() {
            if let Some(w) = lock(&p.pcap).as_mut() {
                w.flush()?;
            }
        }
        Ok(())
    }

    /// Counters of `port`.
    pub fn port_stats(&self, port: PortId) -> Option<PortStats> {
        let p = self.inner.port(port.0)?;
        let c = &p.c;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Some(PortStats {
            tx_frames: g(&c.tx_frames),
            tx_bytes: g(&c.tx_bytes),
            rx_frames: g(&c.rx_frames),
            rx_bytes: g(&c.rx_bytes),
            lost: g(&c.lost),
            link_down_drops: g(&c.link_down_drops),
            duplicated: g(&c.duplicated),
            reordered: g(&c.reordered),
            corrupted: g(&c.corrupted),
            delayed: g(&c.delayed),
            no_device_drops: g(&c.no_device_drops),
            hairpin_drops: g(&c.hairpin_drops),
        })
    }

    /// Every port.
    pub fn ports(&self) -> Vec<PortId> {
        read(&self.inner.ports).iter().map(|p| p.id).collect()
    }

    /// Fabric-wide counters.
    pub fn stats(&self) -> FabricStats {
        FabricStats {
            frames: self.inner.next_frame.load(Ordering::Relaxed),
            flooded: self.inner.flooded.load(Ordering::Relaxed),
            pending: lock(&self.inner.pump.queue).heap.len() as u64,
            foreign_thread_calls: self.inner.foreign_calls.load(Ordering::Relaxed),
            now_ns: self.inner.now_ns(),
        }
    }

    /// What the links did (oldest first, up to the configured capacity).
    pub fn link_events(&self) -> Vec<LinkEvent> {
        lock(&self.inner.events).clone()
    }

    /// Adds a port whose device side is `sink` (the bridge's way in).
    pub(crate) fn add_sink_port(&self, sink: &Arc<dyn PortSink>) -> PortId {
        self.inner.add_port(Some(Arc::downgrade(sink)), None)
    }

    pub(crate) fn inner(&self) -> &FabricInner {
        &self.inner
    }

    /// Adds a tap: a port whose received frames are kept in memory, and
    /// which can send frames into the switch.
    pub fn add_tap(&self, mac: Option<[u8; 6]>) -> Tap {
        let sink = Arc::new(TapSink {
            frames: Mutex::new(Vec::new()),
        });
        let dyn_sink: Arc<dyn PortSink> = sink.clone();
        let port = self.inner.add_port(Some(Arc::downgrade(&dyn_sink)), mac);
        Tap {
            fabric: self.clone(),
            port,
            sink,
            _keep: dyn_sink,
        }
    }

    /// Delivers `frame` to `port`'s device as if it came from the switch
    /// (through the port's switch → device link and its faults).
    pub fn inject(&self, port: PortId, frame: &[u8]) {
        self.inner.check_thread();
        let id = self.inner.next_frame.fetch_add(1, Ordering::Relaxed);
        self.inner
            .hop(Hop::AtDevice { to: port.0 }, id, frame.to_vec(), false);
    }
}

/// A port of the fabric that records what it receives (for tests).
pub struct Tap {
    fabric: Fabric,
    port: PortId,
    sink: Arc<TapSink>,
    _keep: Arc<dyn PortSink>,
}

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tap({})", self.port)
    }
}

struct TapSink {
    frames: Mutex<Vec<Vec<u8>>>,
}

impl PortSink for TapSink {
    fn receive(&self, frame: &[u8]) {
        lock(&self.frames).push(frame.to_vec());
    }
}

impl Tap {
    /// The tap's port.
    pub fn port(&self) -> PortId {
        self.port
    }

    /// Frames received so far (and forgets them).
    pub fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *lock(&self.sink.frames))
    }

    /// Frames received and not yet taken.
    pub fn len(&self) -> usize {
        lock(&self.sink.frames).len()
    }

    /// True if nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends a frame from the tap into the switch.
    pub fn send(&self, frame: &[u8]) {
        self.fabric.inner.transmit(self.port.0, frame.to_vec());
    }
}

impl FabricInner {
    pub(crate) fn deterministic(&self) -> bool {
        self.cfg.deterministic
    }

    pub(crate) fn now_ns(&self) -> u64 {
        let v = self.virt_ns.load(Ordering::Acquire);
        if self.cfg.deterministic {
            v
        } else {
            v.saturating_add(self.start.elapsed().as_nanos() as u64)
        }
    }

    /// Moves the clock by `d` and takes every hop that is due.
    pub(crate) fn advance_by(&self, d: Duration) -> usize {
        self.virt_ns.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX / 4)) as u64,
            Ordering::AcqRel,
        );
        self.pump_due()
    }

    /// Counts calls into a deterministic fabric from foreign threads.
    pub(crate) fn check_thread(&self) {
        if self.cfg.deterministic && std::thread::current().id() != self.owner_thread {
            let n = self.foreign_calls.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                tracing::warn!(
                    "deterministic fabric used from a second thread: replay is no longer exact"
                );
            }
        }
    }

    fn port(&self, id: u32) -> Option<Arc<Port>> {
        read(&self.ports).get(id as usize).cloned()
    }

    pub(crate) fn add_port(
        &self,
        sink: Option<Weak<dyn PortSink>>,
        mac: Option<[u8; 6]>,
    ) -> PortId {
        let mut ports = write(&self.ports);
        let id = ports.len() as u32;
        let seed = self.cfg.seed;
        let mk = |stream: u64| LinkDir {
            faults: self.cfg.default_faults,
            rng: Rng::new(seed, stream),
        };
        ports.push(Arc::new(Port {
            id: PortId(id),
            sink: RwLock::new(sink),
            to_switch: Mutex::new(mk(u64::from(id) * 2)),
            to_device: Mutex::new(mk(u64::from(id) * 2 + 1)),
            pcap: Mutex::new(None),
            c: PortCounters::default(),
        }));
        drop(ports);
        if let Some(m) = mac {
            lock(&self.macs).insert(m, id);
        }
        PortId(id)
    }

    pub(crate) fn set_sink(&self, port: PortId, sink: Weak<dyn PortSink>) {
        if let Some(p) = self.port(port.0) {
            *write(&p.sink) = Some(sink);
        }
    }

    pub(crate) fn link_is_down(&self, port: PortId) -> bool {
        self.port(port.0)
            .is_some_and(|p| lock(&p.to_device).faults.down || lock(&p.to_switch).faults.down)
    }

    /// The port the switch has learned (or was told) `mac` is behind.
    pub(crate) fn port_of_mac(&self, mac: &[u8; 6]) -> Option<u32> {
        lock(&self.macs).get(mac).copied()
    }

    /// A frame leaves the device at `port`. No lock of any device may be
    /// held by the caller.
    pub(crate) fn transmit(&self, port: u32, frame: Vec<u8>) {
        self.check_thread();
        let Some(p) = self.port(port) else { return };
        p.c.tx_frames.fetch_add(1, Ordering::Relaxed);
        p.c.tx_bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        self.capture(&p, &frame);
        let id = self.next_frame.fetch_add(1, Ordering::Relaxed);
        self.hop(Hop::AtSwitch { from: port }, id, frame, false);
        if self.cfg.deterministic {
            self.pump_due();
        }
    }

    fn capture(&self, p: &Port, frame: &[u8]) {
        let mut g = lock(&p.pcap);
        if let Some(w) = g.as_mut() {
            if let Err(e) = w.write_frame(self.now_ns(), frame) {
                tracing::warn!(%e, port = p.id.0, "pcap write failed; capture stopped");
                *g = None;
            }
        }
    }

    fn log_event(&self, frame_id: u64, port: u32, direction: Direction, kind: LinkEventKind) {
        let mut ev = lock(&self.events);
        if ev.len() < self.cfg.event_log_capacity {
            ev.push(LinkEvent {
                frame_id,
                port: PortId(port),
                direction,
                kind,
                time_ns: self.now_ns(),
            });
        }
    }

    /// Applies a link's faults to a frame about to take `hop`, then takes
    /// it now or queues it. `queued` is true when the frame comes out of
    /// the event queue (its link delay has been paid already).
    fn hop(&self, hop: Hop, frame_id: u64, mut frame: Vec<u8>, queued: bool) {
        if queued {
            self.arrive(hop, frame_id, frame);
            return;
        }
        let (port, dir) = match hop {
            Hop::AtSwitch { from } => (from, Direction::ToSwitch),
            Hop::AtDevice { to } => (to, Direction::ToDevice),
        };
        let Some(p) = self.port(port) else { return };
        let link = match dir {
            Direction::ToSwitch => &p.to_switch,
            Direction::ToDevice => &p.to_device,
        };
        let mut copies: [(u64, bool); 2] = [(0, false); 2];
        let mut n = 1;
        {
            let mut l = lock(link);
            let f = l.faults;
            if !f.is_clean() {
                if f.down {
                    p.c.link_down_drops.fetch_add(1, Ordering::Relaxed);
                    drop(l);
                    self.log_event(frame_id, port, dir, LinkEventKind::LinkDown);
                    return;
                }
                if l.rng.chance(f.loss) {
                    p.c.lost.fetch_add(1, Ordering::Relaxed);
                    drop(l);
                    self.log_event(frame_id, port, dir, LinkEventKind::Lost);
                    return;
                }
                if l.rng.chance(f.corrupt) && !frame.is_empty() {
                    let lo = if frame.len() > 14 { 14 } else { 0 };
                    let at = lo + l.rng.below((frame.len() - lo) as u64) as usize;
                    let bit = l.rng.below(8);
                    frame[at] ^= 1 << bit;
                    p.c.corrupted.fetch_add(1, Ordering::Relaxed);
                    self.log_event(frame_id, port, dir, LinkEventKind::Corrupted);
                }
                let delay = f.delay.as_nanos() as u64;
                copies[0].0 = delay;
                if l.rng.chance(f.reorder) {
                    copies[0].0 = delay + f.reorder_delay.as_nanos() as u64;
                    copies[0].1 = true;
                    p.c.reordered.fetch_add(1, Ordering::Relaxed);
                    self.log_event(frame_id, port, dir, LinkEventKind::Reordered);
                }
                if l.rng.chance(f.duplicate) {
                    copies[1] = (delay, false);
                    n = 2;
                    p.c.duplicated.fetch_add(1, Ordering::Relaxed);
                    self.log_event(frame_id, port, dir, LinkEventKind::Duplicated);
                }
            }
        }
        let now = self.now_ns();
        for (i, &(delay, _)) in copies[..n].iter().enumerate() {
            let data = if i + 1 == n {
                std::mem::take(&mut frame)
            } else {
                frame.clone()
            };
            if delay == 0 {
                self.arrive(hop, frame_id, data);
            } else {
                p.c.delayed.fetch_add(1, Ordering::Relaxed);
                let mut q = lock(&self.pump.queue);
                let seq = q.seq;
                q.seq += 1;
                q.heap.push(Reverse(Event {
                    due_ns: now + delay,
                    seq,
                    hop,
                    frame_id,
                    data,
                }));
                drop(q);
                self.pump.cv.notify_one();
            }
        }
    }

    fn arrive(&self, hop: Hop, frame_id: u64, frame: Vec<u8>) {
        match hop {
            Hop::AtSwitch { from } => self.switch(from, frame_id, frame),
            Hop::AtDevice { to } => self.deliver(to, frame),
        }
    }

    fn switch(&self, from: u32, frame_id: u64, frame: Vec<u8>) {
        if frame.len() < 14 {
            return;
        }
        let mut dmac = [0u8; 6];
        dmac.copy_from_slice(&frame[0..6]);
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&frame[6..12]);
        let dest = {
            let mut macs = lock(&self.macs);
            if smac[0] & 1 == 0 {
                macs.insert(smac, from);
            }
            if dmac[0] & 1 == 0 {
                macs.get(&dmac).copied()
            } else {
                None
            }
        };
        match dest {
            Some(to) if to == from => {
                if let Some(p) = self.port(from) {
                    p.c.hairpin_drops.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(to) => self.hop(Hop::AtDevice { to }, frame_id, frame, false),
            None => {
                self.flooded.fetch_add(1, Ordering::Relaxed);
                let n = read(&self.ports).len() as u32;
                let others: Vec<u32> = (0..n).filter(|&i| i != from).collect();
                let last = others.len();
                let mut frame = Some(frame);
                for (k, to) in others.into_iter().enumerate() {
                    let data = if k + 1 == last {
                        frame.take().unwrap_or_default()
                    } else {
                        frame.as_ref().cloned().unwrap_or_default()
                    };
                    self.hop(Hop::AtDevice { to }, frame_id, data, false);
                }
            }
        }
    }

    fn deliver(&self, to: u32, frame: Vec<u8>) {
        let Some(p) = self.port(to) else { return };
        let sink = read(&p.sink).as_ref().and_then(Weak::upgrade);
        let Some(sink) = sink else {
            p.c.no_device_drops.fetch_add(1, Ordering::Relaxed);
            return;
        };
        p.c.rx_frames.fetch_add(1, Ordering::Relaxed);
        p.c.rx_bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        self.capture(&p, &frame);
        sink.receive(&frame);
    }

    /// Takes every queued hop that is due. Returns how many.
    pub(crate) fn pump_due(&self) -> usize {
        let mut n = 0;
        loop {
            let now = self.now_ns();
            let ev = {
                let mut q = lock(&self.pump.queue);
                match q.heap.peek() {
                    Some(Reverse(e)) if e.due_ns <= now => q.heap.pop().map(|r| r.0),
                    _ => None,
                }
            };
            let Some(ev) = ev else { break };
            self.hop(ev.hop, ev.frame_id, ev.data, true);
            n += 1;
        }
        n
    }
}

fn pump_thread(shared: Arc<PumpShared>, fabric: Weak<FabricInner>) {
    const IDLE: Duration = Duration::from_millis(20);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(f) = fabric.upgrade() else { return };
        let now = f.now_ns();
        let wait = {
            let q = lock(&shared.queue);
            match q.heap.peek() {
                Some(Reverse(e)) if e.due_ns <= now => None,
                Some(Reverse(e)) => Some(Duration::from_nanos(e.due_ns - now).min(IDLE)),
                None => Some(IDLE),
            }
        };
        match wait {
            None => {
                f.pump_due();
                drop(f);
            }
            Some(d) => {
                drop(f);
                let q = lock(&shared.queue);
                let _ = shared.cv.wait_timeout(q, d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: [u8; 6], src: [u8; 6], n: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12] = 0x88;
        f[13] = 0xb5;
        f[14] = n;
        f
    }

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    #[test]
    fn switch_learns_and_floods() {
        let fab = Fabric::new(FabricConfig::default());
        let a = fab.add_tap(Some(A));
        let b = fab.add_tap(None);
        let c = fab.add_tap(None);
        // B unknown: flooded to b and c.
        a.send(&frame(B, A, 1));
        assert_eq!((b.len(), c.len()), (1, 1));
        // b answers; now B is learned.
        b.send(&frame(A, B, 2));
        assert_eq!(a.len(), 1);
        a.send(&frame(B, A, 3));
        assert_eq!((b.len(), c.len()), (2, 1));
        assert_eq!(fab.stats().flooded, 1);
    }

    #[test]
    fn delay_needs_the_clock() {
        let fab = Fabric::new(FabricConfig::default());
        let a = fab.add_tap(Some(A));
        let b = fab.add_tap(Some(B));
        fab.set_link_faults(
            b.port(),
            LinkFaults {
                delay: Duration::from_micros(5),
                ..Default::default()
            },
        );
        a.send(&frame(B, A, 1));
        assert!(b.is_empty());
        assert_eq!(fab.advance(Duration::from_micros(4)), 0);
        assert_eq!(fab.advance(Duration::from_micros(1)), 1);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn loss_replays_per_seed() {
        let run = |seed| {
            let fab = Fabric::new(FabricConfig {
                seed,
                ..Default::default()
            });
            let a = fab.add_tap(Some(A));
            let b = fab.add_tap(Some(B));
            fab.set_link_faults(
                a.port(),
                LinkFaults {
                    loss: 0.3,
                    ..Default::default()
                },
            );
            for i in 0..200 {
                a.send(&frame(B, A, i as u8));
            }
            let lost: Vec<u64> = fab.link_events().iter().map(|e| e.frame_id).collect();
            (lost, b.len())
        };
        let (l1, n1) = run(5);
        let (l2, n2) = run(5);
        let (l3, _) = run(6);
        assert_eq!(l1, l2);
        assert_eq!(n1, n2);
        assert_eq!(n1 + l1.len(), 200);
        assert_ne!(l1, l3);
    }
}
