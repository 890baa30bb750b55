//! The TX engine's deferred-gather mode (`NicConfig::deferred_tx`): a
//! send's frame and CQE wait for a later read of its data, which reports a
//! buffer changed between the doorbell and that read.

mod common;

use std::time::Duration;

use common::*;
use mlx5::hw::HwBackend;
use mlx5_sim::{DeferredTx, NicConfig};

/// A host whose NIC holds every send until a later doorbell after
/// `later` more WQEs, or the driver's wait (no time bound).
fn host(later: u32, panic: bool) -> (mlx5_sim::Fabric, Host, Path) {
    let fab = det_fabric(21);
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            log_min_stride_wqe_sz: Some(9),
            deferred_tx: Some(DeferredTx {
                max_later_wqes: later,
                max_delay_ns: 0,
                panic,
                seed: 3,
            }),
            ..Default::default()
        },
    );
    h.bring_up();
    let p = h.build_path(PathCfg::default());
    (fab, h, p)
}

#[test]
fn a_held_send_leaves_with_its_cqe_at_the_drivers_wait_or_a_later_doorbell() {
    let (fab, h, mut p) = host(0, true);
    let tap = fab.add_tap(Some(MAC_B));
    let bufs = h.alloc(4096);
    let frames: Vec<_> = (0..2u8)
        .map(|i| frame_to(MAC_B, MAC_A, &[i; 100]))
        .collect();
    bufs.write(0, &frames[0]);
    bufs.write(1024, &frames[1]);
    h.post_send(&mut p.sq, &[], &[(bufs.iova_at(0), 142)], true);
    h.ring_sq(&mut p.sq);
    fab.advance(Duration::from_micros(10));
    assert!(tap.take().is_empty(), "held: nothing on the wire");
    assert!(h.poll_cq(&mut p.tx_cq).is_none(), "held: no CQE either");
    // Read at the next doorbell (0 later WQEs drawn), before its own WQE.
    h.post_send(&mut p.sq, &[], &[(bufs.iova_at(1024), 142)], true);
    h.ring_sq(&mut p.sq);
    fab.advance(Duration::from_micros(10));
    assert_eq!(tap.take(), vec![frames[0].clone()]);
    assert_eq!(h.poll_cq(&mut p.tx_cq).expect("first CQE").wqe_counter, 0);
    assert!(h.poll_cq(&mut p.tx_cq).is_none());
    // The driver waits: the NIC reads the rest.
    h.hw.wait(Duration::from_micros(1));
    fab.advance(Duration::from_micros(10));
    assert_eq!(tap.take(), vec![frames[1].clone()]);
    assert!(h.poll_cq(&mut p.tx_cq).is_some());
    let s = h.nic.stats();
    assert_eq!((s.tx_deferred_reads, s.tx_deferred_mismatches), (2, 0));
    assert_eq!(s.tx_cqes, 2);
}

#[test]
fn a_buffer_rewritten_before_a_cqe_covered_its_send_is_reported_and_sent_as_read() {
    let (fab, h, mut p) = host(1000, false);
    let tap = fab.add_tap(Some(MAC_B));
    let bufs = h.alloc(4096);
    let f = frame_to(MAC_B, MAC_A, &[7; 100]);
    bufs.write(0, &f);
    h.post_send(&mut p.sq, &[], &[(bufs.iova_at(0), 142)], false);
    h.ring_sq(&mut p.sq);
    // Reused before any CQE: what a missing TX drain does.
    bufs.write(100, &[9]);
    h.hw.wait(Duration::from_micros(1));
    fab.advance(Duration::from_micros(10));
    let got = tap.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0][100], 9, "the NIC sends what it reads");
    assert_eq!(h.nic.stats().tx_deferred_mismatches, 1);
}

#[test]
#[should_panic(expected = "A TX drain is missing")]
fn by_default_a_mismatch_panics() {
    let (_fab, h, mut p) = host(1000, true);
    let bufs = h.alloc(4096);
    bufs.write(0, &frame_to(MAC_B, MAC_A, &[7; 100]));
    h.post_send(&mut p.sq, &[], &[(bufs.iova_at(0), 142)], false);
    h.ring_sq(&mut p.sq);
    bufs.write(60, &[1, 2, 3]);
    h.hw.wait(Duration::from_micros(1));
}
