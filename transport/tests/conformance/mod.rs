//! The transport conformance suite: the behaviour every [`Transport`] must
//! show, written once, run against each implementation. A module of this
//! crate's tests (`mod conformance;` in a test file), not of the library:
//! nothing of it ships.
//!
//! A transport's tests implement [`Fixture`] (how to make a pair of
//! transports that reach each other, where TX memory comes from, and how to
//! let time pass) and then either call the cases one by one, call
//! [`run_all`], or let [`conformance_tests!`](crate::conformance_tests)
//! write one `#[test]` per case:
//!
//! ```ignore
//! mod conformance;
//! mod cases {
//!     crate::conformance_tests!(crate::MyFixture::new());
//! }
//! ```
//!
//! The cases check: routing info a C++ peer can use, and resolution
//! (including peers that use RSS); bursts in both directions with every
//! packet layout and size, verified byte for byte, with exact counters;
//! that one burst costs one doorbell; zero-copy RX (fixed slot addresses,
//! packets stable while held, the ring readable while the transport is
//! borrowed mutably); ring wrap-around; the `post_recvs` accounting of a
//! full ring; rejection of oversize and malformed TX items; rejection and
//! counting of malformed datagrams (when the fixture can inject them); the
//! drop flag; `tx_flush`; routes with and without RSS mixed in one burst;
//! and the ownership checks of the ring handle (unique, own transport's,
//! no more slots given back than held).
//!
//! Every packet the suite sends is a *probe* ([`probe`]): an eRPC-header-
//! sized header naming its stream and sequence number and the data length,
//! followed by a data pattern derived from both, so a receiver can check
//! each byte and spot duplicates, strays and corruption.
//!
//! Every wait is bounded: a case that stops making progress for
//! [`IDLE_TIMEOUT`] panics with both transports' counters.
//!
//! # What the suite pins down beyond the trait's docs
//! * A TX item the transport cannot send (frame over the MTU, header slot
//!   shorter than [`PKTHDR_BYTES`]) is *consumed* (counted in the return
//!   value, so eRPC does not retry it forever) and counted in `tx_errors`.
//! * A `drop` item is consumed, counted in `tx_dropped_on_purpose`, and in
//!   neither `tx_pkts` nor `tx_bytes`.
//! * `tx_bytes` and `rx_bytes` count whole frames, headroom included.
//! * One burst of at most `tx_burst_max` packets costs one doorbell.
//! * A packet's payload address depends only on its slot.
//! * A datagram that is not an eRPC packet either takes a slot and reads
//!   as `None`, or takes no slot; either way it is counted by reason.
//! * While no slot is posted nothing arrives; after `post_recvs(k)` at most
//!   (and, for `k` a multiple of the transport's repost granularity, exactly)
//!   `k` packets arrive. The suite posts `entries / 4`.
//!
//! # Writing a fixture for a simulated transport
//! `pump` moves frames across the fabric; `tx_memory` hands out
//! DMA-registered buffers; `inject` can wrap the payload in a valid
//! Ethernet/IPv4/UDP header ([`wire::build_headroom`]) addressed to the
//! receiver and put it on the fabric.

// Each test file runs the part of the suite its transport supports.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use transport::wire::{self, FrameError, ParseOptions, ParsedFrame};
use transport::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, MAX_DATA_PER_PKT, MTU, PKTHDR_BYTES, RoutingInfo, RxRing,
    Transport, TransportStats, TxItem,
};

/// How long a case waits without progress before it fails.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Memory a fixture hands out for TX buffers: registered with the NIC for a
/// DMA transport, plain heap memory otherwise ([`HeapMemory`]).
pub trait TxMemory {
    /// The buffer.
    fn bytes(&self) -> &[u8];
    /// The buffer, for writing.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// IOVA of `bytes()[0]`.
    fn iova(&self) -> u64;
    /// Memory key covering the buffer.
    fn lkey(&self) -> u32;
}

/// Heap memory for transports that do not DMA (the UDP transport): the IOVA
/// is the virtual address, the key 0.
#[derive(Debug)]
pub struct HeapMemory(Vec<u8>);

impl HeapMemory {
    /// `len` zero bytes.
    pub fn new(len: usize) -> HeapMemory {
        HeapMemory(vec![0; len])
    }
}

impl TxMemory for HeapMemory {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn iova(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn lkey(&self) -> u32 {
        0
    }
}

/// What the suite needs from a transport's tests.
pub trait Fixture {
    /// The transport under test.
    type T: Transport;
    /// TX buffer memory.
    type Mem: TxMemory;

    /// A fresh pair of transports that can reach each other, with zero
    /// counters and every RX ring slot posted. Called once per case.
    fn pair(&mut self) -> (Self::T, Self::T);

    /// A TX buffer of `len` bytes.
    fn tx_memory(&mut self, len: usize) -> Self::Mem;

    /// Lets time pass: moves frames across a simulated fabric, or yields
    /// for a kernel transport. Called between sending and every receive
    /// poll.
    fn pump(&mut self);

    /// Delivers `payload` to `to` as the UDP payload of one datagram
    /// (eRPC header + data, possibly malformed), bypassing the sending
    /// transport's checks. Returns false if the fixture cannot do that for
    /// this payload; the malformed-RX case then skips it.
    fn inject(&mut self, to: &Self::T, payload: &[u8]) -> bool {
        let _ = (to, payload);
        false
    }
}

/// The packets the suite sends: a 14-byte header in the eRPC header's
/// place, then a data pattern.
///
/// Header: sequence number (u32 LE) at 0, data length (u16 LE) at 4, tag
/// `e7 5c` at 6, stream (u16 LE) at 8, inverted sequence number (u32 LE) at
/// 10.
pub mod probe {
    use transport::ERPC_HDR_BYTES;

    const TAG: [u8; 2] = [0xe7, 0x5c];

    /// Names one probe.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct ProbeId {
        /// Which flow of a case.
        pub stream: u16,
        /// Position in the flow.
        pub seq: u32,
    }

    /// Data byte `i` of probe `id`.
    #[inline]
    pub fn data_byte(id: ProbeId, i: usize) -> u8 {
        let x = id.seq.wrapping_mul(0x9e37_79b9) ^ u32::from(id.stream).rotate_left(16);
        (x >> ((i % 4) * 8)) as u8 ^ (i as u8).wrapping_mul(31) ^ (i >> 8) as u8
    }

    /// Writes the header of probe `id` with `data_len` data bytes into
    /// `hdr[..14]`.
    pub fn write_header(hdr: &mut [u8], id: ProbeId, data_len: usize) {
        let hdr = &mut hdr[..ERPC_HDR_BYTES];
        hdr[0..4].copy_from_slice(&id.seq.to_le_bytes());
        hdr[4..6].copy_from_slice(&(data_len as u16).to_le_bytes());
        hdr[6..8].copy_from_slice(&TAG);
        hdr[8..10].copy_from_slice(&id.stream.to_le_bytes());
        hdr[10..14].copy_from_slice(&(!id.seq).to_le_bytes());
    }

    /// Writes the data pattern of probe `id` into `data`.
    pub fn fill_data(data: &mut [u8], id: ProbeId) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = data_byte(id, i);
        }
    }

    /// A whole probe payload (header + data), for injecting.
    pub fn payload(id: ProbeId, data_len: usize) -> Vec<u8> {
        let mut p = vec![0; ERPC_HDR_BYTES + data_len];
        write_header(&mut p, id, data_len);
        fill_data(&mut p[ERPC_HDR_BYTES..], id);
        p
    }

    /// Checks a received payload (eRPC header + data) byte for byte.
    pub fn check(payload: &[u8]) -> Result<ProbeId, String> {
        if payload.len() < ERPC_HDR_BYTES {
            return Err(format!(
                "{} bytes: shorter than a probe header",
                payload.len()
            ));
        }
        let u32le = |o: usize| u32::from_le_bytes(payload[o..o + 4].try_into().unwrap());
        let seq = u32le(0);
        let data_len = usize::from(u16::from_le_bytes([payload[4], payload[5]]));
        let id = ProbeId {
            stream: u16::from_le_bytes([payload[8], payload[9]]),
            seq,
        };
        if payload[6..8] != TAG || u32le(10) != !seq {
            return Err(format!(
                "not a probe header: {:02x?}",
                &payload[..ERPC_HDR_BYTES]
            ));
        }
        if payload.len() != ERPC_HDR_BYTES + data_len {
            return Err(format!(
                "probe {id:?}: {} bytes, header says {data_len} data bytes",
                payload.len()
            ));
        }
        let data = &payload[ERPC_HDR_BYTES..];
        if let Some(i) = (0..data.len()).find(|&i| data[i] != data_byte(id, i)) {
            return Err(format!("probe {id:?}: data byte {i} corrupted"));
        }
        Ok(id)
    }
}

use probe::ProbeId;

/// Offset of the header slot in the "later packet" layout: after the data
/// (room for one byte more than the largest packet, for the oversize case).
const SPLIT_HDR_OFFSET: usize = (MAX_DATA_PER_PKT + 1).next_multiple_of(8);
/// Bytes of every suite TX buffer: fits both layouts.
const TX_BUF_BYTES: usize = SPLIT_HDR_OFFSET + PKTHDR_BYTES;

const _: () = assert!(PKTHDR_BYTES + MAX_DATA_PER_PKT < TX_BUF_BYTES);

/// One packet to send.
#[derive(Debug, Clone, Copy)]
struct Spec {
    id: ProbeId,
    data_len: usize,
    /// Header slot after the data, data passed separately (eRPC's layout
    /// for packets after the first); otherwise header then data in `pkt`.
    split: bool,
    drop: bool,
    /// Hand the transport a header slot one byte short (malformed item).
    short_hdr: bool,
}

impl Spec {
    fn new(stream: u16, seq: u32, data_len: usize) -> Spec {
        Spec {
            id: ProbeId { stream, seq },
            data_len,
            split: seq % 2 == 1,
            drop: false,
            short_hdr: false,
        }
    }

    fn frame_len(&self) -> usize {
        PKTHDR_BYTES + self.data_len
    }

    fn hdr_offset(&self) -> usize {
        if self.split { SPLIT_HDR_OFFSET } else { 0 }
    }

    fn data_offset(&self) -> usize {
        if self.split { 0 } else { PKTHDR_BYTES }
    }
}

/// Writes `spec`'s bytes into `mem` and asks the transport to fill the
/// headroom.
fn prepare<T: Transport, M: TxMemory>(t: &T, route: &T::Route, mem: &mut M, spec: &Spec) {
    let buf = mem.bytes_mut();
    let (h, d) = (spec.hdr_offset(), spec.data_offset());
    probe::fill_data(&mut buf[d..d + spec.data_len], spec.id);
    probe::write_header(
        &mut buf[h + HEADROOM_BYTES..h + PKTHDR_BYTES],
        spec.id,
        spec.data_len,
    );
    t.fill_headroom(route, &mut buf[h..h + HEADROOM_BYTES], spec.frame_len());
}

/// The TX item for a prepared `spec`.
fn item<'a, R, M: TxMemory>(route: &'a R, mem: &'a M, spec: &Spec) -> TxItem<'a, R> {
    let buf = mem.bytes();
    let (h, d) = (spec.hdr_offset(), spec.data_offset());
    let hdr_len = PKTHDR_BYTES - usize::from(spec.short_hdr);
    let (pkt, data) = if spec.split {
        (&buf[h..h + hdr_len], &buf[d..d + spec.data_len])
    } else {
        (&buf[h..h + hdr_len + spec.data_len], &buf[..0])
    };
    TxItem::new(
        route,
        pkt,
        mem.iova() + h as u64,
        data,
        mem.iova() + d as u64,
        mem.lkey(),
        spec.drop,
    )
}

/// TX buffers, one per sequence number modulo their count, so a buffer is
/// reused only long after its last packet was sent.
struct TxPool<M> {
    bufs: Vec<M>,
    /// The probe each buffer last carried, while that may still be in flight.
    owner: Vec<Option<ProbeId>>,
}

impl<M: TxMemory> TxPool<M> {
    fn new<F: Fixture<Mem = M>>(fx: &mut F, n: usize) -> TxPool<M> {
        TxPool {
            bufs: (0..n).map(|_| fx.tx_memory(TX_BUF_BYTES)).collect(),
            owner: vec![None; n],
        }
    }

    /// Prepares and sends `specs` as one burst; returns how many the
    /// transport accepted. `delivered(id)` says whether a probe has arrived
    /// (so its buffer may be reused without a `tx_flush`).
    fn send<T: Transport>(
        &mut self,
        t: &mut T,
        route: &T::Route,
        specs: &[Spec],
        delivered: impl Fn(ProbeId) -> bool,
    ) -> usize {
        assert!(specs.len() <= self.bufs.len());
        let nbufs = self.bufs.len();
        let slot = |s: &Spec| s.id.seq as usize % nbufs;
        let busy = specs
            .iter()
            .filter_map(|s| self.owner[slot(s)])
            .any(|prev| !delivered(prev));
        if busy {
            // The contract: after tx_flush every buffer may be reused.
            t.tx_flush();
        }
        for s in specs {
            let j = slot(s);
            prepare(t, route, &mut self.bufs[j], s);
            self.owner[j] = (!s.drop).then_some(s.id);
        }
        let items: Vec<TxItem<'_, T::Route>> = specs
            .iter()
            .map(|s| item(route, &self.bufs[slot(s)], s))
            .collect();
        t.tx_burst(&items)
    }
}

/// The receiving side's view of a ring: which slots it holds, in order.
struct RxState<R> {
    ring: R,
    cur: Cursor,
}

/// The counters of an [`RxState`], apart from the ring so that packets can
/// borrow the ring while the counters move.
struct Cursor {
    entries: usize,
    /// Packets received so far (the sum of `rx_burst` results).
    head: u64,
    /// Slots held (received, not given back).
    held: usize,
    /// Address of each slot's payload when first seen: zero copy means
    /// fixed slots, so it must never change.
    slot_addr: Vec<Option<usize>>,
}

impl<R: RxRing> RxState<R> {
    fn new<T: Transport<Ring = R>>(t: &mut T) -> RxState<R> {
        let ring = t
            .take_rx_ring()
            .expect("the first take_rx_ring returns the ring");
        assert!(
            t.take_rx_ring().is_none(),
            "take_rx_ring must hand out the ring handle only once"
        );
        let entries = ring.entries();
        assert!(
            entries.is_power_of_two(),
            "RX ring entries {entries}: not a power of two"
        );
        RxState {
            ring,
            cur: Cursor {
                entries,
                head: 0,
                held: 0,
                slot_addr: vec![None; entries],
            },
        }
    }

    /// One `rx_burst`; calls `each(slot, packet)` for every arrival in ring
    /// order. Returns how many arrived.
    fn poll<T: Transport<Ring = R>>(
        &mut self,
        t: &mut T,
        each: impl FnMut(usize, Option<&[u8]>),
    ) -> usize {
        self.cur.poll(&self.ring, t, each)
    }

    /// Gives the `n` oldest held slots back.
    fn post<T: Transport<Ring = R>>(&mut self, t: &mut T, n: usize) {
        assert!(n <= self.cur.held);
        t.post_recvs(&mut self.ring, n);
        self.cur.held -= n;
    }
}

impl Cursor {
    /// [`RxState::poll`], reading packets from `ring`.
    fn poll<T: Transport>(
        &mut self,
        ring: &T::Ring,
        t: &mut T,
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> usize {
        let n = t.rx_burst();
        assert!(
            n <= self.entries - self.held,
            "rx_burst returned {n} packets, but only {} of {} slots were posted",
            self.entries - self.held,
            self.entries
        );
        for k in 0..n {
            let idx = ((self.head + k as u64) % self.entries as u64) as usize;
            let p = ring.packet(idx);
            if let Some(p) = p {
                let addr = p.as_ptr() as usize;
                let first = *self.slot_addr[idx].get_or_insert(addr);
                assert_eq!(
                    first, addr,
                    "slot {idx} moved from {first:#x} to {addr:#x}: RX slots must be fixed"
                );
            }
            each(idx, p);
        }
        self.head += n as u64;
        self.held += n;
        n
    }
}

/// Polls for a while (at least 200 pumps and 20 ms) and returns what
/// arrived; used to show that nothing (more) arrives.
fn settle<F: Fixture>(
    fx: &mut F,
    t: &mut F::T,
    rx: &mut RxState<<F::T as Transport>::Ring>,
) -> Vec<Option<Vec<u8>>> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut polls = 0;
    while polls < 200 || start.elapsed() < Duration::from_millis(20) {
        fx.pump();
        rx.poll(t, |_, p| got.push(p.map(<[u8]>::to_vec)));
        polls += 1;
    }
    got
}

/// When the receiver gives slots back during a transfer.
#[derive(Debug, Clone, Copy)]
enum Post {
    /// Once it holds this many (or nothing more is in flight).
    Every(usize),
    /// Never: the ring fills up.
    Never,
}

/// A one-way flow of probes.
struct Plan {
    stream: u16,
    count: u32,
    /// Most packets sent and not yet received.
    window: usize,
    data_len: fn(u32) -> usize,
    drop: fn(u32) -> bool,
    post: Post,
}

/// What a flow did.
#[derive(Debug, Default)]
struct Outcome {
    sent_pkts: u64,
    sent_bytes: u64,
    dropped: u64,
}

/// Sends `plan` from `a` to `b` and checks that exactly the non-dropped
/// probes arrive, each once and intact, then that nothing else does.
fn transfer<F: Fixture>(
    fx: &mut F,
    a: &mut F::T,
    b: &mut F::T,
    bs: &mut RxState<<F::T as Transport>::Ring>,
    plan: &Plan,
) -> Outcome {
    let route = a
        .resolve(&b.local_routing_info())
        .expect("resolve the peer's routing info");
    let burst_max = a.tx_burst_max();
    let mut pool = TxPool::new(fx, plan.window + burst_max);
    let count = plan.count as usize;
    let mut got = vec![false; count];
    let expected = (0..plan.count).filter(|&s| !(plan.drop)(s)).count();
    let mut received = 0usize;
    let mut next = 0u32;
    let mut inflight = 0usize;
    let mut out = Outcome::default();
    let mut last_progress = Instant::now();
    while received < expected || (next as usize) < count {
        let room = plan.window.saturating_sub(inflight).min(burst_max);
        let room = room.min(count - next as usize);
        if room > 0 {
            let specs: Vec<Spec> = (next..next + room as u32)
                .map(|s| Spec {
                    drop: (plan.drop)(s),
                    ..Spec::new(plan.stream, s, (plan.data_len)(s))
                })
                .collect();
            let accepted = pool.send(a, &route, &specs, |id| got[id.seq as usize]);
            assert!(
                accepted <= specs.len(),
                "tx_burst accepted more than it was given"
            );
            for s in &specs[..accepted] {
                if s.drop {
                    out.dropped += 1;
                } else {
                    inflight += 1;
                    out.sent_pkts += 1;
                    out.sent_bytes += s.frame_len() as u64;
                }
            }
            next += accepted as u32;
            if accepted > 0 {
                last_progress = Instant::now();
            }
        }
        fx.pump();
        let n = bs.poll(b, |idx, p| {
            let p = p.unwrap_or_else(|| panic!("slot {idx}: a valid probe was rejected"));
            let id = probe::check(p).unwrap_or_else(|e| panic!("slot {idx}: {e}"));
            assert_eq!(id.stream, plan.stream, "slot {idx}: stray probe {id:?}");
            let seq = id.seq as usize;
            assert!(seq < count, "slot {idx}: probe {id:?} was never sent");
            assert!(
                !(plan.drop)(id.seq),
                "probe {id:?} was marked drop but arrived"
            );
            assert!(!got[seq], "probe {id:?} arrived twice");
            got[seq] = true;
            received += 1;
            inflight -= 1;
        });
        if n > 0 {
            last_progress = Instant::now();
        }
        if let Post::Every(batch) = plan.post
            && (bs.cur.held >= batch
                || (bs.cur.held > 0 && (inflight == 0 || bs.cur.held == bs.cur.entries)))
        {
            bs.post(b, bs.cur.held);
        }
        if last_progress.elapsed() > IDLE_TIMEOUT {
            let missing: Vec<usize> = (0..count)
                .filter(|&s| !got[s] && !(plan.drop)(s as u32) && s < next as usize)
                .take(8)
                .collect();
            panic!(
                "flow {} stalled: sent {next}/{count}, received {received}/{expected}, \
                 {inflight} in flight, first missing {missing:?}, {} slots held\n\
                 sender: {:?}\nreceiver: {:?}",
                plan.stream,
                bs.cur.held,
                a.stats(),
                b.stats()
            );
        }
    }
    let extra = settle(fx, b, bs);
    assert!(
        extra.is_empty(),
        "flow {}: {} packets arrived after all expected ones",
        plan.stream,
        extra.len()
    );
    if let Post::Every(_) = plan.post {
        bs.post(b, bs.cur.held);
    }
    out
}

fn window_for(entries: usize) -> usize {
    (entries / 2).clamp(1, 64)
}

/// Data sizes that cover the edges: none, one byte, odd sizes, the largest.
fn varied_len(seq: u32) -> usize {
    const LENS: [usize; 9] = [
        0,
        1,
        2,
        13,
        64,
        500,
        967,
        MAX_DATA_PER_PKT - 1,
        MAX_DATA_PER_PKT,
    ];
    LENS[seq as usize % LENS.len()]
}

fn small_len(seq: u32) -> usize {
    (seq as usize * 7) % 48
}

fn never(_: u32) -> bool {
    false
}

/// Counter differences `after - before`.
fn delta(after: TransportStats, before: TransportStats) -> TransportStats {
    TransportStats {
        tx_pkts: after.tx_pkts - before.tx_pkts,
        tx_bytes: after.tx_bytes - before.tx_bytes,
        tx_dropped_on_purpose: after.tx_dropped_on_purpose - before.tx_dropped_on_purpose,
        tx_errors: after.tx_errors - before.tx_errors,
        tx_refused: after.tx_refused - before.tx_refused,
        tx_doorbells: after.tx_doorbells - before.tx_doorbells,
        rx_pkts: after.rx_pkts - before.rx_pkts,
        rx_bytes: after.rx_bytes - before.rx_bytes,
        rx_short: after.rx_short - before.rx_short,
        rx_bad_ethertype: after.rx_bad_ethertype - before.rx_bad_ethertype,
        rx_bad_ip: after.rx_bad_ip - before.rx_bad_ip,
        rx_bad_udp: after.rx_bad_udp - before.rx_bad_udp,
        rx_not_for_us: after.rx_not_for_us - before.rx_not_for_us,
        rx_oversize: after.rx_oversize - before.rx_oversize,
        rx_errors: after.rx_errors - before.rx_errors,
        rx_ip_csum_zero: after.rx_ip_csum_zero - before.rx_ip_csum_zero,
        rx_ip_csum_hw: after.rx_ip_csum_hw - before.rx_ip_csum_hw,
    }
}

fn assert_no_rx_errors(s: &TransportStats, who: &str) {
    let bad = (
        s.rx_short,
        s.rx_bad_ethertype,
        s.rx_bad_ip,
        s.rx_bad_udp,
        s.rx_not_for_us,
        s.rx_oversize,
        s.rx_errors,
    );
    assert_eq!(
        bad,
        (0, 0, 0, 0, 0, 0, 0),
        "{who}: unexpected RX drops: {s:?}"
    );
}

/// Routing info survives its wire form, each side resolves the other, and
/// resolving nonsense fails. The limits are the eRPC ones.
pub fn routing_info<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let (ra, rb) = (a.local_routing_info(), b.local_routing_info());
    for (who, ri) in [("a", ra), ("b", rb)] {
        assert_eq!(
            RoutingInfo::from_bytes(&ri.to_bytes()),
            ri,
            "{who}: wire form"
        );
        assert!(!ri.ipv4.is_unspecified(), "{who}: advertises 0.0.0.0: {ri}");
        assert_ne!(ri.udp_port, 0, "{who}: advertises port 0: {ri}");
    }
    assert_ne!(ra, rb, "two transports advertise the same routing info");
    a.resolve(&RoutingInfo::from_bytes(&rb.to_bytes()))
        .expect("a resolves b's routing info");
    b.resolve(&RoutingInfo::from_bytes(&ra.to_bytes()))
        .expect("b resolves a's routing info");
    assert!(
        a.resolve(&RoutingInfo::default()).is_err(),
        "all-zero routing info must not resolve"
    );
    for (who, ri) in [("a", ra), ("b", rb)] {
        // What a C++ DPDK sender needs: a table size it may divide by, and
        // a queue its formula can produce.
        assert_ne!(ri.rss_table_size, 0, "{who}: RSS table size 0: {ri}");
        assert!(
            ri.rxq_id
                < ri.rss_table_size
                    .min(transport::rss::CPP_MAX_QUEUES_PER_PORT),
            "{who}: RX queue unreachable through its own RSS table: {ri}"
        );
    }
    // A peer that uses RSS resolves too (the source port is then chosen
    // for its queue); one whose queue no RSS can reach does not.
    for q in [0, 5, 15] {
        let rss_peer = RoutingInfo {
            rxq_id: q,
            rss_table_size: 128,
            ..rb
        };
        a.resolve(&rss_peer)
            .unwrap_or_else(|e| panic!("a resolves an RSS peer (queue {q}): {e}"));
    }
    let unreachable = RoutingInfo {
        rxq_id: 16,
        rss_table_size: 128,
        ..rb
    };
    assert!(a.resolve(&unreachable).is_err(), "RX queue 16 of 16");
    // Table size 0 (a C++ raw transport's routing info) means no RSS.
    a.resolve(&RoutingInfo {
        rss_table_size: 0,
        rxq_id: 0,
        ..rb
    })
    .expect("RSS table size 0 resolves (exact-port steering)");
    for t in [&mut a, &mut b] {
        assert_eq!(t.mtu(), MTU);
        assert_eq!(t.max_data_per_pkt(), MAX_DATA_PER_PKT);
        assert!((1..=1024).contains(&t.tx_burst_max()));
        let ring = t.take_rx_ring().expect("the ring handle");
        let entries = ring.entries();
        assert!(
            entries.is_power_of_two() && entries >= 2,
            "{entries} RX entries"
        );
        assert!(t.take_rx_ring().is_none(), "a second ring handle");
        assert!(
            (0..entries + 2).all(|i| ring.packet(i).is_none()),
            "a fresh ring holds no packet"
        );
        assert_eq!(t.stats(), TransportStats::default(), "fresh counters");
    }
}

/// Bursts of every layout and size in both directions arrive intact, with
/// exact counters on both sides.
pub fn bursts_both_directions<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut a_rx = RxState::new(&mut a);
    let mut b_rx = RxState::new(&mut b);
    for (stream, dir) in [(1u16, "a->b"), (2, "b->a")] {
        let (tx, rx, rxs) = if stream == 1 {
            (&mut a, &mut b, &mut b_rx)
        } else {
            (&mut b, &mut a, &mut a_rx)
        };
        let count = 4 * tx.tx_burst_max() as u32 + 3;
        let (tx0, rx0) = (tx.stats(), rx.stats());
        let out = transfer(
            fx,
            tx,
            rx,
            rxs,
            &Plan {
                stream,
                count,
                window: window_for(rxs.cur.entries),
                data_len: varied_len,
                drop: never,
                post: Post::Every(5),
            },
        );
        let (dt, dr) = (delta(tx.stats(), tx0), delta(rx.stats(), rx0));
        assert_eq!(dt.tx_pkts, u64::from(count), "{dir}: tx_pkts {dt:?}");
        assert_eq!(
            dt.tx_bytes, out.sent_bytes,
            "{dir}: tx_bytes (whole frames)"
        );
        assert_eq!(
            (dt.tx_errors, dt.tx_dropped_on_purpose),
            (0, 0),
            "{dir}: {dt:?}"
        );
        assert!(
            dt.tx_doorbells >= 1 && dt.tx_doorbells <= dt.tx_pkts,
            "{dir}: {dt:?}"
        );
        assert_eq!(dr.rx_pkts, u64::from(count), "{dir}: rx_pkts {dr:?}");
        assert_eq!(
            dr.rx_bytes, out.sent_bytes,
            "{dir}: rx_bytes (whole frames)"
        );
        assert_no_rx_errors(&dr, dir);
    }
}

/// A full burst is announced with one doorbell / one send call.
pub fn burst_is_batched<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let n = a.tx_burst_max().min(b_rx.cur.entries);
    let mut pool = TxPool::new(fx, n);
    let specs: Vec<Spec> = (0..n as u32)
        .map(|s| Spec::new(7, s, small_len(s)))
        .collect();
    let before = a.stats();
    assert_eq!(pool.send(&mut a, &route, &specs, |_| false), n);
    let d = delta(a.stats(), before);
    assert_eq!(d.tx_pkts, n as u64);
    assert_eq!(d.tx_doorbells, 1, "one burst of {n} packets: {d:?}");
    let got = wait_for(fx, &mut b, &mut b_rx, n);
    assert_eq!(got.len(), n);
}

/// Polls until `n` packets arrived (all valid probes); returns their ids in
/// arrival order. Does not give slots back.
fn wait_for<F: Fixture>(
    fx: &mut F,
    t: &mut F::T,
    rx: &mut RxState<<F::T as Transport>::Ring>,
    n: usize,
) -> Vec<ProbeId> {
    wait_for_in(fx, t, &rx.ring, &mut rx.cur, n)
}

/// [`wait_for`], with the ring borrowed apart from the counters (so that
/// the caller may hold packets read from it meanwhile).
fn wait_for_in<F: Fixture>(
    fx: &mut F,
    t: &mut F::T,
    ring: &<F::T as Transport>::Ring,
    cur: &mut Cursor,
    n: usize,
) -> Vec<ProbeId> {
    let mut ids = Vec::with_capacity(n);
    let start = Instant::now();
    while ids.len() < n {
        fx.pump();
        cur.poll(ring, t, |idx, p| {
            let p = p.unwrap_or_else(|| panic!("slot {idx}: a valid probe was rejected"));
            ids.push(probe::check(p).unwrap_or_else(|e| panic!("slot {idx}: {e}")));
        });
        assert!(
            start.elapsed() < IDLE_TIMEOUT,
            "waited for {n} packets, {} arrived; receiver {:?}",
            ids.len(),
            t.stats()
        );
    }
    assert_eq!(ids.len(), n, "more packets than were sent");
    ids
}

/// Received packets are read in place: each slot has a fixed address,
/// distinct slots do not overlap, and a held packet stays intact while the
/// transport sends and receives more (the ring handle is independent of
/// the transport's borrow).
pub fn zero_copy_rx<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut a_rx = RxState::new(&mut a);
    let mut b_rx = RxState::new(&mut b);
    let ab = a.resolve(&b.local_routing_info()).unwrap();
    let ba = b.resolve(&a.local_routing_info()).unwrap();
    let k = (b_rx.cur.entries / 2).min(a.tx_burst_max());
    let mut a_pool = TxPool::new(fx, 2 * k);
    let mut b_pool = TxPool::new(fx, k);

    let first: Vec<Spec> = (0..k as u32)
        .map(|s| Spec::new(1, s, varied_len(s)))
        .collect();
    assert_eq!(a_pool.send(&mut a, &ab, &first, |_| false), k);
    let ids = wait_for(fx, &mut b, &mut b_rx, k);
    assert_eq!(
        ids.iter().map(|i| i.seq).collect::<Vec<_>>(),
        (0..k as u32).collect::<Vec<_>>()
    );

    let ring = &b_rx.ring;
    let held: Vec<&[u8]> = (0..k)
        .map(|i| ring.packet(i).expect("held packet"))
        .collect();
    let copies: Vec<Vec<u8>> = held.iter().map(|p| p.to_vec()).collect();
    for (i, p) in held.iter().enumerate() {
        let q = ring.packet(i).unwrap();
        assert_eq!(
            (p.as_ptr(), p.len()),
            (q.as_ptr(), q.len()),
            "slot {i}: two reads disagree"
        );
        for (j, r) in held.iter().enumerate().skip(i + 1) {
            let (ps, rs) = (p.as_ptr() as usize, r.as_ptr() as usize);
            assert!(
                ps + p.len() <= rs || rs + r.len() <= ps,
                "slots {i} and {j} overlap"
            );
        }
    }

    // Use the transport mutably while holding the packets: send from b,
    // and receive more into other slots.
    let back: Vec<Spec> = (0..k as u32)
        .map(|s| Spec::new(2, s, small_len(s)))
        .collect();
    assert_eq!(b_pool.send(&mut b, &ba, &back, |_| false), k);
    let more: Vec<Spec> = (k as u32..2 * k as u32)
        .map(|s| Spec::new(1, s, varied_len(s)))
        .collect();
    assert_eq!(a_pool.send(&mut a, &ab, &more, |_| false), more.len());
    let ids2 = wait_for_in(fx, &mut b, ring, &mut b_rx.cur, more.len());
    assert!(ids2.iter().all(|id| id.stream == 1 && id.seq >= k as u32));
    wait_for(fx, &mut a, &mut a_rx, k);
    for (i, (p, c)) in held.iter().zip(&copies).enumerate() {
        assert_eq!(p, c, "slot {i} changed while held");
        assert_eq!(ring.packet(i).unwrap().as_ptr(), p.as_ptr());
    }
    b_rx.post(&mut b, b_rx.cur.held);
}

/// Many laps around the ring, giving slots back in odd-sized batches:
/// every packet lands in the next slot in ring order, intact, and each slot
/// keeps its address on every lap.
pub fn ring_wrap_around<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let entries = b_rx.cur.entries;
    let count = (2 * entries + entries / 2 + 3) as u32;
    let before = b.stats();
    transfer(
        fx,
        &mut a,
        &mut b,
        &mut b_rx,
        &Plan {
            stream: 3,
            count,
            window: window_for(entries),
            data_len: small_len,
            drop: never,
            post: Post::Every(7.min(entries - 1).max(1)),
        },
    );
    assert_eq!(b_rx.cur.head, u64::from(count));
    let d = delta(b.stats(), before);
    assert_eq!(d.rx_pkts, u64::from(count));
    assert_no_rx_errors(&d, "receiver");
}

/// A ring with no posted slot takes nothing; giving `k` slots back lets
/// exactly `k` packets in; giving all back lets traffic flow again.
pub fn post_recvs_accounting<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let entries = b_rx.cur.entries;
    let route = a.resolve(&b.local_routing_info()).unwrap();

    // Fill every slot and keep them.
    transfer(
        fx,
        &mut a,
        &mut b,
        &mut b_rx,
        &Plan {
            stream: 1,
            count: entries as u32,
            window: window_for(entries),
            data_len: small_len,
            drop: never,
            post: Post::Never,
        },
    );
    assert_eq!(b_rx.cur.held, entries);

    // Full ring: whatever is sent now must not show up (the UDP transport
    // leaves it in the socket buffer, a NIC drops it).
    let burst = a.tx_burst_max();
    let mut pool = TxPool::new(fx, 2 * burst);
    let extra = 8.min(burst) as u32;
    let specs: Vec<Spec> = (0..extra).map(|s| Spec::new(2, s, small_len(s))).collect();
    // Whether a packet of this case arrives is not known in advance: every
    // buffer reuse waits for `tx_flush`.
    assert_eq!(pool.send(&mut a, &route, &specs, |_| false), specs.len());
    let got = settle(fx, &mut b, &mut b_rx);
    assert!(
        got.is_empty(),
        "{} packets arrived into a full ring",
        got.len()
    );

    // Give k slots back: exactly k more packets arrive.
    let k = (entries / 4).max(1);
    b_rx.post(&mut b, k);
    let mut arrived = Vec::new();
    let mut seq = 0u32;
    let to_send = (k + extra as usize) as u32;
    let start = Instant::now();
    while seq < to_send {
        let n = (to_send - seq).min(burst as u32);
        let specs: Vec<Spec> = (seq..seq + n)
            .map(|s| Spec::new(3, s, small_len(s)))
            .collect();
        seq += pool.send(&mut a, &route, &specs, |_| false) as u32;
        fx.pump();
        b_rx.poll(&mut b, |idx, p| arrived.push((idx, p.map(probe::check))));
        assert!(
            start.elapsed() < IDLE_TIMEOUT,
            "could not send {to_send} packets"
        );
    }
    let late = settle(fx, &mut b, &mut b_rx);
    assert!(
        arrived.len() + late.len() == k,
        "{k} slots given back, {} packets arrived (+{} late)",
        arrived.len(),
        late.len()
    );
    let mut ids = Vec::new();
    for (idx, r) in arrived {
        let id = r
            .unwrap_or_else(|| panic!("slot {idx}: rejected"))
            .unwrap_or_else(|e| panic!("slot {idx}: {e}"));
        ids.push(id);
    }
    for p in late.iter().flatten() {
        ids.push(probe::check(p).unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), k, "duplicates among the {k} packets");
    assert!(ids.iter().all(|id| id.stream == 2 || id.stream == 3));
    assert_eq!(b_rx.cur.held, entries);
    let nothing = settle(fx, &mut b, &mut b_rx);
    assert!(
        nothing.is_empty(),
        "ring full again, yet {} arrived",
        nothing.len()
    );

    // Give everything back: new packets all arrive (plus, for a transport
    // that queues them, what the full ring turned away).
    b_rx.post(&mut b, entries);
    let fresh = 8.min(burst) as u32;
    let specs: Vec<Spec> = (0..fresh).map(|s| Spec::new(4, s, small_len(s))).collect();
    assert_eq!(pool.send(&mut a, &route, &specs, |_| false), specs.len());
    let mut after = Vec::new();
    let start = Instant::now();
    while after.iter().filter(|id: &&ProbeId| id.stream == 4).count() < fresh as usize {
        fx.pump();
        b_rx.poll(&mut b, |idx, p| {
            let p = p.unwrap_or_else(|| panic!("slot {idx}: rejected"));
            after.push(probe::check(p).unwrap());
        });
        assert!(
            start.elapsed() < IDLE_TIMEOUT,
            "fresh packets did not arrive: {after:?}"
        );
    }
    for p in settle(fx, &mut b, &mut b_rx).into_iter().flatten() {
        after.push(probe::check(&p).unwrap());
    }
    let queued = 2 * extra as usize;
    assert!(
        after.len() <= fresh as usize + queued,
        "{} packets arrived, at most {} were pending",
        after.len(),
        fresh as usize + queued
    );
    b_rx.post(&mut b, b_rx.cur.held);
}

/// TX items the transport cannot send (frame over the MTU, header slot
/// shorter than a packet header) are consumed, counted as `tx_errors`, and
/// never reach the peer; valid items around them in the same burst do.
pub fn oversize_and_malformed_tx<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let mut pool = TxPool::new(fx, 4);
    let specs = [
        Spec::new(5, 0, 10),
        Spec::new(5, 1, MAX_DATA_PER_PKT + 1),
        Spec {
            short_hdr: true,
            ..Spec::new(5, 2, 0)
        },
        Spec::new(5, 3, MAX_DATA_PER_PKT),
    ];
    let mut n = specs.len().min(a.tx_burst_max());
    if n < specs.len() {
        // A transport with tiny bursts: send the cases one by one.
        n = 0;
        for s in &specs {
            n += pool.send(&mut a, &route, std::slice::from_ref(s), |_| false);
        }
    } else {
        n = pool.send(&mut a, &route, &specs, |_| false);
    }
    assert_eq!(
        n,
        specs.len(),
        "malformed items must be consumed, not retried"
    );
    let d = a.stats();
    assert_eq!((d.tx_pkts, d.tx_errors), (2, 2), "{d:?}");
    assert_eq!(
        d.tx_bytes,
        (specs[0].frame_len() + specs[3].frame_len()) as u64
    );
    let ids = wait_for(fx, &mut b, &mut b_rx, 2);
    assert_eq!(ids.iter().map(|i| i.seq).collect::<Vec<_>>(), [0, 3]);
    let extra = settle(fx, &mut b, &mut b_rx);
    assert!(extra.is_empty(), "a malformed item reached the peer");
}

/// Datagrams that are not eRPC packets (longer than the MTU allows,
/// shorter than an eRPC header) are counted by reason and read as `None`,
/// while a valid one next to them arrives. Needs [`Fixture::inject`].
pub fn malformed_rx<F: Fixture>(fx: &mut F) {
    let (_a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let max_payload = MTU - HEADROOM_BYTES;
    let valid = probe::payload(ProbeId { stream: 6, seq: 0 }, MAX_DATA_PER_PKT);
    assert_eq!(valid.len(), max_payload);
    let mut injected = (0, 0, 0); // (oversize, short, valid)
    for (payload, kind) in [
        (vec![0xab; max_payload + 1], 0),
        (vec![0xab; 2000], 0),
        (vec![0xcd; ERPC_HDR_BYTES - 1], 1),
        (Vec::new(), 1),
        (valid.clone(), 2),
    ] {
        if fx.inject(&b, &payload) {
            match kind {
                0 => injected.0 += 1,
                1 => injected.1 += 1,
                _ => injected.2 += 1,
            }
        }
    }
    if injected == (0, 0, 0) {
        eprintln!("malformed_rx: skipped, the fixture cannot inject datagrams");
        return;
    }
    let mut good = Vec::new();
    let start = Instant::now();
    while good.len() < injected.2 {
        fx.pump();
        b_rx.poll(&mut b, |_, p| {
            if let Some(p) = p {
                good.push(probe::check(p).expect("an accepted payload must be intact"));
            }
        });
        assert!(
            start.elapsed() < IDLE_TIMEOUT,
            "the valid datagram did not arrive"
        );
    }
    for p in settle(fx, &mut b, &mut b_rx).into_iter().flatten() {
        good.push(probe::check(&p).expect("an accepted payload must be intact"));
    }
    assert_eq!(
        good.len(),
        injected.2,
        "only the valid datagram may be readable"
    );
    let s = b.stats();
    assert_eq!(
        s.rx_oversize, injected.0,
        "oversize datagrams counted: {s:?}"
    );
    assert_eq!(s.rx_short, injected.1, "short datagrams counted: {s:?}");
    assert!(s.rx_pkts >= injected.2 as u64, "{s:?}");
}

/// Items with `drop` set are accepted and counted but never sent.
pub fn drop_flag_honoured<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let count = 3 * a.tx_burst_max() as u32 + 5;
    let window = window_for(b_rx.cur.entries);
    let out = transfer(
        fx,
        &mut a,
        &mut b,
        &mut b_rx,
        &Plan {
            stream: 8,
            count,
            window,
            data_len: varied_len,
            drop: |s| s % 3 == 1,
            post: Post::Every(3),
        },
    );
    let (sa, sb) = (a.stats(), b.stats());
    let dropped = (0..count).filter(|s| s % 3 == 1).count() as u64;
    assert_eq!(out.dropped, dropped);
    assert_eq!(sa.tx_dropped_on_purpose, out.dropped, "{sa:?}");
    assert_eq!(
        sa.tx_pkts, out.sent_pkts,
        "dropped packets are not sent: {sa:?}"
    );
    assert_eq!(sa.tx_bytes, out.sent_bytes, "{sa:?}");
    assert_eq!(sa.tx_errors, 0, "{sa:?}");
    assert_eq!(sb.rx_pkts, out.sent_pkts, "{sb:?}");
}

/// After `tx_flush` the TX buffers may be overwritten: what arrives is what
/// was in them at `tx_burst`.
pub fn tx_flush_releases_buffers<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let n = a.tx_burst_max().min(b_rx.cur.entries);
    let mut pool = TxPool::new(fx, n);
    let specs: Vec<Spec> = (0..n as u32)
        .map(|s| Spec::new(9, s, varied_len(s)))
        .collect();
    assert_eq!(pool.send(&mut a, &route, &specs, |_| false), n);
    a.tx_flush();
    for m in &mut pool.bufs {
        m.bytes_mut().fill(0xee);
    }
    let ids = wait_for(fx, &mut b, &mut b_rx, n);
    assert_eq!(ids.len(), n);
}

/// Routes to a peer that uses RSS (its routing info claims an RSS table of
/// 128 entries and various queues) and to the same peer without RSS, mixed
/// in one burst: every packet arrives, in order, intact. (Our transports
/// steer by exact port, so the receiver takes all of them; which source
/// port each route uses is checked by each transport's own tests.)
pub fn rss_routes_in_one_burst<F: Fixture>(fx: &mut F) {
    let (mut a, mut b) = fx.pair();
    let mut b_rx = RxState::new(&mut b);
    let info = b.local_routing_info();
    let routes: Vec<<F::T as Transport>::Route> = [None, Some(3), Some(3), Some(11), Some(0)]
        .into_iter()
        .map(|q| {
            let ri = match q {
                None => info,
                Some(q) => RoutingInfo {
                    rxq_id: q,
                    rss_table_size: 128,
                    ..info
                },
            };
            a.resolve(&ri).expect("resolve")
        })
        .collect();
    let n = a.tx_burst_max().min(b_rx.cur.entries).min(16);
    let mut pool = TxPool::new(fx, n);
    let specs: Vec<Spec> = (0..n as u32)
        .map(|s| Spec::new(12, s, varied_len(s)))
        .collect();
    // Packet i goes on route i / 2 mod 5: runs of two, then a switch.
    let route_of = |s: &Spec| &routes[(s.id.seq as usize / 2) % routes.len()];
    for (j, s) in specs.iter().enumerate() {
        prepare(&a, route_of(s), &mut pool.bufs[j], s);
    }
    let items: Vec<TxItem<'_, _>> = specs
        .iter()
        .enumerate()
        .map(|(j, s)| item(route_of(s), &pool.bufs[j], s))
        .collect();
    assert_eq!(a.tx_burst(&items), n);
    let ids = wait_for(fx, &mut b, &mut b_rx, n);
    assert_eq!(
        ids.iter().map(|i| i.seq).collect::<Vec<_>>(),
        (0..n as u32).collect::<Vec<_>>(),
        "all packets, in order"
    );
    let d = a.stats();
    assert_eq!((d.tx_pkts, d.tx_errors), (n as u64, 0), "{d:?}");
    b_rx.post(&mut b, b_rx.cur.held);
}

/// The ring handle is the transport's own: giving slots back through
/// another transport's handle, or more slots than are held, panics (before
/// anything is given back), and slots not held read as `None`.
pub fn ring_ownership_is_checked<F: Fixture>(fx: &mut F) {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let (mut a, mut b) = fx.pair();
    let mut a_rx = RxState::new(&mut a);
    let mut b_rx = RxState::new(&mut b);
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let mut pool = TxPool::new(fx, 2);
    let specs = [Spec::new(13, 0, 5), Spec::new(13, 1, 7)];
    assert_eq!(pool.send(&mut a, &route, &specs, |_| false), 2);
    wait_for(fx, &mut b, &mut b_rx, 2);
    let entries = b_rx.cur.entries;
    assert!(b_rx.ring.packet(0).is_some() && b_rx.ring.packet(1).is_some());
    assert!(b_rx.ring.packet(2).is_none(), "slot 2 was never reported");
    assert!(b_rx.ring.packet(entries).is_none(), "out of range");

    let foreign = catch_unwind(AssertUnwindSafe(|| b.post_recvs(&mut a_rx.ring, 1)));
    assert!(foreign.is_err(), "post_recvs took another transport's ring");
    let too_many = catch_unwind(AssertUnwindSafe(|| b.post_recvs(&mut b_rx.ring, 3)));
    assert!(too_many.is_err(), "post_recvs gave back 3 of 2 held slots");
    // Nothing was given back by either refusal.
    assert!(b_rx.ring.packet(0).is_some() && b_rx.ring.packet(1).is_some());

    b_rx.post(&mut b, 1);
    assert!(b_rx.ring.packet(0).is_none(), "slot 0 was given back");
    assert_eq!(
        probe::check(b_rx.ring.packet(1).expect("slot 1 is still held")),
        Ok(ProbeId { stream: 13, seq: 1 })
    );
    b_rx.post(&mut b, 1);
    assert!(b_rx.ring.packet(1).is_none(), "slot 1 was given back");
}

/// Runs every case, each on a fresh pair.
pub fn run_all<F: Fixture>(fx: &mut F) {
    routing_info(fx);
    bursts_both_directions(fx);
    burst_is_batched(fx);
    zero_copy_rx(fx);
    ring_wrap_around(fx);
    post_recvs_accounting(fx);
    oversize_and_malformed_tx(fx);
    malformed_rx(fx);
    drop_flag_honoured(fx);
    tx_flush_releases_buffers(fx);
    rss_routes_in_one_burst(fx);
    ring_ownership_is_checked(fx);
}

/// Writes one `#[test]` per conformance case, each building its fixture
/// with the given expression. Invoke it inside a module of its own.
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:expr) => {
        $crate::conformance_tests!(@cases $fixture;
            routing_info, bursts_both_directions, burst_is_batched, zero_copy_rx,
            ring_wrap_around, post_recvs_accounting, oversize_and_malformed_tx,
            malformed_rx, drop_flag_honoured, tx_flush_releases_buffers,
            rss_routes_in_one_burst, ring_ownership_is_checked);
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::$case(&mut $fixture);
            }
        )*
    };
}

/// Parses `frame` with [`wire::parse_frame`] and checks that the verdict is
/// consistent with the bytes: an accepted frame is exactly what its headers
/// say (and nothing past its end was needed), a rejected one is rejected
/// for a reason the bytes show. Panics on any inconsistency; shared by the
/// property tests and the fuzz target.
pub fn parse_frame_checked(frame: &[u8]) -> Result<ParsedFrame<'_>, FrameError> {
    parse_frame_checked_with(frame, ParseOptions::STRICT)
}

/// [`parse_frame_checked`] for [`wire::parse_frame_with`]: the same checks,
/// plus that a relaxation only ever turns a rejection for a zero IPv4
/// checksum into an acceptance (flagged), and changes nothing else.
pub fn parse_frame_checked_with(
    frame: &[u8],
    opts: ParseOptions,
) -> Result<ParsedFrame<'_>, FrameError> {
    use wire::{ETH_HDR_BYTES, ETHERTYPE_IPV4, IPPROTO_UDP, IPV4_HDR_BYTES, UDP_HDR_BYTES};
    let r = wire::parse_frame_with(frame, opts);
    let zero_field = frame.len() >= ETH_HDR_BYTES + 12
        && frame[ETH_HDR_BYTES + 10] == 0
        && frame[ETH_HDR_BYTES + 11] == 0;
    if opts != ParseOptions::STRICT {
        let strict = wire::parse_frame(frame);
        match (&strict, &r) {
            (Ok(s), _) => assert_eq!(r, Ok(*s), "a relaxation changed a strict acceptance"),
            (Err(e), Ok(p)) => {
                assert_eq!(*e, FrameError::BadIp, "relaxed past {e:?}");
                assert!(p.ip_checksum_zero && zero_field, "relaxed past a checksum");
            }
            (Err(e), Err(l)) if e != l => {
                assert!(
                    *e == FrameError::BadIp && zero_field,
                    "strict says {e:?}, relaxed says {l:?}"
                );
            }
            (Err(_), Err(_)) => {}
        }
    }
    if frame.len() < HEADROOM_BYTES {
        assert_eq!(r, Err(FrameError::Short), "{} bytes", frame.len());
        return r;
    }
    let be16 = |o: usize| usize::from(u16::from_be_bytes([frame[o], frame[o + 1]]));
    if be16(12) != usize::from(ETHERTYPE_IPV4) {
        assert_eq!(r, Err(FrameError::BadEthertype));
        return r;
    }
    let Ok(p) = r else { return r };

    let ip = &frame[ETH_HDR_BYTES..ETH_HDR_BYTES + IPV4_HDR_BYTES];
    let ip_len = be16(16);
    let end = ETH_HDR_BYTES + ip_len;
    assert_eq!(
        ip[0],
        0x45,
        "accepted IPv4 with options or version {}",
        ip[0] >> 4
    );
    assert!(
        ip_len >= IPV4_HDR_BYTES + UDP_HDR_BYTES,
        "accepted IP length {ip_len}"
    );
    assert!(
        end <= frame.len(),
        "accepted a frame longer than the buffer"
    );
    assert!(end <= MTU, "accepted a frame over the MTU");
    assert_eq!(be16(20) & 0x3fff, 0, "accepted a fragment");
    if p.ip_checksum_zero {
        assert!(
            opts.accept_zero_ip_checksum && zero_field,
            "flagged a zero checksum that is not allowed or not zero"
        );
        assert_ne!(
            wire::ipv4_checksum(ip),
            0,
            "flagged a checksum that verifies"
        );
    } else {
        assert_eq!(wire::ipv4_checksum(ip), 0, "accepted a bad IPv4 checksum");
    }
    assert_eq!(ip[9], IPPROTO_UDP, "accepted protocol {}", ip[9]);
    assert_eq!(
        be16(38),
        ip_len - IPV4_HDR_BYTES,
        "accepted inconsistent UDP length"
    );
    assert_eq!(
        p.payload.as_ptr(),
        frame[HEADROOM_BYTES..].as_ptr(),
        "payload offset"
    );
    assert_eq!(p.payload.len(), end - HEADROOM_BYTES, "payload length");
    assert_eq!(p.dst_mac[..], frame[0..6]);
    assert_eq!(p.src_mac[..], frame[6..12]);
    assert_eq!(p.src_ip.octets()[..], frame[26..30]);
    assert_eq!(p.dst_ip.octets()[..], frame[30..34]);
    assert_eq!(
        (usize::from(p.src_port), usize::from(p.dst_port)),
        (be16(34), be16(36))
    );
    // The verdict depends on nothing past the frame's end, and a frame cut
    // short is reported as short.
    assert_eq!(
        wire::parse_frame_with(&frame[..end], opts),
        Ok(p),
        "bytes past the end changed the verdict"
    );
    assert_eq!(
        wire::parse_frame_with(&frame[..end - 1], opts),
        Err(FrameError::Short)
    );
    Ok(p)
}

/// Checks what a peer's routing info (any 48 bytes from the network) does
/// to the RSS source-port choice: no panic (a table size of 0 is not a
/// divisor), and a chosen port follows the C++ rule and is the first that
/// does. Shared by the property tests and the fuzz target.
pub fn rss_source_port_checked(
    src_ip: std::net::Ipv4Addr,
    info: &RoutingInfo,
) -> Result<Option<u16>, transport::rss::RssError> {
    use transport::rss;
    let r = rss::source_port(src_ip, info);
    match r {
        Ok(None) => assert!(info.rss_table_size <= 1, "no port for an RSS peer: {info}"),
        Ok(Some(p)) => {
            assert!(info.rss_table_size > 1);
            assert!((rss::RSS_BASE_SRC_PORT..u16::MAX).contains(&p));
            let q = |port| {
                rss::queue_of(
                    rss::hash_v4_udp(src_ip, info.ipv4, port, info.udp_port),
                    info.rss_table_size,
                )
            };
            assert_eq!(q(p), info.rxq_id, "port {p} misses the queue: {info}");
            assert_eq!(rss::source_ports(src_ip, info).next(), Some(p));
        }
        Err(rss::RssError::QueueUnreachable { .. }) => assert!(
            info.rss_table_size > 1
                && info.rxq_id >= info.rss_table_size.min(rss::CPP_MAX_QUEUES_PER_PORT)
        ),
        Err(rss::RssError::NoPort { .. }) => {
            assert_eq!(rss::source_ports(src_ip, info).next(), None)
        }
    }
    r
}
