//! The driver against the device model: bring-up and teardown, the
//! datapath features (doorbell batching, unsignaled TX, striding RQ with an
//! overrunning CQ), fault handling. Everything here runs in one thread on
//! the fabric's virtual clock, so every run is the same.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use mlx5::prm::codes::{CmdStatus, CqeSyndrome, Opcode};
use mlx5::prm::cqe::CQE_L3_HDR_TYPE_IPV4;
use mlx5::{Error, HealthProblem, QueueConfig, TxFrame};
use mlx5_sim::{DropReason, FailCommand, HcaState, Injection, LinkFaults};
use transport::wire::{self, FrameTemplate};

const LEN: usize = 128;

#[test]
fn bring_up_and_teardown_leave_nothing_behind() {
    let fab = fabric(1);
    let nic = nic(&fab, 1);
    let dev = open(&nic);
    let info = dev.info().clone();
    assert_eq!(info.mac, nic.mac());
    assert_eq!(nic.hca_state(), HcaState::Initialized);
    assert!(nic.bus_master(), "bring-up enables bus mastering");
    assert!(dev.firmware_pages() > 0 && dev.firmware_pages() == nic.pages_held());
    let base = nic.objects();
    let qs = dev.create_queue_set(queue(4000)).unwrap();
    let with_qs = nic.objects();
    assert_eq!(with_qs.sqs, base.sqs + 1);
    assert_eq!(with_qs.rqs, base.rqs + 1);
    assert_eq!(with_qs.cqs, base.cqs + 2);
    assert_eq!(with_qs.flow_entries, base.flow_entries + 1);
    dev.check_health().expect("healthy");
    drop(qs);
    assert_eq!(
        nic.objects(),
        base,
        "queue-set teardown destroys every object it created"
    );
    dev.close().expect("clean teardown");
    assert_eq!(nic.hca_state(), HcaState::Disabled);
    assert_eq!(nic.pages_held(), 0, "every firmware page was taken back");
    assert_eq!(nic.objects().total(), 0);
    let s = nic.stats();
    assert_eq!((s.pages_leaked, s.objects_leaked), (0, 0));
    assert!(
        nic.dma_mappings().is_empty(),
        "all device memory unmapped: {:?}",
        nic.dma_mappings()
    );
    // No command failed along the way.
    assert!(
        nic.command_log().iter().all(|c| c.status == CmdStatus::Ok),
        "{:?}",
        nic.command_log().iter().find(|c| c.status != CmdStatus::Ok)
    );
}

#[test]
fn teardown_on_drop_also_returns_everything() {
    let fab = fabric(2);
    let nic = nic(&fab, 1);
    {
        let dev = open(&nic);
        let _qs = dev.create_queue_set(queue(4000)).unwrap();
        let _qs2 = dev.create_queue_set(queue(4001)).unwrap();
    }
    assert_eq!(nic.hca_state(), HcaState::Disabled);
    assert_eq!(nic.pages_held(), 0);
    assert_eq!(nic.objects().total(), 0);
}

#[test]
fn queue_sets_are_send_not_sync() {
    fn send<T: Send>() {}
    send::<mlx5::QueueSet<mlx5_sim::SimBackend>>();
    // `!Sync` is checked by the compile_fail doc test on QueueSet.
}

#[test]
fn two_devices_echo_frames_and_batch_doorbells_and_completions() {
    let fab = fabric(3);
    let (na, nb) = (nic(&fab, 1), nic(&fab, 2));
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let (mut aa, mut ab) = (allocator(&da), allocator(&db));
    let bursts = 40;
    let per = 16;
    let mut bufs: Vec<_> = (0..per).map(|_| aa.alloc(LEN).unwrap()).collect();
    let mut echo_bufs: Vec<_> = (0..per).map(|_| ab.alloc(LEN).unwrap()).collect();
    let sq_doorbells_before = na.stats().sq_doorbells;
    let mut seq = 0u32;
    let mut echoed = 0usize;
    let mut back = 0usize;
    for _ in 0..bursts {
        for b in bufs.iter_mut() {
            write_frame(b, &qa, nb.mac(), 6000, seq, LEN);
            seq += 1;
        }
        let frames: Vec<_> = bufs.iter().map(|b| frame(b, LEN)).collect();
        assert_eq!(qa.tx_burst(&frames).unwrap(), per);
        step(&fab);
        // B echoes everything it got.
        let n = qb.rx_burst();
        assert_eq!(n, per, "all frames of the burst arrived");
        let head = echoed;
        for (i, eb) in echo_bufs.iter_mut().enumerate().take(n) {
            let s = read_seq(&qb, head + i, LEN);
            assert_eq!(s as usize, head + i, "in order");
            write_frame(eb, &qb, na.mac(), 5000, s, LEN);
        }
        let frames: Vec<_> = echo_bufs.iter().take(n).map(|b| frame(b, LEN)).collect();
        assert_eq!(qb.tx_burst(&frames).unwrap(), n);
        qb.post_recvs(n);
        echoed += n;
        step(&fab);
        let m = qa.rx_burst();
        for i in 0..m {
            assert_eq!(read_seq(&qa, back + i, LEN) as usize, back + i);
        }
        qa.post_recvs(m);
        back += m;
    }
    assert_eq!(back, bursts * per);
    // One doorbell per burst; one CQE per 64 sends.
    let s = na.stats();
    assert_eq!(s.sq_doorbells - sq_doorbells_before, bursts as u64);
    assert_eq!(s.tx_frames, (bursts * per) as u64);
    assert_eq!(
        s.tx_cqes,
        (bursts * per / 64) as u64,
        "exactly one CQE per 64 unsignaled sends"
    );
    assert_eq!(qa.stats().tx_doorbells, bursts as u64);
    // tx_flush: a signaled NOP; afterwards nothing is outstanding.
    qa.tx_flush().unwrap();
    let snap = qa.snapshot();
    assert_eq!(snap.sq_ci, snap.sq_pi);
    assert!(!snap.sq_signaled_outstanding);
    let hw = qa.query_hw().unwrap();
    assert_eq!(hw.sq_state, 1);
    assert_eq!(hw.out_of_buffer, 0);
    for b in bufs.drain(..) {
        aa.free(b);
    }
    for b in echo_bufs.drain(..) {
        ab.free(b);
    }
}

/// 100 000 packets through the 8-entry overrun-ignore CQ: the count is
/// exact, the order is right, the RQ is reposted in time (no out-of-buffer
/// drop), and the CQ wraps thousands of times.
#[test]
fn overrunning_rx_cq_counts_100k_packets_exactly() {
    let (mode, _) = count_100k(mlx5_sim::WqeIdMode::FreeRunning);
    assert_eq!(mode, mlx5::RxWqeIdMode::FreeRunning);
}

/// Item 6: the NIC may report `wqe_id` as the WQE's ring index instead of
/// a free-running counter. The driver finds out from the first packet past
/// the first lap of the ring and counts exactly either way.
#[test]
fn overrunning_rx_cq_counts_exactly_when_wqe_id_is_a_ring_index() {
    let (mode, reposts) = count_100k(mlx5_sim::WqeIdMode::RingIndex);
    assert_eq!(mode, mlx5::RxWqeIdMode::RingIndex);
    assert!(reposts >= 100_000 / 512);
}

/// Sends 100 000 packets A -> B with the given `wqe_id` reading; returns
/// the reading the driver detected and B's repost count.
fn count_100k(id_mode: mlx5_sim::WqeIdMode) -> (mlx5::RxWqeIdMode, u64) {
    let fab = fabric(4);
    let cfg = |i| mlx5_sim::NicConfig {
        mac: mac(i),
        wqe_id_mode: id_mode,
        ..Default::default()
    };
    let (na, nb) = (
        mlx5_sim::SimNic::new(&fab, cfg(1)),
        mlx5_sim::SimNic::new(&fab, cfg(2)),
    );
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let mut aa = allocator(&da);
    let per = 16;
    let mut bufs: Vec<_> = (0..per).map(|_| aa.alloc(LEN).unwrap()).collect();
    let total = 100_000usize;
    let mut sent = 0usize;
    let mut got = 0usize;
    let mut unposted = 0usize;
    let mut known = 0u64;
    while got < total {
        if sent < total {
            let n = per.min(total - sent);
            for (i, b) in bufs.iter_mut().take(n).enumerate() {
                write_frame(b, &qa, nb.mac(), 6000, (sent + i) as u32, LEN);
            }
            let frames: Vec<_> = bufs.iter().take(n).map(|b| frame(b, LEN)).collect();
            sent += qa.tx_burst(&frames).unwrap();
        }
        step(&fab);
        // Let several bursts pile up before reading, so the CQ laps.
        if sent.is_multiple_of(per * 8) || sent == total {
            let n = qb.rx_burst();
            for i in 0..n {
                assert_eq!(read_seq(&qb, got + i, LEN) as usize, got + i);
                // Every frame is good: a known verdict must say so.
                let f = qb.rx_cqe_flags_of(got + i);
                assert!(!f.known() || f.ipv4_header_ok(), "{f:?}");
                known += u64::from(f.known());
            }
            got += n;
            unposted += n;
            // Give slots back in chunks, as eRPC does after processing.
            if unposted >= 256 || got == total {
                qb.post_recvs(unposted);
                unposted = 0;
            }
        }
    }
    assert_eq!(got, total);
    // Reads every 8 bursts of 16 lap the CQ: only the last CQEs of each
    // read are the frames' own.
    assert!(known > 0 && known < total as u64, "{known} known");
    assert_eq!(qb.rx_burst(), 0, "nothing phantom after the last packet");
    assert_eq!(nb.drops(DropReason::OutOfBuffer), 0);
    assert_eq!(qb.query_hw().unwrap().out_of_buffer, 0);
    assert_eq!(
        nb.stats().rx_cqes,
        total as u64,
        "one CQE per packet, written round robin over 8 slots"
    );
    assert!(qb.stats().rx_reposts >= (total / 512) as u64);
    for b in bufs {
        aa.free(b);
    }
    (qb.snapshot().rx_wqe_id_mode, qb.stats().rx_reposts)
}

/// A seeded lossy link: RX counting stays exact (what arrived is what the
/// fabric delivered, in order) and the same seed loses the same frames.
#[test]
fn lossy_link_does_not_confuse_rx_counting() {
    let run = |seed: u64| -> Vec<u32> {
        let fab = fabric(seed);
        let (na, nb) = (nic(&fab, 1), nic(&fab, 2));
        fab.set_link_faults(
            na.port(),
            LinkFaults {
                loss: 0.2,
                ..Default::default()
            },
        );
        let (da, db) = (open(&na), open(&nb));
        let mut qa = da.create_queue_set(queue(5000)).unwrap();
        let mut qb = db.create_queue_set(queue(6000)).unwrap();
        let mut aa = allocator(&da);
        let mut bufs: Vec<_> = (0..16).map(|_| aa.alloc(LEN).unwrap()).collect();
        let mut seen = Vec::new();
        for burst in 0..500u32 {
            for (i, b) in bufs.iter_mut().enumerate() {
                write_frame(b, &qa, nb.mac(), 6000, burst * 16 + i as u32, LEN);
            }
            let frames: Vec<_> = bufs.iter().map(|b| frame(b, LEN)).collect();
            qa.tx_burst(&frames).unwrap();
            step(&fab);
            let n = qb.rx_burst();
            let head = seen.len();
            for i in 0..n {
                seen.push(read_seq(&qb, head + i, LEN));
            }
            qb.post_recvs(n);
        }
        let delivered = nb.stats().rx_delivered as usize;
        assert_eq!(
            seen.len(),
            delivered,
            "counted exactly what the NIC delivered"
        );
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "strictly increasing: no phantom or repeated packet"
        );
        assert!(
            seen.len() < 8000 && seen.len() > 5600,
            "about 20% lost: {}",
            seen.len()
        );
        for b in bufs {
            aa.free(b);
        }
        seen
    };
    let a = run(77);
    assert_eq!(a, run(77), "the same seed loses the same frames");
    assert_ne!(a, run(78));
}

#[test]
fn injected_command_failure_is_a_typed_error_and_leaks_nothing() {
    let fab = fabric(5);
    let nic = nic(&fab, 1);
    let dev = open(&nic);
    let base = nic.objects();
    nic.inject(Injection::FailCommand(FailCommand {
        nth: 1,
        opcode: Some(Opcode::CreateRq as u16),
        status: CmdStatus::BadParameter,
        syndrome: 0x00c0_ffee,
    }))
    .unwrap();
    let err = dev.create_queue_set(queue(4000)).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.command_status(), Some(CmdStatus::BadParameter), "{msg}");
    assert!(
        msg.contains("CREATE_RQ") && msg.contains("bad parameter") && msg.contains("0x00c0ffee"),
        "{msg}"
    );
    assert_eq!(
        nic.objects(),
        base,
        "the half-built queue set was torn down"
    );
    // The port is free again.
    dev.create_queue_set(queue(4000)).unwrap();
}

#[test]
fn failed_bring_up_returns_pages_and_disables() {
    let fab = fabric(6);
    let nic = nic(&fab, 1);
    nic.inject(Injection::FailCommand(FailCommand {
        nth: 1,
        opcode: Some(Opcode::InitHca as u16),
        status: CmdStatus::BadSystemState,
        syndrome: 0x42,
    }))
    .unwrap();
    let err = mlx5::Device::open(nic.backend(), device_config()).unwrap_err();
    assert!(err.to_string().contains("INIT_HCA"), "{err}");
    assert_eq!(nic.pages_held(), 0);
    assert_eq!(nic.hca_state(), HcaState::Disabled);
}

#[test]
fn duplicate_port_and_bad_config_are_refused() {
    let fab = fabric(7);
    let nic = nic(&fab, 1);
    let dev = open(&nic);
    let _q = dev.create_queue_set(queue(4000)).unwrap();
    let err = dev.create_queue_set(queue(4000)).unwrap_err();
    assert!(err.to_string().contains("already steered"), "{err}");
    let err = dev
        .create_queue_set(QueueConfig {
            rq_log_stride_bytes: 8,
            ..queue(4001)
        })
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

#[test]
fn error_cqe_moves_sq_to_error_and_recover_brings_it_back() {
    let fab = fabric(8);
    let (na, nb) = (nic(&fab, 1), nic(&fab, 2));
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let mut aa = allocator(&da);
    let mut buf = aa.alloc(LEN).unwrap();
    write_frame(&mut buf, &qa, nb.mac(), 6000, 0, LEN);
    na.inject(Injection::ErrorCqe {
        sqn: qa.snapshot().sqn,
        syndrome: CqeSyndrome::LocalLength,
    })
    .unwrap();
    qa.tx_burst(&[frame(&buf, LEN)]).unwrap();
    step(&fab);
    let err = qa.tx_flush().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::SqInError { .. }), "{msg}");
    assert!(
        msg.contains("local length error"),
        "error CQE named by syndrome: {msg}"
    );
    assert_eq!(qa.query_hw().unwrap().sq_state, 3);
    assert!(
        qa.tx_burst(&[frame(&buf, LEN)]).is_err(),
        "no posting into an SQ in error"
    );
    qa.recover_sq().unwrap();
    assert_eq!(qa.query_hw().unwrap().sq_state, 1);
    write_frame(&mut buf, &qa, nb.mac(), 6000, 7, LEN);
    qa.tx_burst(&[frame(&buf, LEN)]).unwrap();
    qa.tx_flush().unwrap();
    step(&fab);
    assert_eq!(qb.rx_burst(), 1);
    assert_eq!(read_seq(&qb, 0, LEN), 7);
    aa.free(buf);
}

#[test]
fn page_requests_are_answered_including_while_a_command_waits() {
    let fab = fabric(9);
    let nic = nic(&fab, 1);
    let dev = open(&nic);
    let before = nic.pages_held();
    nic.inject(Injection::PageRequest(32)).unwrap();
    dev.poll_events().unwrap();
    assert_eq!(nic.pages_held(), before + 32);
    assert_eq!(dev.firmware_pages(), before + 32);
    nic.inject(Injection::PageRequest(-16)).unwrap();
    dev.poll_events().unwrap();
    assert_eq!(nic.pages_held(), before + 16);
    // A command that completes only once firmware got more pages: the
    // driver must answer the page request while it polls the command.
    nic.inject(Injection::CommandWaitsForPages(8)).unwrap();
    let _q = dev
        .create_queue_set(queue(4000))
        .expect("command completes after the page request is answered");
    assert_eq!(nic.pages_held(), before + 24);
    assert_eq!(dev.firmware_pages(), nic.pages_held());
    drop(_q);
    dev.close().unwrap();
    assert_eq!(nic.pages_held(), 0);
}

#[test]
fn health_check_reports_stall_syndrome_and_surprise_removal() {
    let fab = fabric(10);
    let nic = nic(&fab, 1);
    let dev = open(&nic);
    for _ in 0..5 {
        fab.advance(Duration::from_millis(1000));
        dev.check_health()
            .expect("healthy while the counter advances");
    }
    nic.inject(Injection::StopHealthCounter).unwrap();
    let mut stalled = None;
    for _ in 0..5 {
        fab.advance(Duration::from_millis(1000));
        if let Err(e) = dev.check_health() {
            stalled = Some(e);
            break;
        }
    }
    match stalled {
        Some(Error::Unhealthy {
            why: HealthProblem::Stalled { checks: 3, .. },
            ..
        }) => {}
        other => panic!("expected a stalled-counter error, got {other:?}"),
    }
    nic.inject(Injection::ResumeHealthCounter).unwrap();
    nic.inject(Injection::FatalHealthSyndrome(0x8)).unwrap();
    fab.advance(Duration::from_millis(100));
    let err = dev.check_health().unwrap_err();
    assert!(
        err.to_string().contains("unrecoverable hardware error"),
        "{err}"
    );
    nic.inject(Injection::FatalHealthSyndrome(0)).unwrap();
    nic.inject(Injection::SurpriseRemoval).unwrap();
    let err = dev.check_health().unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unhealthy {
                why: HealthProblem::Gone,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn firmware_readiness_delay_is_waited_out() {
    let fab = fabric(11);
    let nic = nic(&fab, 1);
    nic.inject(Injection::InitDelay(Duration::from_millis(500)))
        .unwrap();
    let dev = open(&nic);
    assert!(
        fab.now_ns() >= 500_000_000,
        "the driver waited (virtual) time for firmware"
    );
    drop(dev);
}

#[test]
fn l2_inline_devices_get_the_header_inline() {
    let fab = fabric(12);
    let na = mlx5_sim::SimNic::new(
        &fab,
        mlx5_sim::NicConfig {
            mac: mac(1),
            wqe_inline_mode: 0,
            ..Default::default()
        },
    );
    let nb = nic(&fab, 2);
    let (da, db) = (open(&na), open(&nb));
    assert_eq!(da.info().inline_mode, mlx5::InlineMode::L2);
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    assert!(qa.inlines_l2());
    let mut aa = allocator(&da);
    let mut buf = aa.alloc(LEN).unwrap();
    for s in 0..200u32 {
        write_frame(&mut buf, &qa, nb.mac(), 6000, s, LEN);
        qa.tx_burst(&[frame(&buf, LEN)]).unwrap();
        qa.tx_flush().unwrap();
        step(&fab);
        assert_eq!(qb.rx_burst(), 1);
        assert_eq!(read_seq(&qb, s as usize, LEN), s);
        qb.post_recvs(1);
    }
    aa.free(buf);
}

/// A signal more often than a burst is long (here every second send)
/// must not make a burst wait for a completion that only a WQE of the
/// same, not yet announced, burst can bring: the driver rings for what it
/// wrote first. Every frame is posted, every second one completes.
#[test]
fn a_signal_every_few_sends_posts_whole_bursts() {
    let fab = fabric(4);
    let (na, nb) = (nic(&fab, 1), nic(&fab, 2));
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da
        .create_queue_set(mlx5::QueueConfig {
            unsignaled_batch: 2,
            ..queue(5000)
        })
        .unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let mut aa = allocator(&da);
    let per = 16;
    let mut bufs: Vec<_> = (0..per).map(|_| aa.alloc(LEN).unwrap()).collect();
    let mut seq = 0u32;
    for _ in 0..10 {
        for b in bufs.iter_mut() {
            write_frame(b, &qa, nb.mac(), 6000, seq, LEN);
            seq += 1;
        }
        let frames: Vec<_> = bufs.iter().map(|b| frame(b, LEN)).collect();
        assert_eq!(qa.tx_burst(&frames).unwrap(), per, "the whole burst");
        step(&fab);
        let n = qb.rx_burst();
        assert_eq!(n, per);
        qb.post_recvs(n);
    }
    qa.tx_flush().unwrap();
    let s = na.stats();
    assert_eq!(s.tx_frames, 160);
    assert_eq!(s.tx_cqes, 80 + 1, "one CQE per 2 sends, and the flush's");
    for b in bufs {
        aa.free(b);
    }
}

/// The NIC's IPv4 header verdict (CQE L3 header type and `l3_ok`) reaches
/// each frame's ring slot when the driver reads that frame's own CQE: right
/// for a good header, not OK for a corrupted one or a zero checksum field
/// (the C++ raw transport's), and unknown, never another frame's, for the
/// frames whose CQEs the overrunning CQ had already reused.
#[test]
fn rx_cqe_flags_carry_the_nics_ipv4_verdict_per_frame() {
    let fab = fabric(9);
    let nb = nic(&fab, 2);
    let db = open(&nb);
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let t = FrameTemplate {
        dst_mac: nb.mac(),
        src_mac: mac(7),
        src_ip: Ipv4Addr::new(10, 0, 0, 7),
        dst_ip: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 1,
        dst_port: 6000,
    };
    let build = |seq: u8| {
        let mut f = vec![seq; LEN];
        wire::build_headroom(&t, &mut f, LEN);
        f
    };
    let good = build(1);
    let mut corrupt = build(2);
    corrupt[14 + 8] ^= 0x04; // TTL: the checksum no longer verifies
    let mut zero = build(3);
    zero[24..26].fill(0);
    for f in [&good, &corrupt, &zero, &good] {
        fab.inject(nb.port(), f);
    }
    step(&fab);
    assert_eq!(qb.rx_burst(), 4);
    let flags: Vec<_> = (0..4).map(|i| qb.rx_cqe_flags_of(i)).collect();
    assert!(flags.iter().all(|f| f.known()), "{flags:?}");
    assert!(
        flags
            .iter()
            .all(|f| f.l3_hdr_type() == CQE_L3_HDR_TYPE_IPV4)
    );
    let ok: Vec<_> = flags.iter().map(|f| f.ipv4_header_ok()).collect();
    assert_eq!(ok, [true, false, false, true], "{flags:?}");
    qb.post_recvs(4);

    // 20 frames between two polls: the 8-entry CQ laps. The first CQE read
    // stands for 13 frames; none of them may be vouched for, and the
    // corrupted frames in the burst are never reported OK.
    for i in 0..20u8 {
        fab.inject(nb.port(), if i % 3 == 0 { &corrupt } else { &good });
    }
    step(&fab);
    assert_eq!(qb.rx_burst(), 20);
    let mut vouched = 0;
    for i in 0..20usize {
        let f = qb.rx_cqe_flags_of(4 + i);
        if f.known() {
            assert_eq!(f.ipv4_header_ok(), i % 3 != 0, "frame {i}: {f:?}");
            vouched += 1;
        }
    }
    assert!((1..20).contains(&vouched), "{vouched} of 20 known");
    qb.post_recvs(20);
}

/// Send WQEs of one and two WQEBBs (L2 inline, one or two gather entries)
/// mixed, so that two-WQEBB WQEs straddle the end of the SQ ring on the
/// laps: each arrives whole.
#[test]
fn two_wqebb_wqes_straddle_the_sq_ring_end_intact() {
    let fab = fabric(13);
    let na = mlx5_sim::SimNic::new(
        &fab,
        mlx5_sim::NicConfig {
            mac: mac(1),
            wqe_inline_mode: 0,
            ..Default::default()
        },
    );
    let nb = nic(&fab, 2);
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    assert!(qa.inlines_l2());
    let sq_wqebbs = 1usize << qa.config().sq_log_wqebbs;
    let mut aa = allocator(&da);
    let mut buf = aa.alloc(LEN).unwrap();
    let total = 3 * sq_wqebbs as u32;
    for s in 0..total {
        write_frame(&mut buf, &qa, nb.mac(), 6000, s, LEN);
        let f = if s % 3 == 0 {
            frame(&buf, LEN)
        } else {
            // Header and data in two gather entries: 5 DS, two WQEBBs. The
            // split moves, so a stale second WQEBB would show.
            let split = 44 + s as usize % 13;
            TxFrame {
                first: &buf.as_slice()[..split],
                first_iova: buf.iova(),
                first_lkey: buf.lkey(),
                rest: mlx5::Gather {
                    iova: buf.iova() + split as u64,
                    len: (LEN - split) as u32,
                    lkey: buf.lkey(),
                },
            }
        };
        assert_eq!(qa.tx_burst(&[f]).unwrap(), 1);
        step(&fab);
        assert_eq!(qb.rx_burst(), 1);
        assert_eq!(read_seq(&qb, s as usize, LEN), s);
        qb.post_recvs(1);
    }
    aa.free(buf);
}

/// The burst fast path (no inline header: every WQE one WQEBB) with every
/// gather shape it accepts — the frame in one segment, split in two, and
/// an empty first segment with the frame in the second — in bursts of 1 to
/// 5 with a completion asked every 3 WQEs (so the signaled WQE falls at
/// every position of a burst, and some bursts take the general path), and
/// BlueFlame for single-WQE bursts: every frame arrives intact and in
/// order, one CQE per 3 sends, and every BlueFlame copy (which must carry
/// the completion request of a signaled WQE) equals the WQE in memory.
#[test]
fn burst_fast_path_gather_shapes_signals_and_blueflame() {
    let fab = fabric(17);
    let na = mlx5_sim::SimNic::new(
        &fab,
        mlx5_sim::NicConfig {
            mac: mac(1),
            bar_write_combining: true,
            ..Default::default()
        },
    );
    let nb = nic(&fab, 2);
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da
        .create_queue_set(QueueConfig {
            unsignaled_batch: 3,
            blueflame: true,
            ..queue(5000)
        })
        .unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    assert!(!qa.inlines_l2());
    let mut aa = allocator(&da);
    let mut bufs: Vec<_> = (0..5).map(|_| aa.alloc(LEN).unwrap()).collect();
    let (mut seq, mut singles) = (0u32, 0u64);
    for round in 0..60usize {
        let n = 1 + round % 5;
        for b in bufs.iter_mut().take(n) {
            write_frame(b, &qa, nb.mac(), 6000, seq, LEN);
            seq += 1;
        }
        let frames: Vec<TxFrame<'_>> = bufs
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, b)| {
                let split = match (round + i) % 3 {
                    0 => LEN,
                    1 => 42 + (round + i) % 17,
                    _ => 0,
                };
                TxFrame {
                    first: &b.as_slice()[..split],
                    first_iova: b.iova(),
                    first_lkey: b.lkey(),
                    rest: if split < LEN {
                        mlx5::Gather {
                            iova: b.iova() + split as u64,
                            len: (LEN - split) as u32,
                            lkey: b.lkey(),
                        }
                    } else {
                        mlx5::Gather::default()
                    },
                }
            })
            .collect();
        assert_eq!(qa.tx_burst(&frames).unwrap(), n);
        singles += u64::from(n == 1);
        step(&fab);
        assert_eq!(qb.rx_burst(), n);
        for k in 0..n {
            let s = seq as usize - n + k;
            assert_eq!(read_seq(&qb, s, LEN) as usize, s, "in order, intact");
        }
        qb.post_recvs(n);
    }
    let sent = u64::from(seq);
    // Single-WQE bursts, and the general path's doorbells for one WQE
    // rung before it waits for a completion inside a burst.
    let bf = qa.stats().tx_blueflame;
    assert!(
        bf >= singles,
        "{bf} BlueFlame writes for {singles} single-WQE bursts"
    );
    let s = na.stats();
    assert_eq!(s.tx_frames, sent);
    assert_eq!(s.tx_cqes, sent / 3, "one CQE per 3 sends");
    assert_eq!((s.bf_writes, s.bf_mismatches), (bf, 0));
    qa.tx_flush().unwrap();
    for b in bufs {
        aa.free(b);
    }
}
