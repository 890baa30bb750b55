//! Random bytes as WQEs, command inputs and frames: the model never panics
//! and never touches memory outside its IOMMU mappings.

mod common;

use common::*;
use mlx5::prm::codes::Opcode;
use mlx5_sim::{HostMem, NicConfig, SimNic};
use proptest::prelude::*;

const CANARY: u8 = 0xc5;

/// Memory the model must never write: mapped through another NIC's IOMMU
/// (so its IOVA means nothing here) and reachable only by guessing.
struct Canary {
    _other: SimNic,
    mem: HostMem,
}

impl Canary {
    fn new(fab: &mlx5_sim::Fabric) -> Canary {
        let other = SimNic::new(
            fab,
            NicConfig {
                mac: [2, 0, 0, 0, 9, 9],
                ..Default::default()
            },
        );
        let mem = HostMem::new(other.dma_mapper(), 16 * 4096).unwrap();
        mem.fill(0, mem.len(), CANARY);
        Canary { _other: other, mem }
    }

    fn intact(&self) -> bool {
        self.mem
            .read_vec(0, self.mem.len())
            .iter()
            .all(|&b| b == CANARY)
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES=5000 for a longer soak.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(96),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Addresses a WQE may point at: valid, the canary's IOVA (unmapped
/// here), or anything.
fn addr_choice(valid: u64, canary: u64, pick: u8, raw: u64) -> u64 {
    match pick % 3 {
        0 => valid,
        1 => canary,
        _ => raw,
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_wqes(
        wqes in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 64..=256), any::<bool>(), 0u8..20, any::<u8>(), any::<u64>()),
            1..24,
        ),
        bf in any::<bool>(),
    ) {
        let fab = det_fabric(1);
        let canary = Canary::new(&fab);
        let mut h = Host::with_mac(&fab, MAC_A);
        h.bring_up();
        let mut p = h.build_path(PathCfg::default());
        let buf = h.alloc(8192);
        for (bytes, fix, ds, pick, raw) in wqes {
            let mut w = bytes;
            w.truncate(w.len() / 64 * 64);
            if fix {
                // A plausible control segment so parsing goes deeper.
                let idx = p.sq.pi;
                let op = if ds % 2 == 0 { 0x0a } else { u32::from(w[3]) };
                w[0..4].copy_from_slice(&((u32::from(idx) << 8) | op).to_be_bytes());
                w[4..8].copy_from_slice(&((p.sq.sqn << 8) | u32::from(ds.max(1))).to_be_bytes());
                let a = addr_choice(buf.iova(), canary.mem.iova(), pick, raw);
                w[0x28..0x30].copy_from_slice(&a.to_be_bytes());
                if pick % 2 == 0 {
                    w[0x24..0x28].copy_from_slice(&h.lkey.to_be_bytes());
                }
            }
            h.write_wqe(&mut p.sq, &w);
            if bf && w.len() <= 256 {
                h.ring_sq_bf(&mut p.sq, w.len() / 64);
            } else {
                h.ring_sq(&mut p.sq);
            }
            while h.poll_cq(&mut p.tx_cq).is_some() {}
        }
        prop_assert!(canary.intact());
        // The command interface still works.
        prop_assert!(h.exec(&simple(Opcode::Nop, 0, 0), 16).ok());
    }

    #[test]
    fn random_command_inputs(
        cmds in proptest::collection::vec(
            (0usize..64, proptest::collection::vec(any::<u8>(), 0..1200), 16usize..0x1100, any::<u16>()),
            1..12,
        ),
        initialized in any::<bool>(),
    ) {
        let fab = det_fabric(2);
        let canary = Canary::new(&fab);
        let mut h = Host::with_mac(&fab, MAC_A);
        if initialized {
            h.bring_up();
        } else {
            h.init_cmdq();
        }
        for (op_pick, mut body, outlen, op_mod) in cmds {
            let ops = Opcode::ALL;
            let op = ops[op_pick % ops.len()];
            if matches!(op, Opcode::DisableHca | Opcode::TeardownHca) && op_pick % 5 != 0 {
                continue;
            }
            body.resize(body.len().max(16), 0);
            body[0..2].copy_from_slice(&(op as u16).to_be_bytes());
            body[2..4].copy_from_slice(&[0, 0]);
            body[6..8].copy_from_slice(&op_mod.to_be_bytes());
            // Often name a real object, so validation goes deeper.
            let real = [h.pd, h.td, h.uar_eq, h.uar_tx, h.lkey >> 8, h.eq.as_ref().map_or(0, |e| e.eqn)];
            if op_mod % 3 != 0 {
                let n = real[usize::from(op_mod) % real.len()];
                body[8..12].copy_from_slice(&n.to_be_bytes());
            }
            h.submit(0, &body, outlen, &mut |_, _| {});
            prop_assert!(!h.busy(0), "{op:?} left the entry with hardware");
            let r = h.collect(0, outlen);
            prop_assert_eq!(r.delivery, 0);
            if r.status != 0 {
                prop_assert!(r.syndrome != 0);
            }
            // Keep the EQ drained so page requests are answered.
            h.service_eq();
        }
        prop_assert!(canary.intact());
        prop_assert!(h.exec(&simple(Opcode::Nop, 0, 0), 16).ok());
        let log = h.nic.command_log();
        prop_assert!(log.iter().all(|r| r.status as u8 == 0 || !r.reason.is_empty()));
    }

    #[test]
    fn random_frames(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..1600), 1..40)) {
        let fab = det_fabric(3);
        let mut h = Host::with_mac(&fab, MAC_A);
        h.bring_up();
        let _p = h.build_path(PathCfg::default());
        let mut good = frame_to(MAC_A, MAC_B, &[0; 32]);
        for (i, mut f) in frames.into_iter().enumerate() {
            if i % 2 == 0 && f.len() >= 42 {
                // Keep the headers valid so some reach the RQ.
                f[..42].copy_from_slice(&good[..42]);
                f.truncate(f.len().min(1024));
                let ip_len = (f.len() - 14) as u16;
                f[16..18].copy_from_slice(&ip_len.to_be_bytes());
                f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
            }
            fab.inject(h.nic.port(), &f);
        }
        good[0] ^= 1;
        fab.inject(h.nic.port(), &good);
        let s = h.nic.stats();
        prop_assert_eq!(s.dma.faults, 0);
        prop_assert!(h.exec(&simple(Opcode::Nop, 0, 0), 16).ok());
    }
}
