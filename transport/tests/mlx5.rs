//! The mlx5 transport on the device model: the shared conformance suite,
//! plus what only this transport does (frames that are not for us, frames
//! across two NICs of a lossy fabric, frames as the C++ raw transport sends
//! them, RSS source ports in the frame header, pcap capture).

// The shared transport conformance suite (a module of the tests only).
#[macro_use]
mod conformance;

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::pcap::{TempPath, read_pcap};
use conformance::{Fixture, TxMemory};
use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::wire::{self, FrameTemplate};
use transport::{HEADROOM_BYTES, PKTHDR_BYTES, RxRing, Transport};

fn region() -> RegionOptions {
    RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    }
}

/// DMA-registered TX memory from the device under test.
struct DmaBuf(Buffer);

impl TxMemory for DmaBuf {
    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
    fn iova(&self) -> u64 {
        self.0.iova()
    }
    fn lkey(&self) -> u32 {
        self.0.lkey()
    }
}

/// Two transports (two queue sets, two UDP ports) on one device-model NIC;
/// frames between them loop back inside the NIC and go through its flow
/// table and striding RQs like any other.
struct SimFixture {
    fabric: Option<Fabric>,
    nic: Option<SimNic>,
    device: Option<Device<SimBackend>>,
    alloc: Option<Allocator>,
    seed: u64,
}

impl SimFixture {
    fn new() -> SimFixture {
        SimFixture {
            fabric: None,
            nic: None,
            device: None,
            alloc: None,
            seed: 1,
        }
    }
}

fn transport(dev: &Device<SimBackend>, ip: u8, port: u16) -> Mlx5Transport<SimBackend> {
    Mlx5Transport::new(
        dev,
        Mlx5Config::new(
            Ipv4Addr::new(10, 9, 0, ip),
            QueueConfig {
                udp_port: port,
                ..Default::default()
            },
        ),
    )
    .expect("mlx5 transport")
}

impl Fixture for SimFixture {
    type T = Mlx5Transport<SimBackend>;
    type Mem = DmaBuf;

    fn pair(&mut self) -> (Self::T, Self::T) {
        // Buffers of the previous case must be gone before its device.
        self.alloc = None;
        self.device = None;
        self.seed += 1;
        let fabric = Fabric::new(FabricConfig {
            seed: self.seed,
            deterministic: true,
            ..Default::default()
        });
        let nic = SimNic::new(
            &fabric,
            NicConfig {
                mac: [2, 0, 0, 0, 0, 1],
                ..Default::default()
            },
        );
        let dev = Device::open(
            nic.backend(),
            DeviceConfig {
                region: region(),
                ..Default::default()
            },
        )
        .expect("device");
        let (a, b) = (transport(&dev, 1, 7001), transport(&dev, 2, 7002));
        self.alloc = Some(
            Allocator::new(
                dev.dma_mapper(),
                AllocatorConfig {
                    initial_bytes: 2 << 20,
                    region: region(),
                    ..Default::default()
                },
            )
            .expect("allocator"),
        );
        self.device = Some(dev);
        self.nic = Some(nic);
        self.fabric = Some(fabric);
        (a, b)
    }

    fn tx_memory(&mut self, len: usize) -> DmaBuf {
        DmaBuf(
            self.alloc
                .as_mut()
                .expect("pair() first")
                .alloc(len)
                .expect("TX buffer"),
        )
    }

    fn pump(&mut self) {
        self.fabric
            .as_ref()
            .expect("pair() first")
            .advance(Duration::from_micros(2));
    }

    fn inject(&mut self, to: &Self::T, payload: &[u8]) -> bool {
        let ri = to.local_routing_info();
        let len = HEADROOM_BYTES + payload.len();
        // What can reach the receive queue: at most the frame length the
        // driver's vport MTU admits, and at least 60 (the sender pads; the
        // NIC drops runts and oversize frames).
        if len > mlx5::MAX_RX_FRAME {
            return false;
        }
        let mut frame = vec![0u8; len.max(60)];
        let t = FrameTemplate {
            dst_mac: ri.mac,
            src_mac: [2, 0, 0, 0, 0, 0x77],
            src_ip: Ipv4Addr::new(10, 9, 0, 99),
            dst_ip: ri.ipv4,
            src_port: 9,
            dst_port: ri.udp_port,
        };
        wire::build_headroom(&t, &mut frame, len);
        frame[HEADROOM_BYTES..len].copy_from_slice(payload);
        let (fabric, nic) = (self.fabric.as_ref().unwrap(), self.nic.as_ref().unwrap());
        fabric.inject(nic.port(), &frame);
        true
    }
}

mod cases {
    crate::conformance_tests!(crate::SimFixture::new());
}

/// Frames that pass the NIC's steering but are malformed or not ours are
/// dropped in the ring reader and counted by reason; the slot still counts.
#[test]
fn malformed_frames_in_the_ring_are_counted_by_reason() {
    let mut fx = SimFixture::new();
    let (a, mut b) = fx.pair();
    let ri = b.local_routing_info();
    let fabric = fx.fabric.clone().unwrap();
    let port = fx.nic.as_ref().unwrap().port();
    let good = |ip_fix: &dyn Fn(&mut Vec<u8>)| {
        let mut f = vec![0u8; 100];
        let t = FrameTemplate {
            dst_mac: ri.mac,
            src_mac: [2, 0, 0, 0, 0, 0x66],
            src_ip: Ipv4Addr::new(10, 9, 0, 50),
            dst_ip: ri.ipv4,
            src_port: 1,
            dst_port: ri.udp_port,
        };
        wire::build_headroom(&t, &mut f, 100);
        ip_fix(&mut f);
        f
    };
    // Steering matches dmac, ethertype, IP protocol and UDP port, so these
    // reach the RQ; the parser must catch them.
    let bad_checksum = good(&|f| f[24] ^= 0xff);
    let bad_udp_len = good(&|f| f[39] ^= 0x10);
    let ip_too_long = good(&|f| {
        f[16..18].copy_from_slice(&2000u16.to_be_bytes());
        let c = wire::ipv4_checksum(&{
            let mut h = f[14..34].to_vec();
            h[10] = 0;
            h[11] = 0;
            h
        });
        f[24..26].copy_from_slice(&c.to_be_bytes());
    });
    // IPv4 options, with a right checksum: the NIC vouches for the
    // checksum (l3_ok), the transport still refuses the header.
    let with_options = {
        let mut f = good(&|_| {});
        f.insert(34, 0);
        f.insert(34, 0);
        f.insert(34, 0);
        f.insert(34, 1); // one option word: NOP, then end of options
        f[14] = 0x46;
        let ip_len = u16::from_be_bytes([f[16], f[17]]) + 4;
        f[16..18].copy_from_slice(&ip_len.to_be_bytes());
        f[24..26].fill(0);
        let c = wire::ipv4_checksum(&f[14..38]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f
    };
    for f in [&bad_checksum, &bad_udp_len, &ip_too_long, &with_options] {
        fabric.inject(port, f);
    }
    fabric.advance(Duration::from_micros(5));
    let n = b.rx_burst();
    assert_eq!(n, 4, "each frame took one slot");
    let mut ring = b.take_rx_ring().expect("the RX ring");
    for i in 0..n {
        assert!(ring.packet(i).is_none(), "slot {i} must not parse");
    }
    b.post_recvs(&mut ring, n);
    let s = b.stats();
    assert_eq!(s.rx_bad_ip, 2, "bad checksum, IPv4 options: {s:?}");
    assert_eq!(s.rx_bad_udp, 1, "bad UDP length: {s:?}");
    assert_eq!(s.rx_oversize, 1, "IP length beyond the MTU: {s:?}");
    assert_eq!(s.rx_ip_csum_hw, 0, "nothing accepted: {s:?}");
    drop(a);
}

/// Across two NICs and a lossy link: every packet the transport reports is
/// a valid one, in order, and the count matches the NIC's deliveries.
#[test]
fn two_nics_over_a_lossy_link() {
    let fabric = Fabric::new(FabricConfig {
        seed: 42,
        deterministic: true,
        ..Default::default()
    });
    let na = SimNic::new(
        &fabric,
        NicConfig {
            mac: [2, 0, 0, 0, 0, 1],
            ..Default::default()
        },
    );
    let nb = SimNic::new(
        &fabric,
        NicConfig {
            mac: [2, 0, 0, 0, 0, 2],
            ..Default::default()
        },
    );
    fabric.set_link_faults(
        na.port(),
        mlx5_sim::LinkFaults {
            loss: 0.05,
            duplicate: 0.02,
            ..Default::default()
        },
    );
    let cfg = DeviceConfig {
        region: region(),
        ..Default::default()
    };
    let (da, db) = (
        Device::open(na.backend(), cfg.clone()).unwrap(),
        Device::open(nb.backend(), cfg).unwrap(),
    );
    let mut ta = transport(&da, 1, 7001);
    let mut tb = transport(&db, 2, 7002);
    let route = ta.resolve(&tb.local_routing_info()).unwrap();
    let mut alloc = Allocator::new(
        da.dma_mapper(),
        AllocatorConfig {
            initial_bytes: 2 << 20,
            region: region(),
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = alloc.alloc(1024).unwrap();
    let mut ring = tb.take_rx_ring().expect("the RX ring");
    let mut got = Vec::new();
    for seq in 0u32..3000 {
        let len = 56 + (seq as usize % 900);
        let b = buf.as_mut_slice();
        ta.fill_headroom(&route, &mut b[..HEADROOM_BYTES], len);
        b[42..46].copy_from_slice(&seq.to_le_bytes());
        let item =
            transport::TxItem::contiguous(&route, &buf.as_slice()[..len], buf.iova(), buf.lkey());
        assert_eq!(ta.tx_burst(&[item]), 1);
        ta.tx_flush();
        fabric.advance(Duration::from_micros(1));
        let n = tb.rx_burst();
        for i in 0..n {
            let p = ring
                .packet(got.len() % ring.entries())
                .expect("valid frame");
            got.push(u32::from_le_bytes(p[0..4].try_into().unwrap()));
            let _ = i;
        }
        tb.post_recvs(&mut ring, n);
    }
    assert_eq!(got.len() as u64, nb.stats().rx_delivered);
    assert!(
        got.windows(2).all(|w| w[0] <= w[1]),
        "in order (duplicates adjacent)"
    );
    assert!(got.len() > 2700, "{}", got.len());
    alloc.free(buf);
}

/// A frame to `to` with `payload` and a valid IPv4 checksum, padded with
/// zeros to `min_len` (the Ethernet minimum is 60 bytes without FCS).
fn frame_to(to: &transport::RoutingInfo, payload: &[u8], min_len: usize) -> Vec<u8> {
    let len = HEADROOM_BYTES + payload.len();
    let mut f = vec![0u8; len.max(min_len)];
    let t = FrameTemplate {
        dst_mac: to.mac,
        src_mac: [2, 0, 0, 0, 0, 0x55],
        src_ip: Ipv4Addr::new(10, 9, 0, 77),
        dst_ip: to.ipv4,
        src_port: 31_850,
        dst_port: to.udp_port,
    };
    wire::build_headroom(&t, &mut f, len);
    f[HEADROOM_BYTES..len].copy_from_slice(payload);
    f
}

/// The captured C++ request-for-response: a 14-byte header with message
/// size 0 and 8 zero bytes after it.
const CPP_RFR: [u8; 22] = [
    0x02, 0, 0, 0, 0, 0, 0x09, 0, 0x08, 0, 0, 0, 0, 0xb0, 0, 0, 0, 0, 0, 0, 0, 0,
];

#[test]
fn routing_info_is_usable_by_a_cpp_peer() {
    let mut fx = SimFixture::new();
    let (a, _b) = fx.pair();
    let ri = a.local_routing_info();
    assert_eq!(ri.mac, [2, 0, 0, 0, 0, 1], "the port's MAC");
    assert_eq!(
        (ri.rxq_id, ri.rss_table_size),
        (0, 1),
        "exact-port steering"
    );
    assert_eq!((ri.ipv4, ri.udp_port), (Ipv4Addr::new(10, 9, 0, 1), 7001));
}

#[test]
fn frames_to_an_rss_peer_carry_the_source_port_its_rss_needs() {
    use transport::rss;
    let mut fx = SimFixture::new();
    let (a, b) = fx.pair();
    let me = a.local_routing_info();
    let peer = transport::RoutingInfo {
        rxq_id: 9,
        rss_table_size: 256,
        ..b.local_routing_info()
    };
    let route = a.resolve(&peer).unwrap();
    let want = rss::source_port(me.ipv4, &peer).unwrap().unwrap();
    assert_eq!(route.src_port(), want);
    let h = rss::hash_v4_udp(me.ipv4, peer.ipv4, want, peer.udp_port);
    assert_eq!(rss::queue_of(h, 256), 9);
    let mut hdr = [0u8; HEADROOM_BYTES];
    a.fill_headroom(&route, &mut hdr, 100);
    assert_eq!(u16::from_be_bytes([hdr[34], hdr[35]]), want);
    // Without RSS (table size 1, or 0 from a C++ raw transport) frames
    // leave from our own port.
    for size in [0, 1] {
        let r = a
            .resolve(&transport::RoutingInfo {
                rss_table_size: size,
                rxq_id: 0,
                ..peer
            })
            .unwrap();
        assert_eq!(r.src_port(), me.udp_port);
    }
    assert!(
        a.resolve(&transport::RoutingInfo { rxq_id: 16, ..peer })
            .is_err()
    );
}

/// Frames as the C++ raw transport sends them (IPv4 checksum 0), a
/// control packet padded to the 60-byte minimum, and the counter and the
/// switch for zero checksums.
#[test]
fn zero_checksum_and_padded_frames_from_cpp() {
    let mut fx = SimFixture::new();
    let (_a, mut b) = fx.pair();
    let dev = fx.device.as_ref().unwrap();
    let mut strict = Mlx5Transport::new(
        dev,
        Mlx5Config {
            accept_zero_ip_checksum: false,
            ..Mlx5Config::new(
                Ipv4Addr::new(10, 9, 0, 3),
                QueueConfig {
                    udp_port: 7003,
                    ..Default::default()
                },
            )
        },
    )
    .unwrap();
    let fabric = fx.fabric.clone().unwrap();
    let port = fx.nic.as_ref().unwrap().port();
    for t in [&b, &strict] {
        let ri = t.local_routing_info();
        let mut zero = frame_to(&ri, &CPP_RFR, 0);
        zero[24..26].fill(0);
        let mut wrong = frame_to(&ri, &[0xab; 40], 0);
        wrong[24] ^= 0x01;
        // A bare 14-byte header: a 56-byte frame, padded to 60.
        let padded = frame_to(&ri, &CPP_RFR[..14], 60);
        assert_eq!(padded.len(), 60);
        let mut padded_zero = padded.clone();
        padded_zero[24..26].fill(0);
        for f in [&zero, &wrong, &padded, &padded_zero] {
            fabric.inject(port, f);
        }
    }
    fabric.advance(Duration::from_micros(5));

    let n = b.rx_burst();
    assert_eq!(n, 4);
    let mut ring = b.take_rx_ring().unwrap();
    assert_eq!(ring.packet(0), Some(&CPP_RFR[..]), "zero checksum accepted");
    assert_eq!(ring.packet(1), None, "a wrong checksum is a drop");
    assert_eq!(
        ring.packet(2),
        Some(&CPP_RFR[..14]),
        "length from the headers"
    );
    assert_eq!(ring.packet(3), Some(&CPP_RFR[..14]));
    b.post_recvs(&mut ring, n);
    let s = b.stats();
    assert_eq!(
        (s.rx_ip_csum_zero, s.rx_bad_ip, s.rx_pkts),
        (2, 1, 4),
        "{s:?}"
    );
    // The NIC reports l3_ok = 0 for a zero checksum field: only the one
    // frame with a computed checksum skipped the software check.
    assert_eq!(s.rx_ip_csum_hw, 1, "{s:?}");
    assert_eq!(
        s.rx_bytes,
        (3 * HEADROOM_BYTES + CPP_RFR.len() + 2 * 14) as u64,
        "padding is not counted"
    );

    let n = strict.rx_burst();
    assert_eq!(n, 4);
    let mut ring = strict.take_rx_ring().unwrap();
    assert_eq!(ring.packet(0), None, "switched off: zero checksum dropped");
    assert_eq!(ring.packet(1), None);
    assert_eq!(ring.packet(2), Some(&CPP_RFR[..14]));
    assert_eq!(ring.packet(3), None);
    strict.post_recvs(&mut ring, n);
    let s = strict.stats();
    assert_eq!((s.rx_ip_csum_zero, s.rx_bad_ip), (0, 3), "{s:?}");
    assert_eq!(s.rx_ip_csum_hw, 1, "{s:?}");
}

/// Frames the NIC vouched for (CQE `l3_ok`) skip the software IPv4
/// checksum; frames whose CQE the overrunning CQ had reused are checked in
/// software; a corrupted header is dropped and counted either way.
#[test]
fn nic_checked_ipv4_headers_skip_only_the_software_checksum() {
    let mut fx = SimFixture::new();
    let (a, mut b) = fx.pair();
    let ri = b.local_routing_info();
    let fabric = fx.fabric.clone().unwrap();
    let port = fx.nic.as_ref().unwrap().port();
    let good = frame_to(&ri, &[0x5a; 40], 0);
    let mut corrupt = good.clone();
    corrupt[14 + 12] ^= 0x01; // source address: the checksum no longer verifies
    let mut ring = b.take_rx_ring().unwrap();
    // One frame per poll: every CQE is read, every good header vouched.
    for f in [&good, &corrupt, &good] {
        fabric.inject(port, f);
        fabric.advance(Duration::from_micros(5));
        assert_eq!(b.rx_burst(), 1);
    }
    assert_eq!(ring.packet(0), Some(&[0x5a; 40][..]));
    assert_eq!(ring.packet(1), None, "corrupted header dropped");
    assert_eq!(ring.packet(2), Some(&[0x5a; 40][..]));
    b.post_recvs(&mut ring, 3);
    let s = b.stats();
    assert_eq!(
        (s.rx_ip_csum_hw, s.rx_bad_ip, s.rx_pkts),
        (2, 1, 3),
        "{s:?}"
    );

    // 30 frames between two polls (the 8-entry CQ laps): all parse or are
    // dropped by their bytes, whether or not the NIC's verdict was known.
    for i in 0..30 {
        fabric.inject(port, if i % 5 == 0 { &corrupt } else { &good });
    }
    fabric.advance(Duration::from_micros(5));
    assert_eq!(b.rx_burst(), 30);
    for i in 0..30 {
        let p = ring.packet(3 + i);
        assert_eq!(p.is_some(), i % 5 != 0, "frame {i}");
    }
    b.post_recvs(&mut ring, 30);
    let t = b.stats();
    assert_eq!(t.rx_bad_ip - s.rx_bad_ip, 6, "{t:?}");
    let hw = t.rx_ip_csum_hw - s.rx_ip_csum_hw;
    assert!(hw > 0 && hw < 24, "some, not all, vouched by the NIC: {hw}");
    drop(a);
}

#[test]
fn pcap_capture_writes_frames_as_sent_and_received() {
    let mut fx = SimFixture::new();
    let _ = fx.pair();
    let (pa, pb) = (TempPath::new("mlx5-a"), TempPath::new("mlx5-b"));
    let dev = fx.device.as_ref().unwrap();
    let cfg = |ip: u8, port: u16, path: &TempPath| Mlx5Config {
        pcap: Some(path.0.clone()),
        ..Mlx5Config::new(
            Ipv4Addr::new(10, 9, 0, ip),
            QueueConfig {
                udp_port: port,
                ..Default::default()
            },
        )
    };
    let mut a = Mlx5Transport::new(dev, cfg(11, 7011, &pa)).unwrap();
    let mut b = Mlx5Transport::new(dev, cfg(12, 7012, &pb)).unwrap();
    let route = a.resolve(&b.local_routing_info()).unwrap();
    let mut bufs: Vec<DmaBuf> = (0..3).map(|_| fx.tx_memory(1024)).collect();
    let lens = [HEADROOM_BYTES + 14, HEADROOM_BYTES + 500, 1024];
    for (i, (buf, &len)) in bufs.iter_mut().zip(&lens).enumerate() {
        let s = buf.bytes_mut();
        a.fill_headroom(&route, &mut s[..HEADROOM_BYTES], len);
        for (k, x) in s[HEADROOM_BYTES..len].iter_mut().enumerate() {
            *x = (i * 31 + k) as u8;
        }
    }
    // Frame 1 goes as two gather entries (header slot, then data).
    let items: Vec<_> = bufs
        .iter()
        .zip(&lens)
        .enumerate()
        .map(|(i, (m, &len))| {
            let split = if i == 1 { PKTHDR_BYTES } else { len };
            transport::TxItem::new(
                &route,
                &m.bytes()[..split],
                m.iova(),
                &m.bytes()[split..len],
                m.iova() + split as u64,
                m.lkey(),
                false,
            )
        })
        .collect();
    assert_eq!(a.tx_burst(&items), 3);
    a.tx_flush();
    // And one malformed frame (wrong checksum) straight onto the fabric.
    let mut bad = frame_to(&b.local_routing_info(), &[0xee; 100], 0);
    bad[25] ^= 0x40;
    let fabric = fx.fabric.clone().unwrap();
    fabric.inject(fx.nic.as_ref().unwrap().port(), &bad);
    fabric.advance(Duration::from_micros(10));
    let n = b.rx_burst();
    assert_eq!(n, 4);
    let mut ring = b.take_rx_ring().unwrap();
    b.post_recvs(&mut ring, n);
    a.flush_pcap().unwrap();
    b.flush_pcap().unwrap();
    assert_eq!((a.pcap_frames(), b.pcap_frames()), (3, 4));

    let sent = read_pcap(&pa.0);
    let received = read_pcap(&pb.0);
    assert_eq!(sent.len(), 3);
    for (i, (orig, f)) in sent.iter().enumerate() {
        assert_eq!(*orig as usize, lens[i]);
        assert_eq!(&f[..], &bufs[i].bytes()[..lens[i]], "frame {i} as sent");
        // What arrived is what left.
        assert_eq!(received[i].1, *f, "frame {i} as received");
    }
    // The rejected frame is captured too, cut to its IPv4 length.
    assert_eq!(received[3].1, bad);
    drop(items);
}
