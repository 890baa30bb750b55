//! VFIO backend: a PCI function bound to vfio-pci, its IOMMU address space
//! and its BARs, without rdma-core, DPDK or a kernel driver.
//!
//! Layers, bottom up (each usable on its own; the QEMU guest tests drive
//! them with non-mlx5 devices):
//!
//! * [`PciAddress`]: `DDDD:BB:DD.F` parsing and display.
//! * [`sysfs`]: read-only lookups (ids, driver, IOMMU group, members, NUMA
//!   node, interfaces) rooted at a configurable path; [`sysfs::FakeSysfs`]
//!   builds a fake tree for tests.
//! * [`Container`]: `/dev/vfio/vfio` with the type1v2 IOMMU; the usable IOVA
//!   ranges from `VFIO_IOMMU_GET_INFO` (legacy x86 ranges when the kernel
//!   does not report them); a naturally aligned IOVA allocator; MAP/UNMAP_DMA.
//!   It implements [`mempool::DmaMapper`], so hugepage regions register with it.
//! * [`Group`]: `/dev/vfio/N`, checked viable, attached to a container.
//! * [`VfioDevice`]: any PCI function: region info, BAR mmap ([`Bar`]),
//!   config space, bus mastering, reset. One owner per function: a second
//!   open in the process is [`VfioError::DeviceAlreadyOpen`]; the kernel
//!   refuses a second owner of a group with EBUSY ([`VfioError::GroupBusy`]).
//! * [`VfioBackend`]: an mlx5 function (vendor 0x15b3 and the device-id
//!   table) implementing [`crate::hw::HwBackend`]: BAR0 through one choke
//!   point (bounds-checked volatile access, big-endian conversion),
//!   BlueFlame copies bracketed by the write-combining barriers.
//!
//! Interrupts: the driver polls, but firmware refuses an EQ on a vector
//! that is not enabled, so MSI-X vector 0 gets an eventfd through
//! `VFIO_DEVICE_SET_IRQS` before the EQ is created, asking the kernel for
//! that one vector (the whole table only if that is refused); nothing
//! waits on it.
//!
//! Why not the `vfio-ioctls` crate: it offers no `VFIO_IOMMU_GET_INFO` (so no
//! IOVA ranges), its region reads/writes and reset log failures instead of
//! returning them, its group is private and its group errors carry no
//! values (no way to name the members that make a group non-viable), and it
//! hard-codes `/dev/vfio`. We use rust-vmm's `vfio-bindings` for the kernel
//! structures and issue the dozen ioctls ourselves, all in `sys`, the only
//! module with `unsafe` code (plus one call of `sys::map_dma` in
//! `container`, under the `DmaMapper` contract).

mod backend;
mod container;
mod device;
mod error;
mod group;
pub mod iova;
mod pci_address;
mod sys;
pub mod sysfs;

pub use backend::{DeviceCheck, VfioBackend, is_mlx5};
pub use container::{Container, LiveMapping};
pub use device::{Bar, IrqEventFd, RegionInfo, VfioDevice, VfioPaths, is_vfio_driver};
pub use error::{BIND_HINT, IOMMU_HINT, VfioError};
pub use group::{Group, VIABLE_DRIVERS, blockers, driver_keeps_group_viable};
pub use iova::{IommuInfo, IovaAllocator, IovaRange};
pub use pci_address::{ParsePciAddressError, PciAddress};
/// VFIO interrupt indices for [`VfioDevice::enable_irq`].
pub use vfio_bindings::bindings::vfio::{VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX};
