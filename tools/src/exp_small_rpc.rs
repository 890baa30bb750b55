//! `erpc-bench` with no subcommand, the project's main job: small-RPC rate
//! and latency against a raw echo of the same packets over the same
//! transport (the paper's Figure 4 setup on two nodes), on the device
//! model by default. The measurement itself is [`crate::bench`]; this is
//! its command line, its table and its JSON and CSV output.
//!
//! Two nodes, each both client and server, requests and responses of
//! `--size` bytes, B requests per batch with at most `--window` in flight
//! per node. Every point also measures a raw echo of eRPC-sized packets
//! over the same transport and reports eRPC's packet rate as a ratio to
//! it. `--count N` stops each point and each reference after N RPCs /
//! round trips instead of after `--secs`, and `--only erpc` / `--only
//! raw-echo` runs one half (`tools/bench-callgrind.sh` uses both);
//! `--threads N` runs one Rpc per thread instead ([`crate::exp_threads`]).

use std::io::{self, Write};
use std::path::PathBuf;

use clap::ArgMatches;
use clap::parser::ValueSource;
use erpc::CcConfig;
use erpc::RpcConfig;
use serde::Serialize;

use crate::bench::{
    DeviceModel, Knobs, Outcome, Point, Progress, RawEcho as RawEchoRun, Settings, Stop, Vfio,
    Which, erpc_until, packets_per_direction, ratio_to_raw, raw_echo_data_bytes, raw_echo_on,
    udp_erpc_with, udp_raw_echo,
};
use crate::capture::{Capture, CaptureStats};
use crate::cli::{
    CcController, JsonOut, Out, Quit, Shape, Timing, create, memory_plan, output_error, usage,
    write_json_to,
};
use crate::memory::{MemoryPlan, bench_pages};

/// Congestion control of the main job's eRPC points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CcSwitch {
    /// On, with `--controller`'s rate controller, over every transport
    /// (over kernel UDP too, where it is off by default).
    On,
    /// Off: no rate control, no pacing, no timing wheel.
    Off,
}

/// Which half of each point `--only` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Only {
    /// The eRPC points, without their raw-echo references.
    Erpc,
    /// The raw-echo references, without the eRPC points.
    RawEcho,
}

/// The main job's flags: small-RPC rate and latency against a raw echo.
#[derive(Debug, Clone, clap::Args)]
pub struct SmallRpcArgs {
    /// Transport.
    #[arg(long, value_enum, default_value = "mlx5-sim")]
    pub transport: Which,
    /// Batch sizes B to measure (comma separated), each 1..=window.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 3, 8, 16])]
    pub batch: Vec<usize>,
    #[command(flatten)]
    pub shape: Shape,
    /// PCI address of the ConnectX for `--transport mlx5` (bind it first
    /// with `erpc-vfio bind`).
    #[arg(long)]
    pub pci: Option<String>,
    #[command(flatten)]
    pub timing: Timing,
    /// Stop each point, and each raw-echo reference, once N RPCs / round
    /// trips have completed (both nodes, checked every 64 event-loop
    /// rounds; the table's last columns say how many) instead of after
    /// --secs, with no warm-up: no wall clock decides anything, so on the
    /// device model a run is a fixed amount of work (instruction counts:
    /// tools/bench-callgrind.sh).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Congestion control of the eRPC points: `on` (with `--controller`),
    /// `off`, or both, `--cc on,off`: each B is then measured with each
    /// setting in turn against the same reference, one row each, in the
    /// same run. Default: the transport's own default (on for the mlx5
    /// transport, off over kernel UDP, whose round trips are set by the
    /// kernel's socket queues; see README).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "on|off")]
    pub cc: Vec<CcSwitch>,
    /// Rate controller of the `--cc on` rows: Timely (the default, the
    /// facts sheet's constants) or the delay-target controller
    /// (`erpc::CcConfig::swift()`: every packet paced).
    #[arg(long, value_enum)]
    pub controller: Option<CcController>,
    /// Measure only the eRPC points or only their raw-echo references
    /// (the other columns show `-`).
    #[arg(long, value_enum, value_name = "SIDE")]
    pub only: Option<Only>,
    /// Frame loss probability on each device-model link while the eRPC
    /// points run (eRPC's loss recovery repairs it). The raw-echo
    /// references run lossless: they have no loss recovery, so the ratio
    /// is eRPC under loss against the lossless bare transport.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub loss: f64,
    /// One Rpc per core: run each point at one thread and at N threads,
    /// thread i owning Rpc i of both nodes (its own queue set and flow rule
    /// on each device-model NIC, or its own UDP sockets), and print each
    /// thread's rate, the total and the scaling efficiency against one
    /// thread (`--transport mlx5-sim` or `udp`).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Capture the eRPC runs (data and session-management packets) into a
    /// pcap file; decode it with tools/wireshark/erpc.lua. Device model
    /// and kernel UDP; slows the run, so keep --secs short.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Expose the run on the debug endpoint, for `erpc-inspect PID` (the
    /// NICs and both nodes' Nexuses and Rpcs; ERPC_INSPECT=1 does the same).
    #[arg(long)]
    pub inspect: bool,
    /// Also write the results (settings, every point, queue snapshots) as
    /// JSON.
    #[command(flatten)]
    pub out: JsonOut,
    /// Write each point's latency distribution as CSV (batch, window,
    /// size, percentile, latency_us, count).
    #[arg(long, value_name = "FILE")]
    pub latency_csv: Option<PathBuf>,
    /// The timing options given on the command line (not defaults), for
    /// refusing them with --count: see [`SmallRpcArgs::note_given`].
    #[arg(skip)]
    pub timing_given: Vec<&'static str>,
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

impl SmallRpcArgs {
    /// Records which timing options `m` (the parsed command line) had
    /// given rather than defaulted, for refusing them with `--count`.
    pub fn note_given(&mut self, m: &ArgMatches) {
        self.timing_given = [("secs", "--secs"), ("warmup", "--warmup")]
            .into_iter()
            .filter(|(id, _)| m.value_source(id) == Some(ValueSource::CommandLine))
            .map(|(_, flag)| flag)
            .collect();
    }

    /// Refuses the combinations that cannot mean what they say: more than
    /// one `--cc` with one latency file, `--loss` without eRPC points,
    /// timing options with `--count`, `--controller` without `--cc on`.
    pub fn check(&self) -> Result<(), Quit> {
        if self.cc.len() > 1 && self.latency_csv.is_some() {
            return usage(
                "--latency-csv keeps one distribution per B: give --cc one setting per run".into(),
            );
        }
        if self.only == Some(Only::RawEcho) && self.loss > 0.0 {
            return usage(
                "--loss applies to the eRPC points, which --only raw-echo leaves out (the raw \
                 echo has no loss recovery and always runs lossless)"
                    .into(),
            );
        }
        if let (Some(n), Some(flag)) = (self.count, self.timing_given.first()) {
            return usage(format!(
                "--count {n} stops each point after {n} RPCs, with no warm-up: \
                 {flag} does not apply"
            ));
        }
        if self.controller.is_some() && !self.cc.contains(&CcSwitch::On) {
            return usage(
                "--controller chooses the rate controller of --cc on: give --cc on (or on,off) \
                 with it"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks the flags and runs the main job (or `--threads`), printing
    /// its table.
    pub fn run(&self) -> Result<(), Quit> {
        self.check()?;
        if let Some(n) = self.threads {
            return self.run_threads(n);
        }
        let settings = self.settings();
        settings.validate()?;
        MainJob::new(self, settings)?.run()
    }

    fn settings(&self) -> Settings {
        Settings {
            transport: self.transport,
            batches: self.batch.clone(),
            window: self.shape.window,
            size: self.shape.size,
            secs: self.timing.secs,
            warmup_secs: self.timing.warmup,
            pci: self.pci.clone(),
            pcap: self.pcap.clone(),
            loss: self.loss,
            count: self.count,
        }
    }

    /// `--threads N`: see [`crate::exp_threads`].
    fn run_threads(&self, n: usize) -> Result<(), Quit> {
        use crate::exp_threads::{ThreadsOn, report, run_threads};
        let on = match self.transport {
            Which::Mlx5Sim => ThreadsOn::DeviceModel,
            Which::Udp => ThreadsOn::Udp,
            Which::Mlx5 => {
                return usage(
                    "--threads runs on the device model or kernel UDP (--transport mlx5-sim or \
                     udp)"
                        .into(),
                );
            }
        };
        if !(1..=64).contains(&n) {
            return usage(format!("--threads {n}: must be 1 to 64"));
        }
        for (flag, given) in [
            ("--count", self.count.is_some()),
            ("--only", self.only.is_some()),
            ("--pcap", self.pcap.is_some()),
            ("--latency-csv", self.latency_csv.is_some()),
            ("--loss", self.loss != 0.0),
            ("--inspect", self.inspect),
            ("--cc", !self.cc.is_empty()),
        ] {
            if given {
                return usage(format!("{flag} does not apply with --threads"));
            }
        }
        let settings = Settings {
            pci: None,
            pcap: None,
            loss: 0.0,
            count: None,
            ..self.settings()
        };
        settings.validate()?;
        let Shape { window, size } = self.shape;
        let nics = self.transport != Which::Udp;
        // Each thread's two Rpcs hold a node's buffers; the NICs' queue sets
        // one RX ring each.
        let plan = memory_plan(n as u64 * bench_pages(size, window, nics));
        let secs = std::time::Duration::from_secs_f64(self.timing.secs);
        let warmup = std::time::Duration::from_secs_f64(self.timing.warmup);
        let rows = run_threads(on, n, &self.batch, (window, size), (secs, warmup), &plan)?;
        print!("{}", report(on, &rows, window, size, secs));
        self.out.write(&rows)
    }

    /// The Rpcs' settings of a point with `--cc` setting `sw` (`None`:
    /// the defaults, congestion control as the transport wants it).
    fn rpc_config(&self, sw: Option<CcSwitch>) -> RpcConfig {
        let mut cfg = RpcConfig::default();
        match sw {
            None => {}
            Some(CcSwitch::Off) => cfg.cc = CcConfig::disabled(),
            Some(CcSwitch::On) => {
                cfg.cc = self.controller().config();
                // Over kernel UDP too.
                cfg.cc.on_software_stack = true;
            }
        }
        cfg
    }

    fn controller(&self) -> CcController {
        self.controller.unwrap_or(CcController::Timely)
    }

    /// The `cc` column: `off`, or the controller that is on.
    fn cc_label(&self, sw: CcSwitch) -> &'static str {
        match (sw, self.controller()) {
            (CcSwitch::Off, _) => "off",
            (CcSwitch::On, CcController::Timely) => "timely",
            (CcSwitch::On, CcController::Swift) => "swift",
        }
    }
}

/// One run of the main job: its outputs (opened before anything runs, so
/// a bad path fails at once) and its testbed.
struct MainJob<'a> {
    args: &'a SmallRpcArgs,
    settings: Settings,
    json_out: Option<io::BufWriter<std::fs::File>>,
    csv_out: Option<io::BufWriter<std::fs::File>>,
    capture: Option<Capture>,
    plan: MemoryPlan,
    progress: Progress,
    out: Out,
    inspect: bool,
    /// The device model, for `--transport mlx5-sim`.
    dm: Option<DeviceModel>,
    /// The ConnectX, for `--transport mlx5`; kernel UDP has neither.
    hw: Option<Vfio>,
}

impl<'a> MainJob<'a> {
    /// Opens the outputs and brings up the testbed.
    fn new(args: &'a SmallRpcArgs, settings: Settings) -> Result<MainJob<'a>, Quit> {
        let json_out = args.out.json.as_deref().map(create).transpose()?;
        let csv_out = args.latency_csv.as_deref().map(create).transpose()?;
        let capture = match &args.pcap {
            Some(p) => Some(Capture::create(p).map_err(output_error(p))?),
            None => None,
        };
        let nics = args.transport != Which::Udp;
        let plan = memory_plan(bench_pages(args.shape.size, args.shape.window, nics));
        if let Some(c) = &capture {
            eprintln!(
                "capturing the eRPC runs into {} (rates measured while capturing are not \
                 representative)",
                c.path().display()
            );
        }
        let inspect = args.inspect || debug_endpoint::env_enabled();
        if inspect {
            announce_debug_endpoint();
        }
        let dm = match args.transport {
            Which::Mlx5Sim => Some(DeviceModel::new(plan.clone(), capture.clone(), inspect)?),
            _ => None,
        };
        let hw = match (&args.transport, &args.pci) {
            (Which::Mlx5, Some(bdf)) => Some(Vfio::open(bdf, plan.clone(), inspect)?),
            _ => None,
        };
        Ok(MainJob {
            args,
            settings,
            json_out,
            csv_out,
            capture,
            plan,
            progress: Progress::new(),
            out: Out::default(),
            inspect,
            dm,
            hw,
        })
    }

    /// Every point's reference first, then every eRPC point (one row per B
    /// and `--cc` setting), then the totals and the output files.
    fn run(mut self) -> Result<(), Quit> {
        let args = self.args;
        let (run_erpc, run_raw) = (
            args.only != Some(Only::RawEcho),
            args.only != Some(Only::Erpc),
        );
        self.intro()?;
        // Each point's reference, with its B, before anything is captured
        // (a capture holds eRPC's packets only).
        let mut raws: Vec<Option<RawEchoRun>> = Vec::with_capacity(args.batch.len());
        for &b in &args.batch {
            raws.push(if run_raw {
                Some(self.raw_echo(self.point(b))?)
            } else {
                None
            });
        }
        if let Some(d) = &self.dm {
            // Loss from here on: the eRPC points recover from it, the raw
            // echo above could not (a lost frame would stall its window for
            // good).
            d.set_loss(args.loss);
            d.start_capture()?;
        }
        // One eRPC row per B and `--cc` setting (one, the transport's
        // default, without `--cc`).
        let ccs: Vec<Option<CcSwitch>> = if args.cc.is_empty() {
            vec![None]
        } else {
            args.cc.iter().copied().map(Some).collect()
        };
        let mut points = Vec::new();
        for ((&b, &raw), &sw) in args
            .batch
            .iter()
            .zip(&raws)
            .flat_map(|br| ccs.iter().map(move |sw| (br, sw)))
        {
            let p = self.point(b);
            let o = if run_erpc {
                Some(self.erpc(p, sw)?)
            } else {
                None
            };
            points.push(self.row(p, sw, o, raw)?);
        }
        self.finish(points)
    }

    fn point(&self, batch: usize) -> Point {
        Point {
            batch,
            window: self.args.shape.window,
            size: self.args.shape.size,
            min_rpcs: 0,
        }
    }

    fn stop(&self) -> Stop {
        self.settings.stop()
    }

    /// The raw-echo reference of point `p`.
    fn raw_echo(&self, p: Point) -> Result<RawEchoRun, Quit> {
        let (stop, progress) = (self.stop(), &self.progress);
        Ok(match (&self.dm, &self.hw) {
            (Some(d), _) => raw_echo_on(d, p, stop, progress)?,
            (_, Some(h)) => raw_echo_on(h, p, stop, progress)?,
            _ => udp_raw_echo(&self.plan, p, stop, progress)?,
        })
    }

    /// The eRPC point `p` with `--cc` setting `sw`.
    fn erpc(&self, p: Point, sw: Option<CcSwitch>) -> Result<Outcome, Quit> {
        let (stop, progress) = (self.stop(), &self.progress);
        let knobs = Knobs {
            rpc: self.args.rpc_config(sw),
            ..Knobs::default()
        };
        Ok(match (&self.dm, &self.hw) {
            (Some(d), _) => erpc_until(d, &knobs, p, stop, progress)?,
            (_, Some(h)) => erpc_until(h, &knobs, p, stop, progress)?,
            _ => udp_erpc_with(
                &self.plan,
                p,
                stop,
                progress,
                self.capture.as_ref(),
                self.inspect,
                knobs.rpc,
            )?,
        })
    }

    /// The lines above the table: what runs, what the reference is, and
    /// the table's header.
    fn intro(&mut self) -> Result<(), Quit> {
        let args = self.args;
        let size = args.shape.size;
        let per_point = match args.count {
            None => format!("{} s per point", args.timing.secs),
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
        self.out.line(
            &self.progress,
            format!(
                "erpc-bench: {size}-byte RPCs, {}, {per_point}{only}",
                args.transport.describe(),
            ),
        )?;
        let frame_bytes = transport::PKTHDR_BYTES + raw_echo_data_bytes(size);
        let per_rpc = packets_per_direction(size);
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
                "\n(a {size}-byte RPC is {per_rpc} packets each way: requests and requests for \
                 response one way, credit returns and responses back; a raw round trip is the \
                 same {per_rpc} frames each way, of eRPC's sizes (up to {frame_bytes} bytes), \
                 each answered on arrival, with as many unanswered as eRPC's session credits \
                 allow)"
            ));
        }
        if args.loss > 0.0 {
            line.push_str(&format!(
                "\n(--loss {}: the eRPC points only; the raw echo has no loss recovery and runs \
                 lossless, so `/ raw echo` is eRPC under loss against the lossless transport)",
                args.loss
            ));
        }
        self.out.line(&self.progress, line)?;
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
        self.out.line(&self.progress, header)
    }

    /// Prints the table's row of point `p` (and the warning of a ratio
    /// above 1), and returns it for the JSON.
    fn row(
        &mut self,
        p: Point,
        sw: Option<CcSwitch>,
        o: Option<Outcome>,
        raw: Option<RawEchoRun>,
    ) -> Result<PointReport, Quit> {
        let args = self.args;
        let ratio = match (&o, &raw) {
            (Some(o), Some(raw)) => ratio_to_raw(o.rpcs_per_sec, raw.round_trips_per_sec),
            _ => None,
        };
        // The reference moves eRPC's packets, with at least eRPC's
        // parallelism, without eRPC: above 1.0, something other than eRPC
        // made the difference.
        let suspect = ratio.is_some_and(|r| r > 1.0);
        let cc_col = match sw {
            None => String::new(),
            Some(sw) => format!(" {:>6}", args.cc_label(sw)),
        };
        let mut row = format!(
            "{:>4} {:>7}{} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}",
            p.batch,
            p.window,
            cc_col,
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
        self.out.line(&self.progress, row)?;
        if suspect {
            self.out.line(
                &self.progress,
                format!(
                    "(!) B = {}: eRPC completed RPCs faster than the raw echo moved the \
                     same packets in the same run. The reference does eRPC's packet work \
                     without its protocol work, so the machine's speed changed between the \
                     two (a noisy machine), or erpc-bench has a bug: please report it \
                     with --json output if it repeats on a quiet machine.",
                    p.batch
                ),
            )?;
        }
        Ok(PointReport {
            point: p,
            mrps: o.as_ref().map(|o| o.rpcs_per_sec / 1e6),
            raw_echo_round_trips_per_sec: raw.map(|r| r.round_trips_per_sec),
            raw_echo_median_us: raw.map(|r| r.median_us),
            raw_echo_round_trips: raw.map(|r| r.round_trips),
            ratio_to_raw_echo: ratio,
            cc: sw.map(|sw| args.cc_label(sw)),
            ratio_above_one: suspect,
            outcome: o,
        })
    }

    /// The device model's totals, the capture's, and the output files.
    fn finish(mut self, points: Vec<PointReport>) -> Result<(), Quit> {
        let args = self.args;
        let totals = self.dm.as_ref().map(nic_totals);
        if let Some(t) = &totals {
            self.out.line(
                &self.progress,
                format!(
                    "device model: {} frames sent, {} doorbells, {} send CQEs (1 per 64 \
                     sends), {} out-of-buffer drops",
                    t.frames_sent, t.doorbells, t.send_cqes, t.out_of_buffer_drops
                ),
            )?;
        }
        let capture_stats = self.finish_capture()?;
        if let (Some(w), Some(path)) = (self.csv_out.as_mut(), args.latency_csv.as_deref()) {
            write_latency_csv(w, &points).map_err(output_error(path))?;
        }
        if let (Some(w), Some(path)) = (self.json_out.as_mut(), args.out.json.as_deref()) {
            let size = args.shape.size;
            let report = Report {
                tool: "erpc-bench",
                version: env!("CARGO_PKG_VERSION"),
                description: args.transport.describe(),
                settings: self.settings,
                hugepages: HugepageUse {
                    pages_needed: self.plan.pages,
                    small_page_fallback: self.plan.is_fallback(),
                },
                raw_echo: RawEcho {
                    frame_bytes: transport::PKTHDR_BYTES + raw_echo_data_bytes(size),
                    packets_per_rpc_per_direction: packets_per_direction(size),
                },
                points,
                device_model: totals,
                capture: capture_stats,
            };
            write_json_to(w, path, &report)?;
        }
        Ok(())
    }

    /// Closes the capture, and says on stderr what it holds and how to
    /// decode it.
    fn finish_capture(&self) -> Result<Option<CaptureStats>, Quit> {
        let Some(c) = &self.capture else {
            return Ok(None);
        };
        if let Some(d) = &self.dm {
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
        Ok(Some(s))
    }
}

/// Says where the debug endpoint listens, or why it cannot; the socket
/// goes with the process on SIGTERM/SIGINT/SIGHUP too.
fn announce_debug_endpoint() {
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

/// The device model's NICs' counters, summed.
fn nic_totals(d: &DeviceModel) -> NicTotals {
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;
    use crate::bench::BenchError;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: SmallRpcArgs,
    }

    fn parse(argv: &[&str]) -> SmallRpcArgs {
        let m = Cli::command()
            .get_matches_from(std::iter::once("erpc-bench").chain(argv.iter().copied()));
        let mut a = Cli::from_arg_matches(&m).expect("parses").args;
        a.note_given(&m);
        a
    }

    fn refused(argv: &[&str]) -> String {
        match parse(argv).check() {
            Err(Quit::Err(e @ BenchError::Usage(_))) => e.to_string(),
            Err(Quit::Err(e)) => panic!("{argv:?}: not a usage error: {e}"),
            Err(Quit::Pipe) => panic!("{argv:?}: a pipe error"),
            Ok(()) => panic!("{argv:?}: accepted"),
        }
    }

    fn accepted(argv: &[&str]) -> SmallRpcArgs {
        let args = parse(argv);
        if let Err(Quit::Err(e)) = args.check() {
            panic!("{argv:?}: refused: {e}");
        }
        args
    }

    #[test]
    fn a_counted_run_takes_no_timing_options() {
        let a = accepted(&["--batch", "1,8", "--count", "20000", "--only", "raw-echo"]);
        assert_eq!(a.count, Some(20000));
        assert_eq!(a.only, Some(Only::RawEcho));
        assert!(a.timing_given.is_empty());
        // The defaults of --secs and --warmup are not "given".
        let a = accepted(&["--secs", "0.5", "--warmup", "0"]);
        assert_eq!(a.timing_given, ["--secs", "--warmup"]);
        assert_eq!(a.count, None);
        accepted(&["--only", "erpc"]);
        accepted(&["--cc", "on", "--controller", "swift"]);
        for (argv, want) in [
            (
                &["--count", "5", "--secs", "1"][..],
                "--secs does not apply",
            ),
            (
                &["--count", "5", "--warmup", "0"],
                "--warmup does not apply",
            ),
            (&["--controller", "swift"], "give --cc on"),
            (&["--cc", "off", "--controller", "timely"], "give --cc on"),
        ] {
            let m = refused(argv);
            assert!(m.contains(want), "{argv:?}: {m}");
        }
    }
}
