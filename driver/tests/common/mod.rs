//! Shared setup for the driver's device-model tests.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, Gather, QueueConfig, QueueSet, TxFrame};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::wire::{self, FrameTemplate};

/// Device memory policy for tests: hugepages when reserved (always in CI),
/// otherwise explicitly allowed 4 KiB pages.
pub fn region() -> RegionOptions {
    RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    }
}

pub fn device_config() -> DeviceConfig {
    DeviceConfig {
        region: region(),
        ..Default::default()
    }
}

pub fn mac(i: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, i]
}

pub fn fabric(seed: u64) -> Fabric {
    Fabric::new(FabricConfig {
        seed,
        deterministic: true,
        ..Default::default()
    })
}

pub fn nic(fabric: &Fabric, i: u8) -> SimNic {
    SimNic::new(
        fabric,
        NicConfig {
            mac: mac(i),
            ..Default::default()
        },
    )
}

pub fn open(nic: &SimNic) -> Device<SimBackend> {
    Device::open(nic.backend(), device_config()).expect("bring-up on the device model")
}

pub fn allocator(dev: &Device<SimBackend>) -> Allocator {
    let cfg = AllocatorConfig {
        initial_bytes: 4 << 20,
        region: region(),
        ..Default::default()
    };
    Allocator::new(dev.dma_mapper(), cfg).expect("allocator")
}

pub fn queue(port: u16) -> QueueConfig {
    QueueConfig {
        udp_port: port,
        ..Default::default()
    }
}

/// A frame from `src` to `dst` with a 4-byte little-endian sequence number
/// at the start of the UDP payload, `len` bytes in all.
pub fn write_frame(
    buf: &mut Buffer,
    src: &QueueSet<SimBackend>,
    dst_mac: [u8; 6],
    dst_port: u16,
    seq: u32,
    len: usize,
) {
    let t = FrameTemplate {
        dst_mac,
        src_mac: src.mac(),
        src_ip: Ipv4Addr::new(10, 0, 0, 1),
        dst_ip: Ipv4Addr::new(10, 0, 0, 2),
        src_port: src.config().udp_port,
        dst_port,
    };
    let b = buf.as_mut_slice();
    wire::build_headroom(&t, b, len);
    b[42..46].copy_from_slice(&seq.to_le_bytes());
    for (i, x) in b[46..len].iter_mut().enumerate() {
        *x = (seq as usize + i) as u8;
    }
}

pub fn frame<'a>(buf: &'a Buffer, len: usize) -> TxFrame<'a> {
    TxFrame {
        first: &buf.as_slice()[..len],
        first_iova: buf.iova(),
        first_lkey: buf.lkey(),
        rest: Gather::default(),
    }
}

/// Reads the sequence number of the packet in ring slot `idx` and checks
/// its payload pattern.
pub fn read_seq(qs: &QueueSet<SimBackend>, idx: usize, len: usize) -> u32 {
    let ring = qs.rx_ring();
    // SAFETY: the slot was reported by rx_burst and is given back only
    // after this read.
    let slot = unsafe { ring.slot(idx) };
    let f = wire::parse_frame(slot).expect("valid frame in the ring");
    assert_eq!(f.payload.len(), len - 42);
    let seq = u32::from_le_bytes(f.payload[..4].try_into().unwrap());
    for (i, x) in f.payload[4..].iter().enumerate() {
        assert_eq!(
            *x,
            (seq as usize + i) as u8,
            "payload of seq {seq} corrupted at byte {i}"
        );
    }
    seq
}

pub fn step(fabric: &Fabric) {
    fabric.advance(Duration::from_micros(1));
}

pub fn _keep(_: Arc<()>) {}
