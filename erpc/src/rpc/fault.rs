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

    /// Resets session `sn` as [`Rpc::reset_session`] does.
    pub fn fault_reset_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        self.reset_session(sn)
    }
}
