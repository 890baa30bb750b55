//! Any PCI function behind vfio-pci: open, region info, BAR mappings,
//! config space, reset. Nothing here is mlx5-specific (the guest tests use
//! it with QEMU's `edu` and `e1000e`); [`super::VfioBackend`] adds that.

#![deny(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use super::container::Container;
use super::group::Group;
use super::sys::{self, Mmio};
use super::sysfs::Sysfs;
use super::{PciAddress, VfioError};
use crate::hw::pci;

/// Where the VFIO layer looks for sysfs and the VFIO nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioPaths {
    /// sysfs (normally `/sys`).
    pub sysfs: Sysfs,
    /// Directory of the VFIO nodes (normally `/dev/vfio`; the container is
    /// `vfio` inside it, groups are numbered nodes).
    pub dev_vfio: PathBuf,
}

impl Default for VfioPaths {
    fn default() -> Self {
        VfioPaths {
            sysfs: Sysfs::default(),
            dev_vfio: PathBuf::from("/dev/vfio"),
        }
    }
}

impl VfioPaths {
    /// The container node.
    pub fn container(&self) -> PathBuf {
        self.dev_vfio.join("vfio")
    }

    /// The node of group `number`.
    pub fn group(&self, number: u32) -> PathBuf {
        self.dev_vfio.join(number.to_string())
    }
}

/// True if `driver` is vfio-pci or a vfio-pci variant driver.
pub fn is_vfio_driver(driver: &str) -> bool {
    driver == "vfio-pci" || driver.ends_with("_vfio_pci") || driver.ends_with("-vfio-pci")
}

/// Functions open in this process: VFIO gives a device one owner, and a
/// second open in the same process would otherwise succeed silently.
static OPEN_DEVICES: Mutex<BTreeSet<PciAddress>> = Mutex::new(BTreeSet::new());

#[derive(Debug)]
struct Claim(PciAddress);

impl Claim {
    fn take(bdf: PciAddress) -> Result<Claim, VfioError> {
        let mut open = OPEN_DEVICES.lock().unwrap_or_else(|p| p.into_inner());
        if !open.insert(bdf) {
            return Err(VfioError::DeviceAlreadyOpen { bdf });
        }
        Ok(Claim(bdf))
    }
}

/// Takes the in-process claim on `bdf` (unit tests of the exclusivity rule).
#[cfg(test)]
pub(crate) fn tests_claim(bdf: PciAddress) -> Result<impl std::fmt::Debug, VfioError> {
    Claim::take(bdf)
}

impl Drop for Claim {
    fn drop(&mut self) {
        OPEN_DEVICES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

/// What `VFIO_DEVICE_GET_REGION_INFO` says about one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RegionInfo {
    /// Region index (BARs 0-5, ROM 6, config 7, VGA 8).
    pub index: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Bytes (0: the BAR is not implemented).
    pub size: u64,
    /// Offset of the region in the device fd.
    pub offset: u64,
}

impl RegionInfo {
    /// Readable with `pread`.
    pub fn readable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_READ != 0
    }
    /// Writable with `pwrite`.
    pub fn writable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_WRITE != 0
    }
    /// Can be mmapped.
    pub fn mappable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_MMAP != 0
    }
}

/// The open device fd, shared by the device handle and its BAR mappings so
/// that a mapping never outlives the fd (vfio-pci disables the device when
/// the last fd closes).
#[derive(Debug)]
struct DeviceFd {
    bdf: PciAddress,
    file: File,
    flags: u32,
    num_regions: u32,
    config: RegionInfo,
    _group: Arc<Group>,
    _container: Arc<Container>,
    _claim: Claim,
}

/// One PCI function opened through VFIO.
#[derive(Debug)]
pub struct VfioDevice {
    fd: Arc<DeviceFd>,
    container: Arc<Container>,
    group: Arc<Group>,
}

impl VfioDevice {
    /// Opens `bdf`: checks that it exists, is bound to vfio-pci and has an
    /// IOMMU group; opens a new container and the group, selects type1v2,
    /// reads the IOVA ranges and gets the device fd.
    pub fn open(bdf: PciAddress, paths: &VfioPaths) -> Result<VfioDevice, VfioError> {
        let sysfs = &paths.sysfs;
        if !sysfs.exists(bdf) {
            return Err(VfioError::NoSuchDevice {
                bdf,
                path: sysfs.device_dir(bdf),
            });
        }
        let driver = sysfs.driver(bdf).map_err(|source| VfioError::Sysfs {
            bdf,
            path: sysfs.device_dir(bdf).join("driver"),
            source,
        })?;
        if !driver.as_deref().is_some_and(is_vfio_driver) {
            return Err(VfioError::NotBoundToVfio { bdf, driver });
        }
        let group_link = sysfs.device_dir(bdf).join("iommu_group");
        let number = sysfs
            .iommu_group(bdf)
            .map_err(|source| VfioError::Sysfs {
                bdf,
                path: group_link.clone(),
                source,
            })?
            .ok_or(VfioError::NoIommuGroup {
                bdf,
                path: group_link,
            })?;
        let claim = Claim::take(bdf)?;
        let group = Group::open(&paths.dev_vfio, number, bdf, sysfs)?;
        let container = Container::open(paths.container())?;
        let group = container.attach(group)?;
        Self::open_claimed(bdf, container, group, claim)
    }

    /// Opens `bdf`, a member of `group`, which is already attached to
    /// `container` (for several functions in one group or one container).
    pub fn open_in(
        bdf: PciAddress,
        container: &Arc<Container>,
        group: &Arc<Group>,
    ) -> Result<VfioDevice, VfioError> {
        let claim = Claim::take(bdf)?;
        Self::open_claimed(bdf, container.clone(), group.clone(), claim)
    }

    fn open_claimed(
        bdf: PciAddress,
        container: Arc<Container>,
        group: Arc<Group>,
        claim: Claim,
    ) -> Result<VfioDevice, VfioError> {
        let name = CString::new(bdf.to_string()).expect("a PCI address has no NUL");
        let owned =
            sys::group_get_device_fd(group.fd(), &name).map_err(|source| VfioError::Ioctl {
                op: "VFIO_GROUP_GET_DEVICE_FD",
                target: format!("{bdf} in group {}", group.path().display()),
                source,
            })?;
        let file = File::from(owned);
        let info = sys::device_info(file.as_fd()).map_err(|source| VfioError::Ioctl {
            op: "VFIO_DEVICE_GET_INFO",
            target: format!("device {bdf}"),
            source,
        })?;
        if info.flags & VFIO_DEVICE_FLAGS_PCI == 0 {
            return Err(VfioError::Ioctl {
                op: "VFIO_DEVICE_GET_INFO",
                target: format!("device {bdf}"),
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("not a PCI device (flags {:#x})", info.flags),
                ),
            });
        }
        let config = region_info_of(&file, bdf, info.num_regions, VFIO_PCI_CONFIG_REGION_INDEX)?;
        Ok(VfioDevice {
            fd: Arc::new(DeviceFd {
                bdf,
                file,
                flags: info.flags,
                num_regions: info.num_regions,
                config,
                _group: group.clone(),
                _container: container.clone(),
                _claim: claim,
            }),
            container,
            group,
        })
    }

    /// The function's address.
    pub fn bdf(&self) -> PciAddress {
        self.fd.bdf
    }

    /// The container (its IOMMU address space; a [`mempool::DmaMapper`]).
    pub fn container(&self) -> &Arc<Container> {
        &self.container
    }

    /// The group.
    pub fn group(&self) -> &Arc<Group> {
        &self.group
    }

    /// `VFIO_DEVICE_FLAGS_*`.
    pub fn flags(&self) -> u32 {
        self.fd.flags
    }

    /// Number of regions the device reports.
    pub fn num_regions(&self) -> u32 {
        self.fd.num_regions
    }

    /// Region `index` (BAR n is index n; config space is 7).
    pub fn region_info(&self, index: u32) -> Result<RegionInfo, VfioError> {
        region_info_of(&self.fd.file, self.fd.bdf, self.fd.num_regions, index)
    }

    /// Reads config space at `offset` into `buf`.
    pub fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), VfioError> {
        let at = self.config_span(offset, buf.len(), "read")?;
        self.fd
            .file
            .read_exact_at(buf, at)
            .map_err(|source| self.config_error("read", offset, buf.len(), source))
    }

    /// Writes `data` to config space at `offset` (vfio-pci filters writes to
    /// fields it virtualizes, e.g. BARs and MSI-X).
    pub fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), VfioError> {
        let at = self.config_span(offset, data.len(), "write")?;
        self.fd
            .file
            .write_all_at(data, at)
            .map_err(|source| self.config_error("write", offset, data.len(), source))
    }

    /// Reads a little-endian 16-bit config register.
    pub fn config_read_u16(&self, offset: u16) -> Result<u16, VfioError> {
        let mut b = [0u8; 2];
        self.config_read(offset, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Reads a little-endian 32-bit config register.
    pub fn config_read_u32(&self, offset: u16) -> Result<u32, VfioError> {
        let mut b = [0u8; 4];
        self.config_read(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Writes a little-endian 16-bit config register.
    pub fn config_write_u16(&self, offset: u16, value: u16) -> Result<(), VfioError> {
        self.config_write(offset, &value.to_le_bytes())
    }

    /// Vendor and device id from config space.
    pub fn ids(&self) -> Result<(u16, u16), VfioError> {
        Ok((
            self.config_read_u16(pci::VENDOR_ID)?,
            self.config_read_u16(pci::DEVICE_ID)?,
        ))
    }

    /// Sets Memory Space Enable and Bus Master Enable in the command
    /// register (nothing else), checks that they stuck, and returns the
    /// command register.
    pub fn enable_bus_master(&self) -> Result<u16, VfioError> {
        let want = pci::COMMAND_MEMORY | pci::COMMAND_MASTER;
        let command = self.config_read_u16(pci::COMMAND)?;
        if command & want != want {
            self.config_write_u16(pci::COMMAND, command | want)?;
        }
        let command = self.config_read_u16(pci::COMMAND)?;
        if command & want != want {
            return Err(VfioError::BusMasterNotEnabled {
                bdf: self.bdf(),
                command,
            });
        }
        Ok(command)
    }

    /// Maps region `index` (a memory BAR) into the address space.
    pub fn map_bar(&self, index: u32) -> Result<Bar, VfioError> {
        let info = self.region_info(index)?;
        if !info.mappable() || info.size == 0 {
            return Err(VfioError::NotMappable {
                bdf: self.bdf(),
                index,
                flags: info.flags,
                size: info.size,
            });
        }
        let len = usize::try_from(info.size).map_err(|_| VfioError::NotMappable {
            bdf: self.bdf(),
            index,
            flags: info.flags,
            size: info.size,
        })?;
        let label = format!("{} BAR{index}", self.bdf());
        let mmio = Mmio::map(self.fd.file.as_fd(), info.offset, len, label).map_err(|source| {
            VfioError::Mmap {
                bdf: self.bdf(),
                index,
                offset: info.offset,
                len: info.size,
                source,
            }
        })?;
        Ok(Bar {
            mmio,
            index,
            _fd: self.fd.clone(),
        })
    }

    /// `VFIO_DEVICE_GET_IRQ_INFO`: (flags, vector count) of interrupt
    /// `index` (`VFIO_PCI_MSIX_IRQ_INDEX`, ...).
    pub fn irq_info(&self, index: u32) -> Result<(u32, u32), VfioError> {
        let i = sys::irq_info(self.fd.file.as_fd(), index).map_err(|source| VfioError::Ioctl {
            op: "VFIO_DEVICE_GET_IRQ_INFO",
            target: format!("device {}", self.bdf()),
            source,
        })?;
        Ok((i.flags, i.count))
    }

    /// Enables interrupt `index` with an eventfd behind `vector`, asking
    /// the kernel for as few vectors as that takes (`vector + 1`): the
    /// first `VFIO_DEVICE_SET_IRQS` fixes how many it allocates (without
    /// dynamic MSI-X, `VFIO_IRQ_INFO_NORESIZE`), and a host may be unable to
    /// allocate a large table (a ConnectX-6 Dx/ConnectX-7 function has
    /// hundreds or thousands of vectors), while this driver never adds a
    /// vector later. If that is refused, every vector the function has is
    /// asked for (rdma-core's way, which fits hosts that insist on the
    /// whole table). The other vectors stay unrouted. Undo with
    /// [`VfioDevice::disable_irq`].
    pub fn enable_irq(&self, index: u32, vector: u32) -> Result<IrqEventFd, VfioError> {
        let (flags, count) = self.irq_info(index)?;
        let bad = |why: String| VfioError::IrqUnsupported {
            bdf: self.bdf(),
            index,
            why,
        };
        if flags & VFIO_IRQ_INFO_EVENTFD == 0 {
            return Err(bad("vfio-pci cannot signal it through an eventfd".into()));
        }
        if vector >= count {
            return Err(bad(format!("vector {vector}, the function has {count}")));
        }
        let fd = sys::eventfd().map_err(|source| VfioError::Ioctl {
            op: "eventfd",
            target: format!("device {}", self.bdf()),
            source,
        })?;
        let mut first_err = None;
        for n in irq_vector_counts(vector, count) {
            let mut fds = vec![-1; n as usize];
            fds[vector as usize] = fd.as_raw_fd();
            match sys::set_irq_eventfds(self.fd.file.as_fd(), index, 0, &fds) {
                Ok(()) => {
                    if first_err.is_some() {
                        tracing::warn!(bdf = %self.bdf(), index, vectors = n, "SET_IRQS with fewer vectors was refused; every vector was allocated instead");
                    }
                    return Ok(IrqEventFd {
                        fd,
                        index,
                        vector,
                        vectors: n,
                    });
                }
                Err(source) => {
                    tracing::debug!(bdf = %self.bdf(), index, vectors = n, error = %source, "VFIO_DEVICE_SET_IRQS refused");
                    first_err.get_or_insert(VfioError::Ioctl {
                        op: "VFIO_DEVICE_SET_IRQS",
                        target: format!(
                            "device {} (irq index {index}, {n} of {count} vectors)",
                            self.bdf()
                        ),
                        source,
                    });
                }
            }
        }
        Err(first_err.expect("at least one attempt"))
    }

    /// Disables every vector of interrupt `index`.
    pub fn disable_irq(&self, index: u32) -> Result<(), VfioError> {
        sys::disable_irqs(self.fd.file.as_fd(), index).map_err(|source| VfioError::Ioctl {
            op: "VFIO_DEVICE_SET_IRQS (disable)",
            target: format!("device {} (irq index {index})", self.bdf()),
            source,
        })
    }

    /// `VFIO_DEVICE_RESET` (function-level, PM or bus reset, whichever the
    /// kernel can do for this function).
    pub fn reset(&self) -> Result<(), VfioError> {
        if self.fd.flags & VFIO_DEVICE_FLAGS_RESET == 0 {
            return Err(VfioError::ResetUnsupported { bdf: self.bdf() });
        }
        sys::device_reset(self.fd.file.as_fd()).map_err(|source| VfioError::Ioctl {
            op: "VFIO_DEVICE_RESET",
            target: format!("device {}", self.bdf()),
            source,
        })?;
        Ok(())
    }

    fn config_span(&self, offset: u16, len: usize, op: &'static str) -> Result<u64, VfioError> {
        let cfg = &self.fd.config;
        let end = u64::from(offset) + len as u64;
        if end > cfg.size {
            return Err(self.config_error(
                op,
                offset,
                len,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("past the {:#x}-byte config space", cfg.size),
                ),
            ));
        }
        Ok(cfg.offset + u64::from(offset))
    }

    fn config_error(
        &self,
        op: &'static str,
        offset: u16,
        len: usize,
        source: io::Error,
    ) -> VfioError {
        VfioError::Config {
            bdf: self.bdf(),
            op,
            offset,
            len,
            source,
        }
    }
}

/// The vector counts [`VfioDevice::enable_irq`] asks for, in order: just
/// enough for `vector`, then (if that is fewer) all `count` of them.
fn irq_vector_counts(vector: u32, count: u32) -> impl Iterator<Item = u32> {
    let least = vector + 1;
    std::iter::once(least).chain((count > least).then_some(count))
}

/// One interrupt vector routed to an eventfd by [`VfioDevice::enable_irq`].
#[derive(Debug)]
pub struct IrqEventFd {
    fd: OwnedFd,
    index: u32,
    vector: u32,
    vectors: u32,
}

impl IrqEventFd {
    /// Interrupts signalled since the last call (reads and clears the
    /// eventfd counter; never blocks).
    pub fn take(&self) -> std::io::Result<u64> {
        sys::eventfd_take(self.fd.as_fd())
    }

    /// The interrupt index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The vector.
    pub fn vector(&self) -> u32 {
        self.vector
    }

    /// How many vectors the kernel was asked to allocate.
    pub fn vectors(&self) -> u32 {
        self.vectors
    }
}

fn region_info_of(
    file: &File,
    bdf: PciAddress,
    count: u32,
    index: u32,
) -> Result<RegionInfo, VfioError> {
    if index >= count {
        return Err(VfioError::NoRegion { bdf, index, count });
    }
    let info = sys::region_info(file.as_fd(), index).map_err(|source| VfioError::Ioctl {
        op: "VFIO_DEVICE_GET_REGION_INFO",
        target: format!("region {index} of {bdf}"),
        source,
    })?;
    Ok(RegionInfo {
        index,
        flags: info.flags,
        size: info.size,
        offset: info.offset,
    })
}

/// A mapped BAR. Every access is bounds- and alignment-checked and
/// volatile (see `sys::Mmio`); out-of-range offsets are driver bugs and
/// panic with the BDF, BAR, offset and size.
///
/// vfio-pci maps BARs uncached, so stores are neither combined nor
/// reordered by the CPU; `write_words` issues 8-byte stores in order.
#[derive(Debug)]
pub struct Bar {
    mmio: Mmio,
    index: u32,
    _fd: Arc<DeviceFd>,
}

impl Bar {
    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.mmio.len()
    }

    /// Never empty (zero-sized BARs are refused by `map_bar`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The BAR index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Little-endian 32-bit register (PCI's native order).
    #[inline]
    pub fn read32_le(&self, offset: usize) -> u32 {
        u32::from_le(self.mmio.load32(offset))
    }

    /// Writes a little-endian 32-bit register.
    #[inline]
    pub fn write32_le(&self, offset: usize, value: u32) {
        self.mmio.store32(offset, value.to_le());
    }

    /// Little-endian 64-bit register.
    #[inline]
    pub fn read64_le(&self, offset: usize) -> u64 {
        u64::from_le(self.mmio.load64(offset))
    }

    /// Writes a little-endian 64-bit register (one 8-byte store).
    #[inline]
    pub fn write64_le(&self, offset: usize, value: u64) {
        self.mmio.store64(offset, value.to_le());
    }

    /// Big-endian 32-bit register (mlx5).
    #[inline]
    pub fn read32_be(&self, offset: usize) -> u32 {
        u32::from_be(self.mmio.load32(offset))
    }

    /// Writes a big-endian 32-bit register.
    #[inline]
    pub fn write32_be(&self, offset: usize, value: u32) {
        self.mmio.store32(offset, value.to_be());
    }

    /// Writes a big-endian 64-bit value as one 8-byte store.
    #[inline]
    pub fn write64_be(&self, offset: usize, value: u64) {
        self.mmio.store64(offset, value.to_be());
    }

    /// Copies `data` (a multiple of 8 bytes, memory order) with 8-byte
    /// stores in ascending address order.
    #[inline]
    pub fn write_words(&self, offset: usize, data: &[u8]) {
        self.mmio.store_words(offset, data);
    }
}

#[cfg(test)]
mod irq_tests {
    #[test]
    fn asks_for_the_fewest_vectors_first_then_the_whole_table() {
        let v = |vector, count| super::irq_vector_counts(vector, count).collect::<Vec<_>>();
        assert_eq!(v(0, 2048), [1, 2048]);
        assert_eq!(v(0, 1), [1]);
        assert_eq!(v(3, 8), [4, 8]);
        assert_eq!(v(7, 8), [8]);
    }
}
