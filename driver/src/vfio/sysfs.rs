//! Read-only sysfs lookups for PCI functions and IOMMU groups, rooted at a
//! configurable directory so that tests run against a fake tree
//! ([`FakeSysfs`]).
//!
//! Layout used (all relative to the root, normally `/sys`):
//!
//! | path | meaning |
//! |---|---|
//! | `bus/pci/devices/<bdf>/{vendor,device,class}` | hex ids (`0x15b3`) |
//! | `bus/pci/devices/<bdf>/driver` | symlink to `bus/pci/drivers/<name>` when bound |
//! | `bus/pci/devices/<bdf>/driver_override` | driver forced by `driver_override` (`(null)` when none) |
//! | `bus/pci/devices/<bdf>/iommu_group` | symlink to `kernel/iommu_groups/<N>` when an IOMMU is on |
//! | `bus/pci/devices/<bdf>/numa_node` | NUMA node, `-1` when unknown |
//! | `class/net/<ifname>/device` | the device under an interface (a PCI function, or a virtio device on one) |
//! | `kernel/iommu_groups/<N>/devices/<bdf>` | members of group N |
//! | `bus/pci/drivers/<name>` | registered PCI drivers |
//! | `module/<name>` | loaded modules |
//! | `class/iommu/*` | IOMMU units (`dmar0`, `ivhd0`) |

#![deny(unsafe_code)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::PciAddress;

/// Default sysfs mount point.
pub const SYSFS_ROOT: &str = "/sys";

/// Ids read from a function's sysfs directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class code (24 bits: class, subclass, programming interface).
    pub class: u32,
}

/// Everything `list` shows about one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address.
    pub address: PciAddress,
    /// Vendor, device and class.
    pub ids: PciIds,
    /// Bound driver, if any.
    pub driver: Option<String>,
    /// IOMMU group, if the IOMMU is on.
    pub iommu_group: Option<u32>,
    /// NUMA node (`None` when the kernel reports -1 or nothing).
    pub numa_node: Option<u32>,
}

/// A sysfs tree (the real one or a fake one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new(SYSFS_ROOT)
    }
}

impl Sysfs {
    /// A tree rooted at `root` (`/sys` in production).
    pub fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `bus/pci/devices`.
    pub fn pci_devices_dir(&self) -> PathBuf {
        self.root.join("bus/pci/devices")
    }

    /// `bus/pci/devices/<bdf>`.
    pub fn device_dir(&self, bdf: PciAddress) -> PathBuf {
        self.pci_devices_dir().join(bdf.to_string())
    }

    /// `bus/pci/drivers/<name>`.
    pub fn driver_dir(&self, name: &str) -> PathBuf {
        self.root.join("bus/pci/drivers").join(name)
    }

    /// `bus/pci/drivers_probe`.
    pub fn drivers_probe_path(&self) -> PathBuf {
        self.root.join("bus/pci/drivers_probe")
    }

    /// `kernel/iommu_groups/<group>`.
    pub fn group_dir(&self, group: u32) -> PathBuf {
        self.root
            .join("kernel/iommu_groups")
            .join(group.to_string())
    }

    /// True if the function exists.
    pub fn exists(&self, bdf: PciAddress) -> bool {
        self.device_dir(bdf).is_dir()
    }

    fn read_attr(&self, bdf: PciAddress, attr: &str) -> io::Result<String> {
        fs::read_to_string(self.device_dir(bdf).join(attr)).map(|s| s.trim().to_string())
    }

    fn read_hex(&self, bdf: PciAddress, attr: &str) -> io::Result<u32> {
        let text = self.read_attr(bdf, attr)?;
        let digits = text.strip_prefix("0x").unwrap_or(&text);
        u32::from_str_radix(digits, 16).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{attr} of {bdf} reads `{text}`, not a hex number"),
            )
        })
    }

    /// Vendor, device and class ids.
    pub fn ids(&self, bdf: PciAddress) -> io::Result<PciIds> {
        let narrow = |value: u32, attr: &str| {
            u16::try_from(value).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{attr} of {bdf} is {value:#x}, wider than 16 bits"),
                )
            })
        };
        Ok(PciIds {
            vendor: narrow(self.read_hex(bdf, "vendor")?, "vendor")?,
            device: narrow(self.read_hex(bdf, "device")?, "device")?,
            class: self.read_hex(bdf, "class")?,
        })
    }

    /// Name of the bound driver, `None` if unbound.
    pub fn driver(&self, bdf: PciAddress) -> io::Result<Option<String>> {
        link_basename(&self.device_dir(bdf).join("driver"))
    }

    /// The IOMMU group number, `None` if the function has none (IOMMU off).
    pub fn iommu_group(&self, bdf: PciAddress) -> io::Result<Option<u32>> {
        let Some(name) = link_basename(&self.device_dir(bdf).join("iommu_group"))? else {
            return Ok(None);
        };
        name.parse().map(Some).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("iommu_group of {bdf} points to `{name}`, not a group number"),
            )
        })
    }

    /// The driver forced with `driver_override`, `None` when none is set.
    pub fn driver_override(&self, bdf: PciAddress) -> io::Result<Option<String>> {
        match self.read_attr(bdf, "driver_override") {
            Ok(text) if text.is_empty() || text == "(null)" => Ok(None),
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// NUMA node of the function; `None` when unknown (-1) or absent.
    pub fn numa_node(&self, bdf: PciAddress) -> Option<u32> {
        self.read_attr(bdf, "numa_node").ok()?.parse::<u32>().ok()
    }

    /// The functions in IOMMU group `group`, sorted.
    pub fn group_members(&self, group: u32) -> io::Result<Vec<PciAddress>> {
        sorted_addresses(&self.group_dir(group).join("devices"))
    }

    /// Every PCI function, sorted by address.
    pub fn list(&self) -> io::Result<Vec<PciAddress>> {
        sorted_addresses(&self.pci_devices_dir())
    }

    /// Ids, driver, group and NUMA node of one function.
    pub fn function(&self, bdf: PciAddress) -> io::Result<PciFunction> {
        Ok(PciFunction {
            address: bdf,
            ids: self.ids(bdf)?,
            driver: self.driver(bdf)?,
            iommu_group: self.iommu_group(bdf)?,
            numa_node: self.numa_node(bdf),
        })
    }

    /// Network interfaces that sit on the function (directly, or through a
    /// virtio device as with virtio-net).
    pub fn net_interfaces(&self, bdf: PciAddress) -> Vec<String> {
        let mut names: Vec<String> = dir_names(&self.root.join("class/net"))
            .into_iter()
            .filter(|name| self.functions_of_interface(name, 0).contains(&bdf))
            .collect();
        names.sort();
        names
    }

    /// Number of IOMMU groups; 0 means the IOMMU is off (or absent).
    pub fn iommu_group_count(&self) -> usize {
        dir_names(&self.root.join("kernel/iommu_groups")).len()
    }

    /// IOMMU hardware units the kernel registered (`dmar0`, ...).
    pub fn iommu_units(&self) -> Vec<String> {
        let mut names = dir_names(&self.root.join("class/iommu"));
        names.sort();
        names
    }

    /// True if module `name` is loaded (`-` and `_` are the same to the kernel).
    pub fn module_loaded(&self, name: &str) -> bool {
        self.root
            .join("module")
            .join(name.replace('-', "_"))
            .is_dir()
    }

    /// True if a PCI driver called `name` is registered.
    pub fn pci_driver_registered(&self, name: &str) -> bool {
        self.driver_dir(name).is_dir()
    }

    /// The PCI function a network interface sits on, found by walking up
    /// from `class/net/<ifname>/device` (virtio interfaces hang off a virtio
    /// device whose parent is the PCI function). Virtual interfaces (bridges,
    /// bonds, VLANs) are followed through their `lower_*` links, at most
    /// `depth` levels. Returns every function found.
    pub fn functions_of_interface(&self, ifname: &str, depth: u32) -> Vec<PciAddress> {
        let net = self.root.join("class/net").join(ifname);
        let mut found = Vec::new();
        if let Ok(real) = fs::canonicalize(net.join("device"))
            && let Some(bdf) = real
                .ancestors()
                .filter_map(|p| p.file_name()?.to_str()?.parse::<PciAddress>().ok())
                .next()
        {
            found.push(bdf);
        }
        if depth > 0 && found.is_empty() {
            for lower in dir_names(&net) {
                if let Some(name) = lower.strip_prefix("lower_") {
                    found.extend(self.functions_of_interface(name, depth - 1));
                }
            }
        }
        found.sort();
        found.dedup();
        found
    }
}

/// Basename of the target of symlink `link`; `None` if there is no link.
fn link_basename(link: &Path) -> io::Result<Option<String>> {
    match fs::read_link(link) {
        Ok(target) => Ok(target
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

fn sorted_addresses(dir: &Path) -> io::Result<Vec<PciAddress>> {
    let mut out: Vec<PciAddress> = fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    out.sort();
    Ok(out)
}

/// A fake sysfs tree in a temporary directory, laid out like the kernel's,
/// for tests of code that reads (and writes) sysfs: this module, the VFIO
/// open path's checks and the binding tool. Removed on drop.
#[derive(Debug)]
pub struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    /// An empty tree with the `bus/pci` skeleton.
    pub fn new() -> io::Result<FakeSysfs> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "erpc-fake-sysfs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        for dir in [
            "bus/pci/devices",
            "bus/pci/drivers",
            "kernel/iommu_groups",
            "class/net",
            "class/iommu",
            "module",
            "devices/pci0000:00",
        ] {
            fs::create_dir_all(root.join(dir))?;
        }
        fs::write(root.join("bus/pci/drivers_probe"), "")?;
        Ok(FakeSysfs { root })
    }

    /// The tree as a [`Sysfs`].
    pub fn sysfs(&self) -> Sysfs {
        Sysfs::new(&self.root)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Adds a function with ids, optional IOMMU group and NUMA node -1. The
    /// device directory lives under `devices/pci0000:00/` and
    /// `bus/pci/devices/<bdf>` links to it, as on a real system.
    pub fn add_device(
        &self,
        bdf: PciAddress,
        vendor: u16,
        device: u16,
        class: u32,
        group: Option<u32>,
    ) -> io::Result<()> {
        let real = self.root.join("devices/pci0000:00").join(bdf.to_string());
        fs::create_dir_all(&real)?;
        fs::write(real.join("vendor"), format!("{vendor:#06x}\n"))?;
        fs::write(real.join("device"), format!("{device:#06x}\n"))?;
        fs::write(real.join("class"), format!("{class:#08x}\n"))?;
        fs::write(real.join("numa_node"), "-1\n")?;
        fs::write(real.join("driver_override"), "(null)\n")?;
        std::os::unix::fs::symlink(&real, self.sysfs().device_dir(bdf))?;
        if let Some(group) = group {
            let gdir = self.sysfs().group_dir(group);
            fs::create_dir_all(gdir.join("devices"))?;
            std::os::unix::fs::symlink(&gdir, real.join("iommu_group"))?;
            std::os::unix::fs::symlink(&real, gdir.join("devices").join(bdf.to_string()))?;
        }
        Ok(())
    }

    /// Registers a PCI driver (creates `bus/pci/drivers/<name>` with its
    /// `bind`/`unbind` files and `module/<name>`).
    pub fn add_driver(&self, name: &str) -> io::Result<()> {
        let dir = self.sysfs().driver_dir(name);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("bind"), "")?;
        fs::write(dir.join("unbind"), "")?;
        fs::create_dir_all(self.root.join("module").join(name.replace('-', "_")))?;
        Ok(())
    }

    /// Binds `bdf` to driver `name` (registers the driver if needed).
    pub fn bind(&self, bdf: PciAddress, name: &str) -> io::Result<()> {
        if !self.sysfs().pci_driver_registered(name) {
            self.add_driver(name)?;
        }
        let link = self.sysfs().device_dir(bdf).join("driver");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(self.sysfs().driver_dir(name), link)
    }

    /// Gives `bdf` a network interface `ifname`; `via_virtio` puts a virtio
    /// device between them, as virtio-net does.
    pub fn add_interface(&self, bdf: PciAddress, ifname: &str, via_virtio: bool) -> io::Result<()> {
        let mut parent = fs::canonicalize(self.sysfs().device_dir(bdf))?;
        if via_virtio {
            parent = parent.join("virtio0");
        }
        let netdir = parent.join("net").join(ifname);
        fs::create_dir_all(&netdir)?;
        std::os::unix::fs::symlink(&parent, netdir.join("device"))?;
        // With virtio the interface is listed under the virtio device only,
        // as in real sysfs; the PCI function's own `net/` stays absent.
        std::os::unix::fs::symlink(&netdir, self.root.join("class/net").join(ifname))
    }

    /// Adds a virtual interface `ifname` (bridge, bond) whose lower devices are `lowers`.
    pub fn add_virtual_interface(&self, ifname: &str, lowers: &[&str]) -> io::Result<()> {
        let dir = self.root.join("devices/virtual/net").join(ifname);
        fs::create_dir_all(&dir)?;
        for lower in lowers {
            let target = fs::canonicalize(self.root.join("class/net").join(lower))?;
            std::os::unix::fs::symlink(target, dir.join(format!("lower_{lower}")))?;
        }
        std::os::unix::fs::symlink(&dir, self.root.join("class/net").join(ifname))
    }

    /// Registers an IOMMU unit (turns the IOMMU "on").
    pub fn add_iommu_unit(&self, name: &str) -> io::Result<()> {
        fs::create_dir_all(self.root.join("class/iommu").join(name))
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bdf(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    fn tree() -> FakeSysfs {
        let fake = FakeSysfs::new().unwrap();
        fake.add_device(bdf("0000:00:02.0"), 0x8086, 0x10d3, 0x020000, Some(2))
            .unwrap();
        fake.add_device(bdf("0000:03:00.0"), 0x15b3, 0x1017, 0x020000, Some(7))
            .unwrap();
        fake.add_device(bdf("0000:03:00.1"), 0x15b3, 0x1017, 0x020000, Some(7))
            .unwrap();
        fake.add_device(bdf("0000:00:1f.0"), 0x8086, 0x2918, 0x060100, None)
            .unwrap();
        fake.bind(bdf("0000:03:00.1"), "mlx5_core").unwrap();
        fake
    }

    #[test]
    fn reads_ids_driver_group_and_node() {
        let fake = tree();
        let sys = fake.sysfs();
        let f = sys.function(bdf("0000:03:00.0")).unwrap();
        assert_eq!(
            f.ids,
            PciIds {
                vendor: 0x15b3,
                device: 0x1017,
                class: 0x020000
            }
        );
        assert_eq!(f.driver, None);
        assert_eq!(f.iommu_group, Some(7));
        assert_eq!(f.numa_node, None);
        assert_eq!(
            sys.driver(bdf("0000:03:00.1")).unwrap().as_deref(),
            Some("mlx5_core")
        );
        assert_eq!(sys.iommu_group(bdf("0000:00:1f.0")).unwrap(), None);
        assert!(sys.driver_override(bdf("0000:03:00.0")).unwrap().is_none());
        assert!(sys.module_loaded("mlx5-core"));
        assert!(sys.pci_driver_registered("mlx5_core"));
        assert!(!sys.pci_driver_registered("vfio-pci"));
    }

    #[test]
    fn lists_functions_and_group_members_sorted() {
        let fake = tree();
        let sys = fake.sysfs();
        let all: Vec<String> = sys.list().unwrap().iter().map(|a| a.to_string()).collect();
        assert_eq!(
            all,
            [
                "0000:00:02.0",
                "0000:00:1f.0",
                "0000:03:00.0",
                "0000:03:00.1"
            ]
        );
        assert_eq!(
            sys.group_members(7).unwrap(),
            vec![bdf("0000:03:00.0"), bdf("0000:03:00.1")]
        );
        assert_eq!(sys.iommu_group_count(), 2);
    }

    #[test]
    fn missing_device_reads_as_not_found() {
        let fake = tree();
        let err = fake.sysfs().ids(bdf("0000:09:00.0")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(!fake.sysfs().exists(bdf("0000:09:00.0")));
    }

    #[test]
    fn garbage_ids_are_invalid_data_naming_the_attribute() {
        let fake = tree();
        let dev = fake.sysfs().device_dir(bdf("0000:00:02.0"));
        fs::write(dev.join("vendor"), "zz\n").unwrap();
        let err = fake.sysfs().ids(bdf("0000:00:02.0")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("vendor of 0000:00:02.0"), "{err}");
    }

    #[test]
    fn interfaces_resolve_to_their_pci_function() {
        let fake = tree();
        fake.add_interface(bdf("0000:00:02.0"), "eth0", false)
            .unwrap();
        fake.add_interface(bdf("0000:03:00.1"), "ens1f1", true)
            .unwrap();
        fake.add_virtual_interface("br0", &["eth0"]).unwrap();
        let sys = fake.sysfs();
        assert_eq!(sys.net_interfaces(bdf("0000:00:02.0")), ["eth0"]);
        assert_eq!(sys.net_interfaces(bdf("0000:03:00.1")), ["ens1f1"]);
        assert_eq!(sys.functions_of_interface("eth0", 0), [bdf("0000:00:02.0")]);
        assert_eq!(
            sys.functions_of_interface("ens1f1", 0),
            [bdf("0000:03:00.1")]
        );
        assert_eq!(sys.functions_of_interface("br0", 4), [bdf("0000:00:02.0")]);
        assert!(sys.functions_of_interface("br0", 0).is_empty());
        assert!(sys.functions_of_interface("nope", 4).is_empty());
    }
}
