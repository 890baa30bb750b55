//! The RX path: take a burst from the transport's ring, validate each
//! packet's header against our own state, and dispatch it by type and
//! direction. Nothing in a packet is trusted: every inconsistency is
//! dropped and counted ([`DropReason`]).
//!
//! Packets are read in place in the ring; the slots are given back only
//! after the whole burst is processed, so a dispatch handler reads its
//! single-packet request without a copy, and a burst handler gets the
//! burst's requests of its type after the loop (`rpc/burst.rs`).

use transport::{ERPC_HDR_BYTES, RxRing, Transport};

use super::Rpc;
use crate::pkthdr::{HdrError, PktType, RxHdr};
use crate::session::{Role, SessionState};
use crate::stats::DropReason;

impl<T: Transport, C> Rpc<T, C> {
    /// Processes the `n` packets the transport's `rx_burst` just reported.
    #[inline(never)]
    pub(crate) fn process_rx(&mut self, ctx: &mut C, n: usize) {
        let mut ring = self
            .ring
            .take()
            .expect("run_event_loop_once must not be called from a handler or continuation");
        debug_assert!(n <= self.ring_entries);
        let start = self.rx_head;
        let mut idx = start;
        for _ in 0..n {
            match ring.packet(idx) {
                Some(pkt) => self.process_pkt(ctx, pkt),
                None => self.stats.drop(DropReason::RingMalformed),
            }
            idx += 1;
            if idx == self.ring_entries {
                idx = 0;
            }
        }
        if !self.burst_pending.is_empty() {
            // Requests of burst types, read in place: before the slots go
            // back (`rpc/burst.rs`).
            self.run_bursts(ctx, &ring, start, n);
        }
        self.stats.rx_pkts += n as u64;
        self.rx_head = idx;
        self.transport.post_recvs(&mut ring, n);
        self.ring = Some(ring);
    }

    /// Validates and dispatches one packet (eRPC header + data).
    pub(crate) fn process_pkt(&mut self, ctx: &mut C, pkt: &[u8]) {
        let hdr = match RxHdr::decode(pkt) {
            Ok(h) => h,
            Err(HdrError::Short { .. }) => return self.stats.drop(DropReason::TooShort),
            Err(HdrError::BadMagic { .. }) => return self.stats.drop(DropReason::BadMagic),
        };
        let data = &pkt[ERPC_HDR_BYTES..];
        let Some(s) = self.session(hdr.dest_session_num()) else {
            if !self.notices.is_empty() {
                self.renotify(hdr.dest_session_num());
            }
            return self.stats.drop(DropReason::UnknownSession);
        };
        if s.state != SessionState::Connected {
            if s.state == SessionState::Resetting && !self.notices.is_empty() {
                // A server session being ended: its client hears again.
                self.renotify(hdr.dest_session_num());
            }
            return self.stats.drop(DropReason::SessionNotConnected);
        }
        match (hdr.pkt_type(), s.role) {
            (PktType::Req, Role::Server) => self.process_req_pkt(ctx, hdr, data),
            (PktType::Rfr, Role::Server) => self.process_rfr(hdr, data),
            (PktType::ExplCr, Role::Client) => self.process_expl_cr(hdr, data),
            (PktType::Resp, Role::Client) => self.process_resp_pkt(ctx, hdr, data),
            _ => self.stats.drop(DropReason::WrongDirection),
        }
    }
}
