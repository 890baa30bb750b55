//! The experiment around the simulation: its settings from the command
//! line (`erpc-bench incast`), the uncongested reference, the table and
//! the report.

use erpc::CcConfig;
use serde::Serialize;

use super::{IncastConfig, IncastResult, max_goodput_fraction, run_incast};
use crate::bench::{BenchError, Progress};
use crate::cli::{CcController, JsonOut, Out, Quit, SimNetwork, usage};

/// Settings of `erpc-bench incast`.
#[derive(Debug, Clone, Serialize)]
pub struct IncastExperiment {
    /// Sender counts, one row pair (CC on, CC off) each.
    pub senders: Vec<usize>,
    /// Switch buffer per output port, bytes.
    pub buffer_bytes: u64,
    /// Link rate, Gbit/s.
    pub link_gbps: f64,
    /// One-way propagation delay of every link, ns.
    pub delay_ns: u64,
    /// Timely's constants of the CC-on rows.
    #[serde(skip)]
    pub cc: CcConfig,
    /// Timely's T_low and T_high of the CC-on rows, µs.
    pub t_low_us: f64,
    /// See `t_low_us`.
    pub t_high_us: f64,
    /// Timely's minimum RTT of the CC-on rows (the gradient's unit), µs.
    pub min_rtt_us: f64,
    /// The wheel bypass of the CC-on rows (off: every client packet is
    /// paced, also at link rate).
    pub wheel_bypass: bool,
    /// The CC-on rows' pace window (`CcConfig::pace_window`, 0: none).
    pub pace_window: u16,
    /// The CC-on rows' wheel slot width, ns.
    pub wheel_slot_ns: u64,
    /// The CC-on rows' rate controller (`Timely` or `Swift`).
    pub controller: String,
    /// The delay-target controller's constants, when it is the one.
    pub swift: Option<SwiftSettings>,
}

/// The delay-target controller's constants (`erpc::SwiftParams`), for
/// the report.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SwiftSettings {
    /// Queueing allowed above the base RTT, µs (at least).
    pub headroom_us: f64,
    /// ... and at least this many bytes at the link rate.
    pub headroom_bytes: f64,
    /// Most flow scaling added to the target, µs.
    pub fs_range_us: f64,
    /// Cap of the base RTT, µs.
    pub max_base_rtt_us: f64,
    /// Additive increase per RTT, MB/s.
    pub ai_mbps: f64,
    /// ... at most this fraction of the rate.
    pub ai_frac: f64,
    /// Decrease factor of the excess over the target.
    pub beta: f64,
    /// Largest decrease in one step.
    pub max_mdf: f64,
    /// Gain of the queue-gradient term (0: off).
    pub grad_gain: f64,
    /// The target's decrease is held while the RTT falls.
    pub hold_while_falling: bool,
}

impl From<erpc::SwiftParams> for SwiftSettings {
    fn from(p: erpc::SwiftParams) -> SwiftSettings {
        SwiftSettings {
            headroom_us: p.headroom_us,
            headroom_bytes: p.headroom_bytes,
            fs_range_us: p.fs_range_us,
            max_base_rtt_us: p.max_base_rtt_us,
            ai_mbps: p.ai_rate / 1e6,
            ai_frac: p.ai_frac,
            beta: p.beta,
            max_mdf: p.max_mdf,
            grad_gain: p.grad_gain,
            hold_while_falling: p.hold_while_falling,
        }
    }
}

/// What `erpc-bench incast` measured.
#[derive(Debug, Clone, Serialize)]
pub struct IncastReport {
    /// The settings.
    pub settings: IncastExperiment,
    /// Best possible goodput fraction (header and wire overhead).
    pub max_goodput_fraction: f64,
    /// The small RPCs alone (no bulk senders).
    pub uncongested: IncastResult,
    /// One row per sender count and CC setting.
    pub rows: Vec<IncastResult>,
}

/// The table header of [`row_line`].
pub fn header_line() -> String {
    format!(
        "{:>4} {:>4} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>11} {:>7} {:>7} {:>6} {:>11}",
        "N",
        "CC",
        "all/lnk",
        "ss/lnk",
        "p50 µs",
        "p99 µs",
        "p99/unc",
        "allp99",
        "maxq KiB",
        "ssmaxqKiB",
        "ssmeanqKiB",
        "drops",
        "ssdrops",
        "rtx",
        "rate Gb/s"
    )
}

/// One row of the table.
pub fn row_line(r: &IncastResult, uncongested_p99_us: f64) -> String {
    let kb = |b: f64| b / 1024.0;
    format!(
        "{:>4} {:>4} {:>7.3} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.0} {:>10.0} {:>11.0} {:>7} {:>7} {:>6} {:>11}",
        r.senders,
        if r.cc { "on" } else { "off" },
        r.goodput_fraction,
        r.steady_fraction.map_or("-".into(), |f| format!("{f:.3}")),
        r.small_p50_us,
        r.small_p99_us,
        r.small_p99_us / uncongested_p99_us.max(1e-9),
        r.small_all_p99_us,
        kb(r.queue_max_bytes as f64),
        kb(r.queue_max_steady_bytes as f64),
        kb(r.queue_mean_bytes),
        r.drops,
        r.drops_steady,
        r.retransmissions,
        if r.cc {
            format!("{:.2}-{:.2}", r.rate_min_gbps, r.rate_max_gbps)
        } else {
            "-".into()
        }
    )
}

/// Runs the reference and every row; `line` gets each line of the table
/// as it is measured.
pub fn incast_experiment(
    e: &IncastExperiment,
    mut line: impl FnMut(String) -> Result<(), BenchError>,
) -> Result<IncastReport, BenchError> {
    let uncongested = run_incast(
        &IncastConfig::new(0, e.cc, e.buffer_bytes)
            .with_link(e.link_gbps)
            .with_delay(e.delay_ns),
    )?;
    line(format!(
        "uncongested small RPCs ({} B, alone): p50 {:.2} µs, p99 {:.2} µs over {} RPCs",
        IncastConfig::new(0, e.cc, 0).small_bytes,
        uncongested.small_p50_us,
        uncongested.small_p99_us,
        uncongested.small_rpcs
    ))?;
    line(header_line())?;
    let mut rows = Vec::new();
    for &n in &e.senders {
        for cc in [e.cc, CcConfig::disabled()] {
            let r = run_incast(
                &IncastConfig::new(n, cc, e.buffer_bytes)
                    .with_link(e.link_gbps)
                    .with_delay(e.delay_ns),
            )?;
            line(row_line(&r, uncongested.small_p99_us))?;
            rows.push(r);
        }
    }
    Ok(IncastReport {
        settings: e.clone(),
        max_goodput_fraction: max_goodput_fraction(),
        uncongested,
        rows,
    })
}

/// `erpc-bench incast`: N-to-1 incast of 1 MB requests on the simulated
/// network (virtual time), with small RPCs from an uncongested sender;
/// congestion control on and off.
#[derive(Debug, Clone, clap::Args)]
pub struct IncastArgs {
    /// Sender counts (comma separated, each 1 to 1000).
    #[arg(long, value_delimiter = ',', default_values_t = vec![10, 20, 50, 100])]
    pub senders: Vec<usize>,
    #[command(flatten)]
    pub net: SimNetwork,
    /// Rate controller of the CC-on rows: Timely (the facts sheet's
    /// constants) or the delay-target controller
    /// (`erpc::CcConfig::swift()`: every packet paced).
    #[arg(long, value_enum, default_value = "timely")]
    pub controller: CcController,
    /// Timely's T_low in µs (default: the C++ eRPC's 50).
    #[arg(long)]
    pub t_low_us: Option<f64>,
    /// Timely's T_high in µs (default 1000).
    #[arg(long)]
    pub t_high_us: Option<f64>,
    /// Timely's minimum RTT in µs, the unit of its gradient (default 2).
    #[arg(long)]
    pub min_rtt_us: Option<f64>,
    /// Pace every client packet through the timing wheel, also at link
    /// rate (the wheel bypass off), in the CC-on rows.
    #[arg(long)]
    pub pace_all: bool,
    /// Most packets a client slot keeps in the timing wheel at once in the
    /// CC-on rows (0: no limit; default: the controller's preset, 0 for
    /// Timely).
    #[arg(long)]
    pub pace_window: Option<u16>,
    /// Delay-target controller: queueing allowed above the base RTT, µs
    /// (default 1; the headroom is the larger of this and 3 KiB at the
    /// link rate).
    #[arg(long)]
    pub headroom_us: Option<f64>,
    /// Delay-target controller: most flow scaling added to the target at
    /// the minimum rate, µs (default 2; 0 switches it off).
    #[arg(long)]
    pub fs_range_us: Option<f64>,
    /// Delay-target controller: additive increase per RTT, MB/s (default
    /// 10).
    #[arg(long)]
    pub ai_mbps: Option<f64>,
    /// Delay-target controller: gain of the queue-gradient term (default
    /// 0.3; 0 switches it off and holds the decrease while the RTT falls,
    /// the controller before the gradient term).
    #[arg(long)]
    pub grad_gain: Option<f64>,
    /// Width of a timing-wheel slot in ns for the CC-on rows (default: the
    /// controller's preset, 500 for Timely, 100 for the delay-target
    /// controller).
    #[arg(long)]
    pub wheel_slot_ns: Option<u64>,
    /// Delay-target controller: multiplicative decrease factor β
    /// (default 0.1).
    #[arg(long)]
    pub md_beta: Option<f64>,
    /// Delay-target controller: additive increase per RTT at most this
    /// fraction of the rate (default 0.005; 0: no limit).
    #[arg(long)]
    pub ai_frac: Option<f64>,
    #[command(flatten)]
    pub out: JsonOut,
}

impl IncastArgs {
    /// Checks the flags and runs the experiment, printing its table.
    pub fn run(&self) -> Result<(), Quit> {
        let e = self.experiment()?;
        let progress = Progress::new();
        let mut out = Out::default();
        out.line(&progress, intro(&e, self.net.buffer_kib))?;
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
        self.out.write(&report)
    }

    /// The network's settings, checked.
    fn check_network(&self) -> Result<(), Quit> {
        if self.senders.is_empty() || self.senders.iter().any(|&n| n == 0 || n > 1000) {
            return usage("--senders: each 1 to 1000".into());
        }
        if !(1..=1 << 20).contains(&self.net.buffer_kib) {
            return usage(format!(
                "--buffer-kib {}: must be 1 to 1048576",
                self.net.buffer_kib
            ));
        }
        self.net.check_link_gbps()?;
        if self.net.link_delay_ns > 1_000_000 {
            return usage(format!(
                "--link-delay-ns {}: must be at most 1000000",
                self.net.link_delay_ns
            ));
        }
        Ok(())
    }

    /// The CC-on rows' congestion control: the controller's preset with the
    /// flags given, checked.
    fn cc_config(&self) -> Result<CcConfig, Quit> {
        let mut cc = self.controller.config();
        if let Some(t) = self.headroom_us {
            cc.swift.headroom_us = t;
        }
        if let Some(t) = self.fs_range_us {
            cc.swift.fs_range_us = t;
        }
        if let Some(r) = self.ai_mbps {
            cc.swift.ai_rate = r * 1e6;
        }
        if let Some(b) = self.md_beta {
            cc.swift.beta = b;
        }
        if let Some(f) = self.ai_frac {
            cc.swift.ai_frac = f;
        }
        if let Some(g) = self.grad_gain {
            cc.swift.grad_gain = g;
            cc.swift.hold_while_falling = g == 0.0;
        }
        if let Some(w) = self.wheel_slot_ns {
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
                "--headroom-us and --fs-range-us must be >= 0, --ai-mbps > 0, --md-beta in \
                 (0, 1], --grad-gain in [0, 1], --wheel-slot-ns 10 to 10000"
                    .into(),
            );
        }
        if let Some(t) = self.t_low_us {
            cc.timely.t_low_us = t;
        }
        if let Some(t) = self.t_high_us {
            cc.timely.t_high_us = t;
        }
        if let Some(t) = self.min_rtt_us {
            cc.timely.min_rtt_us = t;
        }
        if self.pace_all {
            cc.wheel_bypass = false;
        }
        if let Some(w) = self.pace_window {
            cc.pace_window = w;
        }
        if !(cc.timely.min_rtt_us..=cc.timely.t_high_us).contains(&cc.timely.t_low_us) {
            return usage(format!(
                "Timely: need min RTT ({} µs) <= T_low ({} µs) <= T_high ({} µs)",
                cc.timely.min_rtt_us, cc.timely.t_low_us, cc.timely.t_high_us
            ));
        }
        Ok(cc)
    }

    /// The experiment the flags describe, checked.
    fn experiment(&self) -> Result<IncastExperiment, Quit> {
        self.check_network()?;
        let cc = self.cc_config()?;
        Ok(IncastExperiment {
            senders: self.senders.clone(),
            buffer_bytes: self.net.buffer_kib * 1024,
            link_gbps: self.net.link_gbps,
            delay_ns: self.net.link_delay_ns,
            cc,
            t_low_us: cc.timely.t_low_us,
            t_high_us: cc.timely.t_high_us,
            min_rtt_us: cc.timely.min_rtt_us,
            wheel_bypass: cc.wheel_bypass,
            pace_window: cc.pace_window,
            wheel_slot_ns: cc.wheel_slot_ns,
            controller: format!("{:?}", cc.controller),
            swift: (cc.controller == erpc::Controller::Swift).then_some(cc.swift.into()),
        })
    }
}

/// The line that opens the table: the experiment's settings.
fn intro(e: &IncastExperiment, buffer_kib: u64) -> String {
    let controller = match e.swift {
        None => format!(
            "Timely T_low {} µs / T_high {} µs / min RTT {} µs",
            e.t_low_us, e.t_high_us, e.min_rtt_us
        ),
        Some(s) => format!(
            "delay-target controller: headroom max({} µs, {} B at link rate), flow scaling up \
             to {} µs, base RTT at most {} µs, increase per RTT min({} MB/s, {} x rate), \
             decrease {} x excess / target (at most {}{}), gradient gain {}",
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
    };
    format!(
        "erpc-bench incast: N senders x 1 MB requests (2 in flight each) to one receiver, plus \
         32-byte RPCs from one uncongested sender; {} Gbit/s links ({} ns one way), {} KiB \
         switch buffer per port, {controller}, wheel bypass {}, pace window {}, wheel slot {} \
         ns; simulated network, virtual time (best goodput / link: {:.3})",
        e.link_gbps,
        e.delay_ns,
        buffer_kib,
        if e.wheel_bypass { "on" } else { "off" },
        e.pace_window,
        e.wheel_slot_ns,
        max_goodput_fraction()
    )
}
