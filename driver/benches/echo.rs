//! Raw frame echo over the device model, driver only (no eRPC): the
//! reference eRPC's small-RPC rate is measured against.
//!
//! Run: `cargo bench -p mlx5 --bench echo` (add `-- --frames N`).
//!
//! * 1 core: one thread drives both NICs on the deterministic fabric; A
//!   keeps `window` frames in flight to B, B echoes each one back.
//! * 2 threads: the threaded fabric; A and B each run on their own thread.
//!
//! Frames are 88 bytes (Ethernet/IPv4/UDP + a 14-byte eRPC header + 32
//! bytes of data: a small RPC). Bursts of up to 16 share one doorbell;
//! received slots are given back in chunks of 64.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::hw::HwBackend;
use mlx5::{Device, DeviceConfig, Gather, QueueConfig, QueueSet, TxFrame};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimNic};
use transport::wire::{self, FrameTemplate};

const FRAME: usize = 88;
const BURST: usize = 16;

fn region() -> RegionOptions {
    RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    }
}

fn template(src: [u8; 6], dst: [u8; 6], sport: u16, dport: u16) -> FrameTemplate {
    FrameTemplate {
        dst_mac: dst,
        src_mac: src,
        src_ip: Ipv4Addr::new(10, 0, 0, sport as u8),
        dst_ip: Ipv4Addr::new(10, 0, 0, dport as u8),
        src_port: sport,
        dst_port: dport,
    }
}

/// One side: a queue set and BURST prebuilt TX frames to its peer.
struct Side<B: HwBackend> {
    qs: QueueSet<B>,
    alloc: Allocator,
    bufs: Vec<Buffer>,
    head: usize,
    unposted: usize,
}

impl<B: HwBackend> Side<B> {
    fn new(dev: &Device<B>, port: u16, peer_mac: [u8; 6], peer_port: u16) -> Side<B> {
        let qs = dev
            .create_queue_set(QueueConfig {
                udp_port: port,
                ..Default::default()
            })
            .unwrap();
        let mut alloc = Allocator::new(
            dev.dma_mapper(),
            AllocatorConfig {
                initial_bytes: 2 << 20,
                region: region(),
                ..Default::default()
            },
        )
        .unwrap();
        let t = template(qs.mac(), peer_mac, port, peer_port);
        let bufs = (0..BURST)
            .map(|_| {
                let mut b = alloc.alloc(FRAME).unwrap();
                wire::build_headroom(&t, b.as_mut_slice(), FRAME);
                b
            })
            .collect();
        Side {
            qs,
            alloc,
            bufs,
            head: 0,
            unposted: 0,
        }
    }

    fn send(&mut self, n: usize) -> usize {
        let mut frames = [TxFrame {
            first: &[],
            first_iova: 0,
            first_lkey: 0,
            rest: Gather::default(),
        }; BURST];
        for (f, b) in frames.iter_mut().zip(&self.bufs).take(n) {
            *f = TxFrame {
                first: &b.as_slice()[..FRAME],
                first_iova: b.iova(),
                first_lkey: b.lkey(),
                rest: Gather::default(),
            };
        }
        self.qs.tx_burst(&frames[..n]).unwrap()
    }

    /// Receives; checks each frame's first byte of payload is valid.
    fn recv(&mut self) -> usize {
        let n = self.qs.rx_burst();
        if n > 0 {
            let ring = self.qs.rx_ring();
            for i in 0..n {
                // SAFETY: reported by rx_burst, given back below.
                let slot = unsafe { ring.slot(self.head + i) };
                debug_assert!(wire::parse_frame(slot).is_ok());
                std::hint::black_box(slot[42]);
            }
            self.head += n;
            self.unposted += n;
            if self.unposted >= 64 {
                self.qs.post_recvs(self.unposted);
                self.unposted = 0;
            }
        }
        n
    }

    fn finish(mut self) {
        for b in self.bufs.drain(..) {
            self.alloc.free(b);
        }
    }
}

fn open(nic: &SimNic) -> Device<mlx5_sim::SimBackend> {
    Device::open(
        nic.backend(),
        DeviceConfig {
            region: region(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// One thread, deterministic fabric. Returns (round trips, elapsed).
fn one_core(round_trips: usize, window: usize) -> (usize, Duration) {
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
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
    let (da, db) = (open(&na), open(&nb));
    let mut a = Side::new(&da, 1, nb.mac(), 2);
    let mut b = Side::new(&db, 2, na.mac(), 1);
    let (mut sent, mut done, mut in_flight) = (0usize, 0usize, 0usize);
    let t0 = Instant::now();
    while done < round_trips {
        let n = (window - in_flight).min(BURST).min(round_trips - sent);
        if n > 0 {
            let k = a.send(n);
            sent += k;
            in_flight += k;
        }
        // B echoes what it got.
        let mut got = b.recv();
        while got > 0 {
            let k = got.min(BURST);
            assert_eq!(b.send(k), k);
            got -= k;
        }
        let back = a.recv();
        done += back;
        in_flight -= back;
    }
    let dt = t0.elapsed();
    a.finish();
    b.finish();
    (done, dt)
}

/// Two threads, threaded fabric.
fn two_threads(round_trips: usize, window: usize) -> (usize, Duration) {
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: false,
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
    let (da, db) = (open(&na), open(&nb));
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, a_mac) = (stop.clone(), na.mac());
    let server = std::thread::spawn(move || {
        let mut b = Side::new(&db, 2, a_mac, 1);
        while !stop2.load(Ordering::Relaxed) {
            let mut got = b.recv();
            while got > 0 {
                let k = got.min(BURST);
                let mut sent = 0;
                while sent < k {
                    sent += b.send(k - sent);
                }
                got -= k;
            }
        }
        b.finish();
        drop(db);
    });
    let mut a = Side::new(&da, 1, nb.mac(), 2);
    let (mut sent, mut done, mut in_flight) = (0usize, 0usize, 0usize);
    // Let the server create its queue set and flow rule.
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    while done < round_trips {
        let n = (window - in_flight).min(BURST).min(round_trips - sent);
        if n > 0 {
            let k = a.send(n);
            sent += k;
            in_flight += k;
        }
        let back = a.recv();
        done += back;
        in_flight -= back;
    }
    let dt = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    a.finish();
    (done, dt)
}

fn main() {
    let mut round_trips = 400_000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--frames") {
        round_trips = args[i + 1].parse().expect("--frames N");
    }
    println!("raw frame echo over the device model ({FRAME}-byte frames, bursts of {BURST})");
    println!(
        "{:<10} {:>7} {:>12} {:>12} {:>14} {:>11}",
        "mode", "window", "round trips", "elapsed", "Mframes/s", "ns/frame"
    );
    for (mode, window) in [
        ("1 core", 1),
        ("1 core", 16),
        ("1 core", 60),
        ("2 threads", 1),
        ("2 threads", 16),
        ("2 threads", 60),
    ] {
        let (n, dt) = if mode == "1 core" {
            one_core(round_trips, window)
        } else {
            two_threads(round_trips, window)
        };
        // Every round trip is two frames (A→B and B→A).
        let frames = 2 * n;
        let mfps = frames as f64 / dt.as_secs_f64() / 1e6;
        let ns = dt.as_nanos() as f64 / frames as f64;
        println!(
            "{:<10} {:>7} {:>12} {:>10.3}s {:>14.3} {:>11.1}",
            mode,
            window,
            n,
            dt.as_secs_f64(),
            mfps,
            ns
        );
    }
}
