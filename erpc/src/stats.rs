//! Counters of an Rpc. Every packet the Rpc does not act on is counted by
//! reason ([`DropReason`]); nothing is dropped silently.

use std::fmt;

/// Why a received packet (or SM packet) was not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// The transport flagged the ring slot as malformed.
    RingMalformed,
    /// Shorter than the eRPC header.
    TooShort,
    /// Magic nibble is not 11.
    BadMagic,
    /// No session with this number.
    UnknownSession,
    /// The session is not connected.
    SessionNotConnected,
    /// Request/RFR to a client session, or response/CR to a server session.
    WrongDirection,
    /// Request number older than the slot's.
    StaleReqNum,
    /// No request in flight on the client slot.
    NoRequestInFlight,
    /// Packet number outside the message (or the wrong type at it).
    PktNumOutOfRange,
    /// Data length or message size inconsistent with the header or the
    /// request in progress.
    SizeMismatch,
    /// Control packet (CR, RFR) with a non-zero message size. (Bytes
    /// after the header are no reason: the C++ eRPC sends 8.)
    CtrlHasData,
    /// Packet number ahead of the next expected one, or a multi-packet
    /// request not starting at packet 0 (reordering is treated as loss).
    OutOfOrder,
    /// Packet number below the next expected one at a client: an
    /// acknowledgement already counted (a duplicate, or the original of a
    /// retransmission arriving late).
    Duplicate,
    /// Response or credit return for a request that already completed with
    /// an error (reset, peer failure, destroy).
    AbandonedRequest,
    /// Message size above the maximum.
    MsgTooLarge,
    /// No handler for the request type.
    NoHandler,
    /// A new request on a slot whose handler has not responded.
    ServerSlotBusy,
    /// Duplicate of a request whose handler is still running (at-most-once:
    /// the handler never runs twice).
    DupReqInProgress,
    /// No memory for reassembly.
    OutOfMemory,
    /// An acknowledgement (credit return or response packet) of a packet
    /// that waits in the timing wheel to be sent again after a rollback:
    /// of its earlier transmission. Ignored (as the C++ eRPC does), so the
    /// wheel never sends an acknowledged packet beyond the credits.
    AckInWheel,
    /// SM packet about a session we do not have (or in another state).
    SmStale,
    /// SM packet of a type an Rpc does not handle.
    SmUnexpected,
}

/// Number of drop reasons.
pub(crate) const DROP_REASONS: usize = DropReason::SmUnexpected as usize + 1;

impl DropReason {
    /// All reasons, in counter order.
    pub const ALL: [DropReason; DROP_REASONS] = [
        DropReason::RingMalformed,
        DropReason::TooShort,
        DropReason::BadMagic,
        DropReason::UnknownSession,
        DropReason::SessionNotConnected,
        DropReason::WrongDirection,
        DropReason::StaleReqNum,
        DropReason::NoRequestInFlight,
        DropReason::PktNumOutOfRange,
        DropReason::SizeMismatch,
        DropReason::CtrlHasData,
        DropReason::OutOfOrder,
        DropReason::Duplicate,
        DropReason::AbandonedRequest,
        DropReason::MsgTooLarge,
        DropReason::NoHandler,
        DropReason::ServerSlotBusy,
        DropReason::DupReqInProgress,
        DropReason::OutOfMemory,
        DropReason::AckInWheel,
        DropReason::SmStale,
        DropReason::SmUnexpected,
    ];
}

const _: () = {
    let mut i = 0;
    while i < DROP_REASONS {
        assert!(DropReason::ALL[i] as usize == i);
        i += 1;
    }
};

/// Drop counters, one per [`DropReason`]: an array indexed by
/// `DropReason as usize` (it derefs to `[u64; DROP_REASONS]`), or by the
/// reason itself (`drops[DropReason::OutOfOrder]`). Its `Debug` names each
/// reason (`{RingMalformed: 0, TooShort: 0, ..}`), so a printed
/// [`RpcStats`] says what was dropped and why.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DropCounts(pub [u64; DROP_REASONS]);

impl std::ops::Deref for DropCounts {
    type Target = [u64; DROP_REASONS];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for DropCounts {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl std::ops::Index<DropReason> for DropCounts {
    type Output = u64;
    fn index(&self, r: DropReason) -> &u64 {
        &self.0[r as usize]
    }
}

impl std::ops::IndexMut<DropReason> for DropCounts {
    fn index_mut(&mut self, r: DropReason) -> &mut u64 {
        &mut self.0[r as usize]
    }
}

impl std::ops::Index<usize> for DropCounts {
    type Output = u64;
    fn index(&self, i: usize) -> &u64 {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for DropCounts {
    fn index_mut(&mut self, i: usize) -> &mut u64 {
        &mut self.0[i]
    }
}

impl fmt::Debug for DropCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(DropReason::ALL.iter().map(|r| (r, self[*r])))
            .finish()
    }
}

/// Counters of one Rpc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Drops by reason (index with the reason, or `DropReason as usize`).
    pub drops: DropCounts,
    /// Packets taken from the RX ring.
    pub rx_pkts: u64,
    /// Packets acted on (every other packet taken is counted in `drops`
    /// under a data-path reason).
    pub rx_accepted: u64,
    /// Packets handed to the transport.
    pub tx_pkts: u64,
    /// `tx_burst` calls.
    pub tx_bursts: u64,
    /// Packets the transport refused; they stayed queued for the next
    /// flush (counted once per refusal).
    pub tx_refused: u64,
    /// Queued packets given up because the transport refused everything
    /// for `TX_REFUSED_TRIES` (8) TX flushes while the batch
    /// was full; loss recovery resends them.
    pub tx_given_up: u64,
    /// TX queue drains (`tx_flush`): before and after retransmissions,
    /// after duplicate answers, on resets, and while the transport refuses.
    pub tx_flushes: u64,
    /// Packets dropped by fault injection (`Rpc::fault_drop_tx`).
    pub tx_fault_dropped: u64,
    /// Go-back-N rollbacks (retransmission timeouts that resent something).
    pub retransmissions: u64,
    /// Packets presumed lost at those rollbacks (credits reclaimed).
    pub retransmitted_pkts: u64,
    /// Timely rate computations (RTT samples not bypassed).
    pub timely_updates: u64,
    /// RTT samples skipped by the Timely bypass (link rate, RTT ≤ T_low).
    pub timely_bypassed: u64,
    /// Client packets sent without the timing wheel (session at link rate,
    /// none of the slot's packets in the wheel).
    pub wheel_bypassed: u64,
    /// Wheel entries dropped when due: their request completed or was
    /// rolled back meanwhile (never sent twice).
    pub wheel_stale: u64,
    /// Queued packets whose message was gone at flush time (skipped).
    pub tx_stale: u64,
    /// Requests enqueued by the application.
    pub reqs_enqueued: u64,
    /// Requests that waited in a session backlog.
    pub reqs_backlogged: u64,
    /// Continuations invoked.
    pub reqs_completed: u64,
    /// Requests completed with an error.
    pub reqs_failed: u64,
    /// Requests handed to a handler (dispatch or background).
    pub reqs_handled: u64,
    /// Responses enqueued.
    pub resps_enqueued: u64,
    /// Requests the server failed without running them (no handler, no
    /// memory) or whose background handler panicked (`rpc/status.rs`).
    pub reqs_failed_at_server: u64,
    /// Status packets sent (a failed request's answer, first or again).
    pub status_sent: u64,
    /// Status packets received (requests completed with
    /// `RpcError::Server`).
    pub status_received: u64,
    /// "In progress" notices a server sent for a retransmitted request whose
    /// handler still runs (erpc-rs clients only).
    pub in_progress_sent: u64,
    /// "In progress" notices a client received (each counts as progress
    /// for the stall bound).
    pub in_progress_received: u64,
    /// Duplicate request packets answered with a credit return again.
    pub dup_req_cr_resent: u64,
    /// Duplicate request packets answered with the response again (the
    /// handler did not run again).
    pub dup_req_resp_resent: u64,
    /// Duplicate RFRs answered again.
    pub dup_rfr_resent: u64,
    /// Background jobs submitted.
    pub bg_jobs: u64,
    /// Background jobs that waited because worker queues were full.
    pub bg_backlogged: u64,
    /// Background handlers that panicked (their requests failed with
    /// `ServerError::HandlerPanicked`).
    pub bg_panics: u64,
    /// Dispatch requests copied out of the ring because the handler
    /// returned without responding.
    pub deferred_copies: u64,
    /// Single-packet requests copied out of the ring before their handler
    /// ran (`RpcConfig::zero_copy_rx` off).
    pub rx_copied: u64,
    /// SM packets sent.
    pub sm_tx: u64,
    /// SM requests resent after the retry interval.
    pub sm_retries: u64,
    /// Duplicate connect requests answered from the token table.
    pub sm_dup_connect: u64,
    /// Connect requests ignored because their token belongs to a session
    /// freed recently (a late duplicate: never resurrected).
    pub sm_stale_connect: u64,
    /// Sessions a server created for a connect this client had given up
    /// on, disconnected when the late answer came.
    pub sm_abandoned_cleanups: u64,
    /// Connect requests dropped unanswered because their source sent
    /// more than its share (`RpcConfig::connect_burst_per_source`).
    pub sm_connect_rate_limited: u64,
    /// Connect requests refused ("RX ring exhausted") because the server
    /// sessions of their source host already hold its share of the ring
    /// (`RpcConfig::ring_entries_per_source`).
    pub sm_connect_source_full: u64,
    /// Connect requests dropped because they name an incarnation of their
    /// client older than the one this Nexus tracks (a dead process's
    /// request, late or replayed), or a newer one from a source that is
    /// not the client's address.
    pub sm_connect_stale_incarnation: u64,
    /// Connect responses for sessions this client never asked for (a
    /// forged or replayed connect request naming it), whose server session
    /// it disconnected.
    pub sm_disowned: u64,
    /// Connect responses sent again for server sessions of erpc-rs
    /// clients that have not received a request yet (at ages of one SM
    /// retry interval times 1, 2, 4 … 32): the client ignores one for its
    /// own session and disowns one it never asked for, so a forged
    /// connect's session goes even when that one disconnect is lost.
    pub sm_unserved_probes: u64,
    /// Server sessions that never received a request, reclaimed because
    /// the RX ring was short (see `RpcConfig::unused_session_reclaim_ms`).
    pub sessions_reclaimed: u64,
    /// Of those, served sessions reclaimed after `RpcConfig::idle_session_reclaim_ms`
    /// without a request.
    pub sessions_reclaimed_idle: u64,
    /// Reclaim and end notices sent again because the client sent data to
    /// the session the server ended.
    pub sm_reclaim_notices_resent: u64,
    /// Server sessions ended by the server (reset by the application, or
    /// their client declared failed) whose erpc-rs client was told.
    pub sm_end_notices: u64,
    /// Connecting client sessions failed because the SM link found no
    /// address for the server's host name
    /// ([`SessionEnd::HostNotFound`](crate::SessionEnd::HostNotFound)).
    pub sm_unresolved: u64,
    /// SM requests given up after the failure timeout (connect: the
    /// session fails; disconnect: it is freed locally).
    pub sm_timeouts: u64,
    /// Sessions reset (peer failure, `reset_session`, fault injection).
    pub sessions_reset: u64,
    /// Of those, sessions whose peer was declared failed.
    pub sessions_peer_failed: u64,
    /// Client sessions failed because a request got no answer for the
    /// stall bound (`RpcConfig::stall_timeout_ms`).
    pub sessions_stalled: u64,
    /// Loss scans that found the event loop had not run for more than a
    /// scan interval; the pause was not counted against any request.
    pub pauses_discounted: u64,
    /// Half-received multi-packet requests whose packets stopped coming
    /// for the stall bound; their reassembly buffers were freed.
    pub reassemblies_expired: u64,
    /// Responses discarded because their session was reset while the
    /// handler ran.
    pub resps_discarded: u64,
    /// Client sessions to a C++ eRPC server destroyed with requests
    /// unfinished there, whose slots were run to the end before the
    /// disconnect (a C++ server cannot take one earlier).
    pub sessions_drained: u64,
    /// Requests of such sessions that finished after their failure was
    /// reported (not counted in `reqs_completed` again).
    pub drained_reqs: u64,
    /// Burst-handler calls (`reqs_handled` counts their requests, with
    /// every other handler's): requests per call is the batching gained.
    pub burst_calls: u64,
    /// Requests a burst handler returned without taking: failed with
    /// [`crate::ServerError::Declined`].
    pub burst_not_taken: u64,
}

impl RpcStats {
    /// Drops for one reason.
    pub fn drops(&self, r: DropReason) -> u64 {
        self.drops[r]
    }

    /// All drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Drops of data packets (all reasons but the SM ones).
    pub fn data_drops(&self) -> u64 {
        self.total_drops() - self.drops(DropReason::SmStale) - self.drops(DropReason::SmUnexpected)
    }

    /// Counts a drop (the loss scan logs them, rate-limited, at debug
    /// level: `rpc/loss.rs`, `log_drops`).
    #[inline]
    pub(crate) fn drop(&mut self, r: DropReason) {
        self.drops[r] += 1;
    }
}

impl fmt::Display for RpcStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx {} tx {} bursts {} completed {} handled {} retransmissions {} tx flushes {}",
            self.rx_pkts,
            self.tx_pkts,
            self.tx_bursts,
            self.reqs_completed,
            self.reqs_handled,
            self.retransmissions,
            self.tx_flushes
        )?;
        for r in DropReason::ALL {
            let n = self.drops(r);
            if n != 0 {
                write!(f, ", drop {r:?} {n}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_every_drop_reason() {
        let mut s = RpcStats::default();
        s.drop(DropReason::UnknownSession);
        s.drops[DropReason::OutOfOrder] += 8860;
        let d = format!("{s:?}");
        assert!(d.contains("UnknownSession: 1"), "{d}");
        assert!(d.contains("OutOfOrder: 8860"), "{d}");
        for r in DropReason::ALL {
            assert!(d.contains(&format!("{r:?}: ")), "{r:?} missing from {d}");
        }
        // No anonymous array of counters.
        assert!(!d.contains("drops: ["), "{d}");
        assert_eq!(s.total_drops(), 8861);
        assert_eq!(s.drops[DropReason::OutOfOrder as usize], 8860);
    }
}
