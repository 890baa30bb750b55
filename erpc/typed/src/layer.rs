//! The state the typed layer keeps beside an Rpc: it is the Rpc's context
//! type (`Rpc<T, Layer<T, C>>`), so the core's handlers and continuations
//! (plain `fn` pointers, generic over `T` and `C`) reach it as `&mut`
//! without a lock or a `RefCell`.
//!
//! Calls live in a slab of slots; a slot's index is the core request's
//! `tag`. A slot stays taken while the core holds its request (so a tag
//! is never reused under a request in flight) or the layer's per-session
//! queue holds it, and while its caller may still look at it (a future
//! not yet dropped). Message buffers of one packet are pooled, so a small
//! call allocates no hugepage memory once warm.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::{Rc, Weak};
use std::task::Waker;

use erpc::{
    Completion, MsgBuf, ReqHandle, RespondError, Rpc, RpcError, SessionEnd, SessionEvent,
    SessionEventKind, SessionNum,
};
use transport::{MAX_DATA_PER_PKT, Transport};

use crate::codec::{self, RESP_BAD_REQUEST, RESP_OK};
use crate::endpoint::Shared;
use crate::exec::Spawner;
use crate::service::Table;
use crate::{CallError, Ctx, Method};

/// Pooled one-packet buffers kept at most (beyond that they go back to
/// the allocator).
const POOL_MAX: usize = 1024;

/// What a finished call's outcome goes to.
pub(crate) type Done<T, C> = Box<dyn FnOnce(&mut Ctx<'_, T, C>, Result<&[u8], CallError>)>;

pub(crate) enum Deliver<T: Transport + 'static, C: 'static> {
    /// The slot is free.
    Free,
    /// A closure call: the closure runs once with the outcome.
    Closure(Done<T, C>),
    /// A future: the outcome waits in the slot until the future polls.
    Future {
        waker: Option<Waker>,
        result: Option<Result<MsgBuf, CallError>>,
    },
    /// Nobody wants the outcome any more (delivered, timed out, or the
    /// future was dropped): it is discarded when it comes.
    Gone,
}

pub(crate) struct Slot<T: Transport + 'static, C: 'static> {
    pub(crate) era: u32,
    /// The core holds the request (its continuation will come).
    in_core: bool,
    /// The session's queue in this layer holds the request.
    queued: bool,
    /// The call's session.
    session: SessionNum,
    pub(crate) deliver: Deliver<T, C>,
}

/// A request waiting for room in its session's window.
struct Queued {
    id: u32,
    req_type: u8,
    req: MsgBuf,
    resp: MsgBuf,
}

/// One session's window: calls in the core, and calls waiting.
#[derive(Default)]
struct Win {
    in_flight: usize,
    queue: VecDeque<Queued>,
}

/// A `connect` future's state.
pub(crate) struct ConnWait {
    pub(crate) session: SessionNum,
    pub(crate) waker: Option<Waker>,
    pub(crate) result: Option<Result<SessionNum, CallError>>,
}

/// Counters of the typed layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Calls started (closures and futures).
    pub calls: u64,
    /// Calls that waited in the layer's queue for room in their session's
    /// window.
    pub queued: u64,
    /// Calls completed with a response.
    pub ok: u64,
    /// Calls completed with an error (timeouts included).
    pub failed: u64,
    /// Calls whose timeout passed first.
    pub timed_out: u64,
    /// Outcomes discarded because nobody wanted them any more (a dropped
    /// future, a call that had timed out).
    pub discarded: u64,
    /// Requests the server could not decode (answered with a status).
    pub bad_requests: u64,
    /// Responses the core refused (the session went away while a
    /// deferred handler held the request).
    pub respond_errors: u64,
}

/// The typed layer's state beside an Rpc: the application's context `C`,
/// the service's handlers, and the calls in flight. Handlers and
/// continuations see it through [`Ctx`].
pub struct Layer<T: Transport + 'static, C: 'static> {
    pub(crate) app: C,
    pub(crate) table: Rc<Table<T, C>>,
    pub(crate) calls: Vec<Slot<T, C>>,
    free: Vec<u32>,
    wins: Vec<Win>,
    pool: Vec<MsgBuf>,
    /// Deadlines as (ns, slot, generation), soonest first.
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    pub(crate) window: usize,
    pub(crate) default_timeout_ns: Option<u64>,
    pub(crate) conns: Vec<ConnWait>,
    pub(crate) me: Weak<Shared<T, C>>,
    pub(crate) spawner: Spawner,
    pub(crate) stats: LayerStats,
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Layer<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer")
            .field("slots", &self.calls.len())
            .field("window", &self.window)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

pub(crate) type TRpc<T, C> = Rpc<T, Layer<T, C>>;

impl<T: Transport + 'static, C: 'static> Layer<T, C> {
    pub(crate) fn new(
        app: C,
        table: Rc<Table<T, C>>,
        window: usize,
        default_timeout_ns: Option<u64>,
        me: Weak<Shared<T, C>>,
        spawner: Spawner,
    ) -> Self {
        Layer {
            app,
            table,
            calls: Vec::new(),
            free: Vec::new(),
            wins: Vec::new(),
            pool: Vec::new(),
            timers: BinaryHeap::new(),
            window: window.max(1),
            default_timeout_ns,
            conns: Vec::new(),
            me,
            spawner,
            stats: LayerStats::default(),
        }
    }

    /// A one-packet buffer from the pool (or the allocator), sized `len`.
    #[inline]
    fn small_buf(&mut self, rpc: &mut TRpc<T, C>, len: usize) -> Result<MsgBuf, CallError> {
        let mut m = match self.pool.pop() {
            Some(m) => m,
            None => Self::alloc_small(rpc)?,
        };
        // A pooled buffer holds one packet, and `len` fits one.
        let _ = m.resize(len);
        Ok(m)
    }

    #[cold]
    fn alloc_small(rpc: &mut TRpc<T, C>) -> Result<MsgBuf, CallError> {
        Ok(rpc.alloc_msg_buffer(MAX_DATA_PER_PKT)?)
    }

    /// A buffer of `len` bytes: pooled when it fits one packet.
    #[inline]
    fn buf(&mut self, rpc: &mut TRpc<T, C>, len: usize) -> Result<MsgBuf, CallError> {
        if len <= MAX_DATA_PER_PKT {
            self.small_buf(rpc, len)
        } else {
            Ok(rpc.alloc_msg_buffer(len)?)
        }
    }

    /// Gives a buffer back: to the pool if it is a pooled size.
    #[inline]
    pub(crate) fn recycle(&mut self, rpc: &mut TRpc<T, C>, m: MsgBuf) {
        if m.max_len() == MAX_DATA_PER_PKT && self.pool.len() < POOL_MAX {
            self.pool.push(m);
        } else {
            rpc.free_msg_buffer(m);
        }
    }

    /// The request's buffer, encoded, and the response's.
    fn encode<M: Method>(
        &mut self,
        rpc: &mut TRpc<T, C>,
        req: &M,
    ) -> Result<(MsgBuf, MsgBuf), CallError> {
        let mut m = self.small_buf(rpc, MAX_DATA_PER_PKT)?;
        let n = match codec::encode_into(req, m.data_mut()) {
            Ok(Some(n)) => n,
            Ok(None) => {
                // Larger than a packet: a buffer of its size.
                self.recycle(rpc, m);
                let n = codec::encoded_len(req).map_err(CallError::Encode)?;
                m = self.buf(rpc, n)?;
                codec::encode_into(req, m.data_mut())
                    .map_err(CallError::Encode)?
                    .expect("sized by encoded_len")
            }
            Err(e) => {
                self.recycle(rpc, m);
                return Err(CallError::Encode(e));
            }
        };
        let _ = m.resize(n); // within the buffer it was encoded into
        let resp = match self.buf(rpc, 1 + M::MAX_RESP_BYTES) {
            Ok(r) => r,
            Err(e) => {
                self.recycle(rpc, m);
                return Err(e);
            }
        };
        Ok((m, resp))
    }

    #[inline]
    fn take_slot(&mut self, session: SessionNum, deliver: Deliver<T, C>) -> (u32, u32) {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.calls.push(Slot {
                    era: 0,
                    in_core: false,
                    queued: false,
                    session: 0,
                    deliver: Deliver::Free,
                });
                (self.calls.len() - 1) as u32
            }
        };
        let s = &mut self.calls[id as usize];
        debug_assert!(matches!(s.deliver, Deliver::Free));
        // A free slot holds nothing to drop: skip the drop glue.
        std::mem::forget(std::mem::replace(&mut s.deliver, deliver));
        s.session = session;
        (id, s.era)
    }

    /// Frees slot `id` if nothing refers to it any more.
    #[inline]
    pub(crate) fn maybe_free(&mut self, id: u32) {
        let s = &mut self.calls[id as usize];
        if !s.in_core && !s.queued && matches!(s.deliver, Deliver::Gone) {
            // `Gone` holds nothing to drop: skip the drop glue.
            std::mem::forget(std::mem::replace(&mut s.deliver, Deliver::Free));
            s.era = s.era.wrapping_add(1);
            self.free.push(id);
        }
    }

    #[inline]
    fn win(&mut self, sn: SessionNum) -> &mut Win {
        let i = usize::from(sn);
        if i >= self.wins.len() {
            self.wins.resize_with(i + 1, Win::default);
        }
        &mut self.wins[i]
    }

    /// Starts a call: encodes `req`, takes a slot, and hands the request
    /// to the core now if the session's window has room, or queues it.
    /// A failure here (encoding, memory, a session the core refuses) is
    /// returned and nothing is delivered.
    pub(crate) fn start<M: Method>(
        &mut self,
        rpc: &mut TRpc<T, C>,
        session: SessionNum,
        req: &M,
        deliver: Deliver<T, C>,
        timeout_ns: Option<u64>,
    ) -> Result<(u32, u32), CallError> {
        let (reqb, respb) = self.encode(rpc, req)?;
        let (id, era) = self.take_slot(session, deliver);
        self.stats.calls += 1;
        let window = self.window;
        let w = self.win(session);
        if w.in_flight < window && w.queue.is_empty() {
            if let Err(e) = self.send(rpc, session, id, M::REQ_TYPE, reqb, respb) {
                self.calls[id as usize].deliver = Deliver::Gone;
                self.maybe_free(id);
                self.stats.calls -= 1;
                return Err(e);
            }
        } else {
            w.queue.push_back(Queued {
                id,
                req_type: M::REQ_TYPE,
                req: reqb,
                resp: respb,
            });
            self.calls[id as usize].queued = true;
            self.stats.queued += 1;
        }
        if let Some(t) = timeout_ns.or(self.default_timeout_ns) {
            self.timers
                .push(Reverse((rpc.now_ns().saturating_add(t), id, era)));
        }
        Ok((id, era))
    }

    /// Hands a request to the core.
    #[inline(always)]
    fn send(
        &mut self,
        rpc: &mut TRpc<T, C>,
        session: SessionNum,
        id: u32,
        req_type: u8,
        req: MsgBuf,
        resp: MsgBuf,
    ) -> Result<(), CallError> {
        match rpc.enqueue_request(
            session,
            req_type,
            req,
            resp,
            on_complete::<T, C>,
            id as usize,
        ) {
            Ok(()) => {
                self.calls[id as usize].in_core = true;
                self.win(session).in_flight += 1;
                Ok(())
            }
            Err(e) => {
                let kind = e.kind;
                self.recycle(rpc, e.req);
                self.recycle(rpc, e.resp);
                Err(CallError::Enqueue(kind))
            }
        }
    }

    /// Starts queued calls of `session` while its window has room.
    fn pump(&mut self, rpc: &mut TRpc<T, C>, session: SessionNum) {
        loop {
            let window = self.window;
            let w = self.win(session);
            if w.in_flight >= window {
                return;
            }
            let Some(q) = w.queue.pop_front() else {
                return;
            };
            self.calls[q.id as usize].queued = false;
            if !self.wanted(q.id) {
                self.recycle(rpc, q.req);
                self.recycle(rpc, q.resp);
                self.maybe_free(q.id);
                continue;
            }
            if let Err(e) = self.send(rpc, session, q.id, q.req_type, q.req, q.resp) {
                self.deliver(rpc, q.id, Err(e));
            }
        }
    }

    /// Fails every queued call of `session` with `err` (its session is
    /// gone: they would only be refused one by one).
    fn fail_queue(&mut self, rpc: &mut TRpc<T, C>, session: SessionNum, err: &CallError) {
        let Some(w) = self.wins.get_mut(usize::from(session)) else {
            return;
        };
        let q = std::mem::take(&mut w.queue);
        for c in q {
            self.calls[c.id as usize].queued = false;
            self.recycle(rpc, c.req);
            self.recycle(rpc, c.resp);
            if self.wanted(c.id) {
                self.deliver(rpc, c.id, Err(err.clone()));
            } else {
                self.maybe_free(c.id);
            }
        }
    }

    /// Takes slot `id`'s request out of its session's queue, if it waits
    /// there (it is never sent).
    fn unqueue(&mut self, rpc: &mut TRpc<T, C>, id: u32) {
        let s = &mut self.calls[id as usize];
        if !s.queued {
            return;
        }
        s.queued = false;
        let sn = s.session;
        let q = &mut self.wins[usize::from(sn)].queue;
        if let Some(i) = q.iter().position(|c| c.id == id) {
            let c = q.remove(i).expect("found");
            self.recycle(rpc, c.req);
            self.recycle(rpc, c.resp);
        }
    }

    /// True if somebody still waits for slot `id`'s outcome.
    #[inline]
    fn wanted(&self, id: u32) -> bool {
        match &self.calls[id as usize].deliver {
            Deliver::Closure(_) => true,
            Deliver::Future { result, .. } => result.is_none(),
            Deliver::Gone | Deliver::Free => false,
        }
    }

    /// Hands slot `id` its outcome: runs its closure, or parks the outcome
    /// for its future and wakes it, or discards it.
    pub(crate) fn deliver(
        &mut self,
        rpc: &mut TRpc<T, C>,
        id: u32,
        outcome: Result<MsgBuf, CallError>,
    ) {
        match &outcome {
            Ok(_) => self.stats.ok += 1,
            Err(_) => self.stats.failed += 1,
        }
        let slot = &mut self.calls[id as usize];
        match std::mem::replace(&mut slot.deliver, Deliver::Gone) {
            Deliver::Closure(f) => {
                match outcome {
                    Ok(resp) => {
                        {
                            let body = unwrap_envelope(resp.data());
                            f(&mut Ctx { rpc, layer: self }, body);
                        }
                        self.recycle(rpc, resp);
                    }
                    Err(e) => f(&mut Ctx { rpc, layer: self }, Err(e)),
                }
                self.maybe_free(id);
            }
            Deliver::Future {
                waker,
                result: None,
            } => {
                slot.deliver = Deliver::Future {
                    waker: None,
                    result: Some(outcome),
                };
                if let Some(w) = waker {
                    w.wake();
                }
            }
            d @ Deliver::Future {
                result: Some(_), ..
            } => {
                // Already answered (a timeout): this outcome is surplus.
                slot.deliver = d;
                self.discard(rpc, outcome);
            }
            Deliver::Gone | Deliver::Free => {
                self.discard(rpc, outcome);
                self.maybe_free(id);
            }
        }
    }

    fn discard(&mut self, rpc: &mut TRpc<T, C>, outcome: Result<MsgBuf, CallError>) {
        self.stats.discarded += 1;
        match outcome {
            Ok(_) => self.stats.ok -= 1,
            Err(_) => self.stats.failed -= 1,
        }
        if let Ok(m) = outcome {
            self.recycle(rpc, m);
        }
    }

    /// True if some call has a timeout.
    #[inline]
    pub(crate) fn has_timers(&self) -> bool {
        !self.timers.is_empty()
    }

    /// Fails calls whose timeout passed (`now` on the Rpc's clock).
    #[inline(never)]
    pub(crate) fn fire_timers(&mut self, rpc: &mut TRpc<T, C>) {
        let now = rpc.now_ns();
        while let Some(&Reverse((at, id, era))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            let s = &self.calls[id as usize];
            if s.era != era || !self.wanted(id) {
                continue;
            }
            let sent = s.in_core;
            self.stats.timed_out += 1;
            self.unqueue(rpc, id);
            self.deliver(rpc, id, Err(CallError::TimedOut { sent }));
        }
    }

    /// A future gave up on slot `(id, era)` (it was dropped).
    pub(crate) fn abandon(&mut self, rpc: &mut TRpc<T, C>, id: u32, era: u32) {
        let Some(s) = self.calls.get_mut(id as usize) else {
            return;
        };
        if s.era != era {
            return;
        }
        if let Deliver::Future {
            result: Some(Ok(m)),
            ..
        } = std::mem::replace(&mut s.deliver, Deliver::Gone)
        {
            self.recycle(rpc, m);
        }
        self.unqueue(rpc, id);
        self.maybe_free(id);
    }

    /// Gives every buffer the layer holds back to the Rpc (before it is
    /// dropped).
    pub(crate) fn release_all(&mut self, rpc: &mut TRpc<T, C>) {
        for w in std::mem::take(&mut self.wins) {
            for q in w.queue {
                rpc.free_msg_buffer(q.req);
                rpc.free_msg_buffer(q.resp);
            }
        }
        for s in &mut self.calls {
            if let Deliver::Future {
                result: Some(Ok(m)),
                ..
            } = std::mem::replace(&mut s.deliver, Deliver::Gone)
            {
                rpc.free_msg_buffer(m);
            }
        }
        for m in self.pool.drain(..) {
            rpc.free_msg_buffer(m);
        }
    }

    /// Calls in this layer that have not finished (in the core or queued).
    pub(crate) fn pending(&self) -> usize {
        self.calls.iter().filter(|s| s.in_core || s.queued).count()
    }
}

/// The response body after the status byte, or the status as an error.
#[inline]
fn unwrap_envelope(data: &[u8]) -> Result<&[u8], CallError> {
    match data.split_first() {
        Some((&RESP_OK, body)) => Ok(body),
        Some((&RESP_BAD_REQUEST, _)) => Err(CallError::BadRequest),
        _ => Err(CallError::Decode(postcard::Error::DeserializeBadEncoding)),
    }
}

/// Decodes a response (status byte and body).
pub(crate) fn decode_resp<R: serde::de::DeserializeOwned>(data: &[u8]) -> Result<R, CallError> {
    codec::decode(unwrap_envelope(data)?).map_err(CallError::Decode)
}

/// The continuation of every typed call.
fn on_complete<T: Transport + 'static, C: 'static>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    c: Completion,
) {
    let id = c.tag as u32;
    let sn = c.session;
    layer.recycle(rpc, c.req);
    let w = layer.win(sn);
    w.in_flight -= 1;
    layer.calls[id as usize].in_core = false;
    let outcome = match c.result {
        Ok(()) => Ok(c.resp),
        Err(e) => {
            layer.recycle(rpc, c.resp);
            Err(CallError::Rpc(e))
        }
    };
    let gone = match &outcome {
        Err(e) if e.session_gone() => Some(e.clone()),
        _ => None,
    };
    layer.deliver(rpc, id, outcome);
    match gone {
        Some(e) => layer.fail_queue(rpc, sn, &e),
        None if !layer.wins[usize::from(sn)].queue.is_empty() => layer.pump(rpc, sn),
        None => {}
    }
}

/// The error a session event gives the calls queued on the session, if
/// it ends the session.
fn session_end(ev: SessionEvent) -> Option<RpcError> {
    let session = ev.session;
    Some(match ev.kind {
        SessionEventKind::Disconnected => RpcError::SessionDestroyed { session },
        // (As before the outcomes were shared: these two leave the queue
        // alone.)
        SessionEventKind::Ended(SessionEnd::ServerEnded | SessionEnd::Stalled) => return None,
        SessionEventKind::Ended(why) => RpcError::SessionEnded { session, why },
        _ => return None,
    })
}

/// The session-event callback of every typed endpoint.
pub(crate) fn on_session<T: Transport + 'static, C: 'static>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    ev: SessionEvent,
) {
    let end = session_end(ev);
    if let Some(e) = end {
        layer.fail_queue(rpc, ev.session, &CallError::Rpc(e));
    }
    if ev.kind == SessionEventKind::Connected || end.is_some() {
        for w in layer.conns.iter_mut().filter(|w| w.session == ev.session) {
            if w.result.is_none() {
                w.result = Some(match end {
                    None => Ok(ev.session),
                    Some(e) => Err(CallError::Rpc(e)),
                });
                if let Some(k) = w.waker.take() {
                    k.wake();
                }
            }
        }
    }
    if let Some(h) = layer.table.on_session.clone() {
        h(&mut Ctx { rpc, layer }, ev);
    }
}

/// Encodes `resp` as the response to `h`, in the slot's preallocated
/// buffer when it fits one packet.
pub(crate) fn respond<T: Transport + 'static, C: 'static, R: serde::Serialize>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    h: ReqHandle,
    resp: &R,
) -> Result<(), RespondError> {
    let oom = |n| RespondError::OutOfMemory(n);
    let mut m = rpc
        .response_buffer(&h, MAX_DATA_PER_PKT)
        .map_err(|_| oom(MAX_DATA_PER_PKT))?;
    m.data_mut()[0] = RESP_OK;
    let n = match codec::encode_into(resp, &mut m.data_mut()[1..]) {
        Ok(Some(n)) => 1 + n,
        _ => {
            // Larger than a packet (or unencodable: then an empty body,
            // which the client reports as a decode error).
            rpc.free_msg_buffer(m);
            let n = codec::encoded_len(resp).map_or(0, |n| n + 1);
            m = rpc.response_buffer(&h, n.max(1)).map_err(|_| oom(n))?;
            m.data_mut()[0] = RESP_OK;
            if n > 1 {
                let _ = codec::encode_into(resp, &mut m.data_mut()[1..]);
            }
            n.max(1)
        }
    };
    let _ = m.resize(n); // within the buffer it was encoded into
    let r = rpc.enqueue_response(h, m);
    if r.is_err() {
        layer.stats.respond_errors += 1;
    }
    r
}

/// Answers `h` with the bad-request status.
pub(crate) fn respond_bad_request<T: Transport + 'static, C: 'static>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    h: ReqHandle,
) {
    layer.stats.bad_requests += 1;
    if rpc.respond(h, &[RESP_BAD_REQUEST]).is_err() {
        layer.stats.respond_errors += 1;
    }
}
