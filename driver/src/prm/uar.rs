//! UAR pages and doorbell records: where doorbells are rung.
//!
//! A UAR is a 4 KiB page of BAR0 (`BAR0 + index * 4096`). Doorbell records
//! are 8 bytes of host DMA memory whose address is given at queue creation.

use crate::prm::{ConstDesc, ConstHeader};

/// Bytes per UAR page (4 KiB pages, `log_uar_page_sz = 0`).
pub const UAR_PAGE_BYTES: usize = 4096;
/// UAR offset of the 64-bit CQ arm doorbell.
pub const CQ_DOORBELL: usize = 0x20;
/// UAR offset of the EQ doorbell that updates the consumer index and arms.
pub const EQ_DOORBELL_ARM: usize = 0x40;
/// UAR offset of the EQ doorbell that only updates the consumer index.
pub const EQ_DOORBELL_NO_ARM: usize = 0x48;
/// UAR offset of the first BlueFlame / send doorbell register (bfreg 0).
pub const BF_OFFSET: usize = 0x800;
/// BlueFlame registers per UAR page (two shared, two fast-path).
pub const BFREGS_PER_UAR: usize = 4;
/// CQ arm command: any completion.
pub const CQ_DB_REQ_NOT: u32 = 0;
/// CQ arm command: solicited only.
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// EQ doorbell value: `eqn << 24 | ci & 0xffffff`.
pub const fn eq_doorbell_value(eqn: u8, ci: u32) -> u32 {
    ((eqn as u32) << 24) | (ci & 0x00ff_ffff)
}

/// Doorbell record (in dwords): RQ producer counter / CQ consumer counter.
pub const DBR_RQ_OR_CQ_CI: usize = 0;
/// Doorbell record (in dwords): SQ producer counter / CQ arm word.
pub const DBR_SQ_OR_CQ_ARM: usize = 1;
/// Bytes in a doorbell record.
pub const DBR_BYTES: usize = 8;

/// Independent twins.
pub const CONSTS: &[ConstDesc] = &[
    ConstDesc {
        rust: "uar::CQ_DOORBELL",
        value: CQ_DOORBELL as u64,
        header: ConstHeader::Kernel,
        c_name: "MLX5_CQ_DOORBELL",
    },
    ConstDesc {
        rust: "uar::BF_OFFSET",
        value: BF_OFFSET as u64,
        header: ConstHeader::Kernel,
        c_name: "MLX5_BF_OFFSET",
    },
    ConstDesc {
        rust: "uar::CQ_DB_REQ_NOT",
        value: CQ_DB_REQ_NOT as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQ_DB_REQ_NOT",
    },
    ConstDesc {
        rust: "uar::CQ_DB_REQ_NOT_SOL",
        value: CQ_DB_REQ_NOT_SOL as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQ_DB_REQ_NOT_SOL",
    },
    ConstDesc {
        rust: "uar::CQ_DOORBELL(dv)",
        value: CQ_DOORBELL as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQ_DOORBELL",
    },
];
