//! The driver on every device profile of the model: bring-up, an echo
//! exchange long enough to wrap the RX ring several times, and a teardown
//! that returns every page and object without a single failed command.
//! ConnectX-4 (no striding RQ) is refused with a clear error.

mod common;

use common::*;
use mlx5::prm::codes::CmdStatus;
use mlx5::{Device, Error};
use mlx5_sim::{HcaState, NicConfig, Profile, SimNic};

const LEN: usize = 256;

fn profile_nic(fab: &mlx5_sim::Fabric, p: Profile, i: u8) -> SimNic {
    SimNic::new(
        fab,
        NicConfig {
            mac: mac(i),
            ..p.config()
        },
    )
}

/// `packets` frames from A to B, each echoed back, in bursts of 16.
fn echo(p: Profile, packets: usize) {
    let fab = fabric(40);
    let (na, nb) = (profile_nic(&fab, p, 1), profile_nic(&fab, p, 2));
    let (da, db) = (open(&na), open(&nb));
    assert_eq!(na.hca_state(), HcaState::Initialized, "{p}");
    assert!(
        da.firmware_pages() == na.pages_held() && na.pages_held() > 0,
        "{p}"
    );
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let (mut aa, mut ab) = (allocator(&da), allocator(&db));
    let per = 16;
    let mut bufs: Vec<_> = (0..per).map(|_| aa.alloc(LEN).unwrap()).collect();
    let mut echo_bufs: Vec<_> = (0..per).map(|_| ab.alloc(LEN).unwrap()).collect();
    let (mut sent, mut echoed, mut back) = (0usize, 0usize, 0usize);
    while back < packets {
        let n = per.min(packets - sent);
        for (i, b) in bufs.iter_mut().take(n).enumerate() {
            write_frame(b, &qa, nb.mac(), 6000, (sent + i) as u32, LEN);
        }
        let frames: Vec<_> = bufs.iter().take(n).map(|b| frame(b, LEN)).collect();
        assert_eq!(qa.tx_burst(&frames).unwrap(), n, "{p}");
        sent += n;
        step(&fab);
        let got = qb.rx_burst();
        assert_eq!(got, n, "{p}: B received the burst");
        for (i, eb) in echo_bufs.iter_mut().enumerate().take(got) {
            let s = read_seq(&qb, echoed + i, LEN);
            assert_eq!(s as usize, echoed + i, "{p}: in order");
            write_frame(eb, &qb, na.mac(), 5000, s, LEN);
        }
        let frames: Vec<_> = echo_bufs.iter().take(got).map(|b| frame(b, LEN)).collect();
        assert_eq!(qb.tx_burst(&frames).unwrap(), got, "{p}");
        qb.post_recvs(got);
        echoed += got;
        step(&fab);
        let m = qa.rx_burst();
        for i in 0..m {
            assert_eq!(read_seq(&qa, back + i, LEN) as usize, back + i, "{p}");
        }
        qa.post_recvs(m);
        back += m;
    }
    qa.tx_flush().unwrap();
    qb.tx_flush().unwrap();
    assert_eq!(qa.query_hw().unwrap().out_of_buffer, 0, "{p}");
    let mode = match p.config().wqe_id_mode {
        mlx5_sim::WqeIdMode::FreeRunning => mlx5::RxWqeIdMode::FreeRunning,
        mlx5_sim::WqeIdMode::RingIndex => mlx5::RxWqeIdMode::RingIndex,
    };
    assert_eq!(
        qa.snapshot().rx_wqe_id_mode,
        mode,
        "{p}: wqe_id reading detected"
    );
    for b in bufs {
        aa.free(b);
    }
    for b in echo_bufs {
        ab.free(b);
    }
    drop((aa, ab, qa, qb));
    da.close().expect("clean teardown");
    db.close().expect("clean teardown");
    for nic in [&na, &nb] {
        assert_eq!(nic.hca_state(), HcaState::Disabled, "{p}");
        assert_eq!(nic.pages_held(), 0, "{p}: every firmware page came back");
        assert_eq!(nic.objects().total(), 0, "{p}");
        let s = nic.stats();
        assert_eq!((s.pages_leaked, s.objects_leaked), (0, 0), "{p}");
        assert!(nic.dma_mappings().is_empty(), "{p}: all DMA unmapped");
        let failed: Vec<_> = nic
            .command_log()
            .into_iter()
            .filter(|c| c.status != CmdStatus::Ok)
            .collect();
        assert!(failed.is_empty(), "{p}: failed commands {failed:#?}");
    }
}

#[test]
fn connectx4_lx_pf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX4LxPf, 10_000);
}

#[test]
fn connectx5_pf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX5Pf, 10_000);
}

#[test]
fn connectx5_vf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX5Vf, 10_000);
}

#[test]
fn connectx6_dx_pf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX6DxPf, 10_000);
}

#[test]
fn connectx6_dx_vf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX6DxVf, 10_000);
}

#[test]
fn bluefield2_ecpf_brings_up_echoes_and_tears_down() {
    echo(Profile::BlueField2Ecpf, 10_000);
}

#[test]
fn connectx7_pf_brings_up_echoes_and_tears_down() {
    echo(Profile::ConnectX7Pf, 10_000);
}

#[test]
fn every_supported_profile_is_covered() {
    // The tests above, one per profile; a new profile must get its own.
    assert_eq!(Profile::SUPPORTED.len(), 7);
    assert_eq!(Profile::ALL.len(), Profile::SUPPORTED.len() + 1);
}

#[test]
fn connectx4_without_striding_rq_is_refused_with_a_clear_error() {
    let fab = fabric(41);
    let nic = profile_nic(&fab, Profile::ConnectX4Pf, 1);
    let err = Device::open(nic.backend(), device_config()).unwrap_err();
    match &err {
        Error::MissingCapability { cap, why, .. } => {
            assert_eq!(*cap, "striding_rq");
            assert!(why.contains("multi-packet"), "{why}");
        }
        other => panic!("expected a missing-capability error, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("striding_rq"), "{msg}");
    // Refused before anything was left behind.
    assert_eq!(nic.hca_state(), HcaState::Disabled);
    assert_eq!(nic.pages_held(), 0);
}

/// The DMA memory bring-up and one queue set take on each profile, in
/// 2 MiB hugepages; README.md's setup numbers come from here.
#[test]
fn hugepages_per_profile_match_the_readme() {
    // (profile, hugepages after bring-up, with one queue set)
    let readme = [
        (Profile::ConnectX4LxPf, 10, 12),
        (Profile::ConnectX5Pf, 18, 20),
        (Profile::ConnectX5Vf, 3, 5),
        (Profile::ConnectX6DxPf, 22, 24),
        (Profile::ConnectX6DxVf, 5, 7),
        (Profile::ConnectX7Pf, 42, 44),
        (Profile::BlueField2Ecpf, 24, 26),
    ];
    let fab = fabric(42);
    for (p, up, with_qs) in readme {
        let nic = profile_nic(&fab, p, 1);
        let dev = open(&nic);
        let huge = |d: &Device<mlx5_sim::SimBackend>| d.dma_stats().pages_total / 512;
        let after_up = huge(&dev);
        let qs = dev.create_queue_set(queue(4000)).unwrap();
        let after_qs = huge(&dev);
        println!(
            "{p}: {} firmware pages, {after_up} hugepages after bring-up, {after_qs} with a queue set",
            dev.firmware_pages()
        );
        assert_eq!(
            (after_up, after_qs),
            (up, with_qs),
            "{p}: README.md says {up}/{with_qs}"
        );
        drop(qs);
    }
}
