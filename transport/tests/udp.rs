//! The UDP transport over loopback: the shared conformance suite (with the
//! default 4096-entry ring and with a tiny one), then what is specific to
//! kernel UDP: bind errors, configuration, resolution, malformed datagrams,
//! ring ownership, zero-copy echo from the RX ring, and datagrams the
//! kernel refuses.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use transport::conformance::{Fixture, HeapMemory, probe};
use transport::udp::{MAX_PAYLOAD_BYTES, UdpConfig, UdpTransport};
use transport::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, PKTHDR_BYTES, RoutingInfo, RxRing, Transport, TransportError,
    TxItem,
};

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
    transport::conformance_tests!(super::Loopback::default_ring());
}

mod conformance_tiny_ring {
    transport::conformance_tests!(super::Loopback::tiny_ring());
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
    assert_eq!(peer.tx_burst(&[item(&route, &pkt, &[])]), 1);
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

fn item<'a, R>(route: &'a R, pkt: &'a [u8], data: &'a [u8]) -> TxItem<'a, R> {
    TxItem {
        route,
        pkt,
        pkt_iova: 0,
        data,
        data_iova: 0,
        lkey: 0,
        drop: false,
    }
}

/// Polls until `n` datagrams arrived; returns their slots' contents
/// (`None` for rejected ones) and gives the slots back.
fn receive(t: &mut UdpTransport, n: usize) -> Vec<Option<Vec<u8>>> {
    let ring = t.rx_ring();
    let mut out = Vec::new();
    let mut head = 0usize;
    let start = Instant::now();
    while out.len() < n {
        let got = t.rx_burst();
        for k in 0..got {
            out.push(ring.packet((head + k) % ring.entries()).map(<[u8]>::to_vec));
        }
        head += got;
        t.post_recvs(got);
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", t.stats());
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
    let ring = t.rx_ring();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..3u8 {
        tx.send_to(&[i; 20], t.local_addr()).unwrap();
    }
    let start = Instant::now();
    let mut n = 0;
    while n < 3 {
        n += t.rx_burst();
        assert!(start.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(ring.packet(0), Some(&[0u8; 20][..]));
    assert_eq!(ring.packet(2), Some(&[2u8; 20][..]));
    assert_eq!(ring.packet(3), None, "never delivered");
    assert_eq!(ring.packet(4), None, "out of range");
    t.post_recvs(2);
    assert_eq!(ring.packet(0), None, "given back");
    assert_eq!(ring.packet(1), None, "given back");
    assert_eq!(ring.packet(2), Some(&[2u8; 20][..]), "still held");
}

#[test]
#[should_panic(expected = "slots are held by the application")]
fn giving_back_slots_that_are_not_held_panics() {
    let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    t.post_recvs(1);
}

#[test]
fn echo_straight_from_the_rx_ring() {
    // The server sends the data of each request back without copying it:
    // the TX item's `data` is the packet in the server's RX ring.
    let mut client = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut server = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let to_server = client.resolve(&server.local_routing_info()).unwrap();
    let to_client = server.resolve(&client.local_routing_info()).unwrap();
    let ring = server.rx_ring();
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
    let items: Vec<_> = requests.iter().map(|r| item(&to_server, r, &[])).collect();
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
            .map(|(&i, h)| item(&to_client, h, &ring.packet(i).unwrap()[ERPC_HDR_BYTES..]))
            .collect();
        // `ring` is borrowed by `echo` while `server` is borrowed mutably.
        assert_eq!(server.tx_burst(&echo), n);
        drop(echo);
        server.post_recvs(n);
        head += n;
        assert!(start.elapsed() < Duration::from_secs(5));
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
        .map(|(p, r)| item(r, p, &[]))
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
    let mut items: Vec<_> = pkts.iter().map(|p| item(&route, p, &[])).collect();
    items[5].drop = true;
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
