//! Status packets: how a server answers a request it cannot respond to.
//!
//! The C++ eRPC drops such a request (no handler for its type, no memory
//! to reassemble it), and its client resends it every retransmission
//! timeout, forever. An erpc-rs server instead fails the request: the
//! server slot moves to `SrvState::Failed` with a [`ServerError`] code, and
//! a *status packet* goes back, a response header with no data whose
//! message size is `pkthdr::STATUS_SIZE_BASE + code` (no message is ever
//! that large) and whose packet number is the first response packet's.
//! The client completes the request with [`RpcError::Server`]. A duplicate
//! of the request (a retransmission that crossed the status packet, or
//! one sent because the status packet was lost) gets the status packet
//! again, and the handler never runs: at-most-once holds as for a
//! response. The client's next request on the slot buries the failed one,
//! as it buries a response.
//!
//! A retransmission of a request whose handler still runs (a slow
//! handler, a background one, a deferred response) gets an "in progress"
//! status packet (code 0) instead of silence: the client's stall bound
//! (`RpcConfig::stall_timeout_ms`) counts it as progress, so it can tell
//! a slow handler from a server whose Rpc stopped running. It completes
//! nothing; the retransmission timeout keeps asking.
//!
//! Status packets go only to erpc-rs clients (their SM endpoints carry an
//! incarnation). A C++ eRPC client would take the size for a response's,
//! so toward one the server keeps the C++ behaviour: a request without a
//! handler is dropped (and counted), and memory shortage rolls the slot
//! back so that a retransmission can try again.

use transport::Transport;

use super::{Rpc, RpcError, ServerError, SessionNum};
use crate::consts::SESSION_REQ_WINDOW;
use crate::pkthdr::{PktType, RxHdr, STATUS_SIZE_BASE};
use crate::session::SrvState;
use crate::stats::DropReason;

/// The status code that says "in progress", never an error.
const IN_PROGRESS: u8 = 0;

impl<T: Transport, C> Rpc<T, C> {
    /// Whether the client of server session `sn` reads status packets (an
    /// erpc-rs peer).
    pub(crate) fn reads_status(&self, sn: SessionNum) -> bool {
        self.session(sn).is_some_and(|s| s.remote_incarnation != 0)
    }

    /// Server: fails the request on slot `i` of session `sn`, which is the
    /// slot's current request with its header fields recorded (type,
    /// packets), and tells the client. Its reassembly buffer, if any, is
    /// released.
    #[cold]
    #[inline(never)]
    pub(crate) fn fail_request(&mut self, sn: SessionNum, i: usize, err: ServerError) {
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        let sv = &mut s.half.server_mut()[i];
        debug_assert!(!sv.busy(), "a handler still holds the request");
        sv.state = SrvState::Failed;
        sv.status = err.code();
        let req = sv.req_msgbuf.take();
        self.stats.reqs_failed_at_server += 1;
        if let Some(m) = req {
            self.recycle(m);
        }
        tracing::debug!(session = sn, slot = i, %err, "failing a request at the server");
        self.send_status(sn, i);
    }

    /// Server: queues the status packet of the failed request on slot `i`
    /// of session `sn` (its first answer, or again for a duplicate).
    pub(crate) fn send_status(&mut self, sn: SessionNum, i: usize) {
        let Some(s) = self.session(sn) else {
            return;
        };
        let sv = &s.half.server()[i];
        debug_assert_eq!(sv.state, SrvState::Failed);
        let code = sv.status;
        if self.send_status_code(sn, i, code) {
            self.stats.status_sent += 1;
        }
    }

    /// Server: a retransmission of the request on slot `i` of session `sn`
    /// arrived while its handler still runs: an erpc-rs client is told
    /// "in progress" (status code 0), which its stall bound counts as
    /// progress. A C++ client gets nothing, as from a C++ server.
    #[cold]
    #[inline(never)]
    pub(crate) fn send_in_progress(&mut self, sn: SessionNum, i: usize) {
        if self.send_status_code(sn, i, IN_PROGRESS) {
            self.stats.in_progress_sent += 1;
        }
    }

    /// Queues a status packet with `code` for the current request of slot
    /// `i` of server session `sn`, if its client reads status packets.
    fn send_status_code(&mut self, sn: SessionNum, i: usize, code: u8) -> bool {
        let Some(s) = self.session(sn) else {
            return false;
        };
        if s.remote_incarnation == 0 {
            // A C++ client cannot read one (see the module doc).
            return false;
        }
        let slot = &s.slots[i];
        let sv = &s.half.server()[i];
        let (req_type, pkt_num, req_num) = (sv.req_type, sv.req_pkts - 1, slot.cur_req_num);
        let size = STATUS_SIZE_BASE + u32::from(code);
        // The first response packet's number: below 2^14 because the
        // request's packets are (a request of `MAX_MSG_BYTES` at most).
        self.enqueue_ctrl_sized(
            sn,
            i as u8,
            PktType::Resp,
            req_type,
            pkt_num as u16,
            req_num,
            size,
        );
        true
    }

    /// Client: a response header whose size is beyond any message's. The
    /// caller checked that the slot is in flight with this request. A
    /// status packet fails the request; any other size is dropped.
    #[cold]
    #[inline(never)]
    pub(crate) fn process_status_pkt(&mut self, ctx: &mut C, hdr: RxHdr) {
        let size = hdr.msg_size();
        if size < STATUS_SIZE_BASE {
            return self.stats.drop(DropReason::MsgTooLarge);
        }
        let sn = hdr.dest_session_num();
        let i = (hdr.req_num() % SESSION_REQ_WINDOW as u64) as usize;
        let Some(s) = self.sessions.session_mut(sn) else {
            return self.stats.drop(DropReason::UnknownSession);
        };
        let slot = &s.slots[i];
        let c = &s.half.client()[i];
        debug_assert!(slot.tx_msgbuf.is_some() && slot.cur_req_num == hdr.req_num());
        // A status stands in for the first response packet, before any.
        if u32::from(hdr.pkt_num()) + 1 != c.req_pkts || c.resp_pkts != 0 {
            return self.stats.drop(DropReason::PktNumOutOfRange);
        }
        let Some(err) = ServerError::from_code((size - STATUS_SIZE_BASE) as u8) else {
            // "In progress": the server has the request and its handler
            // runs. Progress for the stall bound, not an acknowledgement:
            // the retransmission timeout keeps asking.
            let now = self.now_ns;
            s.half.client_mut()[i].progress_ns = now;
            self.stats.rx_accepted += 1;
            self.stats.in_progress_received += 1;
            return;
        };
        let epoch = slot.tx_epoch;
        self.stats.rx_accepted += 1;
        self.stats.status_received += 1;
        // Request packets of the slot may still be queued, or held by the
        // NIC (a multi-packet request the server failed at its first
        // packet): none may be when the buffer goes back.
        self.tx
            .forget_slot(epoch, sn, i as u8, &mut self.stats.tx_stale);
        self.drain_tx();
        self.complete(ctx, sn, i, Err(RpcError::Server { session: sn, err }));
    }
}
