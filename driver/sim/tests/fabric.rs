//! The fabric with real device-model NICs: seeded faults replay exactly,
//! pcap files are byte-identical per seed, and threaded delivery from many
//! senders into one receiver is safe.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use mlx5::hw::HwBackend;
use mlx5::prm::codes::Opcode;
use mlx5_sim::{
    Direction, DropReason, Fabric, FabricConfig, LinkEventKind, LinkFaults, PcapBuffer, pcap,
};

struct Run {
    lost: Vec<u64>,
    received: Vec<u32>,
    pcap_a: Vec<u8>,
    pcap_b: Vec<u8>,
    events: Vec<mlx5_sim::LinkEvent>,
}

/// A sends 400 frames to B over a faulty link; returns what happened.
fn lossy_run(seed: u64) -> Run {
    let fab = det_fabric(seed);
    let mut a = Host::with_mac(&fab, MAC_A);
    let mut b = Host::with_mac(&fab, MAC_B);
    a.bring_up();
    b.bring_up();
    let mut pa = a.build_path(PathCfg::default());
    let pb = b.build_path(PathCfg::default());
    let (cap_a, cap_b) = (PcapBuffer::new(), PcapBuffer::new());
    fab.set_pcap(a.nic.port(), cap_a.clone()).unwrap();
    fab.set_pcap(b.nic.port(), cap_b.clone()).unwrap();
    fab.set_link_faults(
        a.nic.port(),
        LinkFaults {
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.02,
            delay: Duration::from_micros(2),
            ..Default::default()
        },
    );
    let bufs = a.alloc(400 * 128);
    for i in 0..400u32 {
        let f = frame_to(MAC_B, MAC_A, &i.to_be_bytes().repeat(16));
        bufs.write(i as usize * 128, &f);
        a.post_send(
            &mut pa.sq,
            &[],
            &[(bufs.iova_at(i as usize * 128), f.len() as u32)],
            i % 64 == 63,
        );
        a.ring_sq(&mut pa.sq);
        while a.poll_cq(&mut pa.tx_cq).is_some() {}
        fab.advance(Duration::from_micros(1));
    }
    fab.advance(Duration::from_millis(1));
    let n = b.nic.stats().rx_delivered as usize;
    let received = (0..n)
        .map(|k| be32(&pb.rq.bufs.read_vec(k * 1024 + 42, 4), 0))
        .collect();
    let events = fab.link_events();
    let lost = events
        .iter()
        .filter(|e| e.kind == LinkEventKind::Lost)
        .map(|e| e.frame_id)
        .collect();
    fab.flush_pcaps().unwrap();
    Run {
        lost,
        received,
        pcap_a: cap_a.bytes(),
        pcap_b: cap_b.bytes(),
        events,
    }
}

#[test]
fn a_seeded_lossy_link_replays_exactly() {
    let r1 = lossy_run(7);
    let r2 = lossy_run(7);
    let r3 = lossy_run(8);
    assert!(!r1.lost.is_empty());
    assert_eq!(r1.lost, r2.lost, "same frames lost");
    assert_eq!(r1.events, r2.events);
    assert_eq!(r1.received, r2.received, "same frames, same order");
    assert_eq!(r1.pcap_a, r2.pcap_a, "byte-identical pcap (sender port)");
    assert_eq!(r1.pcap_b, r2.pcap_b, "byte-identical pcap (receiver port)");
    assert_ne!(r1.lost, r3.lost, "another seed loses other frames");
    // Every kind of fault happened, and the receiver saw reordering.
    for k in [
        LinkEventKind::Lost,
        LinkEventKind::Duplicated,
        LinkEventKind::Reordered,
        LinkEventKind::Corrupted,
    ] {
        assert!(r1.events.iter().any(|e| e.kind == k), "{k:?}");
    }
    assert!(r1.received.windows(2).any(|w| w[1] < w[0]), "reordered");
    let frames = pcap::parse(&r1.pcap_a).unwrap();
    assert_eq!(frames.len(), 400, "the sender port saw every frame leave");
    assert!(
        frames.windows(2).all(|w| w[0].0 <= w[1].0),
        "fabric-clock timestamps"
    );
}

#[test]
fn delay_holds_frames_until_the_clock_moves_and_link_down_drops() {
    let fab = det_fabric(3);
    let mut a = Host::with_mac(&fab, MAC_A);
    a.bring_up();
    let mut p = a.build_path(PathCfg::default());
    let tap = fab.add_tap(Some(MAC_B));
    fab.set_link_faults_dir(
        tap.port(),
        Direction::ToDevice,
        LinkFaults {
            delay: Duration::from_micros(50),
            ..Default::default()
        },
    );
    let f = frame_to(MAC_B, MAC_A, &[5; 64]);
    let buf = a.alloc(4096);
    buf.write(0, &f);
    a.post_send(&mut p.sq, &[], &[(buf.iova(), f.len() as u32)], false);
    a.ring_sq(&mut p.sq);
    assert!(tap.is_empty());
    assert_eq!(fab.stats().pending, 1);
    a.hw.wait(Duration::from_micros(49));
    assert!(tap.is_empty());
    a.hw.wait(Duration::from_micros(1));
    assert_eq!(tap.take(), vec![f.clone()]);
    // Link down: QUERY_VPORT_STATE reports it and frames are dropped.
    fab.set_link_faults(
        a.nic.port(),
        LinkFaults {
            down: true,
            ..Default::default()
        },
    );
    let st = a.ok(&simple(Opcode::QueryVportState, 0, 0), 0x10);
    assert_eq!(be32(&st, 0xc) & 0xf, 0);
    a.post_send(&mut p.sq, &[], &[(buf.iova(), f.len() as u32)], false);
    a.ring_sq(&mut p.sq);
    fab.advance(Duration::from_millis(1));
    assert!(tap.is_empty());
    assert_eq!(fab.port_stats(a.nic.port()).unwrap().link_down_drops, 1);
    tap.send(&frame_to(MAC_A, MAC_B, &[1; 64]));
    assert_eq!(a.nic.stats().rx_frames, 0);
}

#[test]
fn threaded_senders_into_one_receiver() {
    let fab = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: false,
        ..Default::default()
    });
    let mut r = Host::with_mac(&fab, MAC_A);
    r.bring_up();
    let rp = r.build_path(PathCfg::default());
    const SENDERS: usize = 3;
    const PER: u32 = 1024;
    let mut senders = sender_hosts(&fab, SENDERS, 1);
    // eRPC's start-up state, written before any packet can arrive: the 8
    // CQEs look like the last 8 positions of the cycle, so the first
    // packet counts as one whenever the receiver gets to look.
    for i in 0..8usize {
        rp.rx_cq.mem.write(i * 64 + 2, &[0xff, 0xff]);
        let ctr = (512 - (8 - i)) as u16;
        rp.rx_cq.mem.write(i * 64 + 0x3c, &ctr.to_be_bytes());
    }
    let (id, ctr) = Host::snapshot(&rp.rx_cq, 7);
    let start = u64::from(id) * 512 + u64::from(ctr);
    let done = AtomicBool::new(false);
    let counted = AtomicU64::new(0);
    std::thread::scope(|s| {
        // The receiver polls its overrun CQ with eRPC's snapshot scheme
        // while the senders run. However late it is scheduled and however
        // far it falls behind, it counts exactly: it stops only after it
        // saw `done` (every frame was delivered, synchronously, inside a
        // sender's doorbell) and then found nothing new.
        s.spawn(|| {
            let cycle = 65536u64 * 512;
            let (mut idx, mut prev) = (0usize, start);
            let mut total = 0;
            loop {
                let finished = done.load(Ordering::Acquire);
                let (id, ctr) = Host::snapshot(&rp.rx_cq, idx);
                let cur = u64::from(id) * 512 + u64::from(ctr);
                let delta = (cur + cycle - prev) % cycle;
                if delta != 0 && delta < 4096 {
                    total += delta;
                    idx = (idx + 1) % 8;
                    prev = cur;
                    continue;
                }
                if finished {
                    break;
                }
                std::thread::yield_now();
            }
            counted.store(total, Ordering::Release);
        });
        let mut handles = Vec::new();
        for (k, (h, p)) in senders.iter_mut().enumerate() {
            handles.push(s.spawn(move || send_to_a(h, p, k as u8, PER)));
        }
        for hd in handles {
            hd.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });
    let total = u64::from(PER) * SENDERS as u64;
    assert_eq!(r.nic.stats().rx_delivered, total);
    assert_eq!(r.nic.drops(DropReason::OutOfBuffer), 0);
    assert_eq!(
        counted.load(Ordering::Acquire),
        total,
        "snapshot scheme under concurrency"
    );
    for (h, _) in &senders {
        assert_eq!(h.nic.stats().tx_frames, u64::from(PER));
    }
    assert_eq!(fab.stats().foreign_thread_calls, 0);
}

/// Four NICs send 32 full frames each at once to a fifth over 10 Gbit/s
/// links into a 16 KiB switch buffer: the output queue towards the
/// receiver fills to the buffer, the tail is dropped, and what arrives plus
/// what was dropped is what was sent. The same seed replays exactly.
fn incast_run(seed: u64) -> (mlx5_sim::QueueStats, Vec<u8>, u64) {
    let fab = Fabric::new(FabricConfig {
        seed,
        deterministic: true,
        port: mlx5_sim::PortConfig::new(10_000_000_000, 16 * 1024),
        ..Default::default()
    });
    let mut r = Host::with_mac(&fab, MAC_A);
    r.bring_up();
    let _rp = r.build_path(PathCfg::default());
    let cap = PcapBuffer::new();
    fab.set_pcap(r.nic.port(), cap.clone()).unwrap();
    let mut senders: Vec<(Host, Path)> = (0..4u8)
        .map(|i| {
            let mut h = Host::with_mac(&fab, [2, 0, 0, 0, 1, i]);
            h.bring_up();
            let p = h.build_path(PathCfg::default());
            (h, p)
        })
        .collect();
    fab.set_queue_trace(r.nic.port(), 1024);
    for (k, (h, p)) in senders.iter_mut().enumerate() {
        let bufs = h.alloc(32 * 1024);
        for j in 0..32usize {
            let f = frame_to(MAC_A, h.nic.mac(), &[k as u8; 900]);
            bufs.write(j * 1024, &f);
            h.post_send(
                &mut p.sq,
                &[],
                &[(bufs.iova_at(j * 1024), f.len() as u32)],
                j == 31,
            );
        }
        h.ring_sq(&mut p.sq);
    }
    fab.advance(Duration::from_millis(1));
    for (h, p) in senders.iter_mut() {
        assert!(h.poll_cq(&mut p.tx_cq).is_some());
    }
    let q = fab.queue(r.nic.port()).unwrap();
    let trace = fab.queue_trace(r.nic.port());
    assert_eq!(trace.len() as u64, q.enqueued + q.drops);
    fab.flush_pcaps().unwrap();
    (q, cap.bytes(), r.nic.stats().rx_frames)
}

#[test]
fn an_incast_of_nics_fills_the_switch_buffer_and_replays() {
    let (q, pcap, rx) = incast_run(5);
    assert_eq!(q.enqueued + q.drops, 128, "{q:?}");
    assert!(q.drops > 0, "{q:?}");
    assert!(q.max_bytes <= 16 * 1024 && q.max_bytes > 15 * 1024, "{q:?}");
    assert_eq!(q.bytes, 0, "drained");
    assert_eq!(rx, q.enqueued);
    // Frames arrive one serialisation time apart (942 + 24 bytes at
    // 10 Gbit/s = 772.8 ns): the receiver's link is the bottleneck.
    let frames = pcap::parse(&pcap).unwrap();
    assert_eq!(frames.len() as u64, rx);
    assert!(frames.windows(2).all(|w| w[1].0 - w[0].0 >= 772), "paced");
    assert_eq!(incast_run(5), (q, pcap, rx), "replay");
}

/// Datapath accesses run under one IOMMU session per doorbell or frame
/// while other threads map and unmap memory (the IOMMU's write lock) and
/// arm the receiver's CQ (a session, then the CQ's and the EQ's locks):
/// every frame arrives and nothing deadlocks (lock order: object table,
/// SQ, IOMMU session, RQ, CQ, EQ). A deadlock would hang the test; a
/// lock-order mistake needs an unlucky interleaving to show, so this is a
/// smoke test: the order itself is documented at `Iommu::session`.
#[test]
fn sessions_with_concurrent_unmaps_and_cq_arms() {
    let fab = Fabric::new(FabricConfig {
        seed: 2,
        deterministic: false,
        ..Default::default()
    });
    let mut r = Host::with_mac(&fab, MAC_A);
    r.bring_up();
    let rp = r.build_path(PathCfg::default());
    const SENDERS: usize = 2;
    const PER: u32 = 1024;
    let mut senders = sender_hosts(&fab, SENDERS, 2);
    let eqn = r.eq.as_ref().expect("an EQ").eqn;
    let uar = r.uar_eq as usize;
    let cqn = rp.rx_cq.cqn;
    let done = AtomicBool::new(false);
    let (maps, arms) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        // Unmapping waits for every session in flight.
        for mapper in [r.mapper.clone(), senders[0].0.mapper.clone()] {
            let (done, maps) = (&done, &maps);
            s.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    drop(mlx5_sim::HostMem::new(mapper.clone(), 8192).unwrap());
                    maps.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now();
                }
            });
        }
        // Arming the RX CQ writes a completion EQE; the EQ's consumer
        // index keeps up so that EQEs are really written.
        let (hw, nic, done, arms) = (r.hw.clone(), &r.nic, &done, &arms);
        s.spawn(move || {
            while !done.load(Ordering::Acquire) {
                let pc = nic
                    .queues()
                    .eqs
                    .iter()
                    .find(|e| e.eqn == eqn)
                    .map_or(0, |e| e.producer);
                hw.write32(
                    uar * 4096 + mlx5::prm::uar::EQ_DOORBELL_NO_ARM,
                    (eqn << 24) | pc,
                );
                hw.write64(uar * 4096 + mlx5::prm::uar::CQ_DOORBELL, u64::from(cqn));
                arms.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        let mut handles = Vec::new();
        for (k, (h, p)) in senders.iter_mut().enumerate() {
            handles.push(s.spawn(move || send_to_a(h, p, k as u8, PER)));
        }
        for hd in handles {
            hd.join().unwrap();
        }
        // Let the helpers run at least once each, however they were
        // scheduled, before stopping them.
        while maps.load(Ordering::Relaxed) < 2 || arms.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
    });
    let total = u64::from(PER) * SENDERS as u64;
    assert_eq!(r.nic.stats().rx_delivered, total);
    assert_eq!(r.nic.stats().dma.faults, 0);
    assert!(r.nic.stats().eqes > 0, "completion EQEs were written");
}

/// `n` hosts on `fab` with MACs 02:00:00:00:`tag`:i, each brought up with
/// a default path.
fn sender_hosts(fab: &Fabric, n: usize, tag: u8) -> Vec<(Host, Path)> {
    (0..n)
        .map(|i| {
            let mut h = Host::with_mac(fab, [2, 0, 0, 0, tag, i as u8]);
            h.bring_up();
            let p = h.build_path(PathCfg::default());
            (h, p)
        })
        .collect()
}

/// Sends `count` (a multiple of 16) 60-byte frames filled with `fill` to
/// `MAC_A`, 16 per doorbell, waiting for each burst's completion.
fn send_to_a(h: &mut Host, p: &mut Path, fill: u8, count: u32) {
    let bufs = h.alloc(16 * 128);
    let mut sent = 0;
    while sent < count {
        for j in 0..16 {
            let f = frame_to(MAC_A, h.nic.mac(), &[fill; 60]);
            bufs.write(j * 128, &f);
            h.post_send(
                &mut p.sq,
                &[],
                &[(bufs.iova_at(j * 128), f.len() as u32)],
                j == 15,
            );
            sent += 1;
        }
        h.ring_sq(&mut p.sq);
        while h.poll_cq(&mut p.tx_cq).is_none() {
            std::thread::yield_now();
        }
    }
}
