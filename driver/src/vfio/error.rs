//! The VFIO layer's error type: every variant names the PCI address, path,
//! IOVA or length involved, carries the OS error as its source, and says
//! what to do about it.

#![deny(unsafe_code)]

use std::io;
use std::path::PathBuf;

use super::{ParsePciAddressError, PciAddress};

/// Command that binds a function to vfio-pci, for hints.
pub const BIND_HINT: &str = "erpc-vfio bind";
/// Kernel command line that turns the IOMMU on, for hints.
pub const IOMMU_HINT: &str =
    "enable the IOMMU: boot with `intel_iommu=on iommu=pt` (AMD: `amd_iommu=on iommu=pt`)";

/// A failure in the VFIO layer.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// The PCI address does not parse.
    #[error(transparent)]
    BadAddress(#[from] ParsePciAddressError),

    /// No such PCI function.
    #[error(
        "PCI function {bdf} does not exist ({} is missing); list the functions with `erpc-vfio list`",
        .path.display()
    )]
    NoSuchDevice {
        /// The address asked for.
        bdf: PciAddress,
        /// Its sysfs directory.
        path: PathBuf,
    },

    /// A sysfs attribute could not be read.
    #[error("cannot read {} for {bdf}: {source}", .path.display())]
    Sysfs {
        /// The function.
        bdf: PciAddress,
        /// The attribute.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The function is not an mlx5 NIC.
    #[error(
        "{bdf} is {vendor:04x}:{device:04x}, not an mlx5 NIC (vendor 15b3 with a ConnectX-4 or \
         later device id); check the address with `erpc-vfio list`"
    )]
    NotMlx5 {
        /// The function.
        bdf: PciAddress,
        /// Its vendor id.
        vendor: u16,
        /// Its device id.
        device: u16,
    },

    /// The function has no IOMMU group: the IOMMU is off.
    #[error("{bdf} has no IOMMU group ({} is missing), so the IOMMU is off; {IOMMU_HINT}", .path.display())]
    NoIommuGroup {
        /// The function.
        bdf: PciAddress,
        /// The missing `iommu_group` link.
        path: PathBuf,
    },

    /// The function is not bound to vfio-pci.
    #[error(
        "{bdf} is {}, not to vfio-pci; bind it with `{BIND_HINT} {bdf}`",
        match .driver { Some(d) => format!("bound to {d}"), None => "bound to no driver".to_string() }
    )]
    NotBoundToVfio {
        /// The function.
        bdf: PciAddress,
        /// Its current driver.
        driver: Option<String>,
    },

    /// `/dev/vfio/N` does not exist.
    #[error(
        "{} (IOMMU group {group} of {bdf}) does not exist; vfio-pci creates it when the function \
         is bound: bind it with `{BIND_HINT} {bdf}`, and make sure /dev/vfio is visible here \
         (udev, container runtime)",
        .path.display()
    )]
    GroupNodeMissing {
        /// The function.
        bdf: PciAddress,
        /// Its IOMMU group.
        group: u32,
        /// The missing node.
        path: PathBuf,
    },

    /// Permission denied on a VFIO node.
    #[error(
        "permission denied opening {}: {source}; VFIO nodes are root-only (0600): run as root or \
         `chown $USER {}`",
        .path.display(), .path.display()
    )]
    Permission {
        /// The node.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The container node cannot be opened.
    #[error(
        "cannot open the VFIO container {}: {source}; load VFIO with `modprobe vfio-pci` \
         (vfio_iommu_type1 comes with it)",
        .path.display()
    )]
    ContainerUnavailable {
        /// The container node (`/dev/vfio/vfio`).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Another owner holds the group open.
    #[error(
        "{} (IOMMU group {group} of {bdf}) is busy: {source}; a group has one owner at a time \
         (another process, or another VFIO context in this one): close it first (`fuser -v {}`)",
        .path.display(), .path.display()
    )]
    GroupBusy {
        /// The function.
        bdf: PciAddress,
        /// The group.
        group: u32,
        /// The group node.
        path: PathBuf,
        /// EBUSY.
        #[source]
        source: io::Error,
    },

    /// A group member is bound to a kernel driver.
    #[error(
        "IOMMU group {group} ({}) of {bdf} is not viable: {}; every function of a group must be \
         bound to vfio-pci or to no driver: bind them with `{BIND_HINT} <bdf>` (or unbind them), \
         or move the NIC to a slot with its own group",
        .path.display(), describe_blockers(.blockers)
    )]
    GroupNotViable {
        /// The function.
        bdf: PciAddress,
        /// The group.
        group: u32,
        /// The group node.
        path: PathBuf,
        /// Members bound to a kernel driver, with the driver.
        blockers: Vec<(PciAddress, String)>,
    },

    /// The kernel speaks another VFIO API version.
    #[error("VFIO API version {got} at {}, this code speaks version {want}", .path.display())]
    ApiVersion {
        /// The container node.
        path: PathBuf,
        /// Version reported.
        got: i32,
        /// Version expected.
        want: u32,
    },

    /// No type1v2 IOMMU backend.
    #[error(
        "the VFIO container {} offers no type1v2 IOMMU backend; load it with \
         `modprobe vfio_iommu_type1`, and {IOMMU_HINT}",
        .path.display()
    )]
    NoType1v2 {
        /// The container node.
        path: PathBuf,
    },

    /// An interrupt cannot be set up as asked.
    #[error("{bdf}: interrupt index {index} cannot be used: {why}")]
    IrqUnsupported {
        /// The function.
        bdf: PciAddress,
        /// VFIO interrupt index (2 = MSI-X).
        index: u32,
        /// Why not.
        why: String,
    },

    /// An ioctl failed.
    #[error("{op} on {target} failed: {source}")]
    Ioctl {
        /// The ioctl (`VFIO_GROUP_SET_CONTAINER`).
        op: &'static str,
        /// What it was issued on (`group /dev/vfio/3`, `device 0000:03:00.0`).
        target: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The function is already open in this process.
    #[error(
        "{bdf} is already open in this process; VFIO gives a device one owner: reuse the open \
         handle (drop it before opening again)"
    )]
    DeviceAlreadyOpen {
        /// The function.
        bdf: PciAddress,
    },

    /// No such region.
    #[error("{bdf} has no region {index} (it has {count})")]
    NoRegion {
        /// The function.
        bdf: PciAddress,
        /// Region index asked for.
        index: u32,
        /// Regions the device reports.
        count: u32,
    },

    /// The region cannot be mmapped.
    #[error(
        "region {index} of {bdf} cannot be mmapped (flags {flags:#x}, size {size:#x}); \
         only memory BARs with VFIO_REGION_INFO_FLAG_MMAP can"
    )]
    NotMappable {
        /// The function.
        bdf: PciAddress,
        /// Region index.
        index: u32,
        /// Region flags.
        flags: u32,
        /// Region size.
        size: u64,
    },

    /// `mmap` of a region failed.
    #[error(
        "mmap of region {index} of {bdf} ({len:#x} bytes at offset {offset:#x}) failed: {source}"
    )]
    Mmap {
        /// The function.
        bdf: PciAddress,
        /// Region index.
        index: u32,
        /// Offset in the device fd.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Config space access failed.
    #[error("config-space {op} of {len} bytes at {offset:#x} on {bdf} failed: {source}")]
    Config {
        /// The function.
        bdf: PciAddress,
        /// `read` or `write`.
        op: &'static str,
        /// Offset in config space.
        offset: u16,
        /// Bytes.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Memory space / bus master bits did not stick.
    #[error(
        "{bdf}: PCI command register reads {command:#06x} after enabling memory space and bus \
         mastering (bits 0x6); the device is not accepting them"
    )]
    BusMasterNotEnabled {
        /// The function.
        bdf: PciAddress,
        /// Command register read back.
        command: u16,
    },

    /// The device has no reset method VFIO can use.
    #[error(
        "{bdf} cannot be reset through VFIO (VFIO_DEVICE_FLAGS_RESET is clear: no FLR, PM or bus reset)"
    )]
    ResetUnsupported {
        /// The function.
        bdf: PciAddress,
    },

    /// DMA was requested before any group was attached.
    #[error(
        "the VFIO container {} has no IOMMU yet: attach a group before mapping DMA",
        .path.display()
    )]
    ContainerNotReady {
        /// The container node.
        path: PathBuf,
    },

    /// A DMA range is not page aligned.
    #[error(
        "DMA range VA {va:#x} + {len:#x} is not a non-empty multiple of the {page:#x}-byte IOMMU page"
    )]
    BadDmaRange {
        /// Start.
        va: usize,
        /// Length.
        len: usize,
        /// Smallest IOMMU page.
        page: u64,
    },

    /// No free IOVA space.
    #[error(
        "no free IOVA range of {len:#x} bytes aligned to {align:#x} below {limit:#x} \
         ({free_bytes:#x} bytes free, largest free range {largest:#x}); unmap regions or map \
         fewer, larger ones"
    )]
    IovaExhausted {
        /// Bytes asked for.
        len: u64,
        /// Alignment required.
        align: u64,
        /// The allocator's upper bound.
        limit: u64,
        /// Free bytes in total.
        free_bytes: u64,
        /// Largest free range.
        largest: u64,
    },

    /// `VFIO_IOMMU_MAP_DMA` failed.
    #[error(
        "VFIO_IOMMU_MAP_DMA of {len:#x} bytes (VA {va:#x} -> IOVA {iova:#x}) failed: {source}; {hint}"
    )]
    DmaMap {
        /// Virtual address.
        va: usize,
        /// IOVA.
        iova: u64,
        /// Bytes.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
        /// What to do.
        hint: &'static str,
    },

    /// `VFIO_IOMMU_UNMAP_DMA` failed.
    #[error("VFIO_IOMMU_UNMAP_DMA of {len:#x} bytes at IOVA {iova:#x} failed: {source}")]
    DmaUnmap {
        /// IOVA.
        iova: u64,
        /// Bytes.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The kernel unmapped a different amount than asked.
    #[error(
        "VFIO_IOMMU_UNMAP_DMA at IOVA {iova:#x} unmapped {unmapped:#x} bytes, expected {len:#x}"
    )]
    UnmapSizeMismatch {
        /// IOVA.
        iova: u64,
        /// Bytes asked.
        len: usize,
        /// Bytes the kernel reports.
        unmapped: u64,
    },

    /// No mapping at that IOVA in this container.
    #[error(
        "IOVA {iova:#x} (+{len:#x} bytes, VA {va:#x}) is not mapped in this container; \
         a device DMA there faults in the IOMMU"
    )]
    IovaNotMapped {
        /// IOVA.
        iova: u64,
        /// Bytes.
        len: usize,
        /// Virtual address given.
        va: usize,
    },

    /// Reserving a hugepage region failed (the message says how to reserve more).
    #[error(transparent)]
    Region(#[from] mempool::RegionError),
}

fn describe_blockers(blockers: &[(PciAddress, String)]) -> String {
    if blockers.is_empty() {
        return "the kernel reports a member bound to a non-VFIO driver".to_string();
    }
    blockers
        .iter()
        .map(|(bdf, driver)| format!("{bdf} is bound to {driver}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do about a failed `VFIO_IOMMU_MAP_DMA`, by errno.
pub(crate) fn dma_map_hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::ENOMEM) => {
            "the pages could not be pinned: raise the locked-memory limit (`ulimit -l unlimited`, \
             systemd LimitMEMLOCK=infinity) or run as root"
        }
        Some(libc::ENOSPC) => {
            "the IOMMU's mapping count limit is reached (vfio_iommu_type1 dma_entry_limit): \
             map fewer, larger regions"
        }
        Some(libc::EEXIST) => "the IOVA range overlaps an existing mapping",
        Some(libc::EFAULT) => "the virtual range is not mapped in this process",
        Some(libc::EINVAL) => {
            "VA, IOVA and length must be multiples of the IOMMU page size and the IOVA must lie \
             in a usable range"
        }
        Some(libc::EPERM) => "the range is read-only or the caller lacks CAP_IPC_LOCK",
        _ => "see the kernel log (dmesg) for the IOMMU's reason",
    }
}

impl From<VfioError> for io::Error {
    fn from(err: VfioError) -> io::Error {
        use std::error::Error as _;
        let kind = err
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .map_or(io::ErrorKind::Other, io::Error::kind);
        io::Error::new(kind, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bdf() -> PciAddress {
        "0000:03:00.0".parse().unwrap()
    }

    #[test]
    fn messages_name_values_and_say_what_to_do() {
        let e = VfioError::NotBoundToVfio {
            bdf: bdf(),
            driver: Some("mlx5_core".into()),
        };
        assert_eq!(
            e.to_string(),
            "0000:03:00.0 is bound to mlx5_core, not to vfio-pci; bind it with \
             `erpc-vfio bind 0000:03:00.0`"
        );
        let e = VfioError::NoIommuGroup {
            bdf: bdf(),
            path: "/sys/bus/pci/devices/0000:03:00.0/iommu_group".into(),
        };
        assert!(e.to_string().contains("intel_iommu=on iommu=pt"), "{e}");
        let e = VfioError::GroupNotViable {
            bdf: bdf(),
            group: 7,
            path: "/dev/vfio/7".into(),
            blockers: vec![("0000:03:00.1".parse().unwrap(), "mlx5_core".into())],
        };
        let text = e.to_string();
        assert!(text.contains("/dev/vfio/7"), "{text}");
        assert!(
            text.contains("0000:03:00.1 is bound to mlx5_core"),
            "{text}"
        );
        let e = VfioError::DmaMap {
            va: 0x7f00_0000_0000,
            iova: 0x20_0000,
            len: 0x20_0000,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
            hint: dma_map_hint(&io::Error::from_raw_os_error(libc::ENOMEM)),
        };
        let text = e.to_string();
        for needle in [
            "0x7f0000000000",
            "IOVA 0x200000",
            "ulimit -l",
            "Cannot allocate memory",
        ] {
            assert!(text.contains(needle), "{needle} missing in {text}");
        }
    }

    #[test]
    fn converts_to_io_error_keeping_the_kind() {
        let e = VfioError::Permission {
            path: "/dev/vfio/3".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
        assert!(io.to_string().contains("/dev/vfio/3"));
    }
}
