//! Raw-command tests of bring-up, teardown, pages, firmware timing and
//! device-side injection.

mod common;

use std::time::Duration;

use common::*;
use mlx5::hw::HwBackend;
use mlx5::prm::codes::{CmdStatus, EventType, Opcode};
use mlx5_sim::{FailCommand, HcaState, Injection, NicConfig, PAGE_FILL};

#[test]
fn full_bringup_datapath_and_teardown_return_every_page_and_object() {
    let fab = det_fabric(1);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    assert_eq!(h.nic.hca_state(), HcaState::Initialized);
    // boot + init + regular (asked for with a page-request EQE).
    let c = h.nic.config().clone();
    let all = (c.boot_pages + c.init_pages + c.regular_pages) as usize;
    assert!(all > 1000, "realistic page counts: {all}");
    assert_eq!(h.nic.pages_held(), all);
    assert_eq!(h.fw_given.len(), all);
    // The firmware scribbles over the pages it holds.
    let first = *h.fw_given.first().unwrap();
    assert_eq!(h.fw_page_bytes(first, 4), vec![PAGE_FILL; 4]);
    let p = h.build_path(PathCfg::default());
    let o = h.nic.objects();
    assert_eq!((o.cqs, o.sqs, o.rqs, o.tirs, o.tises), (2, 1, 1, 1, 1));
    assert_eq!((o.flow_tables, o.flow_groups, o.flow_entries), (1, 1, 1));
    assert!(o.root_set);
    h.destroy_path(p);
    h.teardown();
    assert_eq!(h.nic.hca_state(), HcaState::Disabled);
    assert_eq!(h.nic.pages_held(), 0);
    assert!(h.fw_given.is_empty());
    assert_eq!(h.nic.objects().total(), 0);
    let s = h.nic.stats();
    assert_eq!(s.pages_leaked, 0);
    assert_eq!(s.objects_leaked, 0);
    assert_eq!(s.commands_failed, 0, "{:#?}", h.nic.command_log());
    assert_eq!(s.dma.faults, 0);
    // Every command is in the log, in order, all OK.
    let log = h.nic.command_log();
    assert_eq!(log[0].opcode, Opcode::EnableHca as u16);
    assert!(
        log.iter()
            .all(|r| r.status == CmdStatus::Ok && r.reason.is_empty())
    );
    assert_eq!(log.last().unwrap().opcode, Opcode::DisableHca as u16);
}

#[test]
fn initializing_is_set_again_while_the_firmware_takes_the_cmdq() {
    let fab = det_fabric(2);
    let h = Host::new(
        &fab,
        NicConfig {
            reset_init_delay: Duration::from_millis(2),
            fw_init_delay: Duration::from_millis(5),
            ..Default::default()
        },
    );
    h.nic
        .inject(Injection::InitDelay(Duration::from_millis(3)))
        .unwrap();
    assert_ne!(h.hw.read32(0x1fc) & (1 << 31), 0, "set after reset");
    fab.advance(Duration::from_millis(4));
    assert_ne!(h.hw.read32(0x1fc) & (1 << 31), 0, "2 ms + 3 ms injected");
    fab.advance(Duration::from_millis(1));
    assert_eq!(
        h.hw.read32(0x1fc) & (1 << 31),
        0,
        "clear: ready for the command queue"
    );
    let iova = h.cmdq.iova();
    h.hw.write32(0x10, (iova >> 32) as u32);
    h.hw.write32(0x14, iova as u32);
    assert_eq!(h.hw.read32(0x10), (iova >> 32) as u32);
    assert_eq!(h.hw.read32(0x14) & !0xfff, iova as u32 & !0xfff);
    fab.advance(Duration::from_millis(7));
    assert_ne!(h.hw.read32(0x1fc) & (1 << 31), 0, "5 ms + 3 ms injected");
    // A doorbell while initializing is ignored.
    h.hw.write32(0x18, 1);
    assert_eq!(h.nic.stats().cmd_doorbells_ignored, 1);
    fab.advance(Duration::from_millis(1));
    assert_eq!(h.hw.read32(0x1fc) & (1 << 31), 0);
}

#[test]
fn init_segment_identity_timer_and_health() {
    let fab = det_fabric(3);
    let h = Host::new(&fab, NicConfig::default());
    assert_eq!(h.hw.read32(0x0), (35 << 16) | 16);
    assert_eq!(h.hw.read32(0x4), (5 << 16) | 2000);
    let mut id = [0u8; 4];
    h.hw.config_read(0, &mut id).unwrap();
    assert_eq!(id, [0xb3, 0x15, 0x17, 0x10]);
    let c0 = h.hw.read32(0x1010);
    let t0 = ((h.hw.read32(0x1000) as u64) << 32) | h.hw.read32(0x1004) as u64;
    h.hw.wait(Duration::from_millis(3));
    let c1 = h.hw.read32(0x1010);
    let t1 = ((h.hw.read32(0x1000) as u64) << 32) | h.hw.read32(0x1004) as u64;
    assert_ne!(c0, c1, "health counter advances");
    assert_eq!(
        t1 - t0,
        3_000_000,
        "internal timer in ns of the fabric clock"
    );
    h.nic.inject(Injection::StopHealthCounter).unwrap();
    let c2 = h.hw.read32(0x1010);
    h.hw.wait(Duration::from_millis(10));
    assert_eq!(h.hw.read32(0x1010), c2, "stopped");
    h.nic.inject(Injection::ResumeHealthCounter).unwrap();
    h.hw.wait(Duration::from_millis(2));
    assert_ne!(h.hw.read32(0x1010), c2);
    assert_eq!(h.hw.read32(0x23c) >> 16 & 0xff, 0, "healthy");
    h.nic.inject(Injection::HealthSyndrome(0x10)).unwrap();
    assert_eq!(h.hw.read32(0x23c) >> 16 & 0xff, 0x10);
    h.nic.inject(Injection::SurpriseRemoval).unwrap();
    assert_eq!(h.hw.read32(0x230), 0xffff_ffff);
}

#[test]
fn no_dma_before_bus_mastering() {
    let fab = det_fabric(4);
    let mut h = Host::new(&fab, NicConfig::default());
    h.wait_ready();
    let iova = h.cmdq.iova();
    h.hw.write32(0x10, (iova >> 32) as u32);
    h.hw.write32(0x14, iova as u32);
    h.wait_ready();
    h.submit(0, &simple(Opcode::EnableHca, 0, 0), 16, &mut |_, _| {});
    assert!(h.busy(0), "the entry could not be fetched");
    let s = h.nic.stats();
    assert!(s.dma.blocked_no_bus_master >= 1);
    assert_eq!(s.commands, 0);
    h.hw.config_write(4, &6u16.to_le_bytes()).unwrap();
    assert!(h.nic.bus_master());
    h.hw.write32(0x18, 1);
    assert!(!h.busy(0));
    assert!(h.collect(0, 16).ok());
}

#[test]
fn page_request_and_page_return_through_eqes() {
    let fab = det_fabric(5);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    assert_eq!(h.query_pages(3), 0, "regular demand satisfied");
    h.nic.inject(Injection::PageRequest(5)).unwrap();
    assert_eq!(
        h.query_pages(3),
        5,
        "op_mod 3 shows the outstanding request"
    );
    let before = h.nic.pages_held();
    h.service_eq();
    assert_eq!(h.nic.pages_held(), before + 5);
    h.nic.inject(Injection::PageRequest(-6)).unwrap();
    assert_eq!(h.query_pages(3), -6);
    h.service_eq();
    assert_eq!(h.nic.pages_held(), before - 1);
    assert_eq!(h.fw_given.len(), before - 1);
    // Nothing more to take while initialized.
    assert_eq!(h.take_pages(10, 0), 0);
}

#[test]
fn command_waits_for_pages_until_the_driver_gives_them() {
    let fab = det_fabric(6);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    let before = h.nic.pages_held();
    h.nic.inject(Injection::CommandWaitsForPages(3)).unwrap();
    // Submit without servicing the EQ: the command stays with hardware.
    h.submit(0, &simple(Opcode::AllocPd, 0, 0), 16, &mut |_, _| {});
    assert!(h.busy(0));
    h.hw.wait(Duration::from_millis(10));
    assert!(h.busy(0));
    // The polling driver reads the page request and answers from slot 31.
    h.service_eq();
    assert!(!h.busy(0));
    let r = h.collect(0, 16);
    assert!(r.ok());
    assert_ne!(be32(&r.out, 8) & 0xffffff, 0);
    assert_eq!(h.nic.pages_held(), before + 3);

    // "Cannot give" fails the held command with NO_RESOURCES.
    h.nic.inject(Injection::CommandWaitsForPages(2)).unwrap();
    h.submit(0, &simple(Opcode::AllocPd, 0, 0), 16, &mut |_, _| {});
    assert!(h.busy(0));
    let cannot = simple(Opcode::ManagePages, 0, 0);
    assert!(h.exec_slot(SLOT_PAGES, &cannot, 16).ok());
    let r = h.collect(0, 16);
    assert_eq!(r.status, CmdStatus::NoResources as u8);
}

/// Issue 31 item 5: a command held for pages is the one the firmware
/// fetched. If software rewrites the entry meanwhile (and rings again), the
/// doorbell is ignored and the held command, not the new one, completes.
#[test]
fn a_held_command_finishes_as_fetched_even_if_the_entry_is_rewritten() {
    let fab = det_fabric(31);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    let uars = |h: &Host| {
        h.nic
            .command_log()
            .iter()
            .filter(|c| c.opcode == Opcode::AllocUar as u16)
            .count()
    };
    let uars_before = uars(&h);
    h.nic.inject(Injection::CommandWaitsForPages(3)).unwrap();
    h.submit(0, &simple(Opcode::AllocPd, 0, 0), 16, &mut |_, _| {});
    assert!(h.busy(0));
    let ignored = h.nic.stats().cmd_doorbells_ignored;
    h.submit(0, &simple(Opcode::AllocUar, 0, 0), 16, &mut |_, _| {});
    assert_eq!(h.nic.stats().cmd_doorbells_ignored, ignored + 1);
    h.service_eq();
    assert!(!h.busy(0));
    assert!(h.collect(0, 16).ok());
    let last = h
        .nic
        .command_log()
        .into_iter()
        .rfind(|c| c.slot == 0)
        .unwrap();
    assert_eq!(last.opcode, Opcode::AllocPd as u16, "{last}");
    assert_eq!(uars(&h), uars_before, "the rewritten entry never ran");
}

#[test]
fn injected_command_failure_hits_the_nth_matching_command() {
    let fab = det_fabric(7);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    h.nic
        .inject(Injection::FailCommand(FailCommand {
            nth: 2,
            opcode: Some(Opcode::AllocPd as u16),
            status: CmdStatus::LimitsExceeded,
            syndrome: 0xdead_beef,
        }))
        .unwrap();
    assert!(h.exec(&simple(Opcode::Nop, 0, 0), 16).ok());
    assert!(h.exec(&simple(Opcode::AllocPd, 0, 0), 16).ok());
    let r = h.exec(&simple(Opcode::AllocPd, 0, 0), 16);
    assert_eq!(
        (r.status, r.syndrome),
        (CmdStatus::LimitsExceeded as u8, 0xdead_beef)
    );
    assert!(h.nic.command_log().last().unwrap().injected);
    assert!(h.exec(&simple(Opcode::AllocPd, 0, 0), 16).ok());
}

#[test]
fn command_completion_events_when_subscribed() {
    let fab = det_fabric(8);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    let uar = h.alloc_uar();
    let mut eq = h.create_eq(uar, 4, 1 << EventType::Command as u8);
    h.exec(&simple(Opcode::Nop, 0, 0), 16);
    let owner = eq.mem.load_u8_acquire(63) & 1;
    assert_eq!(owner, 0, "first pass writes owner 0");
    let mut b = [0u8; 64];
    eq.mem.read(0, &mut b);
    let e = mlx5::prm::cqe::EqeDecoded::decode(&b);
    assert_eq!(e.command_vector(), Some(1));
    eq.ci = 1;
    let q = h.nic.queues();
    assert!(q.eqs.iter().any(|i| i.eqn == eq.eqn && i.producer >= 1));
}

#[test]
fn kernel_style_pre_init_wait_is_possible_when_configured() {
    let fab = det_fabric(9);
    let mut h = Host::new(
        &fab,
        NicConfig {
            init_requires_cmdq: false,
            reset_init_delay: Duration::from_millis(4),
            ..Default::default()
        },
    );
    assert_ne!(h.hw.read32(0x1fc) & (1 << 31), 0);
    h.hw.wait(Duration::from_millis(4));
    assert_eq!(
        h.hw.read32(0x1fc) & (1 << 31),
        0,
        "clears without a cmdq address"
    );
    h.init_cmdq();
    assert!(h.exec(&simple(Opcode::EnableHca, 0, 0), 16).ok());
}

/// vfio-pci resets the function at open; until `initializing` clears the
/// firmware does not take the command queue address (the kernel waits
/// before `mlx5_cmd_init` for this reason).
#[test]
fn command_queue_address_is_ignored_while_coming_out_of_reset() {
    let fab = det_fabric(10);
    let h = Host::new(
        &fab,
        NicConfig {
            reset_init_delay: Duration::from_millis(20),
            fw_init_delay: Duration::from_millis(3),
            ..Default::default()
        },
    );
    let iova = h.cmdq.iova();
    let program = || {
        h.hw.write32(0x10, (iova >> 32) as u32);
        h.hw.write32(0x14, iova as u32);
    };
    program();
    assert_eq!(h.hw.read32(0x10), 0, "high address dropped");
    assert_eq!(h.hw.read32(0x14) & !0xfff, 0, "low address dropped");
    assert_eq!(h.nic.stats().cmdq_writes_ignored, 2);
    h.hw.write32(0x18, 1);
    assert_eq!(h.nic.stats().cmd_doorbells_ignored, 1, "no command queue");
    h.wait_ready();
    assert!(fab.now_ns() >= 20_000_000);
    program();
    assert_eq!(h.hw.read32(0x14) & !0xfff, iova as u32 & !0xfff);
    assert_ne!(
        h.hw.read32(0x1fc) & (1 << 31),
        0,
        "set again while the firmware takes the command queue"
    );
    h.wait_ready();
    assert_eq!(h.nic.stats().cmdq_writes_ignored, 2);
}
