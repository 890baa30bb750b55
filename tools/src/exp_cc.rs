//! `erpc-bench --experiment cc-overhead`: what congestion control costs
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
use crate::memory::MemoryPlan;

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
