//! Timely (Mittal et al., SIGCOMM 2015): a rate per client session,
//! updated from RTT samples by the RTT gradient, as eRPC uses it.
//!
//! Each sample (request packet → credit return, or request/RFR → response
//! packet) updates the rate:
//!
//! * RTT below `t_low`: additive increase by `add_rate × Δ` (Δ: time since
//!   the last update in units of `min_rtt`, at most 1);
//! * RTT above `t_high`: multiplicative decrease by `β × Δ × (1 − t_high /
//!   RTT)`;
//! * otherwise by the gradient (EWMA of RTT differences, weight α,
//!   normalised by `min_rtt`): a non-positive gradient adds `add_rate × Δ`,
//!   five times that after `hai_thresh` consecutive negative differences
//!   (hyperactive increase); a positive one decreases by `β × Δ ×
//!   gradient`.
//!
//! The new rate is bounded: at least half the old one, at most the link
//! rate, at least `min_rate`. With the bypass on, a session at link rate
//! whose sample is at most `t_low` skips the computation (the common case
//! of an uncongested network). Rates are bytes per second; times are
//! nanoseconds. The arithmetic is the C++ eRPC's (f64), so the same samples
//! give the same rates.

/// Timely's constants (the C++ eRPC's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimelyParams {
    /// Lowest rate, bytes/s (15 MB/s).
    pub min_rate: f64,
    /// Additive increase step, bytes/s (5 MB/s).
    pub add_rate: f64,
    /// Smallest plausible RTT, µs (2): samples below are ignored, and the
    /// unit of the gradient and of Δ.
    pub min_rtt_us: f64,
    /// Below this RTT, µs (50), increase additively.
    pub t_low_us: f64,
    /// Above this RTT, µs (1000), decrease by the RTT itself.
    pub t_high_us: f64,
    /// Consecutive negative gradients before hyperactive increase (5).
    pub hai_thresh: u32,
    /// EWMA weight of a new RTT difference (0.46).
    pub ewma_alpha: f64,
    /// Multiplicative decrease factor (0.26).
    pub beta: f64,
}

impl Default for TimelyParams {
    fn default() -> Self {
        TimelyParams {
            min_rate: 15.0 * 1e6,
            add_rate: 5.0 * 1e6,
            min_rtt_us: 2.0,
            t_low_us: 50.0,
            t_high_us: 1000.0,
            hai_thresh: 5,
            ewma_alpha: 0.46,
            beta: 0.26,
        }
    }
}

/// What [`Timely::update`] did with a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// The rate was recomputed.
    Updated,
    /// Skipped: at link rate and RTT ≤ `t_low` (the bypass).
    Bypassed,
    /// Ignored: RTT below `min_rtt` (a retransmission's sample).
    Ignored,
}

/// One session's Timely state.
#[derive(Debug, Clone)]
pub(crate) struct Timely {
    rate: f64,
    link_rate: f64,
    prev_rtt_us: f64,
    avg_rtt_diff: f64,
    neg_gradient_count: u32,
    last_update_ns: u64,
    /// Shared by the Rpc's sessions (one copy per Rpc, not per session).
    p: std::sync::Arc<TimelyParams>,
    min_rtt_ns: u64,
    t_low_ns: u64,
}

impl Timely {
    /// A session starting at the link rate (bytes/s) at time `now_ns`.
    /// `p` may be shared (an `Arc`) by many sessions.
    pub(crate) fn new(
        p: impl Into<std::sync::Arc<TimelyParams>>,
        link_rate: f64,
        now_ns: u64,
    ) -> Timely {
        let p = p.into();
        Timely {
            rate: link_rate,
            link_rate,
            prev_rtt_us: p.min_rtt_us,
            avg_rtt_diff: 0.0,
            neg_gradient_count: 0,
            last_update_ns: now_ns,
            min_rtt_ns: (p.min_rtt_us * 1e3) as u64,
            t_low_ns: (p.t_low_us * 1e3) as u64,
            p,
        }
    }

    /// The current rate, bytes/s.
    #[inline]
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// The link rate, bytes/s.
    #[cfg(test)]
    #[inline]
    pub(crate) fn link_rate(&self) -> f64 {
        self.link_rate
    }

    /// `t_low`, ns: at the link rate, a sample at most this is bypassed.
    #[inline]
    pub(crate) fn t_low_ns(&self) -> u64 {
        self.t_low_ns
    }

    /// True at the link rate (the session is not rate limited).
    #[inline]
    pub(crate) fn uncongested(&self) -> bool {
        self.rate == self.link_rate
    }

    /// The EWMA of RTT differences, µs.
    #[cfg(test)]
    pub(crate) fn avg_rtt_diff_us(&self) -> f64 {
        self.avg_rtt_diff
    }

    /// Consecutive negative RTT differences so far.
    #[cfg(test)]
    pub(crate) fn neg_gradient_count(&self) -> u32 {
        self.neg_gradient_count
    }

    /// Updates the rate from an RTT sample taken at `now_ns`. `bypass`:
    /// skip the computation at link rate when the sample is at most
    /// `t_low`.
    #[inline]
    pub(crate) fn update(&mut self, now_ns: u64, rtt_ns: u64, bypass: bool) -> Update {
        if bypass && self.rate == self.link_rate && rtt_ns <= self.t_low_ns {
            return Update::Bypassed;
        }
        if rtt_ns < self.min_rtt_ns {
            return Update::Ignored;
        }
        self.update_slow(now_ns, rtt_ns);
        Update::Updated
    }

    #[inline(never)]
    fn update_slow(&mut self, now_ns: u64, rtt_ns: u64) {
        let p = &self.p;
        let sample_rtt = rtt_ns as f64 / 1e3;
        let rtt_diff = sample_rtt - self.prev_rtt_us;
        self.neg_gradient_count = if rtt_diff < 0.0 {
            self.neg_gradient_count + 1
        } else {
            0
        };
        self.avg_rtt_diff = (1.0 - p.ewma_alpha) * self.avg_rtt_diff + p.ewma_alpha * rtt_diff;
        let delta_factor =
            (now_ns.saturating_sub(self.last_update_ns) as f64 / (p.min_rtt_us * 1e3)).min(1.0);
        let ai = p.add_rate * delta_factor;
        let new_rate = if sample_rtt < p.t_low_us {
            self.rate + ai
        } else {
            let md = delta_factor * p.beta;
            let norm_grad = self.avg_rtt_diff / p.min_rtt_us;
            if sample_rtt <= p.t_high_us {
                if norm_grad <= 0.0 {
                    let n = if self.neg_gradient_count >= p.hai_thresh {
                        5.0
                    } else {
                        1.0
                    };
                    self.rate + n * ai
                } else {
                    self.rate * (1.0 - md * norm_grad)
                }
            } else {
                self.rate * (1.0 - md * (1.0 - p.t_high_us / sample_rtt))
            }
        };
        self.rate = new_rate
            .max(self.rate * 0.5)
            .min(self.link_rate)
            .max(p.min_rate);
        self.prev_rtt_us = sample_rtt;
        self.last_update_ns = now_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GBPS: f64 = 1e9 / 8.0;
    const US: u64 = 1_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn bypass_and_tiny_samples() {
        let mut t = Timely::new(TimelyParams::default(), 25.0 * GBPS, 0);
        assert!(t.uncongested());
        assert_eq!(t.update(10 * US, 20 * US, true), Update::Bypassed);
        assert_eq!(t.update(10 * US, US, false), Update::Ignored);
        // Without the bypass, an RTT below t_low at link rate recomputes
        // (and stays at the link rate).
        assert_eq!(t.update(10 * US, 20 * US, false), Update::Updated);
        assert_eq!(t.rate(), 25.0 * GBPS);
    }

    /// A sequence computed by hand from the formulas (α = 0.46, β = 0.26,
    /// min RTT 2 µs, T_low 50 µs, T_high 1000 µs, add 5 MB/s).
    #[test]
    fn hand_computed_sequence() {
        let link = 10.0 * GBPS; // 1.25e9 B/s
        let mut t = Timely::new(TimelyParams::default(), link, 0);
        // 1) RTT 100 µs at t = 10 µs: diff = 100 - 2 = 98; avg = 0.46 * 98
        //    = 45.08; Δ = min(10/2, 1) = 1; gradient 45.08 / 2 = 22.54 > 0:
        //    rate × (1 - 0.26 × 22.54) < 0.5 × rate → 0.5 × link.
        assert_eq!(t.update(10 * US, 100 * US, true), Update::Updated);
        assert!(close(t.rate(), 0.625e9), "{}", t.rate());
        assert!(close(t.avg_rtt_diff_us(), 45.08));
        // 2) RTT 99 µs at t = 11 µs: diff = -1; avg = 0.54 × 45.08 − 0.46 =
        //    23.8832; Δ = min(1/2, 1) = 0.5; gradient 11.9416 > 0:
        //    rate × (1 − 0.13 × 11.9416) < half → 0.3125e9.
        t.update(11 * US, 99 * US, true);
        assert!(close(t.rate(), 0.3125e9), "{}", t.rate());
        assert_eq!(t.neg_gradient_count(), 1);
        // 3) RTT 20 µs at t = 12 µs (< T_low): additive, Δ = 0.5 →
        //    + 2.5e6.
        t.update(12 * US, 20 * US, true);
        assert!(close(t.rate(), 0.3125e9 + 2.5e6), "{}", t.rate());
        // 4) RTT 2000 µs at t = 20 µs (> T_high): Δ = 1; × (1 − 0.26 ×
        //    (1 − 1000/2000)) = × 0.87.
        let before = t.rate();
        t.update(20 * US, 2000 * US, true);
        assert!(close(t.rate(), before * 0.87), "{}", t.rate());
    }

    #[test]
    fn hyperactive_increase_after_five_negative_gradients() {
        let link = 10.0 * GBPS;
        let mut t = Timely::new(TimelyParams::default(), link, 0);
        // Push the rate down, with the EWMA strongly positive.
        t.update(10 * US, 900 * US, true);
        let mut now = 10 * US;
        let mut rtt = 800 * US;
        // Decreasing RTTs in [T_low, T_high]: once the EWMA turns negative
        // the rate grows by Δ × 5 MB/s, and by 5 × that after five
        // consecutive negative differences.
        let mut increases = Vec::new();
        for _ in 0..30 {
            now += 2 * US; // Δ = 1
            rtt -= 20 * US;
            let r0 = t.rate();
            t.update(now, rtt, true);
            increases.push((t.neg_gradient_count(), t.rate() - r0));
        }
        let hai = increases
            .iter()
            .filter(|(n, d)| *n >= 5 && close(*d, 25e6))
            .count();
        let ai = increases
            .iter()
            .filter(|(n, d)| *n < 5 && *d > 0.0 && close(*d, 5e6))
            .count();
        assert!(hai > 0, "{increases:?}");
        assert!(
            increases
                .iter()
                .all(|(n, d)| *n < 5 || *d <= 0.0 || close(*d, 25e6)),
            "{increases:?}"
        );
        let _ = ai;
    }

    proptest::proptest! {
        /// Whatever the samples and their timing, the rate stays within
        /// [min_rate, link rate] and never drops below half of itself in
        /// one update.
        #[test]
        fn the_rate_never_leaves_its_bounds(
            link_gbps in 1.0f64..400.0,
            samples in proptest::collection::vec((0u64..5_000_000, 0u64..20_000_000, proptest::bool::ANY), 1..300),
        ) {
            let p = TimelyParams::default();
            let link = link_gbps * GBPS;
            let mut t = Timely::new(p, link, 0);
            let mut now = 0u64;
            for (dt, rtt, bypass) in samples {
                now += dt;
                let before = t.rate();
                t.update(now, rtt, bypass);
                proptest::prop_assert!(t.rate() <= link);
                proptest::prop_assert!(t.rate() >= p.min_rate.min(link));
                proptest::prop_assert!(t.rate() >= (before * 0.5).min(p.min_rate.max(before * 0.5)) - 1e-6);
                proptest::prop_assert!(t.rate().is_finite());
            }
        }
    }

    #[test]
    fn bounds_hold() {
        let p = TimelyParams::default();
        let mut t = Timely::new(p, 1.0 * GBPS, 0);
        for k in 1..1000u64 {
            let r0 = t.rate();
            t.update(k * 5 * US, 100_000 * US, false);
            assert!(t.rate() >= r0 * 0.5 - 1e-9);
            assert!(t.rate() >= p.min_rate);
        }
        assert_eq!(t.rate(), p.min_rate);
        for k in 1000..100_000u64 {
            t.update(k * 5 * US, 10 * US, false);
            assert!(t.rate() <= t.link_rate());
        }
        assert!(t.uncongested());
    }
}
