//! `erpc-vfio status`: what a function needs before eRPC can use it (its
//! IOMMU group, hugepages, the IOMMU, its bind record), and the next steps.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mlx5::vfio::{IOMMU_HINT, PciAddress, driver_keeps_group_viable, is_vfio_driver};
use serde::{Deserialize, Serialize};

use super::*;

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

pub(super) fn state_file(env: &Env, bdf: PciAddress) -> PathBuf {
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
