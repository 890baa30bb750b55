//! Session management at the Rpc: `create_session`, `destroy_session`,
//! and the handlers of connect/disconnect requests and responses that the
//! Nexus routes here. Requests are retried every `sm_retry_ms` until
//! answered or until the failure timeout (a connect then fails with
//! `ConnectTimedOut`; a disconnect frees the session locally); the server
//! deduplicates connect requests by the client's unique token and answers
//! duplicate disconnect requests again. Established sessions to erpc-rs
//! peers are registered with the Nexus's keep-alive pings.

use transport::{MAX_DATA_PER_PKT, Transport};

use super::reset::{FailedReq, Owed};
use super::{Rpc, RpcError, SessionEnd, SessionError, SessionEventKind, SessionNum};
use crate::consts::{
    MAX_RPC_ID, MAX_SESSIONS, SESSION_CREDITS, SESSION_NUM_QUARANTINE_MS, SESSION_REQ_WINDOW,
};
use crate::msgbuf::{MsgBuf, Origin};
use crate::nexus::{PktFrom, SmItem, Uri};
use crate::session::{Role, Session, SessionState};
use crate::sm_types::{SM_PKT_BYTES, SmEndpoint, SmErr, SmPkt, SmPktType, TransportType};
use crate::stats::DropReason;

/// Request-number bases a client proposes are below 2^40, so a session
/// reaches the 44-bit wrap only after 2^44 - 2^40 requests (it matters to
/// nobody but a C++ server, which cannot follow a wrap; erpc-rs peers
/// compare request numbers on the 44-bit circle and accept any base).
const REQ_BASE_MASK: u64 = (1 << 40) - 1;

/// The credits an endpoint's credit field grants (0, from a C++ peer or
/// an old erpc-rs one: the C++ eRPC's fixed 32).
fn granted_credits(field: u32) -> u32 {
    if field == 0 {
        SESSION_CREDITS as u32
    } else {
        field
    }
}

/// A request-number base as a session uses it: within 44 bits and a
/// multiple of the slot count (slot `i` starts at `base + i`).
fn slot_base(b: u64) -> u64 {
    b & crate::pkthdr::MAX_REQ_NUM & !(SESSION_REQ_WINDOW as u64 - 1)
}

/// SM packets handled per event-loop iteration.
const MAX_SM_PER_LOOP: usize = 64;

/// A client connect that timed out. The server may still have created the
/// session (its response was lost, or arrived late, e.g. because the server
/// was unreachable for a while): nobody would ever disconnect it. So the
/// client keeps retrying the connect request, quietly, for as long as the
/// server remembers tokens (`tokens::TOKEN_MEMORY_MS`); if the server
/// answers, the client disconnects the session it created (as TCP answers
/// a late SYN-ACK with a reset). At most [`MAX_ABANDONED`] are kept (the
/// oldest go first).
const MAX_ABANDONED: usize = 1024;

#[derive(Debug)]
pub(crate) struct AbandonedConnect {
    token: u64,
    uri: Uri,
    client: SmEndpoint,
    server: SmEndpoint,
    since_ns: u64,
    last_sent_ns: u64,
    /// The server answered: disconnecting its session.
    disconnecting: bool,
    /// Given up at this time (a disconnect for a session the client
    /// already forgot: `send_disconnect_retried`); 0: after
    /// `TOKEN_MEMORY_MS`.
    give_up_ns: u64,
}

impl AbandonedConnect {
    /// The request this record repeats: the disconnect, or the connect
    /// given up on.
    fn pkt(&self) -> (Uri, [u8; SM_PKT_BYTES]) {
        let pkt = SmPkt {
            pkt_type: if self.disconnecting {
                SmPktType::DisconnectReq
            } else {
                SmPktType::ConnectReq
            },
            err: SmErr::NoError,
            uniq_token: self.token,
            client: self.client,
            server: self.server,
        };
        (self.uri.clone(), pkt.encode())
    }
}

impl<T: Transport, C> Rpc<T, C> {
    fn local_endpoint(&self, session_num: u16) -> SmEndpoint {
        let mut ep = SmEndpoint {
            transport_type: self.config.transport_type,
            sm_udp_port: self.nexus.uri().port,
            rpc_id: self.rpc_id,
            session_num,
            routing_info: self.transport.local_routing_info().to_bytes(),
            ..SmEndpoint::default()
        };
        ep.set_hostname(&self.nexus.uri().host)
            .expect("Nexus URIs are checked to fit");
        if self.nexus.sm_extensions() {
            ep.set_incarnation(self.nexus.incarnation());
        }
        ep
    }

    fn alloc_session_num(&mut self) -> Option<u16> {
        let now = self.clock.now_ns();
        let quarantine_ns = SESSION_NUM_QUARANTINE_MS * 1_000_000;
        if let Some(&(n, t)) = self.free_session_nums.front()
            && now.saturating_sub(t) >= quarantine_ns
        {
            self.free_session_nums.pop_front();
            return Some(n);
        }
        if self.sessions.len() < MAX_SESSIONS {
            return Some(self.sessions.push_none() as u16);
        }
        self.free_session_nums.pop_front().map(|(n, _)| n)
    }

    /// At the loss-scan interval: what a quiet Rpc gives back. Retired
    /// connect tokens whose memory time is over are forgotten; and once
    /// every session number handed out is free again and out of
    /// quarantine (no session at all), numbering starts over from 0, so
    /// that session churn leaves neither a long free list nor a high
    /// table mark behind.
    pub(crate) fn sweep_quiet_state(&mut self) {
        let now = self.now_ns;
        self.retired_tokens.expire(now);
        self.drop_stale_unserved();
        self.probe_unserved(now);
        if !self.notices.is_empty() {
            self.expire_notices(now);
        }
        if !self.reassembling.is_empty() {
            self.expire_reassembly();
        }
        let quarantine_ns = SESSION_NUM_QUARANTINE_MS * 1_000_000;
        if self.sessions.len() != 0
            && self.free_session_nums.len() == self.sessions.len()
            && self
                .free_session_nums
                .back()
                .is_some_and(|&(_, t)| now.saturating_sub(t) >= quarantine_ns)
        {
            self.sessions.reset_numbers();
            self.free_session_nums.clear();
            super::tokens::shrink_if_sparse_deque(&mut self.free_session_nums);
        }
    }

    /// Whether a connect request declaring transport type `t` can be
    /// served. As the C++ eRPC does, a server takes only its own type
    /// (`RpcConfig::transport_type`), with one exception: an erpc-rs
    /// client (one carrying the SM extensions, when this Nexus uses them
    /// too) declaring raw Ethernet or DPDK is served by a server presenting
    /// either. Both declare the same frames (Ethernet/IPv4/UDP + the eRPC
    /// header), and every erpc-rs transport computes the IPv4 checksum and
    /// takes frames that carry one, so two erpc-rs Rpcs never fail on the
    /// type. A C++ client declaring the other Ethernet type is refused with
    /// `InvalidTransport`: its raw transport sends IPv4 checksum 0, which a
    /// Linux socket drops. InfiniBand and the fake transport match only
    /// themselves.
    fn accepts_transport(&self, t: TransportType, ext_client: bool) -> bool {
        let own = self.config.transport_type;
        let ethernet = |t| matches!(t, TransportType::Raw | TransportType::Dpdk);
        t == own || (ext_client && ethernet(t) && ethernet(own))
    }

    /// True if the endpoint is an erpc-rs peer's and this Nexus speaks the
    /// erpc-rs SM extensions too (otherwise both sides act as C++ does).
    fn ext_peer(&self, ep: &SmEndpoint) -> bool {
        ep.incarnation() != 0 && self.nexus.sm_extensions()
    }

    fn ring_check(&self, credits: usize) -> Result<(), SessionError> {
        if self.ring_entries_available < credits {
            return Err(SessionError::RingExhausted {
                ring_entries: self.ring_entries,
                available: self.ring_entries_available,
                credits,
                sessions: self.open_sessions,
            });
        }
        Ok(())
    }

    /// [`Rpc::create_session`]: checks the URI and the RX ring, makes the
    /// client session and sends its connect request.
    pub(crate) fn connect_session(
        &mut self,
        remote_uri: &str,
        remote_rpc_id: u8,
    ) -> Result<SessionNum, SessionError> {
        let uri = Uri::parse_remote(remote_uri).map_err(|why| SessionError::BadUri {
            uri: remote_uri.to_owned(),
            why,
        })?;
        if uri == *self.nexus.uri() && remote_rpc_id == self.rpc_id {
            return Err(SessionError::SelfConnect {
                uri,
                rpc_id: self.rpc_id,
            });
        }
        if remote_rpc_id > MAX_RPC_ID {
            return Err(SessionError::RemoteRpcId(remote_rpc_id));
        }
        let credits = self.config.session_credits;
        self.make_ring_room(credits);
        self.ring_check(credits)?;
        let sn = self.alloc_session_num().ok_or(SessionError::NoSessionNum)?;
        let client_ep = self.local_endpoint(sn);
        let mut server_ep = SmEndpoint {
            transport_type: self.config.transport_type,
            sm_udp_port: uri.port,
            rpc_id: remote_rpc_id,
            ..SmEndpoint::default()
        };
        server_ep
            .set_hostname(&uri.host)
            .expect("Uri::parse checked the length");
        let token = self.nexus.random_u64();
        // A random request-number base, far below the 44-bit limit.
        let req_base = self
            .req_base_override
            .unwrap_or(slot_base(self.nexus.random_u64() & REQ_BASE_MASK));
        let mut client_ep = client_ep;
        if self.nexus.sm_extensions() {
            client_ep.set_req_base(req_base);
            client_ep.set_credits(credits as u32);
        }
        let mut s = Session::new(
            Role::Client,
            SessionState::ConnectInProgress,
            sn,
            token,
            uri,
            client_ep,
            server_ep,
            credits as u32,
        );
        let now = self.clock.now_ns();
        s.sm_pending_since_ns = Some(now);
        s.sm_first_sent_ns = now;
        // Congestion-control state lives as long as the session; the TX
        // timestamps (and the wheel's room) only while it is active
        // (`rpc/active.rs`).
        s.cc = self
            .config
            .cc
            .enabled
            .then(|| crate::cc::SessionCc::shared(&self.config.cc, &self.cc_shared, now));
        s.tx_ts = self.active.empty_ts();
        self.sessions[usize::from(sn)] = Some(Box::new(s));
        self.open_sessions += 1;
        self.ring_entries_available -= credits;
        self.sm_pending.push(sn);
        self.send_sm_req(sn);
        Ok(sn)
    }

    /// [`Rpc::destroy_session`]: fails the session's requests and starts
    /// its disconnect (after its slots finish, toward a C++ server).
    pub(crate) fn disconnect_session(&mut self, sn: SessionNum) -> Result<(), SessionError> {
        let now = self.clock.now_ns();
        let Some(s) = self.session_mut(sn).filter(|s| s.role == Role::Client) else {
            return Err(SessionError::NoSuchSession(sn));
        };
        if s.state != SessionState::Connected || s.closing {
            let state = if s.closing {
                SessionState::DisconnectInProgress
            } else {
                s.state
            };
            return Err(SessionError::NotConnected { session: sn, state });
        }
        if s.remote_incarnation == 0
            && s.busy_slots() != 0
            && self.begin_drain(sn, RpcError::SessionDestroyed { session: sn })
        {
            // A C++ server asserts that every slot of a session it is
            // asked to disconnect is finished: the slots finish first.
            return Ok(());
        }
        self.fail_outstanding(sn, RpcError::SessionDestroyed { session: sn });
        self.start_disconnect(sn, now);
        Ok(())
    }

    /// Client session `sn` starts disconnecting: its disconnect request
    /// goes out now and is retried (`process_sm`) until answered or for
    /// the failure timeout. Nothing of it stays in the active list.
    pub(crate) fn start_disconnect(&mut self, sn: SessionNum, now: u64) {
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        s.state = SessionState::DisconnectInProgress;
        s.sm_pending_since_ns = Some(now);
        s.sm_first_sent_ns = now;
        self.deactivate(sn);
        self.sm_pending.push(sn);
        self.send_sm_req(sn);
    }

    /// Client session `sn`, whose connect request is outstanding, is
    /// given up (timed out, or reset by the application): if the server
    /// answers later, the session it made is disconnected (the record
    /// keeps asking for `TOKEN_MEMORY_MS`).
    pub(crate) fn abandon_connect(&mut self, sn: SessionNum, now: u64) {
        self.keep_abandoned(sn, now, false, 0);
    }

    /// Records client session `sn`'s SM request in the abandoned list,
    /// which outlives the session: a connect (`disconnecting` false) or
    /// a disconnect, given up at `give_up_ns` (0: after
    /// `TOKEN_MEMORY_MS`). At most [`MAX_ABANDONED`] (the oldest go).
    fn keep_abandoned(&mut self, sn: SessionNum, now: u64, disconnecting: bool, give_up_ns: u64) {
        let Some(s) = self.session(sn) else { return };
        let record = AbandonedConnect {
            token: s.uniq_token,
            uri: s.remote_uri.clone(),
            client: s.client_endpoint(),
            server: s.server_endpoint(),
            since_ns: now,
            last_sent_ns: now,
            disconnecting,
            give_up_ns,
        };
        if self.abandoned.len() >= MAX_ABANDONED {
            self.abandoned.remove(0);
        }
        self.abandoned.push(record);
    }

    /// A disconnect request for connected client session `sn`, which is
    /// about to be freed (a reset, a stall, its peer declared failed):
    /// sent now and again every SM retry interval until the server
    /// answers or for four failure timeouts, from a record that outlives
    /// the session (the abandoned-connect list's), so that a lost packet
    /// does not leave the server holding the session for ever.
    pub(crate) fn send_disconnect_retried(&mut self, sn: SessionNum) {
        let now = self.clock.now_ns();
        let give_up = now + 4 * self.config.failure_timeout_ms * 1_000_000;
        self.keep_abandoned(sn, now, true, give_up);
        self.send_disconnect_once(sn);
    }

    /// One disconnect request for a connected client session, not retried
    /// here (see `send_disconnect_retried`).
    pub(crate) fn send_disconnect_once(&mut self, sn: SessionNum) {
        let Some((to, pkt)) = self.disconnect_pkt(sn) else {
            return;
        };
        self.stats.sm_tx += 1;
        self.nexus.sm_send(&to, &pkt);
    }

    /// The disconnect request of client session `sn`, and where it goes.
    pub(crate) fn disconnect_pkt(&self, sn: SessionNum) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        self.sm_pkt(sn, SmPktType::DisconnectReq)
    }

    /// SM request `pkt_type` of client session `sn`, and where it goes.
    fn sm_pkt(&self, sn: SessionNum, pkt_type: SmPktType) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let s = self.session(sn)?;
        let pkt = SmPkt {
            pkt_type,
            err: SmErr::NoError,
            uniq_token: s.uniq_token,
            client: s.client_endpoint(),
            server: s.server_endpoint(),
        };
        Some((s.remote_uri.clone(), pkt.encode()))
    }

    /// Sends (or resends) the SM request of client session `sn`.
    pub(crate) fn send_sm_req(&mut self, sn: SessionNum) {
        let Some((to, pkt)) = self.sm_req_pkt(sn) else {
            return;
        };
        self.stats.sm_tx += 1;
        self.nexus.sm_send(&to, &pkt);
    }

    /// The SM request client session `sn` has outstanding (connect or
    /// disconnect), and where it goes.
    pub(crate) fn sm_req_pkt(&self, sn: SessionNum) -> Option<(Uri, [u8; SM_PKT_BYTES])> {
        let pkt_type = match self.session(sn)?.state {
            SessionState::ConnectInProgress => SmPktType::ConnectReq,
            SessionState::DisconnectInProgress => SmPktType::DisconnectReq,
            SessionState::Connected | SessionState::Resetting => return None,
        };
        self.sm_pkt(sn, pkt_type)
    }

    /// Sends an SM response (to the client endpoint's URI).
    pub(crate) fn send_sm(&mut self, pkt: &SmPkt) {
        let Some(to) = pkt.client.uri() else {
            return self.stats.drop(DropReason::SmStale);
        };
        self.stats.sm_tx += 1;
        self.nexus.sm_send(&to, &pkt.encode());
    }

    /// Retries the requests of abandoned connects; forgets them once the
    /// server would have forgotten the token.
    fn process_abandoned(&mut self, now: u64) {
        let retry_ns = self.config.sm_retry_ms * 1_000_000;
        let timeout_ns = super::tokens::TOKEN_MEMORY_MS * 1_000_000;
        self.abandoned.retain(|a| {
            now.saturating_sub(a.since_ns) < timeout_ns && (a.give_up_ns == 0 || now < a.give_up_ns)
        });
        let mut out = Vec::new();
        for a in self.abandoned.iter_mut() {
            if now.saturating_sub(a.last_sent_ns) < retry_ns {
                continue;
            }
            a.last_sent_ns = now;
            out.push(a.pkt());
        }
        for (to, pkt) in out {
            self.stats.sm_tx += 1;
            self.nexus.sm_send(&to, &pkt);
        }
    }

    /// The abandoned records' SM requests, encoded, with their
    /// destinations (for the Nexus to repeat when this Rpc is dropped):
    /// every disconnect, and the connects given up on only with the SM
    /// extensions (the answer to one reaches the next Rpc with this id,
    /// which disowns the session only at an erpc-rs server).
    pub(crate) fn abandoned_pkts(&self) -> impl Iterator<Item = (Uri, [u8; SM_PKT_BYTES])> + '_ {
        let connects = self.nexus.sm_extensions();
        self.abandoned
            .iter()
            .filter(move |a| a.disconnecting || connects)
            .map(AbandonedConnect::pkt)
    }

    /// An SM response for no live session: an abandoned connect's?
    fn abandoned_resp(&mut self, pkt: &SmPkt) -> bool {
        let Some(k) = self.abandoned.iter().position(|a| {
            a.token == pkt.uniq_token && a.client.session_num == pkt.client.session_num
        }) else {
            return false;
        };
        match pkt.pkt_type {
            SmPktType::ConnectResp if pkt.err == SmErr::NoError => {
                let a = &mut self.abandoned[k];
                if !a.disconnecting {
                    // The server made the session after we gave up: take it
                    // down.
                    a.disconnecting = true;
                    a.server = pkt.server;
                    a.last_sent_ns = 0;
                    self.stats.sm_abandoned_cleanups += 1;
                }
            }
            SmPktType::ConnectResp => {
                self.abandoned.swap_remove(k);
            }
            _ => {
                if self.abandoned[k].disconnecting {
                    self.abandoned.swap_remove(k);
                }
            }
        }
        true
    }

    /// Handles queued SM packets and failure notices, and retries (or
    /// gives up on) overdue SM requests.
    #[inline(never)]
    pub(crate) fn process_sm(&mut self) {
        for _ in 0..MAX_SM_PER_LOOP {
            let Some(item) = self.sm_queue.pop() else {
                break;
            };
            let (pkt, from) = match item {
                SmItem::Pkt(p, from) => (p, from),
                SmItem::PeerFailed(f) => {
                    self.handle_peer_failed(&f);
                    continue;
                }
                SmItem::Inspect => {
                    self.maybe_publish_inspect();
                    continue;
                }
                SmItem::Unresolved(uri) => {
                    self.handle_unresolved(&uri);
                    continue;
                }
            };
            match pkt.pkt_type {
                SmPktType::ConnectReq => self.handle_connect_req(&pkt, &from),
                SmPktType::DisconnectReq => self.handle_disconnect_req(&pkt),
                SmPktType::ConnectResp => self.handle_connect_resp(&pkt),
                SmPktType::DisconnectResp => self.handle_disconnect_resp(&pkt),
                _ => self.stats.drop(DropReason::SmUnexpected),
            }
        }
        let now = self.clock.now_ns();
        if !self.abandoned.is_empty() {
            self.process_abandoned(now);
        }
        if self.sm_pending.is_empty() {
            return;
        }
        let retry_ns = self.config.sm_retry_ms * 1_000_000;
        let timeout_ns = self.config.failure_timeout_ms * 1_000_000;
        let mut k = 0;
        while k < self.sm_pending.len() {
            let sn = self.sm_pending[k];
            k += 1;
            let Some(s) = self.session_mut(sn) else {
                continue;
            };
            if now.saturating_sub(s.sm_first_sent_ns) >= timeout_ns {
                let state = s.state;
                self.stats.sm_timeouts += 1;
                k -= 1;
                self.sm_pending.remove(k);
                match state {
                    SessionState::ConnectInProgress => {
                        self.abandon_connect(sn, now);
                        self.reset_client_session(sn, super::reset::ResetCause::ConnectTimedOut)
                    }
                    SessionState::DisconnectInProgress => {
                        // Unanswered for the failure timeout: the session
                        // goes, but its disconnect is asked for a while
                        // longer from a record (a lost one would leave
                        // the server holding the session).
                        self.send_disconnect_retried(sn);
                        self.finish_disconnect(sn)
                    }
                    SessionState::Connected | SessionState::Resetting => {}
                }
                continue;
            }
            let due = s
                .sm_pending_since_ns
                .as_mut()
                .filter(|t| now.saturating_sub(**t) >= retry_ns)
                .map(|t| *t = now)
                .is_some();
            if due {
                self.stats.sm_retries += 1;
                self.send_sm_req(sn);
            }
        }
    }

    /// A connect request this server has seen before, or one from a dead
    /// incarnation of its client: answered again (a retransmission of a
    /// live session's request) or dropped (a late duplicate of a gone
    /// session's, a stale or unverified incarnation). True when handled
    /// here; false for a request that may make a new session.
    fn old_connect_req(&mut self, pkt: &SmPkt, from: &PktFrom) -> bool {
        // A retransmitted request: answer again with the same session.
        if let Some(&sn) = self.token_map.get(&pkt.uniq_token) {
            if let Some(s) = self.session(sn)
                && s.role == Role::Server
                && s.uniq_token == pkt.uniq_token
            {
                let mut r = pkt.response(SmErr::NoError);
                r.server = s.server_endpoint();
                self.stats.sm_dup_connect += 1;
                self.send_sm(&r);
                return true;
            }
            self.token_map.remove(&pkt.uniq_token);
        }
        // A late duplicate of a connect request whose session is gone:
        // never resurrect it.
        if self
            .retired_tokens
            .contains(pkt.uniq_token, self.clock.now_ns())
        {
            self.stats.sm_stale_connect += 1;
            self.stats.drop(DropReason::SmStale);
            return true;
        }
        // A request naming an incarnation of its client older than the one
        // we track (a dead process's, late or replayed), or a newer one not
        // from the client's address, would fail live sessions or make a
        // session to a dead process: dropped (see `nexus::liveness`).
        if self.ext_peer(&pkt.client)
            && let Some(uri) = pkt.client.uri()
            && !self
                .nexus
                .router()
                .may_track(&uri, pkt.client.incarnation(), from.verified)
        {
            self.stats.sm_connect_stale_incarnation += 1;
            self.stats.drop(DropReason::SmStale);
            return true;
        }
        false
    }

    fn handle_connect_req(&mut self, pkt: &SmPkt, from: &PktFrom) {
        if self.old_connect_req(pkt, from) {
            return;
        }
        let ext_client = self.ext_peer(&pkt.client);
        // A new session: charged to the host it came from.
        if !self.admit_connect(&from.host) {
            return;
        }
        let fail = |rpc: &mut Self, err| rpc.send_sm(&pkt.response(err));
        if !self.accepts_transport(pkt.client.transport_type, ext_client)
            || !self.accepts_transport(pkt.server.transport_type, ext_client)
        {
            return fail(self, SmErr::InvalidTransport);
        }
        if pkt.server.rpc_id != self.rpc_id {
            return fail(self, SmErr::InvalidRemoteRpcId);
        }
        // The credits the client will use, which is what its session
        // reserves here: an erpc-rs client asks (and gets at most our
        // configured credits); a C++ client always uses its fixed 32.
        let credits = if ext_client {
            self.credits_to_grant(pkt.client.credits())
        } else {
            SESSION_CREDITS as u32
        };
        let route = match self.transport.resolve(&pkt.client.routing()) {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(error = %e, client = %pkt.client, "connect request: routing resolution failed");
                return fail(self, SmErr::RoutingResolutionFailure);
            }
        };
        // One host's sessions hold at most its share of the ring.
        if !self.source_has_room(&from.host, credits as usize) {
            return fail(self, SmErr::RingExhausted);
        }
        // Only a request that would otherwise succeed may reclaim an
        // unused session for its room.
        if !self.make_ring_room(credits as usize) {
            return fail(self, SmErr::RingExhausted);
        }
        let Some(sn) = self.alloc_session_num() else {
            return fail(self, SmErr::OutOfMemory);
        };
        let mut pre = Vec::with_capacity(crate::consts::SESSION_REQ_WINDOW);
        for slot in 0..crate::consts::SESSION_REQ_WINDOW {
            let origin = Origin::PreallocResp {
                session: sn,
                slot: slot as u8,
            };
            match MsgBuf::alloc(&mut self.alloc, MAX_DATA_PER_PKT, origin) {
                Ok(m) => pre.push(m),
                Err(_) => {
                    for m in pre {
                        self.alloc.free(m.into_buffer());
                    }
                    self.free_session_nums.push_back((sn, 0));
                    return fail(self, SmErr::OutOfMemory);
                }
            }
        }
        // The server endpoint goes back as the client filled it (hostname,
        // SM port, Rpc id, transport type: a C++ client asserts that the
        // hostname is unchanged), with our session number and routing
        // info, as the C++ eRPC answers.
        let mut server_ep = pkt.server;
        server_ep.session_num = sn;
        server_ep.routing_info = self.local_endpoint(sn).routing_info;
        // An erpc-rs client proposes a request-number base; adopt and echo
        // it. A C++ client numbers from 0.
        let req_base = self.req_base_override.unwrap_or(if ext_client {
            slot_base(pkt.client.req_base())
        } else {
            0
        });
        if self.nexus.sm_extensions() {
            server_ep.set_req_base(req_base);
            server_ep.set_credits(credits);
        }
        let remote_uri = pkt.client.uri().unwrap_or_else(|| Uri::new("?", 0));
        let mut s = Session::new(
            Role::Server,
            SessionState::Connected,
            sn,
            pkt.uniq_token,
            remote_uri,
            pkt.client,
            server_ep,
            credits,
        );
        // A server session sends only what its client's packets ask for;
        // `credits` is its ring reservation.
        s.credits = 0;
        s.created_ns = self.clock.now_ns();
        s.remote_num = pkt.client.session_num;
        s.route = Some(std::rc::Rc::new(route));
        s.set_req_base(req_base);
        for (sv, m) in s.half.server_mut().iter_mut().zip(pre) {
            sv.pre_resp = Some(m);
        }
        // Zero ("a C++ peer": no pings, notices or status packets) unless
        // both ends speak the erpc-rs extensions.
        s.remote_incarnation = if self.nexus.sm_extensions() {
            pkt.client.incarnation()
        } else {
            0
        };
        self.sessions[usize::from(sn)] = Some(Box::new(s));
        self.open_sessions += 1;
        self.ring_entries_available -= credits as usize;
        self.token_map.insert(pkt.uniq_token, sn);
        self.note_unserved(sn, pkt.uniq_token);
        self.note_source_share(&from.host, sn, pkt.uniq_token, credits as usize);
        self.track_session(sn, from.verified);
        self.log_server_event(sn, "connected");
        let mut r = pkt.response(SmErr::NoError);
        r.server = server_ep;
        self.send_sm(&r);
    }

    /// Registers an established session with the Nexus's keep-alive pings
    /// (erpc-rs peers only: a C++ peer carries no incarnation). `verified`:
    /// the packet that named the peer's incarnation came from its address
    /// or answered our token (see `SmRouter::track`).
    fn track_session(&mut self, sn: SessionNum, verified: bool) {
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        if s.remote_incarnation == 0 || s.tracked {
            return;
        }
        s.tracked = true;
        let (uri, rpc_id, inc) = (
            s.remote_uri.clone(),
            s.remote_rpc_id(),
            s.remote_incarnation,
        );
        self.nexus.router().track(&uri, rpc_id, inc, verified);
    }

    /// The client session `sn` for an SM response, if it matches.
    fn client_session_for(&self, pkt: &SmPkt, state: SessionState) -> Option<SessionNum> {
        let sn = pkt.client.session_num;
        let s = self.session(sn)?;
        (s.role == Role::Client && s.state == state && s.uniq_token == pkt.uniq_token).then_some(sn)
    }

    fn handle_connect_resp(&mut self, pkt: &SmPkt) {
        // A server telling us it ended a connected session.
        if pkt.err == SmErr::SrvDisconnected && self.handle_server_disconnected(pkt) {
            return;
        }
        let Some(sn) = self.client_session_for(pkt, SessionState::ConnectInProgress) else {
            if self.abandoned_resp(pkt) {
                return;
            }
            self.disown_server_session(pkt);
            return self.stats.drop(DropReason::SmStale);
        };
        self.sm_pending.retain(|&x| x != sn);
        if pkt.err != SmErr::NoError {
            return self.fail_connect(sn, pkt.err);
        }
        let now = self.clock.now_ns();
        match self.transport.resolve(&pkt.server.routing()) {
            Ok(route) => {
                let base_override = self.req_base_override;
                let ext_server = self.ext_peer(&pkt.server);
                let ext = self.nexus.sm_extensions();
                let s = self.session_mut(sn).expect("matched above");
                s.set_server_endpoint(&pkt.server);
                s.remote_num = pkt.server.session_num;
                s.remote_incarnation = if ext { pkt.server.incarnation() } else { 0 };
                // Never more credits than the server reserved for us: what
                // an erpc-rs server granted, 32 at a C++ server. The spare
                // part of our own reservation goes back to the ring.
                let granted = if ext_server {
                    granted_credits(pkt.server.credits())
                } else {
                    SESSION_CREDITS as u32
                };
                let credits = granted.min(s.credits_max);
                let spare = (s.credits_max - credits) as usize;
                s.credits_max = credits;
                s.credits = credits;
                // The base the server adopted (0 from a C++ server).
                let base = base_override.unwrap_or(if ext_server {
                    slot_base(pkt.server.req_base())
                } else {
                    0
                });
                s.set_req_base(base);
                s.route = Some(std::rc::Rc::new(route));
                s.state = SessionState::Connected;
                s.sm_pending_since_ns = None;
                self.ring_entries_available += spare;
                // The response answered our random token.
                self.track_session(sn, true);
                self.owe_event(sn, SessionEventKind::Connected);
                self.drain_backlog(sn);
            }
            Err(e) => {
                // The server has a session for us: tear it down before
                // reporting the failure.
                tracing::info!(error = %e, server = %pkt.server, "connect response: routing resolution failed");
                let s = self.session_mut(sn).expect("matched above");
                s.set_server_endpoint(&pkt.server);
                s.remote_num = pkt.server.session_num;
                s.connect_fail = Some(SmErr::RoutingResolutionFailure);
                self.start_disconnect(sn, now);
            }
        }
    }

    fn handle_disconnect_req(&mut self, pkt: &SmPkt) {
        let sn = pkt.server.session_num;
        let matches = self
            .session(sn)
            .is_some_and(|s| s.role == Role::Server && s.uniq_token == pkt.uniq_token);
        if matches {
            self.log_server_event(sn, "disconnected by its client");
            // Handlers still running keep the session (Resetting) until
            // they respond.
            self.retire_server_session(sn);
        }
        // Answer duplicates too: the first response may have been lost.
        self.send_sm(&pkt.response(SmErr::NoError));
    }

    fn handle_disconnect_resp(&mut self, pkt: &SmPkt) {
        let Some(sn) = self.client_session_for(pkt, SessionState::DisconnectInProgress) else {
            if self.abandoned_resp(pkt) {
                return;
            }
            return self.stats.drop(DropReason::SmStale);
        };
        self.sm_pending.retain(|&x| x != sn);
        self.finish_disconnect(sn);
    }

    /// A client disconnect is over (answered, or timed out): free the
    /// session and report it.
    fn finish_disconnect(&mut self, sn: SessionNum) {
        let fail = self.session(sn).and_then(|s| s.connect_fail);
        match fail {
            Some(err) => self.fail_connect(sn, err),
            None => {
                // The event first: it logs the session's peer.
                self.owe_event(sn, SessionEventKind::Disconnected);
                self.free_session(sn);
            }
        }
    }

    /// Frees a client session that could not connect, failing the requests
    /// that waited for it (in the next event-loop iteration).
    fn fail_connect(&mut self, sn: SessionNum, err: SmErr) {
        let backlog = match self.session_mut(sn) {
            Some(s) => std::mem::take(&mut s.backlog),
            None => return,
        };
        // The event first: it logs the session's peer.
        self.owe_event(sn, SessionEventKind::Ended(SessionEnd::ConnectFailed(err)));
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
                    why: SessionEnd::ConnectFailed(err),
                },
            }));
        }
    }

    /// Releases a session and everything it holds. A server session's
    /// running handlers must be done (see `reset_server_session`).
    pub(crate) fn free_session(&mut self, sn: SessionNum) {
        // Queued packets point into the session (its route, its buffers).
        self.tx.forget_session(sn, &mut self.stats.tx_stale);
        let Some(s) = self
            .sessions
            .get_mut(usize::from(sn))
            .and_then(Option::take)
        else {
            return;
        };
        let s = *s;
        debug_assert_eq!(s.local_num, sn);
        if s.slots.iter().any(|sl| sl.tx_msgbuf.is_some()) {
            // The transport may still hold sends of the session's messages
            // (a server's responses, unsignaled): none may be when their
            // buffers go back.
            self.transport.tx_flush();
            self.stats.tx_flushes += 1;
        }
        if s.tracked {
            self.nexus
                .router()
                .untrack(&s.remote_uri, s.remote_rpc_id(), s.remote_incarnation);
        }
        // A Resetting session already gave back its reservation and token.
        if s.state != SessionState::Resetting {
            if s.role == Role::Server && self.token_map.get(&s.uniq_token) == Some(&sn) {
                self.token_map.remove(&s.uniq_token);
                self.retired_tokens
                    .retire(s.uniq_token, self.clock.now_ns());
            }
            self.open_sessions -= 1;
            self.ring_entries_available += s.credits_max as usize;
        }
        let now = self.clock.now_ns();
        self.free_session_nums.push_back((sn, now));
        self.sm_pending.retain(|&x| x != sn);
        if s.active {
            self.active.remove(sn, s.tx_ts.clone());
        }
        let alloc = &mut self.alloc;
        s.into_buffers(|m| alloc.free(m.into_buffer()));
    }
}
