//! The logic of `erpc-vfio`: listing PCI functions, reporting a function's
//! VFIO readiness, and binding it to vfio-pci (or back) the way the kernel
//! documents: `driver_override`, `driver/unbind`, `drivers_probe`.
//!
//! Every path is rooted in an [`Env`] so the unit tests run against a fake
//! sysfs/procfs tree. Binding is planned first ([`plan_bind`],
//! [`plan_unbind`]) as a list of exact sysfs writes, which `--dry-run`
//! prints and [`apply`] performs.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlx5::hw::mlx5_device_name;
use mlx5::vfio::sysfs::{PciFunction, Sysfs};
use mlx5::vfio::{IOMMU_HINT, PciAddress, driver_keeps_group_viable, is_mlx5, is_vfio_driver};
use serde::{Deserialize, Serialize};

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

/// A group member in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Address.
    pub bdf: PciAddress,
    /// Driver.
    pub driver: Option<String>,
    /// True if its driver makes the group non-viable.
    pub blocks_vfio: bool,
}

/// The IOMMU group part of `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupStatus {
    /// Number.
    pub number: u32,
    /// Members.
    pub members: Vec<Member>,
    /// True if every member is on vfio-pci, a DMA-free driver, or none.
    pub viable: bool,
    /// `/dev/vfio/N`.
    pub dev_node: PathBuf,
    /// True if it exists.
    pub dev_node_exists: bool,
    /// Its mode bits, octal (`0600`).
    pub dev_node_mode: Option<String>,
    /// Its owner, `uid:gid`.
    pub dev_node_owner: Option<String>,
}

/// Hugepage counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Hugepages {
    /// Page size in KiB.
    pub page_kib: u64,
    /// Pages in the pool.
    pub total: u64,
    /// Pages free.
    pub free: u64,
    /// Free pages promised to mappings.
    pub reserved: u64,
}

/// The IOMMU part of `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IommuStatus {
    /// True if the kernel created IOMMU groups.
    pub enabled: bool,
    /// IOMMU units (`dmar0`).
    pub units: Vec<String>,
    /// Number of groups.
    pub groups: usize,
    /// IOMMU options on the kernel command line.
    pub cmdline: Vec<String>,
}

/// What `bind` recorded about a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindRecord {
    /// The function.
    pub bdf: PciAddress,
    /// Its driver before `bind`.
    pub previous_driver: Option<String>,
    /// Its `driver_override` before `bind`.
    pub previous_override: Option<String>,
}

/// Everything `status` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The function.
    pub device: DeviceRow,
    /// Its `driver_override`.
    pub driver_override: Option<String>,
    /// Its IOMMU group.
    pub group: Option<GroupStatus>,
    /// IOMMU state.
    pub iommu: IommuStatus,
    /// True if the vfio-pci driver is registered.
    pub vfio_pci_loaded: bool,
    /// True if `/dev/vfio/vfio` exists.
    pub vfio_container_exists: bool,
    /// Hugepage counters.
    pub hugepages: Hugepages,
    /// Interface with the default route on this function, if any.
    pub default_route: Option<String>,
    /// What `bind` recorded.
    pub recorded: Option<BindRecord>,
    /// True if the function can be opened with VFIO right now.
    pub ready: bool,
    /// What to do to make it ready.
    pub next_steps: Vec<String>,
}

fn group_status(env: &Env, number: u32) -> GroupStatus {
    let members: Vec<Member> = env
        .sysfs
        .group_members(number)
        .unwrap_or_default()
        .into_iter()
        .map(|bdf| {
            let driver = env.sysfs.driver(bdf).ok().flatten();
            let blocks_vfio = driver
                .as_deref()
                .is_some_and(|d| !driver_keeps_group_viable(d));
            Member {
                bdf,
                driver,
                blocks_vfio,
            }
        })
        .collect();
    let dev_node = env.dev_vfio.join(number.to_string());
    let meta = fs::metadata(&dev_node).ok();
    GroupStatus {
        number,
        viable: members.iter().all(|m| !m.blocks_vfio),
        members,
        dev_node_exists: meta.is_some(),
        dev_node_mode: meta.as_ref().map(|m| format!("{:04o}", m.mode() & 0o7777)),
        dev_node_owner: meta.as_ref().map(|m| format!("{}:{}", m.uid(), m.gid())),
        dev_node,
    }
}

/// Hugepage counters from `meminfo`.
pub fn hugepages(env: &Env) -> Hugepages {
    let text = fs::read_to_string(env.proc_root.join("meminfo")).unwrap_or_default();
    let info = mempool::meminfo::HugepageInfo::parse(&text);
    Hugepages {
        page_kib: info.page_size_bytes / 1024,
        total: info.total,
        free: info.free,
        reserved: info.reserved,
    }
}

/// Interfaces that hold a default route (IPv4 or IPv6).
pub fn default_route_interfaces(proc_root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    // /proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask ...
    if let Ok(text) = fs::read_to_string(proc_root.join("net/route")) {
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000" {
                let flags = u32::from_str_radix(f[3], 16).unwrap_or(0);
                if flags & 0x1 != 0 {
                    out.push(f[0].to_string());
                }
            }
        }
    }
    // /proc/net/ipv6_route: dest plen src plen nexthop metric ref use flags iface
    if let Ok(text) = fs::read_to_string(proc_root.join("net/ipv6_route")) {
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" {
                let flags = u32::from_str_radix(f[8], 16).unwrap_or(0);
                // RTF_UP and not RTF_REJECT (the kernel's unreachable default on lo).
                if flags & 0x1 != 0 && flags & 0x200 == 0 && f[9] != "lo" {
                    out.push(f[9].to_string());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The default-route interface that sits on `bdf`, if any.
pub fn default_route_on(env: &Env, bdf: PciAddress) -> Option<String> {
    default_route_interfaces(&env.proc_root)
        .into_iter()
        .find(|iface| env.sysfs.functions_of_interface(iface, 4).contains(&bdf))
}

fn state_file(env: &Env, bdf: PciAddress) -> PathBuf {
    env.state_dir.join(format!("{bdf}.json"))
}

/// What `bind` recorded for `bdf`, if anything.
pub fn read_record(env: &Env, bdf: PciAddress) -> Option<BindRecord> {
    let text = fs::read_to_string(state_file(env, bdf)).ok()?;
    serde_json::from_str(&text).ok()
}

fn iommu_status(env: &Env) -> IommuStatus {
    let cmdline = fs::read_to_string(env.proc_root.join("cmdline")).unwrap_or_default();
    let groups = env.sysfs.iommu_group_count();
    IommuStatus {
        enabled: groups > 0,
        units: env.sysfs.iommu_units(),
        groups,
        cmdline: cmdline
            .split_whitespace()
            .filter(|w| w.contains("iommu"))
            .map(str::to_string)
            .collect(),
    }
}

/// What to do, in order, to make `bdf` ready: the same conditions
/// [`plan_bind`] refuses on, with the same way out, so that following the
/// advice never runs into a refusal.
fn next_steps(
    bdf: PciAddress,
    group: &Option<GroupStatus>,
    vfio_pci_loaded: bool,
    on_vfio: bool,
    default_route: &Option<String>,
    hp: &Hugepages,
) -> Vec<String> {
    let mut next = Vec::new();
    let Some(g) = group else {
        // `bind` refuses a function without a group; nothing else helps
        // until the IOMMU is on.
        next.push(IOMMU_HINT.to_string());
        return next;
    };
    if !vfio_pci_loaded {
        next.push("load vfio-pci: `sudo modprobe vfio-pci`".to_string());
    }
    for m in g.members.iter().filter(|m| m.blocks_vfio && m.bdf != bdf) {
        next.push(format!(
            "group member {} is on {}: VFIO needs every member of group {} on vfio-pci or \
             on no driver; bind it first (`sudo erpc-vfio bind {}`), or move the NIC to a \
             slot with its own IOMMU group",
            m.bdf,
            m.driver.as_deref().unwrap_or("?"),
            g.number,
            m.bdf
        ));
    }
    if !on_vfio {
        let then = if next.is_empty() { "" } else { "then " };
        match default_route {
            Some(iface) => next.push(format!(
                "it carries this machine's default route (interface {iface}): `erpc-vfio \
                 bind` refuses it, since binding it takes the machine off the network; use \
                 another NIC, or {then}`sudo erpc-vfio bind --force {bdf}` if you really \
                 mean it"
            )),
            None => next.push(format!("{then}bind it: `sudo erpc-vfio bind {bdf}`")),
        }
    } else if !g.dev_node_exists && g.viable {
        next.push(format!(
            "{} is missing although {bdf} is on vfio-pci: check that udev created it \
             (`ls -l /dev/vfio`), or rebind (`sudo erpc-vfio unbind {bdf}` and `bind` again)",
            g.dev_node.display()
        ));
    }
    let want = crate::memory::default_bench_pages();
    let info = mempool::meminfo::HugepageInfo {
        total: hp.total,
        free: hp.free,
        reserved: hp.reserved,
        page_size_bytes: hp.page_kib * 1024,
    };
    let available = info.available();
    if available < want {
        next.push(format!(
            "reserve hugepages: the driver and erpc-bench need {want} free 2 MiB pages, {available} \
             are free: `{}`",
            mempool::meminfo::reserve_command(&info, want)
        ));
    }
    next
}

/// Everything about `bdf` that decides whether VFIO can use it.
pub fn status(env: &Env, bdf: PciAddress) -> Result<Status, ToolError> {
    let f = function(env, bdf)?;
    let device = row(env, &f);
    let group = f.iommu_group.map(|g| group_status(env, g));
    let iommu = iommu_status(env);
    let vfio_pci_loaded = env.sysfs.pci_driver_registered(VFIO_DRIVER);
    let hp = hugepages(env);
    let on_vfio = f.driver.as_deref().is_some_and(is_vfio_driver);
    let default_route = default_route_on(env, bdf);
    let next = next_steps(bdf, &group, vfio_pci_loaded, on_vfio, &default_route, &hp);
    let ready = on_vfio
        && group
            .as_ref()
            .is_some_and(|g| g.viable && g.dev_node_exists);
    Ok(Status {
        driver_override: env.sysfs.driver_override(bdf).ok().flatten(),
        default_route,
        recorded: read_record(env, bdf),
        vfio_container_exists: env.dev_vfio.join("vfio").exists(),
        device,
        group,
        iommu,
        vfio_pci_loaded,
        hugepages: hp,
        ready,
        next_steps: next,
    })
}

/// Renders `status` for people.
pub fn render_status(s: &Status) -> String {
    let d = &s.device;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<16}{v}\n"));
    line(
        "device",
        format!("{} {}:{} {}", d.bdf, d.vendor, d.device, d.class_name),
    );
    line(
        "mlx5",
        d.mlx5.map_or("no".to_string(), |m| format!("yes ({m})")),
    );
    line("driver", d.driver.clone().unwrap_or_else(|| "none".into()));
    if let Some(o) = &s.driver_override {
        line("driver_override", o.clone());
    }
    if !d.interfaces.is_empty() {
        line("interfaces", d.interfaces.join(", "));
    }
    line(
        "numa node",
        d.numa_node.map_or("unknown".to_string(), |n| n.to_string()),
    );
    line(
        "iommu",
        if s.iommu.enabled {
            format!(
                "on ({} groups; units {}; cmdline {})",
                s.iommu.groups,
                if s.iommu.units.is_empty() {
                    "-".into()
                } else {
                    s.iommu.units.join(",")
                },
                if s.iommu.cmdline.is_empty() {
                    "-".into()
                } else {
                    s.iommu.cmdline.join(" ")
                }
            )
        } else {
            "off".to_string()
        },
    );
    match &s.group {
        Some(g) => {
            line(
                "iommu group",
                format!(
                    "{} ({} member{}, {})",
                    g.number,
                    g.members.len(),
                    if g.members.len() == 1 { "" } else { "s" },
                    if g.viable { "viable" } else { "NOT viable" }
                ),
            );
            for m in &g.members {
                line(
                    "",
                    format!(
                        "{} {}{}",
                        m.bdf,
                        m.driver.as_deref().unwrap_or("(no driver)"),
                        if m.blocks_vfio {
                            "  <- blocks VFIO"
                        } else {
                            ""
                        }
                    ),
                );
            }
            line(
                "vfio node",
                match (&g.dev_node_mode, &g.dev_node_owner) {
                    (Some(mode), Some(owner)) => {
                        format!("{} mode {mode} owner {owner}", g.dev_node.display())
                    }
                    _ => format!("{} missing", g.dev_node.display()),
                },
            );
        }
        None => line("iommu group", "none".to_string()),
    }
    line(
        "vfio-pci",
        if s.vfio_pci_loaded {
            "loaded".into()
        } else {
            "not loaded".into()
        },
    );
    line(
        "hugepages",
        format!(
            "{} kB pages: {} total, {} free, {} reserved",
            s.hugepages.page_kib, s.hugepages.total, s.hugepages.free, s.hugepages.reserved
        ),
    );
    line(
        "default route",
        s.default_route
            .as_ref()
            .map_or("no".to_string(), |i| format!("yes (via {i})")),
    );
    if let Some(r) = &s.recorded {
        line(
            "bound by tool",
            format!(
                "yes; previous driver {}",
                r.previous_driver.as_deref().unwrap_or("none")
            ),
        );
    }
    line("ready for VFIO", yes(s.ready).to_string());
    for step in &s.next_steps {
        line("next step", step.clone());
    }
    out
}

/// One sysfs write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Write {
    /// The file.
    pub path: PathBuf,
    /// What is written (a trailing newline, as `echo` adds, is implied).
    pub value: String,
}

/// A planned `bind` or `unbind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// `bind` or `unbind`.
    pub action: &'static str,
    /// The function.
    pub bdf: PciAddress,
    /// The writes, in order.
    pub writes: Vec<Write>,
    /// Record to save before the writes (bind) or to remove after (unbind).
    pub record: Option<BindRecord>,
    /// The record file.
    pub state_file: PathBuf,
    /// The driver the function should end up on (`None`: no driver).
    pub expect_driver: Option<String>,
    /// True if nothing needs doing.
    pub already_done: bool,
}

impl Plan {
    /// The writes as shell commands.
    pub fn shell(&self) -> String {
        self.writes
            .iter()
            .map(|w| format!("echo {} > {}\n", shell_word(&w.value), w.path.display()))
            .collect()
    }
}

fn shell_word(s: &str) -> String {
    if s.is_empty() {
        "''".into()
    } else {
        s.to_string()
    }
}

/// Plans binding `bdf` to vfio-pci, refusing what the policy forbids.
pub fn plan_bind(env: &Env, bdf: PciAddress, force: bool) -> Result<Plan, ToolError> {
    let f = function(env, bdf)?;
    let group = f.iommu_group.ok_or(ToolError::NoIommuGroup { bdf })?;
    if !env.sysfs.pci_driver_registered(VFIO_DRIVER) {
        return Err(ToolError::VfioPciMissing);
    }
    let mut plan = Plan {
        action: "bind",
        bdf,
        writes: Vec::new(),
        record: None,
        state_file: state_file(env, bdf),
        expect_driver: Some(VFIO_DRIVER.to_string()),
        already_done: false,
    };
    if f.driver.as_deref().is_some_and(is_vfio_driver) {
        plan.already_done = true;
        return Ok(plan);
    }
    let others: Vec<(PciAddress, String)> = env
        .sysfs
        .group_members(group)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| *m != bdf)
        .filter_map(|m| {
            let d = env.sysfs.driver(m).ok()??;
            (!driver_keeps_group_viable(&d)).then_some((m, d))
        })
        .collect();
    if !others.is_empty() {
        return Err(ToolError::SharedGroup { bdf, group, others });
    }
    if let Some(iface) = default_route_on(env, bdf)
        && !force
    {
        return Err(ToolError::DefaultRoute { bdf, iface });
    }
    let dev = env.sysfs.device_dir(bdf);
    plan.writes.push(Write {
        path: dev.join("driver_override"),
        value: VFIO_DRIVER.into(),
    });
    if f.driver.is_some() {
        plan.writes.push(Write {
            path: dev.join("driver/unbind"),
            value: bdf.to_string(),
        });
    }
    plan.writes.push(Write {
        path: env.sysfs.drivers_probe_path(),
        value: bdf.to_string(),
    });
    plan.record = Some(BindRecord {
        bdf,
        previous_driver: f.driver,
        previous_override: env.sysfs.driver_override(bdf).ok().flatten(),
    });
    Ok(plan)
}

/// Plans returning `bdf` from vfio-pci to the driver `bind` recorded (or,
/// without a record, to whatever the kernel picks).
pub fn plan_unbind(env: &Env, bdf: PciAddress) -> Result<Plan, ToolError> {
    let f = function(env, bdf)?;
    if !f.driver.as_deref().is_some_and(is_vfio_driver) {
        return Err(ToolError::NotOnVfio {
            bdf,
            driver: f.driver,
        });
    }
    let record = read_record(env, bdf);
    let dev = env.sysfs.device_dir(bdf);
    let mut writes = vec![
        Write {
            path: dev.join("driver/unbind"),
            value: bdf.to_string(),
        },
        Write {
            path: dev.join("driver_override"),
            value: record
                .as_ref()
                .and_then(|r| r.previous_override.clone())
                .unwrap_or_default(),
        },
    ];
    // Probe unless the function had no driver before: then leave it so.
    let probe = record.as_ref().is_none_or(|r| r.previous_driver.is_some());
    if probe {
        writes.push(Write {
            path: env.sysfs.drivers_probe_path(),
            value: bdf.to_string(),
        });
    }
    Ok(Plan {
        action: "unbind",
        bdf,
        writes,
        expect_driver: record.as_ref().and_then(|r| r.previous_driver.clone()),
        record,
        state_file: state_file(env, bdf),
        already_done: false,
    })
}

/// Performs a plan: saves the record (bind) first, so an interrupted bind
/// can still be undone, then the writes in order; removes the record after
/// an unbind.
pub fn apply(plan: &Plan) -> Result<(), ToolError> {
    if plan.already_done {
        return Ok(());
    }
    if plan.action == "bind"
        && let Some(record) = &plan.record
    {
        if let Some(dir) = plan.state_file.parent() {
            fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        }
        let text = serde_json::to_string_pretty(record).expect("a record serializes");
        fs::write(&plan.state_file, text + "\n").map_err(io_err("write", &plan.state_file))?;
    }
    for w in &plan.writes {
        // One write(2) per file, newline-terminated, as `echo` does; sysfs
        // acts on the write, so no partial-write loop is needed.
        fs::write(&w.path, format!("{}\n", w.value))
            .map_err(io_err(format!("write `{}` to", w.value), &w.path))?;
    }
    if plan.action == "unbind" {
        match fs::remove_file(&plan.state_file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &plan.state_file)(e)),
        }
    }
    Ok(())
}

/// Waits (up to `timeout`) until the function is on the driver the plan
/// expects and, after a bind, its `/dev/vfio/N` exists.
pub fn verify(env: &Env, plan: &Plan, timeout: Duration) -> Result<(), ToolError> {
    let start = Instant::now();
    loop {
        let driver = env.sysfs.driver(plan.bdf).ok().flatten();
        let node_ok = plan.action != "bind"
            || env
                .sysfs
                .iommu_group(plan.bdf)
                .ok()
                .flatten()
                .is_some_and(|g| env.dev_vfio.join(g.to_string()).exists());
        if driver == plan.expect_driver && node_ok {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(ToolError::Verify(format!(
                "after {} {}: driver is {}, expected {}{}; see `dmesg` for the kernel's reason",
                plan.action,
                plan.bdf,
                driver.as_deref().unwrap_or("none"),
                plan.expect_driver.as_deref().unwrap_or("none"),
                if node_ok {
                    ""
                } else {
                    ", and its /dev/vfio node is missing"
                }
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The effective uid of this process, from `proc_root/self/status`.
pub fn effective_uid(proc_root: &Path) -> Option<u32> {
    let text = fs::read_to_string(proc_root.join("self/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::vfio::sysfs::FakeSysfs;

    fn bdf(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    struct Fixture {
        fake: FakeSysfs,
        env: Env,
    }

    /// A machine like the QEMU guest: e1000e alone (no driver), edu alone,
    /// virtio-net with the default route, and a bridge group holding a
    /// second edu and a virtio-rng on virtio-pci.
    fn machine() -> Fixture {
        let fake = FakeSysfs::new().unwrap();
        fake.add_device(bdf("0000:00:02.0"), 0x8086, 0x10d3, 0x020000, Some(2))
            .unwrap();
        fake.add_device(bdf("0000:00:03.0"), 0x1234, 0x11e8, 0x00ff00, Some(3))
            .unwrap();
        fake.add_device(bdf("0000:00:04.0"), 0x1af4, 0x1000, 0x020000, Some(4))
            .unwrap();
        fake.add_device(bdf("0000:00:05.0"), 0x1b36, 0x0001, 0x060400, Some(5))
            .unwrap();
        fake.add_device(bdf("0000:01:01.0"), 0x1234, 0x11e8, 0x00ff00, Some(5))
            .unwrap();
        fake.add_device(bdf("0000:01:02.0"), 0x1af4, 0x1005, 0x00ff00, Some(5))
            .unwrap();
        fake.add_device(bdf("0000:03:00.0"), 0x15b3, 0x1017, 0x020000, Some(7))
            .unwrap();
        fake.bind(bdf("0000:00:04.0"), "virtio-pci").unwrap();
        fake.bind(bdf("0000:01:02.0"), "virtio-pci").unwrap();
        fake.add_driver("vfio-pci").unwrap();
        fake.add_iommu_unit("dmar0").unwrap();
        fake.add_interface(bdf("0000:00:04.0"), "eth0", true)
            .unwrap();
        let proc_root = fake.root().join("proc");
        fs::create_dir_all(proc_root.join("net")).unwrap();
        fs::create_dir_all(proc_root.join("self")).unwrap();
        fs::write(
            proc_root.join("net/route"),
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
        )
        .unwrap();
        fs::write(
            proc_root.join("net/ipv6_route"),
            "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n",
        )
        .unwrap();
        fs::write(
            proc_root.join("meminfo"),
            "HugePages_Total:      16\nHugePages_Free:       12\nHugePages_Rsvd:        1\nHugepagesize:       2048 kB\n",
        )
        .unwrap();
        fs::write(
            proc_root.join("cmdline"),
            "console=ttyS0 intel_iommu=on quiet\n",
        )
        .unwrap();
        fs::write(
            proc_root.join("self/status"),
            "Name:\tx\nUid:\t1000\t0\t0\t0\n",
        )
        .unwrap();
        let env = Env {
            sysfs: fake.sysfs(),
            proc_root,
            dev_vfio: fake.root().join("dev-vfio"),
            state_dir: fake.root().join("run"),
        };
        fs::create_dir_all(&env.dev_vfio).unwrap();
        Fixture { fake, env }
    }

    #[test]
    fn list_shows_ids_drivers_groups_and_mlx5() {
        let m = machine();
        let rows = list(&m.env).unwrap();
        assert_eq!(rows.len(), 7);
        let nic = rows.iter().find(|r| r.bdf == bdf("0000:03:00.0")).unwrap();
        assert_eq!(nic.mlx5, Some("ConnectX-5"));
        assert_eq!(nic.iommu_group, Some(7));
        let virtio = rows.iter().find(|r| r.bdf == bdf("0000:00:04.0")).unwrap();
        assert_eq!(virtio.driver.as_deref(), Some("virtio-pci"));
        assert_eq!(virtio.class_name, "Ethernet controller");
        assert!(rows.iter().filter(|r| r.mlx5.is_some()).count() == 1);
        let table = render_list(&rows);
        assert!(table.contains("0000:03:00.0  15b3:1017"), "{table}");
        assert!(table.contains("mlx5: ConnectX-5"), "{table}");
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["bdf"], "0000:00:02.0");
    }

    #[test]
    fn bind_plan_is_the_documented_sysfs_sequence() {
        let m = machine();
        let plan = plan_bind(&m.env, bdf("0000:00:02.0"), false).unwrap();
        let root = m.fake.root().display().to_string();
        assert_eq!(
            plan.shell().replace(&root, ""),
            "echo vfio-pci > /bus/pci/devices/0000:00:02.0/driver_override\n\
             echo 0000:00:02.0 > /bus/pci/drivers_probe\n"
        );
        assert_eq!(plan.record.as_ref().unwrap().previous_driver, None);
        // A function on a driver is unbound from it in between.
        let plan = plan_bind(&m.env, bdf("0000:00:04.0"), true).unwrap();
        assert_eq!(
            plan.shell().replace(&root, ""),
            "echo vfio-pci > /bus/pci/devices/0000:00:04.0/driver_override\n\
             echo 0000:00:04.0 > /bus/pci/devices/0000:00:04.0/driver/unbind\n\
             echo 0000:00:04.0 > /bus/pci/drivers_probe\n"
        );
        assert_eq!(
            plan.record.as_ref().unwrap().previous_driver.as_deref(),
            Some("virtio-pci")
        );
    }

    #[test]
    fn bind_refuses_a_group_shared_with_kernel_drivers() {
        let m = machine();
        let err = plan_bind(&m.env, bdf("0000:01:01.0"), true).unwrap_err();
        let ToolError::SharedGroup { group, others, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*group, 5);
        assert_eq!(
            others,
            &vec![(bdf("0000:01:02.0"), "virtio-pci".to_string())]
        );
        let text = err.to_string();
        assert!(
            text.contains("0000:01:02.0 (bound to virtio-pci)"),
            "{text}"
        );
        assert!(text.contains("own IOMMU group"), "{text}");
        // Once the other member is on vfio-pci the bind goes ahead.
        m.fake.bind(bdf("0000:01:02.0"), "vfio-pci").unwrap();
        assert!(plan_bind(&m.env, bdf("0000:01:01.0"), false).is_ok());
    }

    #[test]
    fn bind_refuses_the_default_route_unless_forced() {
        let m = machine();
        let err = plan_bind(&m.env, bdf("0000:00:04.0"), false).unwrap_err();
        assert!(
            matches!(&err, ToolError::DefaultRoute { iface, .. } if iface == "eth0"),
            "{err:?}"
        );
        assert!(err.to_string().contains("--force"), "{err}");
        assert!(plan_bind(&m.env, bdf("0000:00:04.0"), true).is_ok());
        // Through a bridge on top of it, too.
        fs::write(
            m.env.proc_root.join("net/route"),
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             br0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n",
        )
        .unwrap();
        m.fake.add_virtual_interface("br0", &["eth0"]).unwrap();
        assert!(matches!(
            plan_bind(&m.env, bdf("0000:00:04.0"), false),
            Err(ToolError::DefaultRoute { .. })
        ));
    }

    #[test]
    fn bind_refuses_without_iommu_or_vfio_pci() {
        let m = machine();
        m.fake
            .add_device(bdf("0000:00:1f.0"), 0x8086, 0x2918, 0x060100, None)
            .unwrap();
        let err = plan_bind(&m.env, bdf("0000:00:1f.0"), false).unwrap_err();
        assert!(err.to_string().contains("intel_iommu=on iommu=pt"), "{err}");
        let err = plan_bind(&m.env, bdf("0000:09:00.0"), false).unwrap_err();
        assert!(matches!(err, ToolError::NoSuchDevice { .. }));
        fs::remove_dir_all(m.env.sysfs.driver_dir("vfio-pci")).unwrap();
        let err = plan_bind(&m.env, bdf("0000:00:02.0"), false).unwrap_err();
        assert!(err.to_string().contains("modprobe vfio-pci"), "{err}");
    }

    #[test]
    fn apply_records_then_writes_and_unbind_restores() {
        let m = machine();
        let virtio = bdf("0000:00:04.0");
        let plan = plan_bind(&m.env, virtio, true).unwrap();
        apply(&plan).unwrap();
        let dev = m.env.sysfs.device_dir(virtio);
        assert_eq!(
            fs::read_to_string(dev.join("driver_override")).unwrap(),
            "vfio-pci\n"
        );
        assert_eq!(
            fs::read_to_string(m.env.sysfs.drivers_probe_path()).unwrap(),
            "0000:00:04.0\n"
        );
        let rec = read_record(&m.env, virtio).unwrap();
        assert_eq!(rec.previous_driver.as_deref(), Some("virtio-pci"));
        // The fake kernel: the probe put it on vfio-pci.
        m.fake.bind(virtio, "vfio-pci").unwrap();
        let plan = plan_bind(&m.env, virtio, true).unwrap();
        assert!(plan.already_done);
        let un = plan_unbind(&m.env, virtio).unwrap();
        assert_eq!(un.expect_driver.as_deref(), Some("virtio-pci"));
        let root = m.fake.root().display().to_string();
        assert_eq!(
            un.shell().replace(&root, ""),
            "echo 0000:00:04.0 > /bus/pci/devices/0000:00:04.0/driver/unbind\n\
             echo '' > /bus/pci/devices/0000:00:04.0/driver_override\n\
             echo 0000:00:04.0 > /bus/pci/drivers_probe\n"
        );
        apply(&un).unwrap();
        assert_eq!(
            fs::read_to_string(dev.join("driver_override")).unwrap(),
            "\n"
        );
        assert!(read_record(&m.env, virtio).is_none(), "record removed");
    }

    #[test]
    fn unbind_of_a_driverless_function_does_not_probe() {
        let m = machine();
        let e1000e = bdf("0000:00:02.0");
        apply(&plan_bind(&m.env, e1000e, false).unwrap()).unwrap();
        m.fake.bind(e1000e, "vfio-pci").unwrap();
        let un = plan_unbind(&m.env, e1000e).unwrap();
        assert_eq!(un.writes.len(), 2);
        assert_eq!(un.expect_driver, None);
        let err = plan_unbind(&m.env, bdf("0000:00:03.0")).unwrap_err();
        assert!(
            err.to_string()
                .contains("bound to no driver, not to vfio-pci"),
            "{err}"
        );
    }

    #[test]
    fn status_reports_group_viability_hugepages_and_route() {
        let m = machine();
        let s = status(&m.env, bdf("0000:01:01.0")).unwrap();
        let g = s.group.as_ref().unwrap();
        assert_eq!(g.number, 5);
        assert_eq!(g.members.len(), 3);
        assert!(!g.viable);
        assert!(!g.dev_node_exists);
        assert!(s.iommu.enabled);
        assert_eq!(s.iommu.units, ["dmar0"]);
        assert_eq!(s.iommu.cmdline, ["intel_iommu=on"]);
        assert!(s.vfio_pci_loaded);
        assert_eq!(
            s.hugepages,
            Hugepages {
                page_kib: 2048,
                total: 16,
                free: 12,
                reserved: 1
            }
        );
        assert!(!s.ready);
        assert!(
            s.next_steps
                .iter()
                .any(|n| n.contains("0000:01:02.0 is on virtio-pci"))
        );
        let text = render_status(&s);
        assert!(text.contains("NOT viable"), "{text}");
        assert!(text.contains("<- blocks VFIO"), "{text}");
        let s = status(&m.env, bdf("0000:00:04.0")).unwrap();
        assert_eq!(s.default_route.as_deref(), Some("eth0"));
        // A bound function with its node is ready; the node's mode shows.
        m.fake.bind(bdf("0000:00:03.0"), "vfio-pci").unwrap();
        fs::write(m.env.dev_vfio.join("3"), "").unwrap();
        let s = status(&m.env, bdf("0000:00:03.0")).unwrap();
        assert!(s.ready, "{s:?}");
        assert!(s.group.unwrap().dev_node_mode.is_some());
    }

    #[test]
    fn status_advice_never_leads_into_a_bind_refusal() {
        let m = machine();
        // Every non-ready function's advice, followed literally, is accepted
        // by `plan_bind`: a plain `bind` is suggested only where it works.
        for f in [
            "0000:00:02.0",
            "0000:00:04.0",
            "0000:01:01.0",
            "0000:03:00.0",
        ] {
            let s = status(&m.env, bdf(f)).unwrap();
            assert!(!s.ready, "{f}");
            let plain = format!("bind it: `sudo erpc-vfio bind {f}`");
            let suggests_plain = s.next_steps.first() == Some(&plain);
            assert_eq!(
                suggests_plain,
                plan_bind(&m.env, bdf(f), false).is_ok(),
                "{f}: {:?}",
                s.next_steps
            );
        }
        // The default-route NIC: the refusal and its way out, no plain bind.
        let s = status(&m.env, bdf("0000:00:04.0")).unwrap();
        let steps = s.next_steps.join("\n");
        assert!(steps.contains("default route (interface eth0)"), "{steps}");
        assert!(
            steps.contains("`sudo erpc-vfio bind --force 0000:00:04.0`"),
            "{steps}"
        );
        // A shared group: bind the other member first, then this one.
        let s = status(&m.env, bdf("0000:01:01.0")).unwrap();
        assert!(s.next_steps[0].contains("`sudo erpc-vfio bind 0000:01:02.0`"));
        assert!(
            s.next_steps[1].starts_with("then bind it"),
            "{:?}",
            s.next_steps
        );
        // Hugepages: the one number erpc-bench uses, and the command for
        // this machine (16 total, 11 available).
        let want = crate::memory::default_bench_pages();
        assert!(
            steps.contains(&format!("need {want} free 2 MiB pages, 11 are free")),
            "{steps}"
        );
        assert!(
            steps.contains(&format!("`echo {} | sudo tee", 16 + want - 11)),
            "{steps}"
        );
        // Without vfio-pci: load it first.
        fs::remove_dir_all(m.fake.root().join("bus/pci/drivers/vfio-pci")).unwrap();
        let s = status(&m.env, bdf("0000:00:02.0")).unwrap();
        assert!(
            s.next_steps[0].contains("modprobe vfio-pci"),
            "{:?}",
            s.next_steps
        );
        assert!(
            s.next_steps[1].starts_with("then bind it"),
            "{:?}",
            s.next_steps
        );
    }

    #[test]
    fn default_routes_ignore_lo_rejects_and_non_default_entries() {
        let m = machine();
        assert_eq!(default_route_interfaces(&m.env.proc_root), ["eth0"]);
        fs::write(
            m.env.proc_root.join("net/ipv6_route"),
            "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
             fe800000000000000000000000000001 00000400 00000001 00000000 00000003 ens1\n",
        )
        .unwrap();
        assert_eq!(default_route_interfaces(&m.env.proc_root), ["ens1", "eth0"]);
    }

    #[test]
    fn reads_the_effective_uid() {
        let m = machine();
        assert_eq!(effective_uid(&m.env.proc_root), Some(0));
        fs::write(
            m.env.proc_root.join("self/status"),
            "Uid:\t0\t1000\t1000\t1000\n",
        )
        .unwrap();
        assert_eq!(effective_uid(&m.env.proc_root), Some(1000));
    }
}
