//! The hardware boundary: what the driver needs from a PCI function.
//!
//! Two backends implement [`HwBackend`]: the VFIO backend (a real ConnectX
//! behind `vfio-pci`) and the device model in the `mlx5-sim` crate. The
//! driver is generic over it (monomorphized, no virtual calls) and its code
//! path is identical on both.
//!
//! Register values are exchanged as host-order integers: the backend does
//! the big-endian conversion (mlx5 registers and doorbells are big-endian).
//! A 64-bit write is one big-endian 8-byte store (doorbells must not be
//! split). BlueFlame data is passed as raw bytes in memory order.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use mempool::DmaMapper;

/// Access to one mlx5 PCI function.
///
/// Implementations are shared by every queue set of a device (one per
/// thread), so they are `Send + Sync`; MMIO itself needs no locking.
pub trait HwBackend: Send + Sync + 'static {
    /// Bytes in BAR0.
    fn bar0_len(&self) -> usize;

    /// Reads the big-endian 32-bit register at `offset` (4-byte aligned).
    fn read32(&self, offset: usize) -> u32;

    /// Writes the big-endian 32-bit register at `offset` (4-byte aligned).
    fn write32(&self, offset: usize, value: u32);

    /// Writes `value` as one big-endian 8-byte store at `offset` (8-byte
    /// aligned): the send doorbell (first 8 bytes of a WQE's control
    /// segment) and the CQ arm doorbell.
    fn write64(&self, offset: usize, value: u64);

    /// Copies `data` (1..=4 chunks of 64 bytes, in memory order) into a
    /// BlueFlame register at `offset` with write-combining stores. The caller
    /// brackets it with [`crate::barrier::wc_start`]/[`crate::barrier::wc_flush`].
    fn write_bf(&self, offset: usize, data: &[u8]);

    /// Reads PCI configuration space.
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> io::Result<()>;

    /// Writes PCI configuration space.
    fn config_write(&self, offset: u16, data: &[u8]) -> io::Result<()>;

    /// Enables MSI-X with vector `vector` routed to an interrupt sink
    /// (VFIO: `VFIO_DEVICE_SET_IRQS` with an eventfd, as rdma-core does
    /// before its first CREATE_EQ; every reference driver enables MSI-X
    /// before it creates an EQ on a vector). The driver still polls its EQ;
    /// nothing waits on the sink.
    fn enable_msix(&self, vector: u16) -> io::Result<()>;

    /// Disables MSI-X again (after the last EQ is destroyed).
    fn disable_msix(&self) -> io::Result<()>;

    /// True if BAR0 is mapped write-combining, so that a 64-byte BlueFlame
    /// copy reaches the device as one burst. vfio-pci maps BARs uncached,
    /// so the VFIO backend says no and BlueFlame stays off.
    fn bar_write_combining(&self) -> bool;

    /// The IOMMU side: maps host memory so that the device can reach it.
    fn dma_mapper(&self) -> Arc<dyn DmaMapper>;

    /// Lets time pass while the driver polls (firmware readiness, a command,
    /// a page request). Real hardware sleeps; a model may advance its clock.
    /// Timeouts in the driver are sums of these waits, never wall-clock reads.
    fn wait(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    /// Monotonic time since an arbitrary origin, for pacing the health
    /// check against the firmware heartbeat. A model may use its own clock.
    fn now(&self) -> Duration {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed()
    }

    /// Human-readable name for errors and logs (`vfio 0000:03:00.0`, `sim nic 2`).
    fn describe(&self) -> String;
}

/// PCI configuration space offsets and bits the driver uses.
pub mod pci {
    /// Vendor id (16 bits).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device id (16 bits).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command register (16 bits).
    pub const COMMAND: u16 = 0x04;
    /// Command: memory space enable.
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    /// Command: bus master enable.
    pub const COMMAND_MASTER: u16 = 1 << 2;
    /// Mellanox / NVIDIA networking vendor id.
    pub const MELLANOX_VENDOR_ID: u16 = 0x15b3;
}

/// mlx5-class device ids (ConnectX-4 and later, their VFs and BlueField),
/// as the kernel's mlx5_core and rdma-core's mlx5 provider list them.
pub const MLX5_DEVICE_IDS: &[(u16, &str)] = &[
    (0x1011, "Connect-IB"),
    (0x1012, "Connect-IB VF"),
    (0x1013, "ConnectX-4"),
    (0x1014, "ConnectX-4 VF"),
    (0x1015, "ConnectX-4 Lx"),
    (0x1016, "ConnectX-4 Lx VF"),
    (0x1017, "ConnectX-5"),
    (0x1018, "ConnectX-5 VF"),
    (0x1019, "ConnectX-5 Ex"),
    (0x101a, "ConnectX-5 Ex VF"),
    (0x101b, "ConnectX-6"),
    (0x101c, "ConnectX-6 VF"),
    (0x101d, "ConnectX-6 Dx"),
    (0x101e, "ConnectX family VF"),
    (0x101f, "ConnectX-6 Lx"),
    (0x1021, "ConnectX-7"),
    (0x1023, "ConnectX-8"),
    (0x1025, "ConnectX-9"),
    (0xa2d2, "BlueField"),
    (0xa2d3, "BlueField VF"),
    (0xa2d6, "BlueField-2"),
    (0xa2dc, "BlueField-3"),
];

/// The virtual-function ids among [`MLX5_DEVICE_IDS`] (the kernel's
/// `MLX5_PCI_DEV_IS_VF` entries). A VF does not own PF-only registers such
/// as HOST_ENDIANNESS (Linux `set_hca_ctrl` and FreeBSD return early).
pub const MLX5_VF_DEVICE_IDS: &[u16] = &[
    0x1012, 0x1014, 0x1016, 0x1018, 0x101a, 0x101c, 0x101e, 0xa2d3,
];

/// True if `device_id` is an mlx5 virtual function.
pub fn mlx5_is_vf(device_id: u16) -> bool {
    MLX5_VF_DEVICE_IDS.contains(&device_id)
}

/// Name of an mlx5 device id, or `None` if the driver does not know it.
pub fn mlx5_device_name(device_id: u16) -> Option<&'static str> {
    MLX5_DEVICE_IDS
        .iter()
        .find(|(id, _)| *id == device_id)
        .map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vf_id_is_a_known_vf() {
        for id in MLX5_VF_DEVICE_IDS {
            let name = mlx5_device_name(*id).expect("in the name table");
            assert!(name.ends_with("VF"), "{id:#x} {name}");
        }
        for (id, name) in MLX5_DEVICE_IDS {
            assert_eq!(mlx5_is_vf(*id), name.ends_with("VF"), "{id:#x} {name}");
        }
    }
}
