//! `erpc-bench loss`: the paper's loss-tolerance experiment. Goodput of
//! the largest messages (about 8 MB, requests and responses) on one
//! session between two device-model NICs while the fabric loses frames at
//! 10⁻⁶ … 10⁻², as a ratio to the lossless goodput measured in the same
//! run, with go-back-N rollbacks and TX drains counted; then the small-RPC
//! rate at loss 10⁻³ against lossless. Every RPC either completes or the
//! run fails (eRPC must repair every loss); the table prints how many
//! completed. Rates are wall-clock rates of the device model, whose fabric
//! has no link rate: the ratio, not the absolute goodput, is the result.

use std::time::Duration;

use serde::Serialize;

use crate::bench::{BenchError, DeviceModel, Knobs, Outcome, Point, Progress, erpc_on};
use crate::cli::{JsonOut, Out, Quit, Shape, Timing, device_model_settings, memory_plan};
use crate::memory::{MemoryPlan, bench_pages};

/// Frame loss rates of the loss experiment (0 is the reference).
pub const LOSS_RATES: [f64; 6] = [0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2];
/// Loss rate of the small-RPC comparison.
pub const SMALL_RPC_LOSS: f64 = 1e-3;

/// One row of the large-message loss table.
#[derive(Debug, Clone, Serialize)]
pub struct LossRow {
    /// Frame loss probability per link and direction.
    pub loss: f64,
    /// Message size (requests and responses).
    pub size: usize,
    /// RPCs completed while measuring.
    pub rpcs: u64,
    /// RPCs in flight at the end that completed afterwards.
    pub drained: u64,
    /// RPCs that never completed (the run fails if any).
    pub unfinished: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Payload bits per second, both directions.
    pub goodput_gbps: f64,
    /// Goodput over the lossless goodput of the same run.
    pub ratio_to_lossless: Option<f64>,
    /// Go-back-N rollbacks.
    pub retransmissions: u64,
    /// TX queue drains.
    pub tx_flushes: u64,
}

/// One row of the small-RPC loss comparison.
#[derive(Debug, Clone, Serialize)]
pub struct SmallLossRow {
    /// Requests per batch.
    pub batch: usize,
    /// Frame loss probability.
    pub loss: f64,
    /// Million RPCs per second, both nodes.
    pub mrps: f64,
    /// Over the lossless rate at the same batch.
    pub ratio_to_lossless: Option<f64>,
    /// Go-back-N rollbacks.
    pub retransmissions: u64,
    /// RPCs completed while measuring.
    pub rpcs: u64,
}

fn measure(
    plan: &MemoryPlan,
    loss: f64,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
) -> Result<Outcome, BenchError> {
    let dm = DeviceModel::new(plan.clone(), None, false)?;
    dm.set_loss(loss);
    erpc_on(&dm, &Knobs::default(), p, dur, warmup, progress)
}

/// The large-message rows: `size`-byte RPCs with `window` in flight per
/// node, at every rate of [`LOSS_RATES`]. `row` is called as each row is
/// measured.
pub fn large_message_loss(
    plan: &MemoryPlan,
    size: usize,
    window: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    mut row: impl FnMut(&LossRow) -> Result<(), BenchError>,
) -> Result<Vec<LossRow>, BenchError> {
    let mut rows: Vec<LossRow> = Vec::new();
    // At least one RPC per point (heavy loss is slow), so each row has a
    // goodput.
    let p = Point {
        batch: 1,
        window,
        size,
        min_rpcs: 1,
    };
    for loss in LOSS_RATES {
        let o = measure(plan, loss, p, dur, warmup, progress)?;
        let goodput_gbps = o.rpcs_per_sec * 2.0 * size as f64 * 8.0 / 1e9;
        let ratio_to_lossless = rows
            .first()
            .filter(|r| r.goodput_gbps > 0.0)
            .map(|r| goodput_gbps / r.goodput_gbps);
        if o.unfinished > 0 {
            return Err(BenchError::Run(format!(
                "loss {loss}: {} RPCs did not complete",
                o.unfinished
            )));
        }
        let r = LossRow {
            loss,
            size,
            rpcs: o.completed,
            drained: o.drained,
            unfinished: o.unfinished,
            seconds: o.elapsed_s,
            goodput_gbps,
            ratio_to_lossless,
            retransmissions: o.retransmissions,
            tx_flushes: o.tx_flushes,
        };
        row(&r)?;
        rows.push(r);
    }
    Ok(rows)
}

/// The small-RPC comparison: at each batch, lossless then
/// [`SMALL_RPC_LOSS`].
#[allow(clippy::too_many_arguments)]
pub fn small_rpc_loss(
    plan: &MemoryPlan,
    batches: &[usize],
    window: usize,
    size: usize,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    mut row: impl FnMut(&SmallLossRow) -> Result<(), BenchError>,
) -> Result<Vec<SmallLossRow>, BenchError> {
    let mut rows = Vec::new();
    for &batch in batches {
        let p = Point {
            batch,
            window,
            size,
            min_rpcs: 0,
        };
        let mut lossless = None;
        for loss in [0.0, SMALL_RPC_LOSS] {
            let o = measure(plan, loss, p, dur, warmup, progress)?;
            let mrps = o.rpcs_per_sec / 1e6;
            let r = SmallLossRow {
                batch,
                loss,
                mrps,
                ratio_to_lossless: lossless.filter(|&m: &f64| m > 0.0).map(|m| mrps / m),
                retransmissions: o.retransmissions,
                rpcs: o.completed,
            };
            if loss == 0.0 {
                lossless = Some(mrps);
            }
            row(&r)?;
            rows.push(r);
        }
    }
    Ok(rows)
}

/// Large messages in flight per node in the loss experiment (one session
/// has 8 slots).
const LARGE_WINDOW: usize = 4;

/// `erpc-bench loss`: goodput of ~8 MB messages under frame loss
/// 1e-6..1e-2, and the small-RPC rate at loss 1e-3, each against lossless
/// (device model).
#[derive(Debug, Clone, clap::Args)]
pub struct LossArgs {
    /// Batch sizes B of the small-RPC comparison (comma separated), each
    /// 1..=window.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8])]
    pub batch: Vec<usize>,
    /// The small RPCs' window and size.
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub timing: Timing,
    #[command(flatten)]
    pub out: JsonOut,
}

impl LossArgs {
    /// Checks the flags and runs the experiment, printing its tables.
    pub fn run(&self) -> Result<(), Quit> {
        let Shape { window, size } = self.shape;
        let settings = device_model_settings(self.batch.clone(), window, size, &self.timing)?;
        let large_size = erpc::MAX_MSG_BYTES;
        let pages =
            bench_pages(large_size, LARGE_WINDOW, true).max(bench_pages(size, window, true));
        let plan = memory_plan(pages);
        let progress = Progress::new();
        let mut out = Out::default();
        let (dur, warmup) = (settings.duration(), settings.warmup());
        out.line(
            &progress,
            format!(
                "erpc-bench loss: {large_size}-byte requests and responses, {LARGE_WINDOW} in \
                 flight per node, one session each way, mlx5 transport on the device model, {} \
                 s per point",
                self.timing.secs
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
        let large = large_message_loss(
            &plan,
            large_size,
            LARGE_WINDOW,
            dur,
            warmup,
            &progress,
            |r| {
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
            },
        )?;
        if let Some(q) = pending.take() {
            return Err(q);
        }
        out.line(
            &progress,
            format!(
                "small RPCs ({size} B, window {window}): lossless against loss {SMALL_RPC_LOSS}"
            ),
        )?;
        out.line(
            &progress,
            format!(
                "{:>4} {:>8} {:>10} {:>12} {:>16}",
                "B", "loss", "Mrps", "/ lossless", "retransmissions"
            ),
        )?;
        let small = small_rpc_loss(
            &plan,
            &self.batch,
            window,
            size,
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
            experiment: &'static str,
            loss_rates: &'a [f64],
            large_messages: Vec<LossRow>,
            small_rpcs: Vec<SmallLossRow>,
        }
        self.out.write(&LossReport {
            tool: "erpc-bench",
            experiment: "loss",
            loss_rates: &LOSS_RATES,
            large_messages: large,
            small_rpcs: small,
        })
    }
}

/// A loss rate as the tables show it.
fn loss_label(l: f64) -> String {
    if l == 0.0 {
        "0".into()
    } else {
        format!("{l:.0e}")
    }
}
