//! What `erpc-bench`'s jobs share on the command line: the flags several
//! of them take, stdout that a closed pipe ends quietly, JSON output, the
//! hugepage plan, and [`Quit`], how a job ends early.
//!
//! Each job (the main job in [`exp_small_rpc`](crate::exp_small_rpc), the
//! experiments in the other `exp_*` modules) defines its flags as a clap
//! `Args` struct with a `run` method that checks them (a usage error, exit
//! status 2, names the limit) and runs; the binary only parses and
//! dispatches.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bench::{BenchError, Progress, Settings, Which};
use crate::memory::MemoryPlan;

/// `--json FILE`, which every job takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JsonOut {
    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl JsonOut {
    /// Writes `value` to the `--json` file, if one was given.
    pub fn write(&self, value: &impl Serialize) -> Result<(), Quit> {
        let Some(path) = self.json.as_deref() else {
            return Ok(());
        };
        let mut w = create(path)?;
        write_json_to(&mut w, path, value)
    }
}

/// Writes `value` as pretty JSON and a newline to `w`, the file at `path`.
pub fn write_json_to(w: &mut impl Write, path: &Path, value: &impl Serialize) -> Result<(), Quit> {
    serde_json::to_writer_pretty(&mut *w, value)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(w))
        .and_then(|()| w.flush())
        .map_err(output_error(path))?;
    Ok(())
}

/// `--secs` and `--warmup`: how long each wall-clock point runs.
#[derive(Debug, Clone, clap::Args)]
pub struct Timing {
    /// Seconds measured per point.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub secs: f64,
    /// Seconds of warm-up before each point, and each point's raw-echo
    /// reference, is measured.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub warmup: f64,
}

/// `--window` and `--size`: the shape of the small RPCs.
#[derive(Debug, Clone, clap::Args)]
pub struct Shape {
    /// Most requests in flight per node (1..=1024).
    #[arg(long, default_value_t = 60)]
    pub window: usize,
    /// Request and response size in bytes (at most erpc::MAX_MSG_BYTES).
    #[arg(long, default_value_t = 32)]
    pub size: usize,
}

/// The simulated network of the virtual-time experiments (incast, scale).
#[derive(Debug, Clone, clap::Args)]
pub struct SimNetwork {
    /// Link rate in Gbit/s (0.1 to 400).
    #[arg(long, default_value_t = 25.0)]
    pub link_gbps: f64,
    /// Switch buffer per output port in KiB.
    #[arg(long, default_value_t = 1024)]
    pub buffer_kib: u64,
    /// One-way propagation delay of every link in ns. A few ns more or
    /// less change the order of simultaneous events, so runs at 1000,
    /// 1007, 1014, ... show how much a result depends on one trajectory.
    #[arg(long, default_value_t = 1000)]
    pub link_delay_ns: u64,
}

impl SimNetwork {
    /// `--link-gbps` in range.
    pub fn check_link_gbps(&self) -> Result<(), Quit> {
        if !(0.1..=400.0).contains(&self.link_gbps) {
            return usage(format!(
                "--link-gbps {}: must be 0.1 to 400",
                self.link_gbps
            ));
        }
        Ok(())
    }
}

/// The rate controller of congestion control where it is on (incast's
/// CC-on rows, the main job's `--cc on` rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CcController {
    /// Timely (`erpc::CcConfig::default()`).
    Timely,
    /// The delay-target controller (`erpc::CcConfig::swift()`).
    Swift,
}

impl CcController {
    /// The controller's preset.
    pub fn config(self) -> erpc::CcConfig {
        match self {
            CcController::Timely => erpc::CcConfig::default(),
            CcController::Swift => erpc::CcConfig::swift(),
        }
    }
}

/// `--rounds` of the interleaved experiments (factors, cc-overhead).
#[derive(Debug, Clone, clap::Args)]
pub struct Rounds {
    /// Interleaved rounds; each row's rate is the median (1 to 100).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

impl Rounds {
    /// `--rounds` in range.
    pub fn check(&self) -> Result<(), Quit> {
        if self.rounds == 0 || self.rounds > 100 {
            return usage(format!("--rounds {}: must be 1 to 100", self.rounds));
        }
        Ok(())
    }
}

/// The settings of an experiment on the device model (no `--pci`,
/// `--pcap`, `--loss` or `--count`), validated.
pub fn device_model_settings(
    batches: Vec<usize>,
    window: usize,
    size: usize,
    timing: &Timing,
) -> Result<Settings, Quit> {
    let settings = Settings {
        transport: Which::Mlx5Sim,
        batches,
        window,
        size,
        secs: timing.secs,
        warmup_secs: timing.warmup,
        pci: None,
        pcap: None,
        loss: 0.0,
        count: None,
    };
    settings.validate()?;
    Ok(settings)
}

/// How a job ends before it is done: a closed stdout (quietly, exit 0)
/// or an error.
#[derive(Debug)]
pub enum Quit {
    /// stdout was closed (`erpc-bench | head`).
    Pipe,
    /// The error to print (its exit code: [`BenchError::exit_code`]).
    Err(BenchError),
}

impl From<BenchError> for Quit {
    fn from(e: BenchError) -> Self {
        Quit::Err(e)
    }
}

/// A usage error (exit status 2) saying `m`.
pub fn usage<T>(m: String) -> Result<T, Quit> {
    Err(Quit::Err(BenchError::Usage(m)))
}

/// stdout, where a closed pipe (`erpc-bench | head`) ends the run quietly
/// instead of panicking in `println!`.
#[derive(Debug)]
pub struct Out(io::Stdout);

impl Default for Out {
    fn default() -> Self {
        Out(io::stdout())
    }
}

impl Out {
    /// Prints `s` and a newline, with the progress bar out of the way.
    pub fn line(&mut self, progress: &Progress, s: String) -> Result<(), Quit> {
        progress
            .suspend(|| writeln!(self.0.lock(), "{s}"))
            .map_err(|e| {
                if e.kind() == io::ErrorKind::BrokenPipe {
                    Quit::Pipe
                } else {
                    Quit::Err(BenchError::Output {
                        path: "standard output".into(),
                        source: e,
                    })
                }
            })
    }
}

/// Creates the output file at `path` (at once, so a bad path fails before
/// anything runs).
pub fn create(path: &Path) -> Result<BufWriter<File>, BenchError> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|source| BenchError::Output {
            path: path.to_owned(),
            source,
        })
}

/// A write error on the file at `path`, as a [`BenchError`].
pub fn output_error(path: &Path) -> impl Fn(io::Error) -> BenchError + '_ {
    move |source| BenchError::Output {
        path: path.to_owned(),
        source,
    }
}

/// The hugepage plan for `pages` 2 MiB pages; says on stderr when the run
/// falls back to 4 KiB pages.
pub fn memory_plan(pages: u64) -> MemoryPlan {
    let plan = MemoryPlan::decide("erpc-bench", pages);
    if let Some(note) = &plan.note {
        eprintln!("{note}");
    }
    plan
}
