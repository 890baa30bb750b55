//! `erpc-bench large`: goodput of large messages on the
//! device model, against single-core `memcpy` of the same bytes measured in
//! the same run (issue 16, item 6).
//!
//! For each size from 32 B to [`erpc::MAX_MSG_BYTES`], both nodes keep
//! [`LARGE_EXP_WINDOW`] requests of that size in flight on their session to
//! the other node, the server answers with a response of the same size, and
//! goodput counts request and response payload bytes. One thread drives
//! both nodes and both device-model NICs (deterministic fabric, no link
//! rate), so eRPC, the driver and the NIC model's DMA all share one core.
//! The reference is `memcpy` on that core of the same total bytes, copied
//! `size` bytes at a time between two buffers of `size` bytes (so large
//! sizes leave the caches as the RPCs' buffers do), measured right before
//! and right after each eRPC point; the ratio uses their mean.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::{BenchError, DeviceModel, Knobs, Point, Progress, erpc_on};
use crate::cli::{JsonOut, Out, Quit, Timing, device_model_settings, memory_plan};
use crate::memory::{MemoryPlan, bench_pages};

/// Requests in flight per node.
pub const LARGE_EXP_WINDOW: usize = 2;

/// The sizes of the curve: 32 B, then × 4 up to 2 MiB, then the largest
/// message eRPC takes (about 8 MB).
pub fn large_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = (0..)
        .map(|i| 32usize << (2 * i))
        .take_while(|&s| s < erpc::MAX_MSG_BYTES)
        .collect();
    v.push(erpc::MAX_MSG_BYTES);
    v
}

/// One row of the curve.
#[derive(Debug, Clone, Serialize)]
pub struct LargeRow {
    /// Request and response size.
    pub size: usize,
    /// RPCs completed while measuring (both nodes).
    pub rpcs: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Payload bits per second, requests and responses, both nodes.
    pub goodput_gbps: f64,
    /// `memcpy` bits per second on one core, before and after the point.
    pub memcpy_gbps: [f64; 2],
    /// Goodput over the mean of the two `memcpy` figures.
    pub ratio_to_memcpy: f64,
}

/// `memcpy` bandwidth (bits per second) of copying `size`-byte blocks
/// between two `size`-byte buffers for about `dur`.
pub fn memcpy_gbps(size: usize, dur: Duration) -> f64 {
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    // Touch both once so that page faults are not measured.
    dst.copy_from_slice(&src);
    let mut bytes = 0u64;
    let t0 = Instant::now();
    let mut reps = 1u64;
    loop {
        for _ in 0..reps {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        }
        bytes += reps * size as u64;
        let dt = t0.elapsed();
        if dt >= dur {
            return bytes as f64 * 8.0 / dt.as_secs_f64() / 1e9;
        }
        reps = (reps * 2).min(1 << 20);
    }
}

/// Measures every size of `sizes`; `row` is called as each is done.
pub fn large_messages(
    plan: &MemoryPlan,
    sizes: &[usize],
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    mut row: impl FnMut(&LargeRow) -> Result<(), BenchError>,
) -> Result<Vec<LargeRow>, BenchError> {
    let mut rows = Vec::new();
    for &size in sizes {
        let before = memcpy_gbps(size, dur / 2);
        let dm = DeviceModel::new(plan.clone(), None, false)?;
        let p = Point {
            batch: 1,
            window: LARGE_EXP_WINDOW,
            size,
            min_rpcs: 1,
        };
        let o = erpc_on(&dm, &Knobs::default(), p, dur, warmup, progress)?;
        drop(dm);
        let after = memcpy_gbps(size, dur / 2);
        if o.unfinished > 0 {
            return Err(BenchError::Run(format!(
                "{size} B: {} RPCs did not complete",
                o.unfinished
            )));
        }
        let goodput_gbps = o.rpcs_per_sec * 2.0 * size as f64 * 8.0 / 1e9;
        let r = LargeRow {
            size,
            rpcs: o.completed,
            seconds: o.elapsed_s,
            goodput_gbps,
            memcpy_gbps: [before, after],
            ratio_to_memcpy: goodput_gbps / ((before + after) / 2.0),
        };
        row(&r)?;
        rows.push(r);
    }
    Ok(rows)
}

/// `erpc-bench large`: goodput of 32 B ... 8 MB requests and responses
/// against single-core memcpy of the same bytes, same run (device model).
#[derive(Debug, Clone, clap::Args)]
pub struct LargeArgs {
    /// Measure this one size in bytes (default: the curve from 32 B to the
    /// largest message).
    #[arg(long)]
    pub size: Option<usize>,
    #[command(flatten)]
    pub timing: Timing,
    #[command(flatten)]
    pub out: JsonOut,
}

impl LargeArgs {
    /// Checks the flags and runs the experiment, printing its table.
    pub fn run(&self) -> Result<(), Quit> {
        let settings =
            device_model_settings(vec![1], LARGE_EXP_WINDOW, erpc::MAX_MSG_BYTES, &self.timing)?;
        let sizes = match self.size {
            Some(size) => vec![size],
            None => large_sizes(),
        };
        let max = *sizes.iter().max().expect("at least one size");
        let plan = memory_plan(bench_pages(max, LARGE_EXP_WINDOW, true));
        let progress = Progress::new();
        let mut out = Out::default();
        out.line(
            &progress,
            format!(
                "erpc-bench large: requests and responses of each size, {LARGE_EXP_WINDOW} in \
                 flight per node, one session each way, mlx5 transport on the device model (one \
                 thread), {} s per point; memcpy on one core before and after each point",
                self.timing.secs
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
                r.size,
                r.rpcs,
                r.goodput_gbps,
                r.memcpy_gbps[0],
                r.memcpy_gbps[1],
                r.ratio_to_memcpy
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
            experiment: &'static str,
            window: usize,
            rows: &'a [LargeRow],
        }
        self.out.write(&Json {
            experiment: "large",
            window: LARGE_EXP_WINDOW,
            rows: &rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_run_from_32_bytes_to_the_largest_message() {
        let s = large_sizes();
        assert_eq!(s[0], 32);
        assert_eq!(*s.last().unwrap(), erpc::MAX_MSG_BYTES);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn memcpy_reference_is_positive() {
        assert!(memcpy_gbps(4096, Duration::from_millis(5)) > 0.0);
    }
}
