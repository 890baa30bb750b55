//! Responses. Server: `enqueue_response` writes every packet header of the
//! response (packet k is numbered request packets - 1 + k) and sends the
//! first packet, which also returns the request's last credit; later
//! packets go out when RFRs ask for them. Client: response packets are
//! copied into the response msgbuf in order; the last one completes the
//! request and runs the continuation.

use transport::Transport;

use super::tx::write_msg_hdrs;
use super::{Completion, ReqHandle, RespondError, Rpc, RpcError, SessionNum};
use crate::consts::{MAX_MSG_BYTES, SESSION_REQ_WINDOW};
use crate::msgbuf::{MsgBuf, data_size_to_num_pkts, pkt_data_bytes};
use crate::pkthdr::{PktHdr, PktType, RxHdr};
use crate::session::SrvState;
use crate::stats::DropReason;

impl<T: Transport, C> Rpc<T, C> {
    /// Server: [`Rpc::enqueue_response`]. Writes every packet header of
    /// the response and queues its first packet. Always inlined into its
    /// one caller, so that the public method is this function.
    #[inline(always)]
    pub(crate) fn send_response(
        &mut self,
        h: ReqHandle,
        mut resp: MsgBuf,
    ) -> Result<(), RespondError> {
        let stale = RespondError::Stale {
            session: h.session,
            req_num: h.req_num,
        };
        self.tx_make_room();
        let Some(s) = self.sessions.session_mut(h.session) else {
            self.recycle(resp);
            return Err(stale);
        };
        // A handle's slot is below the window by construction.
        debug_assert!(usize::from(h.slot) < SESSION_REQ_WINDOW);
        let i = usize::from(h.slot) % SESSION_REQ_WINDOW;
        // A client session has no server halves: never awaiting.
        let awaiting = match s.half.as_server_mut() {
            Some(svs) if svs[i].busy() && s.slots[i].cur_req_num == h.req_num => svs,
            _ => {
                self.recycle(resp);
                return Err(stale);
            }
        };
        if s.state == crate::session::SessionState::Resetting {
            self.resetting_slot_done(h.session, i, Some(resp));
            return Err(Self::reset_respond_error(h.session, h.req_num));
        }
        let route = s.route.as_ref().expect("server session has a route");
        let slot = &mut s.slots[i];
        let sv = &mut awaiting[i];
        let base = sv.req_pkts - 1;
        write_msg_hdrs(
            &self.transport,
            route,
            &mut resp,
            PktHdr {
                req_type: sv.req_type,
                msg_size: 0,
                dest_session_num: s.remote_num,
                pkt_type: PktType::Resp,
                pkt_num: base as u16,
                req_num: h.req_num,
            },
        );
        sv.state = SrvState::Responded;
        // Usually none: single-packet requests are handled in the RX ring.
        let req = if sv.req_msgbuf.is_some() {
            sv.req_msgbuf.take()
        } else {
            None
        };
        slot.tx_msgbuf = Some(resp);
        self.stats.resps_enqueued += 1;
        // The first response packet (it also returns the request's last
        // credit); later ones go out when RFRs ask for them.
        Self::tx_push_msg(&mut self.tx, &mut self.stats, s, h.slot, 0, None);
        if let Some(m) = req {
            self.recycle(m);
        }
        Ok(())
    }

    /// Client: a response packet arrived.
    pub(crate) fn process_resp_pkt(&mut self, ctx: &mut C, hdr: RxHdr, data: &[u8]) {
        let sn = hdr.dest_session_num();
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        let now = self.now_ns;
        let msg_size = hdr.msg_size() as usize;
        let s = self
            .sessions
            .session_mut(sn)
            .expect("dispatch checked the session");
        let max_credits = s.credits_max;
        let slot = &s.slots[i];
        let c = &mut s.half.client_mut()[i];
        if hdr.req_num() == c.abandoned_req_num {
            // The request completed with an error; its slot may carry
            // another request by now.
            return self.stats.drop(DropReason::AbandonedRequest);
        }
        if slot.tx_msgbuf.is_none() {
            return self.stats.drop(DropReason::NoRequestInFlight);
        }
        if hdr.req_num() != slot.cur_req_num {
            return self.stats.drop(DropReason::StaleReqNum);
        }
        // Anything but the next expected packet, or a size beyond any
        // message's (a status packet: the server failed the request), goes
        // to the cold path.
        let pkt_num = u32::from(hdr.pkt_num());
        if pkt_num + 1 < c.req_pkts
            || pkt_num != c.num_rx
            || msg_size > MAX_MSG_BYTES
            || in_wheel(c, pkt_num)
        {
            return self.unexpected_resp_pkt(ctx, hdr);
        }
        debug_assert!(pkt_num < c.num_tx, "num_rx < num_tx while in flight");
        let k = (pkt_num + 1 - c.req_pkts) as usize;
        let mut too_large = None;
        if k == 0 {
            if data.len() != pkt_data_bytes(msg_size, 0) {
                return self.stats.drop(DropReason::SizeMismatch);
            }
            let m = c
                .resp_msgbuf
                .as_mut()
                .expect("in flight implies a response buffer");
            if msg_size > m.max_len() {
                too_large = Some(RpcError::ResponseTooLarge {
                    size: msg_size,
                    capacity: m.max_len(),
                });
            } else {
                m.resize_checked(msg_size);
                // Packet 0's data starts the message (checked length).
                m.data_mut()[..data.len()].copy_from_slice(data);
                c.resp_pkts = data_size_to_num_pkts(msg_size) as u32;
                c.resp_bytes = msg_size as u32;
            }
        } else {
            if msg_size != c.resp_bytes as usize || k >= c.resp_pkts as usize {
                return self.stats.drop(DropReason::SizeMismatch);
            }
            if data.len() != pkt_data_bytes(msg_size, k) {
                return self.stats.drop(DropReason::SizeMismatch);
            }
            let m = c
                .resp_msgbuf
                .as_mut()
                .expect("in flight implies a response buffer");
            m.write_pkt_data(k, data);
        }
        c.num_rx += 1;
        c.progress_ns = now;
        let done = c.num_rx == c.wire_pkts();
        self.stats.rx_accepted += 1;
        debug_assert!(s.credits < max_credits);
        s.credits = (s.credits + 1).min(max_credits);
        debug_assert_eq!(
            super::cr::credit_balance(s),
            Ok(()),
            "session {sn} after a response packet"
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
        if let Some(e) = too_large {
            return self.complete(ctx, sn, i, Err(e));
        }
        if done {
            return self.complete(ctx, sn, i, Ok(()));
        }
        // The steady state of a large response: this credit is the
        // session's only one, and the RFR for the next response packet
        // takes it.
        if let Some(pkt) = Self::take_only_credit(
            s,
            sn,
            i,
            true,
            self.tx.room(),
            self.pacing,
            self.config.cc.pace_window,
            now,
            &mut self.stallq,
            &mut self.pending,
        ) {
            if self.pacing.cc_on() {
                self.stats.wheel_bypassed += 1;
            }
            let req_type = s.half.client_mut()[i].req_type;
            return self.enqueue_ctrl(
                sn,
                i as u8,
                PktType::Rfr,
                req_type,
                pkt as u16,
                hdr.req_num(),
            );
        }
        self.kick(sn, i as u8);
    }

    /// [`Rpc::complete`] for a request that was rolled back: resent
    /// packets of it may have left through the timing wheel or the stall
    /// queue after the loss scan drained TX, so the transport lets go of
    /// them before its buffers go back to the application.
    #[cold]
    #[inline(never)]
    fn complete_resent(
        &mut self,
        ctx: &mut C,
        sn: SessionNum,
        i: usize,
        result: Result<(), RpcError>,
    ) {
        self.drain_tx();
        if let Some(s) = self.session_mut(sn) {
            s.half.client_mut()[i].resent = false;
        }
        self.complete(ctx, sn, i, result);
    }

    /// Client: a response header for the request in flight on its slot
    /// that is not the next expected response packet: a status packet
    /// (`rpc/status.rs`), or a drop counted by reason.
    #[cold]
    #[inline(never)]
    fn unexpected_resp_pkt(&mut self, ctx: &mut C, hdr: RxHdr) {
        let sn = hdr.dest_session_num();
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        let Some(s) = self.sessions.session(sn) else {
            return self.stats.drop(DropReason::UnknownSession);
        };
        let c = &s.half.client()[i];
        let pkt_num = u32::from(hdr.pkt_num());
        if hdr.msg_size() as usize > MAX_MSG_BYTES {
            return self.process_status_pkt(ctx, hdr);
        }
        let reason = if in_wheel(c, pkt_num) && pkt_num == c.num_rx {
            // An acknowledgement of an earlier transmission of a packet
            // that is waiting in the timing wheel to be sent again (a
            // rollback resent it): ignored, as the C++ eRPC does, so the
            // wheel never sends an acknowledged packet beyond the
            // session's credits; the resent copy is acknowledged in turn.
            DropReason::AckInWheel
        } else if pkt_num + 1 < c.req_pkts || pkt_num >= c.num_tx {
            DropReason::PktNumOutOfRange
        } else if pkt_num < c.num_rx {
            DropReason::Duplicate
        } else {
            DropReason::OutOfOrder
        };
        self.stats.drop(reason);
    }

    /// Frees client slot `i` and runs its continuation, then moves
    /// backlogged requests into free slots.
    #[inline(always)]
    pub(crate) fn complete(
        &mut self,
        ctx: &mut C,
        sn: SessionNum,
        i: usize,
        result: Result<(), RpcError>,
    ) {
        let s = self
            .sessions
            .session_mut(sn)
            .expect("caller checked the session");
        let slot = &mut s.slots[i];
        // The request leaves the slot: none of its packets may stay queued.
        self.tx
            .forget_slot(slot.tx_epoch, sn, i as u8, &mut self.stats.tx_stale);
        if s.half.client()[i].resent {
            return self.complete_resent(ctx, sn, i, result);
        }
        let c = &mut s.half.client_mut()[i];
        let cont = c.cont.take().expect("in flight");
        // Credits still out for this request (an early error) are returned.
        s.credits += c.num_tx - c.num_rx;
        let failed = result.is_err();
        if failed {
            // Later packets of its response are counted as such.
            c.abandoned_req_num = slot.cur_req_num;
        }
        // Built in place: the buffers move once, from the slot into the
        // continuation's argument.
        let comp = Completion {
            tag: c.tag,
            session: sn,
            req: slot.tx_msgbuf.take().expect("in flight"),
            resp: c.resp_msgbuf.take().expect("in flight"),
            result,
        };
        debug_assert_eq!(
            super::cr::credit_balance(s),
            Ok(()),
            "session {sn} after a request completed"
        );
        self.stats.reqs_completed += 1;
        if failed {
            self.stats.reqs_failed += 1;
        }
        cont(self, ctx, comp);
        self.refill_slot(sn, i);
    }
}

/// Whether packet `pkt` of client slot `c` is among those waiting in the
/// timing wheel (the last `wheel_count` it queued): an acknowledgement of
/// it can only be of an earlier transmission, before a rollback. One
/// compare when the slot has nothing in the wheel.
#[inline(always)]
pub(crate) fn in_wheel<T: Transport, C>(c: &crate::session::ClientInfo<T, C>, pkt: u32) -> bool {
    c.wheel_count != 0 && pkt + u32::from(c.wheel_count) >= c.num_tx
}
