//! A bare driver `Device` on the debug endpoint: what `erpc-inspect`
//! reads from a process that uses the driver without eRPC.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use debug_endpoint::client::Client;
use mlx5::inspect::{CompareStatus, DeviceView, decode_mprq_wqe, decode_send_wqe};
use mlx5::prm::codes::{CqeOpcode, WqeOpcode};
use mlx5::prm::cqe::Cqe;
use mlx5::{Device, DeviceConfig};

const LEN: usize = 128;
const FRAMES: usize = 100;
const BURST: usize = 10;

/// Asks for snapshots until one is complete (no wall-clock bound: the
/// datapath loop below keeps publishing until this returns).
fn complete_snapshot(c: &mut Client, rings: bool) -> serde_json::Value {
    loop {
        let s = c.snapshot(rings, Duration::from_secs(2)).expect("snapshot");
        if s["complete"] == serde_json::json!(true) {
            return s;
        }
    }
}

#[test]
fn a_bare_device_shows_software_and_firmware_views_of_its_queue_sets() {
    let dir = std::env::temp_dir().join(format!("mlx5-inspect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    debug_endpoint::set_socket_dir(Some(dir.clone()));
    let fab = fabric(11);
    let (na, nb) = (nic(&fab, 1), nic(&fab, 2));
    let cfg = DeviceConfig {
        inspect: true,
        ..device_config()
    };
    let da = Device::open(na.backend(), cfg.clone()).unwrap();
    let db = Device::open(nb.backend(), cfg).unwrap();
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let mut aa = allocator(&da);
    let mut bufs: Vec<_> = (0..BURST).map(|_| aa.alloc(LEN).unwrap()).collect();
    let mut got = 0;
    for burst in 0..FRAMES / BURST {
        for (i, b) in bufs.iter_mut().enumerate() {
            write_frame(b, &qa, nb.mac(), 6000, (burst * BURST + i) as u32, LEN);
        }
        let frames: Vec<_> = bufs.iter().map(|b| frame(b, LEN)).collect();
        assert_eq!(qa.tx_burst(&frames).unwrap(), BURST);
        step(&fab);
        let n = qb.rx_burst();
        qb.post_recvs(n);
        got += n;
    }
    assert_eq!(got, FRAMES);
    let socket = debug_endpoint::socket_path(&dir, std::process::id());
    assert!(socket.exists());

    // The client waits for publications that the datapath loop makes.
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let sock2 = socket.clone();
    let client = std::thread::spawn(move || {
        let mut c = Client::connect(&sock2).unwrap();
        let hello = c.hello().unwrap();
        let plain = complete_snapshot(&mut c, false);
        let rings = complete_snapshot(&mut c, true);
        d2.store(true, Ordering::Release);
        (hello, plain, rings)
    });
    while !done.load(Ordering::Acquire) {
        qa.poll_control();
        qb.poll_control();
    }
    let (hello, plain, rings) = client.join().unwrap();
    assert_eq!(hello["sources"]["devices"].as_array().unwrap().len(), 2);

    let devs: Vec<DeviceView> = serde_json::from_value(plain["devices"].clone()).unwrap();
    assert_eq!(devs.len(), 2);
    for (d, (nicx, qs, port)) in devs.iter().zip([(&na, &qa, 5000), (&nb, &qb, 6000)]) {
        let r = &d.report;
        assert_eq!(r.mac, format!("02:00:00:00:00:0{}", nicx.mac()[5]));
        assert_eq!(r.port_state, "up");
        assert_eq!(r.health.verdict, "ok");
        assert!(r.pages.firmware_pages > 0 && r.commands.sent > 0);
        assert_eq!(r.fw_version.split('.').count(), 3);
        let eq = d.eq.as_ref().expect("the EQ");
        assert!(eq.firmware.is_some(), "{:?}", eq.firmware_error);
        assert!(
            eq.compare
                .iter()
                .all(|c| c.status != CompareStatus::Differs),
            "{eq:?}"
        );
        assert_eq!(d.queue_sets.len(), 1);
        let v = &d.queue_sets[0];
        assert_eq!(v.udp_port, port);
        assert_eq!(v.ids.sqn, qs.snapshot().sqn);
        assert!(v.published.unwrap().fresh);
        let sw = v.software.as_ref().unwrap();
        // The control service kept running (and found the control lock
        // taken while the endpoint ran firmware queries: it never waits).
        let (mut published, mut now) = (sw.snapshot.clone(), qs.snapshot());
        assert!(published.stats.control_services <= now.stats.control_services);
        for s in [&mut published.stats, &mut now.stats] {
            (s.control_services, s.control_busy) = (0, 0);
        }
        assert_eq!(
            published, now,
            "published state is the queue set's (idle since)"
        );
        assert!(sw.rings.is_none(), "rings only when asked for");
        assert_eq!(sw.rx_cqes.len(), 8);
        let fw = v.firmware.expect("the firmware view");
        assert_eq!((fw.sq_state, fw.rq_state, fw.out_of_buffer), (1, 1, 0));
        for c in &v.compare {
            assert_ne!(c.status, CompareStatus::Differs, "{c:?}");
        }
        let status = |k: &str| v.compare.iter().find(|c| c.key == k).unwrap().status;
        assert_eq!(status("sq.producer"), CompareStatus::Same, "idle: equal");
        assert_eq!(status("tx_cq.consumer"), CompareStatus::Same);
    }
    // What went where: 100 frames in 10 bursts from A, 100 counted at B.
    // One send in 64 asks for a completion (WQE 63), and the TX CQ is
    // polled only before the next such send, so A's software knows of no
    // completed WQEBB while the firmware completed all 100.
    let (a, b) = (&devs[0].queue_sets[0], &devs[1].queue_sets[0]);
    let sa = &a.software.as_ref().unwrap().snapshot;
    assert_eq!(
        (
            sa.stats.tx_wqes,
            sa.stats.tx_doorbells,
            sa.stats.tx_signaled
        ),
        (FRAMES as u64, (FRAMES / BURST) as u64, 1)
    );
    let c = a.compare.iter().find(|c| c.key == "sq.completed").unwrap();
    assert_eq!(
        (c.software, c.firmware, c.status),
        (0, 100, CompareStatus::Lagging)
    );
    let c = a
        .compare
        .iter()
        .find(|c| c.key == "tx_cq.produced")
        .unwrap();
    assert_eq!(
        (c.software, c.firmware, c.status),
        (0, 1, CompareStatus::Lagging)
    );
    let sb = &b.software.as_ref().unwrap();
    assert_eq!(sb.snapshot.stats.rx_pkts, FRAMES as u64);
    let last = sb.rx_cqes[(sb.snapshot.rx_cqe_idx + 7) % 8].clone();
    let cqe = Cqe::decode(&debug_endpoint::unhex(&last).unwrap().try_into().unwrap());
    assert_eq!(cqe.op(), Some(CqeOpcode::RespSend), "{cqe}");
    assert_eq!((cqe.strides(), cqe.mpwrq_bytes()), (1, LEN as u32), "{cqe}");

    // Whole rings on request: decodable descriptors.
    let devs: Vec<DeviceView> = serde_json::from_value(rings["devices"].clone()).unwrap();
    let r = devs[0].queue_sets[0]
        .software
        .as_ref()
        .unwrap()
        .rings
        .as_ref()
        .unwrap();
    assert_eq!(r.sq.hex.len(), 128);
    let w = decode_send_wqe(&r.sq.entry(0).unwrap()).unwrap();
    assert_eq!(WqeOpcode::from_raw(w.opcode), Some(WqeOpcode::Send));
    assert_eq!((w.sqn, w.wqe_index), (a.ids.sqn, 0));
    assert_eq!(
        w.data.iter().map(|d| d.byte_count as usize).sum::<usize>()
            + w.eth.as_ref().unwrap().2.len() / 2,
        LEN
    );
    let tx = Cqe::decode(&r.tx_cq.entry(0).unwrap().try_into().unwrap());
    assert_eq!((tx.op(), tx.wqe_counter), (Some(CqeOpcode::Req), 63));
    let rq = decode_mprq_wqe(&r.rq.entry(0).unwrap()).unwrap();
    assert_eq!(rq.buffer.byte_count, 512 * 1024);

    for b in bufs.drain(..) {
        aa.free(b);
    }
    drop((qa, qb, aa));
    da.close().unwrap();
    assert!(socket.exists(), "the other device still has it open");
    db.close().unwrap();
    assert!(!socket.exists(), "removed with the last device");
    let _ = std::fs::remove_dir_all(&dir);
}
