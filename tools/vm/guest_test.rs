//! The VFIO tests that run inside the QEMU guest of `tools/vm/run.sh`, as
//! root, against a real kernel's vfio-pci and a real (emulated) Intel IOMMU.
//!
//! It drives the project's own code: the `erpc-vfio` binary (next to this
//! one) for binding, `mlx5::vfio` for the container, group, device, BARs and
//! DMA, and `mempool` for hugepage memory. The guest has (found by ids, not
//! by address):
//!
//! * `e1000e` (8086:10d3), its own IOMMU group, no driver in the cloud
//!   kernel; its MAC is set on the QEMU command line (`GUEST_MAC`);
//! * `edu` (1234:11e8), its own group: MMIO registers and a DMA engine;
//! * `virtio-net-pci` (1af4:1000) on `virtio-pci`, carrying the default route;
//! * behind a PCI-PCI bridge (one group): a second `edu` and a
//!   `virtio-rng-pci` (1af4:1005) on `virtio-pci`: a group that is not
//!   viable once the `edu` is on vfio-pci.
//!
//! Each case prints `ok - name` or `not ok - name: why`; the last line is
//! `guest: N passed, M failed`.
// One deliberate `unsafe`: the IOMMU-fault case maps a buffer a second time.
#![deny(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mempool::{Allocator, AllocatorConfig, DmaMapper, PageSize};
use mlx5::hw::HwBackend;
use mlx5::vfio::sysfs::Sysfs;
use mlx5::vfio::{Bar, DeviceCheck, PciAddress, VfioBackend, VfioDevice, VfioError, VfioPaths};
use serde_json::Value;

/// The MAC address run.sh gives the e1000e.
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

/// edu registers (QEMU docs/specs/edu.rst).
mod edu {
    pub const IDENT: usize = 0x00;
    pub const LIVENESS: usize = 0x04;
    pub const DMA_SRC: usize = 0x80;
    pub const DMA_DST: usize = 0x88;
    pub const DMA_COUNT: usize = 0x90;
    pub const DMA_CMD: usize = 0x98;
    pub const CMD_RUN: u64 = 1;
    pub const CMD_TO_RAM: u64 = 2;
    /// The device-side DMA buffer.
    pub const BUF: u64 = 0x4_0000;
    /// edu's DMA mask is 28 bits.
    pub const IOVA_LIMIT: u64 = 1 << 28;
    /// Transfers must end strictly before the end of the 4 KiB buffer.
    pub const MAX_XFER: u32 = 4000;
    pub const IDENT_V1: u32 = 0x0100_00ed;
    /// Write: raise an interrupt (ORed into the status register).
    pub const IRQ_RAISE: usize = 0x60;
    /// Write: acknowledge (clear) interrupt status bits.
    pub const IRQ_ACK: usize = 0x64;
}

type CaseResult = Result<(), String>;

/// A named test case.
type Case = (&'static str, fn(&Ctx) -> CaseResult);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

#[derive(Debug, Clone, Copy)]
struct Devices {
    e1000e: PciAddress,
    edu: PciAddress,
    edu_shared: PciAddress,
    virtio_net: PciAddress,
    virtio_rng: PciAddress,
}

struct Ctx {
    sysfs: Sysfs,
    paths: VfioPaths,
    tool: PathBuf,
    dev: Devices,
}

fn main() {
    erpc_tools::init_tracing();
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "--try-open" {
        try_open_child(&args[2]);
        return;
    }
    if args.len() > 1 {
        // Bad usage, as the other tools report it (exit status 2).
        eprintln!(
            "erpc-vfio-guest-test: takes no arguments ({:?} given); it runs inside the \
             QEMU guest of tools/vm/run.sh",
            &args[1..]
        );
        std::process::exit(2);
    }
    let started = Instant::now();
    let sysfs = Sysfs::default();
    let mut passed = 0;
    let mut failed = 0;
    let ctx = match discover(&sysfs) {
        Ok(dev) => {
            println!("ok - discover: {dev:?}");
            passed += 1;
            Ctx {
                paths: VfioPaths::default(),
                tool: std::env::current_exe()
                    .expect("own path")
                    .with_file_name("erpc-vfio"),
                sysfs,
                dev,
            }
        }
        Err(e) => {
            println!("not ok - discover: {e}");
            println!("guest: 0 passed, 1 failed");
            return;
        }
    };
    let cases: &[Case] = &[
        ("tool_list", tool_list),
        ("tool_refuses_non_root", tool_refuses_non_root),
        ("tool_bind_dry_run_changes_nothing", tool_bind_dry_run),
        ("tool_bind_e1000e", |c| tool_bind(c, c.dev.e1000e)),
        ("tool_bind_edu", |c| tool_bind(c, c.dev.edu)),
        ("tool_status", tool_status),
        ("tool_refuses_shared_group", tool_refuses_shared_group),
        ("tool_refuses_default_route", tool_refuses_default_route),
        (
            "tool_force_bind_then_unbind_restores_virtio",
            tool_force_bind_and_restore,
        ),
        ("vfio_open_container_group_iova_ranges", vfio_open_edu),
        ("vfio_config_space_bus_master", vfio_config_space),
        ("vfio_bar0_known_registers", vfio_bar0_registers),
        ("vfio_map_2mib_hugepage_region", vfio_hugepage_region),
        ("vfio_edu_dma_round_trip", vfio_dma_round_trip),
        ("vfio_unmapped_iova_faults", vfio_unmapped_iova_faults),
        ("vfio_e1000e_bar0_mac_and_reset", vfio_e1000e),
        ("backend_refuses_non_mlx5", backend_refuses_non_mlx5),
        ("backend_hwbackend_on_edu", backend_hwbackend_on_edu),
        ("vfio_msi_eventfd_on_edu", vfio_msi_eventfd_on_edu),
        ("backend_msix_on_e1000e", backend_msix_on_e1000e),
        ("neg_not_bound_to_vfio", neg_not_bound),
        ("neg_non_viable_group", neg_non_viable_group),
        ("neg_missing_dev_vfio_node", neg_missing_node),
        ("neg_open_twice", neg_open_twice),
        ("tool_unbind_e1000e", |c| {
            tool_unbind_driverless(c, c.dev.e1000e)
        }),
        ("tool_unbind_edu", |c| tool_unbind_driverless(c, c.dev.edu)),
    ];
    for (name, case) in cases {
        let t = Instant::now();
        match case(&ctx) {
            Ok(()) => {
                passed += 1;
                println!("ok - {name} ({} ms)", t.elapsed().as_millis());
            }
            Err(why) => {
                failed += 1;
                println!("not ok - {name}: {why}");
            }
        }
    }
    println!("guest: tests took {} ms", started.elapsed().as_millis());
    println!("guest: {passed} passed, {failed} failed");
}

fn discover(sysfs: &Sysfs) -> Result<Devices, String> {
    let all = sysfs.list().map_err(|e| format!("listing PCI: {e}"))?;
    let with = |vendor: u16, device: u16| -> Vec<PciAddress> {
        all.iter()
            .copied()
            .filter(|b| {
                sysfs
                    .ids(*b)
                    .is_ok_and(|i| i.vendor == vendor && i.device == device)
            })
            .collect()
    };
    let one = |v: Vec<PciAddress>, what: &str| -> Result<PciAddress, String> {
        match v.as_slice() {
            [b] => Ok(*b),
            _ => Err(format!("expected one {what}, found {v:?}")),
        }
    };
    let group_size = |b: PciAddress| {
        sysfs
            .iommu_group(b)
            .ok()
            .flatten()
            .and_then(|g| sysfs.group_members(g).ok())
            .map_or(0, |m| m.len())
    };
    let edus = with(0x1234, 0x11e8);
    let edu = one(
        edus.iter()
            .copied()
            .filter(|b| group_size(*b) == 1)
            .collect(),
        "edu alone in its group",
    )?;
    let edu_shared = one(
        edus.iter()
            .copied()
            .filter(|b| group_size(*b) > 1)
            .collect(),
        "edu in a shared group",
    )?;
    let dev = Devices {
        e1000e: one(with(0x8086, 0x10d3), "e1000e")?,
        edu,
        edu_shared,
        virtio_net: one(with(0x1af4, 0x1000), "virtio-net")?,
        virtio_rng: one(with(0x1af4, 0x1005), "virtio-rng")?,
    };
    ensure_ok(group_size(dev.e1000e) == 1, "e1000e shares its IOMMU group")?;
    let g = sysfs.iommu_group(dev.edu_shared).ok().flatten();
    ensure_ok(
        g.is_some() && g == sysfs.iommu_group(dev.virtio_rng).ok().flatten(),
        "the bridged edu and virtio-rng are not in one group",
    )?;
    ensure_ok(
        sysfs.driver(dev.virtio_rng).ok().flatten().as_deref() == Some("virtio-pci"),
        "virtio-rng is not on virtio-pci",
    )?;
    Ok(dev)
}

fn ensure_ok(cond: bool, what: &str) -> CaseResult {
    if cond { Ok(()) } else { Err(what.to_string()) }
}

// ------------------------------------------------------------------ helpers

fn run_tool(ctx: &Ctx, args: &[&str]) -> Output {
    Command::new(&ctx.tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ctx.tool.display()))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Shows a command and its output in the console log (README material).
fn show(args: &[&str], out: &Output) {
    let (so, se) = text(out);
    println!("    | # erpc-vfio {}", args.join(" "));
    for line in so.lines().chain(se.lines()) {
        println!("    | {line}");
    }
    if !out.status.success() {
        println!("    | (exit status {})", out.status.code().unwrap_or(-1));
    }
}

fn driver(ctx: &Ctx, bdf: PciAddress) -> Option<String> {
    ctx.sysfs.driver(bdf).ok().flatten()
}

fn group_node(ctx: &Ctx, bdf: PciAddress) -> Result<PathBuf, String> {
    let g = ctx
        .sysfs
        .iommu_group(bdf)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{bdf} has no IOMMU group"))?;
    Ok(ctx.paths.group(g))
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn sysfs_write(path: &Path, value: &str) -> CaseResult {
    fs::write(path, format!("{value}\n"))
        .map_err(|e| format!("write {value} > {}: {e}", path.display()))
}

fn open(ctx: &Ctx, bdf: PciAddress) -> Result<VfioDevice, String> {
    VfioDevice::open(bdf, &ctx.paths).map_err(|e| format!("open {bdf}: {e}"))
}

/// A 64-bit xorshift stream for DMA patterns.
fn pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed | 1;
    for b in out.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x1234_5678, |d| d.as_nanos() as u64)
}

/// Starts an edu DMA and waits for the engine to finish (it runs from a
/// 100 ms virtual timer).
fn edu_dma(bar: &Bar, src: u64, dst: u64, count: u32, to_ram: bool) -> CaseResult {
    ensure!(count <= edu::MAX_XFER, "edu transfer of {count} bytes");
    ensure!(
        bar.read64_le(edu::DMA_CMD) & edu::CMD_RUN == 0,
        "edu DMA engine busy before start"
    );
    bar.write64_le(edu::DMA_SRC, src);
    bar.write64_le(edu::DMA_DST, dst);
    bar.write64_le(edu::DMA_COUNT, u64::from(count));
    let dir = if to_ram { edu::CMD_TO_RAM } else { 0 };
    bar.write64_le(edu::DMA_CMD, edu::CMD_RUN | dir);
    ensure!(
        wait_until(Duration::from_secs(10), || bar.read64_le(edu::DMA_CMD)
            & edu::CMD_RUN
            == 0),
        "edu DMA {src:#x} -> {dst:#x} ({count} bytes) did not finish in 10 s"
    );
    Ok(())
}

/// Runs `f` on `n` 4 KiB buffers from `alloc` and frees them whatever `f`
/// returns (a buffer that is never freed pins its region, and with it the
/// container and the group, for the rest of the process).
fn with_buffers(
    alloc: &mut Allocator,
    n: usize,
    f: impl FnOnce(&mut [mempool::Buffer]) -> CaseResult,
) -> CaseResult {
    let mut bufs = Vec::with_capacity(n);
    let mut result = Ok(());
    for _ in 0..n {
        match alloc.alloc(4096) {
            Ok(b) => bufs.push(b),
            Err(e) => {
                result = Err(format!("alloc: {e}"));
                break;
            }
        }
    }
    if result.is_ok() {
        result = f(&mut bufs);
    }
    for b in bufs {
        alloc.free(b);
    }
    result
}

fn dma_allocator(c: &Arc<mlx5::vfio::Container>) -> Result<Allocator, String> {
    c.set_iova_limit(edu::IOVA_LIMIT);
    Allocator::new(
        c.clone() as Arc<dyn DmaMapper>,
        AllocatorConfig {
            initial_bytes: 2 << 20,
            max_bytes: 2 << 20,
            ..AllocatorConfig::default()
        },
    )
    .map_err(|e| e.to_string())
}

fn dmesg() -> String {
    Command::new("dmesg")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

// --------------------------------------------------------------- tool cases

fn tool_list(ctx: &Ctx) -> CaseResult {
    let out = run_tool(ctx, &["list"]);
    show(&["list"], &out);
    ensure!(out.status.success(), "list failed: {:?}", text(&out));
    let out = run_tool(ctx, &["--json", "list"]);
    ensure!(out.status.success(), "list --json failed: {:?}", text(&out));
    let rows: Vec<Value> =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("list --json: {e}"))?;
    let all = ctx.sysfs.list().map_err(|e| e.to_string())?;
    ensure!(
        rows.len() == all.len(),
        "{} rows for {} functions",
        rows.len(),
        all.len()
    );
    for bdf in [
        ctx.dev.e1000e,
        ctx.dev.edu,
        ctx.dev.edu_shared,
        ctx.dev.virtio_net,
        ctx.dev.virtio_rng,
    ] {
        let row = rows
            .iter()
            .find(|r| r["bdf"] == bdf.to_string())
            .ok_or_else(|| format!("{bdf} missing from list"))?;
        let ids = ctx.sysfs.ids(bdf).map_err(|e| e.to_string())?;
        ensure!(
            row["vendor"] == format!("{:04x}", ids.vendor),
            "{bdf} vendor {}",
            row["vendor"]
        );
        ensure!(
            row["device"] == format!("{:04x}", ids.device),
            "{bdf} device {}",
            row["device"]
        );
        let group = ctx.sysfs.iommu_group(bdf).ok().flatten();
        ensure!(
            row["iommu_group"] == serde_json::json!(group),
            "{bdf} group {}",
            row["iommu_group"]
        );
        ensure!(
            row["driver"] == serde_json::json!(driver(ctx, bdf)),
            "{bdf} driver {}",
            row["driver"]
        );
        ensure!(row["mlx5"].is_null(), "{bdf} listed as mlx5");
    }
    Ok(())
}

fn tool_refuses_non_root(ctx: &Ctx) -> CaseResult {
    use std::os::unix::process::CommandExt;
    let bdf = ctx.dev.edu.to_string();
    let out = Command::new(&ctx.tool)
        .args(["bind", &bdf])
        .uid(65534)
        .gid(65534)
        .output()
        .map_err(|e| format!("spawn as nobody: {e}"))?;
    show(&["bind", &bdf, "(as uid 65534)"], &out);
    let (_, err) = text(&out);
    ensure!(!out.status.success(), "bind as nobody succeeded");
    ensure!(
        err.contains("must run as root"),
        "unexpected message: {err}"
    );
    ensure!(driver(ctx, ctx.dev.edu).is_none(), "edu got a driver");
    Ok(())
}

fn tool_bind_dry_run(ctx: &Ctx) -> CaseResult {
    let bdf = ctx.dev.virtio_net.to_string();
    let args = ["bind", "--dry-run", "--force", bdf.as_str()];
    let out = run_tool(ctx, &args);
    show(&args, &out);
    let (so, _) = text(&out);
    ensure!(out.status.success(), "dry run failed");
    for line in [
        format!("echo vfio-pci > /sys/bus/pci/devices/{bdf}/driver_override"),
        format!("echo {bdf} > /sys/bus/pci/devices/{bdf}/driver/unbind"),
        format!("echo {bdf} > /sys/bus/pci/drivers_probe"),
    ] {
        ensure!(so.contains(&line), "dry run lacks `{line}`:\n{so}");
    }
    ensure!(
        driver(ctx, ctx.dev.virtio_net).as_deref() == Some("virtio-pci"),
        "dry run changed the driver"
    );
    ensure!(
        ctx.sysfs
            .driver_override(ctx.dev.virtio_net)
            .ok()
            .flatten()
            .is_none(),
        "dry run set driver_override"
    );
    Ok(())
}

fn tool_bind(ctx: &Ctx, bdf: PciAddress) -> CaseResult {
    let b = bdf.to_string();
    let out = run_tool(ctx, &["bind", &b]);
    show(&["bind", &b], &out);
    ensure!(out.status.success(), "bind {b}: {:?}", text(&out));
    ensure!(
        driver(ctx, bdf).as_deref() == Some("vfio-pci"),
        "driver is {:?}",
        driver(ctx, bdf)
    );
    let node = group_node(ctx, bdf)?;
    ensure!(node.exists(), "{} missing after bind", node.display());
    let rec = fs::read_to_string(format!("/run/erpc-vfio/{b}.json"))
        .map_err(|e| format!("no record: {e}"))?;
    let rec: Value = serde_json::from_str(&rec).map_err(|e| e.to_string())?;
    ensure!(
        rec["previous_driver"].is_null(),
        "recorded previous driver {}",
        rec["previous_driver"]
    );
    // A second bind is a no-op.
    let out = run_tool(ctx, &["bind", &b]);
    ensure!(
        out.status.success() && text(&out).0.contains("already bound"),
        "second bind: {:?}",
        text(&out)
    );
    Ok(())
}

fn tool_status(ctx: &Ctx) -> CaseResult {
    let b = ctx.dev.edu.to_string();
    let out = run_tool(ctx, &["status", &b]);
    show(&["status", &b], &out);
    ensure!(out.status.success(), "status failed");
    let out = run_tool(ctx, &["--json", "status", &b]);
    let s: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("status --json: {e}"))?;
    ensure!(s["ready"] == true, "edu not ready: {s}");
    ensure!(s["vfio_pci_loaded"] == true, "vfio-pci not loaded?");
    ensure!(s["vfio_container_exists"] == true, "no /dev/vfio/vfio?");
    ensure!(s["iommu"]["enabled"] == true, "IOMMU off?");
    ensure!(
        s["group"]["viable"] == true,
        "group not viable: {}",
        s["group"]
    );
    ensure!(
        s["group"]["dev_node_mode"] == "0600",
        "node mode {}",
        s["group"]["dev_node_mode"]
    );
    ensure!(
        s["group"]["dev_node_owner"] == "0:0",
        "node owner {}",
        s["group"]["dev_node_owner"]
    );
    let info = mempool::meminfo::HugepageInfo::read().ok_or("no meminfo")?;
    ensure!(
        s["hugepages"]["total"] == info.total && s["hugepages"]["page_kib"] == 2048,
        "hugepages {} vs meminfo {info:?}",
        s["hugepages"]
    );
    ensure!(
        s["default_route"].is_null(),
        "edu carries the default route?"
    );
    // The non-viable group shows as such.
    let out = run_tool(ctx, &["--json", "status", &ctx.dev.edu_shared.to_string()]);
    let s: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    ensure!(
        s["group"]["viable"] == false,
        "shared group viable: {}",
        s["group"]
    );
    Ok(())
}

fn tool_refuses_shared_group(ctx: &Ctx) -> CaseResult {
    let b = ctx.dev.edu_shared.to_string();
    let out = run_tool(ctx, &["bind", &b]);
    show(&["bind", &b], &out);
    let (_, err) = text(&out);
    ensure!(
        !out.status.success(),
        "bind of a shared-group function succeeded"
    );
    let rng = ctx.dev.virtio_rng.to_string();
    ensure!(
        err.contains(&format!("{rng} (bound to virtio-pci)")) && err.contains("own IOMMU group"),
        "message lacks the blocker or the advice: {err}"
    );
    ensure!(
        driver(ctx, ctx.dev.edu_shared).is_none(),
        "edu got bound anyway"
    );
    ensure!(
        ctx.sysfs
            .driver_override(ctx.dev.edu_shared)
            .ok()
            .flatten()
            .is_none(),
        "driver_override was written"
    );
    Ok(())
}

fn default_route_up(ctx: &Ctx) -> Result<String, String> {
    let iface = ctx
        .sysfs
        .net_interfaces(ctx.dev.virtio_net)
        .into_iter()
        .next()
        .or_else(|| {
            // virtio-net hangs its interface off the virtio device.
            fs::read_dir("/sys/class/net").ok()?.find_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                ctx.sysfs
                    .functions_of_interface(&name, 0)
                    .contains(&ctx.dev.virtio_net)
                    .then_some(name)
            })
        })
        .ok_or("virtio-net has no interface")?;
    for args in [
        vec!["link", "set", &iface, "up"],
        vec!["addr", "add", "10.0.2.15/24", "dev", &iface],
        vec!["route", "add", "default", "via", "10.0.2.2", "dev", &iface],
    ] {
        let out = Command::new("ip")
            .args(&args)
            .output()
            .map_err(|e| e.to_string())?;
        ensure!(
            out.status.success(),
            "ip {}: {:?}",
            args.join(" "),
            text(&out)
        );
    }
    Ok(iface)
}

fn tool_refuses_default_route(ctx: &Ctx) -> CaseResult {
    let iface = default_route_up(ctx)?;
    let b = ctx.dev.virtio_net.to_string();
    let out = run_tool(ctx, &["bind", &b]);
    show(&["bind", &b], &out);
    let (_, err) = text(&out);
    ensure!(
        !out.status.success(),
        "bind of the default-route NIC succeeded"
    );
    ensure!(
        err.contains("default route") && err.contains(&iface) && err.contains("--force"),
        "message: {err}"
    );
    ensure!(
        driver(ctx, ctx.dev.virtio_net).as_deref() == Some("virtio-pci"),
        "driver changed"
    );
    Ok(())
}

fn tool_force_bind_and_restore(ctx: &Ctx) -> CaseResult {
    let bdf = ctx.dev.virtio_net;
    let b = bdf.to_string();
    let out = run_tool(ctx, &["bind", "--force", &b]);
    show(&["bind", "--force", &b], &out);
    ensure!(out.status.success(), "forced bind: {:?}", text(&out));
    ensure!(
        driver(ctx, bdf).as_deref() == Some("vfio-pci"),
        "not on vfio-pci"
    );
    ensure!(group_node(ctx, bdf)?.exists(), "no /dev/vfio node");
    let out = run_tool(ctx, &["unbind", "--dry-run", &b]);
    show(&["unbind", "--dry-run", &b], &out);
    let out = run_tool(ctx, &["unbind", &b]);
    show(&["unbind", &b], &out);
    ensure!(out.status.success(), "unbind: {:?}", text(&out));
    ensure!(
        driver(ctx, bdf).as_deref() == Some("virtio-pci"),
        "unbind left it on {:?}, expected virtio-pci",
        driver(ctx, bdf)
    );
    ensure!(
        ctx.sysfs.driver_override(bdf).ok().flatten().is_none(),
        "driver_override not cleared"
    );
    ensure!(
        !Path::new(&format!("/run/erpc-vfio/{b}.json")).exists(),
        "record not removed"
    );
    // The kernel driver is really back: its interface reappears.
    let back = wait_until(Duration::from_secs(5), || {
        fs::read_dir("/sys/class/net").is_ok_and(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .any(|n| ctx.sysfs.functions_of_interface(&n, 0).contains(&bdf))
        })
    });
    ensure!(back, "no network interface on {b} after unbind");
    Ok(())
}

fn tool_unbind_driverless(ctx: &Ctx, bdf: PciAddress) -> CaseResult {
    let b = bdf.to_string();
    let node = group_node(ctx, bdf)?;
    let out = run_tool(ctx, &["unbind", &b]);
    show(&["unbind", &b], &out);
    ensure!(out.status.success(), "unbind: {:?}", text(&out));
    ensure!(
        driver(ctx, bdf).is_none(),
        "still on {:?}",
        driver(ctx, bdf)
    );
    ensure!(
        ctx.sysfs.driver_override(bdf).ok().flatten().is_none(),
        "driver_override not cleared"
    );
    ensure!(
        wait_until(Duration::from_secs(2), || !node.exists()),
        "{} still exists",
        node.display()
    );
    Ok(())
}

// -------------------------------------------------------------- VFIO cases

fn vfio_open_edu(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    let group = ctx.sysfs.iommu_group(ctx.dev.edu).ok().flatten();
    ensure!(
        Some(dev.group().number()) == group,
        "group {} vs sysfs {group:?}",
        dev.group().number()
    );
    let info = dev
        .container()
        .iommu_info()
        .ok_or("no IOMMU info after attach")?;
    println!(
        "    | IOMMU: pgsizes {:#x}, ranges {:?} (from kernel: {}), dma_avail {:?}",
        info.pgsizes,
        info.ranges
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>(),
        info.ranges_from_kernel,
        info.dma_avail
    );
    ensure!(info.ranges_from_kernel, "kernel reported no IOVA ranges");
    ensure!(
        info.pgsizes & 0x1000 != 0 && info.pgsizes & 0x20_0000 != 0,
        "pgsizes {:#x}",
        info.pgsizes
    );
    ensure!(!info.ranges.is_empty(), "no usable IOVA");
    ensure!(
        !info.ranges.iter().any(|r| r.contains(0xfee0_0000, 4096)),
        "the MSI window is usable IOVA: {:?}",
        info.ranges
    );
    ensure!(
        dev.flags() & 2 != 0,
        "not a PCI device: flags {:#x}",
        dev.flags()
    );
    let r0 = dev.region_info(0).map_err(|e| e.to_string())?;
    ensure!(r0.size == 1 << 20 && r0.mappable(), "edu BAR0 {r0:?}");
    Ok(())
}

fn vfio_config_space(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    let (vendor, device) = dev.ids().map_err(|e| e.to_string())?;
    ensure!(
        (vendor, device) == (0x1234, 0x11e8),
        "config ids {vendor:04x}:{device:04x}"
    );
    // Clear memory + master, check, then enable through the backend path.
    let cmd = dev.config_read_u16(4).map_err(|e| e.to_string())?;
    dev.config_write_u16(4, cmd & !0x6)
        .map_err(|e| e.to_string())?;
    let cleared = dev.config_read_u16(4).map_err(|e| e.to_string())?;
    ensure!(
        cleared & 0x6 == 0,
        "command bits did not clear: {cleared:#x}"
    );
    let now = dev.enable_bus_master().map_err(|e| e.to_string())?;
    ensure!(now & 0x6 == 0x6, "command after enable {now:#x}");
    ensure!(
        dev.config_read_u16(4).map_err(|e| e.to_string())? == now,
        "readback differs"
    );
    // Out of range is a typed error, not a short read.
    let mut big = [0u8; 8];
    let err = dev.config_read(0xffc, &mut big).unwrap_err();
    ensure!(
        matches!(
            err,
            VfioError::Config {
                offset: 0xffc,
                len: 8,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

fn vfio_bar0_registers(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    dev.enable_bus_master().map_err(|e| e.to_string())?;
    let bar = dev.map_bar(0).map_err(|e| e.to_string())?;
    let ident = bar.read32_le(edu::IDENT);
    ensure!(
        ident == edu::IDENT_V1,
        "edu ident {ident:#010x}, expected {:#010x}",
        edu::IDENT_V1
    );
    for v in [0u32, 0xdead_beef, seed() as u32] {
        bar.write32_le(edu::LIVENESS, v);
        let got = bar.read32_le(edu::LIVENESS);
        ensure!(
            got == !v,
            "liveness: wrote {v:#x}, read {got:#x}, expected {:#x}",
            !v
        );
    }
    // Region 6 (ROM) and 1 are not mappable on edu: typed error.
    let err = dev.map_bar(1).unwrap_err();
    ensure!(
        matches!(err, VfioError::NotMappable { index: 1, .. }),
        "{err:?}"
    );
    Ok(())
}

fn vfio_hugepage_region(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    let c = dev.container();
    let info = c.iommu_info().ok_or("no info")?;
    let region = c.dma_region(2 << 20).map_err(|e| e.to_string())?;
    let m = region.dma().ok_or("region not registered")?;
    ensure!(
        region.page_size() == PageSize::Huge2M && !region.is_fallback(),
        "not a 2 MiB hugepage"
    );
    ensure!(
        m.iova % (2 << 20) == 0,
        "IOVA {:#x} not 2 MiB aligned",
        m.iova
    );
    ensure!(
        info.ranges.iter().any(|r| r.contains(m.iova, 2 << 20)),
        "IOVA {:#x} outside {:?}",
        m.iova,
        info.ranges
    );
    let live = c.lookup(m.iova, 2 << 20).ok_or("container has no record")?;
    ensure!(
        live.va == region.va(),
        "recorded VA {:#x} vs {:#x}",
        live.va,
        region.va()
    );
    drop(region);
    ensure!(
        c.mappings().is_empty(),
        "region drop did not unmap: {:?}",
        c.mappings()
    );
    Ok(())
}

fn vfio_dma_round_trip(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    dev.enable_bus_master().map_err(|e| e.to_string())?;
    let bar = dev.map_bar(0).map_err(|e| e.to_string())?;
    let mut alloc = dma_allocator(dev.container())?;
    with_buffers(&mut alloc, 2, |bufs| {
        let [src, dst] = bufs else { unreachable!() };
        ensure!(
            dst.iova() + 4096 <= edu::IOVA_LIMIT,
            "IOVA {:#x} above edu's mask",
            dst.iova()
        );
        ensure!(
            src.iova() != src.va() as u64,
            "IOVA equals VA: not our mapping"
        );
        let n = edu::MAX_XFER as usize;
        let s = seed();
        pattern(s, &mut src.as_mut_slice()[..n]);
        dst.as_mut_slice().fill(0);
        // RAM -> device -> RAM, each leg through the IOMMU.
        edu_dma(&bar, src.iova(), edu::BUF, edu::MAX_XFER, false)?;
        edu_dma(&bar, edu::BUF, dst.iova(), edu::MAX_XFER, true)?;
        let got = dst.as_slice();
        if got[..n] != src.as_slice()[..n] {
            let first = (0..n).find(|&i| got[i] != src.as_slice()[i]).unwrap_or(0);
            return Err(format!(
                "round trip differs from byte {first} (seed {s:#x}, src IOVA {:#x}, dst IOVA {:#x})",
                src.iova(),
                dst.iova()
            ));
        }
        ensure!(got[n..].iter().all(|&b| b == 0), "DMA wrote past {n} bytes");
        println!(
            "    | DMA round trip of {n} bytes: RAM IOVA {:#x} -> edu -> RAM IOVA {:#x}: equal",
            src.iova(),
            dst.iova()
        );
        Ok(())
    })
}

fn vfio_unmapped_iova_faults(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.edu)?;
    dev.enable_bus_master().map_err(|e| e.to_string())?;
    let bar = dev.map_bar(0).map_err(|e| e.to_string())?;
    let c = dev.container().clone();
    let mut alloc = dma_allocator(&c)?;
    with_buffers(&mut alloc, 2, |bufs| {
        let [probe, data] = bufs else { unreachable!() };
        let n = edu::MAX_XFER as usize;
        pattern(seed(), &mut data.as_mut_slice()[..n]);
        edu_dma(&bar, data.iova(), edu::BUF, edu::MAX_XFER, false)?;
        // A second IOVA for the probe buffer's page, so the same memory can
        // be reached through a mapping we then remove.
        // SAFETY: `probe` is a live buffer of ours that outlives the alias
        // mapping (unmapped below, before the buffers are freed).
        #[allow(unsafe_code)]
        let alias = unsafe { DmaMapper::map(&*c, probe.va(), 4096) }.map_err(|e| e.to_string())?;
        probe.as_mut_slice().fill(0xa5);
        edu_dma(&bar, edu::BUF, alias.iova, edu::MAX_XFER, true)?;
        ensure!(
            probe.as_slice()[..n] == data.as_slice()[..n],
            "DMA through the alias IOVA {:#x} did not arrive",
            alias.iova
        );
        // Remove the alias; the same DMA must now fault in the IOMMU.
        DmaMapper::unmap(&*c, probe.va(), &alias).map_err(|e| e.to_string())?;
        probe.as_mut_slice().fill(0xa5);
        edu_dma(&bar, edu::BUF, alias.iova, edu::MAX_XFER, true)?;
        ensure!(
            probe.as_slice().iter().all(|&b| b == 0xa5),
            "data reached RAM through unmapped IOVA {:#x}",
            alias.iova
        );
        let needle = format!("fault addr {:#x} ", alias.iova);
        let seen = wait_until(Duration::from_secs(3), || dmesg().contains(&needle));
        let faults: Vec<String> = dmesg()
            .lines()
            .filter(|l| l.contains("DMAR: [DMA"))
            .map(str::to_string)
            .collect();
        for f in faults.iter().rev().take(2).rev() {
            println!("    | kernel: {f}");
        }
        ensure!(
            seen,
            "no DMAR fault at {:#x} in the kernel log: {faults:?}",
            alias.iova
        );
        // Our bookkeeping agrees: the IOVA is not mapped, and unmapping it
        // again is the typed error.
        ensure!(
            c.lookup(alias.iova, 4096).is_none(),
            "container still lists {:#x}",
            alias.iova
        );
        let err = c.unmap_dma(probe.va(), alias.iova, 4096).unwrap_err();
        println!("    | second unmap: {err}");
        ensure!(
            matches!(err, VfioError::IovaNotMapped { iova, len: 4096, .. } if iova == alias.iova),
            "{err:?}"
        );
        ensure!(
            err.to_string().contains(&format!("{:#x}", alias.iova)),
            "{err}"
        );
        Ok(())
    })
}

fn vfio_e1000e(ctx: &Ctx) -> CaseResult {
    let dev = open(ctx, ctx.dev.e1000e)?;
    dev.enable_bus_master().map_err(|e| e.to_string())?;
    let bar = dev.map_bar(0).map_err(|e| e.to_string())?;
    ensure!(
        bar.len() == 128 << 10,
        "e1000e BAR0 is {:#x} bytes",
        bar.len()
    );
    let mac_regs = |bar: &Bar| (bar.read32_le(0x5400), bar.read32_le(0x5404));
    let want_lo = u32::from_le_bytes([GUEST_MAC[0], GUEST_MAC[1], GUEST_MAC[2], GUEST_MAC[3]]);
    let want_hi = u32::from(u16::from_le_bytes([GUEST_MAC[4], GUEST_MAC[5]])) | 1 << 31;
    let (lo, hi) = mac_regs(&bar);
    ensure!(
        (lo, hi) == (want_lo, want_hi),
        "RAL0/RAH0 read {lo:#010x}/{hi:#010x}, expected the QEMU MAC {want_lo:#010x}/{want_hi:#010x}"
    );
    // VFIO_DEVICE_RESET goes through; QEMU 7.2's e1000e ignores the PM
    // reset the kernel picks (reset_method `pm`), so only that the call
    // succeeds and the function stays usable is checked, not its state.
    let method = fs::read_to_string(ctx.sysfs.device_dir(ctx.dev.e1000e).join("reset_method"))
        .unwrap_or_default();
    dev.reset()
        .map_err(|e| format!("VFIO_DEVICE_RESET ({}): {e}", method.trim()))?;
    println!(
        "    | e1000e VFIO_DEVICE_RESET ok (reset_method {})",
        method.trim()
    );
    let now = dev
        .enable_bus_master()
        .map_err(|e| format!("after reset: {e}"))?;
    ensure!(now & 6 == 6, "command {now:#x} after reset");
    ensure!(
        mac_regs(&bar) == (want_lo, want_hi),
        "MAC registers unreadable after reset"
    );
    // edu has no reset method: typed error.
    let edu_dev = open(ctx, ctx.dev.edu)?;
    let err = edu_dev.reset().unwrap_err();
    ensure!(matches!(err, VfioError::ResetUnsupported { .. }), "{err:?}");
    Ok(())
}

fn backend_refuses_non_mlx5(ctx: &Ctx) -> CaseResult {
    let err = VfioBackend::open(ctx.dev.edu).unwrap_err();
    println!("    | VfioBackend::open(edu): {err}");
    ensure!(
        matches!(err, VfioError::NotMlx5 { vendor: 0x1234, device: 0x11e8, bdf } if bdf == ctx.dev.edu),
        "{err:?}"
    );
    Ok(())
}

/// An interrupt through VFIO_DEVICE_SET_IRQS and an eventfd, end to end:
/// edu raises an MSI, the guest's vfio-pci signals our eventfd. edu has no
/// MSI-X, and asking for it says so.
fn vfio_msi_eventfd_on_edu(ctx: &Ctx) -> CaseResult {
    use mlx5::vfio::{VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX};
    let dev = open(ctx, ctx.dev.edu)?;
    dev.enable_bus_master().map_err(|e| e.to_string())?;
    let bar = dev.map_bar(0).map_err(|e| e.to_string())?;
    match dev.enable_irq(VFIO_PCI_MSIX_IRQ_INDEX, 0) {
        Err(VfioError::IrqUnsupported { index, .. }) if index == VFIO_PCI_MSIX_IRQ_INDEX => {}
        other => return Err(format!("MSI-X on edu: {other:?}")),
    }
    let irq = dev
        .enable_irq(VFIO_PCI_MSI_IRQ_INDEX, 0)
        .map_err(|e| e.to_string())?;
    ensure!(
        irq.take().map_err(|e| e.to_string())? == 0,
        "an interrupt before any was raised"
    );
    bar.write32_le(edu::IRQ_RAISE, 1);
    let mut got = 0;
    ensure!(
        wait_until(Duration::from_secs(10), || {
            got += irq.take().unwrap_or(0);
            got > 0
        }),
        "edu's MSI never reached the eventfd"
    );
    bar.write32_le(edu::IRQ_ACK, 1);
    dev.disable_irq(VFIO_PCI_MSI_IRQ_INDEX)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The driver's MSI-X hook on a function that has MSI-X (QEMU's e1000e,
/// five vectors): vector 0 routed to an eventfd with only that one vector
/// allocated (a host may not be able to allocate a ConnectX's whole
/// table), then disabled again; a vector beyond the table is refused.
fn backend_msix_on_e1000e(ctx: &Ctx) -> CaseResult {
    let be = VfioBackend::open_with(ctx.dev.e1000e, &ctx.paths, DeviceCheck::AnyDeviceForTesting)
        .map_err(|e| e.to_string())?;
    be.enable_msix(0)
        .map_err(|e| format!("enable_msix(0): {e}"))?;
    ensure!(
        be.msix_vectors() == Some(1),
        "vectors allocated for vector 0: {:?}",
        be.msix_vectors()
    );
    be.disable_msix()
        .map_err(|e| format!("disable_msix: {e}"))?;
    ensure!(
        be.enable_msix(2048).is_err(),
        "a vector beyond the MSI-X table was accepted"
    );
    ensure!(!be.bar_write_combining(), "vfio-pci maps BARs uncached");
    Ok(())
}

fn backend_hwbackend_on_edu(ctx: &Ctx) -> CaseResult {
    let be = VfioBackend::open_with(ctx.dev.edu, &ctx.paths, DeviceCheck::AnyDeviceForTesting)
        .map_err(|e| e.to_string())?;
    ensure!(be.bar0_len() == 1 << 20, "bar0_len {:#x}", be.bar0_len());
    // HwBackend reads registers as big-endian (mlx5): edu's little-endian
    // ident comes back byte-swapped, which proves the conversion.
    let ident = be.read32(edu::IDENT);
    ensure!(
        ident == edu::IDENT_V1.swap_bytes(),
        "read32(ident) = {ident:#010x}"
    );
    let v = 0x1234_5678u32;
    be.write32(edu::LIVENESS, v);
    ensure!(
        be.read32(edu::LIVENESS) == !v,
        "liveness through HwBackend: {:#x}",
        be.read32(edu::LIVENESS)
    );
    let mut id = [0u8; 4];
    be.config_read(0, &mut id).map_err(|e| e.to_string())?;
    ensure!(id == [0x34, 0x12, 0xe8, 0x11], "config ids {id:02x?}");
    let mut cmd = [0u8; 2];
    be.config_read(4, &mut cmd).map_err(|e| e.to_string())?;
    ensure!(
        u16::from_le_bytes(cmd) & 6 == 6,
        "open did not enable memory + bus master"
    );
    ensure!(
        be.describe().contains(&ctx.dev.edu.to_string()),
        "describe: {}",
        be.describe()
    );
    let mapper = be.dma_mapper();
    let mut region = mempool::HugepageRegion::reserve(2 << 20, mempool::RegionOptions::default())
        .map_err(|e| e.to_string())?;
    let m = region.register(mapper).map_err(|e| e.to_string())?;
    ensure!(
        be.device().container().lookup(m.iova, 4096).is_some(),
        "dma_mapper maps elsewhere"
    );
    // Out-of-range register access is a bug: it panics with the BAR and offset.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| be.read32(1 << 20)));
    let payload = caught.err().ok_or("read past BAR0 did not panic")?;
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    ensure!(
        msg.contains(&format!("{} BAR0", ctx.dev.edu)) && msg.contains("offset 0x100000"),
        "panic message: {msg}"
    );
    Ok(())
}

// ---------------------------------------------------------- negative cases

fn neg_not_bound(ctx: &Ctx) -> CaseResult {
    let err = VfioDevice::open(ctx.dev.virtio_rng, &ctx.paths).unwrap_err();
    println!("    | {err}");
    ensure!(
        matches!(&err, VfioError::NotBoundToVfio { driver: Some(d), .. } if d == "virtio-pci"),
        "{err:?}"
    );
    ensure!(
        err.to_string()
            .contains(&format!("erpc-vfio bind {}", ctx.dev.virtio_rng)),
        "{err}"
    );
    Ok(())
}

fn neg_non_viable_group(ctx: &Ctx) -> CaseResult {
    // Bind the bridged edu behind the tool's back (the tool refuses).
    let bdf = ctx.dev.edu_shared;
    let dir = ctx.sysfs.device_dir(bdf);
    sysfs_write(&dir.join("driver_override"), "vfio-pci")?;
    sysfs_write(&ctx.sysfs.drivers_probe_path(), &bdf.to_string())?;
    let result = (|| {
        ensure!(
            driver(ctx, bdf).as_deref() == Some("vfio-pci"),
            "vfio-pci did not take it"
        );
        let node = group_node(ctx, bdf)?;
        ensure!(
            wait_until(Duration::from_secs(2), || node.exists()),
            "{} missing",
            node.display()
        );
        let err = VfioDevice::open(bdf, &ctx.paths).unwrap_err();
        println!("    | {err}");
        let VfioError::GroupNotViable { blockers, path, .. } = &err else {
            return Err(format!("{err:?}"));
        };
        ensure!(path == &node, "path {}", path.display());
        ensure!(
            blockers == &vec![(ctx.dev.virtio_rng, "virtio-pci".to_string())],
            "blockers {blockers:?}"
        );
        Ok(())
    })();
    sysfs_write(&dir.join("driver/unbind"), &bdf.to_string())?;
    sysfs_write(&dir.join("driver_override"), "")?;
    result
}

fn neg_missing_node(ctx: &Ctx) -> CaseResult {
    let node = group_node(ctx, ctx.dev.edu)?;
    let hidden = node.with_extension("hidden");
    fs::rename(&node, &hidden).map_err(|e| format!("hide {}: {e}", node.display()))?;
    let result = VfioDevice::open(ctx.dev.edu, &ctx.paths);
    fs::rename(&hidden, &node).map_err(|e| format!("restore {}: {e}", node.display()))?;
    let err = result.err().ok_or("open succeeded without the node")?;
    println!("    | {err}");
    ensure!(
        matches!(&err, VfioError::GroupNodeMissing { path, .. } if *path == node),
        "{err:?}"
    );
    // And with the node back, the device opens.
    open(ctx, ctx.dev.edu).map(drop)
}

fn neg_open_twice(ctx: &Ctx) -> CaseResult {
    let first = open(ctx, ctx.dev.edu)?;
    let err = VfioDevice::open(ctx.dev.edu, &ctx.paths).unwrap_err();
    println!("    | in process: {err}");
    ensure!(
        matches!(err, VfioError::DeviceAlreadyOpen { bdf } if bdf == ctx.dev.edu),
        "{err:?}"
    );
    // Another process: the kernel refuses the group.
    let out = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args(["--try-open", &ctx.dev.edu.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let (so, _) = text(&out);
    println!("    | other process: {}", so.trim());
    let node = group_node(ctx, ctx.dev.edu)?;
    ensure!(
        so.starts_with("GroupBusy:") && so.contains(&node.display().to_string()),
        "child said: {so}"
    );
    drop(first);
    open(ctx, ctx.dev.edu)
        .map(drop)
        .map_err(|e| format!("after close: {e}"))
}

fn try_open_child(bdf: &str) {
    let Ok(bdf) = bdf.parse::<PciAddress>() else {
        println!("BadAddress: {bdf}");
        return;
    };
    match VfioDevice::open(bdf, &VfioPaths::default()) {
        Ok(_) => println!("Opened"),
        Err(e) => {
            let variant = format!("{e:?}");
            let variant = variant
                .split([' ', '{', '('])
                .next()
                .unwrap_or("?")
                .to_string();
            println!("{variant}: {e}");
        }
    }
}
