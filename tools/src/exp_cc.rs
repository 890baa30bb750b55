//! `erpc-bench cc-overhead`: what congestion control costs
//! when the network is not congested — the small-RPC rate with Timely, the
//! timing wheel and the bypasses on, against congestion control off, on
//! the device model in real time (the paper reports at most 9 %).
//!
//! Both configurations are measured in the same run, interleaved round by
//! round (their order alternating), each on a fresh device model; a
//! configuration's rate is the median of its rounds, and the overhead is
//! given both from those medians and as the median of the rounds' paired
//! ratios (robust to the machine's load drifting between rounds).

use std::time::Duration;

use serde::Serialize;

use crate::bench::{BenchError, DeviceModel, Knobs, Point, Progress, erpc_on};
use crate::cli::{JsonOut, Out, Quit, Rounds, Shape, Timing, device_model_settings, memory_plan};
use crate::memory::{MemoryPlan, bench_pages};

/// One batch size's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CcOverheadRow {
    /// Requests per batch.
    pub batch: usize,
    /// Million RPCs per second with congestion control on (median).
    pub on_mrps: f64,
    /// Off (median).
    pub off_mrps: f64,
    /// Every round's rate, on.
    pub rounds_on_mrps: Vec<f64>,
    /// Every round's rate, off.
    pub rounds_off_mrps: Vec<f64>,
    /// `on_mrps / off_mrps`.
    pub ratio: f64,
    /// Median over the rounds of on/off of the same round.
    pub paired_ratio: f64,
    /// Smallest and largest paired ratio.
    pub paired_min: f64,
    /// See `paired_min`.
    pub paired_max: f64,
    /// Median RPC latency with CC on, µs (median of the rounds).
    pub on_p50_us: f64,
    /// Off.
    pub off_p50_us: f64,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { 0.0 } else { s[s.len() / 2] }
}

/// Measures CC on and off at every batch size, `rounds` times interleaved.
#[allow(clippy::too_many_arguments)]
pub fn cc_overhead(
    plan: &MemoryPlan,
    batches: &[usize],
    window: usize,
    size: usize,
    rounds: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Vec<CcOverheadRow>, BenchError> {
    let on = Knobs::default();
    let off = Knobs {
        rpc: erpc::RpcConfig {
            cc: erpc::CcConfig::disabled(),
            ..on.rpc
        },
        ..on
    };
    // [batch][on/off] -> (rates, p50s)
    let mut got: Vec<[(Vec<f64>, Vec<f64>); 2]> = vec![Default::default(); batches.len()];
    for round in 0..rounds.max(1) {
        for (bi, &batch) in batches.iter().enumerate() {
            let p = Point {
                batch,
                window,
                size,
                min_rpcs: 0,
            };
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                let knobs = if k == 0 { &on } else { &off };
                let dm = DeviceModel::new(plan.clone(), None, false)?;
                let o = erpc_on(&dm, knobs, p, dur, warmup, progress)?;
                got[bi][k].0.push(o.rpcs_per_sec / 1e6);
                got[bi][k].1.push(o.latency_us.median);
            }
        }
    }
    Ok(batches
        .iter()
        .zip(got)
        .map(|(&batch, [(on_r, on_l), (off_r, off_l)])| {
            let paired: Vec<f64> = on_r
                .iter()
                .zip(&off_r)
                .map(|(a, b)| if *b > 0.0 { a / b } else { 0.0 })
                .collect();
            let (on_mrps, off_mrps) = (median(&on_r), median(&off_r));
            CcOverheadRow {
                batch,
                on_mrps,
                off_mrps,
                ratio: if off_mrps > 0.0 {
                    on_mrps / off_mrps
                } else {
                    0.0
                },
                paired_ratio: median(&paired),
                paired_min: paired.iter().copied().fold(f64::INFINITY, f64::min),
                paired_max: paired.iter().copied().fold(0.0, f64::max),
                on_p50_us: median(&on_l),
                off_p50_us: median(&off_l),
                rounds_on_mrps: on_r,
                rounds_off_mrps: off_r,
            }
        })
        .collect())
}

/// `erpc-bench cc-overhead`: small-RPC rate with congestion control
/// (Timely, wheel, bypasses) on against off, interleaved rounds on the
/// device model.
#[derive(Debug, Clone, clap::Args)]
pub struct CcOverheadArgs {
    /// Batch sizes B to measure (comma separated), each 1..=window.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8])]
    pub batch: Vec<usize>,
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub timing: Timing,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub out: JsonOut,
}

impl CcOverheadArgs {
    /// Checks the flags and runs the experiment, printing its table.
    pub fn run(&self) -> Result<(), Quit> {
        self.rounds.check()?;
        let Shape { window, size } = self.shape;
        let rounds = self.rounds.rounds;
        let settings = device_model_settings(self.batch.clone(), window, size, &self.timing)?;
        let plan = memory_plan(bench_pages(size, window, true));
        let progress = Progress::new();
        let mut out = Out::default();
        out.line(
            &progress,
            format!(
                "erpc-bench cc-overhead: {size}-byte RPCs, window {window}, mlx5 transport on the \
                 device model, {} s per run, {rounds} interleaved rounds (median); CC on = \
                 Timely + wheel + bypasses",
                self.timing.secs
            ),
        )?;
        let rows = cc_overhead(
            &plan,
            &self.batch,
            window,
            size,
            rounds,
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
            experiment: &'static str,
            window: usize,
            size: usize,
            rounds: usize,
            rows: &'a [CcOverheadRow],
        }
        self.out.write(&CcReport {
            tool: "erpc-bench",
            experiment: "cc-overhead",
            window,
            size,
            rounds,
            rows: &rows,
        })
    }
}
