//! A VFIO group (`/dev/vfio/N`): the unit of isolation the IOMMU can tell
//! apart. It is usable only when viable: every member bound to vfio-pci (or
//! to a driver that does no DMA of its own, or to none).

#![deny(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use vfio_bindings::bindings::vfio::VFIO_GROUP_FLAGS_VIABLE;

use super::sysfs::Sysfs;
use super::{PciAddress, VfioError, sys};

/// Drivers that leave a group viable: they tell the kernel they manage DMA
/// themselves (`driver_managed_dma`) or do none.
pub const VIABLE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

/// True if a function bound to `driver` keeps its group viable.
pub fn driver_keeps_group_viable(driver: &str) -> bool {
    VIABLE_DRIVERS.contains(&driver) || driver.ends_with("vfio_pci") || driver.ends_with("vfio-pci")
}

/// An open, viable VFIO group.
#[derive(Debug)]
pub struct Group {
    number: u32,
    path: PathBuf,
    file: File,
}

impl Group {
    /// Opens group `number` under `dev_vfio` (normally `/dev/vfio`) on
    /// behalf of `bdf` and checks that it is viable. `sysfs` is used only to
    /// name the members that make a group non-viable.
    pub fn open(
        dev_vfio: &Path,
        number: u32,
        bdf: PciAddress,
        sysfs: &Sysfs,
    ) -> Result<Group, VfioError> {
        let path = dev_vfio.join(number.to_string());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| match (source.kind(), source.raw_os_error()) {
                (io::ErrorKind::NotFound, _) => VfioError::GroupNodeMissing {
                    bdf,
                    group: number,
                    path: path.clone(),
                },
                (io::ErrorKind::PermissionDenied, _) => VfioError::Permission {
                    path: path.clone(),
                    source,
                },
                (_, Some(libc::EBUSY)) => VfioError::GroupBusy {
                    bdf,
                    group: number,
                    path: path.clone(),
                    source,
                },
                _ => VfioError::Ioctl {
                    op: "open",
                    target: format!("group {}", path.display()),
                    source,
                },
            })?;
        let flags = sys::group_status(file.as_fd()).map_err(|source| VfioError::Ioctl {
            op: "VFIO_GROUP_GET_STATUS",
            target: format!("group {}", path.display()),
            source,
        })?;
        if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                bdf,
                group: number,
                path,
                blockers: blockers(sysfs, number),
            });
        }
        Ok(Group { number, path, file })
    }

    /// The group number.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The group node.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Members of group `number` bound to a driver that makes it non-viable.
pub fn blockers(sysfs: &Sysfs, number: u32) -> Vec<(PciAddress, String)> {
    let Ok(members) = sysfs.group_members(number) else {
        return Vec::new();
    };
    members
        .into_iter()
        .filter_map(|m| {
            let driver = sysfs.driver(m).ok()??;
            (!driver_keeps_group_viable(&driver)).then_some((m, driver))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio::sysfs::FakeSysfs;

    #[test]
    fn blockers_are_members_on_dma_capable_kernel_drivers() {
        let fake = FakeSysfs::new().unwrap();
        let a: PciAddress = "0000:01:01.0".parse().unwrap();
        let b: PciAddress = "0000:01:02.0".parse().unwrap();
        let br: PciAddress = "0000:00:05.0".parse().unwrap();
        fake.add_device(a, 0x1234, 0x11e8, 0xff00, Some(5)).unwrap();
        fake.add_device(b, 0x1af4, 0x1005, 0xff00, Some(5)).unwrap();
        fake.add_device(br, 0x1b36, 0x0001, 0x060400, Some(5))
            .unwrap();
        fake.bind(a, "vfio-pci").unwrap();
        fake.bind(b, "virtio-pci").unwrap();
        fake.bind(br, "pcieport").unwrap();
        assert_eq!(
            blockers(&fake.sysfs(), 5),
            vec![(b, "virtio-pci".to_string())]
        );
        fake.bind(b, "vfio-pci").unwrap();
        assert!(blockers(&fake.sysfs(), 5).is_empty());
        assert!(driver_keeps_group_viable("mlx5_vfio_pci"));
        assert!(!driver_keeps_group_viable("mlx5_core"));
    }

    #[test]
    fn a_missing_node_is_a_typed_error_naming_the_path() {
        let fake = FakeSysfs::new().unwrap();
        let bdf: PciAddress = "0000:03:00.0".parse().unwrap();
        let dir = fake.root().join("dev-vfio");
        std::fs::create_dir_all(&dir).unwrap();
        let err = Group::open(&dir, 12, bdf, &fake.sysfs()).unwrap_err();
        let VfioError::GroupNodeMissing { group, path, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*group, 12);
        assert_eq!(path, &dir.join("12"));
        assert!(
            err.to_string().contains("erpc-vfio bind 0000:03:00.0"),
            "{err}"
        );
    }
}
