//! Typed services and `async` calls on eRPC.
//!
//! A [`Method`] names a request type, its response type and its eRPC
//! request type number; both are serde types, sent in postcard's compact
//! form ([`codec`]). A server answers methods with closures
//! ([`Service`]); a client calls them with a closure continuation
//! ([`Ctx::call_then`]) or as a future ([`Client::call`]), on an
//! [`Endpoint`]: an eRPC `Rpc` whose event loop also drives a
//! single-threaded executor.
//!
//! ```
//! use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
//! use erpc::Nexus;
//! use erpc_typed::{Endpoint, EndpointConfig, Method, Service};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Put { key: u64, value: String }
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct PutReply { replaced: bool }
//! impl Method for Put {
//!     const REQ_TYPE: u8 = 1;
//!     type Resp = PutReply;
//! }
//!
//! /// The server's state, `&mut` in every handler (through `Ctx`).
//! #[derive(Default)]
//! struct Store(std::collections::BTreeMap<u64, String>);
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let net = SimNet::new(SimConfig::default()); // virtual time, one thread
//! let service = Service::<SimTransport, Store>::new()
//!     .handle(|ctx, put: Put| PutReply { replaced: ctx.0.insert(put.key, put.value).is_some() });
//! let nexus = |uri: &str, svc: &Service<SimTransport, Store>| {
//!     svc.register(Nexus::builder(uri)).sm_link(net.sm_link()).clock(net.erpc_clock()).build()
//! };
//! let (sn, cn) = (nexus("server:31850", &service)?, nexus("client:31850", &Service::new())?);
//! let endpoint = |nexus, svc: &Service<SimTransport, Store>| {
//!     let (t, a) = (net.add_transport(), test_allocator(2 << 20));
//!     Endpoint::new(nexus, 0, t, a, EndpointConfig::default(), svc, Store::default())
//! };
//! let mut server = endpoint(&sn, &service)?;
//! let mut client = endpoint(&cn, &Service::new())?;
//!
//! let api = client.client();
//! let reply = client.block_on_with(
//!     async move {
//!         let s = api.connect("server:31850", 0).await?;
//!         api.call(s, Put { key: 1, value: "one".into() }).await?;
//!         Ok::<_, Box<dyn std::error::Error>>(api.call(s, Put { key: 1, value: "uno".into() }).await?)
//!     },
//!     || { server.run_once(); net.advance(1_000) }, // the server, and 1 µs of virtual time
//! )?;
//! assert_eq!(reply, PutReply { replaced: true });
//! assert_eq!(server.app().0[&1], "uno");
//! # Ok(())
//! # }
//! ```
//!
//! # How it fits eRPC's model
//!
//! An eRPC `Rpc` is `!Send`, lives on one thread, and hands its handlers
//! and continuations `&mut Rpc` and `&mut C`, the application's context,
//! from its event loop. The layer keeps that shape instead of fighting
//! it:
//!
//! * **The layer is the Rpc's context.** An endpoint's Rpc is an
//!   `Rpc<T, Layer<T, C>>`: the [`Layer`] holds the application's `C`,
//!   the service's handlers and the calls in flight. The core calls one
//!   dispatch `fn` for every typed request type and one continuation for
//!   every typed call (plain `fn` pointers, generic over `T` and `C`, as
//!   the core requires); they decode, run the user's closure with a
//!   [`Ctx`] (`&mut` Rpc and layer, and `C` through `Deref`), and encode.
//!   No lock and no `RefCell` on that path.
//! * **Futures reach the Rpc between iterations.** The Rpc and the layer
//!   sit in one `RefCell` behind an `Rc` that [`Client`]s share. The
//!   event loop borrows it for an iteration; after it, the endpoint polls
//!   its tasks (its own small executor: an idle iteration costs an atomic
//!   swap), and a [`Call`] borrows it for
//!   the moment it takes to encode and start its request, or to take its
//!   response. Nothing else holds it, so it is never contended; a call
//!   polled from inside a handler (where the cell is borrowed) panics
//!   with a message saying to use the handler's `Ctx`. Everything is
//!   `!Send`, as the Rpc is: one endpoint, one thread, one executor.
//! * **A call is a slot.** Each call takes a slot in the layer, whose
//!   index is the core request's tag. A call's request and response
//!   buffers come from a pool of one-packet msgbufs, and its request is
//!   encoded straight into its msgbuf, so a small call allocates nothing
//!   once warm (a closure continuation that captures state is boxed).
//! * **A window per session.** At most
//!   [`EndpointConfig::max_in_flight`] calls per session are in the core
//!   (default 8, the session's slots); the layer queues the rest in order
//!   and starts each as a call finishes. A `join_all` of a hundred calls
//!   starts them all in its first poll: eight go out, ninety-two queue,
//!   and the pipe stays full.
//! * **Dropping and timing out are safe.** eRPC sends a request once
//!   (retransmissions are the same request; the server runs it at most
//!   once) and has no cancel. A call dropped before it was handed to the
//!   core is never sent; one dropped or timed out after that keeps its
//!   slot until the core completes it, and its response is discarded.
//!   [`CallError::TimedOut`] says which case it was. Timeouts run on the
//!   Rpc's clock (virtual time in simulation, so tests replay).
//! * **Errors stay typed.** Every `RpcError` of the core reaches the
//!   caller as [`CallError::Rpc`] (peer failed, session reset, connect
//!   timed out, host not found, the server's status errors); the layer
//!   adds decode, bad-request (the server could not decode the request),
//!   timeout and enqueue errors. When a call fails because its session
//!   ended, the calls queued behind it fail with the same error.
//! * **Panics are the core's.** A background handler that panics fails
//!   its call with `ServerError::HandlerPanicked` and the server lives
//!   on. An event-loop handler that panics unwinds out of the server's
//!   [`Endpoint::run_once`], as a raw dispatch handler's panic leaves
//!   `run_event_loop_once`: that Rpc is done, and its clients' calls fail
//!   with `SessionEnd::PeerFailed` once their failure detection sees the
//!   process gone (`tests/typed_sim.rs` runs both).
//!
//! # The raw API underneath
//!
//! Everything here is built on eRPC's raw API (`erpc::Rpc::
//! enqueue_request`, dispatch handlers, continuations), which stays the
//! zero-allocation fast path; [`Ctx::rpc`] reaches it from a typed
//! handler. This crate is separate from `erpc` so that the core neither
//! links serde's codec nor an executor, and so that nothing it does can
//! touch the core's hot path: it uses only the core's public API. What it
//! costs per RPC, next to the raw API in the same run, is in
//! `BENCHMARKS.md` ("Typed and async calls").

pub mod codec;
mod endpoint;
mod error;
mod exec;
mod layer;
mod service;

pub use endpoint::{Call, Client, Connect, ConnectError, Ctx, Endpoint, EndpointConfig};
pub use error::CallError;
pub use layer::{Layer, LayerStats};
pub use service::{Reply, Service};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Data bytes in one eRPC packet: a message up to this size travels in one
/// packet.
pub const ONE_PACKET: usize = transport::MAX_DATA_PER_PKT;

/// A method: a request type, its response type, and the eRPC request type
/// number that carries it. Implemented on the request type.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Get { key: u64 }
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct GetReply { value: Option<Vec<u8>> }
/// impl erpc_typed::Method for Get {
///     const REQ_TYPE: u8 = 2;
///     type Resp = GetReply;
///     // Values up to 4 KiB: room for the largest response.
///     const MAX_RESP_BYTES: usize = 4 << 10;
/// }
/// ```
pub trait Method: Serialize + DeserializeOwned + 'static {
    /// The eRPC request type (one per method in a Nexus).
    const REQ_TYPE: u8;
    /// The response type.
    type Resp: Serialize + DeserializeOwned + 'static;
    /// The largest encoded response the client makes room for (eRPC
    /// clients give the response buffer with the request; a larger
    /// response fails the call with `RpcError::ResponseTooLarge`).
    /// Default: what fits one packet with the status byte.
    const MAX_RESP_BYTES: usize = ONE_PACKET - 1;
}
