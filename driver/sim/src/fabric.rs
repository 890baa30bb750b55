//! The simulated Ethernet fabric the device-model NICs plug into: the
//! project's one network model ([`netsim`]) in its shared form, plus what
//! only NICs need (object numbers unique across the functions of one
//! fabric).
//!
//! # Delivery
//!
//! A frame sent by a NIC crosses its port's link (NIC → switch), the switch
//! (MAC learning; unknown unicast, broadcast and multicast are flooded to
//! every other port in port order) and its output queue towards the
//! destination port, then that port's link (switch → NIC). Each link
//! direction applies its [`LinkFaults`] with its own random stream, derived
//! from the fabric seed and the port number, so the fate of frames on one
//! link does not depend on traffic elsewhere. Links have a rate and the
//! switch a buffer per output port ([`PortConfig`]; unlimited by default):
//! with limits, an incast builds a real queue and drops at the tail
//! ([`Fabric::queue`]).
//!
//! A hop that takes no time (no rate, delay or queue) is taken
//! synchronously, inside the sender's call (inside the doorbell write that
//! produced the frame), with no lock of the sending NIC held. A delayed
//! hop goes into the event queue and is taken when the clock reaches its
//! due time. Frames are handed to NICs after the network's lock is
//! released.
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

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use netsim::{
    Direction, LinkEvent, LinkEventKind, LinkFaults, PortConfig, PortId, PortSink, PortStats,
    QueueSample, QueueStats, Tap,
};
use netsim::{NetConfig, SharedNetwork};

/// Fabric configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricConfig {
    /// Seed of every random stream.
    pub seed: u64,
    /// Virtual clock, single thread, exact replay (see the module doc).
    pub deterministic: bool,
    /// Faults of every new port's link (both directions).
    pub default_faults: LinkFaults,
    /// Link rate and switch buffer of every new port (unlimited by
    /// default).
    pub port: PortConfig,
    /// How many link events (losses, duplicates, buffer drops, ...) are
    /// kept for [`Fabric::link_events`]; older ones are discarded.
    pub event_log_capacity: usize,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            seed: 0,
            deterministic: true,
            default_faults: LinkFaults::default(),
            port: PortConfig::default(),
            event_log_capacity: 1 << 16,
        }
    }
}

/// Fabric-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Frames that entered the fabric.
    pub frames: u64,
    /// Frames flooded (unknown unicast, broadcast, multicast).
    pub flooded: u64,
    /// Hops waiting in the event queue now.
    pub pending: u64,
    /// Calls into a deterministic fabric from a thread other than its
    /// creator (each one is a replay hazard).
    pub foreign_thread_calls: u64,
    /// Fabric clock.
    pub now_ns: u64,
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
    net: SharedNetwork,
    pub(crate) registry: Mutex<Registry>,
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
            self.inner.net.with(|n| n.port_count()),
            self.inner.now_ns()
        )
    }
}

impl Fabric {
    /// A fabric with no ports. In threaded mode this starts the pump
    /// thread (it stops when the last handle is gone).
    pub fn new(cfg: FabricConfig) -> Fabric {
        let net = SharedNetwork::new(
            NetConfig {
                seed: cfg.seed,
                faults: cfg.default_faults,
                port: cfg.port,
                flood_unknown_unicast: true,
                event_log_capacity: cfg.event_log_capacity,
            },
            cfg.deterministic,
        );
        Fabric {
            inner: Arc::new(FabricInner {
                cfg,
                net,
                registry: Mutex::new(Registry::default()),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FabricConfig {
        &self.inner.cfg
    }

    /// The network model underneath (for what this wrapper does not
    /// expose).
    pub fn network(&self) -> &SharedNetwork {
        &self.inner.net
    }

    /// Fabric clock in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }

    /// Moves the clock forward by `d` and delivers every frame that is due
    /// (in deterministic mode this is the only way time passes). Returns
    /// the number of hops taken.
    pub fn advance(&self, d: Duration) -> usize {
        self.inner.net.advance(d)
    }

    /// Time of the next hop waiting in the event queue.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.inner.net.with(|n| n.next_event_ns())
    }

    /// Sets the faults of `port`'s link (both directions).
    pub fn set_link_faults(&self, port: PortId, faults: LinkFaults) {
        self.inner.net.with(|n| n.set_faults(port, None, faults));
    }

    /// Sets the faults of one direction of `port`'s link.
    pub fn set_link_faults_dir(&self, port: PortId, dir: Direction, faults: LinkFaults) {
        self.inner
            .net
            .with(|n| n.set_faults(port, Some(dir), faults));
    }

    /// The faults of `port`'s link (device → switch direction).
    pub fn link_faults(&self, port: PortId) -> Option<LinkFaults> {
        self.inner.net.with(|n| n.faults(port, Direction::ToSwitch))
    }

    /// Sets `port`'s link rate and the switch's buffer towards it.
    pub fn set_port_config(&self, port: PortId, cfg: PortConfig) {
        self.inner.net.with(|n| n.set_port_config(port, cfg));
    }

    /// The switch's output queue towards `port` now: occupancy, high-water
    /// marks, drops.
    pub fn queue(&self, port: PortId) -> Option<QueueStats> {
        let now = self.now_ns();
        self.inner.net.with(|n| n.queue(port, now))
    }

    /// Records the output queue towards `port` at every arrival (up to
    /// `capacity` samples); [`Fabric::queue_trace`] reads them.
    pub fn set_queue_trace(&self, port: PortId, capacity: usize) {
        self.inner.net.with(|n| n.set_queue_trace(port, capacity));
    }

    /// The recorded samples of the output queue towards `port`.
    pub fn queue_trace(&self, port: PortId) -> Vec<QueueSample> {
        self.inner.net.with(|n| n.queue_trace(port).to_vec())
    }

    /// Captures every frame the port sends and receives into `out`, in
    /// pcap format (stamped with the fabric clock).
    pub fn set_pcap(&self, port: PortId, out: impl Write + Send + 'static) -> io::Result<()> {
        self.inner.net.set_pcap(port, out)
    }

    /// Captures `port` into a pcap file at `path`.
    pub fn pcap_to_file(&self, port: PortId, path: impl AsRef<Path>) -> io::Result<()> {
        let f = std::fs::File::create(path)?;
        self.set_pcap(port, io::BufWriter::new(f))
    }

    /// Flushes every pcap writer.
    pub fn flush_pcaps(&self) -> io::Result<()> {
        self.inner.net.with(|n| n.flush_pcaps())
    }

    /// Counters of `port`.
    pub fn port_stats(&self, port: PortId) -> Option<PortStats> {
        self.inner.net.with(|n| n.port_stats(port))
    }

    /// Every port.
    pub fn ports(&self) -> Vec<PortId> {
        let n = self.inner.net.with(|n| n.port_count());
        (0..n as u32).map(PortId).collect()
    }

    /// Fabric-wide counters.
    pub fn stats(&self) -> FabricStats {
        let s = self.inner.net.with(|n| n.stats());
        FabricStats {
            frames: s.frames,
            flooded: s.flooded,
            pending: s.pending,
            foreign_thread_calls: self.inner.net.foreign_thread_calls(),
            now_ns: self.inner.now_ns(),
        }
    }

    /// What the links and the switch did (oldest first, up to the
    /// configured capacity).
    pub fn link_events(&self) -> Vec<LinkEvent> {
        self.inner.net.with(|n| n.link_events().to_vec())
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
        self.inner.net.add_tap(mac)
    }

    /// Delivers `frame` to `port`'s device as if it came from the switch
    /// (through the switch's output queue and the port's switch → device
    /// link and its faults).
    pub fn inject(&self, port: PortId, frame: &[u8]) {
        self.inner.net.inject(port, frame.to_vec());
    }
}

impl FabricInner {
    pub(crate) fn deterministic(&self) -> bool {
        self.cfg.deterministic
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    /// Moves the clock by `d` and takes every hop that is due.
    pub(crate) fn advance_by(&self, d: Duration) -> usize {
        self.net.advance(d)
    }

    /// Counts calls into a deterministic fabric from foreign threads.
    pub(crate) fn check_thread(&self) {
        self.net.check_thread();
    }

    pub(crate) fn add_port(
        &self,
        sink: Option<Weak<dyn PortSink>>,
        mac: Option<[u8; 6]>,
    ) -> PortId {
        self.net.add_port(mac, sink)
    }

    pub(crate) fn set_sink(&self, port: PortId, sink: Weak<dyn PortSink>) {
        self.net.set_sink(port, Some(sink));
    }

    pub(crate) fn link_is_down(&self, port: PortId) -> bool {
        self.net.with(|n| n.link_is_down(port))
    }

    /// The port the switch has learned (or was told) `mac` is behind.
    pub(crate) fn port_of_mac(&self, mac: &[u8; 6]) -> Option<u32> {
        self.net.with(|n| n.port_of_mac(mac)).map(|p| p.0)
    }

    /// An empty frame buffer for [`transmit`](Self::transmit), reused from
    /// frames delivered on this thread.
    pub(crate) fn frame_buf(&self) -> Vec<u8> {
        self.net.frame_buf()
    }

    /// Returns a buffer from [`frame_buf`](Self::frame_buf) that did not go
    /// to the wire.
    pub(crate) fn recycle(&self, frame: Vec<u8>) {
        self.net.recycle(frame);
    }

    /// A frame leaves the device at `port`. No lock of any device may be
    /// held by the caller.
    pub(crate) fn transmit(&self, port: u32, frame: Vec<u8>) {
        self.net.transmit(PortId(port), frame);
    }

    /// Frames leave the device at `port`, in order (one lock of the
    /// network for all of them). No lock of any device may be held by the
    /// caller, nor taken by `frames`.
    pub(crate) fn transmit_many(&self, port: u32, frames: impl IntoIterator<Item = Vec<u8>>) {
        self.net.transmit_many(PortId(port), frames);
    }

    /// Takes every queued hop that is due. Returns how many.
    pub(crate) fn pump_due(&self) -> usize {
        self.net.pump_due()
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

    #[test]
    fn a_slow_port_queues_and_drops_at_its_buffer() {
        let fab = Fabric::new(FabricConfig {
            port: PortConfig::new(1_000_000_000, 600),
            ..Default::default()
        });
        let a = fab.add_tap(Some(A));
        let b = fab.add_tap(Some(B));
        // Ten 60-byte frames at once: the uplink spaces them 672 ns apart,
        // so they reach the switch no faster than B's port drains them.
        for i in 0..10 {
            a.send(&frame(B, A, i));
        }
        fab.advance(Duration::from_micros(20));
        assert_eq!(b.len(), 10);
        let q = fab.queue(b.port()).unwrap();
        assert_eq!((q.max_frames, q.drops), (1, 0));
        // Injected frames bypass the uplink: they all arrive at once and
        // the buffer holds ten.
        for i in 0..12 {
            fab.inject(b.port(), &frame(B, A, i));
        }
        let q = fab.queue(b.port()).unwrap();
        assert_eq!((q.bytes, q.drops), (600, 2));
        fab.advance(Duration::from_micros(20));
        assert_eq!(b.len(), 20);
    }
}
