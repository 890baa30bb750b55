//! Client sessions to a host whose name does not resolve. The Nexus's SM
//! link resolves hostnames off the Rpc's thread (`nexus::udp_sm`); when a
//! lookup finds no address, the router tells every Rpc
//! (`SmItem::Unresolved`), and the sessions still connecting to that URI
//! fail at once with [`SessionEnd::HostNotFound`](crate::SessionEnd::HostNotFound) instead of timing
//! out a failure timeout later as if the host had not answered.

use transport::Transport;

use super::reset::{FailedReq, Owed};
use super::{Rpc, RpcError, SessionEnd, SessionEventKind};
use crate::nexus::Uri;
use crate::session::{Role, SessionState};

impl<T: Transport, C> Rpc<T, C> {
    /// The SM link found no address for `uri`: every client session still
    /// connecting to it fails, with the requests that waited for it (their
    /// continuations run in the next event-loop iteration).
    pub(crate) fn handle_unresolved(&mut self, uri: &Uri) {
        let doomed: Vec<u16> = self
            .sm_pending
            .iter()
            .copied()
            .filter(|&sn| {
                self.session(sn).is_some_and(|s| {
                    s.role == Role::Client
                        && s.state == SessionState::ConnectInProgress
                        && s.remote_uri == *uri
                })
            })
            .collect();
        for sn in doomed {
            let backlog = match self.session_mut(sn) {
                Some(s) => std::mem::take(&mut s.backlog),
                None => continue,
            };
            tracing::warn!(session = sn, %uri, "host name does not resolve; session failed");
            self.stats.sm_unresolved += 1;
            self.owe_event(sn, SessionEventKind::Ended(SessionEnd::HostNotFound));
            self.free_session(sn);
            for p in backlog {
                self.owed.push_back(Owed::Failed(FailedReq {
                    session: sn,
                    req: p.req,
                    resp: p.resp,
                    cont: p.cont,
                    tag: p.tag,
                    err: RpcError::SessionEnded {
                        session: sn,
                        why: SessionEnd::HostNotFound,
                    },
                }));
            }
        }
    }
}
