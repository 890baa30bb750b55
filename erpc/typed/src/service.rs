//! Typed handlers: what a server answers, per [`Method`].

use std::marker::PhantomData;
use std::sync::Arc;

use erpc::{BgResponse, NexusBuilder, ReqHandle, Request, RespondError, SessionEvent};
use transport::Transport;

use crate::codec::{self, RESP_BAD_REQUEST, RESP_OK};
use crate::layer::{Layer, TRpc, respond, respond_bad_request};
use crate::{Ctx, Method};

/// A type-erased dispatch handler: decodes, runs the user's handler and
/// responds.
pub(crate) type DispatchFn<T, C> = Arc<dyn Fn(&mut Ctx<'_, T, C>, ReqHandle, &[u8]) + Send + Sync>;
type BgFn = Arc<dyn Fn(&[u8], &mut BgResponse<'_>) + Send + Sync>;
pub(crate) type SessionFn<T, C> = Arc<dyn Fn(&mut Ctx<'_, T, C>, SessionEvent) + Send + Sync>;

/// The handlers of one Rpc, by request type.
pub(crate) struct Table<T: Transport + 'static, C: 'static> {
    pub(crate) dispatch: Vec<Option<DispatchFn<T, C>>>,
    pub(crate) on_session: Option<SessionFn<T, C>>,
}

/// A typed service: the handlers of the request types a server answers,
/// each a [`Method`] with its request and response types.
///
/// * [`Service::handle`]: `fn(&mut Ctx, Req) -> Resp`, in the Rpc's event
///   loop (the paper's dispatch handlers: short, run to completion).
/// * [`Service::handle_deferred`]: the handler gets a [`Reply`] and may
///   answer later (after a nested call, from a task), with
///   [`Ctx::reply`] or [`crate::Client::reply`].
/// * [`Service::handle_background`]: `fn(Req) -> Resp` on the Nexus's
///   worker threads (long handlers; the request is copied to the worker).
///
/// A service is built once per process and shared by its endpoints (it is
/// `Clone`, `Send` and `Sync`): [`Service::register`] puts its request
/// types into the Nexus's handler table before any Rpc exists, and each
/// [`crate::Endpoint`] keeps a reference to its handlers.
pub struct Service<T: Transport + 'static, C: 'static> {
    dispatch: Vec<Option<DispatchFn<T, C>>>,
    background: Vec<(u8, BgFn)>,
    on_session: Option<SessionFn<T, C>>,
    error: Option<u8>,
}

impl<T: Transport + 'static, C: 'static> Clone for Service<T, C> {
    fn clone(&self) -> Self {
        Service {
            dispatch: self.dispatch.clone(),
            background: self.background.clone(),
            on_session: self.on_session.clone(),
            error: self.error,
        }
    }
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Service<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d: Vec<usize> = (0..256).filter(|&t| self.dispatch[t].is_some()).collect();
        let b: Vec<u8> = self.background.iter().map(|(t, _)| *t).collect();
        f.debug_struct("Service")
            .field("dispatch_types", &d)
            .field("background_types", &b)
            .finish_non_exhaustive()
    }
}

impl<T: Transport + 'static, C: 'static> Default for Service<T, C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Transport + 'static, C: 'static> Service<T, C> {
    /// A service with no handlers (a pure client needs none).
    pub fn new() -> Self {
        Service {
            dispatch: (0..256).map(|_| None).collect(),
            background: Vec::new(),
            on_session: None,
            error: None,
        }
    }

    fn taken(&mut self, t: u8) -> bool {
        let dup =
            self.dispatch[usize::from(t)].is_some() || self.background.iter().any(|(b, _)| *b == t);
        if dup {
            self.error.get_or_insert(t);
        }
        dup
    }

    /// Answers `M` with `f` in the event loop: `f` gets the context and
    /// the decoded request and returns the response, which is encoded into
    /// the slot's preallocated buffer (no allocation when it fits one
    /// packet).
    pub fn handle<M, F>(mut self, f: F) -> Self
    where
        M: Method,
        F: Fn(&mut Ctx<'_, T, C>, M) -> M::Resp + Send + Sync + 'static,
    {
        if self.taken(M::REQ_TYPE) {
            return self;
        }
        self.dispatch[usize::from(M::REQ_TYPE)] = Some(Arc::new(
            move |ctx: &mut Ctx<'_, T, C>, h: ReqHandle, data: &[u8]| match codec::decode::<M>(data)
            {
                Ok(req) => {
                    let resp = f(ctx, req);
                    let _ = respond(ctx.rpc, ctx.layer, h, &resp);
                }
                Err(_) => respond_bad_request(ctx.rpc, ctx.layer, h),
            },
        ));
        self
    }

    /// Answers `M` with `f`, which gets a [`Reply`] to answer with now or
    /// later ([`Ctx::reply`], [`crate::Client::reply`]), e.g. once a
    /// nested call it made has returned. The core keeps the request's slot
    /// until then; a reply that is never sent leaves the client's call
    /// waiting (until its timeout, or until the session ends).
    pub fn handle_deferred<M, F>(mut self, f: F) -> Self
    where
        M: Method,
        F: Fn(&mut Ctx<'_, T, C>, M, Reply<M>) + Send + Sync + 'static,
    {
        if self.taken(M::REQ_TYPE) {
            return self;
        }
        self.dispatch[usize::from(M::REQ_TYPE)] = Some(Arc::new(
            move |ctx: &mut Ctx<'_, T, C>, h: ReqHandle, data: &[u8]| match codec::decode::<M>(data)
            {
                Ok(req) => f(
                    ctx,
                    req,
                    Reply {
                        handle: h,
                        _m: PhantomData,
                    },
                ),
                Err(_) => respond_bad_request(ctx.rpc, ctx.layer, h),
            },
        ));
        self
    }

    /// Answers `M` with `f` on one of the Nexus's worker threads (see
    /// `NexusBuilder::workers`): for handlers too long for the event loop.
    /// `f` sees only the request (it runs on another thread, without the
    /// Rpc or its context); its response is encoded there.
    pub fn handle_background<M, F>(mut self, f: F) -> Self
    where
        M: Method,
        F: Fn(M) -> M::Resp + Send + Sync + 'static,
    {
        if self.taken(M::REQ_TYPE) {
            return self;
        }
        let bg: BgFn = Arc::new(move |data: &[u8], out: &mut BgResponse<'_>| {
            match codec::decode::<M>(data) {
                Ok(req) => {
                    let resp = f(req);
                    match codec::encoded_len(&resp) {
                        Ok(n) => {
                            let buf = out.buf(1 + n);
                            buf[0] = RESP_OK;
                            let _ = codec::encode_into(&resp, &mut buf[1..]);
                        }
                        // Unencodable: an empty body (a decode error at the
                        // client).
                        Err(_) => out.buf(1)[0] = RESP_OK,
                    }
                }
                Err(_) => out.buf(1)[0] = RESP_BAD_REQUEST,
            }
        });
        self.background.push((M::REQ_TYPE, bg));
        self
    }

    /// Session events (connected, failed, ...) of each endpoint go to `f`
    /// too (calls and `connect` futures learn of them without it).
    pub fn on_session<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut Ctx<'_, T, C>, SessionEvent) + Send + Sync + 'static,
    {
        self.on_session = Some(Arc::new(f));
        self
    }

    /// Puts the service's request types into a Nexus's handler table: the
    /// typed dispatcher for event-loop handlers, the background handlers
    /// as they are. A request type given two handlers makes the Nexus
    /// fail to build (`NexusError::DuplicateHandler`), as in the core.
    pub fn register(&self, mut b: NexusBuilder) -> NexusBuilder {
        for t in 0..=255u8 {
            if self.dispatch[usize::from(t)].is_some() {
                b = b.handler::<T, Layer<T, C>>(t, dispatch::<T, C>);
            }
        }
        for (t, f) in &self.background {
            let f = f.clone();
            b = b.bg_handler(*t, move |d: &[u8], out: &mut BgResponse<'_>| f(d, out));
        }
        if let Some(t) = self.error {
            // Registered twice here: the Nexus reports the duplicate.
            b = b
                .handler::<T, Layer<T, C>>(t, dispatch::<T, C>)
                .handler::<T, Layer<T, C>>(t, dispatch::<T, C>);
        }
        b
    }

    pub(crate) fn table(&self) -> Table<T, C> {
        Table {
            dispatch: self.dispatch.clone(),
            on_session: self.on_session.clone(),
        }
    }
}

/// The core's handler for every typed event-loop request type.
fn dispatch<T: Transport + 'static, C: 'static>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    req: Request<'_>,
) {
    // An `Rc` clone (no atomic): the handler borrows the layer mutably.
    let table = layer.table.clone();
    match &table.dispatch[usize::from(req.req_type)] {
        Some(f) => f(&mut Ctx { rpc, layer }, req.handle, req.data),
        // A Nexus shared with another service registered the type.
        None => respond_bad_request(rpc, layer, req.handle),
    }
}

/// The right to answer one request of method `M` ([`Service::
/// handle_deferred`]): consumed by [`Ctx::reply`] or
/// [`crate::Client::reply`]. Dropping it without replying leaves the
/// client's call unanswered.
#[must_use = "a Reply that is never sent leaves the client's call waiting"]
pub struct Reply<M: Method> {
    pub(crate) handle: ReqHandle,
    _m: PhantomData<fn() -> M>,
}

impl<M: Method> std::fmt::Debug for Reply<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Reply<{}>({:?})",
            std::any::type_name::<M>(),
            self.handle
        )
    }
}

impl<M: Method> Reply<M> {
    /// The session the request came on.
    pub fn session(&self) -> erpc::SessionNum {
        self.handle.session()
    }
}

pub(crate) fn send_reply<T: Transport + 'static, C: 'static, M: Method>(
    rpc: &mut TRpc<T, C>,
    layer: &mut Layer<T, C>,
    r: Reply<M>,
    resp: &M::Resp,
) -> Result<(), RespondError> {
    respond(rpc, layer, r.handle, resp)
}
