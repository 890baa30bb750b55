//! What a run is told ([`Settings`], checked before anything runs), where
//! it runs ([`Which`]), when a measured run stops ([`Stop`]) and why a run
//! fails ([`BenchError`]).

use std::path::PathBuf;
use std::time::Duration;

use erpc::MAX_MSG_BYTES;
use serde::Serialize;

use crate::memory::node_bytes;

use super::{MAX_STRETCH, Progress, STALL_ROUNDS};

/// Most requests in flight per node (`--window`). The paper's small-RPC
/// runs use up to 60; beyond a few hundred the session backlog, not the
/// protocol, is what is measured.
pub const MAX_WINDOW: usize = 1024;
/// Most message-buffer memory one node may reserve (`--size` × `--window`).
pub const MAX_NODE_BYTES: usize = 4 << 30;
/// Longest measurement per point (`--secs`), one day.
pub const MAX_SECS: f64 = 86_400.0;

/// Where the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Which {
    /// The mlx5 transport on the device model (a software ConnectX), one thread.
    Mlx5Sim,
    /// Kernel UDP over loopback, one thread.
    Udp,
    /// A real ConnectX bound to vfio-pci (`--pci`): both nodes are queue
    /// sets of that function, talking through the NIC's own loopback.
    Mlx5,
}

impl Which {
    /// One line for the report header.
    pub fn describe(self) -> &'static str {
        match self {
            Which::Mlx5Sim => "mlx5 transport on the device model (2 NICs, 1 thread)",
            Which::Udp => "kernel UDP over loopback (1 thread)",
            Which::Mlx5 => "mlx5 transport on a ConnectX via VFIO (2 queue sets, 1 thread)",
        }
    }
}

/// Why a run could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range or does not fit the other settings.
    #[error("{0}")]
    Usage(String),
    /// Bringing up the testbed failed.
    #[error("{what}: {why}")]
    Setup {
        /// What was being set up.
        what: String,
        /// The underlying error, as text.
        why: String,
    },
    /// The run failed after it started.
    #[error("{0}")]
    Run(String),
    /// Writing an output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl BenchError {
    pub(crate) fn setup(what: impl Into<String>, why: impl std::fmt::Display) -> BenchError {
        BenchError::Setup {
            what: what.into(),
            why: why.to_string(),
        }
    }

    /// The process exit code: 2 for bad settings (as clap uses), 1 else.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// Everything a run is told.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Where it runs.
    pub transport: Which,
    /// Batch sizes B, one point each.
    pub batches: Vec<usize>,
    /// Most requests in flight per node.
    pub window: usize,
    /// Request and response size in bytes.
    pub size: usize,
    /// Seconds measured per point.
    pub secs: f64,
    /// Seconds of warm-up before each point is measured.
    pub warmup_secs: f64,
    /// PCI address for `--transport mlx5`.
    pub pci: Option<String>,
    /// Packet capture file.
    pub pcap: Option<PathBuf>,
    /// Probability that a frame is lost on each device-model link (both
    /// directions); loss recovery must repair it.
    pub loss: f64,
    /// Stop each point, and each raw-echo reference, after this many
    /// completed RPCs / round trips (both nodes) instead of after `secs`,
    /// with no warm-up (`erpc-bench --count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl Settings {
    /// Checks every setting; the error names the limit it broke.
    pub fn validate(&self) -> Result<(), BenchError> {
        let usage = |s: String| Err(BenchError::Usage(s));
        if self.size > MAX_MSG_BYTES {
            return usage(format!(
                "--size {}: above the largest eRPC message, {MAX_MSG_BYTES} bytes \
                 (8 MiB less the headers of its packets)",
                self.size
            ));
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return usage(format!(
                "--window {}: must be 1 to {MAX_WINDOW} requests in flight per node",
                self.window
            ));
        }
        let bytes = node_bytes(self.size, self.window);
        if bytes > MAX_NODE_BYTES {
            return usage(format!(
                "--size {} with --window {} needs {} MiB of message buffers per node; \
                 the limit is {} MiB: lower --window or --size",
                self.size,
                self.window,
                bytes >> 20,
                MAX_NODE_BYTES >> 20
            ));
        }
        if self.batches.is_empty() {
            return usage("--batch: give at least one batch size".into());
        }
        if let Some(b) = self.batches.iter().find(|&&b| b == 0 || b > self.window) {
            return usage(format!(
                "--batch {b}: a batch must be 1 to --window ({}) requests",
                self.window
            ));
        }
        if !self.secs.is_finite() || self.secs <= 0.0 || self.secs > MAX_SECS {
            return usage(format!(
                "--secs {}: must be a number of seconds above 0 and at most {MAX_SECS} \
                 (one day)",
                self.secs
            ));
        }
        if !self.warmup_secs.is_finite() || self.warmup_secs < 0.0 || self.warmup_secs > MAX_SECS {
            return usage(format!(
                "--warmup {}: must be a number of seconds from 0 to {MAX_SECS} (one day)",
                self.warmup_secs
            ));
        }
        match (self.transport, &self.pci) {
            (Which::Mlx5, None) => {
                return usage(
                    "--transport mlx5 needs --pci DDDD:BB:DD.F (see `erpc-vfio list`)".into(),
                );
            }
            (Which::Mlx5Sim | Which::Udp, Some(_)) => {
                return usage(format!(
                    "--pci is for --transport mlx5 (a ConnectX bound to vfio-pci); \
                     it means nothing with --transport {}",
                    self.transport_name()
                ));
            }
            _ => {}
        }
        if !self.loss.is_finite() || !(0.0..0.5).contains(&self.loss) {
            return usage(format!(
                "--loss {}: must be a frame loss probability from 0 to below 0.5",
                self.loss
            ));
        }
        if self.count == Some(0) {
            return usage("--count 0: must be at least 1 RPC (round trip) per point".into());
        }
        if self.loss > 0.0 && self.transport != Which::Mlx5Sim {
            return usage(format!(
                "--loss is injected by the device model's fabric; it means nothing with \
                 --transport {}",
                self.transport_name()
            ));
        }
        if self.pcap.is_some() {
            match self.transport {
                Which::Mlx5Sim => {}
                Which::Udp => {}
                Which::Mlx5 => {
                    return usage(
                        "--pcap works on the device model only: a real ConnectX sends \
                         through its own loopback, which no host tool sees; drop --pcap \
                         or use the default transport"
                            .into(),
                    );
                }
            }
        }
        Ok(())
    }

    fn transport_name(&self) -> &'static str {
        match self.transport {
            Which::Mlx5Sim => "mlx5-sim",
            Which::Udp => "udp",
            Which::Mlx5 => "mlx5",
        }
    }

    /// Measurement time per point (valid settings only).
    pub fn duration(&self) -> Duration {
        Duration::try_from_secs_f64(self.secs).unwrap_or(Duration::ZERO)
    }

    /// Warm-up per point (valid settings only).
    pub fn warmup(&self) -> Duration {
        Duration::try_from_secs_f64(self.warmup_secs).unwrap_or(Duration::ZERO)
    }

    /// When each point and each reference stops: after `count` completions
    /// if set, otherwise after the warm-up and the duration.
    pub fn stop(&self) -> Stop {
        match self.count {
            Some(n) => Stop::Count(n),
            None => Stop::Time {
                dur: self.duration(),
                warmup: self.warmup(),
            },
        }
    }
}

/// When a measured run (an eRPC point or its raw-echo reference) stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `warmup` of wall time (counters then zeroed), then `dur` measured:
    /// the rate benchmark.
    Time {
        /// The measured interval.
        dur: Duration,
        /// Run before the measured interval, not counted.
        warmup: Duration,
    },
    /// At the first check (every 64 event-loop rounds, as in a timed run)
    /// where at least this many RPCs / round trips have completed, both
    /// nodes together, counted from the first round (no warm-up). No wall
    /// clock decides anything, so on the deterministic device model the
    /// same count always does the same work: the fixed amount of work for
    /// an instruction count (`tools/bench-callgrind.sh`). The run reports
    /// how many completed (at most one check's worth above the count).
    Count(u64),
}

impl Stop {
    /// The warm-up: none for a counted run.
    pub(super) fn warmup(self) -> Duration {
        match self {
            Stop::Time { warmup, .. } => warmup,
            Stop::Count(_) => Duration::ZERO,
        }
    }

    /// Whether a run that has measured for `measured` and completed `done`
    /// is over (`min_rpcs`: a timed run's minimum, see [`Point`]).
    pub(super) fn reached(self, measured: Duration, done: u64, min_rpcs: u64) -> bool {
        match self {
            Stop::Time { dur, .. } => {
                measured >= dur && (done >= min_rpcs || measured >= dur * MAX_STRETCH)
            }
            Stop::Count(n) => done >= n,
        }
    }

    /// Draws a progress bar for a timed run (a counted one has none).
    pub(super) fn phase(self, progress: &Progress, name: &str) {
        if let Stop::Time { dur, warmup } = self {
            progress.phase(name, warmup + dur);
        }
    }
}

/// Counts event-loop rounds without a completion, for a counted run's
/// stall bound (`STALL_ROUNDS`).
pub(super) struct Stall {
    last: u64,
    rounds: usize,
}

impl Stall {
    pub(super) fn new() -> Stall {
        Stall { last: 0, rounds: 0 }
    }

    /// `rounds` more have run and `done` completed so far: true once
    /// [`STALL_ROUNDS`] rounds in a row completed nothing.
    pub(super) fn stalled(&mut self, done: u64, rounds: usize) -> bool {
        if done != self.last {
            self.last = done;
            self.rounds = 0;
            return false;
        }
        self.rounds += rounds;
        self.rounds >= STALL_ROUNDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            transport: Which::Mlx5Sim,
            batches: vec![1, 3],
            window: 60,
            size: 32,
            secs: 1.0,
            warmup_secs: 0.2,
            pci: None,
            pcap: None,
            loss: 0.0,
            count: None,
        }
    }

    fn usage(s: Settings) -> String {
        match s.validate() {
            Err(BenchError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_limits_are_named() {
        settings().validate().unwrap();
        let m = usage(Settings {
            size: MAX_MSG_BYTES + 1,
            ..settings()
        });
        assert!(m.contains(&MAX_MSG_BYTES.to_string()), "{m}");
        Settings {
            size: MAX_MSG_BYTES,
            window: 8,
            batches: vec![1],
            ..settings()
        }
        .validate()
        .unwrap();
        assert!(
            usage(Settings {
                window: 0,
                ..settings()
            })
            .contains("1 to 1024")
        );
        assert!(
            usage(Settings {
                batches: vec![0],
                ..settings()
            })
            .contains("--batch 0")
        );
        assert!(
            usage(Settings {
                batches: vec![61],
                ..settings()
            })
            .contains("--window (60)")
        );
        for secs in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e9] {
            let m = usage(Settings { secs, ..settings() });
            assert!(m.contains("at most 86400"), "{m}");
        }
        let m = usage(Settings {
            size: MAX_MSG_BYTES,
            window: 1024,
            batches: vec![1],
            ..settings()
        });
        assert!(m.contains("MiB of message buffers per node"), "{m}");
        for warmup_secs in [f64::NAN, -0.1, 1e6] {
            let m = usage(Settings {
                warmup_secs,
                ..settings()
            });
            assert!(m.contains("from 0 to 86400"), "{m}");
        }
        Settings {
            warmup_secs: 0.0,
            ..settings()
        }
        .validate()
        .unwrap();
        assert!(
            usage(Settings {
                pci: Some("0000:03:00.0".into()),
                ..settings()
            })
            .contains("--pci is for")
        );
        assert!(
            usage(Settings {
                transport: Which::Mlx5,
                ..settings()
            })
            .contains("needs --pci")
        );
        // Kernel UDP captures too (node 0's transport and the SM link).
        assert!(
            Settings {
                transport: Which::Udp,
                pcap: Some("x".into()),
                ..settings()
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn count_zero_is_refused_and_count_replaces_the_clock() {
        let m = usage(Settings {
            count: Some(0),
            ..settings()
        });
        assert!(m.contains("--count 0"), "{m}");
        let s = Settings {
            count: Some(500),
            ..settings()
        };
        s.validate().unwrap();
        assert_eq!(s.stop(), Stop::Count(500));
        assert_eq!(Stop::Count(500).warmup(), Duration::ZERO);
        assert_eq!(
            settings().stop(),
            Stop::Time {
                dur: Duration::from_secs(1),
                warmup: Duration::from_millis(200)
            }
        );
        // A count stops on the count alone, whatever the time.
        assert!(!Stop::Count(500).reached(Duration::from_secs(1000), 499, 0));
        assert!(Stop::Count(500).reached(Duration::ZERO, 500, 0));
        let t = settings().stop();
        assert!(!t.reached(Duration::from_millis(999), 1 << 40, 0));
        assert!(t.reached(Duration::from_secs(1), 0, 0));
        // min_rpcs stretches a timed run, up to MAX_STRETCH.
        assert!(!t.reached(Duration::from_secs(1), 9, 10));
        assert!(t.reached(Duration::from_secs(u64::from(MAX_STRETCH)), 9, 10));
    }

    #[test]
    fn a_stall_is_rounds_in_a_row_without_a_completion() {
        let mut s = Stall::new();
        assert!(!s.stalled(0, STALL_ROUNDS - 1));
        assert!(!s.stalled(1, STALL_ROUNDS - 1), "a completion restarts it");
        assert!(!s.stalled(1, STALL_ROUNDS - 1));
        assert!(s.stalled(1, 1));
    }
}
