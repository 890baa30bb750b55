//! Explicit credit returns. The server sends one for every request packet
//! but the last (same request and packet number, size 0); the client
//! regains one credit per CR and may send more request packets.
//!
//! The session credit invariant (`session.rs`) lives here too: a client
//! session's credits plus the packets of its busy slots not yet
//! acknowledged equal its credits in all ([`credit_balance`]). Debug
//! builds assert it where it must hold: after request packets are sent
//! (`req.rs`), a credit return or a response packet is taken
//! (`process_expl_cr`, `process_resp_pkt`), a request completes
//! (`complete`) and a slot is rolled back (`loss.rs`).

use transport::Transport;

use super::Rpc;
use crate::consts::SESSION_REQ_WINDOW;
use crate::pkthdr::{PktType, RxHdr};
use crate::session::{Role, Session};
use crate::stats::DropReason;

impl<T: Transport, C> Rpc<T, C> {
    /// Server: queues a credit return for request packet `req_hdr`.
    pub(crate) fn enqueue_cr(&mut self, sn: u16, slot: u8, req_hdr: RxHdr) {
        self.enqueue_ctrl(
            sn,
            slot,
            PktType::ExplCr,
            req_hdr.req_type(),
            req_hdr.pkt_num(),
            req_hdr.req_num(),
        );
    }

    /// Client: a credit return arrived. Bytes after the header are
    /// ignored: the C++ eRPC sends 8 (its control buffers have 8 data
    /// bytes), and a NIC may pad a short frame. A non-zero message size
    /// is refused.
    pub(crate) fn process_expl_cr(&mut self, hdr: RxHdr, _trailing: &[u8]) {
        if hdr.msg_size() != 0 {
            return self.stats.drop(DropReason::CtrlHasData);
        }
        let sn = hdr.dest_session_num();
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        let now = self.now_ns;
        let s = self
            .sessions
            .session_mut(sn)
            .expect("dispatch checked the session");
        let max_credits = s.credits_max;
        let slot = &s.slots[i];
        let c = &mut s.half.client_mut()[i];
        if slot.tx_msgbuf.is_none() {
            return self.stats.drop(if hdr.req_num() == c.abandoned_req_num {
                DropReason::AbandonedRequest
            } else {
                DropReason::NoRequestInFlight
            });
        }
        if hdr.req_num() != slot.cur_req_num {
            return self.stats.drop(DropReason::StaleReqNum);
        }
        let pkt_num = u32::from(hdr.pkt_num());
        if pkt_num + 1 >= c.req_pkts || pkt_num >= c.num_tx {
            return self.stats.drop(DropReason::PktNumOutOfRange);
        }
        if pkt_num != c.num_rx {
            return self.stats.drop(if pkt_num < c.num_rx {
                DropReason::Duplicate
            } else {
                DropReason::OutOfOrder
            });
        }
        if super::resp::in_wheel(c, pkt_num) {
            // See `DropReason::AckInWheel`.
            return self.stats.drop(DropReason::AckInWheel);
        }
        c.num_rx += 1;
        c.progress_ns = now;
        self.stats.rx_accepted += 1;
        debug_assert!(s.credits < max_credits);
        s.credits = (s.credits + 1).min(max_credits);
        debug_assert_eq!(
            credit_balance(s),
            Ok(()),
            "session {sn} after a credit return"
        );
        if self.pacing.cc_on() {
            // The RTT sample, with the session in hand.
            let rx = super::cc::rx_time(&self.config.cc, now, &self.clock);
            super::cc::rtt_sample(
                s,
                super::cc::ts_index(self.tx_ts_cap, i, pkt_num),
                rx,
                self.config.cc.timely_bypass,
                &mut self.stats,
            );
        }
        if !slot_has_more(&s.half.client()[i]) {
            return;
        }
        // The steady state of a large request: this credit is the
        // session's only one, and the slot's next request packet takes it.
        if let Some(pkt) = Self::take_only_credit(
            s,
            sn,
            i,
            false,
            self.tx.room(),
            self.pacing,
            self.config.cc.pace_window,
            now,
            &mut self.stallq,
            &mut self.pending,
        ) {
            let ts_at = if self.pacing.cc_on() {
                self.stats.wheel_bypassed += 1;
                Some(super::cc::ts_index(self.tx_ts_cap, i, pkt))
            } else {
                None
            };
            return Self::tx_push_msg(&mut self.tx, &mut self.stats, s, i as u8, pkt, ts_at);
        }
        self.kick(sn, i as u8);
    }
}

#[inline]
pub(crate) fn slot_has_more<T: Transport, C>(c: &crate::session::ClientInfo<T, C>) -> bool {
    c.num_tx < c.wire_pkts()
}

/// The session credit invariant of `s`: at a client, `credits` plus
/// `num_tx - num_rx` over the slots with a request equals `credits_max`.
/// `Err((credits, unacknowledged))` when it does not hold; a server
/// session holds no credits and always passes.
pub(crate) fn credit_balance<T: Transport, C>(s: &Session<T, C>) -> Result<(), (u32, u32)> {
    if s.role != Role::Client {
        return Ok(());
    }
    let out: u32 = s
        .slots
        .iter()
        .zip(s.half.client().iter())
        .filter(|(sl, _)| sl.tx_msgbuf.is_some())
        .map(|(_, c)| c.num_tx - c.num_rx)
        .sum();
    if s.credits + out == s.credits_max {
        Ok(())
    } else {
        Err((s.credits, out))
    }
}
