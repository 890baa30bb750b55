//! eRPC ("Datacenter RPCs can be General and Fast", Kalia, Kaminsky and
//! Andersen, NSDI 2019) in Rust, wire-compatible with the C++ eRPC.
//!
//! # Shape
//!
//! * [`Nexus`] — one per process: URI (host + SM UDP port), the
//!   request-handler table (registered on a [`NexusBuilder`] before any
//!   Rpc exists), worker threads for background handlers, and the
//!   session-management link ([`SmLink`]: kernel UDP in production, an
//!   in-memory hub on the virtual clock in simulation).
//! * [`Rpc<T, C>`] — one per thread, generic over the transport `T`
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
//! Ownership follows the data: a request msgbuf moves into
//! [`Rpc::enqueue_request`] and comes back, with the response msgbuf, in
//! the [`Completion`]; a server's request data is valid until
//! [`Rpc::enqueue_response`]; the Rpc keeps a response until the client's
//! next request on the slot shows it arrived. Completions carry a
//! `Result` so that loss recovery and failure detection can complete
//! requests with errors.
//!
//! # Time
//!
//! Everything takes nanoseconds from a [`Clock`]: the calibrated TSC in
//! production, a [`clock::VirtualClock`] in simulation.
//!
//! # Simulation
//!
//! With the `sim` feature (on by default), [`sim::SimNet`] is a seeded,
//! single-threaded network of [`sim::SimTransport`]s with per-link loss,
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
//! * `tests/alloc_free.rs`: a counting global allocator proves the request
//!   path allocates nothing after warm-up.
//! * `tests/fuzz.rs` (and `erpc/fuzz/` for cargo-fuzz): hostile data and SM
//!   packets through [`sim::fuzz::run`].
//!
//! # Unsafe code
//!
//! The crate denies `unsafe_code` except in two named modules: the TSC
//! read (`clock::tsc`) and the simulated NIC's RX ring (`sim::ring`),
//! whose slots are read in place like DMA memory.

#![deny(unsafe_code)]

pub mod clock;
pub mod consts;
pub mod msgbuf;
pub mod nexus;
pub mod pkthdr;
pub mod rng;
mod rpc;
mod session;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sm_types;
pub mod stats;

pub use clock::{Clock, VirtualClock};
pub use consts::{MAX_MSG_BYTES, SESSION_CREDITS, SESSION_REQ_WINDOW};
pub use msgbuf::{MsgBuf, MsgBufError};
pub use nexus::{BgHandler, BgResponse, Nexus, NexusBuilder, NexusError, SmLink, Uri};
pub use rpc::{
    Completion, Continuation, CreateError, EnqueueError, EnqueueErrorKind, ReqHandle, ReqHandler,
    Request, RespondError, Rpc, RpcConfig, RpcError, SessionError, SessionEvent, SessionEventKind,
    SessionHandler, SessionInfo, SessionNum,
};
pub use session::SessionState;
pub use sm_types::{SmErr, TransportType};
pub use stats::{DropReason, RpcStats};
