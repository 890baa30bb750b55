//! Sessions and their slots (the C++ `Session` and `SSlot`).
//!
//! A session is one end of a client–server connection between two Rpcs.
//! It has [`SESSION_REQ_WINDOW`] slots; slot `i` carries request numbers
//! `i + 8, i + 16, ...`, so a packet's slot is its request number mod 8.
//! Requests beyond the window wait in the session's backlog.
//!
//! The per-slot client state counts packets sent and acknowledged per
//! request (`num_tx`, `num_rx`) with a progress timestamp, like the C++
//! sslot: go-back-N rolls `num_tx` back to `num_rx` when the slot has made
//! no progress for the retransmission timeout (`rpc/loss.rs`).
//!
//! Credit invariant of a connected client session, checked by the tests
//! and asserted in debug builds where it must hold (`rpc/cr.rs`):
//! `credits + sum over busy slots of (num_tx - num_rx) == credits_max`.

use std::collections::VecDeque;

use transport::Transport;

use crate::consts::SESSION_REQ_WINDOW;
use crate::msgbuf::MsgBuf;
use crate::nexus::Uri;
use crate::rpc::Continuation;
use crate::sm_types::{EndpointFields, SmEndpoint, SmErr};

/// Which end of the session we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// We send requests.
    Client,
    /// We run handlers and send responses.
    Server,
}

/// Connection state of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Client: connect request sent, no response yet.
    ConnectInProgress,
    /// Usable.
    Connected,
    /// Client: disconnect request sent, no response yet.
    DisconnectInProgress,
    /// Server: reset (its client failed or went away) while handlers of
    /// it still run on workers or hold deferred responses; freed when the
    /// last of them responds. Accepts no packets.
    Resetting,
}

/// A request waiting for a free slot.
pub(crate) struct PendingReq<T: Transport, C> {
    pub req_type: u8,
    pub req: MsgBuf,
    pub resp: MsgBuf,
    pub cont: Continuation<T, C>,
    pub tag: usize,
}

/// Client half of a slot.
pub(crate) struct ClientInfo<T: Transport, C> {
    /// Where the response goes (the request is `SSlot::tx_msgbuf`).
    pub resp_msgbuf: Option<MsgBuf>,
    pub cont: Option<Continuation<T, C>>,
    pub tag: usize,
    pub req_type: u8,
    /// Packets in the request.
    pub req_pkts: u32,
    /// Packets in the response (0 until its first packet arrives).
    pub resp_pkts: u32,
    /// Response size (valid once `resp_pkts > 0`).
    pub resp_bytes: u32,
    /// Request packets and RFRs sent for this request.
    pub num_tx: u32,
    /// Credit returns and response packets received for this request.
    pub num_rx: u32,
    /// When the request last made progress (enqueue, or a packet in).
    pub progress_ns: u64,
    /// When the slot last put a packet in flight with none outstanding
    /// (`num_tx == num_rx` before the send: its first send, a send after
    /// waiting for credits, a resend after a rollback). The
    /// retransmission timeout runs from the later of this and
    /// `progress_ns`, so time spent waiting for credits never counts.
    pub in_flight_ns: u64,
    /// Request number of the last request on this slot that completed with
    /// an error, so that its late response is counted as such.
    pub abandoned_req_num: u64,
    /// Request size in bytes.
    pub req_bytes: u32,
    /// Packets of this slot in the timing wheel (current generation).
    pub wheel_count: u16,
    /// Rollback generation: wheel entries of an older one are dropped.
    pub wheel_gen: u8,
    /// In the Rpc's credit-stall queue.
    pub in_stallq: bool,
    /// Rolled back since it started: packets of it may have left (through
    /// the timing wheel or the stall queue) after the loss scan's drains,
    /// so its completion drains TX before the buffers go back.
    pub resent: bool,
}

impl<T: Transport, C> ClientInfo<T, C> {
    fn new() -> Self {
        ClientInfo {
            resp_msgbuf: None,
            cont: None,
            tag: 0,
            req_type: 0,
            req_pkts: 0,
            resp_pkts: 0,
            resp_bytes: 0,
            num_tx: 0,
            num_rx: 0,
            progress_ns: 0,
            in_flight_ns: 0,
            abandoned_req_num: u64::MAX,
            req_bytes: 0,
            wheel_count: 0,
            wheel_gen: 0,
            in_stallq: false,
            resent: false,
        }
    }

    /// Packets on the wire for the whole exchange (request packets, plus
    /// one RFR per response packet after the first); before the response's
    /// first packet arrives (`resp_pkts == 0`), the request packets alone.
    #[inline]
    pub(crate) fn wire_pkts(&self) -> u32 {
        if self.resp_pkts == 0 {
            self.req_pkts
        } else {
            self.req_pkts + self.resp_pkts - 1
        }
    }
}

/// Where a server slot is in handling its current request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SrvState {
    /// No request yet on this slot.
    Idle,
    /// Reassembling a multi-packet request.
    Receiving,
    /// The dispatch handler is running.
    InHandler,
    /// The handler returned without responding (nested RPC).
    Deferred,
    /// A worker thread has the request.
    Background,
    /// The response is in `SSlot::tx_msgbuf`.
    Responded,
    /// The request was failed without running (or its background handler
    /// panicked): `ServerInfo::status` is the code its status packet
    /// carries, sent again for any duplicate (see `rpc/status.rs`).
    Failed,
}

impl SrvState {
    /// The state's name as the debug endpoint shows it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SrvState::Idle => "idle",
            SrvState::Receiving => "receiving",
            SrvState::InHandler => "in_handler",
            SrvState::Deferred => "deferred",
            SrvState::Background => "background",
            SrvState::Responded => "responded",
            SrvState::Failed => "failed",
        }
    }
}

/// Server half of a slot.
pub(crate) struct ServerInfo {
    pub state: SrvState,
    /// Reassembled (or copied) request, valid until the response.
    pub req_msgbuf: Option<MsgBuf>,
    /// The preallocated MTU-size response buffer, when not in use.
    pub pre_resp: Option<MsgBuf>,
    pub req_type: u8,
    pub req_bytes: u32,
    pub req_pkts: u32,
    /// Request packets received in order.
    pub num_rx: u32,
    /// Packet number the next in-order RFR carries.
    pub next_rfr: u32,
    pub progress_ns: u64,
    /// `SrvState::Failed`: the status code answered.
    pub status: u8,
}

impl ServerInfo {
    /// A handler has the slot's request and has not responded yet.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        matches!(
            self.state,
            SrvState::InHandler | SrvState::Deferred | SrvState::Background
        )
    }

    fn new() -> Self {
        ServerInfo {
            state: SrvState::Idle,
            req_msgbuf: None,
            pre_resp: None,
            req_type: 0,
            req_bytes: 0,
            req_pkts: 0,
            num_rx: 0,
            next_rfr: 0,
            progress_ns: 0,
            status: 0,
        }
    }
}

/// What a slot holds at either end of a session. The rest of a slot's
/// state is its end's: `Session::client[i]` or `Session::server[i]`.
pub(crate) struct SSlot {
    /// Request number of the current (or last) request on this slot.
    pub cur_req_num: u64,
    /// Client: the request being sent. Server: the response.
    pub tx_msgbuf: Option<MsgBuf>,
    /// The TX batch epoch in which the slot last queued a packet of
    /// `tx_msgbuf` (see `rpc::tx`).
    pub tx_epoch: u64,
}

/// The role-specific half of a session's slots: a session holds only its
/// own end's. The role is known wherever a half is used (the RX path
/// dispatches on it), so the accessors treat the other end's as a bug.
pub(crate) enum Half<T: Transport, C> {
    /// A client session's.
    Client([ClientInfo<T, C>; SESSION_REQ_WINDOW]),
    /// A server session's.
    Server([ServerInfo; SESSION_REQ_WINDOW]),
}

impl<T: Transport, C> Half<T, C> {
    /// The client halves (a client session's).
    #[inline(always)]
    pub(crate) fn client(&self) -> &[ClientInfo<T, C>; SESSION_REQ_WINDOW] {
        match self {
            Half::Client(c) => c,
            Half::Server(_) => unreachable!("a server session has no client half"),
        }
    }

    /// See [`Half::client`].
    #[inline(always)]
    pub(crate) fn client_mut(&mut self) -> &mut [ClientInfo<T, C>; SESSION_REQ_WINDOW] {
        match self {
            Half::Client(c) => c,
            Half::Server(_) => unreachable!("a server session has no client half"),
        }
    }

    /// The server halves (a server session's).
    #[inline(always)]
    pub(crate) fn server(&self) -> &[ServerInfo; SESSION_REQ_WINDOW] {
        match self {
            Half::Server(s) => s,
            Half::Client(_) => unreachable!("a client session has no server half"),
        }
    }

    /// See [`Half::server`].
    #[inline(always)]
    pub(crate) fn server_mut(&mut self) -> &mut [ServerInfo; SESSION_REQ_WINDOW] {
        match self {
            Half::Server(s) => s,
            Half::Client(_) => unreachable!("a client session has no server half"),
        }
    }

    /// The server halves, if this is a server session's.
    #[inline]
    pub(crate) fn as_server_mut(&mut self) -> Option<&mut [ServerInfo; SESSION_REQ_WINDOW]> {
        match self {
            Half::Server(s) => Some(s),
            Half::Client(_) => None,
        }
    }

    /// The client halves, if this is a client session's.
    #[inline]
    pub(crate) fn as_client_mut(&mut self) -> Option<&mut [ClientInfo<T, C>; SESSION_REQ_WINDOW]> {
        match self {
            Half::Client(c) => Some(c),
            Half::Server(_) => None,
        }
    }

    /// See [`Half::as_server_mut`].
    #[inline]
    pub(crate) fn as_server(&self) -> Option<&[ServerInfo; SESSION_REQ_WINDOW]> {
        match self {
            Half::Server(s) => Some(s),
            Half::Client(_) => None,
        }
    }
}

/// One end of a session.
pub(crate) struct Session<T: Transport, C> {
    pub role: Role,
    pub state: SessionState,
    pub local_num: u16,
    pub remote_num: u16,
    pub uniq_token: u64,
    pub remote_uri: Uri,
    /// The client's SM endpoint, but its hostname (`client_host`; the
    /// whole endpoint: [`Session::client_endpoint`]).
    pub client_ep: EndpointFields,
    /// The server's, likewise.
    pub server_ep: EndpointFields,
    /// The hostnames of the two endpoints, as their packets carried them.
    pub client_host: Box<[u8]>,
    pub server_host: Box<[u8]>,
    /// Where packets go. In an `Rc`: queued TX entries point at it (see
    /// `rpc::tx`), so it is never moved or written while the session is
    /// connected.
    pub route: Option<std::rc::Rc<T::Route>>,
    /// Client: packets we may still send before credits come back.
    pub credits: u32,
    /// The session's credits: RX ring entries it reserves at this Rpc and,
    /// at a client, the most packets it has outstanding (the configured
    /// credits until the server's answer, then what both ends agreed; see
    /// `sm_types::EXT_CREDITS`).
    pub credits_max: u32,
    pub slots: [SSlot; SESSION_REQ_WINDOW],
    /// The rest of each slot's state: its client half at a client
    /// session, its server half at a server session (a session holds only
    /// its own end's).
    pub half: Half<T, C>,
    pub backlog: VecDeque<PendingReq<T, C>>,
    /// Client: an SM request is outstanding; when it was last sent.
    pub sm_pending_since_ns: Option<u64>,
    /// Client: when the current SM request was first sent (for its timeout).
    pub sm_first_sent_ns: u64,
    /// Client: why a connect failed after the server accepted (we then
    /// disconnect before reporting it).
    pub connect_fail: Option<SmErr>,
    /// The remote Nexus's incarnation (0: a C++ peer, not pinged).
    pub remote_incarnation: u64,
    /// Registered with the Nexus's failure detection.
    pub tracked: bool,
    /// Fault injection: data packets to drop on transmission before any
    /// more are sent.
    pub fault_drop_tx: std::cell::Cell<u32>,
    /// Go-back-N rollbacks on this session.
    pub retransmits: u64,
    /// Client: Timely and pacing state (congestion control on).
    pub cc: Option<crate::cc::SessionCc>,
    /// Client: TX timestamps of each slot's packets in flight (`Rpc::tx_ts_cap`
    /// per slot), for RTT samples, while the session is active (from the
    /// Rpc's pool, see `rpc/active.rs`); the Rpc's shared empty array when
    /// idle or with congestion control off. In an `Rc` so that queued TX
    /// entries can point at their cells (see `rpc::tx`).
    pub tx_ts: std::rc::Rc<[std::cell::Cell<u64>]>,
    /// Client: in the Rpc's list of active sessions (`rpc/active.rs`).
    pub active: bool,
    /// Server: when the session was created.
    pub created_ns: u64,
    /// Server: a request arrived on the session (it is never reclaimed;
    /// see `rpc/admission.rs`).
    pub served_any: bool,
    /// Client, toward a C++ eRPC server: destroyed while requests of it
    /// were unfinished there. Its slots finish with the Rpc's own buffers
    /// (their requests already failed to the application), then the
    /// disconnect goes out (`rpc/reset.rs`, `begin_drain`). It takes no
    /// new requests and reads as disconnecting.
    pub closing: bool,
}

impl<T: Transport, C> Session<T, C> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        role: Role,
        state: SessionState,
        local_num: u16,
        uniq_token: u64,
        remote_uri: Uri,
        client_ep: SmEndpoint,
        server_ep: SmEndpoint,
        credits: u32,
    ) -> Self {
        let (client, server) = (client_ep.split(), server_ep.split());
        Session {
            role,
            state,
            local_num,
            remote_num: crate::consts::INVALID_SESSION_NUM,
            uniq_token,
            remote_uri,
            client_ep: client.0,
            server_ep: server.0,
            client_host: client.1,
            server_host: server.1,
            route: None,
            credits,
            credits_max: credits,
            slots: std::array::from_fn(|i| SSlot {
                cur_req_num: i as u64,
                tx_msgbuf: None,
                tx_epoch: 0,
            }),
            half: match role {
                Role::Client => Half::Client(std::array::from_fn(|_| ClientInfo::new())),
                Role::Server => Half::Server(std::array::from_fn(|_| ServerInfo::new())),
            },
            backlog: VecDeque::new(),
            sm_pending_since_ns: None,
            sm_first_sent_ns: 0,
            connect_fail: None,
            remote_incarnation: 0,
            tracked: false,
            fault_drop_tx: std::cell::Cell::new(0),
            retransmits: 0,
            cc: None,
            tx_ts: std::rc::Rc::new([]),
            active: false,
            created_ns: 0,
            served_any: false,
            closing: false,
        }
    }

    /// Numbers the slots' requests from `base` (see
    /// `sm_types::EXT_REQ_BASE`): slot `i` starts at `base + i`. Only
    /// before the first request.
    pub(crate) fn set_req_base(&mut self, base: u64) {
        debug_assert_eq!(base % SESSION_REQ_WINDOW as u64, 0);
        for (i, sl) in self.slots.iter_mut().enumerate() {
            debug_assert!(sl.tx_msgbuf.is_none());
            sl.cur_req_num = base + i as u64;
        }
    }

    /// The client's whole SM endpoint.
    pub(crate) fn client_endpoint(&self) -> SmEndpoint {
        self.client_ep.with_host(&self.client_host)
    }

    /// The server's whole SM endpoint.
    pub(crate) fn server_endpoint(&self) -> SmEndpoint {
        self.server_ep.with_host(&self.server_host)
    }

    /// Takes the server's SM endpoint from a connect response.
    pub(crate) fn set_server_endpoint(&mut self, ep: &SmEndpoint) {
        (self.server_ep, self.server_host) = ep.split();
    }

    /// Rpc id of the remote end.
    pub(crate) fn remote_rpc_id(&self) -> u8 {
        match self.role {
            Role::Client => self.server_ep.rpc_id,
            Role::Server => self.client_ep.rpc_id,
        }
    }

    /// Index of a client slot with no request in flight.
    #[inline]
    pub(crate) fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.tx_msgbuf.is_none())
    }

    /// Client slots with a request in flight.
    pub(crate) fn busy_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.tx_msgbuf.is_some()).count()
    }

    /// Hands every buffer the session holds to `f`: each slot's message,
    /// a client's response buffers and backlogged requests, a server's
    /// reassembly and preallocated response buffers.
    pub(crate) fn into_buffers(self, mut f: impl FnMut(MsgBuf)) {
        for sl in self.slots {
            sl.tx_msgbuf.into_iter().for_each(&mut f);
        }
        match self.half {
            Half::Client(cs) => {
                for c in cs {
                    c.resp_msgbuf.into_iter().for_each(&mut f);
                }
            }
            Half::Server(svs) => {
                for sv in svs {
                    // A slot may still be `InHandler` here only if its
                    // dispatch handler unwound (panicked) out of the event
                    // loop and the application dropped the Rpc after
                    // catching it: nothing else holds the slot, so its
                    // buffers go like any other's.
                    sv.req_msgbuf.into_iter().for_each(&mut f);
                    sv.pre_resp.into_iter().for_each(&mut f);
                }
            }
        }
        for p in self.backlog {
            f(p.req);
            f(p.resp);
        }
    }

    /// Server slots whose handler has not responded yet.
    pub(crate) fn busy_handlers(&self) -> usize {
        self.half
            .as_server()
            .map_or(0, |svs| svs.iter().filter(|sv| sv.busy()).count())
    }
}

/// Entries of a [`SessionTable`]: one per 16-bit session number.
const SESSION_TABLE_LEN: usize = 1 << 16;

/// The Rpc's sessions by local session number: a table with an entry for
/// every 16-bit number, so a lookup by [`crate::SessionNum`] needs no
/// bounds check (it runs several times per packet). The table is 512 KiB
/// of pointers; numbers are handed out from the bottom, and iteration
/// visits only the numbers handed out so far.
pub(crate) struct SessionTable<S> {
    slots: Box<[Option<Box<S>>; SESSION_TABLE_LEN]>,
    /// Numbers handed out so far (each below this is, or was, in use).
    used: usize,
}

impl<S> SessionTable<S> {
    pub(crate) fn new() -> SessionTable<S> {
        let slots: Box<[Option<Box<S>>]> = std::iter::repeat_with(|| None)
            .take(SESSION_TABLE_LEN)
            .collect();
        SessionTable {
            slots: slots.try_into().unwrap_or_else(|_| unreachable!()),
            used: 0,
        }
    }

    /// The entry of session number `i` (to take or replace the session):
    /// `None` out of the 16-bit range. Entries of numbers never handed out
    /// stay empty, so no check against the count is needed.
    #[inline]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut Option<Box<S>>> {
        self.slots.get_mut(i)
    }

    /// Session number `sn`, if it exists (a table entry per 16-bit number:
    /// no bounds check). A method of the table, not of the Rpc, so a caller
    /// can hold the session and borrow the Rpc's other fields beside it.
    #[inline]
    pub(crate) fn session(&self, sn: u16) -> Option<&S> {
        self.slots[usize::from(sn)].as_deref()
    }

    /// See [`SessionTable::session`].
    #[inline]
    pub(crate) fn session_mut(&mut self, sn: u16) -> Option<&mut S> {
        self.slots[usize::from(sn)].as_deref_mut()
    }

    /// Numbers handed out so far.
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// Hands out the next number, its entry empty.
    pub(crate) fn push_none(&mut self) -> usize {
        assert!(self.used < SESSION_TABLE_LEN, "session table full");
        self.used += 1;
        self.used - 1
    }

    /// Takes every number back (none is in use): the next one handed out
    /// is 0 again.
    pub(crate) fn reset_numbers(&mut self) {
        debug_assert!(self.iter().all(Option::is_none), "a number is in use");
        self.used = 0;
    }

    /// The entries of the numbers handed out so far.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Option<Box<S>>> {
        self.slots[..self.used].iter()
    }

    /// Empties the table, returning every session.
    pub(crate) fn take_all(&mut self) -> Vec<Box<S>> {
        let used = std::mem::take(&mut self.used);
        self.slots[..used]
            .iter_mut()
            .filter_map(Option::take)
            .collect()
    }
}

impl<S> std::ops::Index<usize> for SessionTable<S> {
    type Output = Option<Box<S>>;
    #[inline]
    fn index(&self, i: usize) -> &Option<Box<S>> {
        &self.slots[i]
    }
}

impl<S> std::ops::IndexMut<usize> for SessionTable<S> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Option<Box<S>> {
        &mut self.slots[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // Any transport type will do: these sessions never send.
    use transport::udp::UdpTransport as SimTransport;

    #[test]
    fn slots_start_at_their_index_and_wire_pkts() {
        let s: Session<SimTransport, ()> = Session::new(
            Role::Client,
            SessionState::ConnectInProgress,
            0,
            1,
            Uri::new("h", 1),
            SmEndpoint::default(),
            SmEndpoint::default(),
            32,
        );
        for (i, sl) in s.slots.iter().enumerate() {
            assert_eq!(sl.cur_req_num, i as u64);
            // First request on slot i is i + 8: slot = req_num mod 8.
            assert_eq!((sl.cur_req_num + 8) % 8, i as u64);
        }
        let mut c: ClientInfo<SimTransport, ()> = ClientInfo::new();
        c.req_pkts = 3;
        assert_eq!(
            c.wire_pkts(),
            3,
            "unknown response size: request packets only"
        );
        c.resp_pkts = 1;
        assert_eq!(c.wire_pkts(), 3);
        c.resp_pkts = 4;
        assert_eq!(c.wire_pkts(), 6);
        assert_eq!(s.free_slot(), Some(0));
    }

    #[test]
    fn session_table_hands_out_numbers_from_the_bottom() {
        let mut t: SessionTable<u32> = SessionTable::new();
        assert_eq!(t.len(), 0);
        assert!(t.session(5).is_none());
        assert!(t.get_mut(1 << 16).is_none());
        assert_eq!(t.push_none(), 0);
        assert_eq!(t.push_none(), 1);
        t[1] = Some(Box::new(7));
        assert_eq!(t.session(1), Some(&7));
        assert_eq!(t.session_mut(0), None);
        assert_eq!(t.iter().flatten().count(), 1);
        assert_eq!(t.take_all().len(), 1);
        assert_eq!(t.len(), 0);
        assert!(t[1].is_none());
    }
}
