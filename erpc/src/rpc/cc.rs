//! Congestion control at the Rpc: pacing a client's packets through the
//! timing wheel, TX timestamps, RTT samples and Timely updates (see
//! [`crate::cc`]).

use std::cell::Cell;

use transport::{PKTHDR_BYTES, Transport};

use super::Rpc;
use crate::cc::{SessionCc, Update, WheelEnt};
use crate::msgbuf::pkt_data_bytes;
use crate::pkthdr::PktType;
use crate::session::{Role, SessionState};

/// The TX timestamps of an active client session's packets in flight:
/// `cap` cells per slot (a power of two at least the credits), indexed by
/// packet number modulo `cap` (see [`ts_index`]).
pub(crate) fn new_ts_array(cap: usize) -> std::rc::Rc<[Cell<u64>]> {
    (0..cap * crate::consts::SESSION_REQ_WINDOW)
        .map(|_| Cell::new(0))
        .collect()
}

/// How many more packets a client slot may hand to the timing wheel now,
/// with at most `window` of them waiting there (`CcConfig::pace_window`,
/// not 0). The rest stay unsent in the stall queue, which kicks the slot
/// again every event-loop iteration, and are paced once earlier ones have
/// left, at the rate of that moment. (Packets that bypass the wheel leave
/// `wheel_count` at 0, so a session at link rate is not held back: `kick`
/// takes `window` at a time until its credits run out.)
#[inline]
pub(crate) fn pace_room(wheel_count: u16, window: u16) -> u32 {
    u32::from(window.saturating_sub(wheel_count))
}

/// How a client slot's burst is paced, decided once per Rpc from the
/// configuration (the wheel exists exactly when congestion control is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pacing {
    /// Congestion control off: no wheel, nothing paced.
    Off,
    /// Every burst goes through the wheel (the wheel bypass off, or only a
    /// slot's first unacknowledged packet may bypass it: `cc_pace` decides
    /// that packet by packet).
    Always,
    /// A burst bypasses the wheel when its session is uncongested and none
    /// of the slot's packets are in the wheel (the wheel bypass).
    UnlessUncongested,
}

impl Pacing {
    pub(crate) fn new(cfg: &crate::cc::CcConfig) -> Pacing {
        if !cfg.enabled {
            Pacing::Off
        } else if cfg.wheel_bypass && !cfg.wheel_bypass_first_only {
            Pacing::UnlessUncongested
        } else {
            Pacing::Always
        }
    }

    /// Congestion control is on (the Rpc has a timing wheel).
    #[inline(always)]
    pub(crate) fn cc_on(self) -> bool {
        self != Pacing::Off
    }
}

/// Whether a client slot's burst goes through the timing wheel (decided
/// once per burst, see `kick`): with congestion control on, unless the
/// wheel bypass holds for the whole burst — an uncongested session with
/// none of the slot's packets in the wheel (`wheel_count`). With
/// `wheel_bypass_first_only` the burst counts as paced and `cc_pace`
/// decides packet by packet.
#[inline(always)]
pub(crate) fn burst_paced(pacing: Pacing, wheel_count: u16, cc: Option<&SessionCc>) -> bool {
    match pacing {
        Pacing::Off => false,
        Pacing::Always => true,
        Pacing::UnlessUncongested => !(wheel_count == 0 && cc.is_none_or(|cc| cc.uncongested())),
    }
}

/// Where the TX timestamp of packet `pkt` of client slot `slot` is kept in
/// its session's `tx_ts`: `cap` cells per slot (`Rpc::tx_ts_cap`, a power
/// of two at least the credits), by packet number modulo `cap`.
#[inline(always)]
pub(crate) fn ts_index(cap: usize, slot: usize, pkt: u32) -> usize {
    slot * cap + (pkt as usize & (cap - 1))
}

/// The receive time of an acknowledgement: the event-loop iteration's
/// clock reading `now_ns` with batched timestamps, a fresh read otherwise
/// (the acknowledgement paths hold their session while they take it).
#[inline(always)]
pub(crate) fn rx_time(cfg: &crate::cc::CcConfig, now_ns: u64, clock: &crate::clock::Clock) -> u64 {
    if cfg.batch_timestamps {
        now_ns
    } else {
        clock.now_ns()
    }
}

/// An RTT sample for client session `s`: the acknowledgement of the packet
/// whose TX timestamp is cell `ts_at` arrived at `rx_ns`. Out of line, and
/// given the session its caller holds: no second lookup, and the response
/// path keeps its registers.
#[inline(never)]
pub(crate) fn rtt_sample<T: Transport, C>(
    s: &mut crate::session::Session<T, C>,
    ts_at: usize,
    rx_ns: u64,
    bypass: bool,
    stats: &mut crate::stats::RpcStats,
) {
    let Some(cc) = s.cc.as_mut() else { return };
    let Some(ts) = s.tx_ts.get(ts_at) else {
        return;
    };
    let rtt = rx_ns.saturating_sub(ts.get());
    match cc.update(rx_ns, rtt, bypass) {
        Update::Updated => stats.timely_updates += 1,
        Update::Bypassed => stats.timely_bypassed += 1,
        Update::Ignored => {}
    }
}

impl<T: Transport, C> Rpc<T, C> {
    /// Puts packet `pkt` of client slot `i` into the timing wheel unless
    /// the session may send it now (CC off, or the wheel bypass). Returns
    /// true if the wheel took it.
    #[inline]
    pub(crate) fn cc_pace(&mut self, session: u16, i: u8, pkt: u32, req_num: u64) -> bool {
        let Some(wheel) = self.wheel.as_mut() else {
            return false;
        };
        let bypass = self.config.cc.wheel_bypass;
        let first_only = self.config.cc.wheel_bypass_first_only;
        let now = self.now_ns;
        let Some(s) = self.sessions.session_mut(session) else {
            return false;
        };
        let Some(cc) = s.cc.as_mut() else {
            return false;
        };
        let c = &mut s.half.client_mut()[usize::from(i)];
        if bypass && c.wheel_count == 0 && cc.uncongested() && (!first_only || pkt == c.num_rx) {
            self.stats.wheel_bypassed += 1;
            return false;
        }
        let bytes = if pkt < c.req_pkts {
            PKTHDR_BYTES + pkt_data_bytes(c.req_bytes as usize, pkt as usize)
        } else {
            PKTHDR_BYTES
        };
        let at = cc.next_tx_ns(now, bytes);
        let ent = WheelEnt {
            req_num,
            session,
            pkt_num: pkt as u16,
            slot: i,
            generation: c.wheel_gen,
        };
        match wheel.insert(ent, now, at) {
            Ok(()) => {
                c.wheel_count += 1;
                self.pending |= super::ev_loop::PENDING_WHEEL;
                true
            }
            Err(_) => false,
        }
    }

    /// Sends the wheel's packets whose departure time has come. Packets of
    /// a request that completed, or that was rolled back since, are
    /// dropped (counted), never sent twice.
    #[inline(never)]
    pub(crate) fn process_wheel(&mut self) {
        let now = self.now_ns;
        match self.wheel.as_mut() {
            Some(w) if !w.is_empty() => w.reap(now),
            _ => return,
        }
        while let Some(e) = self.wheel.as_mut().and_then(|w| w.pop_ready()) {
            let k = usize::from(e.slot);
            let live = self
                .sessions
                .session_mut(e.session)
                .filter(|s| s.role == Role::Client && s.state == SessionState::Connected)
                .filter(|s| {
                    let sl = &s.slots[k];
                    sl.tx_msgbuf.is_some()
                        && sl.cur_req_num == e.req_num
                        && s.half.client()[k].wheel_gen == e.generation
                })
                .map(|s| &mut s.half.client_mut()[k]);
            let Some(c) = live else {
                self.stats.wheel_stale += 1;
                continue;
            };
            c.wheel_count -= 1;
            let (req_pkts, req_type) = (c.req_pkts, c.req_type);
            let pkt = u32::from(e.pkt_num);
            if pkt < req_pkts {
                self.enqueue_msg_pkt(e.session, e.slot, pkt, e.req_num);
            } else {
                self.enqueue_ctrl(
                    e.session,
                    e.slot,
                    PktType::Rfr,
                    req_type,
                    e.pkt_num,
                    e.req_num,
                );
            }
        }
    }
}

impl<T: Transport, C> Rpc<T, C> {
    /// Congestion control as the debug endpoint shows it (`None` when it
    /// is off).
    pub(crate) fn cc_view(&self) -> Option<crate::inspect::CcView> {
        let w = self.wheel.as_ref()?;
        let cfg = &self.config.cc;
        let st = w.stats();
        Some(crate::inspect::CcView {
            link_gbps: cfg.link_gbps,
            min_gbps: cfg.timely.min_rate * 8.0 / 1e9,
            timely_bypass: cfg.timely_bypass,
            wheel_bypass: cfg.wheel_bypass,
            wheel_queued: w.len(),
            wheel_inserted: st.inserted,
            wheel_reaped: st.reaped,
            wheel_clamped: st.clamped,
            wheel_overflow: st.overflow,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::CcConfig;

    /// `Pacing` decides exactly what the configuration's three switches
    /// and the session's state decided when they were read per burst.
    #[test]
    fn pacing_mode_matches_the_configuration_for_every_burst() {
        let uncongested = SessionCc::new(&CcConfig::default(), 0);
        let mut congested = SessionCc::new(&CcConfig::default(), 0);
        // RTT samples far above Timely's high threshold lower the rate.
        for k in 1..=100u64 {
            if !congested.uncongested() {
                break;
            }
            congested.update(k * 1_000_000, 5_000_000, true);
        }
        assert!(uncongested.uncongested() && !congested.uncongested());
        for bits in 0..8u8 {
            let cfg = CcConfig {
                enabled: bits & 1 != 0,
                wheel_bypass: bits & 2 != 0,
                wheel_bypass_first_only: bits & 4 != 0,
                ..CcConfig::default()
            };
            let pacing = Pacing::new(&cfg);
            assert_eq!(pacing.cc_on(), cfg.enabled);
            for wheel_count in [0u16, 1, 5] {
                for cc in [None, Some(&uncongested), Some(&congested)] {
                    let per_burst = cfg.enabled
                        && (cfg.wheel_bypass_first_only
                            || !(cfg.wheel_bypass
                                && wheel_count == 0
                                && cc.is_none_or(|c| c.uncongested())));
                    assert_eq!(
                        burst_paced(pacing, wheel_count, cc),
                        per_burst,
                        "{cfg:?} wheel_count {wheel_count} cc {:?}",
                        cc.map(|c| c.uncongested())
                    );
                }
            }
        }
    }
}
