//! erpc-bench: small-RPC rate and latency, on the device model by default.
//!
//! ```sh
//! cargo run --release -p erpc-tools --bin erpc-bench                 # device model
//! cargo run --release -p erpc-tools --bin erpc-bench -- --transport udp
//! cargo run --release -p erpc-tools --bin erpc-bench -- --json run.json --latency-csv lat.csv
//! cargo run --release -p erpc-tools --bin erpc-bench -- --secs 0.01 --batch 1 --pcap erpc.pcap
//! ```
//!
//! Two nodes, each both client and server, requests and responses of
//! `--size` bytes, B requests per batch with at most `--window` in flight
//! per node (the paper's Figure 4 setup on two nodes). Every run also
//! measures a raw echo of eRPC-sized packets over the same transport and
//! reports eRPC's packet rate as a ratio to it.
//!
//! `--count N` stops each point and each reference after N RPCs / round
//! trips instead of after `--secs` (no warm-up, no wall clock deciding
//! anything: on the device model a fixed amount of work), and `--only erpc`
//! / `--only raw-echo` runs one half; `tools/bench-callgrind.sh` uses both
//! to count instructions per RPC and per round trip under callgrind.
//!
//! Other experiments (`--experiment`): `loss` measures the goodput of the
//! largest messages while the device model's fabric loses frames at
//! 10⁻⁶ … 10⁻² (a ratio to lossless in the same run), then the small-RPC
//! rate at loss 10⁻³; `failure-detection` kills a server process on kernel
//! UDP (loopback) and measures how long the client takes to see its
//! requests fail, against the failure timeout; `large` measures the
//! goodput of 32 B … 8 MB requests and responses against single-core
//! `memcpy` of the same bytes in the same run.
//! `factors` switches eRPC's optimisations off one at a time (device
//! model); `incast` runs N senders of 1 MB requests into one receiver on
//! the simulated network with link rates and a drop-tail switch buffer, in
//! virtual time, with congestion control on and off.
//! `cc-overhead` compares the small-RPC rate with congestion control on
//! and off (device model, interleaved rounds).
//!
//! `--inspect` exposes the run on the debug endpoint: `erpc-inspect PID`
//! (or `--watch`) shows the NICs' queues, the Rpcs and their sessions while
//! it runs.
//!
//! Bad settings are refused before anything runs, naming the limit (exit
//! code 2); a failed setup or run is one error line (exit code 1).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use erpc::CcConfig;
use erpc::RpcConfig;
use erpc_tools::bench::{
    BenchError, DeviceModel, Knobs, Outcome, Point, Progress, RawEcho as RawEchoRun, Settings,
    Vfio, Which, erpc_until, packets_per_direction, ratio_to_raw, raw_echo_data_bytes, raw_echo_on,
    udp_erpc_with, udp_raw_echo,
};
use erpc_tools::capture::{Capture, CaptureStats};
use erpc_tools::experiments::{self, LOSS_RATES, SMALL_RPC_LOSS};
use erpc_tools::memory::{MemoryPlan, bench_pages};
use serde::Serialize;

/// The rate controller of `--experiment incast`'s CC-on rows, and of the
/// small-RPC experiment's `--cc on` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CcController {
    /// Timely (`erpc::CcConfig::default()`).
    Timely,
    /// The delay-target controller (`erpc::CcConfig::swift()`).
    Swift,
}

/// Congestion control of the small-RPC experiment's eRPC points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CcSwitch {
    /// On, with `--controller`'s rate controller, over every transport
    /// (over kernel UDP too, where it is off by default).
    On,
    /// Off: no rate control, no pacing, no timing wheel.
    Off,
}

/// Which half of each small-RPC point `--only` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Only {
    /// The eRPC points, without their raw-echo references.
    Erpc,
    /// The raw-echo references, without the eRPC points.
    RawEcho,
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Experiment {
    /// Small-RPC rate and latency against a raw echo (the paper's Figure 4).
    SmallRpc,
    /// Goodput of ~8 MB messages under frame loss 1e-6..1e-2, and the
    /// small-RPC rate at loss 1e-3, each against lossless (device model).
    Loss,
    /// Time from killing a server process (kernel UDP) to the client's
    /// error continuations, against the failure timeout.
    FailureDetection,
    /// Small-RPC rate with each of eRPC's optimisations switched off in
    /// turn, and congestion control off, against all on (device model).
    Factors,
    /// N-to-1 incast of 1 MB requests on the simulated network (virtual
    /// time), with small RPCs from an uncongested sender; CC on and off.
    Incast,
    /// Small-RPC rate with congestion control (Timely, wheel, bypasses) on
    /// against off, interleaved rounds on the device model.
    CcOverhead,
    /// Goodput of 32 B ... 8 MB requests and responses against single-core
    /// memcpy of the same bytes, same run (device model).
    Large,
    /// Session scalability (the paper's 20 000 sessions): client nodes of
    /// many sessions each against one server node of several Rpcs, small
    /// RPCs with congestion control on, on the simulated network (virtual
    /// time); every RPC checked exactly once.
    Scale,
}

#[derive(Debug, Parser)]
#[command(version, about = "eRPC benchmarks (device model by default)")]
struct Args {
    /// What to measure.
    #[arg(long, value_enum, default_value = "small-rpc")]
    experiment: Experiment,
    /// Frame loss probability on each device-model link while the eRPC
    /// points run (small-rpc only; eRPC's loss recovery repairs it). The
    /// raw-echo references run lossless: they have no loss recovery, so
    /// the ratio is eRPC under loss against the lossless bare transport.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    loss: f64,
    /// Trials of `--experiment failure-detection`.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Rounds of `--experiment factors` and `cc-overhead` (interleaved;
    /// each row's rate is the median).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Sender counts of `--experiment incast`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![10, 20, 50, 100])]
    senders: Vec<usize>,
    /// Switch buffer per output port in KiB (`--experiment incast`).
    #[arg(long, default_value_t = 1024)]
    buffer_kib: u64,
    /// Link rate in Gbit/s (`--experiment incast`).
    #[arg(long, default_value_t = 25.0)]
    link_gbps: f64,
    /// Timely's T_low in µs for `--experiment incast` (default: the C++
    /// eRPC's 50).
    #[arg(long)]
    t_low_us: Option<f64>,
    /// Timely's T_high in µs for `--experiment incast` (default 1000).
    #[arg(long)]
    t_high_us: Option<f64>,
    /// Timely's minimum RTT in µs, the unit of its gradient, for
    /// `--experiment incast` (default 2).
    #[arg(long)]
    min_rtt_us: Option<f64>,
    /// Pace every client packet through the timing wheel, also at link
    /// rate (the wheel bypass off), in `--experiment incast`'s CC-on rows.
    #[arg(long)]
    pace_all: bool,
    /// Most packets a client slot keeps in the timing wheel at once in
    /// `--experiment incast`'s CC-on rows (0: no limit; default: the
    /// controller's preset, 0 for Timely).
    #[arg(long)]
    pace_window: Option<u16>,
    /// Rate controller of `--experiment incast`'s CC-on rows and of the
    /// small-RPC experiment's `--cc on` rows: Timely (the default, the
    /// facts sheet's constants) or the delay-target controller
    /// (`erpc::CcConfig::swift()`: every packet paced).
    #[arg(long, value_enum, default_value = "timely")]
    controller: CcController,
    /// Delay-target controller: queueing allowed above the base RTT, µs
    /// (default 1; the headroom is the larger of this and 3 KiB at the
    /// link rate).
    #[arg(long)]
    headroom_us: Option<f64>,
    /// Delay-target controller: most flow scaling added to the target at
    /// the minimum rate, µs (default 2; 0 switches it off).
    #[arg(long)]
    fs_range_us: Option<f64>,
    /// Delay-target controller: additive increase per RTT, MB/s (default
    /// 10).
    #[arg(long)]
    ai_mbps: Option<f64>,
    /// Delay-target controller: gain of the queue-gradient term (default
    /// 0.3; 0 switches it off and holds the decrease while the RTT falls,
    /// the controller before the gradient term).
    #[arg(long)]
    grad_gain: Option<f64>,
    /// Width of a timing-wheel slot in ns for `--experiment incast`'s
    /// CC-on rows (default: the controller's preset, 500 for Timely, 100
    /// for the delay-target controller).
    #[arg(long)]
    wheel_slot_ns: Option<u64>,
    /// Delay-target controller: multiplicative decrease factor β
    /// (default 0.1).
    #[arg(long)]
    md_beta: Option<f64>,
    /// Delay-target controller: additive increase per RTT at most this
    /// fraction of the rate (default 0.005; 0: no limit).
    #[arg(long)]
    ai_frac: Option<f64>,
    /// One-way propagation delay of every link in ns (`--experiment
    /// incast`; default 1000). A few ns more or less change the order
    /// of simultaneous events, so runs at 1000, 1007, 1014, ... show how
    /// much a result depends on one trajectory.
    #[arg(long, default_value_t = 1000)]
    link_delay_ns: u64,
    /// One Rpc per core: run each point at one thread and at N threads,
    /// thread i owning Rpc i of both nodes (its own queue set and flow rule
    /// on each device-model NIC, or its own UDP sockets), and print each
    /// thread's rate, the total and the scaling efficiency against one
    /// thread (small-RPC experiment, `--transport mlx5-sim` or `udp`).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Client nodes of `--experiment scale` (one Rpc each).
    #[arg(long, default_value_t = 100)]
    client_nodes: usize,
    /// Sessions each client node opens in `--experiment scale` (spread over
    /// the server's Rpcs).
    #[arg(long, default_value_t = 200)]
    sessions_per_client: usize,
    /// Rpcs of the server node in `--experiment scale`.
    #[arg(long, default_value_t = 8)]
    server_rpcs: usize,
    /// RPCs each session carries in `--experiment scale`.
    #[arg(long, default_value_t = 4)]
    rpcs_per_session: usize,
    /// Failure timeout in ms for `--experiment failure-detection`.
    #[arg(long, default_value_t = erpc::FAILURE_TIMEOUT_MS)]
    failure_timeout_ms: u64,
    /// (internal) Run as the peer process of the failure-detection
    /// experiment at this URI.
    #[arg(long, hide = true, value_name = "URI")]
    failure_peer: Option<String>,
    /// Transport.
    #[arg(long, value_enum, default_value = "mlx5-sim")]
    transport: Which,
    /// Batch sizes B to measure (comma separated), each 1..=window.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 3, 8, 16])]
    batch: Vec<usize>,
    /// Most requests in flight per node (1..=1024).
    #[arg(long, default_value_t = 60)]
    window: usize,
    /// Request and response size in bytes (at most erpc::MAX_MSG_BYTES).
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// PCI address of the ConnectX for `--transport mlx5` (bind it first
    /// with `erpc-vfio bind`).
    #[arg(long)]
    pci: Option<String>,
    /// Seconds measured per point.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    secs: f64,
    /// Seconds of warm-up before each point, and each point's raw-echo
    /// reference, is measured.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    warmup: f64,
    /// Stop each point, and each raw-echo reference, once N RPCs / round
    /// trips have completed (both nodes, checked every 64 event-loop
    /// rounds; the table's last columns say how many) instead of after
    /// --secs, with no warm-up: no wall clock decides anything, so on the
    /// device model a run is a fixed amount of work (instruction counts:
    /// tools/bench-callgrind.sh). Small-RPC experiment only.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Congestion control of the eRPC points (small-RPC experiment): `on`
    /// (with `--controller`), `off`, or both, `--cc on,off`: each B is then
    /// measured with each setting in turn against the same reference, one
    /// row each, in the same run. Default: the transport's own default (on
    /// for the mlx5 transport, off over kernel UDP, whose round trips are
    /// set by the kernel's socket queues; see README).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "on|off")]
    cc: Vec<CcSwitch>,
    /// Measure only the eRPC points or only their raw-echo references
    /// (small-RPC experiment; the other columns show `-`).
    #[arg(long, value_enum, value_name = "SIDE")]
    only: Option<Only>,
    /// The timing options given on the command line (not defaults), for
    /// refusing them with --count.
    #[arg(skip)]
    timing_given: Vec<&'static str>,
    /// Every option given on the command line (clap ids), for refusing
    /// those the experiment does not read.
    #[arg(skip)]
    given: Vec<String>,
    /// Capture the eRPC runs (data and session-management packets) into a
    /// pcap file; decode it with tools/wireshark/erpc.lua. Device model
    /// and kernel UDP; slows the run, so keep --secs short.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Expose the run on the debug endpoint, for `erpc-inspect PID` (the
    /// NICs and both nodes' Nexuses and Rpcs; ERPC_INSPECT=1 does the same).
    #[arg(long)]
    inspect: bool,
    /// Also write the results (settings, every point, queue snapshots) as
    /// JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write each point's latency distribution as CSV (batch, window,
    /// size, percentile, latency_us, count).
    #[arg(long, value_name = "FILE")]
    latency_csv: Option<PathBuf>,
}

/// The results of a run, as `--json` writes them.
#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    version: &'static str,
    settings: Settings,
    description: &'static str,
    hugepages: HugepageUse,
    raw_echo: RawEcho,
    points: Vec<PointReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_model: Option<NicTotals>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capture: Option<CaptureStats>,
}

#[derive(Debug, Serialize)]
struct HugepageUse {
    pages_needed: u64,
    small_page_fallback: bool,
}

#[derive(Debug, Serialize)]
struct RawEcho {
    frame_bytes: usize,
    /// Frames each way of one raw-echo round trip: eRPC's packets per
    /// direction per RPC.
    packets_per_rpc_per_direction: usize,
}

/// One point; with `--only`, the half not measured is left out.
#[derive(Debug, Serialize)]
struct PointReport {
    point: Point,
    #[serde(skip_serializing_if = "Option::is_none")]
    mrps: Option<f64>,
    /// The point's reference: a raw echo of the same shape (both nodes,
    /// the point's batch and window), round trips per second by both nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_echo_round_trips_per_sec: Option<f64>,
    /// The raw echo's median round-trip time, µs (timed as eRPC's RPCs are).
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_echo_median_us: Option<f64>,
    /// Round trips the raw echo completed while measuring (both nodes; as
    /// `completed` counts RPCs).
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_echo_round_trips: Option<u64>,
    ratio_to_raw_echo: Option<f64>,
    /// Congestion control of the eRPC point with `--cc` (`off`, `timely`,
    /// `swift`); absent: the transport's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    cc: Option<&'static str>,
    /// The ratio is above 1.0: eRPC moved its packets faster than the bare
    /// transport moved the same packets (see erpc-bench's output).
    ratio_above_one: bool,
    #[serde(flatten)]
    outcome: Option<Outcome>,
}

#[derive(Debug, Serialize)]
struct NicTotals {
    frames_sent: u64,
    doorbells: u64,
    send_cqes: u64,
    out_of_buffer_drops: u64,
}

/// stdout, where a closed pipe (`erpc-bench | head`) ends the run quietly
/// instead of panicking in `println!`.
struct Out(io::Stdout);

impl Out {
    fn line(&mut self, progress: &Progress, s: String) -> Result<(), Quit> {
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

enum Quit {
    Pipe,
    Err(BenchError),
}

impl From<BenchError> for Quit {
    fn from(e: BenchError) -> Self {
        Quit::Err(e)
    }
}

fn create(path: &Path) -> Result<BufWriter<File>, BenchError> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|source| BenchError::Output {
            path: path.to_owned(),
            source,
        })
}

fn output_error(path: &Path) -> impl Fn(io::Error) -> BenchError + '_ {
    move |source| BenchError::Output {
        path: path.to_owned(),
        source,
    }
}

fn main() -> ExitCode {
    erpc_tools::init_tracing();
    let args = parse_args(std::env::args_os());
    match run(args) {
        Ok(()) | Err(Quit::Pipe) => ExitCode::SUCCESS,
        Err(Quit::Err(e)) => {
            eprintln!("erpc-bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The command line (clap's errors exit 2), with the timing options that
/// were given rather than defaulted.
fn parse_args<I, T>(argv: I) -> Args
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Args::command().get_matches_from(argv);
    let mut args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    args.timing_given = [("secs", "--secs"), ("warmup", "--warmup")]
        .into_iter()
        .filter(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
        .map(|(_, flag)| flag)
        .collect();
    // Options only (the derive's argument group has an id too).
    let options = Args::command();
    args.given = options
        .get_arguments()
        .map(|a| a.get_id().as_str())
        .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
        .map(str::to_owned)
        .collect();
    args
}

/// The options (clap ids) each experiment reads, besides `--experiment`
/// and `--json`; any other given on the command line is refused, since it
/// would be silently ignored.
fn options_of(e: Experiment) -> &'static [&'static str] {
    /// The small-RPC rate settings the interleaved experiments share.
    const RATE: [&str; 6] = ["transport", "batch", "window", "size", "secs", "warmup"];
    match e {
        Experiment::SmallRpc => &[
            "transport",
            "batch",
            "window",
            "size",
            "secs",
            "warmup",
            "loss",
            "controller",
            "pci",
            "count",
            "cc",
            "only",
            "pcap",
            "inspect",
            "latency_csv",
            "threads",
        ],
        Experiment::Loss => &RATE,
        Experiment::FailureDetection => &["trials", "failure_timeout_ms"],
        Experiment::Factors | Experiment::CcOverhead => &[
            "transport",
            "batch",
            "window",
            "size",
            "secs",
            "warmup",
            "rounds",
        ],
        Experiment::Incast => &[
            "senders",
            "buffer_kib",
            "link_gbps",
            "t_low_us",
            "t_high_us",
            "min_rtt_us",
            "pace_all",
            "pace_window",
            "controller",
            "headroom_us",
            "fs_range_us",
            "ai_mbps",
            "grad_gain",
            "wheel_slot_ns",
            "md_beta",
            "ai_frac",
            "link_delay_ns",
        ],
        Experiment::Large => &["transport", "size", "secs", "warmup"],
        Experiment::Scale => &[
            "client_nodes",
            "sessions_per_client",
            "server_rpcs",
            "rpcs_per_session",
            "window",
            "size",
            "link_gbps",
            "buffer_kib",
            "link_delay_ns",
        ],
    }
}

/// Refuses an option given on the command line that the experiment does
/// not read (`--experiment incast --batch 3`), and `--controller` on the
/// small-RPC experiment without `--cc on`, where no rate controller runs.
fn refuse_ignored_options(args: &Args) -> Result<(), Quit> {
    let usage = |m: String| Err(Quit::Err(BenchError::Usage(m)));
    let exp = args
        .experiment
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned());
    let own = options_of(args.experiment);
    if let Some(id) = args
        .given
        .iter()
        .find(|id| !["experiment", "json"].contains(&id.as_str()) && !own.contains(&id.as_str()))
    {
        return usage(format!(
            "--{} does not apply to --experiment {exp}",
            id.replace('_', "-")
        ));
    }
    if args.experiment == Experiment::SmallRpc
        && args.given.iter().any(|id| id == "controller")
        && !args.cc.contains(&CcSwitch::On)
    {
        return usage(
            "--controller chooses the rate controller of --cc on: give --cc on (or on,off) \
             with it"
                .into(),
        );
    }
    Ok(())
}

/// `--count` and `--only` belong to the small-RPC experiment, and a
/// counted run has no use for the timing options.
fn check_count_and_only(args: &Args) -> Result<(), Quit> {
    let usage = |m: String| Err(Quit::Err(BenchError::Usage(m)));
    if args.experiment != Experiment::SmallRpc {
        if args.threads.is_some() {
            return usage("--threads applies to --experiment small-rpc only".into());
        }
        if args.count.is_some() {
            return usage("--count applies to --experiment small-rpc only".into());
        }
        if args.only.is_some() {
            return usage("--only applies to --experiment small-rpc only".into());
        }
        if !args.cc.is_empty() {
            return usage(
                "--cc applies to --experiment small-rpc only (incast and cc-overhead \
                 measure both settings themselves)"
                    .into(),
            );
        }
    }
    if args.cc.len() > 1 && args.latency_csv.is_some() {
        return usage(
            "--latency-csv keeps one distribution per B: give --cc one setting per run".into(),
        );
    }
    if args.only == Some(Only::RawEcho) && args.loss > 0.0 {
        return usage(
            "--loss applies to the eRPC points, which --only raw-echo leaves out (the raw \
             echo has no loss recovery and always runs lossless)"
                .into(),
        );
    }
    if let (Some(n), Some(flag)) = (args.count, args.timing_given.first()) {
        return usage(format!(
            "--count {n} stops each point after {n} RPCs, with no warm-up: \
             {flag} does not apply"
        ));
    }
    Ok(())
}

fn run(args: Args) -> Result<(), Quit> {
    check_count_and_only(&args)?;
    if let Some(uri) = &args.failure_peer {
        return Err(Quit::Err(
            experiments::failure_peer(uri)
                .err()
                .unwrap_or_else(|| BenchError::Run("the failure-detection peer returned".into())),
        ));
    }
    refuse_ignored_options(&args)?;
    match args.experiment {
        Experiment::SmallRpc => run_small_rpc(args),
        Experiment::Loss => run_loss(args),
        Experiment::FailureDetection => run_failure_detection(args),
        Experiment::Factors => run_factors(args),
        Experiment::Incast => run_incast(args),
        Experiment::CcOverhead => run_cc_overhead(args),
        Experiment::Large => run_large(args),
        Experiment::Scale => run_scale(args),
    }
}

/// `--experiment scale`: see `erpc_tools::exp_scale`.
fn run_scale(args: Args) -> Result<(), Quit> {
    use erpc_tools::exp_scale::{ScaleConfig, report, run_scale};
    refuse_other_options(&args, "scale")?;
    let usage = |m: String| Err(Quit::Err(BenchError::Usage(m)));
    if !(1..=10_000).contains(&args.client_nodes) {
        return usage(format!(
            "--client-nodes {}: must be 1 to 10000",
            args.client_nodes
        ));
    }
    if !(1..=65_000).contains(&args.sessions_per_client) {
        return usage(format!(
            "--sessions-per-client {}: must be 1 to 65000 (16-bit session numbers)",
            args.sessions_per_client
        ));
    }
    if !(1..=1_000_000).contains(&args.rpcs_per_session) {
        return usage(format!(
            "--rpcs-per-session {}: must be 1 to 1000000",
            args.rpcs_per_session
        ));
    }
    if !(1..=1024).contains(&args.window) {
        return usage(format!("--window {}: must be 1 to 1024", args.window));
    }
    if !(0.1..=400.0).contains(&args.link_gbps) {
        return usage(format!(
            "--link-gbps {}: must be 0.1 to 400",
            args.link_gbps
        ));
    }
    let c = ScaleConfig {
        server_rpcs: args.server_rpcs,
        client_nodes: args.client_nodes,
        sessions_per_client: args.sessions_per_client,
        rpcs_per_session: args.rpcs_per_session,
        window: args.window,
        size: args.size,
        link_gbps: args.link_gbps,
        buffer_bytes: args.buffer_kib * 1024,
        delay_ns: args.link_delay_ns,
        ..ScaleConfig::default()
    };
    let heap = || heap_count::net_bytes();
    let r = run_scale(&c, Some(&heap)).map_err(Quit::Err)?;
    print!("{}", report(&r));
    write_json(args.json.as_deref(), &r)
}

/// A counting global allocator: the process's net heap bytes, for
/// `--experiment scale`'s heap per session. One relaxed atomic add per
/// allocation and free; eRPC's request path allocates nothing, so the
/// measured points are not touched by it.
mod heap_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicI64, Ordering};

    static NET: AtomicI64 = AtomicI64::new(0);

    struct Counting;

    // SAFETY: forwards every call to the system allocator unchanged; the
    // counter is an atomic, which allocates nothing.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            NET.fetch_add(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            NET.fetch_sub(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            NET.fetch_add(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            NET.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.realloc(p, l, n) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Net heap bytes allocated so far.
    pub(super) fn net_bytes() -> i64 {
        NET.load(Ordering::Relaxed)
    }
}

/// Settings that apply to every experiment but the one named, refused.
fn refuse_other_options(args: &Args, exp: &str) -> Result<(), Quit> {
    let bad = |o: &str| {
        Err(Quit::Err(BenchError::Usage(format!(
            "{o} does not apply to --experiment {exp}"
        ))))
    };
    if args.pcap.is_some() {
        return bad("--pcap");
    }
    if args.latency_csv.is_some() {
        return bad("--latency-csv");
    }
    if args.pci.is_some() {
        return bad("--pci");
    }
    if args.loss != 0.0 {
        return bad("--loss (the experiment sets its own loss rates)");
    }
    Ok(())
}

fn write_json(path: Option<&Path>, value: &impl Serialize) -> Result<(), Quit> {
    let Some(path) = path else { return Ok(()) };
    let mut w = create(path)?;
    serde_json::to_writer_pretty(&mut w, value)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(w))
        .and_then(|()| w.flush())
        .map_err(output_error(path))?;
    Ok(())
}

/// The settings of an experiment that takes no --pci, --pcap or --loss
/// (refused earlier by `refuse_other_options`), validated.
fn experiment_settings(args: &Args) -> Result<Settings, Quit> {
    let settings = Settings {
        transport: args.transport,
        batches: args.batch.clone(),
        window: args.window,
        size: args.size,
        secs: args.secs,
        warmup_secs: args.warmup,
        pci: None,
        pcap: None,
        loss: 0.0,
        count: None,
    };
    settings.validate()?;
    Ok(settings)
}

/// Refuses another transport for an experiment that runs on the device
/// model (`why`, if not empty, says what it needs the model for).
/// The hugepage plan for `pages` 2 MiB pages; says on stderr when the run
/// falls back to 4 KiB pages.
fn memory_plan(pages: u64) -> MemoryPlan {
    let plan = MemoryPlan::decide("erpc-bench", pages);
    if let Some(note) = &plan.note {
        eprintln!("{note}");
    }
    plan
}

fn device_model_only(args: &Args, name: &str, why: &str) -> Result<(), Quit> {
    if args.transport == Which::Mlx5Sim {
        return Ok(());
    }
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    Err(Quit::Err(BenchError::Usage(format!(
        "--experiment {name} runs on the device model{why}; drop --transport"
    ))))
}

/// `--rounds` of the interleaved experiments: 1 to 100.
fn check_rounds(args: &Args) -> Result<(), Quit> {
    if args.rounds == 0 || args.rounds > 100 {
        return Err(Quit::Err(BenchError::Usage(format!(
            "--rounds {}: must be 1 to 100",
            args.rounds
        ))));
    }
    Ok(())
}

fn run_loss(args: Args) -> Result<(), Quit> {
    refuse_other_options(&args, "loss")?;
    device_model_only(&args, "loss", "its fabric loses the frames")?;
    let settings = experiment_settings(&args)?;
    let size = erpc::MAX_MSG_BYTES;
    let large_window = LARGE_WINDOW;
    let pages =
        bench_pages(size, large_window, true).max(bench_pages(args.size, args.window, true));
    let plan = memory_plan(pages);
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    let (dur, warmup) = (settings.duration(), settings.warmup());
    out.line(
        &progress,
        format!(
            "erpc-bench loss: {size}-byte requests and responses, {large_window} in flight per \
             node, one session each way, mlx5 transport on the device model, {} s per point",
            args.secs
        ),
    )?;
    out.line(
        &progress,
        format!(
            "{:>8} {:>8} {:>8} {:>12} {:>12} {:>16} {:>12}",
            "loss", "RPCs", "+drained", "Gbit/s", "/ lossless", "retransmissions", "TX drains"
        ),
    )?;
    let mut pending: Option<Quit> = None;
    let large =
        experiments::large_message_loss(&plan, size, large_window, dur, warmup, &progress, |r| {
            let line = format!(
                "{:>8} {:>8} {:>8} {:>12.3} {:>12} {:>16} {:>12}",
                loss_label(r.loss),
                r.rpcs,
                r.drained,
                r.goodput_gbps,
                r.ratio_to_lossless
                    .map_or("-".into(), |x| format!("{x:.3}")),
                r.retransmissions,
                r.tx_flushes
            );
            if let Err(e) = out.line(&progress, line) {
                pending = Some(e);
            }
            Ok(())
        })?;
    if let Some(q) = pending.take() {
        return Err(q);
    }
    let batches: Vec<usize> = if args.batch == [1, 3, 8, 16] {
        vec![1, 8]
    } else {
        args.batch.clone()
    };
    out.line(
        &progress,
        format!(
            "small RPCs ({} B, window {}): lossless against loss {SMALL_RPC_LOSS}",
            args.size, args.window
        ),
    )?;
    out.line(
        &progress,
        format!(
            "{:>4} {:>8} {:>10} {:>12} {:>16}",
            "B", "loss", "Mrps", "/ lossless", "retransmissions"
        ),
    )?;
    let small = experiments::small_rpc_loss(
        &plan,
        &batches,
        args.window,
        args.size,
        dur,
        warmup,
        &progress,
        |r| {
            let line = format!(
                "{:>4} {:>8} {:>10.3} {:>12} {:>16}",
                r.batch,
                loss_label(r.loss),
                r.mrps,
                r.ratio_to_lossless
                    .map_or("-".into(), |x| format!("{x:.3}")),
                r.retransmissions
            );
            if let Err(e) = out.line(&progress, line) {
                pending = Some(e);
            }
            Ok(())
        },
    )?;
    if let Some(q) = pending {
        return Err(q);
    }
    #[derive(Serialize)]
    struct LossReport<'a> {
        tool: &'static str,
        experiment: Experiment,
        loss_rates: &'a [f64],
        large_messages: Vec<experiments::LossRow>,
        small_rpcs: Vec<experiments::SmallLossRow>,
    }
    write_json(
        args.json.as_deref(),
        &LossReport {
            tool: "erpc-bench",
            experiment: Experiment::Loss,
            loss_rates: &LOSS_RATES,
            large_messages: large,
            small_rpcs: small,
        },
    )
}

/// Large messages in flight per node in the loss experiment (one session
/// has 8 slots).
const LARGE_WINDOW: usize = 4;

fn loss_label(l: f64) -> String {
    if l == 0.0 {
        "0".into()
    } else {
        format!("{l:.0e}")
    }
}

fn run_failure_detection(args: Args) -> Result<(), Quit> {
    refuse_other_options(&args, "failure-detection")?;
    if args.trials == 0 || args.trials > 1000 {
        return Err(Quit::Err(BenchError::Usage(format!(
            "--trials {}: must be 1 to 1000",
            args.trials
        ))));
    }
    if !(10..=60_000).contains(&args.failure_timeout_ms) {
        return Err(Quit::Err(BenchError::Usage(format!(
            "--failure-timeout-ms {}: must be 10 to 60000",
            args.failure_timeout_ms
        ))));
    }
    let exe = std::env::current_exe().map_err(|e| {
        Quit::Err(BenchError::Run(format!(
            "cannot find this program to start the peer: {e}"
        )))
    })?;
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    out.line(
        &progress,
        format!(
            "erpc-bench failure-detection: {} trials, two processes over kernel UDP \
             (loopback), failure timeout {} ms",
            args.trials, args.failure_timeout_ms
        ),
    )?;
    let d = experiments::failure_detection(&exe, args.trials, args.failure_timeout_ms, &progress)?;
    out.line(
        &progress,
        format!(
            "kill -> error continuation: median {:.1} ms, min {:.1} ms, max {:.1} ms \
             ({:.2} / {:.2} x the timeout)",
            d.median_ms,
            d.min_ms,
            d.max_ms,
            d.median_ms / d.timeout_ms as f64,
            d.max_ms / d.timeout_ms as f64
        ),
    )?;
    write_json(args.json.as_deref(), &d)
}

fn run_factors(args: Args) -> Result<(), Quit> {
    refuse_other_options(&args, "factors")?;
    device_model_only(&args, "factors", "it switches NIC features off")?;
    check_rounds(&args)?;
    let settings = experiment_settings(&args)?;
    let batch = if args.batch == [1, 3, 8, 16] {
        8
    } else {
        args.batch[0]
    };
    let plan = memory_plan(bench_pages(args.size, args.window, true));
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    out.line(
        &progress,
        format!(
            "erpc-bench factors: {}-byte RPCs, B = {batch}, window {}, mlx5 transport on the \
             device model, {} s per run, {} interleaved rounds (median)",
            args.size, args.window, args.secs, args.rounds
        ),
    )?;
    let p = Point {
        batch,
        window: args.window,
        size: args.size,
        min_rpcs: 0,
    };
    let rows = experiments::factor_analysis(
        &plan,
        p,
        args.rounds,
        settings.duration(),
        settings.warmup(),
        &progress,
    )?;
    out.line(
        &progress,
        format!("{:<52} {:>8} {:>12}", "switched off", "Mrps", "/ all on"),
    )?;
    for r in &rows {
        out.line(
            &progress,
            format!(
                "{:<52} {:>8.3} {:>12.3}",
                r.factor, r.mrps, r.ratio_to_all_on
            ),
        )?;
    }
    #[derive(Serialize)]
    struct FactorReport<'a> {
        tool: &'static str,
        experiment: Experiment,
        point: Point,
        rounds: usize,
        rows: &'a [experiments::FactorRow],
    }
    write_json(
        args.json.as_deref(),
        &FactorReport {
            tool: "erpc-bench",
            experiment: Experiment::Factors,
            point: p,
            rounds: args.rounds,
            rows: &rows,
        },
    )
}

fn run_cc_overhead(args: Args) -> Result<(), Quit> {
    refuse_other_options(&args, "cc-overhead")?;
    device_model_only(&args, "cc-overhead", "")?;
    check_rounds(&args)?;
    let settings = experiment_settings(&args)?;
    let batches: Vec<usize> = if args.batch == [1, 3, 8, 16] {
        vec![1, 8]
    } else {
        args.batch.clone()
    };
    let plan = memory_plan(bench_pages(args.size, args.window, true));
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    out.line(
        &progress,
        format!(
            "erpc-bench cc-overhead: {}-byte RPCs, window {}, mlx5 transport on the device \
             model, {} s per run, {} interleaved rounds (median); CC on = Timely + wheel + \
             bypasses",
            args.size, args.window, args.secs, args.rounds
        ),
    )?;
    let rows = erpc_tools::exp_cc::cc_overhead(
        &plan,
        &batches,
        args.window,
        args.size,
        args.rounds,
        settings.duration(),
        settings.warmup(),
        &progress,
    )?;
    out.line(
        &progress,
        format!(
            "{:>4} {:>10} {:>10} {:>9} {:>15} {:>17} {:>10} {:>10}",
            "B",
            "on Mrps",
            "off Mrps",
            "on / off",
            "paired median",
            "paired min-max",
            "on p50 µs",
            "off p50 µs"
        ),
    )?;
    for r in &rows {
        out.line(
            &progress,
            format!(
                "{:>4} {:>10.3} {:>10.3} {:>9.3} {:>15.3} {:>17} {:>10.1} {:>10.1}",
                r.batch,
                r.on_mrps,
                r.off_mrps,
                r.ratio,
                r.paired_ratio,
                format!("{:.3}-{:.3}", r.paired_min, r.paired_max),
                r.on_p50_us,
                r.off_p50_us
            ),
        )?;
    }
    #[derive(Serialize)]
    struct CcReport<'a> {
        tool: &'static str,
        experiment: Experiment,
        window: usize,
        size: usize,
        rounds: usize,
        rows: &'a [erpc_tools::exp_cc::CcOverheadRow],
    }
    write_json(
        args.json.as_deref(),
        &CcReport {
            tool: "erpc-bench",
            experiment: Experiment::CcOverhead,
            window: args.window,
            size: args.size,
            rounds: args.rounds,
            rows: &rows,
        },
    )
}

fn run_incast(args: Args) -> Result<(), Quit> {
    use erpc_tools::exp_incast::{IncastExperiment, incast_experiment};
    refuse_other_options(&args, "incast")?;
    let usage = |m: String| Err(Quit::Err(BenchError::Usage(m)));
    if args.senders.is_empty() || args.senders.iter().any(|&n| n == 0 || n > 1000) {
        return usage("--senders: each 1 to 1000".into());
    }
    if !(1..=1 << 20).contains(&args.buffer_kib) {
        return usage(format!(
            "--buffer-kib {}: must be 1 to 1048576",
            args.buffer_kib
        ));
    }
    if !(0.1..=400.0).contains(&args.link_gbps) {
        return usage(format!(
            "--link-gbps {}: must be 0.1 to 400",
            args.link_gbps
        ));
    }
    if args.link_delay_ns > 1_000_000 {
        return usage(format!(
            "--link-delay-ns {}: must be at most 1000000",
            args.link_delay_ns
        ));
    }
    let mut cc = match args.controller {
        CcController::Timely => erpc::CcConfig::default(),
        CcController::Swift => erpc::CcConfig::swift(),
    };
    if let Some(t) = args.headroom_us {
        cc.swift.headroom_us = t;
    }
    if let Some(t) = args.fs_range_us {
        cc.swift.fs_range_us = t;
    }
    if let Some(r) = args.ai_mbps {
        cc.swift.ai_rate = r * 1e6;
    }
    if let Some(b) = args.md_beta {
        cc.swift.beta = b;
    }
    if let Some(f) = args.ai_frac {
        cc.swift.ai_frac = f;
    }
    if let Some(g) = args.grad_gain {
        cc.swift.grad_gain = g;
        cc.swift.hold_while_falling = g == 0.0;
    }
    if let Some(w) = args.wheel_slot_ns {
        cc.wheel_slot_ns = w;
    }
    if !(cc.swift.headroom_us >= 0.0
        && cc.swift.fs_range_us >= 0.0
        && cc.swift.ai_rate > 0.0
        && cc.swift.beta > 0.0
        && cc.swift.beta <= 1.0
        && (0.0..=1.0).contains(&cc.swift.grad_gain)
        && (10..=10_000).contains(&cc.wheel_slot_ns))
    {
        return usage(
            "--headroom-us and --fs-range-us must be >= 0, --ai-mbps > 0, --md-beta in (0, 1], \
             --grad-gain in [0, 1], --wheel-slot-ns 10 to 10000"
                .into(),
        );
    }
    if let Some(t) = args.t_low_us {
        cc.timely.t_low_us = t;
    }
    if let Some(t) = args.t_high_us {
        cc.timely.t_high_us = t;
    }
    if let Some(t) = args.min_rtt_us {
        cc.timely.min_rtt_us = t;
    }
    if args.pace_all {
        cc.wheel_bypass = false;
    }
    if let Some(w) = args.pace_window {
        cc.pace_window = w;
    }
    if !(cc.timely.min_rtt_us..=cc.timely.t_high_us).contains(&cc.timely.t_low_us) {
        return usage(format!(
            "Timely: need min RTT ({} µs) <= T_low ({} µs) <= T_high ({} µs)",
            cc.timely.min_rtt_us, cc.timely.t_low_us, cc.timely.t_high_us
        ));
    }
    let e = IncastExperiment {
        senders: args.senders.clone(),
        buffer_bytes: args.buffer_kib * 1024,
        link_gbps: args.link_gbps,
        delay_ns: args.link_delay_ns,
        cc,
        t_low_us: cc.timely.t_low_us,
        t_high_us: cc.timely.t_high_us,
        min_rtt_us: cc.timely.min_rtt_us,
        wheel_bypass: cc.wheel_bypass,
        pace_window: cc.pace_window,
        wheel_slot_ns: cc.wheel_slot_ns,
        controller: format!("{:?}", cc.controller),
        swift: (cc.controller == erpc::Controller::Swift).then_some(cc.swift.into()),
    };
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    out.line(
        &progress,
        format!(
            "erpc-bench incast: N senders x 1 MB requests (2 in flight each) to one receiver, \
             plus 32-byte RPCs from one uncongested sender; {} Gbit/s links ({} ns one way), {} \
             KiB switch buffer per port, {}, wheel bypass {}, pace window {}, wheel slot {} ns; \
             simulated network, virtual time (best goodput / link: {:.3})",
            e.link_gbps,
            e.delay_ns,
            args.buffer_kib,
            match e.swift {
                None => format!(
                    "Timely T_low {} µs / T_high {} µs / min RTT {} µs",
                    e.t_low_us, e.t_high_us, e.min_rtt_us
                ),
                Some(s) => format!(
                    "delay-target controller: headroom max({} µs, {} B at link rate), flow \
                     scaling up to {} µs, base RTT at most {} µs, increase per RTT min({} \
                     MB/s, {} x rate), decrease {} x excess / target (at most {}{}), gradient \
                     gain {}",
                    s.headroom_us,
                    s.headroom_bytes,
                    s.fs_range_us,
                    s.max_base_rtt_us,
                    s.ai_mbps,
                    s.ai_frac,
                    s.beta,
                    s.max_mdf,
                    if s.hold_while_falling {
                        ", not while the RTT falls"
                    } else {
                        ""
                    },
                    s.grad_gain
                ),
            },
            if e.wheel_bypass { "on" } else { "off" },
            e.pace_window,
            e.wheel_slot_ns,
            erpc_tools::exp_incast::max_goodput_fraction()
        ),
    )?;
    let mut pending: Option<Quit> = None;
    let report = incast_experiment(&e, |l| {
        if pending.is_none()
            && let Err(q) = out.line(&progress, l)
        {
            pending = Some(q);
        }
        Ok(())
    })?;
    if let Some(q) = pending {
        return Err(q);
    }
    write_json(args.json.as_deref(), &report)
}

/// `--threads N`: see `erpc_tools::exp_threads`.
fn run_threads(args: &Args, n: usize) -> Result<(), Quit> {
    use erpc_tools::exp_threads::{ThreadsOn, report, run_threads};
    let usage = |m: String| Err(Quit::Err(BenchError::Usage(m)));
    let on = match args.transport {
        Which::Mlx5Sim => ThreadsOn::DeviceModel,
        Which::Udp => ThreadsOn::Udp,
        Which::Mlx5 => {
            return usage(
                "--threads runs on the device model or kernel UDP (--transport mlx5-sim or udp)"
                    .into(),
            );
        }
    };
    if !(1..=64).contains(&n) {
        return usage(format!("--threads {n}: must be 1 to 64"));
    }
    for (flag, given) in [
        ("--count", args.count.is_some()),
        ("--only", args.only.is_some()),
        ("--pcap", args.pcap.is_some()),
        ("--latency-csv", args.latency_csv.is_some()),
        ("--loss", args.loss != 0.0),
        ("--inspect", args.inspect),
        ("--cc", !args.cc.is_empty()),
    ] {
        if given {
            return usage(format!("{flag} does not apply with --threads"));
        }
    }
    let settings = Settings {
        transport: args.transport,
        batches: args.batch.clone(),
        window: args.window,
        size: args.size,
        secs: args.secs,
        warmup_secs: args.warmup,
        pci: None,
        pcap: None,
        loss: 0.0,
        count: None,
    };
    settings.validate()?;
    let nics = args.transport != Which::Udp;
    // Each thread's two Rpcs hold a node's buffers; the NICs' queue sets
    // one RX ring each.
    let plan = memory_plan(n as u64 * bench_pages(args.size, args.window, nics));
    let secs = std::time::Duration::from_secs_f64(args.secs);
    let rows = run_threads(
        on,
        n,
        &args.batch,
        (args.window, args.size),
        (secs, std::time::Duration::from_secs_f64(args.warmup)),
        &plan,
    )
    .map_err(Quit::Err)?;
    print!("{}", report(on, &rows, args.window, args.size, secs));
    write_json(args.json.as_deref(), &rows)
}

/// The Rpcs' settings of a small-RPC point with `--cc` setting `sw`
/// (`None`: the defaults, congestion control as the transport wants it).
fn rpc_config(sw: Option<CcSwitch>, controller: CcController) -> RpcConfig {
    let mut cfg = RpcConfig::default();
    match sw {
        None => {}
        Some(CcSwitch::Off) => cfg.cc = CcConfig::disabled(),
        Some(CcSwitch::On) => {
            cfg.cc = match controller {
                CcController::Timely => CcConfig::default(),
                CcController::Swift => CcConfig::swift(),
            };
            // Over kernel UDP too.
            cfg.cc.on_software_stack = true;
        }
    }
    cfg
}

/// The `cc` column: `off`, or the controller that is on.
fn cc_label(sw: CcSwitch, controller: CcController) -> &'static str {
    match (sw, controller) {
        (CcSwitch::Off, _) => "off",
        (CcSwitch::On, CcController::Timely) => "timely",
        (CcSwitch::On, CcController::Swift) => "swift",
    }
}

fn run_small_rpc(args: Args) -> Result<(), Quit> {
    if let Some(n) = args.threads {
        return run_threads(&args, n);
    }
    let settings = Settings {
        transport: args.transport,
        batches: args.batch.clone(),
        window: args.window,
        size: args.size,
        secs: args.secs,
        warmup_secs: args.warmup,
        pci: args.pci.clone(),
        pcap: args.pcap.clone(),
        loss: args.loss,
        count: args.count,
    };
    settings.validate()?;
    // Open every output before the run, so a bad path fails at once.
    let mut json_out = args.json.as_deref().map(create).transpose()?;
    let mut csv_out = args.latency_csv.as_deref().map(create).transpose()?;
    let capture = match &args.pcap {
        Some(p) => Some(Capture::create(p).map_err(output_error(p))?),
        None => None,
    };
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    let stop = settings.stop();
    let (run_erpc, run_raw) = (
        args.only != Some(Only::RawEcho),
        args.only != Some(Only::Erpc),
    );

    let nics = args.transport != Which::Udp;
    let plan = memory_plan(bench_pages(args.size, args.window, nics));
    if let Some(c) = &capture {
        eprintln!(
            "capturing the eRPC runs into {} (rates measured while capturing are not \
             representative)",
            c.path().display()
        );
    }
    let inspect = args.inspect || debug_endpoint::env_enabled();
    if inspect {
        // Announced only where it can be made; the socket goes with the
        // process on SIGTERM/SIGINT/SIGHUP too.
        match debug_endpoint::prepare_socket_dir() {
            Ok(dir) => {
                if let Err(e) = debug_endpoint::remove_socket_on_termination() {
                    eprintln!("note: the debug endpoint's socket may outlive a signal: {e}");
                }
                eprintln!(
                    "debug endpoint: {} (attach with `erpc-inspect {}`)",
                    debug_endpoint::socket_path(&dir, std::process::id()).display(),
                    std::process::id()
                )
            }
            Err(e) => eprintln!("{e}; running without it"),
        }
    }
    let dm = match args.transport {
        Which::Mlx5Sim => Some(DeviceModel::new(plan.clone(), capture.clone(), inspect)?),
        _ => None,
    };
    let hw = match (&args.transport, &args.pci) {
        (Which::Mlx5, Some(bdf)) => Some(Vfio::open(bdf, plan.clone(), inspect)?),
        _ => None,
    };
    let per_point = match args.count {
        None => format!("{} s per point", args.secs),
        Some(n) => format!(
            "each point until {n} RPCs (the reference: round trips) have completed, \
             both nodes, no warm-up"
        ),
    };
    let only = match args.only {
        None => "",
        Some(Only::Erpc) => " (eRPC points only)",
        Some(Only::RawEcho) => " (raw-echo references only)",
    };
    out.line(
        &progress,
        format!(
            "erpc-bench: {}-byte RPCs, {}, {per_point}{only}",
            args.size,
            args.transport.describe(),
        ),
    )?;
    let frame_bytes = transport::PKTHDR_BYTES + raw_echo_data_bytes(args.size);
    let per_rpc = packets_per_direction(args.size);
    let mut line = format!(
        "reference (`raw Mrt/s`): a raw echo of {frame_bytes}-byte packets over the same \
         transport with each point's batch and window, both nodes sending and answering, \
         measured before the points {}, in M round trips/s, and its \
         median round-trip time (`raw med µs`), timed as eRPC's RPCs are",
        if args.count.is_some() {
            "to the same count"
        } else {
            "after the same warm-up"
        }
    );
    if args.count.is_some() {
        line.push_str(
            "\n(counted: `RPCs` and `raw rts` are the RPCs and round trips completed, \
             both nodes; rates are wall clock)",
        );
    }
    if per_rpc > 1 {
        line.push_str(&format!(
            "\n(a {}-byte RPC is {per_rpc} packets each way: requests and requests for \
             response one way, credit returns and responses back; a raw round trip is the \
             same {per_rpc} frames each way, of eRPC's sizes (up to {frame_bytes} bytes), \
             each answered on arrival, with as many unanswered as eRPC's session credits \
             allow)",
            args.size
        ));
    }
    if args.loss > 0.0 {
        line.push_str(&format!(
            "\n(--loss {}: the eRPC points only; the raw echo has no loss recovery and runs \
             lossless, so `/ raw echo` is eRPC under loss against the lossless transport)",
            args.loss
        ));
    }
    out.line(&progress, line)?;
    // One eRPC row per B and `--cc` setting (one, the transport's
    // default, without `--cc`).
    let ccs: Vec<Option<CcSwitch>> = if args.cc.is_empty() {
        vec![None]
    } else {
        args.cc.iter().copied().map(Some).collect()
    };
    let cc_col = |sw: Option<CcSwitch>| match sw {
        None => String::new(),
        Some(sw) => format!(" {:>6}", cc_label(sw, args.controller)),
    };
    let mut header = format!(
        "{:>4} {:>7}{} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "B",
        "window",
        if args.cc.is_empty() {
            String::new()
        } else {
            format!(" {:>6}", "cc")
        },
        "Mrps",
        "raw Mrt/s",
        "/ raw echo",
        "median µs",
        "raw med µs",
        "p99 µs",
        "p99.9 µs"
    );
    if args.count.is_some() {
        header.push_str(&format!(" {:>10} {:>10}", "RPCs", "raw rts"));
    }
    out.line(&progress, header)?;
    let point = |b| Point {
        batch: b,
        window: args.window,
        size: args.size,
        min_rpcs: 0,
    };
    // Each point's reference, with its B, before anything is captured (a
    // capture holds eRPC's packets only).
    let mut raws: Vec<Option<RawEchoRun>> = Vec::with_capacity(args.batch.len());
    for &b in &args.batch {
        raws.push(if run_raw {
            Some(match (&dm, &hw) {
                (Some(d), _) => raw_echo_on(d, point(b), stop, &progress)?,
                (_, Some(h)) => raw_echo_on(h, point(b), stop, &progress)?,
                _ => udp_raw_echo(&plan, point(b), stop, &progress)?,
            })
        } else {
            None
        });
    }
    if let Some(d) = &dm {
        // Loss from here on: the eRPC points recover from it, the raw echo
        // above could not (a lost frame would stall its window for good).
        d.set_loss(args.loss);
        d.start_capture()?;
    }
    let mut points = Vec::new();
    for ((&b, &raw), &sw) in args
        .batch
        .iter()
        .zip(&raws)
        .flat_map(|br| ccs.iter().map(move |sw| (br, sw)))
    {
        let p = point(b);
        let knobs = Knobs {
            rpc: rpc_config(sw, args.controller),
            ..Knobs::default()
        };
        let o = if run_erpc {
            Some(match (&dm, &hw) {
                (Some(d), _) => erpc_until(d, &knobs, p, stop, &progress)?,
                (_, Some(h)) => erpc_until(h, &knobs, p, stop, &progress)?,
                _ => udp_erpc_with(
                    &plan,
                    p,
                    stop,
                    &progress,
                    capture.as_ref(),
                    inspect,
                    knobs.rpc,
                )?,
            })
        } else {
            None
        };
        let ratio = match (&o, &raw) {
            (Some(o), Some(raw)) => ratio_to_raw(o.rpcs_per_sec, raw.round_trips_per_sec),
            _ => None,
        };
        // The reference moves eRPC's packets, with at least eRPC's
        // parallelism, without eRPC: above 1.0, something other than eRPC
        // made the difference.
        let suspect = ratio.is_some_and(|r| r > 1.0);
        let mut row = format!(
            "{:>4} {:>7}{} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}",
            b,
            args.window,
            cc_col(sw),
            col(o.as_ref(), |o| format!("{:.3}", o.rpcs_per_sec / 1e6)),
            col(raw, |r| format!("{:.3}", r.round_trips_per_sec / 1e6)),
            col(ratio, |r| format!(
                "{r:.2}{}",
                if suspect { " (!)" } else { "" }
            )),
            col(o.as_ref(), |o| format!("{:.1}", o.latency_us.median)),
            col(raw, |r| format!("{:.1}", r.median_us)),
            col(o.as_ref(), |o| format!("{:.1}", o.latency_us.p99)),
            col(o.as_ref(), |o| format!("{:.1}", o.latency_us.p99_9)),
        );
        if args.count.is_some() {
            row.push_str(&format!(
                " {:>10} {:>10}",
                col(o.as_ref(), |o| o.completed.to_string()),
                col(raw, |r| r.round_trips.to_string())
            ));
        }
        out.line(&progress, row)?;
        if suspect {
            out.line(
                &progress,
                format!(
                    "(!) B = {b}: eRPC completed RPCs faster than the raw echo moved the \
                     same packets in the same run. The reference does eRPC's packet work \
                     without its protocol work, so the machine's speed changed between the \
                     two (a noisy machine), or erpc-bench has a bug: please report it \
                     with --json output if it repeats on a quiet machine."
                ),
            )?;
        }
        points.push(PointReport {
            point: p,
            mrps: o.as_ref().map(|o| o.rpcs_per_sec / 1e6),
            raw_echo_round_trips_per_sec: raw.map(|r| r.round_trips_per_sec),
            raw_echo_median_us: raw.map(|r| r.median_us),
            raw_echo_round_trips: raw.map(|r| r.round_trips),
            ratio_to_raw_echo: ratio,
            cc: sw.map(|sw| cc_label(sw, args.controller)),
            ratio_above_one: suspect,
            outcome: o,
        });
    }
    let totals = dm.as_ref().map(|d| {
        let s: Vec<_> = d.nics().iter().map(|n| n.stats()).collect();
        NicTotals {
            frames_sent: s.iter().map(|s| s.tx_frames).sum(),
            doorbells: s.iter().map(|s| s.sq_doorbells).sum(),
            send_cqes: s.iter().map(|s| s.tx_cqes).sum(),
            out_of_buffer_drops: d
                .nics()
                .iter()
                .map(|n| n.drops(mlx5_sim::DropReason::OutOfBuffer))
                .sum(),
        }
    });
    if let Some(t) = &totals {
        out.line(
            &progress,
            format!(
                "device model: {} frames sent, {} doorbells, {} send CQEs (1 per 64 sends), \
                 {} out-of-buffer drops",
                t.frames_sent, t.doorbells, t.send_cqes, t.out_of_buffer_drops
            ),
        )?;
    }
    let capture_stats = match &capture {
        Some(c) => {
            if let Some(d) = &dm {
                d.flush_capture()?;
            }
            let s = c.finish().map_err(output_error(c.path()))?;
            eprintln!(
                "wrote {}: {} data frames, {} session-management packets",
                c.path().display(),
                s.data_frames,
                s.sm_frames
            );
            let ports = c.ports();
            if !ports.is_empty() {
                // Kernel UDP picked the ports: tell the dissector.
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                eprintln!(
                    "decode it with: tshark -X lua_script:tools/wireshark/erpc.lua -o erpc.udp_ports:{} -r {}",
                    list.join(","),
                    c.path().display()
                );
            }
            Some(s)
        }
        None => None,
    };
    if let (Some(w), Some(path)) = (csv_out.as_mut(), args.latency_csv.as_deref()) {
        write_latency_csv(w, &points).map_err(output_error(path))?;
    }
    if let (Some(w), Some(path)) = (json_out.as_mut(), args.json.as_deref()) {
        let report = Report {
            tool: "erpc-bench",
            version: env!("CARGO_PKG_VERSION"),
            description: args.transport.describe(),
            settings,
            hugepages: HugepageUse {
                pages_needed: plan.pages,
                small_page_fallback: plan.is_fallback(),
            },
            raw_echo: RawEcho {
                frame_bytes,
                packets_per_rpc_per_direction: per_rpc,
            },
            points,
            device_model: totals,
            capture: capture_stats,
        };
        serde_json::to_writer_pretty(&mut *w, &report)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(w))
            .and_then(|()| w.flush())
            .map_err(output_error(path))?;
    }
    Ok(())
}

/// A column's value, or `-` for the half `--only` left out.
fn col<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or("-".to_string(), f)
}

/// One row per step of each point's latency distribution (hdrhistogram's
/// quantile iteration, 1 tick per half-distance), ready for a plot of
/// latency against percentile.
fn write_latency_csv(w: &mut impl Write, points: &[PointReport]) -> io::Result<()> {
    writeln!(w, "batch,window,size,percentile,latency_us,count")?;
    for p in points {
        let Some(outcome) = &p.outcome else { continue };
        for v in outcome.hist.iter_quantiles(1) {
            writeln!(
                w,
                "{},{},{},{:.6},{:.3},{}",
                p.point.batch,
                p.point.window,
                p.point.size,
                v.quantile_iterated_to() * 100.0,
                v.value_iterated_to() as f64 / 1000.0,
                v.count_since_last_iteration()
            )?;
        }
    }
    w.flush()
}

fn run_large(args: Args) -> Result<(), Quit> {
    use erpc_tools::exp_large::{LARGE_EXP_WINDOW, large_messages, large_sizes};
    refuse_other_options(&args, "large")?;
    device_model_only(&args, "large", "")?;
    let settings = Settings {
        batches: vec![1],
        window: LARGE_EXP_WINDOW,
        size: erpc::MAX_MSG_BYTES,
        ..experiment_settings(&args)?
    };
    settings.validate()?;
    // --size N measures that one size; the default draws the curve.
    let sizes = if args.size == 32 {
        large_sizes()
    } else {
        vec![args.size]
    };
    let max = *sizes.iter().max().expect("at least one size");
    let plan = memory_plan(bench_pages(max, LARGE_EXP_WINDOW, true));
    let progress = Progress::new();
    let mut out = Out(io::stdout());
    out.line(
        &progress,
        format!(
            "erpc-bench large: requests and responses of each size, {LARGE_EXP_WINDOW} in flight \
             per node, one session each way, mlx5 transport on the device model (one thread), \
             {} s per point; memcpy on one core before and after each point",
            args.secs
        ),
    )?;
    out.line(
        &progress,
        format!(
            "{:>9} {:>8} {:>12} {:>22} {:>10}",
            "size", "RPCs", "Gbit/s", "memcpy Gbit/s (b, a)", "/ memcpy"
        ),
    )?;
    let mut pending: Option<Quit> = None;
    let (dur, warmup) = (settings.duration(), settings.warmup());
    let rows = large_messages(&plan, &sizes, dur, warmup, &progress, |r| {
        let line = format!(
            "{:>9} {:>8} {:>12.3} {:>10.1} {:>11.1} {:>10.3}",
            r.size, r.rpcs, r.goodput_gbps, r.memcpy_gbps[0], r.memcpy_gbps[1], r.ratio_to_memcpy
        );
        if let Err(e) = out.line(&progress, line) {
            pending = Some(e);
        }
        Ok(())
    })?;
    if let Some(q) = pending.take() {
        return Err(q);
    }
    #[derive(Serialize)]
    struct Json<'a> {
        experiment: Experiment,
        window: usize,
        rows: &'a [erpc_tools::exp_large::LargeRow],
    }
    write_json(
        args.json.as_deref(),
        &Json {
            experiment: Experiment::Large,
            window: LARGE_EXP_WINDOW,
            rows: &rows,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(argv: &[&str]) -> String {
        let args = parse_args(std::iter::once("erpc-bench").chain(argv.iter().copied()));
        match check_count_and_only(&args) {
            Err(Quit::Err(e @ BenchError::Usage(_))) => e.to_string(),
            Err(Quit::Err(e)) => panic!("{argv:?}: not a usage error: {e}"),
            Err(Quit::Pipe) => panic!("{argv:?}: a pipe error"),
            Ok(()) => panic!("{argv:?}: accepted"),
        }
    }

    fn accepted(argv: &[&str]) -> Args {
        let args = parse_args(std::iter::once("erpc-bench").chain(argv.iter().copied()));
        if let Err(Quit::Err(e)) = check_count_and_only(&args) {
            panic!("{argv:?}: refused: {e}");
        }
        args
    }

    #[test]
    fn count_and_only_are_small_rpc_options_without_timing() {
        let a = accepted(&["--batch", "1,8", "--count", "20000", "--only", "raw-echo"]);
        assert_eq!(a.count, Some(20000));
        assert_eq!(a.only, Some(Only::RawEcho));
        assert!(a.timing_given.is_empty());
        // The defaults of --secs and --warmup are not "given".
        let a = accepted(&["--secs", "0.5", "--warmup", "0"]);
        assert_eq!(a.timing_given, ["--secs", "--warmup"]);
        assert_eq!(a.count, None);
        accepted(&["--only", "erpc"]);
        for (argv, want) in [
            (
                &["--count", "5", "--secs", "1"][..],
                "--secs does not apply",
            ),
            (
                &["--count", "5", "--warmup", "0"],
                "--warmup does not apply",
            ),
            (
                &["--experiment", "factors", "--count", "5"],
                "--count applies to --experiment small-rpc only",
            ),
            (
                &["--experiment", "large", "--only", "erpc"],
                "--only applies to --experiment small-rpc only",
            ),
        ] {
            let m = refused(argv);
            assert!(m.contains(want), "{argv:?}: {m}");
        }
    }
}
