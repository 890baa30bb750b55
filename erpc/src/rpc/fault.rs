//! Fault injection for tests and benchmarks, compiled in always (as in the
//! C++ `rpc_fault_inject.cc`, but never behind a build flag that CI does
//! not build). When unused it costs one predictable branch per packet
//! sent (`Session::fault_drop_tx`).

use transport::Transport;

use super::{Rpc, SessionError, SessionNum};
use crate::nexus::Uri;
use crate::session::SessionState;

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
            _ => Err(SessionError::NoSession(sn)),
        }
    }

    /// Declares the remote Nexus at `uri` (`host:port`) failed in this
    /// process, as if it had stopped answering keep-alive pings: every Rpc
    /// of this Nexus resets its sessions to it (here at the next event-loop
    /// iteration).
    pub fn fault_fail_remote(&mut self, uri: &str) -> Result<(), SessionError> {
        let uri = Uri::parse(uri)?;
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
}
