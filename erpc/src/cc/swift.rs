//! A delay-target rate controller in the manner of Swift (Kumar et al.,
//! SIGCOMM 2020), as an alternative to Timely ([`super::Controller`]).
//!
//! Timely holds the queue between `t_low` and `t_high` (tens of µs to a
//! millisecond): any RTT in that range is a fixed point of its gradient
//! rule. This controller instead steers every session's RTT towards a
//! target close to the path's base RTT. Per RTT sample:
//!
//! * **target** = the session's base RTT (the smallest sample it has seen)
//!   plus a headroom (queueing allowed on the path: `headroom_bytes` at
//!   the link rate, a few frames, but at least `headroom_us`) plus a
//!   flow-scaling term that grows as the session's rate falls
//!   (`fs_range_us × (1/√f − 1) / (1/√f_min − 1)`, `f` the rate as a
//!   fraction of the link, `f_min` the minimum rate's): the more senders
//!   share a link, the smaller each one's rate and the more queueing they
//!   are allowed, as Swift's flow scaling does for small windows; a slower
//!   session aims higher than a faster one on the same path, which pulls
//!   their rates together;
//! * RTT at most the target: **additive increase** of
//!   `min(ai_rate, ai_frac × rate)` per RTT (each sample adds that times
//!   `Δ / RTT`, Δ the time since the previous sample, at most one RTT).
//!   The `ai_frac` cap matters with many senders: a session at 1/100 of
//!   the link gets a sample only every few tens of µs, and a fixed step
//!   per sample, summed over 100 sessions, would overshoot the link by
//!   several per cent between two samples;
//! * RTT above the target: **multiplicative decrease** by
//!   `β × (RTT − target) / target`, at most `max_mdf`, at most once per
//!   RTT, and (with `hold_while_falling`) not while the RTT is falling
//!   (below the previous sample). Normalising the excess by the target
//!   (Swift divides by the RTT, which bounds the decrease by β) lets a
//!   small β keep the response gentle near the target while a queue many
//!   times the target still halves the rate;
//! * **queue gradient** (`grad_gain` > 0): once at least one RTT has
//!   passed since the gradient's reference sample, the rate is also
//!   multiplied by `1 − grad_gain × (RTT − RTT_ref) / (now − t_ref)` (at
//!   least `1 − max_mdf`, at most `1 + grad_gain`) and the sample becomes
//!   the new reference. The slope of the RTT over time is the slope of the
//!   bottleneck queue in seconds of queue per second: (arrival rate − link
//!   rate) / link rate, so every session cutting its rate by that fraction
//!   removes the overload in one round, and raising it when the queue
//!   drains refills the link before it idles. The target terms alone act
//!   only on the queue's level, and the queue then swings around the
//!   target (at N = 100, where each session samples every ≈ 33 µs at its
//!   fair share, with periods of 30 µs to a millisecond); the gradient
//!   damps the swing. Noise in single samples does not accumulate: the
//!   factors telescope, so a session's rate carries only the noise of its
//!   latest reference sample. It takes the place of the hold-while-falling
//!   rule, a one-bit version of it.
//!
//! A retransmission timeout puts the rate at its minimum
//! ([`Swift::on_timeout`]): the session had no feedback since the loss.
//! The rate stays within `[min_rate, link rate]`; sessions start at the
//! link rate, as eRPC's do.
//!
//! The RTT samples must not include the sender's own NIC queue: a session
//! at link rate that hands 32 credits' packets to its NIC at once would
//! measure ≈ 11 µs of its own queue at 25 Gbit/s and read it as
//! congestion. [`super::CcConfig::swift`] therefore paces every packet but
//! a slot's first unacknowledged one through the wheel and keeps at most
//! one packet per slot in the wheel ([`super::CcConfig::pace_window`]), so
//! a new rate applies from the next packet.
//!
//! The base RTT is the smallest sample of the session's lifetime (samples
//! include the receiver's turnaround and, with batched timestamps, up to
//! one event-loop iteration at each end), capped at `max_base_rtt_us`: a
//! session that starts during an incast sees only queued samples at
//! first, and would otherwise aim at that queue and keep its rate while
//! the others back off. (Swift configures its base target per fabric; the
//! cap is that configuration, the minimum makes it tighter on a shorter
//! path.)

/// The controller's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiftParams {
    /// Queueing delay allowed above the base RTT, µs.
    pub headroom_us: f64,
    /// Queueing allowed above the base RTT in bytes at the link rate (0:
    /// only `headroom_us`); the headroom is the larger of the two. A few
    /// frames: the queue the packet-scale jitter of many paced senders
    /// needs to keep the link busy is a number of frames, whose time
    /// depends on the link.
    pub headroom_bytes: f64,
    /// Largest extra target at the minimum rate (flow scaling), µs; 0
    /// switches flow scaling off.
    pub fs_range_us: f64,
    /// Additive increase per RTT, bytes/s.
    pub ai_rate: f64,
    /// At most this fraction of the current rate is added per RTT (0: no
    /// such limit).
    pub ai_frac: f64,
    /// Multiplicative decrease factor (of `(RTT − target) / target`).
    pub beta: f64,
    /// Largest multiplicative decrease in one step (a fraction of the
    /// rate).
    pub max_mdf: f64,
    /// Lowest rate, bytes/s.
    pub min_rate: f64,
    /// The base RTT is the smallest sample, but at most this, µs: a
    /// session whose first samples all crossed a standing queue (it
    /// started during an incast) would otherwise take that queue for the
    /// path and hold it. Must be at least the paths' real RTT with a
    /// full-size frame and no queue (else the session aims below what it
    /// can reach and sinks to the minimum rate).
    pub max_base_rtt_us: f64,
    /// Gain of the queue-gradient term (0: off): per gradient step the rate
    /// is multiplied by `1 − grad_gain × ΔRTT / Δt` (see the module docs).
    pub grad_gain: f64,
    /// Skip the target's decrease while the RTT is below the previous
    /// sample (an earlier decrease is already draining the queue). Off
    /// when the gradient term runs: that reacts to the falling queue
    /// itself.
    pub hold_while_falling: bool,
}

/// The defaults were chosen on `erpc-bench incast --controller
/// swift` (25 Gbit/s, 1 MiB buffer, N = 10 and 100; BENCHMARKS.md): a
/// decrease factor of 0.1 with the excess over the target normalised by
/// the target, and an increase capped at 0.5 % of the rate per RTT,
/// kept both the goodput near the link and the queue within a few frames;
/// Swift's own β = 0.8 (normalised by the RTT) and an uncapped increase
/// made the rates oscillate (goodput 0.41 at N = 10). The gradient term
/// (gain 0.3) raised the steady goodput at N = 100 enough to let the
/// headroom fall from 2 to 1 µs (with 100 ns wheel slots,
/// [`super::CcConfig::swift`]): probe p99 from 3.9× to 2.9× the
/// uncongested RTT at a steady goodput of 0.90.
impl Default for SwiftParams {
    fn default() -> Self {
        SwiftParams {
            headroom_us: 1.0,
            headroom_bytes: 3.0 * 1024.0,
            fs_range_us: 2.0,
            ai_rate: 10.0 * 1e6,
            ai_frac: 0.005,
            beta: 0.1,
            max_mdf: 0.5,
            min_rate: 15.0 * 1e6,
            max_base_rtt_us: 10.0,
            grad_gain: 0.3,
            hold_while_falling: false,
        }
    }
}

use super::Update;

/// One session's controller state.
#[derive(Debug, Clone)]
pub(crate) struct Swift {
    rate: f64,
    link_rate: f64,
    /// Shared by the Rpc's sessions (one copy per Rpc, not per session).
    p: std::sync::Arc<SwiftParams>,
    /// Smallest RTT seen, ns (`u64::MAX` before the first sample).
    base_rtt_ns: u64,
    max_base_rtt_ns: u64,
    /// The headroom, ns.
    headroom_ns: f64,
    last_sample_ns: u64,
    last_decrease_ns: u64,
    /// The previous sample, ns (0 before the first).
    prev_rtt_ns: u64,
    /// `1/√f_min − 1`: the flow-scaling term's denominator.
    fs_norm: f64,
    /// The gradient's reference sample: (time, RTT), ns; `None` before the
    /// first sample, after a bypassed one and after a timeout.
    grad_ref: Option<(u64, u64)>,
}

impl Swift {
    /// A session starting at the link rate (bytes/s) at time `now_ns`.
    /// `p` may be shared (an `Arc`) by many sessions.
    pub(crate) fn new(
        p: impl Into<std::sync::Arc<SwiftParams>>,
        link_rate: f64,
        now_ns: u64,
    ) -> Swift {
        let p = p.into();
        let f_min = (p.min_rate / link_rate).clamp(f64::MIN_POSITIVE, 1.0);
        Swift {
            rate: link_rate,
            link_rate,
            base_rtt_ns: u64::MAX,
            max_base_rtt_ns: (p.max_base_rtt_us * 1e3) as u64,
            headroom_ns: (p.headroom_us * 1e3).max(p.headroom_bytes / link_rate * 1e9),
            last_sample_ns: now_ns,
            last_decrease_ns: now_ns,
            prev_rtt_ns: 0,
            fs_norm: 1.0 / f_min.sqrt() - 1.0,
            grad_ref: None,
            p,
        }
    }

    /// The current rate, bytes/s.
    #[inline]
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// True at the link rate.
    #[inline]
    pub(crate) fn uncongested(&self) -> bool {
        self.rate == self.link_rate
    }

    /// The smallest RTT sample so far, at most `max_base_rtt_us`, ns
    /// (`None` before the first).
    pub(crate) fn base_rtt_ns(&self) -> Option<u64> {
        (self.base_rtt_ns != u64::MAX).then_some(self.base_rtt_ns)
    }

    /// The target RTT at the current rate, ns (`None` before the first
    /// sample).
    pub(crate) fn target_ns(&self) -> Option<f64> {
        let base = self.base_rtt_ns()?;
        Some(base as f64 + self.headroom_ns + self.flow_scaling_us() * 1e3)
    }

    /// The flow-scaling part of the target at the current rate, µs: 0 at
    /// the link rate, `fs_range_us` at the minimum rate.
    pub(crate) fn flow_scaling_us(&self) -> f64 {
        if self.p.fs_range_us <= 0.0 || self.fs_norm <= 0.0 {
            return 0.0;
        }
        let f = (self.rate / self.link_rate).clamp(f64::MIN_POSITIVE, 1.0);
        (self.p.fs_range_us * (1.0 / f.sqrt() - 1.0) / self.fs_norm).clamp(0.0, self.p.fs_range_us)
    }

    /// A retransmission timeout: the session lost what it had in flight
    /// and has had no feedback since; it restarts from the minimum rate
    /// (a rate kept from before the loss would send the go-back-N
    /// retransmissions of every session that timed out together into the
    /// buffer that just overflowed). (A slow start back to half the old
    /// rate was tried: at N = 100 its doublings overflowed the buffer a
    /// second time.)
    pub(crate) fn on_timeout(&mut self, now_ns: u64) {
        self.rate = self.p.min_rate.min(self.link_rate);
        self.last_decrease_ns = now_ns;
        self.last_sample_ns = now_ns;
        self.grad_ref = None;
    }

    /// Updates the rate from an RTT sample taken at `now_ns`. `bypass`:
    /// skip the computation at link rate when the sample is within the
    /// target (the base RTT is still tracked).
    #[inline(never)]
    pub(crate) fn update(&mut self, now_ns: u64, rtt_ns: u64, bypass: bool) -> Update {
        if rtt_ns == 0 {
            return Update::Ignored;
        }
        self.base_rtt_ns = self.base_rtt_ns.min(rtt_ns).min(self.max_base_rtt_ns);
        let target = self.target_ns().expect("a sample was taken");
        let rtt = rtt_ns as f64;
        if rtt <= target && bypass && self.rate == self.link_rate {
            self.last_sample_ns = now_ns;
            self.grad_ref = None;
            return Update::Bypassed;
        }
        let before = self.rate;
        if self.p.grad_gain > 0.0 {
            self.gradient_step(now_ns, rtt_ns);
        }
        if rtt <= target {
            let dt = now_ns.saturating_sub(self.last_sample_ns) as f64;
            let ai = if self.p.ai_frac > 0.0 {
                self.p.ai_rate.min(self.p.ai_frac * self.rate)
            } else {
                self.p.ai_rate
            };
            self.rate += ai * (dt / rtt).min(1.0);
        } else if (!self.p.hold_while_falling || rtt_ns >= self.prev_rtt_ns)
            && now_ns.saturating_sub(self.last_decrease_ns) >= rtt_ns
        {
            let md = (self.p.beta * (rtt - target) / target).min(self.p.max_mdf);
            self.rate *= 1.0 - md;
            self.last_decrease_ns = now_ns;
        }
        // One sample never takes away more than `max_mdf` of the rate, the
        // gradient's and the target's decreases together.
        self.rate = self
            .rate
            .max(before * (1.0 - self.p.max_mdf))
            .min(self.link_rate)
            .max(self.p.min_rate);
        self.last_sample_ns = now_ns;
        self.prev_rtt_ns = rtt_ns;
        Update::Updated
    }

    /// The queue-gradient term: once a whole RTT (the current sample's)
    /// has passed since the reference sample, scale the rate by
    /// `1 − grad_gain × ΔRTT / Δt` (clamped) and take this sample as the
    /// new reference. Shorter intervals leave the reference in place, so
    /// the slope is never taken over less than one RTT (where the
    /// queue's packet-scale jitter would dominate it).
    #[inline]
    fn gradient_step(&mut self, now_ns: u64, rtt_ns: u64) {
        match self.grad_ref {
            Some((t0, r0)) if now_ns.saturating_sub(t0) >= rtt_ns => {
                let dt = now_ns.saturating_sub(t0) as f64;
                let slope = (rtt_ns as f64 - r0 as f64) / dt;
                let k = self.p.grad_gain;
                self.rate *= (1.0 - k * slope).clamp(1.0 - self.p.max_mdf, 1.0 + k);
                self.grad_ref = Some((now_ns, rtt_ns));
            }
            Some(_) => {}
            None => self.grad_ref = Some((now_ns, rtt_ns)),
        }
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

    fn params() -> SwiftParams {
        SwiftParams {
            headroom_us: 2.0,
            headroom_bytes: 0.0,
            fs_range_us: 0.0,
            ai_rate: 10e6,
            ai_frac: 0.0,
            beta: 0.8,
            max_mdf: 0.5,
            min_rate: 15e6,
            max_base_rtt_us: 10.0,
            grad_gain: 0.0,
            hold_while_falling: true,
        }
    }

    /// A sequence computed by hand (headroom 2 µs, no flow scaling, AI
    /// 10 MB/s per RTT without a fraction cap, β 0.8, at most 0.5 per
    /// step), 10 Gbit/s link.
    #[test]
    fn hand_computed_sequence() {
        let link = 10.0 * GBPS; // 1.25e9 B/s
        let mut s = Swift::new(params(), link, 0);
        // 1) RTT 5 µs at t = 10 µs: base 5 µs, target 7 µs; at link rate
        //    and within the target: bypassed.
        assert_eq!(s.update(10 * US, 5 * US, true), Update::Bypassed);
        assert_eq!(s.base_rtt_ns(), Some(5 * US));
        assert!(close(s.target_ns().unwrap(), 7_000.0));
        // 2) RTT 10 µs at t = 20 µs: above the target, not falling, 20 µs
        //    since the last decrease (t = 0) ≥ 10 µs: × (1 − 0.8 × 3/7).
        assert_eq!(s.update(20 * US, 10 * US, true), Update::Updated);
        let r2 = 1.25e9 * (1.0 - 0.8 * 3.0 / 7.0);
        assert!(close(s.rate(), r2), "{}", s.rate());
        // 3) RTT 20 µs at t = 25 µs: above, but only 5 µs since the last
        //    decrease (< 20 µs): unchanged.
        s.update(25 * US, 20 * US, true);
        assert!(close(s.rate(), r2), "{}", s.rate());
        // 4) RTT 40 µs at t = 60 µs: 40 µs since the decrease: 0.8 × 33/7
        //    capped at 0.5 → half.
        s.update(60 * US, 40 * US, true);
        let r4 = r2 * 0.5;
        assert!(close(s.rate(), r4), "{}", s.rate());
        // 5) RTT 30 µs at t = 100 µs: above the target and 40 µs since the
        //    decrease, but falling (30 < 40): held.
        s.update(100 * US, 30 * US, true);
        assert!(close(s.rate(), r4), "{}", s.rate());
        // 6) RTT 6 µs at t = 103 µs (≤ 7 µs): + 10 MB/s × 3/6.
        s.update(103 * US, 6 * US, true);
        assert!(close(s.rate(), r4 + 5e6), "{}", s.rate());
        // 7) RTT 4 µs at t = 140 µs: the base falls to 4 µs (target 6 µs);
        //    37 µs since the last sample: a whole RTT's 10 MB/s.
        s.update(140 * US, 4 * US, true);
        assert_eq!(s.base_rtt_ns(), Some(4 * US));
        let r7 = r4 + 15e6;
        assert!(close(s.rate(), r7), "{}", s.rate());
        // 8) RTT 6.5 µs at t = 200 µs: above the new target (6 µs), rising:
        //    × (1 − 0.8 × 0.5/6).
        s.update(200 * US, 6_500, true);
        assert!(
            close(s.rate(), r7 * (1.0 - 0.8 * 0.5 / 6.0)),
            "{}",
            s.rate()
        );
        // 9) The first sample of a new session crossed a 500 µs queue: its
        //    base is capped at 10 µs (target 12 µs), so the next sample
        //    (in the same queue, rising) decreases by half.
        let mut late = Swift::new(params(), link, 0);
        late.update(10 * US, 500 * US, true);
        assert_eq!(late.base_rtt_ns(), Some(10 * US));
        assert!(close(late.target_ns().unwrap(), 12_000.0));
        late.update(600 * US, 501 * US, true);
        assert!(close(late.rate(), link * 0.5), "{}", late.rate());
        // 10) A retransmission timeout: the minimum rate; the next sample
        //     within the target adds the usual step.
        s.on_timeout(300 * US);
        assert!(close(s.rate(), 15e6), "{}", s.rate());
        s.update(310 * US, 5 * US, true);
        assert!(close(s.rate(), 25e6), "{}", s.rate());
    }

    /// The gradient term by hand (headroom 2 µs, no flow scaling, AI
    /// 10 MB/s per RTT, β 0.8, at most 0.5 per sample, gradient gain 0.5,
    /// no hold while falling), 10 Gbit/s link, from 1 GB/s.
    #[test]
    fn gradient_hand_computed_sequence() {
        let link = 10.0 * GBPS;
        let p = SwiftParams {
            grad_gain: 0.5,
            hold_while_falling: false,
            ..params()
        };
        let mut s = Swift::new(p, link, 0);
        s.rate = 1e9;
        // 1) RTT 5 µs at 10 µs: the first sample is only the gradient's
        //    reference; within the target (7 µs): + a whole RTT's 10 MB/s.
        s.update(10 * US, 5 * US, false);
        let r1 = 1e9 + 10e6;
        assert!(close(s.rate(), r1), "{}", s.rate());
        // 2) RTT 6 µs at 12 µs: 2 µs since the reference, less than this
        //    RTT: no gradient step; + 10 MB/s × 2/6.
        s.update(12 * US, 6 * US, false);
        let r2 = r1 + 10e6 / 3.0;
        assert!(close(s.rate(), r2), "{}", s.rate());
        // 3) RTT 6.5 µs at 20 µs: 10 µs since the reference (5 µs):
        //    slope 1.5/10, × (1 − 0.5 × 0.15); then + 10 MB/s (8 µs since
        //    the last sample, more than an RTT).
        s.update(20 * US, 6_500, false);
        let r3 = r2 * 0.925 + 10e6;
        assert!(close(s.rate(), r3), "{}", s.rate());
        // 4) RTT 9 µs at 30 µs: slope 2.5/10 → × 0.875; above the target
        //    by 2 µs: × (1 − 0.8 × 2/7).
        s.update(30 * US, 9 * US, false);
        let r4 = r3 * 0.875 * (1.0 - 0.8 * 2.0 / 7.0);
        assert!(close(s.rate(), r4), "{}", s.rate());
        // 5) RTT 4 µs at 40 µs (base 4 µs, target 6 µs): the queue drained,
        //    slope −5/10 → × 1.25; + 10 MB/s.
        s.update(40 * US, 4 * US, false);
        let r5 = r4 * 1.25 + 10e6;
        assert!(close(s.rate(), r5), "{}", s.rate());
        // 6) RTT 30 µs at 50 µs: 10 µs since the reference (< 30 µs): no
        //    gradient step; 20 µs since the decrease (< 30 µs): none.
        s.update(50 * US, 30 * US, false);
        assert!(close(s.rate(), r5), "{}", s.rate());
        // 7) RTT 36 µs at 80 µs: slope 32/40 → × 0.6, and 30 µs over the
        //    6 µs target → × 0.5 (capped): together 0.3, but one sample
        //    takes at most half.
        s.update(80 * US, 36 * US, false);
        let r7 = r5 * 0.5;
        assert!(close(s.rate(), r7), "{}", s.rate());
        // 8) A timeout: the minimum rate, and the next sample is a new
        //    reference (no slope across the timeout): + 10 MB/s.
        s.on_timeout(100 * US);
        s.update(110 * US, 5 * US, false);
        assert!(close(s.rate(), 25e6), "{}", s.rate());
        // 9) RTT 4 µs at 120 µs: slope −1/10 → × 1.05; + 10 MB/s.
        s.update(120 * US, 4 * US, false);
        assert!(close(s.rate(), 25e6 * 1.05 + 10e6), "{}", s.rate());
    }

    /// A bypassed sample is no gradient reference; without the hold, the
    /// target's decrease also applies while the RTT falls.
    #[test]
    fn gradient_after_a_bypass_and_without_the_hold() {
        let link = 10.0 * GBPS;
        let p = SwiftParams {
            grad_gain: 0.5,
            hold_while_falling: false,
            ..params()
        };
        let mut s = Swift::new(p, link, 0);
        assert_eq!(s.update(10 * US, 5 * US, true), Update::Bypassed);
        // RTT 8 µs at 20 µs: the reference; 1 µs over the 7 µs target.
        s.update(20 * US, 8 * US, true);
        let r1 = link * (1.0 - 0.8 / 7.0);
        assert!(close(s.rate(), r1), "{}", s.rate());
        // RTT 7.5 µs at 40 µs: falling, slope −0.5/20 → × 1.0125, and
        //    still 0.5 µs over the target: × (1 − 0.8 × 0.5/7).
        s.update(40 * US, 7_500, true);
        let r2 = r1 * 1.0125 * (1.0 - 0.8 * 0.5 / 7.0);
        assert!(close(s.rate(), r2), "{}", s.rate());
        // The same with the hold: the falling sample holds the decrease.
        let mut h = Swift::new(
            SwiftParams {
                hold_while_falling: true,
                ..p
            },
            link,
            0,
        );
        h.update(10 * US, 5 * US, true);
        h.update(20 * US, 8 * US, true);
        h.update(40 * US, 7_500, true);
        assert!(close(h.rate(), r1 * 1.0125), "{}", h.rate());
    }

    /// With `ai_frac`, the increase per RTT is the smaller of `ai_rate`
    /// and that fraction of the rate.
    #[test]
    fn the_increase_is_capped_by_a_fraction_of_the_rate() {
        let link = 25.0 * GBPS;
        let p = SwiftParams {
            ai_frac: 0.01,
            ..params()
        };
        let mut s = Swift::new(p, link, 0);
        s.update(0, 5 * US, false);
        // At 100 MB/s: 1 % is 1 MB/s < 10 MB/s.
        s.rate = 100e6;
        s.update(10 * US, 5 * US, false);
        assert!(close(s.rate(), 101e6), "{}", s.rate());
        // Half an RTT later: half of 1 % of 101 MB/s.
        s.update(12_500, 5 * US, false);
        assert!(close(s.rate(), 101e6 * 1.005), "{}", s.rate());
        // At 2 GB/s: 1 % is 20 MB/s, capped at 10 MB/s.
        s.rate = 2e9;
        s.update(30 * US, 5 * US, false);
        assert!(close(s.rate(), 2.01e9), "{}", s.rate());
    }

    #[test]
    fn flow_scaling_raises_the_target_as_the_rate_falls() {
        let link = 25.0 * GBPS;
        let p = SwiftParams {
            fs_range_us: 4.0,
            ..params()
        };
        let mut s = Swift::new(p, link, 0);
        assert_eq!(s.flow_scaling_us(), 0.0);
        s.update(10 * US, 5 * US, false);
        assert!(close(s.target_ns().unwrap(), 7_000.0));
        // Drive the rate to the minimum with huge, rising RTTs, once per
        // RTT.
        let mut now = 10 * US;
        for k in 0..100 {
            now += 1_000 * US;
            s.update(now, 900 * US + k, false);
        }
        assert!(close(s.rate(), p.min_rate), "{}", s.rate());
        assert!(close(s.flow_scaling_us(), 4.0), "{}", s.flow_scaling_us());
        assert!(close(s.target_ns().unwrap(), 11_000.0));
        // In between: f = 1/100 of the link gives
        // 4 × (10 − 1) / (1/√(15e6/3.125e9) − 1).
        s.rate = link / 100.0;
        let norm = 1.0 / (15e6f64 / 3.125e9).sqrt() - 1.0;
        assert!(
            close(s.flow_scaling_us(), 4.0 * 9.0 / norm),
            "{}",
            s.flow_scaling_us()
        );
    }

    #[test]
    fn a_standing_target_rtt_grows_the_rate_by_ai_per_rtt() {
        let link = 100.0 * GBPS;
        let mut s = Swift::new(params(), link, 0);
        s.rate = 1e9;
        s.update(0, 5 * US, false);
        let r0 = s.rate();
        // 100 samples one per µs at RTT 5 µs: 100 µs = 20 RTTs → +200 MB/s.
        for k in 1..=100u64 {
            s.update(k * US, 5 * US, false);
        }
        assert!(close(s.rate(), r0 + 20.0 * 10e6), "{}", s.rate());
    }

    proptest::proptest! {
        /// Whatever the samples and their timing, the rate stays within
        /// [min_rate, link rate], never falls by more than `max_mdf` in
        /// one sample, never rises by more than `ai_rate` in one sample,
        /// and the target stays within [base + headroom, base + headroom +
        /// fs_range].
        #[test]
        fn the_rate_never_leaves_its_bounds(
            link_gbps in 1.0f64..400.0,
            fs_range_us in 0.0f64..20.0,
            ai_frac in 0.0f64..0.5,
            beta in 0.01f64..1.0,
            grad_gain in 0.0f64..1.0,
            hold_while_falling in proptest::bool::ANY,
            samples in proptest::collection::vec((0u64..5_000_000, 0u64..20_000_000, proptest::bool::ANY, 0u8..20), 1..300),
        ) {
            let p = SwiftParams { fs_range_us, ai_frac, beta, grad_gain, hold_while_falling, ..SwiftParams::default() };
            let link = link_gbps * GBPS;
            let mut s = Swift::new(p, link, 0);
            let mut now = 0u64;
            for (dt, rtt, bypass, timeout) in samples {
                now += dt;
                let before = s.rate();
                if timeout == 0 {
                    s.on_timeout(now);
                    proptest::prop_assert_eq!(s.rate(), p.min_rate);
                    continue;
                }
                s.update(now, rtt, bypass);
                let r = s.rate();
                proptest::prop_assert!(r.is_finite());
                proptest::prop_assert!(r <= link);
                proptest::prop_assert!(r >= p.min_rate.min(link));
                proptest::prop_assert!(r >= (before * (1.0 - p.max_mdf)).max(p.min_rate) - 1e-6);
                proptest::prop_assert!(r <= before * (1.0 + p.grad_gain) + p.ai_rate + 1e-6);
                if let (Some(b), Some(t)) = (s.base_rtt_ns(), s.target_ns()) {
                    proptest::prop_assert!(b as f64 <= p.max_base_rtt_us * 1e3);
                    let lo = b as f64 + (p.headroom_us * 1e3).max(p.headroom_bytes / link * 1e9);
                    proptest::prop_assert!(t >= lo - 1e-6 && t <= lo + p.fs_range_us * 1e3 + 1e-6);
                }
            }
        }
    }
}
