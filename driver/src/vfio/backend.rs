//! The production [`HwBackend`]: an mlx5 function behind vfio-pci.
//!
//! Opening follows rdma-core's mlx5 VFIO provider: check the ids in sysfs,
//! open container and group (type1v2), get the device fd, map BAR0, then
//! enable memory space and bus mastering (the kernel's mlx5_core also does
//! this before it programs the command queue). MSI-X vector 0 gets an
//! eventfd when the driver asks (before its EQ), as rdma-core does; the
//! driver still polls its command queue, EQ and CQs and never reads it.

#![deny(unsafe_code)]

use std::io;
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX;

use mempool::DmaMapper;

use super::device::{Bar, IrqEventFd, VfioDevice, VfioPaths};
use super::{PciAddress, VfioError};
use crate::barrier;
use crate::hw::{HwBackend, mlx5_device_name, pci};

/// Which devices [`VfioBackend::open_with`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceCheck {
    /// Vendor 0x15b3 and a device id from [`crate::hw::MLX5_DEVICE_IDS`].
    #[default]
    Mlx5,
    /// Any PCI function: only for testing the VFIO path on other devices
    /// (the QEMU guest tests use `edu`). The driver must not run on it.
    AnyDeviceForTesting,
}

/// True if vendor/device name an mlx5 function the driver knows.
pub fn is_mlx5(vendor: u16, device: u16) -> bool {
    vendor == pci::MELLANOX_VENDOR_ID && mlx5_device_name(device).is_some()
}

/// An mlx5 PCI function opened through VFIO, with BAR0 mapped.
#[derive(Debug)]
pub struct VfioBackend {
    device: VfioDevice,
    bar0: Bar,
    model: Option<&'static str>,
    /// The MSI-X vector the driver enabled, while it is enabled.
    msix: Mutex<Option<IrqEventFd>>,
}

impl VfioBackend {
    /// MSI-X vectors the kernel allocated for [`HwBackend::enable_msix`]
    /// (`None` while MSI-X is off): one, unless the host refused that and
    /// the whole table was taken.
    pub fn msix_vectors(&self) -> Option<u32> {
        self.msix
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(IrqEventFd::vectors)
    }

    /// Opens the mlx5 function `bdf` with the default paths.
    pub fn open(bdf: PciAddress) -> Result<VfioBackend, VfioError> {
        Self::open_with(bdf, &VfioPaths::default(), DeviceCheck::Mlx5)
    }

    /// Opens `bdf` with explicit paths and device check.
    pub fn open_with(
        bdf: PciAddress,
        paths: &VfioPaths,
        check: DeviceCheck,
    ) -> Result<VfioBackend, VfioError> {
        let sysfs = &paths.sysfs;
        if !sysfs.exists(bdf) {
            return Err(VfioError::NoSuchDevice {
                bdf,
                path: sysfs.device_dir(bdf),
            });
        }
        let ids = sysfs.ids(bdf).map_err(|source| VfioError::Sysfs {
            bdf,
            path: sysfs.device_dir(bdf),
            source,
        })?;
        if check == DeviceCheck::Mlx5 && !is_mlx5(ids.vendor, ids.device) {
            return Err(VfioError::NotMlx5 {
                bdf,
                vendor: ids.vendor,
                device: ids.device,
            });
        }
        let device = VfioDevice::open(bdf, paths)?;
        // Config space is the device's own word; sysfs could be stale or fake.
        let (vendor, dev_id) = device.ids()?;
        if check == DeviceCheck::Mlx5 && !is_mlx5(vendor, dev_id) {
            return Err(VfioError::NotMlx5 {
                bdf,
                vendor,
                device: dev_id,
            });
        }
        let bar0 = device.map_bar(0)?;
        device.enable_bus_master()?;
        let model = (vendor == pci::MELLANOX_VENDOR_ID)
            .then(|| mlx5_device_name(dev_id))
            .flatten();
        tracing::info!(%bdf, model, bar0_len = bar0.len(), "VFIO device open");
        Ok(VfioBackend {
            device,
            bar0,
            model,
            msix: Mutex::new(None),
        })
    }

    /// The VFIO device (regions, config space, reset, container).
    pub fn device(&self) -> &VfioDevice {
        &self.device
    }

    /// BAR0.
    pub fn bar0(&self) -> &Bar {
        &self.bar0
    }

    /// The model name from the device-id table.
    pub fn model(&self) -> Option<&'static str> {
        self.model
    }
}

impl HwBackend for VfioBackend {
    fn bar0_len(&self) -> usize {
        self.bar0.len()
    }

    #[inline]
    fn read32(&self, offset: usize) -> u32 {
        self.bar0.read32_be(offset)
    }

    #[inline]
    fn write32(&self, offset: usize, value: u32) {
        self.bar0.write32_be(offset, value);
    }

    #[inline]
    fn write64(&self, offset: usize, value: u64) {
        self.bar0.write64_be(offset, value);
    }

    #[inline]
    fn write_bf(&self, offset: usize, data: &[u8]) {
        assert!(
            !data.is_empty() && data.len() <= 256 && data.len().is_multiple_of(64),
            "{}: BlueFlame write of {} bytes at {offset:#x} (must be 64, 128, 192 or 256)",
            self.describe(),
            data.len()
        );
        barrier::wc_start();
        self.bar0.write_words(offset, data);
        barrier::wc_flush();
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> io::Result<()> {
        Ok(self.device.config_read(offset, buf)?)
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> io::Result<()> {
        Ok(self.device.config_write(offset, data)?)
    }

    fn enable_msix(&self, vector: u16) -> io::Result<()> {
        let irq = self
            .device
            .enable_irq(VFIO_PCI_MSIX_IRQ_INDEX, u32::from(vector))
            .map_err(io::Error::other)?;
        *self.msix.lock().unwrap_or_else(|p| p.into_inner()) = Some(irq);
        Ok(())
    }

    fn disable_msix(&self) -> io::Result<()> {
        let mut msix = self.msix.lock().unwrap_or_else(|p| p.into_inner());
        if msix.is_some() {
            self.device
                .disable_irq(VFIO_PCI_MSIX_IRQ_INDEX)
                .map_err(io::Error::other)?;
            *msix = None;
        }
        Ok(())
    }

    /// vfio-pci mmaps BAR0 uncached (`pgprot_noncached`), so BlueFlame
    /// writes would reach the NIC as separate 8-byte stores.
    fn bar_write_combining(&self) -> bool {
        false
    }

    fn dma_mapper(&self) -> Arc<dyn DmaMapper> {
        self.device.container().clone()
    }

    fn describe(&self) -> String {
        match self.model {
            Some(model) => format!("vfio {} ({model})", self.device.bdf()),
            None => format!("vfio {}", self.device.bdf()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::MLX5_DEVICE_IDS;
    use crate::vfio::sysfs::FakeSysfs;

    #[test]
    fn the_id_check_accepts_exactly_the_table() {
        for (id, _) in MLX5_DEVICE_IDS {
            assert!(is_mlx5(0x15b3, *id));
            assert!(!is_mlx5(0x8086, *id));
        }
        assert!(!is_mlx5(0x15b3, 0x1003)); // ConnectX-3: mlx4
        assert!(!is_mlx5(0x15b3, 0x0000));
    }

    #[test]
    fn open_refuses_a_non_mlx5_function_before_touching_vfio() {
        let fake = FakeSysfs::new().unwrap();
        let bdf: PciAddress = "0000:00:03.0".parse().unwrap();
        fake.add_device(bdf, 0x1234, 0x11e8, 0xff00, Some(3))
            .unwrap();
        let paths = VfioPaths {
            sysfs: fake.sysfs(),
            dev_vfio: fake.root().join("no-dev-vfio"),
        };
        let err = VfioBackend::open_with(bdf, &paths, DeviceCheck::Mlx5).unwrap_err();
        assert!(
            matches!(
                err,
                VfioError::NotMlx5 {
                    vendor: 0x1234,
                    device: 0x11e8,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("0000:00:03.0 is 1234:11e8"),
            "{err}"
        );
    }

    #[test]
    fn open_reports_each_missing_precondition() {
        let fake = FakeSysfs::new().unwrap();
        let nic: PciAddress = "0000:03:00.0".parse().unwrap();
        let paths = VfioPaths {
            sysfs: fake.sysfs(),
            dev_vfio: fake.root().join("dev-vfio"),
        };
        std::fs::create_dir_all(&paths.dev_vfio).unwrap();
        // Not there at all.
        let err = VfioBackend::open_with(nic, &paths, DeviceCheck::Mlx5).unwrap_err();
        assert!(matches!(err, VfioError::NoSuchDevice { .. }), "{err:?}");
        // There, on mlx5_core.
        fake.add_device(nic, 0x15b3, 0x1017, 0x020000, None)
            .unwrap();
        fake.bind(nic, "mlx5_core").unwrap();
        let err = VfioBackend::open_with(nic, &paths, DeviceCheck::Mlx5).unwrap_err();
        assert!(
            matches!(&err, VfioError::NotBoundToVfio { driver: Some(d), .. } if d == "mlx5_core"),
            "{err:?}"
        );
        // On vfio-pci, but no IOMMU group.
        fake.bind(nic, "vfio-pci").unwrap();
        let err = VfioBackend::open_with(nic, &paths, DeviceCheck::Mlx5).unwrap_err();
        assert!(matches!(err, VfioError::NoIommuGroup { .. }), "{err:?}");
        assert!(err.to_string().contains("intel_iommu=on"), "{err}");
    }

    #[test]
    fn open_stops_at_a_missing_group_node() {
        let fake = FakeSysfs::new().unwrap();
        let nic: PciAddress = "0000:03:00.0".parse().unwrap();
        fake.add_device(nic, 0x15b3, 0x101d, 0x020000, Some(9))
            .unwrap();
        fake.bind(nic, "vfio-pci").unwrap();
        let paths = VfioPaths {
            sysfs: fake.sysfs(),
            dev_vfio: fake.root().join("dev-vfio"),
        };
        std::fs::create_dir_all(&paths.dev_vfio).unwrap();
        let err = VfioBackend::open_with(nic, &paths, DeviceCheck::Mlx5).unwrap_err();
        assert!(
            matches!(err, VfioError::GroupNodeMissing { group: 9, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn the_in_process_claim_is_exclusive_and_released() {
        let bdf: PciAddress = "0000:7f:1f.7".parse().unwrap();
        let first = super::super::device::tests_claim(bdf).unwrap();
        let err = super::super::device::tests_claim(bdf).unwrap_err();
        assert!(
            matches!(err, VfioError::DeviceAlreadyOpen { .. }),
            "{err:?}"
        );
        drop(first);
        assert!(super::super::device::tests_claim(bdf).is_ok());
    }
}
