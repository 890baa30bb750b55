//! `erpc-vfio bind` and `unbind`: the exact sysfs writes, planned first
//! ([`plan_bind`], [`plan_unbind`]), then applied and verified.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlx5::vfio::{PciAddress, driver_keeps_group_viable, is_vfio_driver};
use serde::Serialize;

use super::*;

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
