//! `erpc-inspect device`: bring a device up offline (the device model or
//! a function bound to vfio-pci) and report what it is.

use std::fmt::Write as _;

use mlx5::inspect::DeviceReport;
use serde::Serialize;

use super::*;

/// A device-model profile for `erpc-inspect device --sim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimProfile {
    /// ConnectX-4 PF (no striding RQ: bring-up refuses it).
    Cx4,
    /// ConnectX-4 Lx PF.
    Cx4lx,
    /// ConnectX-5 PF (the default).
    Cx5,
    /// ConnectX-5 VF.
    Cx5vf,
    /// ConnectX-6 Dx PF.
    Cx6dx,
    /// ConnectX-7 PF.
    Cx7,
}

impl SimProfile {
    /// The model's profile.
    pub fn profile(self) -> mlx5_sim::Profile {
        use mlx5_sim::Profile::*;
        match self {
            SimProfile::Cx4 => ConnectX4Pf,
            SimProfile::Cx4lx => ConnectX4LxPf,
            SimProfile::Cx5 => ConnectX5Pf,
            SimProfile::Cx5vf => ConnectX5Vf,
            SimProfile::Cx6dx => ConnectX6DxPf,
            SimProfile::Cx7 => ConnectX7Pf,
        }
    }
}

/// What `erpc-inspect device` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OfflineReport {
    /// What was brought up (`vfio 0000:03:00.0`, `device model ConnectX-5 PF`).
    pub target: String,
    /// The device.
    #[serde(flatten)]
    pub report: DeviceReport,
    /// QUERY_EQ right after bring-up: (consumer, producer, state).
    pub eq: Option<(u32, u32, u8)>,
    /// Milliseconds bring-up took (wall clock; the model's firmware delays
    /// are simulated).
    pub bring_up_ms: f64,
    /// Teardown gave every firmware page back and destroyed every object.
    pub torn_down: bool,
}

/// Why an offline bring-up failed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The PCI address is not one.
    #[error("{0}")]
    Usage(String),
    /// Opening or bringing up the function failed.
    #[error("{what}: {why}")]
    Failed {
        /// The step.
        what: String,
        /// The error.
        why: String,
    },
}

fn bring_up_report<B: mlx5::hw::HwBackend>(
    target: String,
    backend: B,
    region: mempool::RegionOptions,
) -> Result<OfflineReport, OfflineError> {
    let t = std::time::Instant::now();
    let dev = mlx5::Device::open(
        backend,
        mlx5::DeviceConfig {
            region,
            ..Default::default()
        },
    )
    .map_err(|e| OfflineError::Failed {
        what: format!("bringing up {target}"),
        why: e.to_string(),
    })?;
    let bring_up_ms = t.elapsed().as_secs_f64() * 1e3;
    let eq = dev.query_eq().ok();
    let report = mlx5::inspect::report(&dev);
    dev.close().map_err(|e| OfflineError::Failed {
        what: format!("tearing down {target}"),
        why: e.to_string(),
    })?;
    Ok(OfflineReport {
        target,
        report,
        eq,
        bring_up_ms,
        torn_down: true,
    })
}

/// Hugepages an offline bring-up needs (firmware pages and the command
/// queue; generous for a real ConnectX, whose page count is unknown).
const OFFLINE_PAGES_VFIO: u64 = 48;

/// Brings up a device-model NIC of `profile`, reports, tears down.
pub fn offline_sim(profile: SimProfile) -> Result<OfflineReport, OfflineError> {
    let p = profile.profile();
    let cfg = p.config();
    let pages_4k =
        u64::from(cfg.boot_pages) + u64::from(cfg.init_pages) + u64::from(cfg.regular_pages);
    let plan =
        crate::memory::MemoryPlan::decide("erpc-inspect", (pages_4k * 4096).div_ceil(2 << 20) + 2);
    if let Some(n) = &plan.note {
        eprintln!("{n}");
    }
    let fabric = mlx5_sim::Fabric::new(mlx5_sim::FabricConfig {
        seed: 1,
        deterministic: true,
        ..Default::default()
    });
    let nic = mlx5_sim::SimNic::new(&fabric, cfg);
    let r = bring_up_report(
        format!("device model, {}", p.name()),
        nic.backend(),
        plan.region,
    )?;
    Ok(r)
}

/// Opens the function at `bdf` through VFIO, brings it up, reports, tears
/// down.
pub fn offline_vfio(bdf: &str) -> Result<OfflineReport, OfflineError> {
    let addr: mlx5::vfio::PciAddress = bdf
        .parse()
        .map_err(|e| OfflineError::Usage(format!("{bdf}: {e}")))?;
    let plan = crate::memory::MemoryPlan::decide("erpc-inspect", OFFLINE_PAGES_VFIO);
    if let Some(n) = &plan.note {
        eprintln!("{n}");
    }
    let backend = mlx5::vfio::VfioBackend::open(addr).map_err(|e| OfflineError::Failed {
        what: format!("opening {bdf} through VFIO (bind it with `erpc-vfio bind {bdf}`)"),
        why: e.to_string(),
    })?;
    bring_up_report(format!("vfio {bdf}"), backend, plan.region)
}

/// The text of an offline report.
pub fn offline_text(r: &OfflineReport, style: Style) -> String {
    let mut s = report_text(&r.report, style);
    if let Some((c, p, st)) = r.eq {
        let _ = writeln!(
            s,
            "  EQ 0x{:x}: QUERY_EQ consumer {c}, producer {p}, state 0x{st:x}",
            r.report.objects.eqn
        );
    }
    let _ = writeln!(
        s,
        "  brought up in {:.1} ms; torn down{}",
        r.bring_up_ms,
        if r.torn_down {
            ": every object destroyed, every firmware page taken back"
        } else {
            " with errors"
        }
    );
    s
}
