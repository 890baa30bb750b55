//! Less common but modeled features: 128-byte CQEs, MTT memory keys,
//! cyclic (non-striding) RQs with VLAN stripping, two-byte shift, TIR
//! self-loopback blocking and flow entry modification, vport MAC filter,
//! MODIFY_CQ overrun-ignore.

mod common;

use common::*;
use mlx5::prm::cmd::*;
use mlx5::prm::codes::{CqeOpcode, Opcode, wq_type};
use mlx5::prm::cqe::Cqe;
use mlx5::prm::ctx::*;
use mlx5::prm::wqe::encode_log_num_strides;
use mlx5_sim::{DropReason, NicConfig};

fn up(seed: u64) -> (mlx5_sim::Fabric, Host) {
    let fab = det_fabric(seed);
    let mut h = Host::with_mac(&fab, MAC_A);
    h.bring_up();
    (fab, h)
}

#[test]
fn cqe_of_128_bytes_is_in_the_second_half() {
    let (fab, mut h) = up(1);
    let tap = fab.add_tap(Some(MAC_B));
    let mem = h.alloc(128 * 8);
    for i in 0..8 {
        mem.store_u8_release(i * 128 + 127, 0xf0);
    }
    let (dbr_off, dbr) = h.dbr();
    let (uar, eqn) = (h.uar_eq, h.eq.as_ref().unwrap().eqn);
    let mut inp = input::<CreateCqIn>(Opcode::CreateCq, 0, 0x118, |v| {
        v.sub(CreateCqIn::CQC)
            .set(Cqc::CQE_SZ, 1)
            .set(Cqc::LOG_CQ_SIZE, 3)
            .set(Cqc::UAR_PAGE, u64::from(uar))
            .set(Cqc::C_EQN, u64::from(eqn))
            .set(Cqc::DBR_ADDR, dbr);
    });
    inp[0x110..0x118].copy_from_slice(&mem.iova().to_be_bytes());
    let cqn = Host::out24(&h.ok(&inp, 0x10));
    let tis = h.create_tis();
    let mut sq = h.create_sq(cqn, tis, 6, 0);
    assert!(h.modify_sq(sq.sqn, 0, 1).ok());
    let f = frame_to(MAC_B, MAC_A, &[1; 50]);
    let buf = h.alloc(4096);
    buf.write(0, &f);
    h.post_send(&mut sq, &[], &[(buf.iova(), f.len() as u32)], true);
    h.ring_sq(&mut sq);
    assert_eq!(mem.read_vec(0, 64), vec![0; 64], "first half untouched");
    let mut b = [0u8; 64];
    mem.read(64, &mut b);
    let c = Cqe::decode(&b);
    assert_eq!(c.op(), Some(CqeOpcode::Req));
    assert!(!c.owner);
    assert_eq!(c.qpn, sq.sqn);
    assert_eq!(tap.take().len(), 1);
    let _ = dbr_off;
}

#[test]
fn mtt_memory_keys_translate_virtual_addresses() {
    let (fab, mut h) = up(2);
    let tap = fab.add_tap(Some(MAC_B));
    let mut p = h.build_path(PathCfg::default());
    // Two separate 4 KiB pages, presented as one virtual range that
    // starts 0x800 into the first.
    let pg0 = h.alloc(4096);
    let pg1 = h.alloc(4096);
    let f = frame_to(
        MAC_B,
        MAC_A,
        &(0..300u32).map(|i| i as u8).collect::<Vec<_>>(),
    );
    pg0.write(0x800 + 0x700, &f[..0x100]);
    pg1.write(0, &f[0x100..]);
    let va: u64 = 0x7f00_0000_0800;
    let pd = h.pd;
    let mut inp = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0x120, |v| {
        v.set(CreateMkeyIn::TRANSLATIONS_OCTWORD_ACTUAL_SIZE, 1);
        let mut m = v.sub(CreateMkeyIn::MKC);
        m.set(Mkc::ACCESS_MODE_1_0, 1)
            .set(Mkc::LR, 1)
            .set(Mkc::QPN, 0xff_ffff)
            .set(Mkc::MKEY_7_0, 7)
            .set(Mkc::PD, u64::from(pd))
            .set(Mkc::START_ADDR, va)
            .set(Mkc::LEN, 0x1800)
            .set(Mkc::LOG_PAGE_SIZE, 12);
    });
    inp[0x110..0x118].copy_from_slice(&(pg0.iova() | 3).to_be_bytes());
    inp[0x118..0x120].copy_from_slice(&(pg1.iova() | 1).to_be_bytes());
    let idx = Host::out24(&h.ok(&inp, 0x10));
    let pa_key = h.lkey;
    h.lkey = (idx << 8) | 7;
    h.post_send(&mut p.sq, &[], &[(va + 0x700, f.len() as u32)], true);
    h.lkey = pa_key;
    h.ring_sq(&mut p.sq);
    let c = h.poll_cq(&mut p.tx_cq).unwrap();
    assert_eq!(c.op(), Some(CqeOpcode::Req), "{c}");
    assert_eq!(tap.take(), vec![f]);
    // Too few MTT entries for the range.
    let bad = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0x120, |v| {
        v.set(CreateMkeyIn::TRANSLATIONS_OCTWORD_ACTUAL_SIZE, 1);
        let mut m = v.sub(CreateMkeyIn::MKC);
        m.set(Mkc::ACCESS_MODE_1_0, 1)
            .set(Mkc::QPN, 0xff_ffff)
            .set(Mkc::PD, u64::from(pd))
            .set(Mkc::START_ADDR, va)
            .set(Mkc::LEN, 0x3000)
            .set(Mkc::LOG_PAGE_SIZE, 12);
    });
    assert_eq!(h.exec(&bad, 16).status, 0x03);
}

#[test]
fn cyclic_rq_scatters_and_strips_vlan() {
    let fab = det_fabric(3);
    // A jumbo MTU, so that a frame longer than a receive WQE gets past the
    // port's MTU check.
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            mtu: 9000 + 22,
            ..Default::default()
        },
    );
    h.bring_up();
    let mut cq = h.create_cq(4, false);
    let ring = h.alloc(4096);
    let bufs = h.alloc(8 * 2048);
    let (dbr_off, dbr) = h.dbr();
    let pd = h.pd;
    let mut inp = input::<CreateRqIn>(Opcode::CreateRq, 0, 0x118, |v| {
        let mut r = v.sub(CreateRqIn::CTX);
        r.set(Rqc::VSD, 0).set(Rqc::CQN, u64::from(cq.cqn));
        let mut w = r.sub(Rqc::WQ);
        w.set(Wq::WQ_TYPE, u64::from(wq_type::CYCLIC))
            .set(Wq::PD, u64::from(pd))
            .set(Wq::DBR_ADDR, dbr)
            .set(Wq::LOG_WQ_STRIDE, 5)
            .set(Wq::LOG_WQ_SZ, 3);
    });
    inp[0x110..0x118].copy_from_slice(&ring.iova().to_be_bytes());
    let rqn = Host::out24(&h.ok(&inp, 0x10));
    // Each WQE: two 1 KiB segments.
    for i in 0..8usize {
        for s in 0..2usize {
            let mut d = [0u8; 16];
            d[0..4].copy_from_slice(&1024u32.to_be_bytes());
            d[4..8].copy_from_slice(&h.lkey.to_be_bytes());
            d[8..16].copy_from_slice(&bufs.iova_at(i * 2048 + s * 1024).to_be_bytes());
            ring.write(i * 32 + s * 16, &d);
        }
    }
    h.dbrs.store_be32_release(dbr_off, 8);
    assert!(h.modify_rq(rqn, 0, 1).ok());
    let tir = h.create_tir(rqn);
    let table = h.create_flow_table(2);
    // Match on dmac only.
    let g = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0, |v| {
        v.set(CreateFlowGroupIn::TABLE_ID, u64::from(table))
            .set(CreateFlowGroupIn::END_FLOW_INDEX, 3)
            .set(CreateFlowGroupIn::MATCH_CRITERIA_ENABLE, 1);
        let mut mc = v.sub(CreateFlowGroupIn::MATCH_CRITERIA);
        mc.sub(FteMatchParam::OUTER_HEADERS)
            .set(FteMatchSetLyr24::DMAC_47_16, 0xffff_ffff)
            .set(FteMatchSetLyr24::DMAC_15_0, 0xffff);
    });
    let group = Host::out24(&h.ok(&g, 0x10));
    let mut fte = h.fte_input(table, group, 0, MAC_A, 0, tir);
    // Clear the fields outside the group mask (ignored anyway).
    fte[0x80 + 0x10] = 0;
    h.ok(&fte, 0x10);
    h.set_root(table);
    // A 1500-byte VLAN-tagged frame: stripped to 1496 bytes, over two segments.
    let inner = frame_to(MAC_A, MAC_B, &[0x5a; 1458]);
    let mut tagged = inner[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x20, 0x07]);
    tagged.extend_from_slice(&inner[12..]);
    fab.inject(h.nic.port(), &tagged);
    let c = h.poll_cq(&mut cq).expect("CQE");
    assert_eq!(c.op(), Some(CqeOpcode::RespSend), "{c}");
    assert_eq!(c.byte_cnt as usize, inner.len());
    assert_eq!(c.wqe_counter, 0);
    assert_eq!(c.l4_hdr_type_etc & 1, 1, "VLAN stripped and reported");
    let mut got = bufs.read_vec(0, 1024);
    got.extend(bufs.read_vec(1024, inner.len() - 1024));
    assert_eq!(got, inner);
    let mut b = [0u8; 64];
    cq.mem.read(0, &mut b);
    assert_eq!(u16::from_be_bytes([b[0x1e], b[0x1f]]), 0x2007);
    // Larger than a WQE: local length error CQE, RQ to error.
    fab.inject(h.nic.port(), &frame_to(MAC_A, MAC_B, &vec![0; 2100]));
    let c = h.poll_cq(&mut cq).expect("error CQE");
    assert_eq!(c.op(), Some(CqeOpcode::RespErr));
    assert_eq!(c.syndrome, 0x01);
    assert_eq!(h.nic.drops(DropReason::RqWqeError), 1);
    fab.inject(h.nic.port(), &inner);
    assert_eq!(h.nic.drops(DropReason::RqNotReady), 1);
}

#[test]
fn two_byte_shift_places_packets_two_bytes_in() {
    // Eight 64-byte strides make a 512-byte WQE, which `Host::with_mac`'s
    // device accepts.
    let (fab, mut h) = up(4);
    let mut cq = h.create_cq(6, false);
    let ring = h.alloc(4096);
    let bufs = h.alloc(4 * 8 * 64);
    let (dbr_off, dbr) = h.dbr();
    let pd = h.pd;
    let mut inp = input::<CreateRqIn>(Opcode::CreateRq, 0, 0x118, |v| {
        let mut r = v.sub(CreateRqIn::CTX);
        r.set(Rqc::VSD, 1).set(Rqc::CQN, u64::from(cq.cqn));
        let mut w = r.sub(Rqc::WQ);
        w.set(Wq::WQ_TYPE, u64::from(wq_type::CYCLIC_STRIDING))
            .set(Wq::PD, u64::from(pd))
            .set(Wq::DBR_ADDR, dbr)
            .set(Wq::LOG_WQ_STRIDE, 5)
            .set(Wq::LOG_WQ_SZ, 2)
            .set(
                Wq::LOG_WQE_NUM_OF_STRIDES,
                u64::from(encode_log_num_strides(3, true).unwrap()),
            )
            .set(Wq::TWO_BYTE_SHIFT_EN, 1)
            .set(Wq::LOG_WQE_STRIDE_SIZE, 0);
    });
    inp[0x110..0x118].copy_from_slice(&ring.iova().to_be_bytes());
    let rqn = Host::out24(&h.ok(&inp, 0x10));
    for i in 0..4usize {
        let mut w = [0u8; 32];
        w[0x10..0x14].copy_from_slice(&512u32.to_be_bytes());
        w[0x14..0x18].copy_from_slice(&h.lkey.to_be_bytes());
        w[0x18..0x20].copy_from_slice(&bufs.iova_at(i * 512).to_be_bytes());
        ring.write(i * 32, &w);
    }
    h.dbrs.store_be32_release(dbr_off, 4);
    assert!(h.modify_rq(rqn, 0, 1).ok());
    let tir = h.create_tir(rqn);
    let table = h.create_flow_table(4);
    let group = h.create_flow_group(table, 0, 15);
    let fte = h.fte_input(table, group, 0, MAC_A, UDP_PORT, tir);
    h.ok(&fte, 0x10);
    h.set_root(table);
    // 126 bytes + 2 = 128: exactly 2 strides of 64.
    let f = frame_to(MAC_A, MAC_B, &[3; 84]);
    assert_eq!(f.len(), 126);
    fab.inject(h.nic.port(), &f);
    let c = h.poll_cq(&mut cq).unwrap();
    assert_eq!((c.strides(), c.mpwrq_bytes()), (2, 126));
    assert_eq!(bufs.read_vec(2, 126), f);
    assert_eq!(bufs.read_vec(0, 2), vec![0, 0]);
    // 127 + 2 = 129: 3 strides.
    let f2 = frame_to(MAC_A, MAC_B, &[4; 85]);
    fab.inject(h.nic.port(), &f2);
    let c = h.poll_cq(&mut cq).unwrap();
    assert_eq!((c.strides(), c.wqe_counter), (3, 2));
    assert_eq!(bufs.read_vec(2 * 64 + 2, 127), f2);
}

#[test]
fn tir_self_loopback_block_and_fte_modify() {
    let (_fab, mut h) = up(5);
    let mut p = h.build_path(PathCfg::default());
    let td = h.td;
    let rqn = p.rq.rqn;
    let tir2 = input::<CreateTirIn>(Opcode::CreateTir, 0, 0, |v| {
        v.sub(CreateTirIn::CTX)
            .set(Tirc::INLINE_RQN, u64::from(rqn))
            .set(Tirc::SELF_LB_BLOCK, 1)
            .set(Tirc::TRANSPORT_DOMAIN, u64::from(td));
    });
    let tir2 = Host::out24(&h.ok(&tir2, 0x10));
    let mut modify = h.fte_input(p.table, p.group, 0, MAC_A, UDP_PORT, tir2);
    modify[6..8].copy_from_slice(&1u16.to_be_bytes());
    h.ok(&modify, 0x10);
    // The old TIR is no longer referenced.
    h.ok(&simple(Opcode::DestroyTir, 0, p.tir), 0x10);
    p.tir = tir2;
    let f = frame_to(MAC_A, MAC_A, &[1; 64]);
    let buf = h.alloc(4096);
    buf.write(0, &f);
    h.post_send(&mut p.sq, &[], &[(buf.iova(), f.len() as u32)], false);
    h.ring_sq(&mut p.sq);
    assert_eq!(h.nic.drops(DropReason::SelfLoopback), 1);
    assert_eq!(h.nic.stats().rx_delivered, 0);
    // Destroying a TIR that an entry forwards to is refused.
    let r = h.exec(&simple(Opcode::DestroyTir, 0, tir2), 16);
    assert_eq!(r.status, 0x06);
    h.destroy_path(p);
}

#[test]
fn vport_mac_filter_promisc_and_mac_change() {
    let fab = det_fabric(6);
    let mut h = Host::new(
        &fab,
        NicConfig {
            mac: MAC_A,
            vport_mac_filter: true,
            // The optional vport filter alone, without an e-switch in front.
            eswitch: mlx5_sim::Eswitch::None,
            ..Default::default()
        },
    );
    h.bring_up();
    let _p = h.build_path(PathCfg::default());
    let other = [2, 0, 0, 0, 7, 7];
    fab.inject(h.nic.port(), &frame_to(other, MAC_B, &[0; 40]));
    assert_eq!(h.nic.drops(DropReason::VportFilter), 1);
    // Promiscuous: reaches steering (and misses: the rule is for MAC_A).
    let mut m = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0, |v| {
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::PROMISC, 1);
        v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
            .set(NicVportContext::PROMISC_UC, 1);
    });
    h.ok(&m, 0x10);
    fab.inject(h.nic.port(), &frame_to(other, MAC_B, &[0; 40]));
    assert_eq!(h.nic.drops(DropReason::FlowMiss), 1);
    // New permanent address, as QUERY_NIC_VPORT_CONTEXT shows.
    m = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0, |v| {
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::PERMANENT_ADDRESS, 1);
        let mut c = v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT);
        let mut a = c.sub(NicVportContext::PERMANENT_ADDRESS);
        a.set(MacAddressLayout::MAC_ADDR_47_32, 0x0200)
            .set(MacAddressLayout::MAC_ADDR_31_0, 0x0000_0707);
    });
    h.ok(&m, 0x10);
    let q = h.ok(&simple(Opcode::QueryNicVportContext, 0, 0), 0x110);
    assert_eq!(&q[0x106..0x10c], &other);
    assert_eq!(h.nic.mac(), other);
    // RoCE cannot be turned on: the device reports roce = 0.
    m = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0, |v| {
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::ROCE_EN, 1);
        v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
            .set(NicVportContext::ROCE_EN, 1);
    });
    assert_eq!(h.exec(&m, 16).status, 0x03);
}

#[test]
fn modify_cq_sets_overrun_ignore() {
    let (fab, mut h) = up(7);
    let p = h.build_path(PathCfg {
        rx_cq_log: 1,
        rx_oi: false,
        ..Default::default()
    });
    let m = input::<ModifyCqIn>(Opcode::ModifyCq, 0, 0, |v| {
        v.set(ModifyCqIn::CQN, u64::from(p.rx_cq.cqn))
            .set(ModifyCqIn::MODIFY_FIELD_SELECT, 1 << 2);
        v.sub(ModifyCqIn::CQC).set(Cqc::OI, 1);
    });
    h.ok(&m, 0x10);
    let f = frame_to(MAC_A, MAC_B, &[1; 64]);
    for _ in 0..10 {
        fab.inject(h.nic.port(), &f);
    }
    assert_eq!(h.nic.stats().cq_overruns, 0);
    assert_eq!(h.nic.stats().rx_delivered, 10);
    let out = h.ok(&simple(Opcode::QueryCq, 0, p.rx_cq.cqn), 0x110);
    assert_eq!(out[0x10] >> 4, 0);
    assert_eq!((out[0x12] >> 1) & 1, 1, "oi reported");
    // Resize is not modeled.
    let r = h.exec(&input::<ModifyCqIn>(Opcode::ModifyCq, 1, 0, |_| {}), 16);
    assert_eq!(r.status, 0x03);
}
