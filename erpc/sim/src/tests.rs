//! The simulated network's own tests: frames, faults, rings, deferred DMA.

use super::*;
use transport::PKTHDR_BYTES;

fn send(t: &mut SimTransport, route: &SimRoute, n: usize, payload: &[u8]) {
    let mut frame = vec![0u8; HEADROOM_BYTES + payload.len()];
    let len = frame.len();
    t.fill_headroom(route, &mut frame[..HEADROOM_BYTES], len);
    frame[HEADROOM_BYTES..].copy_from_slice(payload);
    let item = TxItem::unregistered(route, &frame, &[]);
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
        link: LinkFaults {
            loss: 0.5,
            duplicate: 0.2,
            ..crate::delayed_link(1_000, 0)
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

/// A network in deferred-DMA mode (reads only at flushes and after
/// `later` later sends unless `delay_ns`), two endpoints, and a buffer
/// from the network's allocator.
fn deferred(
    later: u32,
    delay_ns: u64,
    panic: bool,
) -> (
    SimNet,
    SimTransport,
    SimTransport,
    SimRoute,
    mempool::Allocator,
) {
    let cfg = SimConfig {
        deferred_dma: Some(DeferredDma {
            max_later_sends: later,
            max_delay_ns: delay_ns,
            panic,
            poison: 0xa5,
        }),
        ..SimConfig::default()
    };
    let (net, a, b, r) = pair(cfg);
    let alloc = net.allocator(2 << 20);
    (net, a, b, r, alloc)
}

/// Writes a frame with payload byte `v` into `buf` and hands it over.
fn send_buf(t: &mut SimTransport, r: &SimRoute, buf: &mut mempool::Buffer, v: u8) -> usize {
    let len = HEADROOM_BYTES + 100;
    let b = buf.as_mut_slice();
    t.fill_headroom(r, &mut b[..HEADROOM_BYTES], len);
    b[HEADROOM_BYTES..len].fill(v);
    let item = TxItem::contiguous(r, &buf.as_slice()[..len], buf.iova(), buf.lkey());
    t.tx_burst(std::slice::from_ref(&item))
}

#[test]
fn deferred_dma_reads_at_the_flush_what_the_buffer_holds_then() {
    let (net, mut a, mut b, r, mut alloc) = deferred(1000, 0, true);
    let mut buf = alloc.alloc(1024).unwrap();
    assert_eq!(send_buf(&mut a, &r, &mut buf, 1), 1);
    net.advance(10_000);
    assert_eq!(b.rx_burst(), 0, "not read yet: nothing on the wire");
    assert_eq!(net.dma_pending(0), 1);
    a.tx_flush();
    assert_eq!(net.dma_pending(0), 0);
    net.advance(1_000);
    assert_eq!(b.rx_burst(), 1);
    let mut ring = b.take_rx_ring().unwrap();
    assert_eq!(ring.packet(0).unwrap(), &[1u8; 100][..]);
    b.post_recvs(&mut ring, 1);
    let s = net.stats();
    assert_eq!((s.dma_deferred, s.dma_mismatches, s.dma_faults), (1, 0, 0));
    alloc.free(buf);
}

#[test]
fn deferred_dma_reads_after_later_sends_or_a_delay_never_in_the_same_burst() {
    // Every send is read at the next burst (0 later sends drawn).
    let (net, mut a, mut b, r, mut alloc) = deferred(0, 0, true);
    let mut bufs: Vec<_> = (0..2).map(|_| alloc.alloc(1024).unwrap()).collect();
    send_buf(&mut a, &r, &mut bufs[0], 1);
    assert_eq!(net.dma_pending(0), 1, "never read in its own burst");
    send_buf(&mut a, &r, &mut bufs[1], 2);
    assert_eq!(
        net.dma_pending(0),
        1,
        "the first was read at the second burst"
    );
    net.advance(1_000);
    assert_eq!(b.rx_burst(), 1);
    // Drained before the buffers go back (the second send is still
    // held, and a dropped transport reads what it holds).
    a.tx_flush();
    for buf in bufs {
        alloc.free(buf);
    }
    // A delay bound: read at the first advance past it.
    let (net, mut a, mut b, r, mut alloc) = deferred(1000, 5_000, true);
    let mut buf = alloc.alloc(1024).unwrap();
    send_buf(&mut a, &r, &mut buf, 3);
    assert!(net.next_event_ns().is_some_and(|t| t <= 5_000));
    net.advance(5_000);
    net.advance(1_000);
    assert_eq!(b.rx_burst(), 1);
    assert_eq!(net.dma_pending(0), 0);
    alloc.free(buf);
}

#[test]
fn deferred_dma_counts_a_buffer_rewritten_or_freed_before_the_read() {
    let (net, mut a, _b, r, mut alloc) = deferred(1000, 0, false);
    let mut buf = alloc.alloc(1024).unwrap();
    send_buf(&mut a, &r, &mut buf, 1);
    // Rewritten while the NIC owns it.
    buf.as_mut_slice()[HEADROOM_BYTES + 50] = 9;
    a.tx_flush();
    assert_eq!(net.stats().dma_mismatches, 1);
    let m = net.dma_first_error().unwrap();
    assert!(
        m.contains("was rewritten while") && m.contains("first at byte 92"),
        "{m}"
    );
    // Freed (and poisoned) while the NIC owns it.
    send_buf(&mut a, &r, &mut buf, 1);
    alloc.free(buf);
    a.tx_flush();
    assert_eq!(net.stats().dma_mismatches, 2);
    // Memory the IOMMU never saw: a fault at tx_burst, nothing sent.
    let mut other_alloc = test_allocator(2 << 20);
    let mut other = other_alloc.alloc(1024).unwrap();
    send_buf(&mut a, &r, &mut other, 1);
    assert_eq!(net.stats().dma_faults, 1);
    assert_eq!(net.dma_pending(0), 0);
    other_alloc.free(other);
}

#[test]
#[should_panic(expected = "was freed (it now holds the allocator's poison 0xa5)")]
fn deferred_dma_panics_naming_a_freed_buffer() {
    let (_net, mut a, _b, r, mut alloc) = deferred(1000, 0, true);
    let mut buf = alloc.alloc(1024).unwrap();
    send_buf(&mut a, &r, &mut buf, 1);
    alloc.free(buf);
    a.tx_flush();
}

#[test]
fn malformed_frames_read_as_none_and_jitter_keeps_order() {
    let cfg = SimConfig {
        link: crate::delayed_link(1_000, 5_000),
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
