//! The initialization segment at the start of BAR0, and its health buffer
//! (kernel `device.h`: `struct mlx5_init_seg`, `struct health_buffer`).
//!
//! These are 32-bit big-endian registers; the layouts give their offsets,
//! and the constants below give the sub-fields inside them.

use crate::layout;
use crate::prm::Source;

layout! {
    /// The initialization segment (BAR0 offset 0).
    pub struct InitSeg: Source::Kernel { header: "device.h", name: "mlx5_init_seg" }, 0x2010 * 8;
    /// `[15:0]` FW major, `[31:16]` FW minor.
    FW_REV: field = "fw_rev" @ 8 * 0x0000, 32;
    /// `[31:16]` command-interface revision (must be 5), `[15:0]` FW sub-minor.
    CMDIF_REV_FW_SUB: field = "cmdif_rev_fw_sub" @ 8 * 0x0004, 32;
    /// High 32 bits of the command queue address.
    CMDQ_ADDR_H: field = "cmdq_addr_h" @ 8 * 0x0010, 32;
    /// Write: low address bits. Read: `[31:12]` address, `[10:8]` nic_interface, `[7:4]` log size, `[3:0]` log stride.
    CMDQ_ADDR_L_SZ: field = "cmdq_addr_l_sz" @ 8 * 0x0014, 32;
    /// Write `1 << slot` to start a command.
    CMD_DBELL: field = "cmd_dbell" @ 8 * 0x0018, 32;
    /// Bit 31: firmware initializing. Bit 30: FW reset supported.
    INITIALIZING: field = "initializing" @ 8 * 0x01fc, 32;
    /// The health buffer.
    HEALTH: sub<HealthBuffer> = "health" @ 8 * 0x0200;
    /// Firmware-advertised command timeout (ms, newer firmware).
    CMD_EXEC_TO: field = "cmd_exec_to" @ 8 * 0x0ff8, 32;
    /// Firmware-advertised command-queue init timeout.
    CMD_Q_INIT_TO: field = "cmd_q_init_to" @ 8 * 0x0ffc, 32;
    /// Free-running device clock, high half.
    INTERNAL_TIMER_H: field = "internal_timer_h" @ 8 * 0x1000, 32;
    /// Free-running device clock, low half.
    INTERNAL_TIMER_L: field = "internal_timer_l" @ 8 * 0x1004, 32;
    /// `[23:0]` firmware heartbeat; must keep changing.
    HEALTH_COUNTER: field = "health_counter" @ 8 * 0x1010, 32;
    /// Real-time clock, high half.
    REAL_TIME_H: field = "real_time_h" @ 8 * 0x1040, 32;
    /// Real-time clock, low half.
    REAL_TIME_L: field = "real_time_l" @ 8 * 0x1044, 32;
    /// IEEE 1588 clock.
    IEEE1588_CLK: field = "ieee1588_clk" @ 8 * 0x2000, 64;
    /// IEEE 1588 clock type.
    IEEE1588_CLK_TYPE: field = "ieee1588_clk_type" @ 8 * 0x2008, 32;
    /// Clear INTx.
    CLR_INTX: field = "clr_intx" @ 8 * 0x200c, 32;
}

layout! {
    /// The bits of the `initializing` register (BAR0 + 0x1fc) as
    /// `mlx5_ifc.h` names them (`initial_seg`): bit offsets from the start
    /// of the segment.
    pub struct InitialSegBits: Source::Ifc("initial_seg"), 0x1000 * 8;
    /// Firmware still initializing (`initializing` bit 31).
    INITIALIZING: field = "initializing" @ 0xfe0, 1;
    /// NIC interface modes the firmware supports.
    NIC_INTERFACE_SUPPORTED: field = "nic_interface_supported" @ 0xfe5, 3;
    /// The function is a BlueField embedded-CPU function (ECPF): Linux
    /// `mlx5_read_embedded_cpu` reads it to set `embedded_cpu_function` in
    /// ENABLE/DISABLE_HCA and QUERY_PAGES.
    EMBEDDED_CPU: field = "embedded_cpu" @ 0xfe8, 1;
}

/// `initializing` register value bit of [`InitialSegBits::EMBEDDED_CPU`] (bit 23).
pub const EMBEDDED_CPU_BIT: u32 = 1 << (31 - InitialSegBits::EMBEDDED_CPU.bit() % 32);
const _: () = assert!(
    InitialSegBits::EMBEDDED_CPU.bit() / 32 == InitSeg::INITIALIZING.bit() / 32
        && EMBEDDED_CPU_BIT == 1 << 23
        && InitialSegBits::INITIALIZING.bit().is_multiple_of(32)
);

layout! {
    /// The health buffer (BAR0 + 0x200).
    pub struct HealthBuffer: Source::Kernel { header: "device.h", name: "health_buffer" }, 0x40 * 8;
    /// Assert variables (6 dwords in the kernel, 5 in rdma-core).
    ASSERT_VAR: field = "assert_var" @ 8 * 0x00, 6 * 32;
    /// Assert exit pointer.
    ASSERT_EXIT_PTR: field = "assert_exit_ptr" @ 8 * 0x20, 32;
    /// Assert caller return address.
    ASSERT_CALLRA: field = "assert_callra" @ 8 * 0x24, 32;
    /// Time of the event (kernel only).
    TIME: field = "time" @ 8 * 0x2c, 32;
    /// Firmware version; 0xffffffff when the device has gone from PCI.
    FW_VER: field = "fw_ver" @ 8 * 0x30, 32;
    /// Hardware id.
    HW_ID: field = "hw_id" @ 8 * 0x34, 32;
    /// Bit 7: reset required (RFR); `[6:0]` severity.
    RFR_SEVERITY: field = "rfr_severity" @ 8 * 0x38, 8;
    /// iRISC that raised the syndrome.
    IRISC_INDEX: field = "irisc_index" @ 8 * 0x3c, 8;
    /// Health syndrome, 0 = healthy (see `HealthSyndrome`).
    SYND: field = "synd" @ 8 * 0x3d, 8;
    /// Extended syndrome.
    EXT_SYND: field = "ext_synd" @ 8 * 0x3e, 16;
}

/// `cmdif_rev_fw_sub`: command-interface revision is bits `[31:16]`.
pub const CMDIF_REV_SHIFT: u32 = 16;
/// The only command-interface revision this driver speaks.
pub const CMDIF_REV: u32 = 5;
/// `cmdq_addr_l_sz`: `nic_interface` is bits `[10:8]`.
pub const NIC_IFC_SHIFT: u32 = 8;
/// `nic_interface` mask after shifting.
pub const NIC_IFC_MASK: u32 = 0x7;
/// `nic_interface`: full driver (normal).
pub const NIC_IFC_FULL_DRIVER: u32 = 0;
/// `nic_interface`: disabled.
pub const NIC_IFC_DISABLED: u32 = 1;
/// `nic_interface`: no-DRAM NIC.
pub const NIC_IFC_NO_DRAM_NIC: u32 = 2;
/// `nic_interface`: software reset.
pub const NIC_IFC_SW_RESET: u32 = 7;
/// `cmdq_addr_l_sz`: log2 entries in bits `[7:4]`.
pub const LOG_CMDQ_SIZE_SHIFT: u32 = 4;
/// `cmdq_addr_l_sz`: log2 bytes per entry in bits `[3:0]`.
pub const LOG_CMDQ_STRIDE_MASK: u32 = 0xf;
/// `initializing`: bit 31 set while firmware initializes.
pub const INITIALIZING_BIT: u32 = 1 << 31;
/// `initializing`: bit 30, firmware reset supported.
pub const FW_RESET_SUPPORTED_SHIFT: u32 = 30;
/// `health_counter` heartbeat mask.
pub const HEALTH_COUNTER_MASK: u32 = 0x00ff_ffff;
/// `rfr_severity`: reset-required bit.
pub const RFR_BIT: u8 = 1 << 7;
/// Byte offset of the health syndrome in BAR0.
pub const HEALTH_SYND_OFFSET: usize = 0x23d;

/// Independent twins of the constants above.
pub const CONSTS: &[super::ConstDesc] = &[
    super::ConstDesc {
        rust: "init_seg::NIC_IFC_SHIFT",
        value: NIC_IFC_SHIFT as u64,
        header: super::ConstHeader::Kernel,
        c_name: "MLX5_NIC_IFC_OFFSET",
    },
    super::ConstDesc {
        rust: "init_seg::FW_RESET_SUPPORTED_SHIFT",
        value: FW_RESET_SUPPORTED_SHIFT as u64,
        header: super::ConstHeader::Kernel,
        c_name: "MLX5_FW_RESET_SUPPORTED_OFFSET",
    },
];
