//! Every class of bad command input gets its PRM status, a non-zero
//! syndrome and a logged reason.

mod common;

use common::*;
use mlx5::hw::HwBackend;
use mlx5::prm::ViewMut;
use mlx5::prm::cmd::*;
use mlx5::prm::cmdq::CmdLayout;
use mlx5::prm::codes::{CmdStatus, DeliveryStatus, Opcode};
use mlx5::prm::ctx::*;
use mlx5_sim::{Limits, NicConfig, Why};

fn up(seed: u64) -> (mlx5_sim::Fabric, Host) {
    let fab = det_fabric(seed);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    (fab, h)
}

fn expect(h: &mut Host, inp: &[u8], outlen: usize, status: CmdStatus, why: Why) {
    let r = h.exec(inp, outlen);
    assert_eq!(r.delivery, 0);
    let last = h.nic.command_log().last().cloned().unwrap();
    assert_eq!(r.status, status as u8, "{last}");
    assert_ne!(r.syndrome, 0);
    assert_eq!(last.status, status);
    assert_eq!(last.syndrome, r.syndrome);
    assert_eq!((r.syndrome >> 8) & 0xff, why as u32, "{last}");
    assert!(!last.reason.is_empty());
}

#[test]
fn unknown_and_unmodeled_opcodes() {
    let (_f, mut h) = up(1);
    expect(
        &mut h,
        &simple_raw(0x0777),
        16,
        CmdStatus::BadOpcode,
        Why::BadOpcode,
    );
    expect(
        &mut h,
        &simple(Opcode::QueryAdapter, 0, 0),
        16,
        CmdStatus::BadOpcode,
        Why::BadOpcode,
    );
}

fn simple_raw(op: u16) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[0..2].copy_from_slice(&op.to_be_bytes());
    v
}

#[test]
fn input_and_output_lengths() {
    let (_f, mut h) = up(2);
    // CREATE_CQ needs 0x110 input bytes.
    let mut short = simple(Opcode::CreateCq, 0, 0);
    short.resize(0x100, 0);
    expect(
        &mut h,
        &short,
        16,
        CmdStatus::BadInputLength,
        Why::InputLength,
    );
    // QUERY_HCA_CAP needs 0x1010 output bytes.
    expect(
        &mut h,
        &simple(Opcode::QueryHcaCap, 1, 0),
        0x100,
        CmdStatus::BadOutputLength,
        Why::OutputLength,
    );
    // CREATE_EQ of 256 entries needs 4 PAS entries.
    let uar = h.uar_eq;
    let inp = input::<CreateEqIn>(Opcode::CreateEq, 0, 0x110 + 8, |v| {
        v.sub(CreateEqIn::EQC)
            .set(Eqc::LOG_EQ_SIZE, 8)
            .set(Eqc::UAR_PAGE, u64::from(uar));
    });
    expect(
        &mut h,
        &inp,
        16,
        CmdStatus::BadInputLength,
        Why::InputLength,
    );
}

#[test]
fn out_of_range_and_unsupported_fields() {
    let (_f, mut h) = up(3);
    let (uar, eqn) = (h.uar_eq, h.eq.as_ref().unwrap().eqn);
    let mem = h.alloc(4096);
    let (_, dbr) = h.dbr();
    let cq = |log: u64, oi: u64, cc: u64| {
        let mut i = input::<CreateCqIn>(Opcode::CreateCq, 0, 0x118, |v| {
            v.sub(CreateCqIn::CQC)
                .set(Cqc::LOG_CQ_SIZE, log)
                .set(Cqc::OI, oi)
                .set(Cqc::CC, cc)
                .set(Cqc::UAR_PAGE, u64::from(uar))
                .set(Cqc::C_EQN, u64::from(eqn))
                .set(Cqc::DBR_ADDR, dbr);
        });
        i[0x110..0x118].copy_from_slice(&mem.iova().to_be_bytes());
        i
    };
    expect(
        &mut h,
        &cq(23, 0, 0),
        16,
        CmdStatus::BadParameter,
        Why::OutOfRange,
    );
    expect(
        &mut h,
        &cq(3, 0, 1),
        16,
        CmdStatus::BadParameter,
        Why::NotSupported,
    );
    assert!(h.exec(&cq(3, 1, 0), 16).ok());
    // Misaligned doorbell record.
    let mut bad = cq(3, 0, 0);
    {
        let mut v = ViewMut::<CreateCqIn>::new(&mut bad).unwrap();
        v.sub(CreateCqIn::CQC).set(Cqc::DBR_ADDR, dbr + 4);
    }
    expect(&mut h, &bad, 16, CmdStatus::BadParameter, Why::Alignment);
    // PAS entry that is not mapped.
    let mut bad = cq(3, 0, 0);
    bad[0x110..0x118].copy_from_slice(&0x42_0000_0000u64.to_be_bytes());
    expect(&mut h, &bad, 16, CmdStatus::BadParameter, Why::Unmapped);
    // QUERY_PAGES op_mod 7.
    expect(
        &mut h,
        &simple(Opcode::QueryPages, 7, 0),
        16,
        CmdStatus::BadParameter,
        Why::OpMod,
    );
    // Capability type 4 (RoCE) is not modeled.
    expect(
        &mut h,
        &simple(Opcode::QueryHcaCap, 4 << 1 | 1, 0),
        0x1010,
        CmdStatus::BadParameter,
        Why::NotSupported,
    );
    // Indirect TIR.
    let td = h.td;
    let tir = input::<CreateTirIn>(Opcode::CreateTir, 0, 0, |v| {
        v.sub(CreateTirIn::CTX)
            .set(Tirc::DISP_TYPE, 1)
            .set(Tirc::TRANSPORT_DOMAIN, u64::from(td));
    });
    expect(&mut h, &tir, 16, CmdStatus::BadParameter, Why::NotSupported);
    // Match on a field the model cannot evaluate (misc parameters).
    let table = h.create_flow_table(4);
    let g = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0, |v| {
        v.set(CreateFlowGroupIn::TABLE_ID, u64::from(table))
            .set(CreateFlowGroupIn::END_FLOW_INDEX, 3)
            .set(CreateFlowGroupIn::MATCH_CRITERIA_ENABLE, 2);
    });
    expect(&mut h, &g, 16, CmdStatus::BadParameter, Why::NotSupported);
    // Overlapping groups.
    h.create_flow_group(table, 0, 7);
    let g = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0, |v| {
        v.set(CreateFlowGroupIn::TABLE_ID, u64::from(table))
            .set(CreateFlowGroupIn::START_FLOW_INDEX, 4)
            .set(CreateFlowGroupIn::END_FLOW_INDEX, 9);
    });
    expect(&mut h, &g, 16, CmdStatus::BadParameter, Why::Mismatch);
}

#[test]
fn missing_objects_and_other_functions_objects_are_bad_resource() {
    let fab = det_fabric(4);
    let mut a = Host::with_mac(&fab, MAC_A);
    let mut b = Host::with_mac(&fab, MAC_B);
    a.bring_up();
    b.bring_up();
    let b_cq = b.create_cq(3, false);
    // A number nobody owns.
    expect(
        &mut a,
        &simple(Opcode::DestroyCq, 0, 0x00ab_cdef),
        16,
        CmdStatus::BadResource,
        Why::NoObject,
    );
    // B's CQ, B's PD, B's EQ through A.
    expect(
        &mut a,
        &simple(Opcode::QueryCq, 0, b_cq.cqn),
        0x110,
        CmdStatus::BadResource,
        Why::OtherFunction,
    );
    expect(
        &mut a,
        &simple(Opcode::DeallocPd, 0, b.pd),
        16,
        CmdStatus::BadResource,
        Why::OtherFunction,
    );
    let b_eqn = b.eq.as_ref().unwrap().eqn;
    expect(
        &mut a,
        &simple(Opcode::QueryEq, 0, b_eqn),
        0x110,
        CmdStatus::BadResource,
        Why::OtherFunction,
    );
    // A CQ on B's EQ.
    let mem = a.alloc(4096);
    let (_, dbr) = a.dbr();
    let uar = a.uar_eq;
    let mut inp = input::<CreateCqIn>(Opcode::CreateCq, 0, 0x118, |v| {
        v.sub(CreateCqIn::CQC)
            .set(Cqc::LOG_CQ_SIZE, 2)
            .set(Cqc::UAR_PAGE, u64::from(uar))
            .set(Cqc::C_EQN, u64::from(b_eqn))
            .set(Cqc::DBR_ADDR, dbr);
    });
    inp[0x110..0x118].copy_from_slice(&mem.iova().to_be_bytes());
    expect(&mut a, &inp, 16, CmdStatus::BadResource, Why::OtherFunction);
    // An SQ on B's TIS.
    let b_tis = b.create_tis();
    let cq = a.create_cq(3, false);
    let ring = a.alloc(4096);
    let (_, dbr) = a.dbr();
    let inp = a.create_sq_input(cq.cqn, b_tis, 6, 0, &ring, dbr);
    expect(&mut a, &inp, 16, CmdStatus::BadResource, Why::OtherFunction);
    // UAR not allocated.
    expect(
        &mut a,
        &simple(Opcode::DeallocUar, 0, 999),
        16,
        CmdStatus::BadResource,
        Why::NoObject,
    );
}

#[test]
fn wrong_hca_or_object_state() {
    let fab = det_fabric(5);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.init_cmdq();
    // Before ENABLE_HCA.
    expect(
        &mut h,
        &simple(Opcode::AllocPd, 0, 0),
        16,
        CmdStatus::BadSystemState,
        Why::HcaState,
    );
    h.ok(&simple(Opcode::EnableHca, 0, 0), 16);
    expect(
        &mut h,
        &simple(Opcode::EnableHca, 0, 0),
        16,
        CmdStatus::BadSystemState,
        Why::HcaState,
    );
    expect(
        &mut h,
        &simple(Opcode::AllocPd, 0, 0),
        16,
        CmdStatus::BadSystemState,
        Why::HcaState,
    );
    // INIT_HCA without pages.
    expect(
        &mut h,
        &simple(Opcode::InitHca, 0, 0),
        16,
        CmdStatus::NoResources,
        Why::Pages,
    );
    h.ok(&simple(Opcode::DisableHca, 0, 0), 16);

    let (_f, mut h) = up(6);
    expect(
        &mut h,
        &simple(Opcode::SetIssi, 0, 1),
        16,
        CmdStatus::BadSystemState,
        Why::HcaState,
    );
    let tx_cq = h.create_cq(3, false);
    let tis = h.create_tis();
    let sq = h.create_sq(tx_cq.cqn, tis, 6, 0);
    // MODIFY_SQ that claims RDY while it is RST.
    let r = h.modify_sq(sq.sqn, 1, 3);
    assert_eq!(r.status, CmdStatus::BadResourceState as u8);
    // RST -> ERR directly is not a transition.
    let r = h.modify_sq(sq.sqn, 0, 3);
    assert_eq!(r.status, CmdStatus::BadResourceState as u8);
    // Invalid state encoding.
    let r = h.modify_sq(sq.sqn, 0, 2);
    assert_eq!(r.status, CmdStatus::BadParameter as u8);
    assert!(h.modify_sq(sq.sqn, 0, 1).ok());
    assert!(h.modify_sq(sq.sqn, 1, 3).ok());
    let r = h.modify_sq(sq.sqn, 3, 1);
    assert_eq!(r.status, CmdStatus::BadResourceState as u8);
    assert!(h.modify_sq(sq.sqn, 3, 0).ok());
    assert!(h.modify_sq(sq.sqn, 0, 1).ok());
    // Destroying a referenced object: busy.
    expect(
        &mut h,
        &simple(Opcode::DestroyCq, 0, tx_cq.cqn),
        16,
        CmdStatus::ResourceBusy,
        Why::InUse,
    );
    expect(
        &mut h,
        &simple(Opcode::DestroyTis, 0, tis),
        16,
        CmdStatus::ResourceBusy,
        Why::InUse,
    );
    let eqn = h.eq.as_ref().unwrap().eqn;
    expect(
        &mut h,
        &simple(Opcode::DestroyEq, 0, eqn),
        16,
        CmdStatus::ResourceBusy,
        Why::InUse,
    );
    // SQ below the device's inline requirement is fine on a CX-5 (none).
    let mut sqc = h.create_sq(tx_cq.cqn, tis, 6, 0);
    sqc.pi = 0;
}

#[test]
fn resource_limits() {
    let fab = det_fabric(7);
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            limits: Limits {
                max_pds: 2,
                max_q_counters: 1,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    h.bring_up(); // allocates one PD
    let caps = h.ok(&simple(Opcode::QueryHcaCap, 1, 0), 0x1010);
    let v = mlx5::prm::View::<CmdHcaCap>::new(&caps[0x10..]).unwrap();
    assert_eq!(v.get(CmdHcaCap::LOG_MAX_PD), 1);
    assert!(h.exec(&simple(Opcode::AllocPd, 0, 0), 16).ok());
    expect(
        &mut h,
        &simple(Opcode::AllocPd, 0, 0),
        16,
        CmdStatus::LimitsExceeded,
        Why::Limit,
    );
    h.alloc_q_counter();
    expect(
        &mut h,
        &simple(Opcode::AllocQCounter, 0, 0),
        16,
        CmdStatus::LimitsExceeded,
        Why::Limit,
    );
    // SET_HCA_CAP cannot raise a limit or enable a missing feature.
    // Copying the whole 4 KiB the query returned (its tail past
    // cmd_hca_cap is reserved, and not zero) is refused: only the general
    // block may be sent back, as Linux and rdma-core do.
    let mut whole = input::<SetHcaCapIn>(Opcode::SetHcaCap, 0, 0, |_| {});
    whole[0x10..0x1010].copy_from_slice(&caps[0x10..0x1010]);
    assert!(caps[0x110..0x1010].iter().any(|b| *b != 0));
    let fab2 = det_fabric(8);
    let mut h2 = Host::with_mac(&fab2, MAC_B);
    h2.init_cmdq();
    h2.ok(&simple(Opcode::EnableHca, 0, 0), 16);
    expect(&mut h2, &whole, 16, CmdStatus::BadParameter, Why::Reserved);
    let mut set = input::<SetHcaCapIn>(Opcode::SetHcaCap, 0, 0, |_| {});
    set[0x10..0x110].copy_from_slice(&caps[0x10..0x110]);
    assert!(
        h2.exec(&set, 16).ok(),
        "the general block alone is accepted"
    );
    {
        let mut v = ViewMut::<SetHcaCapIn>::new(&mut set).unwrap();
        v.sub(SetHcaCapIn::CMD_HCA_CAP)
            .set(CmdHcaCap::CQE_COMPRESSION, 1);
    }
    expect(&mut h2, &set, 16, CmdStatus::BadParameter, Why::OutOfRange);
}

#[test]
fn delivery_statuses_for_broken_entries_and_mailboxes() {
    let (_f, mut h) = up(9);
    let big = simple(Opcode::QueryHcaCap, 1, 0);
    let run = |h: &mut Host, tweak: &mut dyn FnMut(&mut [u8; 64], &mlx5_sim::HostMem)| {
        h.submit(0, &big, 0x1010, tweak);
        assert!(!h.busy(0), "ownership returned");
        h.collect(0, 0x1010).delivery
    };
    // Bad descriptor type.
    let d = run(&mut h, &mut |e, _| e[0] = 3);
    assert_eq!(d, DeliveryStatus::BadDescriptorType as u8);
    // Token mismatch in an output mailbox.
    let d = run(&mut h, &mut |_, mb| {
        mb.write(16 * 1024 + 2 * 1024 + 0x23d, &[0x11])
    });
    assert_eq!(d, DeliveryStatus::TokenError as u8);
    // Block numbers out of sequence.
    let d = run(&mut h, &mut |_, mb| {
        mb.write(16 * 1024 + 3 * 1024 + 0x238, &7u32.to_be_bytes())
    });
    assert_eq!(d, DeliveryStatus::BadBlockNumber as u8);
    // Chain ends early.
    let d = run(&mut h, &mut |_, mb| {
        mb.write(16 * 1024 + 4 * 1024 + 0x230, &0u64.to_be_bytes())
    });
    assert_eq!(d, DeliveryStatus::BadBlockNumber as u8);
    // Output pointer not aligned.
    let d = run(&mut h, &mut |e, _| {
        let mut v = ViewMut::<CmdLayout>::new(e).unwrap();
        let p = v.as_view().get(CmdLayout::OUT_PTR);
        v.set(CmdLayout::OUT_PTR, p + 0x40);
    });
    assert_eq!(d, DeliveryStatus::OutputPointerNotAligned as u8);
    // Output mailbox pointer outside every mapping: a DMA fault.
    let faults = h.nic.stats().dma.faults;
    let d = run(&mut h, &mut |e, _| {
        ViewMut::<CmdLayout>::new(e)
            .unwrap()
            .set(CmdLayout::OUT_PTR, 0x7700_0000_0000);
    });
    assert_eq!(d, DeliveryStatus::FwInternalError as u8);
    assert_eq!(h.nic.stats().dma.faults, faults + 1);
    // Input length beyond the transport limit.
    let d = run(&mut h, &mut |e, _| {
        ViewMut::<CmdLayout>::new(e)
            .unwrap()
            .set(CmdLayout::INLEN, 2 << 20);
    });
    assert_eq!(d, DeliveryStatus::InputLengthError as u8);
    // Every one is in the log with its reason.
    let log = h.nic.command_log();
    let bad: Vec<_> = log
        .iter()
        .filter(|r| r.delivery != DeliveryStatus::Ok)
        .collect();
    assert_eq!(bad.len(), 7);
    assert!(bad.iter().all(|r| !r.reason.is_empty()));
    // And the interface still works.
    assert!(h.exec(&simple(Opcode::Nop, 0, 0), 16).ok());
}

#[test]
fn reserved_uid_and_manage_pages_checks() {
    let (_f, mut h) = up(10);
    let mut nop = simple(Opcode::Nop, 0, 0);
    nop[3] = 1; // uid
    expect(&mut h, &nop, 16, CmdStatus::BadParameter, Why::Reserved);
    // A page that is not 4 KiB aligned / given twice / unmapped.
    let given = *h.fw_given.first().unwrap();
    for (addr, why) in [
        (given + 0x800, Why::Alignment),
        (given, Why::Duplicate),
        (0x55_0000_0000, Why::Unmapped),
    ] {
        let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, 1, 0x18, |v| {
            v.set(ManagePagesIn::INPUT_NUM_ENTRIES, 1);
        });
        inp[0x10..0x18].copy_from_slice(&addr.to_be_bytes());
        expect(&mut h, &inp, 16, CmdStatus::BadParameter, why);
    }
    // GIVE that claims more entries than the input carries.
    let inp = input::<ManagePagesIn>(Opcode::ManagePages, 1, 0x18, |v| {
        v.set(ManagePagesIn::INPUT_NUM_ENTRIES, 3);
    });
    expect(
        &mut h,
        &inp,
        16,
        CmdStatus::BadInputLength,
        Why::InputLength,
    );
}

/// Every reference enables MSI-X before its first CREATE_EQ; the firmware
/// refuses an EQ whose vector the host never enabled.
#[test]
fn create_eq_needs_msix_enabled() {
    let (_f, mut h) = up(11);
    let uar = h.alloc_uar();
    h.hw.disable_msix().unwrap();
    let mem = h.alloc(4096);
    let mut inp = input::<CreateEqIn>(Opcode::CreateEq, 0, 0x118, |v| {
        v.set_flex(CreateEqIn::EVENT_BITMASK, 0, 1 << 0x0b);
        let mut e = v.sub(CreateEqIn::EQC);
        e.set(Eqc::LOG_EQ_SIZE, 6)
            .set(Eqc::UAR_PAGE, u64::from(uar));
    });
    inp[0x110..0x118].copy_from_slice(&mem.iova().to_be_bytes());
    expect(&mut h, &inp, 16, CmdStatus::BadParameter, Why::Interrupt);
    h.hw.enable_msix(0).unwrap();
    assert_eq!(h.nic.msix_routed(), Some(0));
    assert!(h.exec(&inp, 16).ok());
}

/// A VF: HOST_ENDIANNESS is a PF register, and MANAGE_PAGES must name the
/// function id QUERY_PAGES reported (1 here), not 0.
#[test]
fn a_vf_refuses_host_endianness_and_pages_for_another_function() {
    let fab = det_fabric(12);
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            ..mlx5_sim::Profile::ConnectX5Vf.config()
        },
    );
    h.init_cmdq();
    h.ok(&simple(Opcode::EnableHca, 0, 0), 0x10);
    let mut reg = simple(Opcode::AccessReg, 0, 0x7004);
    reg.extend_from_slice(&[0u8; 16]);
    expect(
        &mut h,
        &reg,
        0x20,
        CmdStatus::BadParameter,
        Why::NotSupported,
    );
    let out = h.ok(&simple(Opcode::QueryPages, 1, 0), 0x10);
    assert_eq!(be32(&out, 8) & 0xffff, 1, "QUERY_PAGES names function 1");
    // Host::give_pages sends function 0: refused.
    let r = h.give_pages(4, SLOT_PAGES);
    assert_eq!(r.status, CmdStatus::BadParameter as u8);
    let last = h.nic.command_log().pop().unwrap();
    assert_eq!(last.syndrome >> 8 & 0xff, Why::Mismatch as u32, "{last}");
    // Echoing the id works.
    let page = h.alloc(4096);
    let mut inp = input::<ManagePagesIn>(Opcode::ManagePages, 1, 0x18, |v| {
        v.set(ManagePagesIn::INPUT_NUM_ENTRIES, 1)
            .set(ManagePagesIn::FUNCTION_ID, 1);
    });
    inp[0x10..0x18].copy_from_slice(&page.iova().to_be_bytes());
    assert!(h.exec_slot(SLOT_PAGES, &inp, 0x10).ok());
    assert_eq!(h.nic.pages_held(), 1);
}

/// SET_FLOW_TABLE_ROOT op_mod 1 needs `reset_root_to_default`; destroying
/// the root table is allowed (steering falls back to nothing).
#[test]
fn root_disconnect_needs_the_cap_and_the_root_may_be_destroyed() {
    let (_f, mut h) = up(13);
    assert!(!h.nic.config().reset_root_to_default);
    let t = h.create_flow_table(4);
    h.set_root(t);
    assert!(h.nic.objects().root_set);
    let unroot = input::<SetFlowTableRootIn>(Opcode::SetFlowTableRoot, 1, 0, |_| {});
    expect(
        &mut h,
        &unroot,
        16,
        CmdStatus::BadParameter,
        Why::NotSupported,
    );
    let dt = input::<DestroyFlowTableIn>(Opcode::DestroyFlowTable, 0, 0, |v| {
        v.set(DestroyFlowTableIn::TABLE_ID, u64::from(t));
    });
    h.ok(&dt, 0x10);
    assert!(!h.nic.objects().root_set);
}

/// A ConnectX-7 offers only real-time timestamps: an SQ asking for the
/// free-running format is refused.
#[test]
fn real_time_only_device_refuses_free_running_queues() {
    let fab = det_fabric(14);
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            ..mlx5_sim::Profile::ConnectX7Pf.config()
        },
    );
    h.bring_up();
    let cq = h.create_cq(4, false);
    let tis = h.create_tis();
    let ring = h.alloc(4096);
    let (_, dbr) = h.dbr();
    let mut inp = h.create_sq_input(cq.cqn, tis, 6, 0, &ring, dbr);
    expect(&mut h, &inp, 16, CmdStatus::BadParameter, Why::NotSupported);
    {
        let mut v = mlx5::prm::ViewMut::<CreateSqIn>::new(&mut inp).unwrap();
        v.sub(CreateSqIn::CTX).set(Sqc::TS_FORMAT, 2);
    }
    assert!(h.exec(&inp, 16).ok());
}

/// A physical-address mkey whose range wraps past 2^64 is refused.
#[test]
fn pa_mkey_range_may_not_wrap() {
    let (_f, mut h) = up(15);
    let pd = h.pd;
    let mk = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0, |v| {
        let mut m = v.sub(CreateMkeyIn::MKC);
        m.set(Mkc::ACCESS_MODE_1_0, 0)
            .set(Mkc::LR, 1)
            .set(Mkc::QPN, 0xff_ffff)
            .set(Mkc::PD, u64::from(pd))
            .set(Mkc::START_ADDR, u64::MAX - 0xfff)
            .set(Mkc::LEN, 0x2000);
    });
    expect(&mut h, &mk, 16, CmdStatus::BadParameter, Why::OutOfRange);
}
