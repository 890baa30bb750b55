//! The mlx5 datapath alone, for callgrind (`driver/benches/callgrind_driver.sh`
//! runs it twice with different frame counts and divides the difference of
//! the driver's instructions). Not a timed benchmark.
//!
//! One thread, deterministic fabric, two device-model NICs. A posts bursts
//! of `burst` 88-byte frames (one doorbell each); the fabric delivers them
//! inside the doorbell write. Mode `tx`: the frames are for a UDP port B has
//! no flow rule for (B's steering drops them), and B never polls: only the
//! send side (post + completion handling) runs. Mode `txrx`: the frames are
//! for B's queue set, which polls exactly once per burst (a bounded loop:
//! every frame is already there) and gives the slots back in chunks of 64,
//! reposting striding WQEs as they free up. Receive cost per frame =
//! `txrx` - `tx`.
//!
//! Usage: callgrind_driver <tx|txrx> <burst 1..=16> <frames>

use std::hint::black_box;
use std::net::Ipv4Addr;

use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, Gather, QueueConfig, QueueSet, TxFrame};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::wire::{self, FrameTemplate};

const FRAME: usize = 88;
const MAX_BURST: usize = 16;

fn region() -> RegionOptions {
    RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    }
}

fn open(nic: &SimNic) -> Device<SimBackend> {
    Device::open(
        nic.backend(),
        DeviceConfig {
            region: region(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn queue(dev: &Device<SimBackend>, port: u16) -> QueueSet<SimBackend> {
    dev.create_queue_set(QueueConfig {
        udp_port: port,
        ..Default::default()
    })
    .unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: callgrind_driver <tx|txrx> <burst 1..=16> <frames>");
        std::process::exit(2)
    };
    let (Some(mode), Some(burst), Some(frames)) = (
        args.get(1).cloned(),
        args.get(2).and_then(|s| s.parse::<usize>().ok()),
        args.get(3).and_then(|s| s.parse::<usize>().ok()),
    ) else {
        usage()
    };
    let rx = match mode.as_str() {
        "tx" => false,
        "txrx" => true,
        _ => usage(),
    };
    if !(1..=MAX_BURST).contains(&burst) || frames % burst != 0 {
        usage();
    }
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: true,
        ..Default::default()
    });
    let nic = |i: u8| {
        SimNic::new(
            &fabric,
            NicConfig {
                mac: [2, 0, 0, 0, 0, i],
                ..Default::default()
            },
        )
    };
    let (na, nb) = (nic(1), nic(2));
    let (da, db) = (open(&na), open(&nb));
    let mut qa = queue(&da, 1000);
    let mut qb = queue(&db, 2000);
    let mut alloc = Allocator::new(
        da.dma_mapper(),
        AllocatorConfig {
            initial_bytes: 2 << 20,
            region: region(),
            ..Default::default()
        },
    )
    .unwrap();
    let t = FrameTemplate {
        dst_mac: nb.mac(),
        src_mac: qa.mac(),
        src_ip: Ipv4Addr::new(10, 0, 0, 1),
        dst_ip: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 1000,
        dst_port: if rx { 2000 } else { 2001 },
    };
    let bufs: Vec<Buffer> = (0..MAX_BURST)
        .map(|_| {
            let mut b = alloc.alloc(FRAME).unwrap();
            wire::build_headroom(&t, b.as_mut_slice(), FRAME);
            b
        })
        .collect();
    let mut tx = [TxFrame {
        first: &[],
        first_iova: 0,
        first_lkey: 0,
        rest: Gather::default(),
    }; MAX_BURST];
    for (f, b) in tx.iter_mut().zip(&bufs) {
        *f = TxFrame {
            first: &b.as_slice()[..FRAME],
            first_iova: b.iova(),
            first_lkey: b.lkey(),
            rest: Gather::default(),
        };
    }
    let (mut got, mut unposted) = (0usize, 0usize);
    for _ in 0..frames / burst {
        let sent = qa.tx_burst(black_box(&tx[..burst])).unwrap();
        assert_eq!(sent, burst, "the SQ keeps up (completions every 64 WQEs)");
        if rx {
            let n = qb.rx_burst();
            got += n;
            unposted += n;
            if unposted >= 64 {
                qb.post_recvs(unposted);
                unposted = 0;
            }
        }
    }
    if rx {
        assert_eq!(got, frames, "every frame counted");
    } else {
        assert_eq!(nb.stats().rx_delivered, 0);
    }
    for b in bufs {
        alloc.free(b);
    }
}
