//! The command queue: its 64-byte entries and the 576-byte mailbox blocks
//! that carry command input and output beyond the first 16 bytes
//! (kernel `device.h`: `struct mlx5_cmd_layout`, `struct mlx5_cmd_prot_block`).

use crate::layout;
use crate::prm::Source;

layout! {
    /// One command queue entry.
    pub struct CmdLayout: Source::Kernel { header: "device.h", name: "mlx5_cmd_layout" }, 64 * 8;
    /// Always 7 (PCIe command transport).
    TYPE: field = "type" @ 8 * 0x00, 8;
    /// Input bytes, counting the 16 inline ones.
    INLEN: field = "inlen" @ 8 * 0x04, 32;
    /// DMA address of the first input mailbox.
    IN_PTR: field = "in_ptr" @ 8 * 0x08, 64;
    /// First 16 bytes of the input.
    IN: field = "in" @ 8 * 0x10, 128;
    /// First 16 bytes of the output.
    OUT: field = "out" @ 8 * 0x20, 128;
    /// DMA address of the first output mailbox.
    OUT_PTR: field = "out_ptr" @ 8 * 0x30, 64;
    /// Output bytes expected.
    OUTLEN: field = "outlen" @ 8 * 0x38, 32;
    /// Token, repeated in every mailbox block.
    TOKEN: field = "token" @ 8 * 0x3c, 8;
    /// Signature (only checked with command checksums on).
    SIG: field = "sig" @ 8 * 0x3d, 8;
    /// Bit 0 ownership (1 = hardware), bits `[7:1]` delivery status.
    STATUS_OWN: field = "status_own" @ 8 * 0x3f, 8;
}

layout! {
    /// One mailbox block.
    pub struct CmdProtBlock: Source::Kernel { header: "device.h", name: "mlx5_cmd_prot_block" }, 0x240 * 8;
    /// 512 data bytes.
    DATA: field = "data" @ 0, 512 * 8;
    /// DMA address of the next block, 0 on the last.
    NEXT: field = "next" @ 8 * 0x230, 64;
    /// 0, 1, 2, ... in chain order.
    BLOCK_NUM: field = "block_num" @ 8 * 0x238, 32;
    /// Must match the entry's token.
    TOKEN: field = "token" @ 8 * 0x23d, 8;
    /// Control signature.
    CTRL_SIG: field = "ctrl_sig" @ 8 * 0x23e, 8;
    /// Signature.
    SIG: field = "sig" @ 8 * 0x23f, 8;
}

/// `type` of every entry: PCIe command transport.
pub const CMD_TYPE_PCIE: u8 = 7;
/// `status_own` bit 0: hardware owns the entry.
pub const CMD_OWNER_HW: u8 = 1;
/// Bytes of input and output carried inline in the entry.
pub const INLINE_BYTES: usize = 16;
/// Data bytes per mailbox block.
pub const MAILBOX_DATA_BYTES: usize = 512;
/// Size of a mailbox block.
pub const MAILBOX_BYTES: usize = 0x240;
/// The largest command queue the driver accepts (entries). The slot kept
/// for MANAGE_PAGES is the last one the firmware reports (31 with 32
/// entries), not a fixed number.
pub const MAX_ENTRIES: usize = 32;
/// The smallest: one general slot and the pages slot.
pub const MIN_ENTRIES: usize = 2;

/// Mailbox blocks needed for a message of `len` bytes.
pub const fn mailbox_blocks(len: usize) -> usize {
    len.saturating_sub(INLINE_BYTES)
        .div_ceil(MAILBOX_DATA_BYTES)
}

/// Independent twins.
pub const CONSTS: &[super::ConstDesc] = &[super::ConstDesc {
    rust: "cmdq::MAILBOX_DATA_BYTES",
    value: MAILBOX_DATA_BYTES as u64,
    header: super::ConstHeader::Kernel,
    c_name: "MLX5_CMD_DATA_BLOCK_SIZE",
}];

#[cfg(test)]
mod tests {
    #[test]
    fn mailbox_block_count_matches_facts_sheet() {
        assert_eq!(super::mailbox_blocks(16), 0);
        assert_eq!(super::mailbox_blocks(17), 1);
        assert_eq!(super::mailbox_blocks(16 + 512), 1);
        // QUERY_HCA_CAP output: 0x1010 bytes = 16 inline + 8 blocks.
        assert_eq!(super::mailbox_blocks(0x1010), 8);
    }
}
