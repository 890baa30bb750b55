//! Congestion control: Timely per client session ([`timely`]) and the
//! Carousel timing wheel that paces rate-limited sessions ([`wheel`]), with
//! the paper's common-case bypasses, each switchable in [`CcConfig`] so
//! their cost can be measured (the factor analysis of `erpc-bench`).
//!
//! How the Rpc uses them (`rpc/tx.rs`, `rpc/cr.rs`, `rpc/resp.rs`,
//! `rpc/loss.rs`):
//!
//! * every request packet and request-for-response a client sends gets a
//!   TX timestamp when it is handed to the transport (one clock read per
//!   burst with batched timestamps);
//! * every credit return and response packet that acknowledges one gives
//!   an RTT sample (receive time: one clock read per event-loop iteration
//!   with batched timestamps) and a Timely update (skipped at link rate
//!   when the RTT is at most `t_low`: the Timely bypass);
//! * a client's packets go through the wheel, departing `size / rate`
//!   after the session's previous one, unless the session is at link rate
//!   with none of the slot's packets in the wheel (the wheel bypass);
//! * a go-back-N rollback drops the slot's packets still in the wheel.

pub mod timely;
pub mod wheel;

use crate::consts::SESSION_CREDITS;
pub use timely::{Timely, TimelyParams, Update};
pub use wheel::{TimingWheel, WheelConfig, WheelEnt, WheelStats};

/// Congestion-control settings of an Rpc. Everything on by default, as a
/// user would run it; each optimisation can be switched off to measure it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CcConfig {
    /// Timely and the timing wheel at all (off: sessions send at will).
    pub enabled: bool,
    /// Skip Timely's update at link rate when the RTT is at most `t_low`.
    pub timely_bypass: bool,
    /// Send directly, not through the wheel, when the session is at link
    /// rate and none of the slot's packets waits in the wheel.
    pub wheel_bypass: bool,
    /// One clock read per RX/TX batch for RTT timestamps (off: one per
    /// packet).
    pub batch_timestamps: bool,
    /// The link rate sessions start at and never exceed, Gbit/s.
    pub link_gbps: f64,
    /// Timely's constants.
    pub timely: TimelyParams,
    /// Width of a wheel slot, ns (500).
    pub wheel_slot_ns: u64,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            enabled: true,
            timely_bypass: true,
            wheel_bypass: true,
            batch_timestamps: true,
            link_gbps: 25.0,
            timely: TimelyParams::default(),
            wheel_slot_ns: 500,
        }
    }
}

impl CcConfig {
    /// Everything off (no RTT measurement, no rate, no wheel).
    pub fn disabled() -> CcConfig {
        CcConfig {
            enabled: false,
            ..CcConfig::default()
        }
    }

    /// The link rate in bytes per second.
    pub fn link_rate(&self) -> f64 {
        self.link_gbps * 1e9 / 8.0
    }

    /// The wheel's horizon: the time a session at Timely's minimum rate
    /// needs to send a full window of credits of MTU-size packets (the
    /// C++ eRPC's `kWheelHorizonUs`, ≈ 2184.5 µs with the defaults).
    pub fn wheel(&self) -> WheelConfig {
        let bytes = (SESSION_CREDITS * transport::MTU) as f64;
        WheelConfig {
            slot_ns: self.wheel_slot_ns.max(1),
            horizon_ns: (bytes / self.timely.min_rate * 1e9).ceil() as u64,
        }
    }
}

/// Congestion-control state of a client session.
#[derive(Debug, Clone)]
pub(crate) struct SessionCc {
    pub timely: Timely,
    /// Departure time of the session's last paced packet.
    pub prev_desired_tx_ns: u64,
    /// The last RTT sample, ns (bypassed and ignored samples included),
    /// for diagnostics: `None` before the first acknowledgement.
    pub last_rtt_ns: Option<u64>,
}

impl SessionCc {
    pub(crate) fn new(cfg: &CcConfig, now_ns: u64) -> SessionCc {
        SessionCc {
            timely: Timely::new(cfg.timely, cfg.link_rate(), now_ns),
            prev_desired_tx_ns: now_ns,
            last_rtt_ns: None,
        }
    }

    /// The departure time of a `bytes`-long packet: `bytes / rate` after
    /// the previous one, not before now.
    #[inline]
    pub(crate) fn next_tx_ns(&mut self, now_ns: u64, bytes: usize) -> u64 {
        let gap = (bytes as f64 * 1e9 / self.timely.rate()) as u64;
        let t = (self.prev_desired_tx_ns + gap).max(now_ns);
        self.prev_desired_tx_ns = t;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_is_the_cpp_one() {
        let w = CcConfig::default().wheel();
        assert_eq!(w.slot_ns, 500);
        assert_eq!(w.horizon_ns, 2_184_534);
    }

    #[test]
    fn pacing_spaces_packets_by_size_over_rate() {
        let cfg = CcConfig {
            link_gbps: 8.0, // 1e9 B/s: 1 ns per byte
            ..CcConfig::default()
        };
        let mut s = SessionCc::new(&cfg, 1_000);
        assert_eq!(s.next_tx_ns(1_000, 1024), 2_024);
        assert_eq!(s.next_tx_ns(1_000, 1024), 3_048);
        // Idle for long: not before now.
        assert_eq!(s.next_tx_ns(1_000_000, 1024), 1_000_000);
    }
}
