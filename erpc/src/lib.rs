//! eRPC ("Datacenter RPCs can be General and Fast", Kalia, Kaminsky and
//! Andersen, NSDI 2019) in Rust, wire-compatible with the C++ eRPC.
//!
//! # Typed services and async calls
//!
//! Start here: the companion crate `erpc-typed` (`erpc/typed/`) gives each
//! request type a serde request and response type, servers closures
//! (`fn(&mut Ctx, Req) -> Resp`, deferred, or on worker threads), and
//! clients closure continuations or futures, with a window of calls per
//! session, per-call timeouts and every error typed. An Rpc is `!Send` and
//! hands its handlers `&mut` state from its event loop, so an
//! `erpc_typed::Endpoint` is an Rpc whose context is the typed layer, and
//! whose event loop also drives a single-threaded executor for its tasks
//! (its crate documentation explains the design). On 32-byte RPCs on the
//! device model it adds about 730 instructions per RPC (typed closure
//! calls) or 970 (futures) to the raw API's 7 200, and 85–115 ns or
//! 170–200 ns of CPU time to its 0.63 µs: 0.84–0.88 and 0.75–0.79 of the
//! raw rate by CPU time (BENCHMARKS.md, "Typed and async calls").
//!
//! ```
//! use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
//! use erpc::Nexus;
//! use erpc_typed::{Endpoint, EndpointConfig, Method, Service};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Hello(String);
//! impl Method for Hello {
//!     const REQ_TYPE: u8 = 1;
//!     type Resp = String;
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let net = SimNet::new(SimConfig::default()); // one thread, virtual time
//! let svc = Service::<SimTransport, ()>::new().handle(|_ctx, h: Hello| format!("hello, {}!", h.0));
//! let nexus = |uri: &str| {
//!     svc.register(Nexus::builder(uri)).sm_link(net.sm_link()).clock(net.erpc_clock()).build()
//! };
//! let (sn, cn) = (nexus("server:31850")?, nexus("client:31850")?);
//! let ep = |n| {
//!     let (t, a) = (net.add_transport(), test_allocator(2 << 20));
//!     Endpoint::new(n, 0, t, a, EndpointConfig::default(), &svc, ())
//! };
//! let (mut server, mut client) = (ep(&sn)?, ep(&cn)?);
//! let api = client.client();
//! let reply = client.block_on_with(
//!     async move {
//!         let session = api.connect("server:31850", 0).await?;
//!         Ok::<_, Box<dyn std::error::Error>>(api.call(session, Hello("eRPC".into())).await?)
//!     },
//!     || { server.run_once(); net.advance(1_000) },
//! )?;
//! assert_eq!(reply, "hello, eRPC!");
//! # Ok(())
//! # }
//! ```
//!
//! # The raw API: the fast path underneath
//!
//! The rest of this crate is eRPC itself, and its API is the paper's:
//! `fn`-pointer handlers and continuations, a `usize` tag per request,
//! message buffers that move in and come back. It allocates nothing per
//! request; the typed layer is built on it, and a program can use both
//! (`erpc_typed::Ctx::rpc` reaches the Rpc underneath).
//!
//! # Shape
//!
//! * [`Nexus`] — one per process: URI (host + SM UDP port), the
//!   request-handler table (dispatch, burst and background handlers,
//!   registered on a [`NexusBuilder`] before any Rpc exists), worker threads for background handlers, and the
//!   session-management link ([`sm::SmLink`]: kernel UDP in production, an
//!   in-memory hub on the virtual clock in simulation).
//! * [`Rpc<T, C>`] — one per thread, made with [`Rpc::builder`] (an
//!   [`RpcBuilder`]), generic over the transport `T`
//!   (static dispatch) and the application context `C`. It owns its
//!   transport, its hugepage allocator, its sessions and queues; it is
//!   `!Send`. [`Rpc::run_event_loop_once`] takes `&mut C` and runs
//!   handlers and continuations.
//! * [`MsgBuf`] — message buffers in hugepage memory with the paper's
//!   layout: packet 0's header right before the contiguous data, the
//!   headers of later packets after it; up to [`MAX_MSG_BYTES`].
//! * Sessions with 8 slots, 32 credits, backlog beyond 8 requests;
//!   single-packet requests handled in place in the RX ring; multi-packet
//!   requests with explicit credit returns, multi-packet responses pulled
//!   with requests-for-response; at-most-once execution.
//!
//! # Example: a client and a server, raw
//!
//! A server Rpc that echoes requests back and a client Rpc that sends one,
//! each in its own Nexus, on the simulated network (one thread, virtual
//! time). On a NIC only the setup differs: an [`Rpc`] over
//! `transport::mlx5::Mlx5Transport` with an allocator registered with the
//! device, and Nexuses on kernel UDP (see the README and
//! `examples/hello_world.rs`).
//!
//! ```
//! use erpc_sim::{SimConfig, SimNet, SimTransport, sim_allocator};
//! use erpc::{Completion, Nexus, Request, Rpc};
//! use mempool::{Fallback, RegionOptions};
//!
//! const ECHO: u8 = 1;
//!
//! /// Per-Rpc application state, handed `&mut` to handlers and continuations.
//! #[derive(Default)]
//! struct App {
//!     reply: Option<Vec<u8>>,
//! }
//!
//! // Server side: runs in the server's event loop; the request is read in
//! // place and the response goes out from the slot's preallocated buffer.
//! fn echo(rpc: &mut Rpc<SimTransport, App>, _app: &mut App, req: Request<'_>) {
//!     let data = req.data.to_vec();
//!     rpc.respond(req.handle, &data).expect("the request is awaiting a response");
//! }
//!
//! // Client side: both buffers come back with the result.
//! fn done(rpc: &mut Rpc<SimTransport, App>, app: &mut App, c: Completion) {
//!     if c.result.is_ok() {
//!         app.reply = Some(c.resp.data().to_vec());
//!     }
//!     rpc.free_msg_buffer(c.req);
//!     rpc.free_msg_buffer(c.resp);
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let net = SimNet::new(SimConfig::default()); // links, SM hub and clock
//! let nexus = |uri: &str| {
//!     Nexus::builder(uri)
//!         .handler::<SimTransport, App>(ECHO, echo) // handlers before any Rpc
//!         .sm_link(net.sm_link())
//!         .clock(net.erpc_clock())
//!         .build()
//! };
//! let (server_nexus, client_nexus) = (nexus("server:31850")?, nexus("client:31851")?);
//! // Message buffers: 2 MiB hugepages in production; this example also
//! // runs where none are reserved.
//! let memory = RegionOptions { fallback: Fallback::SmallPages, ..Default::default() };
//! let rpc = |nexus| {
//!     let alloc = sim_allocator(2 << 20, memory)?;
//!     // Rpc id 0 within its Nexus, default settings, no session-event
//!     // callback: the builder's defaults (`.id(..)`, `.config(..)`,
//!     // `.session_handler(..)` change them).
//!     Rpc::<SimTransport, App>::builder(nexus, net.add_transport(), alloc)
//!         .build()
//!         .map_err(Box::<dyn std::error::Error>::from)
//! };
//! let (mut server, mut client) = (rpc(&server_nexus)?, rpc(&client_nexus)?);
//!
//! // Connect to Rpc 0 of the server's Nexus and enqueue a request at once:
//! // it waits for the session.
//! let session = client.create_session("server:31850", 0)?;
//! let mut req = client.alloc_msg_buffer(5)?;
//! req.data_mut().copy_from_slice(b"hello");
//! let resp = client.alloc_msg_buffer(64)?;
//! client.enqueue_request(session, ECHO, req, resp, done, 0)?;
//!
//! // Each Rpc runs its own event loop (one per thread in a real program).
//! let (mut server_app, mut client_app) = (App::default(), App::default());
//! while client_app.reply.is_none() {
//!     client.run_event_loop_once(&mut client_app);
//!     server.run_event_loop_once(&mut server_app);
//!     net.advance(1_000); // 1 µs of virtual time
//! #   assert!(net.now_ns() < 1_000_000_000, "no reply in a simulated second");
//! }
//! assert_eq!(client_app.reply.as_deref(), Some(&b"hello"[..]));
//! # Ok(())
//! # }
//! ```
//!
//! # Handlers and continuations: no allocation per request
//!
//! Handlers and continuations are plain `fn` pointers
//! ([`ReqHandler`], [`Continuation`], [`SessionHandler`]) that receive
//! `&mut Rpc<T, C>` and `&mut C`, plus a `usize` tag for continuations.
//! The alternative, a boxed closure per request, would allocate on the hot
//! path and make the slot state own arbitrary captured data; with fn
//! pointers the per-request state is a few words in the slot, the
//! application's state lives in `C` (passed `&mut` from the event loop, so
//! it needs no `RefCell`), and the handler table is `Copy`. Dispatch
//! handlers are registered type-erased in the Nexus and checked against
//! the Rpc's `T` and `C` when the Rpc copies the table. Background
//! handlers run on other threads and so are `Arc<dyn Fn>`: they see only
//! the request bytes and a [`BgResponse`].
//!
//! A *burst handler* ([`BurstHandler`], registered with
//! [`NexusBuilder::burst_handler`]) gets every request of its type from
//! one RX burst at once, a [`Burst`] of up to [`MAX_BURST`] requests read
//! in place in the RX ring, and responds to each ([`Burst::take`], then
//! [`Rpc::respond`] or [`Rpc::enqueue_response`], now or deferred): the
//! RDMA design guidelines' batching (prefetch every hash bucket of a burst
//! before reading any; add N to a counter once). At-most-once, loss
//! recovery and session resets are as for a dispatch handler; multi-packet
//! requests of a burst type still arrive one by one (bursts of one); a
//! request not taken fails with [`ServerError::Declined`]. Request types
//! without one pay one more arm of the handler match and one test per RX
//! burst.
//!
//! Ownership follows the data: a request msgbuf moves into
//! [`Rpc::enqueue_request`] and comes back, with the response msgbuf, in
//! the [`Completion`]; a server's request data is valid until
//! [`Rpc::enqueue_response`]; the Rpc keeps a response until the client's
//! next request on the slot shows it arrived. Completions carry a
//! `Result` so that loss recovery and failure detection can complete
//! requests with errors.
//!
//! # Inspection
//!
//! [`NexusBuilder::inspect`] (or `ERPC_INSPECT=1`) exposes the Nexus and
//! its Rpcs on the process's debug endpoint, which `erpc-inspect` attaches
//! to; see [`inspect`].
//!
//! # Time
//!
//! Everything takes nanoseconds from a [`Clock`]: the calibrated TSC in
//! production, a [`VirtualClock`] in simulation.
//!
//! # Simulation
//!
//! The companion crate `erpc-sim` (`erpc/sim/`), a dev-dependency, not
//! part of this crate: `erpc_sim::SimNet` is a seeded,
//! single-threaded network of `erpc_sim::SimTransport`s with per-link loss,
//! duplication, reordering, corruption and delay, and an in-memory SM hub;
//! a whole multi-Rpc scenario runs in one thread and a seed replays
//! exactly.
//!
//! # Tests
//!
//! * `tests/sim.rs`: deterministic scenarios generic over a `World` (the
//!   transport plus how time moves); a failure prints its seed and a replay
//!   command such as
//!   `ERPC_SEED=81 cargo test -p erpc --test sim -- duplicated_packets_run_handlers_at_most_once --exact`.
//! * `tests/udp.rs`: real threads, UDP SM threads and worker threads over
//!   kernel UDP; `tests/netns.rs`: two processes in two network namespaces
//!   (root; runs in CI).
//! * `tests/cpp_wire.rs`: the C++ eRPC's byte forms both ways (a C++
//!   client and a C++ server played by the test); `tests/hardening.rs`:
//!   request numbers across the 44-bit wrap, late and forged SM packets,
//!   transport types and credits between peers.
//! * `tests/burst.rs`: burst handlers mixed with ordinary requests, under
//!   loss and duplication, across sessions and clients, deferring,
//!   declining, with multi-packet requests and session resets.
//! * `tests/workers.rs`: background handlers that panic, responses the
//!   server has no memory for, and an Rpc dropped while its handler runs,
//!   with handlers inline, on stepped workers and on worker threads.
//! * `tests/alloc_free.rs`: a counting global allocator proves the request
//!   path allocates nothing after warm-up.
//! * `tests/fuzz.rs` (and `erpc/fuzz/` for cargo-fuzz): hostile data and SM
//!   packets through `erpc_sim::fuzz::run`.
//!
//! # Crate layout
//!
//! Everything an application uses is at the crate root. Three public
//! modules serve other kinds of user: [`inspect`] (the debug endpoint's
//! JSON views, read by `erpc-inspect`), [`sm`] (session-management links,
//! to carry SM packets some other way than kernel UDP) and [`wire`] (the
//! packet formats, for dissectors and interoperability tests). The cargo
//! feature `testing` adds hooks for tests and the simulator (fault
//! injection, invariant probes, stepped worker pools); it is off in
//! production builds.
//!
//! # Unsafe code
//!
//! The crate denies `unsafe_code` except in three named modules: the TSC
//! read (`clock::tsc`), the TX batch (`rpc::tx`), whose entries are the
//! transport's items resolved when a packet is queued, kept valid by the
//! batch invariant documented there, and the single-producer
//! single-consumer ring that carries jobs to worker threads and back
//! (`nexus::spsc`). (The simulated NIC's RX ring, read in place like DMA
//! memory, is `erpc-sim`'s.)

#![deny(unsafe_code)]
#![warn(unnameable_types)]
#![deny(missing_docs, unreachable_pub)]

mod cc;
mod clock;
mod consts;
// Before `inspect`: rustdoc lists `Rpc`'s methods in module order, and
// the debug endpoint's view of an Rpc belongs after its API.
mod rpc;

pub mod inspect;
mod memory;
mod msgbuf;
mod nexus;
mod pkthdr;
mod rng;
mod session;
pub mod sm;
mod sm_types;
mod stats;
pub mod wire;

pub use cc::{CcConfig, Controller, SwiftParams, TimelyParams, WheelConfig, WheelStats};
pub use clock::{Clock, TscClock, VirtualClock};
pub use consts::{
    FAILURE_TIMEOUT_MS, MAX_BURST, MAX_MSG_BYTES, MAX_RPC_ID, MIN_SESSION_CREDITS,
    RX_RING_ENTRIES_DEFAULT, SESSION_CREDITS, SESSION_REQ_WINDOW, STALL_TIMEOUT_MS,
    rx_ring_entries_for,
};
pub use memory::host_allocator;
#[cfg(any(test, feature = "testing"))]
pub use memory::{test_allocator, test_allocator_with};
pub use msgbuf::{MsgBuf, MsgBufError, msgbuf_bytes};
#[cfg(feature = "testing")]
pub use nexus::SteppedJob;
pub use nexus::{
    BgHandler, BgResponse, LivenessStats, Nexus, NexusBuilder, NexusError, PeerLiveness, Uri,
    WorkerDispatch, WorkerIdle, WorkerStats,
};
#[cfg(feature = "testing")]
pub use rpc::ActivePools;
pub use rpc::{
    Burst, BurstHandler, Completion, Continuation, CreateError, EnqueueError, EnqueueErrorKind,
    ReqHandle, ReqHandler, Request, RespondError, Rpc, RpcBuilder, RpcConfig, RpcError,
    ServerError, SessionEnd, SessionError, SessionEvent, SessionEventKind, SessionHandler,
    SessionInfo, SessionNum, SlotInfo,
};
pub use session::SessionState;
pub use sm_types::{SmErr, TransportType};
pub use stats::{DropCounts, DropReason, RpcStats};
