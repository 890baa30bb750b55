//! Test hooks: fault injection (packets dropped on purpose, peers
//! declared failed, sessions reset, request numbers chosen) and probes of
//! internal state that tests and the deterministic simulation check
//! (the credit invariant, the RX ring's reservations, the active-session
//! pools, the fuzz harness's view of live sessions).
//!
//! None of this is for applications: the module exists only with the
//! `testing` cargo feature, which this crate's tests and `erpc-sim` turn
//! on. The per-session fault state is always there (as in the C++
//! `rpc_fault_inject.cc`); unused, it costs one predictable branch per
//! packet sent (`Session::fault_drop_tx`). This
//! module comes after `api`, so rustdoc lists these methods after the
//! application's API on the `Rpc` page.

use transport::Transport;

use super::{ActivePools, Rpc, SessionError, SessionNum};
use crate::session::SessionState;

/// Test hooks: fault injection and probes of internal state.
impl<T: Transport, C> Rpc<T, C> {
    /// Drops the next `n` packets this Rpc sends on session `sn` (data,
    /// credit returns, requests for response) as if the network lost
    /// them: the transport counts them in `tx_dropped_on_purpose` and does
    /// not send them. Loss recovery has to repair the damage.
    pub fn fault_drop_tx(&mut self, sn: SessionNum, n: u32) -> Result<(), SessionError> {
        match self.session(sn) {
            Some(s) if s.state != SessionState::Resetting => {
                s.fault_drop_tx.set(n);
                Ok(())
            }
            _ => Err(SessionError::NoSuchSession(sn)),
        }
    }

    /// Declares the remote Nexus at `uri` (`host:port`) failed in this
    /// process, as if it had stopped answering keep-alive pings: every Rpc
    /// of this Nexus resets its sessions to it (here at the next event-loop
    /// iteration).
    pub fn fault_fail_remote(&mut self, uri: &str) -> Result<(), SessionError> {
        let uri = crate::nexus::Uri::parse(uri)?;
        self.nexus.fault_fail_remote(&uri);
        Ok(())
    }

    /// Test hook: sessions this Rpc creates or accepts from now on number
    /// their requests from `base` (rounded down to a multiple of the 8
    /// slots, within 44 bits): slot `i` starts at `base + i`, whatever the
    /// handshake said. With `base` near 2^44 a test reaches the request-
    /// number wrap in a few requests. Both ends of a session must use the
    /// same base: an erpc-rs server adopts the base an erpc-rs client
    /// proposes, so setting it at the client is enough between erpc-rs
    /// peers; a peer presenting itself as C++ (no SM extensions) numbers
    /// from 0 unless it is set there too. `None` goes back to the
    /// handshake's base.
    pub fn fault_set_req_base(&mut self, base: Option<u64>) {
        self.req_base_override = base.map(|b| {
            b & crate::pkthdr::MAX_REQ_NUM & !(crate::consts::SESSION_REQ_WINDOW as u64 - 1)
        });
    }

    /// Resets session `sn` as [`Rpc::reset_session`] does.
    pub fn fault_reset_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        self.reset_session(sn)
    }

    /// Checks the credit invariant of every connected client session:
    /// credits plus unacknowledged packets of its slots equal the
    /// session's credits. For tests (deterministic simulation); returns a
    /// description of the first violation.
    pub fn check_credit_invariant(&self) -> Result<(), String> {
        for s in self.sessions.iter().flatten() {
            if let Err((credits, out)) = super::cr::credit_balance(s) {
                return Err(format!(
                    "session {}: {} credits + {} unacknowledged != {}",
                    s.local_num, credits, out, s.credits_max
                ));
            }
        }
        Ok(())
    }

    /// RX ring entries not reserved by sessions, and the ring's size (each
    /// open session reserves its credits' worth).
    pub fn rx_ring_unreserved(&self) -> (usize, usize) {
        self.ring_reservation()
    }

    /// What the Rpc keeps for its active client sessions (see
    /// [`ActivePools`]): follows the sessions with requests, not the
    /// sessions open.
    pub fn active_pools(&self) -> ActivePools {
        let (spare_ts_arrays, wheel_sessions) = self.active.pooled();
        ActivePools {
            active_sessions: self.active.len(),
            spare_ts_arrays,
            wheel_sessions,
            wheel_pool_buckets: self.wheel.as_ref().map_or(0, |w| w.pool_buckets()),
        }
    }

    /// The fuzz harness's view of live state: each session's number, its
    /// SM token, and its slots' current request numbers.
    pub fn live_sessions(
        &self,
    ) -> impl Iterator<Item = (SessionNum, u64, [u64; crate::consts::SESSION_REQ_WINDOW])> + '_
    {
        self.sessions.iter().flatten().map(|s| {
            (
                s.local_num,
                s.uniq_token,
                std::array::from_fn(|i| s.slots[i].cur_req_num),
            )
        })
    }
}
