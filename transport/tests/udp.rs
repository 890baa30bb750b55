//! The UDP transport over loopback: the shared conformance suite (with the
//! default 4096-entry ring and with a tiny one), then what is specific to
//! kernel UDP: bind errors, configuration, resolution, malformed datagrams,
//! ring ownership, zero-copy echo from the RX ring, and datagrams the
//! kernel refuses.

// The shared transport conformance suite (a module of the tests only).
#[macro_use]
mod conformance;

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use common::pcap::{TempPath, read_pcap};
use conformance::{Fixture, HeapMemory, probe};
use transport::udp::{MAX_PAYLOAD_BYTES, UdpConfig, UdpTransport};
use transport::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, PKTHDR_BYTES, RoutingInfo, RxRing, Transport, TransportError,
    TxItem,
};

/// How long a test waits for datagrams that were already sent on loopback
/// (the kernel queues them before `send` returns) before failing: only a
/// guard that turns a lost datagram into a failure instead of a hang, so
/// generous enough for a heavily loaded machine. Not a speed bound.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Pairs of UDP transports on 127.0.0.1 with free ports.
struct Loopback {
    config: UdpConfig,
    injector: UdpSocket,
}

impl Loopback {
    fn new(config: UdpConfig) -> Loopback {
        Loopback {
            config,
            injector: UdpSocket::bind("127.0.0.1:0").unwrap(),
        }
    }

    fn default_ring() -> Loopback {
        Loopback::new(UdpConfig::loopback())
    }

    /// 16 slots, bursts of 4: many wrap-arounds, bursts split into chunks.
    fn tiny_ring() -> Loopback {
        Loopback::new(UdpConfig {
            rx_ring_entries: 16,
            rx_burst_max: 5,
            tx_burst_max: 4,
            ..UdpConfig::loopback()
        })
    }
}

impl Fixture for Loopback {
    type T = UdpTransport;
    type Mem = HeapMemory;

    fn pair(&mut self) -> (UdpTransport, UdpTransport) {
        let a = UdpTransport::new(&self.config).expect("bind a");
        let b = UdpTransport::new(&self.config).expect("bind b");
        (a, b)
    }

    fn tx_memory(&mut self, len: usize) -> HeapMemory {
        HeapMemory::new(len)
    }

    fn pump(&mut self) {
        std::thread::yield_now();
    }

    fn inject(&mut self, to: &UdpTransport, payload: &[u8]) -> bool {
        let sent = self.injector.send_to(payload, to.local_addr()).unwrap();
        assert_eq!(sent, payload.len());
        true
    }
}

mod conformance_default_ring {
    crate::conformance_tests!(super::Loopback::default_ring());
}

mod conformance_tiny_ring {
    crate::conformance_tests!(super::Loopback::tiny_ring());
}

fn io_error_text(e: TransportError) -> String {
    assert!(matches!(e, TransportError::Io { .. }), "{e:?}");
    e.to_string()
}

#[test]
fn bind_to_a_port_in_use_names_address_and_reason() {
    let first = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let addr = first.local_addr();
    let err = UdpTransport::new(&UdpConfig::new(addr)).unwrap_err();
    let text = io_error_text(err);
    assert!(text.contains(&addr.to_string()), "{text}");
    assert!(text.contains("port in use"), "{text}");
}

#[test]
fn bind_to_a_foreign_address_names_address_and_reason() {
    // TEST-NET-2 (RFC 5737): never assigned to a real host. Binding sends
    // nothing.
    let addr = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 77), 31850);
    let text = io_error_text(UdpTransport::new(&UdpConfig::new(addr)).unwrap_err());
    assert!(text.contains("198.51.100.77:31850"), "{text}");
    assert!(text.contains("address not assigned to this host"), "{text}");
}

#[test]
fn wildcard_bind_needs_an_advertised_address() {
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
    let text = io_error_text(UdpTransport::new(&UdpConfig::new(any)).unwrap_err());
    assert!(text.contains("advertise"), "{text}");

    let t = UdpTransport::new(&UdpConfig {
        advertise: Some(Ipv4Addr::LOCALHOST),
        ..UdpConfig::new(any)
    })
    .unwrap();
    let ri = t.local_routing_info();
    assert_eq!(ri.ipv4, Ipv4Addr::LOCALHOST);
    assert_eq!(ri.udp_port, t.local_addr().port());
    assert_ne!(ri.udp_port, 0);
    assert_eq!(ri.mac, [0; 6]);

    // And a peer reaches it through the advertised address.
    let mut peer = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let route = peer.resolve(&ri).unwrap();
    assert_eq!(
        route.addr(),
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, ri.udp_port)
    );
    let mut t = t;
    let pkt = header_slot(42, 0);
    assert_eq!(peer.tx_burst(&[TxItem::unregistered(&route, &pkt, &[])]), 1);
    assert_eq!(receive(&mut t, 1).len(), 1);
}

#[test]
fn invalid_configurations_are_refused_with_the_reason() {
    let base = UdpConfig::loopback;
    let cases = [
        (
            UdpConfig {
                rx_ring_entries: 1000,
                ..base()
            },
            "power of two",
        ),
        (
            UdpConfig {
                rx_ring_entries: 0,
                ..base()
            },
            "power of two",
        ),
        (
            UdpConfig {
                tx_burst_max: 0,
                ..base()
            },
            "tx_burst_max",
        ),
        (
            UdpConfig {
                rx_burst_max: 5000,
                ..base()
            },
            "rx_burst_max",
        ),
        (
            UdpConfig {
                advertise: Some(Ipv4Addr::BROADCAST),
                ..base()
            },
            "advertise",
        ),
    ];
    for (config, why) in cases {
        let text = io_error_text(UdpTransport::new(&config).unwrap_err());
        assert!(text.contains(why), "{text}");
        assert!(
            text.contains("invalid UDP transport configuration"),
            "{text}"
        );
    }
}

#[test]
fn resolve_refuses_addresses_no_datagram_can_reach() {
    let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let good = t.local_routing_info();
    for (ri, why) in [
        (
            RoutingInfo {
                ipv4: Ipv4Addr::UNSPECIFIED,
                ..good
            },
            "0.0.0.0",
        ),
        (
            RoutingInfo {
                udp_port: 0,
                ..good
            },
            "port 0",
        ),
        (
            RoutingInfo {
                ipv4: Ipv4Addr::new(239, 1, 2, 3),
                ..good
            },
            "unicast",
        ),
    ] {
        let text = t.resolve(&ri).unwrap_err().to_string();
        assert!(text.contains(why), "{text}");
    }
    assert_eq!(t.resolve(&good).unwrap().addr(), t.local_addr());
}

/// A packet header slot carrying probe `seq` of stream 0 with no data.
fn header_slot(seq: u32, data_len: usize) -> Vec<u8> {
    let mut pkt = vec![0u8; PKTHDR_BYTES];
    probe::write_header(
        &mut pkt[HEADROOM_BYTES..],
        probe::ProbeId { stream: 0, seq },
        data_len,
    );
    pkt
}

/// Polls until `n` datagrams arrived; returns their slots' contents
/// (`None` for rejected ones) and gives the slots back.
fn receive(t: &mut UdpTransport, n: usize) -> Vec<Option<Vec<u8>>> {
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let mut out = Vec::new();
    let mut head = 0usize;
    let start = Instant::now();
    while out.len() < n {
        let got = t.rx_burst();
        for k in 0..got {
            out.push(ring.packet((head + k) % ring.entries()).map(<[u8]>::to_vec));
        }
        head += got;
        t.post_recvs(&mut ring, got);
        assert!(start.elapsed() < HANG_GUARD, "{:?}", t.stats());
    }
    out
}

#[test]
fn malformed_datagrams_are_counted_by_reason_and_read_as_none() {
    let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sizes = [
        0,
        1,
        ERPC_HDR_BYTES - 1,
        ERPC_HDR_BYTES,
        MAX_PAYLOAD_BYTES,
        MAX_PAYLOAD_BYTES + 1,
        1024,
        1500,
        9000,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        tx.send_to(&vec![i as u8; n], t.local_addr()).unwrap();
    }
    let got = receive(&mut t, sizes.len());
    for ((&n, p), i) in sizes.iter().zip(&got).zip(0u8..) {
        let ok = (ERPC_HDR_BYTES..=MAX_PAYLOAD_BYTES).contains(&n);
        match p {
            Some(p) => {
                assert!(ok, "{n}-byte datagram accepted");
                assert_eq!(p.len(), n);
                assert!(p.iter().all(|&b| b == i), "{n}-byte datagram corrupted");
            }
            None => assert!(!ok, "{n}-byte datagram rejected"),
        }
    }
    let s = t.stats();
    assert_eq!((s.rx_short, s.rx_oversize), (3, 4), "{s:?}");
    assert_eq!(s.rx_pkts, sizes.len() as u64);
    let bytes: usize = sizes.iter().map(|n| n + HEADROOM_BYTES).sum();
    assert_eq!(
        s.rx_bytes, bytes as u64,
        "real lengths, even of truncated ones"
    );
    assert_eq!((s.rx_errors, s.rx_bad_ip, s.rx_bad_udp), (0, 0, 0));
}

#[test]
fn only_held_slots_are_readable() {
    let mut t = UdpTransport::new(&UdpConfig {
        rx_ring_entries: 4,
        ..UdpConfig::loopback()
    })
    .unwrap();
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..3u8 {
        tx.send_to(&[i; 20], t.local_addr()).unwrap();
    }
    let start = Instant::now();
    let mut n = 0;
    while n < 3 {
        n += t.rx_burst();
        assert!(start.elapsed() < HANG_GUARD);
    }
    assert_eq!(ring.packet(0), Some(&[0u8; 20][..]));
    assert_eq!(ring.packet(2), Some(&[2u8; 20][..]));
    assert_eq!(ring.packet(3), None, "never delivered");
    assert_eq!(ring.packet(4), None, "out of range");
    t.post_recvs(&mut ring, 2);
    assert_eq!(ring.packet(0), None, "given back");
    assert_eq!(ring.packet(1), None, "given back");
    assert_eq!(ring.packet(2), Some(&[2u8; 20][..]), "still held");
}

#[test]
#[should_panic(expected = "slots are held by the application")]
fn giving_back_slots_that_are_not_held_panics() {
    let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut ring = t.take_rx_ring().unwrap();
    t.post_recvs(&mut ring, 1);
}

#[test]
fn echo_straight_from_the_rx_ring() {
    // The server sends the data of each request back without copying it:
    // the TX item's `data` is the packet in the server's RX ring.
    let mut client = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut server = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let to_server = client.resolve(&server.local_routing_info()).unwrap();
    let to_client = server.resolve(&client.local_routing_info()).unwrap();
    let mut ring = server.take_rx_ring().expect("the RX ring");
    let mut hdrs = vec![vec![0u8; PKTHDR_BYTES]; 16];
    let requests: Vec<Vec<u8>> = (0..16u32)
        .map(|s| {
            let mut buf = vec![0u8; PKTHDR_BYTES + 100 + s as usize];
            let id = probe::ProbeId { stream: 1, seq: s };
            probe::write_header(&mut buf[HEADROOM_BYTES..], id, 100 + s as usize);
            probe::fill_data(&mut buf[PKTHDR_BYTES..], id);
            buf
        })
        .collect();
    let items: Vec<_> = requests
        .iter()
        .map(|r| TxItem::unregistered(&to_server, r, &[]))
        .collect();
    assert_eq!(client.tx_burst(&items), 16);

    let mut head = 0;
    let start = Instant::now();
    while head < 16 {
        let n = server.rx_burst();
        let idx: Vec<usize> = (head..head + n).map(|i| i % ring.entries()).collect();
        for (h, &i) in hdrs.iter_mut().zip(&idx) {
            h[HEADROOM_BYTES..].copy_from_slice(&ring.packet(i).unwrap()[..ERPC_HDR_BYTES]);
        }
        let echo: Vec<_> = idx
            .iter()
            .zip(&hdrs)
            .map(|(&i, h)| {
                TxItem::unregistered(&to_client, h, &ring.packet(i).unwrap()[ERPC_HDR_BYTES..])
            })
            .collect();
        // `ring` is borrowed by `echo` while `server` is borrowed mutably.
        assert_eq!(server.tx_burst(&echo), n);
        drop(echo);
        server.post_recvs(&mut ring, n);
        head += n;
        assert!(start.elapsed() < HANG_GUARD);
    }
    let back = receive(&mut client, 16);
    for (s, p) in back.iter().enumerate() {
        let p = p.as_deref().unwrap();
        assert_eq!(p, &requests[s][HEADROOM_BYTES..], "echo {s}");
    }
    assert_eq!(server.stats().tx_pkts, 16);
}

#[test]
fn datagrams_the_kernel_refuses_are_lost_and_counted_not_retried() {
    // Sending to the loopback broadcast address without SO_BROADCAST fails
    // at once with EACCES; nothing leaves the host.
    let mut a = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let good = a.resolve(&b.local_routing_info()).unwrap();
    let bad = a
        .resolve(&RoutingInfo {
            ipv4: Ipv4Addr::new(127, 255, 255, 255),
            ..b.local_routing_info()
        })
        .unwrap();
    let pkts: Vec<Vec<u8>> = (0..5).map(|s| header_slot(s, 0)).collect();
    let routes = [&good, &bad, &bad, &good, &good];
    let items: Vec<_> = pkts
        .iter()
        .zip(routes)
        .map(|(p, r)| TxItem::unregistered(r, p, &[]))
        .collect();
    assert_eq!(a.tx_burst(&items), 5);
    let s = a.stats();
    assert_eq!((s.tx_pkts, s.tx_errors), (3, 2), "{s:?}");
    assert_eq!(s.tx_bytes, 3 * PKTHDR_BYTES as u64);
    let got = receive(&mut b, 3);
    let seqs: Vec<u32> = got
        .iter()
        .map(|p| probe::check(p.as_deref().unwrap()).unwrap().seq)
        .collect();
    assert_eq!(seqs, [0, 3, 4]);
}

#[test]
fn bursts_over_tx_burst_max_are_split_into_batches() {
    let config = UdpConfig {
        tx_burst_max: 4,
        ..UdpConfig::loopback()
    };
    let mut a = UdpTransport::new(&config).unwrap();
    let mut b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let pkts: Vec<Vec<u8>> = (0..10).map(|s| header_slot(s, 0)).collect();
    let mut items: Vec<_> = pkts
        .iter()
        .map(|p| TxItem::unregistered(&route, p, &[]))
        .collect();
    items[5] = items[5].with_drop(true);
    assert_eq!(a.tx_burst(&items), 10);
    let s = a.stats();
    assert_eq!(s.tx_doorbells, 3, "{s:?}");
    assert_eq!((s.tx_pkts, s.tx_dropped_on_purpose), (9, 1));
    assert_eq!(receive(&mut b, 9).len(), 9);
}

#[test]
fn debug_output_names_the_socket() {
    let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let text = format!("{t:?}");
    assert!(text.contains(&t.local_addr().to_string()), "{text}");
    assert!(text.contains("entries: 4096"), "{text}");
}

#[test]
fn routing_info_is_usable_by_a_cpp_peer() {
    let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let ri = t.local_routing_info();
    // Exact-port steering: a one-entry table, queue 0; loopback has no MAC.
    assert_eq!((ri.rxq_id, ri.rss_table_size), (0, 1), "{ri}");
    assert_eq!(ri.mac, [0; 6], "loopback's link-layer address is zero");
    // The formula a C++ DPDK sender runs on it ends at its first port.
    assert_eq!(
        transport::rss::source_port(Ipv4Addr::new(10, 0, 0, 1), &ri),
        Ok(None)
    );
    // An explicit MAC wins over the lookup.
    let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    let t = UdpTransport::new(&UdpConfig {
        mac: Some(mac),
        ..UdpConfig::loopback()
    })
    .unwrap();
    assert_eq!(t.local_routing_info().mac, mac);
    let text = io_error_text(
        UdpTransport::new(&UdpConfig {
            mac: Some([0x01, 0, 0x5e, 0, 0, 1]),
            ..UdpConfig::loopback()
        })
        .unwrap_err(),
    );
    assert!(text.contains("multicast MAC"), "{text}");
}

#[test]
fn advertising_an_address_of_no_local_interface_needs_a_mac() {
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
    let foreign = Ipv4Addr::new(198, 51, 100, 9);
    let text = io_error_text(
        UdpTransport::new(&UdpConfig {
            advertise: Some(foreign),
            ..UdpConfig::new(any)
        })
        .unwrap_err(),
    );
    assert!(text.contains("198.51.100.9"), "{text}");
    assert!(text.contains("UdpConfig::mac"), "{text}");
    let mac = [0x02, 0, 0, 0, 0, 0x42];
    let t = UdpTransport::new(&UdpConfig {
        advertise: Some(foreign),
        mac: Some(mac),
        ..UdpConfig::new(any)
    })
    .unwrap();
    assert_eq!(t.local_routing_info().mac, mac);
    assert_eq!(t.local_routing_info().ipv4, foreign);
}

/// A peer's routing info claiming RSS over `rss_table_size` entries, for
/// the socket at `at`.
fn rss_peer(at: SocketAddrV4, rxq_id: u16, rss_table_size: u16) -> RoutingInfo {
    RoutingInfo {
        mac: [0x02, 0, 0, 0, 0, 0x99],
        ipv4: *at.ip(),
        udp_port: at.port(),
        rxq_id,
        rss_table_size,
    }
}

fn local_v4(s: &UdpSocket) -> SocketAddrV4 {
    match s.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        a => panic!("{a}"),
    }
}

/// Receives `n` datagrams on `s`; returns (source port, first payload byte).
fn recv_sources(s: &UdpSocket, n: usize) -> Vec<(u16, u8)> {
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut buf = [0u8; 2048];
    (0..n)
        .map(|_| {
            let (len, from) = s.recv_from(&mut buf).expect("a datagram");
            assert!(len >= ERPC_HDR_BYTES);
            (from.port(), buf[0])
        })
        .collect()
}

#[test]
fn datagrams_to_an_rss_peer_leave_from_the_port_its_rss_needs() {
    use transport::rss;
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = local_v4(&peer);
    let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let me = t.local_routing_info().ipv4;
    let plain = t.resolve(&rss_peer(at, 0, 1)).unwrap();
    assert_eq!(plain.rss_source_port(), None, "no RSS, no extra socket");
    let queues = [3u16, 3, 7, 0, 15];
    let routes: Vec<_> = queues
        .iter()
        .map(|&q| t.resolve(&rss_peer(at, q, 128)).unwrap())
        .collect();
    for (route, &q) in routes.iter().zip(&queues) {
        let port = route.rss_source_port().expect("an RSS source port");
        let h = rss::hash_v4_udp(me, *at.ip(), port, at.port());
        assert_eq!(rss::queue_of(h, 128), q, "port {port} for queue {q}");
        // Normally the first candidate (what C++ picks), unless another
        // process on this host holds it.
        let first = rss::source_port(me, &rss_peer(at, q, 128)).unwrap();
        assert!(
            Some(port) >= first,
            "port {port} before the first {first:?}"
        );
    }
    // Two routes to the same queue share one socket.
    assert_eq!(routes[0].rss_source_port(), routes[1].rss_source_port());
    assert_eq!(t.rss_source_sockets(), 4);

    // One burst over all routes, the plain one in the middle: every
    // datagram leaves from its route's port, in order.
    let pkts: Vec<Vec<u8>> = (0..7u8)
        .map(|i| {
            let mut p = header_slot(u32::from(i), 0);
            p[HEADROOM_BYTES] = i;
            p
        })
        .collect();
    let order: Vec<&transport::udp::UdpRoute> = vec![
        &routes[0], &routes[1], &plain, &routes[2], &routes[3], &routes[4], &routes[4],
    ];
    let items: Vec<_> = pkts
        .iter()
        .zip(&order)
        .map(|(p, r)| TxItem::unregistered(*r, p, &[]))
        .collect();
    assert_eq!(t.tx_burst(&items), 7);
    let got = recv_sources(&peer, 7);
    let want: Vec<(u16, u8)> = order
        .iter()
        .zip(0u8..)
        .map(|(r, i)| (r.rss_source_port().unwrap_or(t.local_addr().port()), i))
        .collect();
    assert_eq!(got, want);
    let s = t.stats();
    assert_eq!((s.tx_pkts, s.tx_errors), (7, 0), "{s:?}");
    // Runs: [0,1] [plain] [2] [3] [4,4].
    assert_eq!(s.tx_doorbells, 5, "one sendmmsg per run of one socket");

    // Sockets no route uses are closed at the next resolve.
    drop(order);
    drop(items);
    drop(routes);
    let again = t.resolve(&rss_peer(at, 9, 128)).unwrap();
    assert_eq!(t.rss_source_sockets(), 1);
    drop(again);
    let mut ring = t.take_rx_ring().unwrap();
    assert_eq!(t.rx_burst(), 0, "the extra sockets receive nothing");
    t.post_recvs(&mut ring, 0);
}

#[test]
fn a_taken_rss_port_moves_to_the_next_one_that_reaches_the_queue() {
    use transport::rss;
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = local_v4(&peer);
    let info = rss_peer(at, 6, 64);
    let a = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let ra = a.resolve(&info).unwrap();
    let rb = b.resolve(&info).unwrap();
    let (pa, pb) = (ra.rss_source_port().unwrap(), rb.rss_source_port().unwrap());
    assert_ne!(pa, pb, "two transports cannot bind the same port");
    let candidates: Vec<u16> = rss::source_ports(Ipv4Addr::LOCALHOST, &info)
        .take(64)
        .collect();
    assert!(candidates.contains(&pa) && candidates.contains(&pb));
}

#[test]
fn rss_peers_that_no_port_can_reach_are_refused() {
    let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4000);
    for (q, size) in [(16, 128), (4, 4), (200, 512)] {
        let e = t.resolve(&rss_peer(at, q, size)).unwrap_err();
        assert!(matches!(e, TransportError::Resolve { .. }), "{e:?}");
        assert!(e.to_string().contains("cannot be reached"), "{e}");
    }
    // Table size 0 (a C++ raw transport) is not a divisor: no RSS.
    let r = t.resolve(&rss_peer(at, 0, 0)).unwrap();
    assert_eq!(r.rss_source_port(), None);
    assert_eq!(t.rss_source_sockets(), 0);
}

#[test]
fn pcap_capture_writes_the_framing_datagrams_would_have_had() {
    let (pa, pb) = (TempPath::new("udp-a"), TempPath::new("udp-b"));
    let mut a = UdpTransport::new(&UdpConfig {
        pcap: Some(pa.0.clone()),
        ..UdpConfig::loopback()
    })
    .unwrap();
    let mut b = UdpTransport::new(&UdpConfig {
        pcap: Some(pb.0.clone()),
        ..UdpConfig::loopback()
    })
    .unwrap();
    let (ia, ib) = (a.local_routing_info(), b.local_routing_info());
    let to_b = a.resolve(&ib).unwrap();
    // Packet 0 contiguous, packet 1 split (header slot + data).
    let p0 = {
        let mut p = header_slot(0, 30);
        p.extend((0..30u8).map(|i| i ^ 0x5a));
        p
    };
    let p1_hdr = header_slot(1, 500);
    let p1_data: Vec<u8> = (0..500u32).map(|i| i as u8).collect();
    let items = [
        TxItem::unregistered(&to_b, &p0, &[]),
        TxItem::unregistered(&to_b, &p1_hdr, &p1_data),
    ];
    assert_eq!(a.tx_burst(&items), 2);
    // And a datagram from a plain socket that the ring rejects (too short).
    let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
    plain.send_to(&[7; 5], b.local_addr()).unwrap();
    let got = receive(&mut b, 3);
    assert_eq!(got.iter().filter(|p| p.is_some()).count(), 2);
    a.flush_pcap().unwrap();
    b.flush_pcap().unwrap();
    assert_eq!((a.pcap_frames(), b.pcap_frames()), (2, 3));

    let sent = read_pcap(&pa.0);
    assert_eq!(sent.len(), 2);
    let payloads: [Vec<u8>; 2] = [
        p0[HEADROOM_BYTES..].to_vec(),
        [&p1_hdr[HEADROOM_BYTES..], &p1_data[..]].concat(),
    ];
    for ((orig, f), want) in sent.iter().zip(&payloads) {
        assert_eq!(*orig as usize, f.len());
        let p = transport::wire::parse_frame(f).expect("a valid frame");
        assert_eq!(p.payload, &want[..]);
        assert_eq!((p.src_ip, p.src_port), (ia.ipv4, ia.udp_port));
        assert_eq!((p.dst_ip, p.dst_port), (ib.ipv4, ib.udp_port));
        assert_eq!((p.src_mac, p.dst_mac), (ia.mac, ib.mac));
    }
    let received = read_pcap(&pb.0);
    assert_eq!(received.len(), 3);
    // The two from `a`, in order, then the short one from `plain`.
    for ((_, f), want) in received.iter().zip(&payloads) {
        let p = transport::wire::parse_frame(f).expect("a valid frame");
        assert_eq!(p.payload, &want[..]);
        assert_eq!((p.src_ip, p.src_port), (ia.ipv4, ia.udp_port));
        assert_eq!((p.dst_ip, p.dst_port), (ib.ipv4, ib.udp_port));
    }
    let p = transport::wire::parse_frame(&received[2].1).unwrap();
    assert_eq!(p.payload, &[7; 5]);
    assert_eq!(p.src_port, local_v4(&plain).port());

    // Without a capture there is nothing to flush.
    let mut c = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    assert!(c.flush_pcap().is_err());
    assert_eq!(c.pcap_frames(), 0);
}

#[test]
fn a_pcap_file_that_cannot_be_created_is_a_clear_error() {
    let text = io_error_text(
        UdpTransport::new(&UdpConfig {
            pcap: Some("/nonexistent-dir/x.pcap".into()),
            ..UdpConfig::loopback()
        })
        .unwrap_err(),
    );
    assert!(text.contains("/nonexistent-dir/x.pcap"), "{text}");
}

/// A burst's runs of datagrams to one peer with one size each go as one
/// UDP GSO send; the peers still get every datagram on its own, intact and
/// in order, whatever the mix of sizes, peers and one- or two-part
/// payloads around them.
#[test]
fn runs_to_one_peer_with_one_size_go_as_one_send_and_arrive_one_by_one() {
    let mut a = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut c = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let (to_b, to_c) = (
        a.resolve(&b.local_routing_info()).unwrap(),
        a.resolve(&c.local_routing_info()).unwrap(),
    );
    // (peer, data bytes, data in a second part?)
    let plan: [(bool, usize, bool); 16] = [
        (true, 20, false),
        (true, 20, true),
        (true, 20, false),
        (true, 20, true),
        (true, 20, false),
        (true, 60, false),
        (true, 20, false),
        (true, 20, false),
        (true, 20, true),
        (true, 20, false),
        (false, 20, false),
        (false, 20, true),
        (false, 20, false),
        (true, 9, false),
        (false, 9, false),
        (true, 9, false),
    ];
    let pkts: Vec<(Vec<u8>, Vec<u8>)> = plan
        .iter()
        .zip(0u32..)
        .map(|(&(_, len, split), seq)| {
            let id = probe::ProbeId { stream: 0, seq };
            let mut pkt = vec![0u8; PKTHDR_BYTES + len];
            probe::write_header(&mut pkt[HEADROOM_BYTES..], id, len);
            probe::fill_data(&mut pkt[PKTHDR_BYTES..], id);
            let data = if split {
                pkt.split_off(PKTHDR_BYTES)
            } else {
                Vec::new()
            };
            (pkt, data)
        })
        .collect();
    let items: Vec<_> = plan
        .iter()
        .zip(&pkts)
        .map(|(&(b, _, _), (pkt, data))| {
            TxItem::unregistered(if b { &to_b } else { &to_c }, pkt, data)
        })
        .collect();
    assert_eq!(a.tx_burst(&items), 16);
    // Sends: 0..5 (GSO), 5 alone, 6..10 (GSO), 10..13 (GSO), 13..16 (one
    // sendmmsg: no two neighbours alike).
    let s = a.stats();
    assert_eq!((s.tx_pkts, s.tx_doorbells), (16, 5), "{s:?}");
    let seqs = |got: Vec<Option<Vec<u8>>>| -> Vec<u32> {
        got.iter()
            .map(|p| probe::check(p.as_deref().expect("valid")).unwrap().seq)
            .collect()
    };
    assert_eq!(
        seqs(receive(&mut b, 12)),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15]
    );
    assert_eq!(seqs(receive(&mut c, 4)), [10, 11, 12, 14]);
}
