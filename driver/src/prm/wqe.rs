//! Work-queue entries: the send WQE segments for raw Ethernet and the
//! striding (multi-packet) RQ WQE (rdma-core `mlx5dv.h`:
//! `mlx5_wqe_ctrl_seg`, `mlx5_wqe_eth_seg`, `mlx5_wqe_data_seg`,
//! `mlx5_wqe_srq_next_seg`, `mlx5_mprq_wqe`).

use crate::layout;
use crate::prm::{ConstDesc, ConstHeader, Source};

layout! {
    /// Send WQE control segment (16 bytes, WQE + 0x00).
    pub struct WqeCtrlSeg: Source::Dv("mlx5_wqe_ctrl_seg"), 16 * 8;
    /// `[31:24]` opmod, `[23:8]` WQE index (WQEBB producer counter), `[7:0]` opcode.
    OPMOD_IDX_OPCODE: field = "opmod_idx_opcode" @ 8 * 0x00, 32;
    /// `[31:8]` SQ number, `[5:0]` WQE size in 16-byte DS units.
    QPN_DS: field = "qpn_ds" @ 8 * 0x04, 32;
    /// WQE signature (0).
    SIGNATURE: field = "signature" @ 8 * 0x08, 8;
    /// DCI stream channel (DC only).
    DCI_STREAM_CHANNEL_ID: field = "dci_stream_channel_id" @ 8 * 0x09, 16;
    /// `[7:5]` fence, `[3:2]` completion mode (CE), `[1]` solicited.
    FM_CE_SE: field = "fm_ce_se" @ 8 * 0x0b, 8;
    /// Immediate / TIS number << 8.
    IMM: field = "imm" @ 8 * 0x0c, 32;
}

layout! {
    /// Send WQE Ethernet segment (WQE + 0x10; 16 bytes plus the inline-header tail).
    pub struct WqeEthSeg: Source::Dv("mlx5_wqe_eth_seg"), 32 * 8;
    /// Software parser offsets / reserved.
    RSVD0: field = "rsvd0" @ 8 * 0x00, 32;
    /// 0x40 IPv4 checksum, 0x80 L4 checksum.
    CS_FLAGS: field = "cs_flags" @ 8 * 0x04, 8;
    /// TSO MSS.
    MSS: field = "mss" @ 8 * 0x06, 16;
    /// Packet bytes placed inline (0 or 18 here).
    INLINE_HDR_SZ: field = "inline_hdr_sz" @ 8 * 0x0c, 16;
    /// First 2 inline bytes.
    INLINE_HDR_START: field = "inline_hdr_start" @ 8 * 0x0e, 16;
    /// Next 16 inline bytes (the next DS).
    INLINE_HDR: field = "inline_hdr" @ 8 * 0x10, 128;
}

layout! {
    /// Data (gather/scatter) segment, 16 bytes.
    pub struct WqeDataSeg: Source::Dv("mlx5_wqe_data_seg"), 16 * 8;
    /// Bytes; bit 31 set means inline data follows (never for pointers).
    BYTE_COUNT: field = "byte_count" @ 8 * 0x00, 32;
    /// Memory key.
    LKEY: field = "lkey" @ 8 * 0x04, 32;
    /// Address (IOVA).
    ADDR: field = "addr" @ 8 * 0x08, 64;
}

layout! {
    /// Next segment of an RQ WQE (ignored for cyclic RQs; written as zero).
    pub struct WqeSrqNextSeg: Source::Dv("mlx5_wqe_srq_next_seg"), 16 * 8;
    /// Next WQE index (linked-list RQs only).
    NEXT_WQE_INDEX: field = "next_wqe_index" @ 8 * 0x02, 16;
    /// Signature.
    SIGNATURE: field = "signature" @ 8 * 0x04, 8;
}

layout! {
    /// Striding (multi-packet) RQ WQE, 32 bytes: next segment, then one data
    /// segment that covers all strides of the WQE.
    pub struct MprqWqe: Source::Dv("mlx5_mprq_wqe"), 32 * 8;
    /// Next segment (zero).
    NSEG: sub<WqeSrqNextSeg> = "nseg" @ 0;
    /// The buffer: byte_count = strides x stride size.
    DSEG: sub<WqeDataSeg> = "dseg" @ 8 * 0x10;
}

/// Bytes in a send WQE basic block (WQEBB).
pub const SEND_WQE_BB: usize = 64;
/// log2 of [`SEND_WQE_BB`] (`log_wq_stride` of an SQ).
pub const SEND_WQE_SHIFT: u32 = 6;
/// Bytes in a DS unit.
pub const SEND_WQE_DS: usize = 16;
/// The largest send WQE, in WQEBBs.
pub const SEND_WQE_MAX_WQEBBS: usize = 16;
/// Bytes of L2 header the device wants inline when it requires L2 inlining
/// (rdma-core's private `MLX5_ETH_L2_INLINE_HEADER_SIZE`; no installed twin).
pub const ETH_L2_INLINE_HEADER_SIZE: usize = 18;
/// log2 bytes of a striding-RQ WQE slot (`log_wq_stride` of the RQ).
pub const MPRQ_WQE_SHIFT: u32 = 5;

/// `fm_ce_se` completion-mode bits: always write a CQE.
pub const CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `fm_ce_se`: solicited event.
pub const CTRL_SOLICITED: u8 = 1 << 1;
/// `cs_flags`: compute the IPv4 header checksum.
pub const ETH_L3_CSUM: u8 = 1 << 6;
/// `cs_flags`: compute the L4 checksum.
pub const ETH_L4_CSUM: u8 = 1 << 7;
/// Data segment `byte_count` flag for inline data.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `fm_ce_se`: fence (wait for earlier WQEs).
pub const CTRL_FENCE: u8 = 4 << 5;
/// `fm_ce_se`: initiator small fence.
pub const CTRL_INITIATOR_SMALL_FENCE: u8 = 1 << 5;

bitflags::bitflags! {
    /// The control segment's `fm_ce_se` byte: fence mode [7:5], completion
    /// mode [3:2] (0b10 = always write a CQE), solicited event [1].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct FmCeSe: u8 {
        /// Write a CQE for this WQE (CE = 0b10; 0b11 also raises an EQE).
        const CQ_UPDATE = CTRL_CQ_UPDATE;
        /// Solicited event.
        const SOLICITED = CTRL_SOLICITED;
        /// Fence.
        const FENCE = CTRL_FENCE;
        /// Initiator small fence.
        const INITIATOR_SMALL_FENCE = CTRL_INITIATOR_SMALL_FENCE;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// The Ethernet segment's `cs_flags`: checksums the NIC computes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CsFlags: u8 {
        /// The (outer) IPv4 header checksum.
        const L3_CSUM = ETH_L3_CSUM;
        /// The (outer) TCP/UDP checksum.
        const L4_CSUM = ETH_L4_CSUM;
        const _ = !0;
    }
}
/// Doorbell record index of the RQ producer counter (in dwords).
pub const RCV_DBR: usize = 0;
/// Doorbell record index of the SQ producer counter (in dwords).
pub const SND_DBR: usize = 1;

/// Striding RQ: smallest stride, log2 bytes (field value 0).
pub const MPWQE_LOG_STRIDE_SZ_BASE: u32 = 6;
/// Striding RQ: largest stride, log2 bytes.
pub const MPWQE_LOG_STRIDE_SZ_MAX: u32 = 13;
/// Striding RQ: strides-per-WQE encoding base (field value 0 = 2^9).
pub const MPWQE_LOG_NUM_STRIDES_BASE: u32 = 9;
/// Striding RQ: extended range base (2^3, with `ext_stride_num_range`).
pub const MPWQE_LOG_NUM_STRIDES_EXT_BASE: u32 = 3;
/// Striding RQ: most strides per WQE, log2.
pub const MPWQE_LOG_NUM_STRIDES_MAX: u32 = 16;

/// Encodes `log2(strides per WQE)` into `wq.log_wqe_num_of_strides`:
/// 9..=16 map to 0..=7; with the extended range, 3..=8 map to 10..=15.
/// `None` if the count cannot be expressed.
pub const fn encode_log_num_strides(log_strides: u32, ext_range: bool) -> Option<u32> {
    if log_strides >= MPWQE_LOG_NUM_STRIDES_BASE && log_strides <= MPWQE_LOG_NUM_STRIDES_MAX {
        Some(log_strides - MPWQE_LOG_NUM_STRIDES_BASE)
    } else if ext_range
        && log_strides >= MPWQE_LOG_NUM_STRIDES_EXT_BASE
        && log_strides < MPWQE_LOG_NUM_STRIDES_BASE
    {
        Some(log_strides + 7)
    } else {
        None
    }
}

/// Inverse of [`encode_log_num_strides`].
pub const fn decode_log_num_strides(v: u32) -> Option<u32> {
    match v {
        0..=7 => Some(v + MPWQE_LOG_NUM_STRIDES_BASE),
        10..=15 => Some(v - 7),
        _ => None,
    }
}

/// Independent twins.
pub const CONSTS: &[ConstDesc] = &[
    dv("wqe::SEND_WQE_BB", SEND_WQE_BB as u64, "MLX5_SEND_WQE_BB"),
    dv(
        "wqe::SEND_WQE_SHIFT",
        SEND_WQE_SHIFT as u64,
        "MLX5_SEND_WQE_SHIFT",
    ),
    dv(
        "wqe::CTRL_CQ_UPDATE",
        CTRL_CQ_UPDATE as u64,
        "MLX5_WQE_CTRL_CQ_UPDATE",
    ),
    dv(
        "wqe::CTRL_SOLICITED",
        CTRL_SOLICITED as u64,
        "MLX5_WQE_CTRL_SOLICITED",
    ),
    dv(
        "wqe::ETH_L3_CSUM",
        ETH_L3_CSUM as u64,
        "MLX5_ETH_WQE_L3_CSUM",
    ),
    dv(
        "wqe::ETH_L4_CSUM",
        ETH_L4_CSUM as u64,
        "MLX5_ETH_WQE_L4_CSUM",
    ),
    dv("wqe::CTRL_FENCE", CTRL_FENCE as u64, "MLX5_WQE_CTRL_FENCE"),
    dv(
        "wqe::CTRL_INITIATOR_SMALL_FENCE",
        CTRL_INITIATOR_SMALL_FENCE as u64,
        "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
    ),
    dv("wqe::INLINE_SEG", INLINE_SEG as u64, "MLX5_INLINE_SEG"),
    dv("wqe::RCV_DBR", RCV_DBR as u64, "MLX5_RCV_DBR"),
    dv("wqe::SND_DBR", SND_DBR as u64, "MLX5_SND_DBR"),
    kernel("wqe::SEND_WQE_DS", SEND_WQE_DS as u64, "MLX5_SEND_WQE_DS"),
    kernel(
        "wqe::SEND_WQE_MAX_WQEBBS",
        SEND_WQE_MAX_WQEBBS as u64,
        "MLX5_SEND_WQE_MAX_WQEBBS",
    ),
    kernel(
        "wqe::MPWQE_LOG_STRIDE_SZ_BASE",
        MPWQE_LOG_STRIDE_SZ_BASE as u64,
        "MLX5_MPWQE_LOG_STRIDE_SZ_BASE",
    ),
    kernel(
        "wqe::MPWQE_LOG_STRIDE_SZ_MAX",
        MPWQE_LOG_STRIDE_SZ_MAX as u64,
        "MLX5_MPWQE_LOG_STRIDE_SZ_MAX",
    ),
    kernel(
        "wqe::MPWQE_LOG_NUM_STRIDES_BASE",
        MPWQE_LOG_NUM_STRIDES_BASE as u64,
        "MLX5_MPWQE_LOG_NUM_STRIDES_BASE",
    ),
    kernel(
        "wqe::MPWQE_LOG_NUM_STRIDES_EXT_BASE",
        MPWQE_LOG_NUM_STRIDES_EXT_BASE as u64,
        "MLX5_MPWQE_LOG_NUM_STRIDES_EXT_BASE",
    ),
    kernel(
        "wqe::MPWQE_LOG_NUM_STRIDES_MAX",
        MPWQE_LOG_NUM_STRIDES_MAX as u64,
        "MLX5_MPWQE_LOG_NUM_STRIDES_MAX",
    ),
];

const fn dv(rust: &'static str, value: u64, c_name: &'static str) -> ConstDesc {
    ConstDesc {
        rust,
        value,
        header: ConstHeader::Dv,
        c_name,
    }
}

const fn kernel(rust: &'static str, value: u64, c_name: &'static str) -> ConstDesc {
    ConstDesc {
        rust,
        value,
        header: ConstHeader::Kernel,
        c_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_count_encoding_matches_kernel_table() {
        // The kernel's table, indexed from log2 = 3: 3->10 .. 8->15, 9->0 .. 16->7.
        let table = [
            (3, 10),
            (4, 11),
            (5, 12),
            (6, 13),
            (7, 14),
            (8, 15),
            (9, 0),
            (10, 1),
            (16, 7),
        ];
        for (log, v) in table {
            assert_eq!(encode_log_num_strides(log, true), Some(v), "log {log}");
            assert_eq!(decode_log_num_strides(v), Some(log));
        }
        assert_eq!(encode_log_num_strides(8, false), None);
        assert_eq!(encode_log_num_strides(17, true), None);
        assert_eq!(encode_log_num_strides(2, true), None);
        assert_eq!(decode_log_num_strides(8), None);
    }
}
