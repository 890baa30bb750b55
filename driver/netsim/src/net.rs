//! [`Network`]: the single-threaded network model (ports, links, switch,
//! event queue). Time is passed in; it never reads a clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::io::{self, Write};

use rustc_hash::FxHashMap;

use crate::link::{Direction, LinkFaults, PortConfig, PortId, serialization_ps};
use crate::pcap::PcapWriter;
use crate::queue::{Admit, Egress, QueueSample, QueueStats};
use crate::rng::Rng;

/// Settings of a network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Seed of every random stream (one per link direction).
    pub seed: u64,
    /// Faults of every new port's link, both directions.
    pub faults: LinkFaults,
    /// Rate and buffer of every new port.
    pub port: PortConfig,
    /// Unicast to a MAC the switch does not know is flooded to every
    /// other port (a learning switch); when false it is dropped and
    /// counted (`unknown_unicast_drops`).
    pub flood_unknown_unicast: bool,
    /// How many [`LinkEvent`]s are kept ([`Network::link_events`]); later
    /// ones are counted but not kept.
    pub event_log_capacity: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            seed: 0,
            faults: LinkFaults::default(),
            port: PortConfig::default(),
            flood_unknown_unicast: true,
            event_log_capacity: 1 << 16,
        }
    }
}

/// What the network did to a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkEventKind {
    /// Lost on the wire (`loss`).
    Lost,
    /// Dropped because the link is down.
    LinkDown,
    /// Delivered twice.
    Duplicated,
    /// Held back so that later frames overtake it.
    Reordered,
    /// Damaged past the frame check and delivered.
    Corrupted,
    /// Damaged on the wire and dropped by the receiving port's frame check.
    FcsError,
    /// Dropped by the switch: the output buffer towards the port was full
    /// (direction [`Direction::ToDevice`]).
    BufferFull,
}

/// One thing the network did, for replay checks and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkEvent {
    /// Network-wide sequence number of the frame (assigned when it entered
    /// the network: deterministic for one driving thread).
    pub frame_id: u64,
    /// The link's port.
    pub port: PortId,
    /// Which way the frame was going.
    pub direction: Direction,
    /// What happened.
    pub kind: LinkEventKind,
    /// Network time.
    pub time_ns: u64,
}

/// Per-port counters (both directions of its link, and the switch's
/// output queue towards it).
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
    /// Frames damaged past the frame check (delivered).
    pub corrupted: u64,
    /// Frames damaged on the wire and dropped by the frame check.
    pub fcs_errors: u64,
    /// Frames the switch dropped because its buffer towards this port was
    /// full.
    pub queue_drops: u64,
    /// Hops that waited in the event queue.
    pub delayed: u64,
    /// Frames for this port dropped because nothing is plugged in.
    pub no_device_drops: u64,
    /// Frames whose destination was the port they came from (dropped).
    pub hairpin_drops: u64,
    /// Frames from this port too short for an Ethernet header (dropped by
    /// the switch).
    pub runts: u64,
}

/// Network-wide counters (sums over ports, and the switch's own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames that entered the network (sent or injected).
    pub frames: u64,
    /// Frames flooded (unknown unicast, broadcast, multicast).
    pub flooded: u64,
    /// Unknown unicast dropped (flooding off).
    pub unknown_unicast_drops: u64,
    /// Hops waiting in the event queue now.
    pub pending: u64,
    /// Sum of every port's counters.
    pub ports: PortStats,
}

struct LinkDir {
    faults: LinkFaults,
    /// `faults` has nothing random (the common case): a frame arrives
    /// `delay_ns` after its last bit left.
    fixed: bool,
    /// `faults.delay` in ns.
    delay_ns: u64,
    rng: Rng,
    /// Transmitter free again at (ps); only the device → switch direction
    /// uses it (the other is the switch's output queue).
    busy_ps: u64,
    /// Latest arrival so far (ns), which in-order frames may not precede.
    last_arrival_ns: u64,
}

impl LinkDir {
    fn new(seed: u64, stream: u64, faults: LinkFaults) -> LinkDir {
        LinkDir {
            faults,
            fixed: faults.is_fixed(),
            delay_ns: faults.delay.as_nanos() as u64,
            rng: Rng::with_stream(seed, stream),
            busy_ps: 0,
            last_arrival_ns: 0,
        }
    }

    fn set(&mut self, faults: LinkFaults) {
        self.faults = faults;
        self.fixed = faults.is_fixed();
        self.delay_ns = faults.delay.as_nanos() as u64;
    }
}

/// A MAC as a hash key (one word: one multiply to hash).
#[inline]
fn mac_key(m: &[u8]) -> u64 {
    u64::from(m[0]) << 40
        | u64::from(m[1]) << 32
        | u64::from(m[2]) << 24
        | u64::from(m[3]) << 16
        | u64::from(m[4]) << 8
        | u64::from(m[5])
}

struct Port<D> {
    mac: Option<[u8; 6]>,
    /// A MAC the switch maps to this port for sure (the port's own, until
    /// it is learned behind another port): frames from it need no
    /// learning lookup.
    own_mac: Option<u64>,
    dev: D,
    cfg: PortConfig,
    up: LinkDir,
    down: LinkDir,
    egress: Egress,
    pcap: Option<PcapWriter>,
    stats: PortStats,
    /// The last unicast destination of frames from this port: (MAC key,
    /// port, MAC table version), so a stream to one peer skips the lookup.
    last_dst: (u64, u32, u64),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// Arrives at the switch from the port's device.
    AtSwitch,
    /// Arrives at the port's device.
    AtDevice,
}

struct Event {
    due_ns: u64,
    seq: u64,
    hop: Hop,
    port: u32,
    frame_id: u64,
    frame: Vec<u8>,
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

/// What crossing a link did.
enum Crossing {
    Dropped,
    /// Arrives at this time.
    One(u64),
    /// Arrives twice (duplicated).
    Two(u64, u64),
}

/// Frame buffers kept for reuse at most.
const POOL_MAX: usize = 1 << 14;

/// The network: ports with their devices (`D`, whatever the user plugs in),
/// links, a learning switch with output queues, and the event queue.
///
/// Single-threaded and clock-free: every call that moves frames takes the
/// current time, and frames due by then are handed to the `deliver`
/// callback as `(port, device, frame)`. The callback returns whether the
/// device took the frame (false counts a `no_device_drops`); it may keep
/// the frame buffer with `std::mem::take`.
pub struct Network<D> {
    cfg: NetConfig,
    ports: Vec<Port<D>>,
    macs: FxHashMap<u64, u32>,
    /// Changes of `macs` so far (invalidates the ports' `last_dst`).
    macs_version: u64,
    heap: BinaryHeap<Reverse<Event>>,
    seq: u64,
    next_frame: u64,
    pool: Vec<Vec<u8>>,
    flooded: u64,
    unknown_unicast_drops: u64,
    log: Vec<LinkEvent>,
}

impl<D> fmt::Debug for Network<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Network {{ seed {}, {} ports, {} pending }}",
            self.cfg.seed,
            self.ports.len(),
            self.heap.len()
        )
    }
}

impl<D> Drop for Network<D> {
    fn drop(&mut self) {
        let _ = self.flush_pcaps();
    }
}

fn log_event(
    log: &mut Vec<LinkEvent>,
    cap: usize,
    frame_id: u64,
    port: u32,
    direction: Direction,
    kind: LinkEventKind,
    time_ns: u64,
) {
    if log.len() < cap {
        log.push(LinkEvent {
            frame_id,
            port: PortId(port),
            direction,
            kind,
            time_ns,
        });
    }
}

impl<D> Network<D> {
    /// A network with no ports.
    pub fn new(cfg: NetConfig) -> Network<D> {
        Network {
            cfg,
            ports: Vec::new(),
            macs: FxHashMap::default(),
            macs_version: 0,
            heap: BinaryHeap::with_capacity(1 << 12),
            seq: 0,
            next_frame: 0,
            pool: Vec::new(),
            flooded: 0,
            unknown_unicast_drops: 0,
            log: Vec::new(),
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// Adds a port with device `dev`. With a `mac`, the switch knows from
    /// the start that the MAC is behind this port (otherwise it learns
    /// source MACs from traffic).
    pub fn add_port(&mut self, mac: Option<[u8; 6]>, dev: D) -> PortId {
        let id = self.ports.len() as u32;
        let seed = self.cfg.seed;
        let f = self.cfg.faults;
        self.ports.push(Port {
            mac,
            own_mac: mac.map(|m| mac_key(&m)),
            dev,
            cfg: self.cfg.port,
            up: LinkDir::new(seed, u64::from(id) * 2, f),
            down: LinkDir::new(seed, u64::from(id) * 2 + 1, f),
            egress: Egress::default(),
            pcap: None,
            stats: PortStats::default(),
            last_dst: (u64::MAX, 0, u64::MAX),
        });
        if let Some(m) = mac {
            self.macs.insert(mac_key(&m), id);
            self.macs_version += 1;
        }
        PortId(id)
    }

    /// Number of ports.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// The device of `port`.
    ///
    /// # Panics
    /// If there is no such port.
    pub fn device(&self, port: PortId) -> &D {
        &self.ports[port.0 as usize].dev
    }

    /// The device of `port`, mutably.
    ///
    /// # Panics
    /// If there is no such port.
    pub fn device_mut(&mut self, port: PortId) -> &mut D {
        &mut self.ports[port.0 as usize].dev
    }

    /// Every device, in port order.
    pub fn devices(&self) -> impl Iterator<Item = &D> {
        self.ports.iter().map(|p| &p.dev)
    }

    /// The MAC `port` was added with.
    pub fn port_mac(&self, port: PortId) -> Option<[u8; 6]> {
        self.ports.get(port.0 as usize).and_then(|p| p.mac)
    }

    /// The port the switch has learned (or was told) `mac` is behind.
    pub fn port_of_mac(&self, mac: &[u8; 6]) -> Option<PortId> {
        self.macs.get(&mac_key(mac)).map(|&p| PortId(p))
    }

    fn port_mut(&mut self, port: PortId) -> Option<&mut Port<D>> {
        self.ports.get_mut(port.0 as usize)
    }

    /// Sets the faults of one direction of `port`'s link, or of both
    /// (`dir` `None`).
    pub fn set_faults(&mut self, port: PortId, dir: Option<Direction>, faults: LinkFaults) {
        if let Some(p) = self.port_mut(port) {
            if dir != Some(Direction::ToDevice) {
                p.up.set(faults);
            }
            if dir != Some(Direction::ToSwitch) {
                p.down.set(faults);
            }
        }
    }

    /// The faults of one direction of `port`'s link.
    pub fn faults(&self, port: PortId, dir: Direction) -> Option<LinkFaults> {
        let p = self.ports.get(port.0 as usize)?;
        Some(match dir {
            Direction::ToSwitch => p.up.faults,
            Direction::ToDevice => p.down.faults,
        })
    }

    /// True if either direction of `port`'s link is down.
    pub fn link_is_down(&self, port: PortId) -> bool {
        self.ports
            .get(port.0 as usize)
            .is_some_and(|p| p.up.faults.down || p.down.faults.down)
    }

    /// Sets `port`'s link rate and the switch's buffer towards it.
    pub fn set_port_config(&mut self, port: PortId, cfg: PortConfig) {
        if let Some(p) = self.port_mut(port) {
            p.cfg = cfg;
        }
    }

    /// `port`'s link rate and buffer.
    pub fn port_config(&self, port: PortId) -> Option<PortConfig> {
        self.ports.get(port.0 as usize).map(|p| p.cfg)
    }

    /// The switch's output queue towards `port`, with its occupancy at
    /// `now_ns`.
    pub fn queue(&self, port: PortId, now_ns: u64) -> Option<QueueStats> {
        let p = self.ports.get(port.0 as usize)?;
        Some(p.egress.stats(&p.cfg, now_ns))
    }

    /// Records the output queue towards `port` at every arrival (up to
    /// `capacity` samples; 0 stops recording). Clears earlier samples.
    pub fn set_queue_trace(&mut self, port: PortId, capacity: usize) {
        if let Some(p) = self.port_mut(port) {
            p.egress.set_trace(capacity);
        }
    }

    /// The samples recorded for `port`'s output queue.
    pub fn queue_trace(&self, port: PortId) -> &[QueueSample] {
        self.ports
            .get(port.0 as usize)
            .map_or(&[], |p| p.egress.trace())
    }

    /// Forgets `port`'s queue high-water marks, drop counts and trace (to
    /// measure one phase of a run).
    pub fn reset_queue_stats(&mut self, port: PortId) {
        if let Some(p) = self.port_mut(port) {
            p.egress.reset_stats();
        }
    }

    /// Captures every frame `port`'s device sends and receives into `out`
    /// (pcap, nanosecond timestamps of network time).
    pub fn set_pcap(&mut self, port: PortId, out: Box<dyn Write + Send>) -> io::Result<()> {
        let w = PcapWriter::new(out)?;
        let p = self
            .port_mut(port)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no {port}")))?;
        p.pcap = Some(w);
        Ok(())
    }

    /// Flushes every pcap writer.
    pub fn flush_pcaps(&mut self) -> io::Result<()> {
        for p in &mut self.ports {
            if let Some(w) = p.pcap.as_mut() {
                w.flush()?;
            }
        }
        Ok(())
    }

    /// Counters of `port`.
    pub fn port_stats(&self, port: PortId) -> Option<PortStats> {
        self.ports.get(port.0 as usize).map(|p| p.stats)
    }

    /// Network-wide counters.
    pub fn stats(&self) -> NetStats {
        let mut t = PortStats::default();
        for p in &self.ports {
            let s = &p.stats;
            t.tx_frames += s.tx_frames;
            t.tx_bytes += s.tx_bytes;
            t.rx_frames += s.rx_frames;
            t.rx_bytes += s.rx_bytes;
            t.lost += s.lost;
            t.link_down_drops += s.link_down_drops;
            t.duplicated += s.duplicated;
            t.reordered += s.reordered;
            t.corrupted += s.corrupted;
            t.fcs_errors += s.fcs_errors;
            t.queue_drops += s.queue_drops;
            t.delayed += s.delayed;
            t.no_device_drops += s.no_device_drops;
            t.hairpin_drops += s.hairpin_drops;
            t.runts += s.runts;
        }
        NetStats {
            frames: self.next_frame,
            flooded: self.flooded,
            unknown_unicast_drops: self.unknown_unicast_drops,
            pending: self.heap.len() as u64,
            ports: t,
        }
    }

    /// What the links and the switch did (oldest first, up to the
    /// configured capacity).
    pub fn link_events(&self) -> &[LinkEvent] {
        &self.log
    }

    /// Hops waiting in the event queue.
    pub fn pending(&self) -> usize {
        self.heap.len()
    }

    /// Time of the next hop in the event queue.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.0.due_ns)
    }

    /// An empty frame buffer (reused from delivered frames when there are
    /// some).
    pub fn frame_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// Keeps `frame`'s buffer (emptied) for [`frame_buf`](Self::frame_buf),
    /// up to a bound.
    pub fn recycle(&mut self, mut frame: Vec<u8>) {
        if frame.capacity() != 0 && self.pool.len() < POOL_MAX {
            frame.clear();
            self.pool.push(frame);
        }
    }

    /// `port`'s device sends `frame` at `now_ns`. Hops due by then (with
    /// no delay or rate on the way) are taken at once, through `deliver`.
    pub fn transmit<F>(&mut self, now_ns: u64, port: PortId, frame: Vec<u8>, deliver: &mut F)
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let id = self.next_frame;
        self.next_frame += 1;
        let p = port.0 as usize;
        let Some(pt) = self.ports.get_mut(p) else {
            return self.recycle(frame);
        };
        pt.stats.tx_frames += 1;
        pt.stats.tx_bytes += frame.len() as u64;
        capture(&mut pt.pcap, p, now_ns, &frame);
        if pt.up.faults.down {
            pt.stats.link_down_drops += 1;
            let cap = self.cfg.event_log_capacity;
            log_event(
                &mut self.log,
                cap,
                id,
                port.0,
                Direction::ToSwitch,
                LinkEventKind::LinkDown,
                now_ns,
            );
            return self.recycle(frame);
        }
        let rate = pt.cfg.rate_bps;
        if rate == 0
            && pt.up.fixed
            && let Some(to) = self.cut_through(p, &frame)
        {
            // Nothing on the way can queue, drop or draw: the frame reaches
            // the device after the two propagation delays, exactly as the
            // hop-by-hop path would take it there.
            let at = now_ns + self.ports[p].up.delay_ns + self.ports[to].down.delay_ns;
            if at > now_ns {
                return self.schedule(at, Hop::AtDevice, to, id, frame);
            }
            return self.deliver(now_ns, to, frame, deliver);
        }
        let end_ps = if rate == 0 {
            now_ns.saturating_mul(1000)
        } else {
            let pt = &mut self.ports[p];
            let end = now_ns.saturating_mul(1000).max(pt.up.busy_ps)
                + serialization_ps(frame.len(), rate);
            pt.up.busy_ps = end;
            end
        };
        self.cross_then(now_ns, end_ps, p, Direction::ToSwitch, id, frame, deliver);
    }

    /// The destination port of a frame from port `from` whose whole path
    /// is trivial: unicast from the port's own MAC (nothing to learn) to a
    /// known other port whose queue is unlimited and whose link towards
    /// the device has only a fixed delay. `None` sends it hop by hop.
    #[inline]
    fn cut_through(&mut self, from: usize, frame: &[u8]) -> Option<usize> {
        if frame.len() < 14 || frame[0] & 1 != 0 {
            return None;
        }
        if self.ports[from].own_mac != Some(mac_key(&frame[6..12])) {
            return None;
        }
        let key = mac_key(&frame[0..6]);
        let (k, p, v) = self.ports[from].last_dst;
        let to = if k == key && v == self.macs_version {
            p
        } else {
            let p = *self.macs.get(&key)?;
            self.ports[from].last_dst = (key, p, self.macs_version);
            p
        } as usize;
        let t = &self.ports[to];
        (to != from && t.cfg.is_unlimited() && t.down.fixed).then_some(to)
    }

    /// Delivers `frame` towards `port`'s device as if it came from the
    /// switch: through the output queue and the switch → device link.
    pub fn inject<F>(&mut self, now_ns: u64, port: PortId, frame: Vec<u8>, deliver: &mut F)
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let id = self.next_frame;
        self.next_frame += 1;
        if (port.0 as usize) < self.ports.len() {
            self.egress(now_ns, port.0 as usize, id, frame, deliver);
        }
    }

    /// Takes every hop due by `now_ns`, in time order. Returns how many.
    pub fn run_until<F>(&mut self, now_ns: u64, deliver: &mut F) -> usize
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let mut n = 0;
        while self.heap.peek().is_some_and(|e| e.0.due_ns <= now_ns) {
            let Some(Reverse(ev)) = self.heap.pop() else {
                break;
            };
            n += 1;
            let p = ev.port as usize;
            match ev.hop {
                Hop::AtSwitch => self.switch(ev.due_ns, p, ev.frame_id, ev.frame, deliver),
                Hop::AtDevice if self.ports[p].down.faults.down => {
                    // The link went down while the frame was on it.
                    self.ports[p].stats.link_down_drops += 1;
                    self.recycle(ev.frame);
                }
                Hop::AtDevice => self.deliver(ev.due_ns, p, ev.frame, deliver),
            }
        }
        n
    }

    fn schedule(&mut self, due_ns: u64, hop: Hop, port: usize, frame_id: u64, frame: Vec<u8>) {
        self.ports[port].stats.delayed += 1;
        self.seq += 1;
        self.heap.push(Reverse(Event {
            due_ns,
            seq: self.seq,
            hop,
            port: port as u32,
            frame_id,
            frame,
        }));
    }

    /// Applies one link direction's faults to a frame whose last bit went
    /// onto the wire at `end_ps`, then takes the next hop at `t_ns` (when
    /// it arrives by then) or schedules it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn cross_then<F>(
        &mut self,
        t_ns: u64,
        end_ps: u64,
        p: usize,
        dir: Direction,
        id: u64,
        mut frame: Vec<u8>,
        deliver: &mut F,
    ) where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let crossing = self.cross(t_ns, end_ps, p, dir, id, &mut frame);
        let hop = match dir {
            Direction::ToSwitch => Hop::AtSwitch,
            Direction::ToDevice => Hop::AtDevice,
        };
        match crossing {
            Crossing::Dropped => self.recycle(frame),
            Crossing::One(at) => self.next_hop(t_ns, at, hop, p, id, frame, deliver),
            Crossing::Two(a, b) => {
                let mut copy = self.frame_buf();
                copy.extend_from_slice(&frame);
                self.next_hop(t_ns, a, hop, p, id, frame, deliver);
                self.next_hop(t_ns, b, hop, p, id, copy, deliver);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn next_hop<F>(
        &mut self,
        t_ns: u64,
        at_ns: u64,
        hop: Hop,
        p: usize,
        id: u64,
        frame: Vec<u8>,
        deliver: &mut F,
    ) where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        if at_ns > t_ns {
            return self.schedule(at_ns, hop, p, id, frame);
        }
        match hop {
            Hop::AtSwitch => self.switch(t_ns, p, id, frame, deliver),
            Hop::AtDevice => self.deliver(t_ns, p, frame, deliver),
        }
    }

    #[inline]
    fn cross(
        &mut self,
        t_ns: u64,
        end_ps: u64,
        p: usize,
        dir: Direction,
        id: u64,
        frame: &mut [u8],
    ) -> Crossing {
        let cap = self.cfg.event_log_capacity;
        let log = &mut self.log;
        let port = &mut self.ports[p];
        let link = match dir {
            Direction::ToSwitch => &mut port.up,
            Direction::ToDevice => &mut port.down,
        };
        let base = end_ps.div_ceil(1000) + link.delay_ns;
        if link.fixed {
            return Crossing::One(base);
        }
        let f = link.faults;
        let s = &mut port.stats;
        let mut ev = |kind| log_event(log, cap, id, p as u32, dir, kind, t_ns);
        if f.down {
            s.link_down_drops += 1;
            ev(LinkEventKind::LinkDown);
            return Crossing::Dropped;
        }
        let rng = &mut link.rng;
        if rng.chance(f.loss) {
            s.lost += 1;
            ev(LinkEventKind::Lost);
            return Crossing::Dropped;
        }
        if rng.chance(f.fcs_error) {
            s.fcs_errors += 1;
            ev(LinkEventKind::FcsError);
            return Crossing::Dropped;
        }
        if rng.chance(f.corrupt) && frame.len() > f.corrupt_from {
            let at = f.corrupt_from + rng.below((frame.len() - f.corrupt_from) as u64) as usize;
            frame[at] ^= 1 << rng.below(8);
            s.corrupted += 1;
            ev(LinkEventKind::Corrupted);
        }
        let jitter = f.jitter.as_nanos() as u64;
        let mut at = base + if jitter > 0 { rng.below(jitter + 1) } else { 0 };
        if rng.chance(f.reorder) {
            at += f.reorder_delay.as_nanos() as u64;
            s.reordered += 1;
            ev(LinkEventKind::Reordered);
        } else {
            at = at.max(link.last_arrival_ns);
            link.last_arrival_ns = at;
        }
        if rng.chance(f.duplicate) {
            s.duplicated += 1;
            ev(LinkEventKind::Duplicated);
            return Crossing::Two(at, at);
        }
        Crossing::One(at)
    }

    /// The switch receives `frame` from port `from` at `t_ns`.
    fn switch<F>(&mut self, t_ns: u64, from: usize, id: u64, frame: Vec<u8>, deliver: &mut F)
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        if frame.len() < 14 {
            self.ports[from].stats.runts += 1;
            return self.recycle(frame);
        }
        // Learn the source, unless it is the MAC the port was added with
        // (already known, no lookup needed).
        let smac = &frame[6..12];
        let key = mac_key(smac);
        if smac[0] & 1 == 0 && self.ports[from].own_mac != Some(key) {
            let old = self.macs.insert(key, from as u32);
            if old != Some(from as u32) {
                self.macs_version += 1;
            }
            if let Some(old) = old
                && old as usize != from
                && let Some(o) = self.ports.get_mut(old as usize)
                && o.own_mac == Some(key)
            {
                // The MAC moved: its old port no longer owns it for sure.
                o.own_mac = None;
            }
        }
        let unicast = frame[0] & 1 == 0;
        let dest = if unicast {
            let key = mac_key(&frame[0..6]);
            let (k, p, v) = self.ports[from].last_dst;
            if k == key && v == self.macs_version {
                Some(p)
            } else {
                let d = self.macs.get(&key).copied();
                if let Some(p) = d {
                    self.ports[from].last_dst = (key, p, self.macs_version);
                }
                d
            }
        } else {
            None
        };
        match dest {
            Some(to) if to as usize == from => {
                self.ports[from].stats.hairpin_drops += 1;
                self.recycle(frame);
            }
            Some(to) => self.egress(t_ns, to as usize, id, frame, deliver),
            None if unicast && !self.cfg.flood_unknown_unicast => {
                self.unknown_unicast_drops += 1;
                self.recycle(frame);
            }
            None => {
                self.flooded += 1;
                let n = self.ports.len();
                let last = (0..n).rev().find(|&i| i != from);
                let mut frame = Some(frame);
                for to in (0..n).filter(|&i| i != from) {
                    let data = if Some(to) == last {
                        frame.take().unwrap_or_default()
                    } else {
                        let mut c = self.frame_buf();
                        c.extend_from_slice(frame.as_deref().unwrap_or_default());
                        c
                    };
                    self.egress(t_ns, to, id, data, deliver);
                }
                if let Some(f) = frame {
                    self.recycle(f);
                }
            }
        }
    }

    /// `frame` enters the switch's output queue towards `to` at `t_ns`.
    fn egress<F>(&mut self, t_ns: u64, to: usize, id: u64, frame: Vec<u8>, deliver: &mut F)
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let cap = self.cfg.event_log_capacity;
        let port = &mut self.ports[to];
        if port.down.faults.down {
            port.stats.link_down_drops += 1;
            log_event(
                &mut self.log,
                cap,
                id,
                to as u32,
                Direction::ToDevice,
                LinkEventKind::LinkDown,
                t_ns,
            );
            return self.recycle(frame);
        }
        let end_ps = if port.cfg.is_unlimited() {
            t_ns.saturating_mul(1000)
        } else {
            match port.egress.admit(&port.cfg, t_ns, frame.len()) {
                Admit::Leaves(end) => end,
                Admit::Full => {
                    port.stats.queue_drops += 1;
                    log_event(
                        &mut self.log,
                        cap,
                        id,
                        to as u32,
                        Direction::ToDevice,
                        LinkEventKind::BufferFull,
                        t_ns,
                    );
                    return self.recycle(frame);
                }
            }
        };
        self.cross_then(t_ns, end_ps, to, Direction::ToDevice, id, frame, deliver);
    }

    /// `frame` reaches `to`'s device at `t_ns`.
    fn deliver<F>(&mut self, t_ns: u64, to: usize, mut frame: Vec<u8>, deliver: &mut F)
    where
        F: FnMut(PortId, &mut D, &mut Vec<u8>) -> bool,
    {
        let port = &mut self.ports[to];
        capture(&mut port.pcap, to, t_ns, &frame);
        let len = frame.len() as u64;
        if deliver(PortId(to as u32), &mut port.dev, &mut frame) {
            port.stats.rx_frames += 1;
            port.stats.rx_bytes += len;
        } else {
            port.stats.no_device_drops += 1;
        }
        self.recycle(frame);
    }
}

#[inline]
fn capture(pcap: &mut Option<PcapWriter>, port: usize, t_ns: u64, frame: &[u8]) {
    if pcap.is_some() {
        capture_slow(pcap, port, t_ns, frame);
    }
}

#[cold]
fn capture_slow(pcap: &mut Option<PcapWriter>, port: usize, t_ns: u64, frame: &[u8]) {
    if let Some(w) = pcap.as_mut()
        && let Err(e) = w.write_frame(t_ns, frame)
    {
        tracing::warn!(%e, port, "pcap write failed; capture stopped");
        *pcap = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn frame(dst: [u8; 6], src: [u8; 6], n: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12] = 0x88;
        f[13] = 0xb5;
        f[14] = n;
        f
    }

    fn mac(i: u8) -> [u8; 6] {
        [2, 0, 0, 0, 0, i]
    }

    type Got = Vec<(u32, u8)>;

    fn sink(got: &mut Got) -> impl FnMut(PortId, &mut (), &mut Vec<u8>) -> bool + '_ {
        |p, _, f| {
            got.push((p.0, f[14]));
            true
        }
    }

    #[test]
    fn switch_learns_and_floods() {
        let mut n: Network<()> = Network::new(NetConfig::default());
        let a = n.add_port(Some(mac(1)), ());
        let _b = n.add_port(None, ());
        let _c = n.add_port(None, ());
        let mut got = Vec::new();
        n.transmit(0, a, frame(mac(2), mac(1), 1, 60), &mut sink(&mut got));
        assert_eq!(got, vec![(1, 1), (2, 1)], "unknown unicast flooded");
        got.clear();
        n.transmit(
            0,
            PortId(1),
            frame(mac(1), mac(2), 2, 60),
            &mut sink(&mut got),
        );
        n.transmit(0, a, frame(mac(2), mac(1), 3, 60), &mut sink(&mut got));
        assert_eq!(got, vec![(0, 2), (1, 3)], "learned");
        assert_eq!(n.stats().flooded, 1);
    }

    #[test]
    fn rate_and_delay_set_the_arrival_time() {
        let mut n: Network<()> = Network::new(NetConfig {
            port: PortConfig {
                rate_bps: 1_000_000_000,
                buffer_bytes: None,
            },
            faults: LinkFaults {
                delay: Duration::from_nanos(500),
                ..LinkFaults::default()
            },
            ..NetConfig::default()
        });
        let a = n.add_port(Some(mac(1)), ());
        let _b = n.add_port(Some(mac(2)), ());
        let mut got = Vec::new();
        // 976 + 24 bytes on the wire = 8000 ns per hop, 500 ns propagation.
        n.transmit(0, a, frame(mac(2), mac(1), 1, 976), &mut sink(&mut got));
        n.transmit(0, a, frame(mac(2), mac(1), 2, 976), &mut sink(&mut got));
        assert_eq!(n.next_event_ns(), Some(8_500));
        n.run_until(16_999, &mut sink(&mut got));
        assert!(got.is_empty());
        n.run_until(17_000, &mut sink(&mut got));
        assert_eq!(got, vec![(1, 1)]);
        n.run_until(25_000, &mut sink(&mut got));
        assert_eq!(got, vec![(1, 1), (1, 2)]);
    }

    /// A frame whose path is trivial skips the switch's event; one whose
    /// source must be learned goes hop by hop: both arrive at the same time.
    #[test]
    fn the_shortcut_and_the_hop_by_hop_path_agree() {
        let mut n: Network<()> = Network::new(NetConfig::default());
        let d = |ns| LinkFaults {
            delay: Duration::from_nanos(ns),
            ..LinkFaults::default()
        };
        let a = n.add_port(Some(mac(1)), ());
        let b = n.add_port(Some(mac(2)), ());
        let c = n.add_port(None, ());
        n.set_faults(a, Some(Direction::ToSwitch), d(300));
        n.set_faults(c, Some(Direction::ToSwitch), d(300));
        n.set_faults(b, Some(Direction::ToDevice), d(200));
        let mut got = Vec::new();
        n.transmit(0, a, frame(mac(2), mac(1), 1, 60), &mut sink(&mut got));
        n.transmit(0, c, frame(mac(2), mac(3), 2, 60), &mut sink(&mut got));
        assert_eq!(n.pending(), 2);
        assert_eq!(
            n.run_until(499, &mut sink(&mut got)),
            1,
            "c's frame at the switch"
        );
        assert!(got.is_empty());
        n.run_until(500, &mut sink(&mut got));
        assert_eq!(got, vec![(1, 1), (1, 2)]);
        // A link that goes down drops what is on it.
        n.transmit(600, a, frame(mac(2), mac(1), 3, 60), &mut sink(&mut got));
        n.set_faults(
            b,
            Some(Direction::ToDevice),
            LinkFaults {
                down: true,
                ..LinkFaults::default()
            },
        );
        n.run_until(2000, &mut sink(&mut got));
        assert_eq!(got.len(), 2);
        assert_eq!(n.port_stats(b).unwrap().link_down_drops, 1);
    }

    #[test]
    fn incast_fills_the_buffer_and_drops_the_tail() {
        let rate = 10_000_000_000;
        let mut n: Network<()> = Network::new(NetConfig {
            port: PortConfig::new(rate, 8 * 1024),
            ..NetConfig::default()
        });
        let rx = n.add_port(Some(mac(0)), ());
        let senders: Vec<PortId> = (1..=4).map(|i| n.add_port(Some(mac(i)), ())).collect();
        let mut got = Vec::new();
        for k in 0..16u8 {
            for (i, &s) in senders.iter().enumerate() {
                n.transmit(
                    0,
                    s,
                    frame(mac(0), mac(i as u8 + 1), k, 1000),
                    &mut sink(&mut got),
                );
            }
        }
        n.run_until(1_000_000, &mut sink(&mut got));
        let q = n.queue(rx, 1_000_000).unwrap();
        assert_eq!(q.bytes, 0);
        assert!(q.max_bytes > 7 * 1024 && q.max_bytes <= 8 * 1024, "{q:?}");
        assert!(q.drops > 0);
        assert_eq!(q.enqueued + q.drops, 64);
        assert_eq!(got.len() as u64, q.enqueued);
        assert_eq!(n.port_stats(rx).unwrap().queue_drops, q.drops);
    }

    #[test]
    fn faults_replay_per_seed() {
        let run = |seed| {
            let mut n: Network<()> = Network::new(NetConfig {
                seed,
                faults: LinkFaults {
                    loss: 0.2,
                    duplicate: 0.1,
                    reorder: 0.1,
                    fcs_error: 0.05,
                    corrupt: 0.05,
                    jitter: Duration::from_nanos(300),
                    delay: Duration::from_nanos(100),
                    ..LinkFaults::default()
                },
                ..NetConfig::default()
            });
            let a = n.add_port(Some(mac(1)), ());
            n.add_port(Some(mac(2)), ());
            let mut got = Vec::new();
            for i in 0..200u8 {
                n.transmit(
                    u64::from(i) * 50,
                    a,
                    frame(mac(2), mac(1), i, 64),
                    &mut sink(&mut got),
                );
                n.run_until(u64::from(i) * 50, &mut sink(&mut got));
            }
            n.run_until(1 << 40, &mut sink(&mut got));
            (got, n.link_events().to_vec())
        };
        let (g1, e1) = run(3);
        let (g2, e2) = run(3);
        let (g3, _) = run(4);
        assert_eq!(g1, g2);
        assert_eq!(e1, e2);
        assert_ne!(g1, g3);
        for k in [
            LinkEventKind::Lost,
            LinkEventKind::Duplicated,
            LinkEventKind::Reordered,
            LinkEventKind::FcsError,
            LinkEventKind::Corrupted,
        ] {
            assert!(e1.iter().any(|e| e.kind == k), "{k:?}");
        }
    }
}
