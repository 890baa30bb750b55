//! The logic of `erpc-vfio`: listing PCI functions, reporting a function's
//! VFIO readiness, and binding it to vfio-pci (or back) the way the kernel
//! documents: `driver_override`, `driver/unbind`, `drivers_probe`.
//!
//! Every path is rooted in an [`Env`] so the unit tests run against a fake
//! sysfs/procfs tree. Binding is planned first ([`plan_bind`],
//! [`plan_unbind`]) as a list of exact sysfs writes, which `--dry-run`
//! prints and [`apply`] performs.

use std::io;
use std::path::{Path, PathBuf};

use mlx5::hw::mlx5_device_name;
use mlx5::vfio::sysfs::{PciFunction, Sysfs};
use mlx5::vfio::{IOMMU_HINT, PciAddress, is_mlx5};
use serde::Serialize;

/// The driver `bind` selects.
pub const VFIO_DRIVER: &str = "vfio-pci";

/// Where the tool looks and keeps its records.
#[derive(Debug, Clone)]
pub struct Env {
    /// sysfs (`/sys`).
    pub sysfs: Sysfs,
    /// procfs (`/proc`): routes, meminfo, cmdline, our uid.
    pub proc_root: PathBuf,
    /// VFIO nodes (`/dev/vfio`).
    pub dev_vfio: PathBuf,
    /// Where `bind` records the previous driver (`/run/erpc-vfio`).
    pub state_dir: PathBuf,
}

impl Default for Env {
    fn default() -> Self {
        Env {
            sysfs: Sysfs::default(),
            proc_root: "/proc".into(),
            dev_vfio: "/dev/vfio".into(),
            state_dir: "/run/erpc-vfio".into(),
        }
    }
}

/// Why the tool will not (or could not) do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Not root.
    #[error(
        "`erpc-vfio {command}` must run as root (it writes to /sys/bus/pci and reads /dev/vfio); \
         rerun it with sudo, or add --dry-run to only print the writes"
    )]
    NotRoot {
        /// The subcommand.
        command: &'static str,
    },
    /// No such function.
    #[error(
        "PCI function {bdf} does not exist; `erpc-vfio list` shows the functions of this machine"
    )]
    NoSuchDevice {
        /// The address.
        bdf: PciAddress,
    },
    /// No IOMMU group.
    #[error("{bdf} has no IOMMU group, so VFIO cannot isolate it: the IOMMU is off; {IOMMU_HINT}")]
    NoIommuGroup {
        /// The address.
        bdf: PciAddress,
    },
    /// vfio-pci is not loaded.
    #[error("the vfio-pci driver is not loaded: load it with `modprobe vfio-pci`, then retry")]
    VfioPciMissing,
    /// Other group members are on kernel drivers.
    #[error(
        "refusing to bind {bdf}: its IOMMU group {group} also holds {}. VFIO can use a group only \
         when every member is bound to vfio-pci or to no driver, and unbinding those devices from \
         their drivers is not this tool's call. Bind them first (`erpc-vfio bind <bdf>` for \
         each), or move the NIC to a slot with its own IOMMU group (a port with ACS)",
        describe(.others)
    )]
    SharedGroup {
        /// The function.
        bdf: PciAddress,
        /// Its group.
        group: u32,
        /// Other members on kernel drivers.
        others: Vec<(PciAddress, String)>,
    },
    /// The function carries the default route.
    #[error(
        "refusing to bind {bdf}: it carries this machine's default route (interface {iface}); \
         binding it to vfio-pci takes the machine off the network (and off your SSH session). \
         Use another NIC, or pass --force if you really mean it"
    )]
    DefaultRoute {
        /// The function.
        bdf: PciAddress,
        /// The interface with the default route.
        iface: String,
    },
    /// `unbind` of a function not on vfio-pci.
    #[error("{bdf} is {}, not to vfio-pci: nothing to unbind", match .driver { Some(d) => format!("bound to {d}"), None => "bound to no driver".into() })]
    NotOnVfio {
        /// The function.
        bdf: PciAddress,
        /// Its driver.
        driver: Option<String>,
    },
    /// A file could not be read or written.
    #[error("{op} {} failed: {source}", .path.display())]
    Io {
        /// What was done (`write 0000:00:02.0 to`, `read`).
        op: String,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The kernel did not end up where the writes should have put it.
    #[error("{0}")]
    Verify(String),
}

fn describe(others: &[(PciAddress, String)]) -> String {
    others
        .iter()
        .map(|(b, d)| format!("{b} (bound to {d})"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn io_err(op: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> ToolError + '_ {
    let op = op.into();
    move |source| ToolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One PCI function, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    /// Address.
    pub bdf: PciAddress,
    /// Vendor id, 4 hex digits.
    pub vendor: String,
    /// Device id, 4 hex digits.
    pub device: String,
    /// Class code, 6 hex digits.
    pub class: String,
    /// Short class name.
    pub class_name: &'static str,
    /// Bound driver.
    pub driver: Option<String>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// mlx5 model name, for mlx5 functions.
    pub mlx5: Option<&'static str>,
    /// Network interfaces.
    pub interfaces: Vec<String>,
}

/// Names of the common PCI classes (class, subclass).
pub fn class_name(class: u32) -> &'static str {
    match class >> 8 {
        0x0200 => "Ethernet controller",
        0x0207 => "InfiniBand controller",
        0x0280 => "Network controller",
        0x0100 => "SCSI controller",
        0x0106 => "SATA controller",
        0x0108 => "NVMe controller",
        0x0300 => "VGA controller",
        0x0600 => "Host bridge",
        0x0601 => "ISA bridge",
        0x0604 => "PCI bridge",
        0x0c03 => "USB controller",
        0x0c05 => "SMBus controller",
        0x00ff => "Unclassified device",
        0x1200 => "Processing accelerator",
        _ => match class >> 16 {
            0x01 => "Storage controller",
            0x02 => "Network controller",
            0x03 => "Display controller",
            0x06 => "Bridge",
            0x08 => "System peripheral",
            0x0c => "Serial bus controller",
            0xff => "Unassigned class",
            _ => "Other",
        },
    }
}

fn row(env: &Env, f: &PciFunction) -> DeviceRow {
    DeviceRow {
        bdf: f.address,
        vendor: format!("{:04x}", f.ids.vendor),
        device: format!("{:04x}", f.ids.device),
        class: format!("{:06x}", f.ids.class),
        class_name: class_name(f.ids.class),
        driver: f.driver.clone(),
        iommu_group: f.iommu_group,
        numa_node: f.numa_node,
        mlx5: is_mlx5(f.ids.vendor, f.ids.device)
            .then(|| mlx5_device_name(f.ids.device))
            .flatten(),
        interfaces: env.sysfs.net_interfaces(f.address),
    }
}

fn function(env: &Env, bdf: PciAddress) -> Result<PciFunction, ToolError> {
    if !env.sysfs.exists(bdf) {
        return Err(ToolError::NoSuchDevice { bdf });
    }
    let dir = env.sysfs.device_dir(bdf);
    env.sysfs.function(bdf).map_err(io_err("read", &dir))
}

/// Every PCI function.
pub fn list(env: &Env) -> Result<Vec<DeviceRow>, ToolError> {
    let dir = env.sysfs.pci_devices_dir();
    let all = env.sysfs.list().map_err(io_err("list", &dir))?;
    all.into_iter()
        .map(|bdf| function(env, bdf).map(|f| row(env, &f)))
        .collect()
}

/// Renders `list` as a table.
pub fn render_list(rows: &[DeviceRow]) -> String {
    let mut out = format!(
        "{:<13} {:<9} {:<22} {:<12} {:>5} {:>4}  {}\n",
        "BDF", "ID", "CLASS", "DRIVER", "GROUP", "NUMA", "NOTES"
    );
    for r in rows {
        let mut notes = Vec::new();
        if let Some(m) = r.mlx5 {
            notes.push(format!("mlx5: {m}"));
        }
        if !r.interfaces.is_empty() {
            notes.push(format!("net: {}", r.interfaces.join(",")));
        }
        let line = format!(
            "{:<13} {:<9} {:<22} {:<12} {:>5} {:>4}  {}",
            r.bdf.to_string(),
            format!("{}:{}", r.vendor, r.device),
            r.class_name,
            r.driver.as_deref().unwrap_or("-"),
            r.iommu_group.map_or("-".to_string(), |g| g.to_string()),
            r.numa_node.map_or("-".to_string(), |n| n.to_string()),
            notes.join("; ")
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

mod bind;
mod status;

pub use bind::*;
pub use status::*;

#[cfg(test)]
mod tests;
