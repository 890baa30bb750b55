//! An [`Endpoint`]: an Rpc with the typed layer as its context, its
//! single-threaded executor, and the handles ([`Client`], [`Call`]) that
//! futures use to reach it.
//!
//! The Rpc and the layer sit in one `RefCell` behind an `Rc`
//! ([`Shared`]). The event loop borrows it for an iteration (handlers and
//! continuations then get `&mut` through [`Ctx`], no cell involved); tasks
//! are polled after the iteration, when it is free, and a [`Call`] borrows
//! it for the moment it takes to start its request or read its outcome. So
//! the cell is never contended: the only way to meet it borrowed is to
//! poll a call from inside a handler (which panics, saying so).

use std::cell::RefCell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use erpc::{CreateError, Nexus, RespondError, Rpc, RpcConfig, RpcStats, SessionError, SessionNum};
use transport::Transport;

use crate::exec::Executor;
use crate::layer::{ConnWait, Deliver, Layer, LayerStats, TRpc, decode_resp};
use crate::service::{Reply, Service, send_reply};
use crate::{CallError, Method};

pub(crate) struct Core<T: Transport + 'static, C: 'static> {
    pub(crate) rpc: TRpc<T, C>,
    pub(crate) layer: Layer<T, C>,
}

impl<T: Transport + 'static, C: 'static> Drop for Core<T, C> {
    fn drop(&mut self) {
        self.layer.release_all(&mut self.rpc);
    }
}

pub(crate) struct Shared<T: Transport + 'static, C: 'static> {
    pub(crate) core: RefCell<Core<T, C>>,
    /// Futures dropped while the core was borrowed (inside a handler):
    /// their slots are given up at the next iteration.
    orphans: RefCell<Vec<(u32, u32)>>,
}

impl<T: Transport + 'static, C: 'static> Shared<T, C> {
    fn core(&self) -> std::cell::RefMut<'_, Core<T, C>> {
        self.core.try_borrow_mut().unwrap_or_else(|_| {
            panic!(
                "erpc-typed: the endpoint was used from inside one of its own handlers or \
                 continuations (a Call polled, or Client::with called, there); inside them use \
                 the Ctx they are given"
            )
        })
    }
}

/// Settings of an [`Endpoint`].
#[derive(Debug, Clone, Copy)]
pub struct EndpointConfig {
    /// The Rpc's settings.
    pub rpc: RpcConfig,
    /// Calls in flight per session at most (default 8, the session's
    /// slots: nothing waits in the core's backlog); the layer queues the
    /// rest in order and starts them as calls finish.
    pub max_in_flight: usize,
    /// The timeout of calls that set none (default none: a call waits
    /// until its response or an error of its session).
    pub default_timeout: Option<Duration>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            rpc: RpcConfig::default(),
            max_in_flight: erpc::SESSION_REQ_WINDOW,
            default_timeout: None,
        }
    }
}

/// An Rpc with typed services and calls: the Rpc itself (its context is
/// the typed [`Layer`], which holds the application's `C`), and a
/// single-threaded executor that its event loop drives. One per thread,
/// like the Rpc; `!Send`.
///
/// Drive it with [`Endpoint::run_once`] (an event-loop iteration, then
/// every task that is ready), [`Endpoint::run_until`], or
/// [`Endpoint::block_on`].
pub struct Endpoint<T: Transport + 'static, C: 'static> {
    // Dropped first: tasks may hold calls, which give their slots back.
    exec: Executor,
    shared: Rc<Shared<T, C>>,
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Endpoint<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.shared.core.try_borrow() {
            Ok(c) => f
                .debug_struct("Endpoint")
                .field("rpc", &c.rpc)
                .field("layer", &c.layer)
                .finish(),
            Err(_) => f.write_str("Endpoint { (in use) }"),
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<T: Transport + 'static, C: 'static> Endpoint<T, C> {
    /// Creates the Rpc `rpc_id` of `nexus` over `transport` and `alloc`
    /// (as [`Rpc::builder`]), serving `service` (whose request types must have
    /// been [registered](Service::register) on the Nexus), with `app` as
    /// the application's context.
    pub fn new(
        nexus: &Arc<Nexus>,
        rpc_id: u8,
        transport: T,
        alloc: mempool::Allocator,
        config: EndpointConfig,
        service: &Service<T, C>,
        app: C,
    ) -> Result<Self, CreateError> {
        let rpc = Rpc::builder(nexus, transport, alloc)
            .id(rpc_id)
            .config(config.rpc)
            .session_handler(crate::layer::on_session::<T, C>)
            .build()?;
        let exec = Executor::default();
        let spawner = exec.spawner();
        let table = Rc::new(service.table());
        let shared = Rc::new_cyclic(|me| Shared {
            core: RefCell::new(Core {
                rpc,
                layer: Layer::new(
                    app,
                    table,
                    config.max_in_flight,
                    config.default_timeout.map(ns),
                    me.clone(),
                    spawner,
                ),
            }),
            orphans: RefCell::new(Vec::new()),
        });
        Ok(Endpoint { exec, shared })
    }

    /// A handle for making calls from tasks (cheap to clone; `!Send`).
    pub fn client(&self) -> Client<T, C> {
        Client {
            shared: self.shared.clone(),
        }
    }

    /// Runs `fut` as a task of this endpoint's executor (polled by
    /// [`Endpoint::run_once`]).
    pub fn spawn<F: Future<Output = ()> + 'static>(&self, fut: F) {
        self.exec.spawner().spawn(fut);
    }

    /// Tasks spawned and not finished.
    pub fn tasks(&self) -> usize {
        self.exec.len()
    }

    /// One event-loop iteration of the Rpc (RX, handlers, continuations,
    /// TX; calls whose timeout passed fail), then every task that is
    /// ready, until none is.
    pub fn run_once(&mut self) {
        {
            let mut core = self.shared.core();
            let Core { rpc, layer } = &mut *core;
            if !self.shared.orphans.borrow().is_empty() {
                let orphans = std::mem::take(&mut *self.shared.orphans.borrow_mut());
                for (id, era) in orphans {
                    layer.abandon(rpc, id, era);
                }
            }
            rpc.run_event_loop_once(layer);
            if layer.has_timers() {
                layer.fire_timers(rpc);
            }
        }
        if !self.exec.idle() {
            self.exec.run_until_stalled();
        }
    }

    /// Runs the endpoint until `done()` says so, calling `between` after
    /// each iteration (on the simulated network: advance its clock, run
    /// the other endpoints).
    pub fn run_until(&mut self, mut done: impl FnMut() -> bool, mut between: impl FnMut()) {
        while !done() {
            self.run_once();
            between();
        }
    }

    /// Runs the endpoint until `fut` completes, and returns its output.
    /// `fut` is polled only when woken (a call it awaits finished), the
    /// endpoint's tasks as they become ready.
    pub fn block_on<F: Future>(&mut self, fut: F) -> F::Output {
        self.block_on_with(fut, || {})
    }

    /// [`Endpoint::block_on`], calling `between` after each iteration (on
    /// the simulated network: advance its clock, run the other
    /// endpoints).
    pub fn block_on_with<F: Future>(&mut self, fut: F, mut between: impl FnMut()) -> F::Output {
        let flag = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(fut);
        loop {
            if flag.0.swap(false, Ordering::AcqRel)
                && let Poll::Ready(v) = fut.as_mut().poll(&mut cx)
            {
                return v;
            }
            self.run_once();
            between();
        }
    }

    /// Runs `f` with the endpoint's context (closure calls, replies,
    /// sessions, the raw Rpc).
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Ctx<'_, T, C>) -> R) -> R {
        self.client().with(f)
    }

    /// The application's context.
    pub fn app(&self) -> std::cell::RefMut<'_, C> {
        std::cell::RefMut::map(self.shared.core(), |c| &mut c.layer.app)
    }

    /// The Rpc's counters.
    pub fn rpc_stats(&self) -> RpcStats {
        self.shared.core().rpc.stats().clone()
    }

    /// The typed layer's counters.
    pub fn stats(&self) -> LayerStats {
        self.shared.core().layer.stats
    }

    /// Calls not finished: in the core, or queued in the layer.
    pub fn pending_calls(&self) -> usize {
        self.shared.core().layer.pending()
    }
}

/// A waker that sets a flag.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// What handlers and closure continuations get: the Rpc, the typed layer,
/// and through `Deref` the application's context `C`.
pub struct Ctx<'a, T: Transport + 'static, C: 'static> {
    pub(crate) rpc: &'a mut TRpc<T, C>,
    pub(crate) layer: &'a mut Layer<T, C>,
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Ctx<'_, T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("rpc", &self.rpc)
            .finish_non_exhaustive()
    }
}

impl<T: Transport + 'static, C: 'static> std::ops::Deref for Ctx<'_, T, C> {
    type Target = C;
    fn deref(&self) -> &C {
        &self.layer.app
    }
}

impl<T: Transport + 'static, C: 'static> std::ops::DerefMut for Ctx<'_, T, C> {
    fn deref_mut(&mut self) -> &mut C {
        &mut self.layer.app
    }
}

impl<T: Transport + 'static, C: 'static> Ctx<'_, T, C> {
    /// The application's context.
    pub fn app(&mut self) -> &mut C {
        &mut self.layer.app
    }

    /// The Rpc underneath, for the raw API (its context type is the
    /// layer: raw calls made here need continuations of that type).
    pub fn rpc(&mut self) -> &mut Rpc<T, Layer<T, C>> {
        self.rpc
    }

    /// Calls `M` on `session`; `then` runs in the event loop with the
    /// response or the error. `Err` here (encoding, memory, a session the
    /// core refuses) means the call never started and `then` never runs.
    /// A closure that captures nothing costs no allocation; one that
    /// captures is boxed.
    pub fn call_then<M, F>(&mut self, session: SessionNum, req: M, then: F) -> Result<(), CallError>
    where
        M: Method,
        F: FnOnce(&mut Ctx<'_, T, C>, Result<M::Resp, CallError>) + 'static,
    {
        self.call_then_within(session, req, None, then)
    }

    /// [`Ctx::call_then`] with a timeout (`None`: the endpoint's default).
    /// When it passes first, `then` gets [`CallError::TimedOut`] and the
    /// response, if one comes, is discarded.
    pub fn call_then_within<M, F>(
        &mut self,
        session: SessionNum,
        req: M,
        timeout: Option<Duration>,
        then: F,
    ) -> Result<(), CallError>
    where
        M: Method,
        F: FnOnce(&mut Ctx<'_, T, C>, Result<M::Resp, CallError>) + 'static,
    {
        let done: crate::layer::Done<T, C> = Box::new(move |ctx, r| {
            let r = r.and_then(|body| crate::codec::decode(body).map_err(CallError::Decode));
            then(ctx, r)
        });
        self.layer
            .start(
                self.rpc,
                session,
                &req,
                Deliver::Closure(done),
                timeout.map(ns),
            )
            .map(|_| ())
    }

    /// Answers a deferred request (see [`Service::handle_deferred`]).
    pub fn reply<M: Method>(&mut self, r: Reply<M>, resp: &M::Resp) -> Result<(), RespondError> {
        send_reply(self.rpc, self.layer, r, resp)
    }

    /// Starts connecting a session (as [`Rpc::create_session`]); calls on
    /// it may start at once and wait for it.
    pub fn create_session(&mut self, uri: &str, rpc_id: u8) -> Result<SessionNum, SessionError> {
        self.rpc.create_session(uri, rpc_id)
    }

    /// Runs `fut` as a task of the endpoint's executor (first polled
    /// after the current event-loop iteration).
    pub fn spawn<F: Future<Output = ()> + 'static>(&self, fut: F) {
        self.layer.spawner.spawn(fut);
    }

    /// A [`Client`] of this endpoint, for tasks spawned from here.
    pub fn client(&self) -> Client<T, C> {
        Client {
            shared: self
                .layer
                .me
                .upgrade()
                .expect("the endpoint outlives its handlers"),
        }
    }

    /// The typed layer's counters.
    pub fn stats(&self) -> LayerStats {
        self.layer.stats
    }
}

/// A handle on an [`Endpoint`] for tasks: makes calls that are futures.
/// Cheap to clone; `!Send` (it belongs to the endpoint's thread).
pub struct Client<T: Transport + 'static, C: 'static> {
    shared: Rc<Shared<T, C>>,
}

impl<T: Transport + 'static, C: 'static> Clone for Client<T, C> {
    fn clone(&self) -> Self {
        Client {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Client<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl<T: Transport + 'static, C: 'static> Client<T, C> {
    /// Calls `M` on `session`: a future of the response. Nothing is sent
    /// until it is first polled (awaited, or joined: a `join_all` of many
    /// calls starts them all in its first poll, so they pipeline, up to
    /// the session's window and queued beyond it). Dropping it is safe at
    /// any point: before it started, the request is never sent; while
    /// queued, it is never sent; in flight, the request runs at the server
    /// at most once and its response is discarded.
    pub fn call<M: Method>(&self, session: SessionNum, req: M) -> Call<T, C, M> {
        Call {
            shared: self.shared.clone(),
            state: CallState::Init { session, req },
            timeout: None,
        }
    }

    /// Starts connecting a session to Rpc `rpc_id` of the Nexus at `uri`;
    /// the future ends when it connects, or with the error that ended it.
    /// (Calls need not wait for it: they wait for the session themselves.)
    pub fn connect(&self, uri: &str, rpc_id: u8) -> Connect<T, C> {
        let r = self.with(|ctx| ctx.create_session(uri, rpc_id));
        Connect {
            shared: self.shared.clone(),
            state: Some(r),
            registered: false,
        }
    }

    /// Answers a deferred request from a task.
    pub fn reply<M: Method>(&self, r: Reply<M>, resp: &M::Resp) -> Result<(), RespondError> {
        self.with(|ctx| ctx.reply(r, resp))
    }

    /// Runs `f` with the endpoint's context. Not from inside the
    /// endpoint's own handlers (they have a [`Ctx`] already).
    pub fn with<R>(&self, f: impl FnOnce(&mut Ctx<'_, T, C>) -> R) -> R {
        let mut core = self.shared.core();
        let Core { rpc, layer } = &mut *core;
        f(&mut Ctx { rpc, layer })
    }
}

enum CallState<M> {
    Init { session: SessionNum, req: M },
    Started { id: u32, era: u32 },
    Done,
}

/// A call in progress ([`Client::call`]): resolves to the response or a
/// [`CallError`].
#[must_use = "a call does nothing until it is awaited"]
pub struct Call<T: Transport + 'static, C: 'static, M: Method> {
    shared: Rc<Shared<T, C>>,
    state: CallState<M>,
    timeout: Option<Duration>,
}

// The request is never pinned: it is moved out to be encoded.
impl<T: Transport + 'static, C: 'static, M: Method> Unpin for Call<T, C, M> {}

impl<T: Transport + 'static, C: 'static, M: Method> std::fmt::Debug for Call<T, C, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = match &self.state {
            CallState::Init { session, .. } => format!("not started, session {session}"),
            CallState::Started { id, .. } => format!("started, slot {id}"),
            CallState::Done => "done".into(),
        };
        write!(f, "Call<{}>({st})", std::any::type_name::<M>())
    }
}

impl<T: Transport + 'static, C: 'static, M: Method> Call<T, C, M> {
    /// Fails the call with [`CallError::TimedOut`] if it has not finished
    /// `d` after it starts (on the Rpc's clock: virtual time in
    /// simulation).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}

impl<T: Transport + 'static, C: 'static, M: Method> Future for Call<T, C, M> {
    type Output = Result<M::Resp, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut core = this.shared.core();
        let Core { rpc, layer } = &mut *core;
        match std::mem::replace(&mut this.state, CallState::Done) {
            CallState::Init { session, req } => {
                let deliver = Deliver::Future {
                    waker: Some(cx.waker().clone()),
                    result: None,
                };
                match layer.start(rpc, session, &req, deliver, this.timeout.map(ns)) {
                    Ok((id, era)) => {
                        this.state = CallState::Started { id, era };
                        Poll::Pending
                    }
                    Err(e) => Poll::Ready(Err(e)),
                }
            }
            CallState::Started { id, era } => {
                let slot = &mut layer.calls[id as usize];
                debug_assert_eq!(slot.era, era);
                match &mut slot.deliver {
                    Deliver::Future {
                        result: r @ Some(_),
                        ..
                    } => {
                        let r = r.take().expect("matched Some");
                        slot.deliver = Deliver::Gone;
                        layer.maybe_free(id);
                        Poll::Ready(match r {
                            Ok(m) => {
                                let v = decode_resp::<M::Resp>(m.data());
                                layer.recycle(rpc, m);
                                v
                            }
                            Err(e) => Err(e),
                        })
                    }
                    Deliver::Future { waker, .. } => {
                        match waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            w => *w = Some(cx.waker().clone()),
                        }
                        this.state = CallState::Started { id, era };
                        Poll::Pending
                    }
                    _ => unreachable!("a started call's slot is its future's"),
                }
            }
            CallState::Done => panic!("a Call polled after it completed"),
        }
    }
}

impl<T: Transport + 'static, C: 'static, M: Method> Drop for Call<T, C, M> {
    fn drop(&mut self) {
        if let CallState::Started { id, era } = self.state {
            match self.shared.core.try_borrow_mut() {
                Ok(mut core) => {
                    let Core { rpc, layer } = &mut *core;
                    layer.abandon(rpc, id, era);
                }
                // Dropped inside a handler: given up at the next iteration.
                Err(_) => self.shared.orphans.borrow_mut().push((id, era)),
            }
        }
    }
}

/// A session being connected ([`Client::connect`]).
#[must_use = "a connect future does nothing useful until it is awaited"]
pub struct Connect<T: Transport + 'static, C: 'static> {
    shared: Rc<Shared<T, C>>,
    state: Option<Result<SessionNum, SessionError>>,
    registered: bool,
}

impl<T: Transport + 'static, C: 'static> std::fmt::Debug for Connect<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connect({:?})", self.state)
    }
}

/// Why [`Client::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The session could not be created (a malformed URI, no free RX ring
    /// room, ...).
    #[error(transparent)]
    Create(#[from] SessionError),
    /// The session ended before it connected (connect failed or timed
    /// out, the host name does not resolve, ...).
    #[error(transparent)]
    Failed(CallError),
}

impl<T: Transport + 'static, C: 'static> Future for Connect<T, C> {
    type Output = Result<SessionNum, ConnectError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let sn = match this
            .state
            .take()
            .expect("a Connect polled after it completed")
        {
            Ok(sn) => sn,
            Err(e) => return Poll::Ready(Err(ConnectError::Create(e))),
        };
        let mut core = this.shared.core();
        let Core { rpc, layer } = &mut *core;
        if !this.registered {
            this.registered = true;
            if rpc.is_connected(sn) {
                return Poll::Ready(Ok(sn));
            }
            layer.conns.push(ConnWait {
                session: sn,
                waker: Some(cx.waker().clone()),
                result: None,
            });
            this.state = Some(Ok(sn));
            return Poll::Pending;
        }
        let i = layer
            .conns
            .iter()
            .position(|w| w.session == sn)
            .expect("registered");
        match layer.conns[i].result.take() {
            Some(r) => {
                layer.conns.swap_remove(i);
                Poll::Ready(r.map_err(ConnectError::Failed))
            }
            None => {
                layer.conns[i].waker = Some(cx.waker().clone());
                this.state = Some(Ok(sn));
                Poll::Pending
            }
        }
    }
}

impl<T: Transport + 'static, C: 'static> Drop for Connect<T, C> {
    fn drop(&mut self) {
        if self.registered
            && let Some(Ok(sn)) = self.state
            && let Ok(mut core) = self.shared.core.try_borrow_mut()
        {
            core.layer.conns.retain(|w| w.session != sn);
        }
    }
}
