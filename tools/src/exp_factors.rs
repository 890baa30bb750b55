//! `erpc-bench factors`: the small-RPC rate with each of eRPC's
//! optimisations switched off in turn, and congestion control off, against
//! all on (device model, interleaved rounds).

use std::time::Duration;

use serde::Serialize;

use crate::bench::{BenchError, DeviceModel, Knobs, Point, Progress, erpc_on};
use crate::cli::{JsonOut, Out, Quit, Rounds, Shape, Timing, device_model_settings, memory_plan};
use crate::memory::{MemoryPlan, bench_pages};

#[derive(Debug, Clone, Serialize)]
pub struct FactorRow {
    /// What is switched off.
    pub factor: &'static str,
    /// Million RPCs per second, both nodes: the median of the rounds.
    pub mrps: f64,
    /// Every round's rate.
    pub rounds_mrps: Vec<f64>,
    /// `mrps` over the all-on rate (below 1: the optimisation helps).
    pub ratio_to_all_on: f64,
}

/// The configurations of the factor analysis: everything on, then each of
/// eRPC's optimisations off in turn (the paper's Table 3 idea), and
/// congestion control off altogether (its cost when uncongested).
pub fn factor_knobs() -> Vec<(&'static str, Knobs)> {
    let all = Knobs::default();
    let rpc = |f: &dyn Fn(&mut erpc::RpcConfig)| {
        let mut k = all;
        f(&mut k.rpc);
        k
    };
    let queue = |f: &dyn Fn(&mut mlx5::QueueConfig)| {
        let mut k = all;
        f(&mut k.queue);
        k
    };
    vec![
        ("none (all optimisations on)", all),
        (
            "batched RTT timestamps",
            rpc(&|r| r.cc.batch_timestamps = false),
        ),
        ("Timely bypass", rpc(&|r| r.cc.timely_bypass = false)),
        ("timing-wheel bypass", rpc(&|r| r.cc.wheel_bypass = false)),
        (
            // 16 strides: the smallest striding WQE devices accept is
            // 16 KiB (DPDK's log_min_stride_wqe_sz default).
            "multi-packet RQ (16 instead of 512 strides per WQE)",
            queue(&|q| {
                q.rq_log_strides = 4;
                q.rq_log_wqes = 8;
            }),
        ),
        (
            "unsignaled TX (a CQE per send instead of 1 per 64)",
            queue(&|q| q.unsignaled_batch = 1),
        ),
        ("doorbell batching (postlist 1)", {
            let mut k = all;
            k.postlist = 1;
            k
        }),
        (
            "preallocated responses",
            rpc(&|r| r.prealloc_responses = false),
        ),
        ("zero-copy RX", rpc(&|r| r.zero_copy_rx = false)),
        (
            "congestion control (Timely, wheel, bypasses)",
            rpc(&|r| r.cc = erpc::CcConfig::disabled()),
        ),
    ]
}

/// Measures every configuration of [`factor_knobs`] `rounds` times,
/// interleaved (so that a change in the machine's load hits every row
/// alike), at one point; the rate of a row is the median of its rounds.
#[allow(clippy::too_many_arguments)]
pub fn factor_analysis(
    plan: &MemoryPlan,
    p: Point,
    rounds: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Vec<FactorRow>, BenchError> {
    let knobs = factor_knobs();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); knobs.len()];
    for _ in 0..rounds.max(1) {
        for (k, (_, kn)) in knobs.iter().enumerate() {
            let dm = DeviceModel::new(plan.clone(), None, false)?;
            let o = erpc_on(&dm, kn, p, dur, warmup, progress)?;
            rates[k].push(o.rpcs_per_sec / 1e6);
        }
    }
    let median = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let base = median(&rates[0]);
    Ok(knobs
        .iter()
        .zip(rates)
        .map(|((name, _), r)| {
            let m = median(&r);
            FactorRow {
                factor: name,
                mrps: m,
                ratio_to_all_on: if base > 0.0 { m / base } else { 0.0 },
                rounds_mrps: r,
            }
        })
        .collect())
}

/// `erpc-bench factors`: small-RPC rate with each of eRPC's optimisations
/// switched off in turn, and congestion control off, against all on
/// (device model).
#[derive(Debug, Clone, clap::Args)]
pub struct FactorsArgs {
    /// Batch size B (1..=window).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub timing: Timing,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub out: JsonOut,
}

impl FactorsArgs {
    /// Checks the flags and runs the experiment, printing its table.
    pub fn run(&self) -> Result<(), Quit> {
        self.rounds.check()?;
        let Shape { window, size } = self.shape;
        let (batch, rounds) = (self.batch, self.rounds.rounds);
        let settings = device_model_settings(vec![batch], window, size, &self.timing)?;
        let plan = memory_plan(bench_pages(size, window, true));
        let progress = Progress::new();
        let mut out = Out::default();
        out.line(
            &progress,
            format!(
                "erpc-bench factors: {size}-byte RPCs, B = {batch}, window {window}, mlx5 \
                 transport on the device model, {} s per run, {rounds} interleaved rounds \
                 (median)",
                self.timing.secs
            ),
        )?;
        let p = Point {
            batch,
            window,
            size,
            min_rpcs: 0,
        };
        let rows = factor_analysis(
            &plan,
            p,
            rounds,
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
            experiment: &'static str,
            point: Point,
            rounds: usize,
            rows: &'a [FactorRow],
        }
        self.out.write(&FactorReport {
            tool: "erpc-bench",
            experiment: "factors",
            point: p,
            rounds,
            rows: &rows,
        })
    }
}
