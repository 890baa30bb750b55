//! Congestion control: Timely per client session ([`timely`]) and the
//! Carousel timing wheel that paces rate-limited sessions ([`wheel`]), with
//! the paper's common-case bypasses, each switchable in [`CcConfig`] so
//! their cost can be measured (the factor analysis of `erpc-bench`).
//! Timely is the default; a delay-target controller in the manner of
//! Swift ([`swift`]) can be selected instead ([`Controller`],
//! [`CcConfig::swift`]).
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

pub(crate) mod swift;
pub(crate) mod timely;
pub(crate) mod wheel;

use crate::consts::SESSION_CREDITS;
pub(crate) use swift::Swift;
pub use swift::SwiftParams;
pub use timely::TimelyParams;
pub(crate) use timely::{Timely, Update};
pub(crate) use wheel::{TimingWheel, WheelEnt};
pub use wheel::{WheelConfig, WheelStats};

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
    /// Restrict the wheel bypass to a slot's first unacknowledged packet:
    /// a lone packet (a small RPC) still leaves at once, but the rest of
    /// a burst at link rate is paced, so the RTT samples of its packets
    /// do not include their wait in the sender's own NIC queue (what a
    /// delay target of a few µs needs; off for Timely, as in the C++
    /// eRPC).
    pub wheel_bypass_first_only: bool,
    /// One clock read per RX/TX batch for RTT timestamps (off: one per
    /// packet).
    pub batch_timestamps: bool,
    /// The link rate sessions start at and never exceed, Gbit/s.
    pub link_gbps: f64,
    /// Which rate controller sessions run (Timely by default).
    pub controller: Controller,
    /// Timely's constants. `timely.min_rate` is also the wheel's horizon
    /// unit, whichever controller runs.
    pub timely: TimelyParams,
    /// The delay-target controller's constants (used with
    /// [`Controller::Swift`]).
    pub swift: SwiftParams,
    /// Width of a wheel slot, ns (500).
    pub wheel_slot_ns: u64,
    /// Most packets a client slot keeps in the wheel at once (0: no
    /// limit, as the C++ eRPC). Without a limit a slot hands all its
    /// credits' packets to the wheel at once, each scheduled at the rate
    /// of that moment, so a new rate takes effect only after up to 32
    /// packets (at 1/100 of 25 Gbit/s, about a millisecond). With a limit
    /// the rest wait in the credit-stall queue, kicked every event-loop
    /// iteration, and are scheduled when earlier ones leave.
    pub pace_window: u16,
    /// Run congestion control also on a transport whose round trip is a
    /// host software stack's rather than the network's
    /// ([`transport::Transport::rtt_is_network`] false: kernel UDP). Off by
    /// default: there, the kernel's socket queues put the RTT above
    /// Timely's `t_low` whenever the sessions are busy, with no network
    /// congestion to relieve, and pacing only splits the transmit batches
    /// (more system calls, so longer queues): over loopback, `erpc-bench
    /// --transport udp` at B = 8 held every session at Timely's minimum
    /// rate, 0.44 of the raw echo's rate at 2.3× the median latency of CC
    /// off (BENCHMARKS.md). An Rpc created with this off on such a
    /// transport runs with `enabled` false, and its config says so.
    pub on_software_stack: bool,
}

/// The rate controller of every client session of an Rpc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Controller {
    /// Timely with the C++ eRPC's constants (the paper's choice).
    #[default]
    Timely,
    /// The delay-target controller of Swift (SIGCOMM 2020): a target RTT near the
    /// base RTT, additive increase below it, multiplicative decrease
    /// proportional to the excess at most once per RTT.
    Swift,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            enabled: true,
            timely_bypass: true,
            wheel_bypass: true,
            wheel_bypass_first_only: false,
            batch_timestamps: true,
            link_gbps: 25.0,
            controller: Controller::Timely,
            timely: TimelyParams::default(),
            swift: SwiftParams::default(),
            wheel_slot_ns: 500,
            pace_window: 0,
            on_software_stack: false,
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

    /// The delay-target controller ([`Controller::Swift`]) as it is
    /// meant to run: the wheel bypass only for a slot's first
    /// unacknowledged packet (a burst of credits at link rate would wait
    /// in the sender's own NIC queue, and its RTT samples would read that
    /// as congestion; a lone small request still leaves at once), at most
    /// one packet per slot in the wheel (a new rate applies from the next
    /// packet), Timely's minimum rate (so the wheel's horizon is the
    /// same), and 100 ns wheel slots: a paced packet leaves at the end of
    /// its slot, and with 0.5 µs slots that rounding alone cost ≈ 0.4 µs
    /// of probe p99 at N = 100 (`erpc-bench incast`,
    /// BENCHMARKS.md); the price is a wheel of 5× the slots (≈ 22 000,
    /// ≈ 2.3 MB per Rpc) and 5× the slot steps when reaping.
    pub fn swift() -> CcConfig {
        let d = CcConfig::default();
        CcConfig {
            controller: Controller::Swift,
            wheel_bypass_first_only: true,
            pace_window: 1,
            wheel_slot_ns: 100,
            swift: SwiftParams {
                min_rate: d.timely.min_rate,
                ..SwiftParams::default()
            },
            ..d
        }
    }

    /// The link rate in bytes per second.
    pub fn link_rate(&self) -> f64 {
        self.link_gbps * 1e9 / 8.0
    }

    /// The wheel's horizon: the time a session at the minimum rate
    /// needs to send a full window of credits of MTU-size packets (the
    /// C++ eRPC's `kWheelHorizonUs`, ≈ 2184.5 µs with the defaults).
    pub fn wheel(&self) -> WheelConfig {
        let bytes = (SESSION_CREDITS * transport::MTU) as f64;
        let min_rate = match self.controller {
            Controller::Timely => self.timely.min_rate,
            Controller::Swift => self.swift.min_rate.max(self.timely.min_rate),
        };
        WheelConfig {
            slot_ns: self.wheel_slot_ns.max(1),
            horizon_ns: (bytes / min_rate * 1e9).ceil() as u64,
        }
    }
}

/// A session's rate controller.
#[derive(Debug, Clone)]
pub(crate) enum RateCtl {
    /// Timely.
    Timely(Timely),
    /// The delay-target controller.
    Swift(Swift),
}

/// An Rpc's controller parameters, shared by its sessions' controllers
/// (a session holds a pointer, not a copy: issue 28's small sessions).
#[derive(Debug, Clone)]
pub(crate) struct CcShared {
    timely: std::sync::Arc<TimelyParams>,
    swift: std::sync::Arc<SwiftParams>,
}

impl CcShared {
    pub(crate) fn new(cfg: &CcConfig) -> CcShared {
        CcShared {
            timely: std::sync::Arc::new(cfg.timely),
            swift: std::sync::Arc::new(cfg.swift),
        }
    }
}

impl RateCtl {
    /// A controller of the configured kind at the link rate, with the
    /// parameters of `sh` (those of `cfg`).
    pub(crate) fn shared(cfg: &CcConfig, sh: &CcShared, now_ns: u64) -> RateCtl {
        match cfg.controller {
            Controller::Timely => {
                RateCtl::Timely(Timely::new(sh.timely.clone(), cfg.link_rate(), now_ns))
            }
            Controller::Swift => {
                RateCtl::Swift(Swift::new(sh.swift.clone(), cfg.link_rate(), now_ns))
            }
        }
    }

    /// The current rate, bytes/s.
    #[inline]
    pub(crate) fn rate(&self) -> f64 {
        match self {
            RateCtl::Timely(t) => t.rate(),
            RateCtl::Swift(s) => s.rate(),
        }
    }

    /// True at the link rate.
    #[inline]
    pub(crate) fn uncongested(&self) -> bool {
        match self {
            RateCtl::Timely(t) => t.uncongested(),
            RateCtl::Swift(s) => s.uncongested(),
        }
    }

    /// A retransmission timeout of one of the session's requests: Timely
    /// ignores it (as in the C++ eRPC); the delay-target controller
    /// restarts from its minimum rate ([`Swift::on_timeout`]).
    #[inline]
    pub(crate) fn on_timeout(&mut self, now_ns: u64) {
        match self {
            RateCtl::Timely(_) => {}
            RateCtl::Swift(s) => s.on_timeout(now_ns),
        }
    }

    /// An RTT sample (see [`Timely::update`], [`Swift::update`]).
    #[inline(always)]
    pub(crate) fn update(&mut self, now_ns: u64, rtt_ns: u64, bypass: bool) -> Update {
        match self {
            RateCtl::Timely(t) => t.update(now_ns, rtt_ns, bypass),
            RateCtl::Swift(s) => s.update(now_ns, rtt_ns, bypass),
        }
    }
}

/// Congestion-control state of a client session.
#[derive(Debug, Clone)]
pub(crate) struct SessionCc {
    ctl: RateCtl,
    /// `ctl.uncongested()`, kept current by [`SessionCc::update`] and
    /// [`SessionCc::on_timeout`] (the only ways the rate changes), so the
    /// per-packet wheel bypass reads a byte instead of asking the
    /// controller.
    uncongested: bool,
    /// Timely with its bypass on: one more than `t_low`, ns. At the link
    /// rate a sample below it is Timely's bypass, decided here without a
    /// call. 0 otherwise (no sample is below it).
    quick_bypass_below_ns: u64,
    /// Departure time of the session's last paced packet.
    pub prev_desired_tx_ns: u64,
    /// The last RTT sample, ns (bypassed and ignored samples included),
    /// for diagnostics: `None` before the first acknowledgement.
    pub last_rtt_ns: Option<u64>,
}

impl SessionCc {
    #[cfg(test)]
    pub(crate) fn new(cfg: &CcConfig, now_ns: u64) -> SessionCc {
        SessionCc::shared(cfg, &CcShared::new(cfg), now_ns)
    }

    /// A new session's state, with the Rpc's shared parameters `sh`.
    pub(crate) fn shared(cfg: &CcConfig, sh: &CcShared, now_ns: u64) -> SessionCc {
        let ctl = RateCtl::shared(cfg, sh, now_ns);
        let quick_bypass_below_ns = match &ctl {
            RateCtl::Timely(t) if cfg.timely_bypass => t.t_low_ns() + 1,
            _ => 0,
        };
        SessionCc {
            uncongested: ctl.uncongested(),
            ctl,
            quick_bypass_below_ns,
            prev_desired_tx_ns: now_ns,
            last_rtt_ns: None,
        }
    }

    /// The rate controller.
    #[inline]
    pub(crate) fn ctl(&self) -> &RateCtl {
        &self.ctl
    }

    /// At the link rate (not rate limited).
    #[inline(always)]
    pub(crate) fn uncongested(&self) -> bool {
        self.uncongested
    }

    /// An RTT sample for the controller (see [`RateCtl::update`]); Timely's
    /// bypass is decided here, exactly as Timely decides it, without the
    /// call.
    #[inline(always)]
    pub(crate) fn update(&mut self, now_ns: u64, rtt_ns: u64, bypass: bool) -> Update {
        self.last_rtt_ns = Some(rtt_ns);
        if self.uncongested && rtt_ns < self.quick_bypass_below_ns {
            debug_assert!(bypass, "set only with the bypass on");
            return Update::Bypassed;
        }
        self.update_ctl(now_ns, rtt_ns, bypass)
    }

    /// The controller's own update, out of line: the bypass above then
    /// needs no stack frame in its caller.
    #[inline(never)]
    fn update_ctl(&mut self, now_ns: u64, rtt_ns: u64, bypass: bool) -> Update {
        let u = self.ctl.update(now_ns, rtt_ns, bypass);
        self.uncongested = self.ctl.uncongested();
        u
    }

    /// A retransmission timeout (see [`RateCtl::on_timeout`]).
    #[inline]
    pub(crate) fn on_timeout(&mut self, now_ns: u64) {
        self.ctl.on_timeout(now_ns);
        self.uncongested = self.ctl.uncongested();
    }

    /// The departure time of a `bytes`-long packet: `bytes / rate` after
    /// the previous one, not before now.
    #[inline]
    pub(crate) fn next_tx_ns(&mut self, now_ns: u64, bytes: usize) -> u64 {
        let gap = (bytes as f64 * 1e9 / self.ctl.rate()) as u64;
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
