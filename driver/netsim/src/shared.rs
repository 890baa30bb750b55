//! [`SharedNetwork`]: the [`Network`] behind a lock, with its own clock,
//! for devices that live in several threads (the device-model NICs).
//!
//! # Modes
//!
//! * **Deterministic**: the clock is virtual and moves only in
//!   [`SharedNetwork::advance`]. Everything runs on the caller's thread;
//!   with one driving thread a seed replays exactly (same frames lost,
//!   byte-identical pcaps). Calls from a thread other than the creator are
//!   counted ([`SharedNetwork::foreign_thread_calls`]).
//! * **Threaded** (real time): the clock is wall time since creation (plus
//!   any `advance`); a pump thread takes delayed hops when they are due.
//!   Any number of threads may transmit.
//!
//! A hop that is due at once (no delay, rate or queue on the way) is taken
//! inside the sender's call. Frames are handed to devices ([`PortSink`])
//! after the network's lock is released, so a device may be entered while
//! another thread transmits, and no device lock is ever taken under the
//! network's.

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::link::PortId;
use crate::net::{NetConfig, Network};

/// Something plugged into a port of a [`SharedNetwork`].
pub trait PortSink: Send + Sync {
    /// A frame arrives from the switch.
    fn receive(&self, frame: &[u8]);

    /// Several frames arrive from the switch, in order, with nothing
    /// delivered to any other device between them (the deliveries of one
    /// hand-over that go to this device one after the other). The same as
    /// [`receive`](Self::receive) for each, in order, which is what the
    /// default does; a device may take its locks once for all of them.
    fn receive_many(&self, frames: Frames<'_>) {
        for f in frames.iter() {
            self.receive(f);
        }
    }
}

/// Frames handed to one device at once ([`PortSink::receive_many`]).
#[derive(Clone, Copy)]
pub struct Frames<'a> {
    items: &'a [Delivery],
}

impl fmt::Debug for Frames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Frames({})", self.items.len())
    }
}

impl<'a> Frames<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The frames, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.items.iter().map(|d| d.frame.as_slice())
    }
}

/// What a port of a [`SharedNetwork`] holds: its device, if one is
/// plugged in and still alive.
pub type Attachment = Option<Weak<dyn PortSink>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Core {
    deterministic: bool,
    start: Instant,
    virt_ns: AtomicU64,
    net: Mutex<Network<Attachment>>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Core {
    fn now_ns(&self) -> u64 {
        let v = self.virt_ns.load(Ordering::Acquire);
        if self.deterministic {
            v
        } else {
            v.saturating_add(self.start.elapsed().as_nanos() as u64)
        }
    }
}

struct Inner {
    core: Arc<Core>,
    owner_thread: ThreadId,
    foreign_calls: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::Release);
        self.core.cv.notify_all();
        let _ = lock(&self.core.net).flush_pcaps();
    }
}

/// One delivery taken under the lock: the port, its device (`None`: the
/// same as the entry before, which is for the same port — a run of frames
/// to one device takes its reference once), the frame.
struct Delivery {
    port: u32,
    sink: Option<Arc<dyn PortSink>>,
    frame: Vec<u8>,
}

type Pending = Vec<Delivery>;

/// Delivered frame buffers kept per thread for [`SharedNetwork::frame_buf`].
const SPARE_MAX: usize = 512;
/// Buffers a thread without spares takes from the network's pool at once.
const REFILL: usize = 32;

thread_local! {
    /// Frames taken under the lock, handed to their devices after it.
    static SCRATCH: RefCell<Pending> = const { RefCell::new(Vec::new()) };
    /// Buffers of frames this thread handed to their devices, emptied, for
    /// the next frames sent from this thread (no allocation per frame when
    /// one thread both sends and delivers, as in deterministic mode).
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `frame`'s buffer for this thread's next [`SharedNetwork::frame_buf`].
fn keep_spare(mut frame: Vec<u8>) {
    if frame.capacity() == 0 {
        return;
    }
    frame.clear();
    // Off at thread exit (the slot is gone): the buffer is simply freed.
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARE_MAX
        {
            s.push(frame);
        }
    });
}

/// Collects deliveries into `out` (under the lock).
fn collect(out: &mut Pending) -> impl FnMut(PortId, &mut Attachment, &mut Vec<u8>) -> bool + '_ {
    |port, dev, frame| {
        // The entry before holds this port's device (alive: referenced),
        // and the attachment cannot change while the lock is held.
        if out.last().is_some_and(|d| d.port == port.0) {
            out.push(Delivery {
                port: port.0,
                sink: None,
                frame: std::mem::take(frame),
            });
            return true;
        }
        match dev.as_ref().and_then(Weak::upgrade) {
            Some(sink) => {
                out.push(Delivery {
                    port: port.0,
                    sink: Some(sink),
                    frame: std::mem::take(frame),
                });
                true
            }
            None => false,
        }
    }
}

/// Hands the collected deliveries to their devices, in order: each run of
/// frames for one device in one call.
fn hand_over(out: &mut Pending) {
    let mut i = 0;
    while i < out.len() {
        let n = 1 + out[i + 1..].iter().take_while(|d| d.sink.is_none()).count();
        let items = &out[i..i + n];
        // Every run starts with the device's reference (see `collect`).
        if let Some(sink) = &items[0].sink {
            if n == 1 {
                sink.receive(&items[0].frame);
            } else {
                sink.receive_many(Frames { items });
            }
        }
        i += n;
    }
    for d in out.drain(..) {
        keep_spare(d.frame);
    }
}

/// A [`Network`] shared between threads, with its clock. Cheap to clone
/// (a handle); the pump thread (threaded mode) stops when the last handle
/// is gone.
#[derive(Clone)]
pub struct SharedNetwork {
    inner: Arc<Inner>,
}

impl fmt::Debug for SharedNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedNetwork({}, t={} ns, {:?})",
            if self.inner.core.deterministic {
                "deterministic"
            } else {
                "threaded"
            },
            self.now_ns(),
            *lock(&self.inner.core.net)
        )
    }
}

impl SharedNetwork {
    /// A network with no ports; `deterministic` picks the mode (see the
    /// module doc). Threaded mode starts the pump thread.
    pub fn new(cfg: NetConfig, deterministic: bool) -> SharedNetwork {
        let core = Arc::new(Core {
            deterministic,
            start: Instant::now(),
            virt_ns: AtomicU64::new(0),
            net: Mutex::new(Network::new(cfg)),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        if !deterministic {
            let c = core.clone();
            let spawned = std::thread::Builder::new()
                .name("netsim-pump".into())
                .spawn(move || pump_thread(c));
            if let Err(e) = spawned {
                tracing::error!(%e, "cannot start the network's pump thread; delayed frames will only move in advance()");
            }
        }
        SharedNetwork {
            inner: Arc::new(Inner {
                core,
                owner_thread: current_thread_id(),
                foreign_calls: AtomicU64::new(0),
            }),
        }
    }

    /// True in deterministic mode.
    pub fn deterministic(&self) -> bool {
        self.inner.core.deterministic
    }

    /// The network clock in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.inner.core.now_ns()
    }

    /// Moves the clock forward by `d` and takes every hop that is due (in
    /// deterministic mode the only way time passes). Returns the number of
    /// hops taken.
    pub fn advance(&self, d: Duration) -> usize {
        self.check_thread();
        self.inner.core.virt_ns.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX / 4)) as u64,
            Ordering::AcqRel,
        );
        self.pump_due()
    }

    /// Takes every hop that is due now. Returns how many.
    pub fn pump_due(&self) -> usize {
        SCRATCH.with(|s| {
            let mut out = s.take();
            let n = {
                let mut net = lock(&self.inner.core.net);
                net.run_until(self.now_ns(), &mut collect(&mut out))
            };
            hand_over(&mut out);
            s.replace(out);
            n
        })
    }

    /// Counts calls into a deterministic network from foreign threads
    /// (each one is a replay hazard).
    pub fn check_thread(&self) {
        if self.inner.core.deterministic && current_thread_id() != self.inner.owner_thread {
            let n = self.inner.foreign_calls.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                tracing::warn!(
                    "deterministic network used from a second thread: replay is no longer exact"
                );
            }
        }
    }

    /// Calls from a thread other than the creator (deterministic mode).
    pub fn foreign_thread_calls(&self) -> u64 {
        self.inner.foreign_calls.load(Ordering::Relaxed)
    }

    /// Runs `f` on the network under its lock: configuration and queries
    /// (`f` must not call back into this handle).
    pub fn with<R>(&self, f: impl FnOnce(&mut Network<Attachment>) -> R) -> R {
        f(&mut lock(&self.inner.core.net))
    }

    /// Adds a port with `sink` plugged in (or nothing yet).
    pub fn add_port(&self, mac: Option<[u8; 6]>, sink: Attachment) -> PortId {
        self.with(|n| n.add_port(mac, sink))
    }

    /// Plugs `sink` into `port`.
    pub fn set_sink(&self, port: PortId, sink: Attachment) {
        self.with(|n| {
            if (port.0 as usize) < n.port_count() {
                *n.device_mut(port) = sink;
            }
        });
    }

    /// An empty buffer for a frame to [`transmit`](Self::transmit): one
    /// this thread delivered before, emptied, when there is one (its
    /// capacity is whatever that frame needed), else a new one.
    pub fn frame_buf(&self) -> Vec<u8> {
        let spare = SPARE.try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()));
        if let Ok(Some(f)) = spare {
            return f;
        }
        // None here: this thread's frames were delivered by another (the
        // pump thread gives its spares to the network's pool) or lost on
        // the way (the network keeps those). Take a few at once.
        let mut net = lock(&self.inner.core.net);
        let first = net.frame_buf();
        if first.capacity() != 0 {
            let _ = SPARE.try_with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    for _ in 1..REFILL {
                        let f = net.frame_buf();
                        if f.capacity() == 0 {
                            break;
                        }
                        s.push(f);
                    }
                }
            });
        }
        first
    }

    /// Gives back a buffer from [`frame_buf`](Self::frame_buf) that was
    /// not transmitted after all.
    pub fn recycle(&self, frame: Vec<u8>) {
        keep_spare(frame);
    }

    /// `port`'s device sends `frame`. The caller must hold no lock that a
    /// device's `receive` takes.
    pub fn transmit(&self, port: PortId, frame: Vec<u8>) {
        self.check_thread();
        self.moved([frame], |net, now, frame, out| {
            net.transmit(now, port, frame, &mut collect(out));
        });
    }

    /// `port`'s device sends `frames`, in order: the same as one
    /// [`transmit`](Self::transmit) per frame (each frame is put on the
    /// network at the clock's time when it is taken, and in deterministic
    /// mode followed by every hop due by then), with the network locked
    /// once for all of them; the deliveries are handed to their devices
    /// after the last frame, in the order they were made. Devices never
    /// send from `receive`, so handing over later changes nothing they
    /// see but the time (in threaded mode). The caller must hold no lock
    /// that a device's `receive` takes, and `frames` must not call into
    /// this network.
    pub fn transmit_many(&self, port: PortId, frames: impl IntoIterator<Item = Vec<u8>>) {
        self.check_thread();
        self.moved(frames, |net, now, frame, out| {
            net.transmit(now, port, frame, &mut collect(out));
        });
    }

    /// Delivers `frame` to `port`'s device as if it came from the switch
    /// (through the output queue and the switch → device link).
    pub fn inject(&self, port: PortId, frame: Vec<u8>) {
        self.check_thread();
        self.moved([frame], |net, now, frame, out| {
            net.inject(now, port, frame, &mut collect(out));
        });
    }

    /// Applies `f` to each of `items` in order with the network locked
    /// once: each at the clock's time when it is taken and, in
    /// deterministic mode, followed by every hop due by then; in threaded
    /// mode the network thread is woken if its next event moved. The
    /// deliveries are handed to their devices after the last item.
    fn moved<I>(
        &self,
        items: impl IntoIterator<Item = I>,
        mut f: impl FnMut(&mut Network<Attachment>, u64, I, &mut Pending),
    ) {
        let core = &self.inner.core;
        SCRATCH.with(|s| {
            let mut out = s.take();
            let wake = {
                let mut net = lock(&core.net);
                let mut wake = false;
                for item in items {
                    let now = core.now_ns();
                    let before = net.next_event_ns();
                    f(&mut net, now, item, &mut out);
                    if core.deterministic {
                        net.run_until(now, &mut collect(&mut out));
                    } else {
                        let after = net.next_event_ns();
                        wake |= after.is_some() && after != before;
                    }
                }
                wake
            };
            if wake {
                core.cv.notify_one();
            }
            hand_over(&mut out);
            s.replace(out);
        });
    }

    /// Adds a tap: a port whose received frames are kept in memory, and
    /// which can send frames into the switch.
    pub fn add_tap(&self, mac: Option<[u8; 6]>) -> Tap {
        let sink = Arc::new(TapSink {
            frames: Mutex::new(Vec::new()),
        });
        let dyn_sink: Arc<dyn PortSink> = sink.clone();
        let port = self.add_port(mac, Some(Arc::downgrade(&dyn_sink)));
        Tap {
            net: self.clone(),
            port,
            sink,
            _keep: dyn_sink,
        }
    }

    /// Captures `port` into `out` (see [`Network::set_pcap`]).
    pub fn set_pcap(&self, port: PortId, out: impl Write + Send + 'static) -> std::io::Result<()> {
        self.with(|n| n.set_pcap(port, Box::new(out)))
    }
}

fn pump_thread(core: Arc<Core>) {
    const IDLE: Duration = Duration::from_millis(20);
    let mut out = Pending::new();
    loop {
        if core.stop.load(Ordering::Acquire) {
            return;
        }
        let mut net = lock(&core.net);
        // What this thread delivered goes back to the senders' threads
        // through the network's pool (see `SharedNetwork::frame_buf`).
        let _ = SPARE.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                for f in s.drain(..) {
                    net.recycle(f);
                }
            }
        });
        let now = core.now_ns();
        if net.run_until(now, &mut collect(&mut out)) > 0 {
            drop(net);
            hand_over(&mut out);
            continue;
        }
        let wait = match net.next_event_ns() {
            Some(t) => Duration::from_nanos(t.saturating_sub(now)).min(IDLE),
            None => IDLE,
        };
        let _ = core.cv.wait_timeout(net, wait);
    }
}

/// A port that records what it receives (for tests).
pub struct Tap {
    net: SharedNetwork,
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
        self.net.transmit(self.port, frame.to_vec());
    }
}

/// This thread's id, read from a thread-local copy: `thread::current()`
/// clones the thread's handle (an atomic increment and decrement), and
/// `check_thread` runs on every device doorbell of the deterministic
/// fabric (≈ 1–2 % of a device-model benchmark's time went there).
fn current_thread_id() -> std::thread::ThreadId {
    thread_local! {
        static ID: std::thread::ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::LinkFaults;

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f
    }

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    /// A network with taps A and B, frames to B delayed by `delay`.
    fn two_taps(deterministic: bool, delay: Duration) -> (SharedNetwork, Tap, Tap) {
        let net = SharedNetwork::new(NetConfig::default(), deterministic);
        let a = net.add_tap(Some(A));
        let b = net.add_tap(Some(B));
        net.with(|n| {
            n.set_faults(
                b.port(),
                None,
                LinkFaults {
                    delay,
                    ..Default::default()
                },
            )
        });
        (net, a, b)
    }

    #[test]
    fn calls_from_a_second_thread_are_counted_in_deterministic_mode() {
        for deterministic in [true, false] {
            let net = SharedNetwork::new(NetConfig::default(), deterministic);
            net.check_thread();
            assert_eq!(net.foreign_thread_calls(), 0, "the creating thread");
            let n2 = net.clone();
            std::thread::spawn(move || {
                n2.check_thread();
                n2.check_thread();
            })
            .join()
            .unwrap();
            net.check_thread();
            let want = if deterministic { 2 } else { 0 };
            assert_eq!(
                net.foreign_thread_calls(),
                want,
                "deterministic {deterministic}"
            );
        }
    }

    #[test]
    fn delay_needs_the_clock_in_deterministic_mode() {
        let (net, a, b) = two_taps(true, Duration::from_micros(5));
        a.send(&frame(B, A));
        assert!(b.is_empty());
        assert_eq!(net.advance(Duration::from_micros(4)), 0);
        assert_eq!(net.advance(Duration::from_micros(1)), 1);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn delivered_buffers_are_reused_by_the_sending_thread() {
        let net = SharedNetwork::new(NetConfig::default(), true);
        let a = net.add_tap(Some(A));
        let b = net.add_tap(Some(B));
        // Whatever this thread kept before.
        while net.frame_buf().capacity() != 0 {}
        let mut f = net.frame_buf();
        f.extend_from_slice(&frame(B, A));
        let buf = f.as_ptr();
        net.transmit(a.port(), f);
        assert_eq!(b.take(), vec![frame(B, A)]);
        let g = net.frame_buf();
        assert!(g.is_empty());
        assert_eq!(g.as_ptr(), buf, "the delivered frame's buffer comes back");
        net.recycle(g);
        let h = net.frame_buf();
        assert_eq!(h.as_ptr(), buf);
        assert_eq!(net.frame_buf().capacity(), 0);
    }

    /// Frames sent together arrive, are captured and are dropped exactly
    /// as when sent one by one, for a seed's faults and with links that
    /// delay, duplicate and reorder.
    #[test]
    fn transmit_many_is_transmit_per_frame() {
        use crate::pcap::PcapBuffer;
        let run = |many: bool| {
            let net = SharedNetwork::new(
                NetConfig {
                    seed: 9,
                    ..Default::default()
                },
                true,
            );
            let a = net.add_tap(Some(A));
            let b = net.add_tap(Some(B));
            let cap = PcapBuffer::new();
            net.with(|n| {
                n.set_pcap(b.port(), Box::new(cap.clone())).unwrap();
                n.set_faults(
                    a.port(),
                    None,
                    LinkFaults {
                        loss: 0.2,
                        duplicate: 0.1,
                        reorder: 0.1,
                        corrupt: 0.05,
                        ..Default::default()
                    },
                );
            });
            for round in 0..40u8 {
                let frames: Vec<Vec<u8>> = (0..5u8)
                    .map(|i| {
                        let mut f = frame(B, A);
                        f[14] = round;
                        f[15] = i;
                        f
                    })
                    .collect();
                if many {
                    net.transmit_many(a.port(), frames);
                } else {
                    for f in frames {
                        net.transmit(a.port(), f);
                    }
                }
                net.advance(Duration::from_micros(3));
            }
            net.advance(Duration::from_millis(1));
            net.with(|n| n.flush_pcaps()).unwrap();
            (
                b.take(),
                cap.bytes(),
                net.with(|n| n.link_events().to_vec()),
            )
        };
        let (one, many) = (run(false), run(true));
        assert!(!one.2.is_empty(), "faults happened");
        assert_eq!(one, many);
    }

    /// A hand-over gives each run of consecutive frames for one device in
    /// one call, in order.
    #[test]
    fn runs_of_frames_for_one_device_come_in_one_call() {
        #[derive(Default)]
        struct Calls(Mutex<Vec<Vec<u8>>>);
        impl PortSink for Calls {
            fn receive(&self, frame: &[u8]) {
                lock(&self.0).push(vec![frame[14]]);
            }
            fn receive_many(&self, frames: Frames<'_>) {
                lock(&self.0).push(frames.iter().map(|f| f[14]).collect());
            }
        }
        const C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
        let net = SharedNetwork::new(NetConfig::default(), true);
        let a = net.add_tap(Some(A));
        let (b, c) = (Arc::new(Calls::default()), Arc::new(Calls::default()));
        for (mac, sink) in [(B, &b), (C, &c)] {
            let sink: Arc<dyn PortSink> = sink.clone();
            net.add_port(Some(mac), Some(Arc::downgrade(&sink)));
        }
        let frames = [(B, 1), (B, 2), (C, 3), (B, 4), (C, 5), (C, 6), (B, 7)].map(|(to, n)| {
            let mut f = frame(to, A);
            f[14] = n;
            f
        });
        net.transmit_many(a.port(), frames);
        assert_eq!(*lock(&b.0), vec![vec![1, 2], vec![4], vec![7]]);
        assert_eq!(*lock(&c.0), vec![vec![3], vec![5, 6]]);
    }

    #[test]
    fn buffers_delivered_by_the_pump_thread_come_back_to_the_sender() {
        let (net, a, b) = two_taps(false, Duration::from_micros(200));
        while net.frame_buf().capacity() != 0 {}
        let mut f = net.frame_buf();
        f.extend_from_slice(&frame(B, A));
        let buf = f.as_ptr();
        net.transmit(a.port(), f);
        // No deadline: the pump delivers, then hands the buffer to the
        // network's pool on its next round, however late it runs.
        while b.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        loop {
            let g = net.frame_buf();
            if g.capacity() != 0 {
                assert!(g.is_empty());
                assert_eq!(g.as_ptr(), buf);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_pump_thread_delivers_in_threaded_mode() {
        let (_net, a, b) = two_taps(false, Duration::from_micros(200));
        a.send(&frame(B, A));
        // No deadline: the pump delivers however late it is scheduled.
        while b.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(b.take().len(), 1);
    }
}
