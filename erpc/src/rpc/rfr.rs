//! Requests for response. After the first response packet, the client
//! pulls each further one with an RFR (size 0, packet number = packets it
//! has sent for the request), within its credits; the server answers RFR
//! number `p` with the response packet numbered `p`.

use transport::Transport;

use super::Rpc;
use crate::consts::SESSION_REQ_WINDOW;
use crate::pkthdr::RxHdr;
use crate::session::SrvState;
use crate::stats::DropReason;

impl<T: Transport, C> Rpc<T, C> {
    /// Server: an RFR arrived. Bytes after the header are ignored (the
    /// C++ eRPC sends 8); a non-zero message size is refused.
    pub(crate) fn process_rfr(&mut self, hdr: RxHdr, _trailing: &[u8]) {
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
        let slot = &s.slots[i];
        if hdr.req_num() != slot.cur_req_num {
            return self.stats.drop(DropReason::StaleReqNum);
        }
        let sv = &mut s.half.server_mut()[i];
        if sv.state != SrvState::Responded {
            return self.stats.drop(DropReason::OutOfOrder);
        }
        let resp_pkts = slot.tx_msgbuf.as_ref().map_or(0, |m| m.num_pkts()) as u32;
        let pkt_num = u32::from(hdr.pkt_num());
        // Response packet k carries number req_pkts - 1 + k; RFRs ask for
        // k >= 1.
        if pkt_num < sv.req_pkts || pkt_num >= sv.req_pkts - 1 + resp_pkts {
            return self.stats.drop(DropReason::PktNumOutOfRange);
        }
        if pkt_num > sv.next_rfr {
            return self.stats.drop(DropReason::OutOfOrder);
        }
        let resp_idx = pkt_num - (sv.req_pkts - 1);
        self.stats.rx_accepted += 1;
        if pkt_num == sv.next_rfr {
            sv.next_rfr += 1;
            sv.progress_ns = now;
            if self.tx.room() != 0 {
                // What `enqueue_msg_pkt` would do, with the session in
                // hand: the checks above found the slot on this request
                // with the response holding packet `resp_idx`, and a
                // server packet carries no TX timestamp.
                return Self::tx_push_msg(
                    &mut self.tx,
                    &mut self.stats,
                    s,
                    i as u8,
                    resp_idx,
                    None,
                );
            }
            self.enqueue_msg_pkt(sn, i as u8, resp_idx, hdr.req_num());
        } else {
            // A retransmitted RFR: send the packet again, and let the NIC
            // go of it before the response buffer can be recycled.
            self.stats.dup_rfr_resent += 1;
            self.enqueue_msg_pkt(sn, i as u8, resp_idx, hdr.req_num());
            self.drain_tx();
        }
    }
}
