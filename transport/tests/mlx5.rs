//! The mlx5 transport on the device model: the shared conformance suite,
//! plus what only this transport does (frames that are not for us, frames
//! across two NICs of a lossy fabric).

use std::net::Ipv4Addr;
use std::time::Duration;

use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::conformance::{Fixture, TxMemory};
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::wire::{self, FrameTemplate};
use transport::{HEADROOM_BYTES, RxRing, Transport};

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
        Mlx5Config {
            ipv4: Ipv4Addr::new(10, 9, 0, ip),
            queue: QueueConfig {
                udp_port: port,
                ..Default::default()
            },
        },
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
        // What an Ethernet link can carry to the NIC: at most the port's
        // MTU + 18 bytes, and at least 60 (the sender pads; the NIC drops
        // runts and oversize frames).
        if len > 1500 + 18 {
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

mod conformance {
    transport::conformance_tests!(crate::SimFixture::new());
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
    for f in [&bad_checksum, &bad_udp_len, &ip_too_long] {
        fabric.inject(port, f);
    }
    fabric.advance(Duration::from_micros(5));
    let n = b.rx_burst();
    assert_eq!(n, 3, "each frame took one slot");
    let ring = b.rx_ring();
    for i in 0..n {
        assert!(ring.packet(i).is_none(), "slot {i} must not parse");
    }
    b.post_recvs(n);
    let s = b.stats();
    assert_eq!(s.rx_bad_ip, 1, "bad checksum: {s:?}");
    assert_eq!(s.rx_bad_udp, 1, "bad UDP length: {s:?}");
    assert_eq!(s.rx_oversize, 1, "IP length beyond the MTU: {s:?}");
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
    let ring = tb.rx_ring();
    let mut got = Vec::new();
    for seq in 0u32..3000 {
        let len = 56 + (seq as usize % 900);
        let b = buf.as_mut_slice();
        ta.fill_headroom(&route, &mut b[..HEADROOM_BYTES], len);
        b[42..46].copy_from_slice(&seq.to_le_bytes());
        let item = transport::TxItem {
            route: &route,
            pkt: &buf.as_slice()[..len],
            pkt_iova: buf.iova(),
            data: &[],
            data_iova: 0,
            lkey: buf.lkey(),
            drop: false,
        };
        assert_eq!(ta.tx_burst(&[item]), 1);
        ta.tx_flush();
        fabric.advance(Duration::from_micros(1));
        let n = tb.rx_burst();
        for i in 0..n {
            let p = ring.packet(got.len()).expect("valid frame");
            got.push(u32::from_le_bytes(p[0..4].try_into().unwrap()));
            let _ = i;
        }
        tb.post_recvs(n);
    }
    assert_eq!(got.len() as u64, nb.stats().rx_delivered);
    assert!(
        got.windows(2).all(|w| w[0] <= w[1]),
        "in order (duplicates adjacent)"
    );
    assert!(got.len() > 2700, "{}", got.len());
    alloc.free(buf);
}
