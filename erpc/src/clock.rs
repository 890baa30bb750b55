//! Time for the Rpc: the calibrated TSC in production, a virtual clock in
//! simulation. Nothing else in the crate reads a clock; everything takes
//! nanoseconds from [`Clock::now_ns`].
//!
//! The two clocks are an enum, not a trait object: a read is one branch
//! plus either `rdtsc` and a multiply, or one atomic load.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonic nanosecond clock.
#[derive(Debug, Clone)]
pub enum Clock {
    /// The time-stamp counter, calibrated once against the OS clock.
    Tsc(TscClock),
    /// Simulated time, advanced explicitly.
    Virtual(VirtualClock),
}

impl Clock {
    /// The TSC clock (calibrates on first use in the process, ~10 ms).
    pub fn tsc() -> Clock {
        Clock::Tsc(TscClock::calibrated())
    }

    /// Nanoseconds since an arbitrary origin.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Tsc(t) => t.now_ns(),
            Clock::Virtual(v) => v.now_ns(),
        }
    }

    /// True for the simulated clock.
    pub fn is_virtual(&self) -> bool {
        matches!(self, Clock::Virtual(_))
    }
}

/// Simulated time in nanoseconds, shared by everything in one simulation.
#[derive(Debug, Clone, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock at time 0.
    pub fn new() -> VirtualClock {
        VirtualClock::default()
    }

    /// Current simulated time.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Moves time forward by `ns`.
    pub fn advance_ns(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }

    /// Moves time forward to `ns` (never backward).
    pub fn advance_to_ns(&self, ns: u64) {
        self.0.fetch_max(ns, Ordering::Relaxed);
    }
}

/// TSC ticks converted to nanoseconds with a fixed-point factor.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    base_tsc: u64,
    /// Nanoseconds per tick, times 2^32.
    ns_per_tick_q32: u64,
}

static CALIBRATION: std::sync::OnceLock<TscClock> = std::sync::OnceLock::new();

impl TscClock {
    /// The process-wide calibrated clock.
    pub fn calibrated() -> TscClock {
        *CALIBRATION.get_or_init(TscClock::calibrate)
    }

    fn calibrate() -> TscClock {
        // The one place that reads the OS clock: to learn the tick rate.
        let t0 = std::time::Instant::now();
        let c0 = tsc::read();
        while t0.elapsed() < std::time::Duration::from_millis(10) {
            std::hint::spin_loop();
        }
        let c1 = tsc::read();
        let ns = t0.elapsed().as_nanos() as u64;
        let ticks = c1.saturating_sub(c0).max(1);
        let q = ((u128::from(ns) << 32) / u128::from(ticks)) as u64;
        TscClock {
            base_tsc: c0,
            ns_per_tick_q32: q.max(1),
        }
    }

    /// Ticks per microsecond (for reports).
    pub fn ticks_per_us(&self) -> f64 {
        1000.0 * (1u64 << 32) as f64 / self.ns_per_tick_q32 as f64
    }

    /// Nanoseconds since calibration.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        let ticks = tsc::read().wrapping_sub(self.base_tsc);
        ((u128::from(ticks) * u128::from(self.ns_per_tick_q32)) >> 32) as u64
    }
}

/// The time-stamp counter read: one of the crate's three `unsafe` modules
/// (with the simulated RX ring and the TX batch, `rpc::tx`).
#[allow(unsafe_code)]
mod tsc {
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: `rdtsc` has no preconditions on x86-64: it reads a
        // counter register and touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub fn read() -> u64 {
        // Without a TSC, a monotonic OS clock in nanoseconds (the
        // calibration then finds a factor of 1).
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        ORIGIN
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_told() {
        let c = Clock::Virtual(VirtualClock::new());
        assert_eq!(c.now_ns(), 0);
        if let Clock::Virtual(v) = &c {
            v.advance_ns(5);
            v.advance_to_ns(3);
            assert_eq!(v.now_ns(), 5);
            v.advance_to_ns(100);
        }
        assert_eq!(c.now_ns(), 100);
    }

    #[test]
    fn tsc_is_monotonic_and_roughly_calibrated() {
        let c = TscClock::calibrated();
        let a = c.now_ns();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {}
        let b = c.now_ns();
        let d = b - a;
        // Loose bounds: a shared VM can be descheduled.
        assert!(
            (15_000_000..2_000_000_000).contains(&d),
            "20 ms measured as {d} ns"
        );
    }
}
