//! What a second hardware review and an independent model fuzzer found
//! (issue 31): one test per finding where the device model now behaves
//! like the hardware, so that the driver's earlier behaviour fails here.

mod common;

use common::*;
use mlx5::Device;
use mlx5::prm::codes::{CmdStatus, Opcode, manage_pages_op_mod};
use mlx5_sim::{HcaState, Injection, NicConfig, Profile, SimNic};

fn nic_with(fab: &mlx5_sim::Fabric, i: u8, cfg: NicConfig) -> SimNic {
    SimNic::new(fab, NicConfig { mac: mac(i), ..cfg })
}

/// The command log entries of `op` (with their op_mod and slot).
fn logged(nic: &SimNic, op: Opcode) -> Vec<mlx5_sim::CommandRecord> {
    nic.command_log()
        .into_iter()
        .filter(|c| c.opcode == op as u16)
        .collect()
}

/// Sends one frame from `qa` to `qb` and checks it arrives.
fn echo_once(
    fab: &mlx5_sim::Fabric,
    da: &Device<mlx5_sim::SimBackend>,
    qa: &mut mlx5::QueueSet<mlx5_sim::SimBackend>,
    qb: &mut mlx5::QueueSet<mlx5_sim::SimBackend>,
    dst_mac: [u8; 6],
) {
    let mut a = allocator(da);
    let mut buf = a.alloc(256).unwrap();
    write_frame(&mut buf, qa, dst_mac, qb.config().udp_port, 7, 200);
    qa.tx_burst(&[frame(&buf, 200)]).unwrap();
    qa.tx_flush().unwrap();
    step(fab);
    assert_eq!(qb.rx_burst(), 1);
    qb.post_recvs(1);
    a.free(buf);
}

/// A limit on mapped DMA memory that bring-up and a queue set fit in, but
/// a request for [`HUGE_REQUEST`] more firmware pages does not.
const DMA_LIMIT: u64 = 96 << 20;
const HUGE_REQUEST: u32 = 100_000;

/// Items 4–6: a command held by firmware until a page request is met, when
/// the driver cannot meet it. The driver tells firmware (MANAGE_PAGES
/// CANT_GIVE), firmware fails the held command with NO_RESOURCES, and that
/// is the command's own result; the error answering the event is logged,
/// never returned in the command's place. The driver therefore never
/// abandons the slot while the hardware owns it (the model ignores a
/// doorbell for a held slot, and finishes the command it fetched), and the
/// next command works.
#[test]
fn a_command_held_for_pages_the_driver_cannot_give_fails_on_its_own_and_the_slot_is_not_reused() {
    let fab = fabric(3101);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            dma_lock_limit: Some(DMA_LIMIT),
            ..Default::default()
        },
    );
    let dev = open(&nic);
    nic.inject(Injection::CommandWaitsForPages(HUGE_REQUEST))
        .unwrap();
    let err = dev.create_queue_set(queue(5000)).unwrap_err();
    assert_eq!(
        err.command_status(),
        Some(CmdStatus::NoResources),
        "the held command's own failure, not the page request's: {err}"
    );
    let cant_give: Vec<_> = logged(&nic, Opcode::ManagePages)
        .into_iter()
        .filter(|c| c.op_mod == manage_pages_op_mod::CANNOT_GIVE)
        .collect();
    assert_eq!(cant_give.len(), 1, "firmware was told: CANT_GIVE");
    assert_eq!(cant_give[0].slot, 31, "from the pages slot");
    assert_eq!(dev.page_requests_refused(), 1);
    assert_eq!(dev.command_stats().service_errors, 0);
    assert_eq!(
        nic.stats().cmd_doorbells_ignored,
        0,
        "no doorbell for a held slot"
    );
    // Everything works afterwards.
    let peer = nic_with(&fab, 2, NicConfig::default());
    let dp = open(&peer);
    let mut qa = dev.create_queue_set(queue(5000)).unwrap();
    let mut qb = dp.create_queue_set(queue(6000)).unwrap();
    echo_once(&fab, &dev, &mut qa, &mut qb, peer.mac());
    drop((qa, qb));
    dev.close().unwrap();
    dp.close().unwrap();
    assert_eq!(nic.stats().pages_leaked, 0);
}

/// Item 6: a page request that arrives as an event while nothing else
/// runs, and cannot be met: CANT_GIVE, and `poll_events` (like the
/// datapath's `poll_control`) carries on; the firmware lowers its demand.
#[test]
fn a_page_request_the_driver_cannot_meet_is_answered_cant_give() {
    let fab = fabric(3102);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            dma_lock_limit: Some(DMA_LIMIT),
            ..Default::default()
        },
    );
    let dev = open(&nic);
    let held = nic.pages_held();
    nic.inject(Injection::PageRequest(HUGE_REQUEST as i32))
        .unwrap();
    dev.poll_events()
        .expect("an unmet page request is the firmware's to know, not the caller's error");
    assert_eq!(dev.page_requests_refused(), 1);
    assert!(
        logged(&nic, Opcode::ManagePages)
            .iter()
            .any(|c| c.op_mod == manage_pages_op_mod::CANNOT_GIVE && c.status == CmdStatus::Ok)
    );
    assert_eq!(nic.pages_held(), held, "nothing half-given");
    // A request that fits is still answered.
    nic.inject(Injection::PageRequest(10)).unwrap();
    dev.poll_events().unwrap();
    assert_eq!(nic.pages_held(), held + 10);
    dev.close().unwrap();
    assert_eq!(nic.stats().pages_leaked, 0);
}

/// Item 6: a GIVE the firmware itself refuses, for a page request that
/// came as an event, is dropped (Linux `give_pages` in event context): the
/// pages come back to the driver, and neither `poll_events` nor anything
/// else fails for it.
#[test]
fn a_give_the_firmware_refuses_for_an_event_is_dropped() {
    let fab = fabric(3117);
    let nic = nic_with(&fab, 1, NicConfig::default());
    let dev = open(&nic);
    let held = nic.pages_held();
    nic.inject(Injection::FailCommand(mlx5_sim::FailCommand {
        nth: 1,
        opcode: Some(Opcode::ManagePages as u16),
        status: CmdStatus::BadParameter,
        syndrome: 0x3100_0006,
    }))
    .unwrap();
    nic.inject(Injection::PageRequest(64)).unwrap();
    dev.poll_events()
        .expect("a refused GIVE for an event is not the caller's error");
    assert_eq!(nic.pages_held(), held);
    assert_eq!(
        dev.firmware_pages(),
        held,
        "the pages came back to the driver"
    );
    // The next request is answered normally.
    nic.inject(Injection::PageRequest(8)).unwrap();
    dev.poll_events().unwrap();
    assert_eq!(nic.pages_held(), held + 8);
    dev.close().unwrap();
    assert_eq!(nic.stats().pages_leaked, 0);
}

/// Item 7: after TEARDOWN_HCA firmware returns its pages when it has
/// released them, not at once; teardown keeps asking until none is left
/// (a budget that restarts on progress). A bring-up that fails before
/// INIT_HCA (ConnectX-4 has no striding RQ) also gets its boot pages
/// back before DISABLE_HCA.
#[test]
fn teardown_takes_every_page_back_even_when_firmware_releases_them_late() {
    let fab = fabric(3103);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            page_release_delay: std::time::Duration::from_millis(40),
            ..Default::default()
        },
    );
    let dev = open(&nic);
    assert!(nic.pages_held() > 0);
    dev.close().expect("every page came back");
    assert_eq!(nic.stats().pages_leaked, 0);
    assert_eq!(nic.pages_held(), 0);
    let takes = logged(&nic, Opcode::ManagePages)
        .iter()
        .filter(|c| c.op_mod == manage_pages_op_mod::TAKE)
        .count();
    assert!(takes > 1, "a TAKE that returned nothing was retried");

    let cx4 = nic_with(&fab, 2, Profile::ConnectX4Pf.config());
    let err = Device::open(cx4.backend(), device_config()).unwrap_err();
    assert!(
        matches!(err, mlx5::Error::MissingCapability { .. }),
        "{err}"
    );
    assert_eq!(cx4.hca_state(), HcaState::Disabled);
    assert_eq!(cx4.stats().pages_leaked, 0, "boot pages taken back");
}

/// Item 8: the slot kept for MANAGE_PAGES is the last one the firmware
/// reports, not a fixed 31; a queue of 8 entries works.
#[test]
fn the_pages_slot_is_the_last_one_the_firmware_reports() {
    let fab = fabric(3104);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            log_cmdq_size: 3,
            ..Default::default()
        },
    );
    let peer = nic_with(&fab, 2, NicConfig::default());
    let (dev, dp) = (open(&nic), open(&peer));
    let mut qa = dev.create_queue_set(queue(5000)).unwrap();
    let mut qb = dp.create_queue_set(queue(6000)).unwrap();
    echo_once(&fab, &dev, &mut qa, &mut qb, peer.mac());
    drop((qa, qb));
    dev.close().unwrap();
    dp.close().unwrap();
    let log = nic.command_log();
    assert!(log.iter().all(|c| c.slot < 8));
    assert!(
        log.iter()
            .filter(|c| c.opcode == Opcode::ManagePages as u16)
            .all(|c| c.slot == 7)
    );
    assert_eq!(nic.stats().cmd_doorbells_ignored, 0);
    assert_eq!(nic.stats().pages_leaked, 0);
}

/// Item 9: after a surprise removal every read is all-ones and no command
/// completes. The command poll loop reads the health buffer while it
/// waits, so the teardown commands fail at once instead of waiting the
/// command timeout (60 s) each.
#[test]
fn commands_fail_at_once_when_the_device_is_gone() {
    let fab = fabric(3105);
    let nic = nic_with(&fab, 1, NicConfig::default());
    let dev = open(&nic);
    let qs = dev.create_queue_set(queue(5000)).unwrap();
    nic.inject(Injection::SurpriseRemoval).unwrap();
    let t0 = fab.now_ns();
    drop(qs);
    let err = dev.close().unwrap_err();
    assert!(
        matches!(
            err,
            mlx5::Error::Unhealthy {
                why: mlx5::HealthProblem::Gone,
                ..
            }
        ),
        "{err}"
    );
    let waited = fab.now_ns() - t0;
    assert!(
        waited < 1_000_000_000,
        "teardown of a removed device took {waited} ns of device time"
    );
}

/// Items 1–2: the RX count turns stride positions into packets, so a frame
/// longer than a 1 KiB stride (two strides, or a filler CQE before it)
/// would become a phantom packet. The driver programs the vport MTU, a
/// frame length as the hardware counts it (FCS included, Linux
/// `mlx5e_set_mtu`): frames of 1 025–1 518 bytes steered to the queue set
/// are dropped by the port, as are runts; eRPC-size frames count one each.
/// The model's vport MTU starts at 1522 (a previous owner's Linux at MTU
/// 1500), so a driver that leaves it alone counts phantom packets here.
#[test]
fn frames_longer_than_a_stride_and_runts_never_reach_the_rx_count() {
    use mlx5_sim::DropReason;
    let fab = fabric(3106);
    let (na, nb) = (
        nic_with(&fab, 1, NicConfig::default()),
        nic_with(&fab, 2, NicConfig::default()),
    );
    let (da, db) = (open(&na), open(&nb));
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    let mut a = allocator(&da);
    let mut buf = a.alloc(2048).unwrap();
    let template = transport::wire::FrameTemplate {
        dst_mac: nb.mac(),
        src_mac: na.mac(),
        src_ip: std::net::Ipv4Addr::new(10, 0, 0, 1),
        dst_ip: std::net::Ipv4Addr::new(10, 0, 0, 2),
        src_port: 5000,
        dst_port: 6000,
    };
    for len in [1025, 1100, 1400, 1500, 1518] {
        let mut f = vec![0x5au8; len];
        transport::wire::build_headroom(&template, &mut f, len);
        fab.inject(nb.port(), &f);
    }
    for len in [20, 42, 59] {
        let mut f = vec![0u8; 60];
        transport::wire::build_headroom(&template, &mut f, 60);
        fab.inject(nb.port(), &f[..len]);
    }
    step(&fab);
    assert_eq!(qb.rx_burst(), 0, "no phantom packets");
    assert_eq!(nb.drops(DropReason::Oversize), 5);
    assert_eq!(nb.drops(DropReason::Runt), 3);
    // Full-size eRPC frames still count exactly one each.
    for seq in 0..3 {
        write_frame(&mut buf, &qa, nb.mac(), 6000, seq, mlx5::MAX_RX_FRAME);
        qa.tx_burst(&[frame(&buf, mlx5::MAX_RX_FRAME)]).unwrap();
        qa.tx_flush().unwrap();
    }
    step(&fab);
    assert_eq!(qb.rx_burst(), 3);
    for i in 0..3 {
        assert_eq!(read_seq(&qb, i, mlx5::MAX_RX_FRAME), i as u32);
    }
    qb.post_recvs(3);
    // The MTU holds on the way out too: a longer frame is a local length
    // error.
    write_frame(&mut buf, &qa, nb.mac(), 6000, 9, mlx5::MAX_RX_FRAME + 1);
    qa.tx_burst(&[frame(&buf, mlx5::MAX_RX_FRAME + 1)]).unwrap();
    assert!(matches!(qa.tx_flush(), Err(mlx5::Error::SqInError { .. })));
    a.free(buf);
}

/// Item 3: with the extended stride range (ConnectX-5 and later), a
/// striding WQE may not be smaller than the device's minimum WQE size
/// (general-2 cap `log_min_stride_wqe_sz`, 16 KiB by default, DPDK
/// `mlx5_devx_cmds.c`): 8 strides of 1 KiB are refused with a clear error
/// before the firmware sees them; 16 work.
#[test]
fn a_striding_wqe_below_the_minimum_size_is_refused_clearly() {
    let fab = fabric(3107);
    let nic = nic_with(&fab, 1, Profile::ConnectX6DxPf.config());
    let dev = open(&nic);
    assert_eq!(dev.info().log_min_stride_wqe_sz, 14);
    let small = mlx5::QueueConfig {
        rq_log_strides: 3,
        rq_log_wqes: 9,
        ..queue(5000)
    };
    let err = dev.create_queue_set(small).unwrap_err();
    assert!(
        matches!(&err, mlx5::Error::Config(m) if m.contains("minimum WQE size")),
        "{err}"
    );
    assert!(
        logged(&nic, Opcode::CreateRq).is_empty(),
        "refused before any CREATE_RQ"
    );
    let ok = mlx5::QueueConfig {
        rq_log_strides: 4,
        rq_log_wqes: 8,
        ..queue(5000)
    };
    drop(dev.create_queue_set(ok).expect("16 KiB WQEs"));
    dev.close().unwrap();
}

/// Item 11: MPFS exists only when the e-switch manager's L2 table has more
/// than one entry (Linux `mlx5_mpfs_init`); with `log_max_l2_table` 0 the
/// model refuses SET_L2_TABLE_ENTRY and filters nothing, and the driver
/// does not send it.
#[test]
fn mpfs_is_left_alone_when_the_l2_table_has_one_entry() {
    let fab = fabric(3108);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            log_max_l2_table: 0,
            ..Default::default()
        },
    );
    let peer = nic_with(&fab, 2, NicConfig::default());
    let (dev, dp) = (open(&nic), open(&peer));
    assert!(logged(&nic, Opcode::SetL2TableEntry).is_empty());
    let mut qa = dp.create_queue_set(queue(5000)).unwrap();
    let mut qb = dev.create_queue_set(queue(6000)).unwrap();
    echo_once(&fab, &dp, &mut qa, &mut qb, nic.mac());
    drop((qa, qb));
    dev.close().unwrap();
    dp.close().unwrap();
}

/// Item 12: a VF has few Q counters (here 2). Queue sets beyond them go
/// without one (out-of-buffer drops are then not counted) instead of
/// failing, as Linux mlx5e carries on when ALLOC_Q_COUNTER fails.
#[test]
fn queue_sets_beyond_the_q_counters_go_without_one() {
    let fab = fabric(3109);
    let nic = nic_with(&fab, 1, Profile::ConnectX5Vf.config());
    let dev = open(&nic);
    assert_eq!(dev.info().max_q_counters, 2);
    let sets: Vec<_> = (0..4)
        .map(|i| dev.create_queue_set(queue(5000 + i)).expect("queue set"))
        .collect();
    let ids: Vec<u32> = sets.iter().map(|q| q.snapshot().counter_set_id).collect();
    assert!(ids[0] != 0 && ids[1] != 0 && ids[0] != ids[1], "{ids:?}");
    assert_eq!(&ids[2..], &[0, 0]);
    for q in &sets {
        assert_eq!(q.query_hw().unwrap().out_of_buffer, 0);
    }
    drop(sets);
    dev.close().unwrap();
    assert_eq!(nic.objects().q_counters, 0);
}

/// Item 14: every capability group is read again after INIT_HCA (Linux
/// `mlx5_function_open`), and that reading is the one used: the model
/// gives a function its Q counters at INIT_HCA (`max_qp_cnt` reads 0
/// before), so a driver that kept the first reading would think it has
/// none.
#[test]
fn capabilities_are_read_again_after_init_hca() {
    let fab = fabric(3110);
    let nic = nic_with(&fab, 1, NicConfig::default());
    let dev = open(&nic);
    let log = nic.command_log();
    let init = log
        .iter()
        .position(|c| c.opcode == Opcode::InitHca as u16)
        .unwrap();
    let after: Vec<u16> = log[init..]
        .iter()
        .filter(|c| c.opcode == Opcode::QueryHcaCap as u16)
        .map(|c| c.op_mod >> 1)
        .collect();
    assert!(after.contains(&0) && after.contains(&1), "{after:?}");
    assert!(dev.info().max_q_counters > 0);
    let qs = dev.create_queue_set(queue(5000)).unwrap();
    assert_ne!(qs.snapshot().counter_set_id, 0);
    drop(qs);
    dev.close().unwrap();
}

/// Item 16: with `wqe_inline_mode` VPORT_CONTEXT the vport context's
/// `min_wqe_inline_mode` means something only with `eth_virt`; DPDK
/// otherwise falls back by device id (none on a ConnectX-5). A ConnectX-5
/// without `eth_virt` whose vport context holds a stale IP requirement
/// comes up without inlining, and its frames go out.
#[test]
fn inline_mode_comes_from_the_vport_context_only_with_eth_virt() {
    let fab = fabric(3111);
    let stale = nic_with(
        &fab,
        1,
        NicConfig {
            eth_virt: false,
            vport_min_inline: 2,
            ..Default::default()
        },
    );
    let peer = nic_with(&fab, 2, NicConfig::default());
    let (dev, dp) = (open(&stale), open(&peer));
    assert_eq!(dev.info().inline_mode, mlx5::InlineMode::None);
    let mut qa = dev.create_queue_set(queue(5000)).unwrap();
    let mut qb = dp.create_queue_set(queue(6000)).unwrap();
    assert!(!qa.inlines_l2());
    echo_once(&fab, &dev, &mut qa, &mut qb, peer.mac());
    drop((qa, qb));
    // With eth_virt the vport context is followed (L2 here).
    let l2 = nic_with(
        &fab,
        3,
        NicConfig {
            vport_min_inline: 1,
            ..Default::default()
        },
    );
    let d3 = open(&l2);
    assert_eq!(d3.info().inline_mode, mlx5::InlineMode::L2);
    d3.close().unwrap();
    dev.close().unwrap();
    dp.close().unwrap();
}

/// Item 15: the link comes up some time after INIT_HCA (the model: 2 ms;
/// real links take longer), and frames sent before are lost. Bring-up
/// waits for the vport state to read up, so the first frame arrives; a
/// link that stays down is a clear timeout.
#[test]
fn bring_up_waits_for_the_link() {
    let fab = fabric(3112);
    let cfg = NicConfig {
        link_up_delay: std::time::Duration::from_millis(30),
        ..Default::default()
    };
    let (na, nb) = (nic_with(&fab, 1, cfg.clone()), nic_with(&fab, 2, cfg));
    let (da, db) = (open(&na), open(&nb));
    assert_eq!(da.info().vport_state, 1);
    let mut qa = da.create_queue_set(queue(5000)).unwrap();
    let mut qb = db.create_queue_set(queue(6000)).unwrap();
    echo_once(&fab, &da, &mut qa, &mut qb, nb.mac());
    assert_eq!(nb.drops(mlx5_sim::DropReason::LinkDown), 0);
    drop((qa, qb));
    da.close().unwrap();
    db.close().unwrap();

    let dead = nic_with(&fab, 3, NicConfig::default());
    fab.set_link_faults(
        dead.port(),
        mlx5_sim::LinkFaults {
            down: true,
            ..Default::default()
        },
    );
    let cfg = mlx5::DeviceConfig {
        link_up_timeout: std::time::Duration::from_millis(50),
        ..device_config()
    };
    let err = Device::open(dead.backend(), cfg).unwrap_err();
    assert!(
        matches!(&err, mlx5::Error::Timeout { what, .. } if what.contains("link up")),
        "{err}"
    );
    assert_eq!(dead.hca_state(), HcaState::Disabled, "torn down again");
    assert_eq!(dead.stats().pages_leaked, 0);
}

/// Items 17 and 7: a BlueField ECPF says so in the init segment
/// (`embedded_cpu`); the driver names itself as one in ENABLE/DISABLE_HCA
/// and QUERY_PAGES (the model refuses otherwise), gives the host PF the
/// pages firmware asks for it (function 0, `ec_function` 0), and at
/// teardown takes every page back for the function it was given for.
#[test]
fn a_bluefield_ecpf_names_itself_and_its_host_pf_pages_come_back() {
    let fab = fabric(3113);
    let nic = nic_with(&fab, 1, Profile::BlueField2Ecpf.config());
    let dev = open(&nic);
    assert!(dev.info().embedded_cpu);
    assert_eq!(dev.info().func, mlx5::FuncId { ec: true, id: 0 });
    let host = nic.config().host_pf_pages as usize;
    assert!(host > 0);
    assert_eq!(dev.firmware_pages(), nic.pages_held());
    let own = nic.config().boot_pages + nic.config().init_pages + nic.config().regular_pages;
    assert_eq!(
        nic.pages_held(),
        own as usize + host,
        "the host PF's pages too"
    );
    dev.close().unwrap();
    assert_eq!(nic.pages_held(), 0);
    assert_eq!(
        nic.stats().pages_leaked,
        0,
        "each page taken back for its function"
    );
    let takes: Vec<_> = logged(&nic, Opcode::ManagePages)
        .into_iter()
        .filter(|c| c.op_mod == manage_pages_op_mod::TAKE && c.status == CmdStatus::Ok)
        .collect();
    assert!(takes.len() >= 2, "TAKE for the ECPF and for the host PF");
}

/// Item 10: the PF decides what a VF gets. It ignores an untrusted VF's
/// promiscuous request, so the driver refuses `promiscuous` on a VF
/// unless told the PF trusts it; trusted, the PF's e-switch passes
/// unicast for other MACs to the VF.
#[test]
fn a_vf_refuses_promiscuous_mode_unless_the_pf_trusts_it() {
    use mlx5_sim::{DropReason, VfPolicy};
    let fab = fabric(3114);
    let untrusted = nic_with(&fab, 1, Profile::ConnectX5Vf.config());
    let cfg = mlx5::DeviceConfig {
        promiscuous: true,
        ..device_config()
    };
    let err = Device::open(untrusted.backend(), cfg.clone()).unwrap_err();
    assert!(
        matches!(&err, mlx5::Error::Config(m) if m.contains("trust")),
        "{err}"
    );
    assert_eq!(untrusted.hca_state(), HcaState::Disabled);

    let trusted = nic_with(
        &fab,
        2,
        NicConfig {
            vf_policy: VfPolicy {
                trusted: true,
                ..VfPolicy::default()
            },
            ..Profile::ConnectX5Vf.config()
        },
    );
    let dv = Device::open(
        trusted.backend(),
        mlx5::DeviceConfig {
            vf_trusted: true,
            ..cfg
        },
    )
    .expect("a trusted VF may be promiscuous");
    let pf = nic_with(&fab, 3, NicConfig::default());
    let dp = open(&pf);
    let mut qv = dv.create_queue_set(queue(6000)).unwrap();
    let mut qp = dp.create_queue_set(queue(5000)).unwrap();
    // Unicast for another MAC passes the PF's e-switch (and then misses
    // the VF's steering, which matches its own MAC).
    let mut a = allocator(&dp);
    let mut buf = a.alloc(256).unwrap();
    write_frame(&mut buf, &qp, mac(0x77), 6000, 1, 128);
    qp.tx_burst(&[frame(&buf, 128)]).unwrap();
    qp.tx_flush().unwrap();
    step(&fab);
    assert_eq!(trusted.drops(DropReason::Eswitch), 0);
    assert_eq!(qv.rx_burst(), 0);
    // Its own MAC arrives.
    echo_once(&fab, &dp, &mut qp, &mut qv, trusted.mac());
    a.free(buf);
}

/// Item 10: the PF copies a VF's unicast list into its forwarding table
/// asynchronously; the driver programs the list before it waits for the
/// link (so the copy overlaps the wait) and reads it back. The first frame
/// after bring-up arrives.
#[test]
fn the_vf_address_list_is_set_before_the_link_wait_and_read_back() {
    use mlx5_sim::VfPolicy;
    let fab = fabric(3115);
    let vf = nic_with(
        &fab,
        1,
        NicConfig {
            vf_policy: VfPolicy {
                copy_delay: std::time::Duration::from_millis(1),
                ..VfPolicy::default()
            },
            link_up_delay: std::time::Duration::from_millis(5),
            ..Profile::ConnectX5Vf.config()
        },
    );
    let pf = nic_with(&fab, 2, NicConfig::default());
    let (dv, dp) = (open(&vf), open(&pf));
    let log = vf.command_log();
    let set = log
        .iter()
        .rposition(|c| c.opcode == Opcode::ModifyNicVportContext as u16)
        .unwrap();
    assert!(
        log[set..]
            .iter()
            .any(|c| c.opcode == Opcode::QueryNicVportContext as u16),
        "the list is read back"
    );
    let link = log
        .iter()
        .rposition(|c| c.opcode == Opcode::QueryVportState as u16)
        .unwrap();
    assert!(set < link, "the list is set before the link wait ends");
    let mut qv = dv.create_queue_set(queue(6000)).unwrap();
    let mut qp = dp.create_queue_set(queue(5000)).unwrap();
    echo_once(&fab, &dp, &mut qp, &mut qv, vf.mac());
}

/// Item 10 (model): with spoof checking on, the PF passes only frames
/// whose source is the VF's admin MAC, and nothing from a VF without one;
/// the driver warns about that when it has to make a MAC up.
#[test]
fn spoof_checking_drops_a_vf_without_an_admin_mac() {
    use mlx5_sim::{DropReason, VfPolicy};
    let fab = fabric(3116);
    let policy = VfPolicy {
        spoofchk: true,
        ..VfPolicy::default()
    };
    let nameless = SimNic::new(
        &fab,
        NicConfig {
            mac: [0; 6],
            vf_policy: policy,
            ..Profile::ConnectX5Vf.config()
        },
    );
    let named = nic_with(
        &fab,
        2,
        NicConfig {
            vf_policy: policy,
            ..Profile::ConnectX5Vf.config()
        },
    );
    let pf = nic_with(&fab, 3, NicConfig::default());
    let (dn, dm, dp) = (open(&nameless), open(&named), open(&pf));
    let mut qn = dn.create_queue_set(queue(5001)).unwrap();
    let mut qm = dm.create_queue_set(queue(5002)).unwrap();
    let mut qp = dp.create_queue_set(queue(6000)).unwrap();
    echo_once(&fab, &dm, &mut qm, &mut qp, pf.mac());
    let mut a = allocator(&dn);
    let mut buf = a.alloc(256).unwrap();
    write_frame(&mut buf, &qn, pf.mac(), 6000, 1, 128);
    qn.tx_burst(&[frame(&buf, 128)]).unwrap();
    qn.tx_flush().unwrap();
    step(&fab);
    assert_eq!(qp.rx_burst(), 0);
    assert_eq!(nameless.drops(DropReason::Eswitch), 1);
    a.free(buf);
}
