//! The eRPC paper's case studies on this stack, as programs users can copy:
//!
//! * [`raftkv`]: a replicated key-value store, Raft state-machine
//!   replication with tikv's `raft` crate (unmodified) whose messages,
//!   snapshots and client requests travel over eRPC; leader failover with
//!   client retries and at-most-once PUTs; a simulated cluster harness.
//! * [`orderedkv`]: an ordered key-value store on a concurrent skip list
//!   (`crossbeam-skiplist`): GET and PUT in the dispatch thread, 128-key
//!   SCANs on background workers; [`orderedkv_typed`] is the same store
//!   on the typed API (`erpc-typed`: serde requests, closures, async
//!   tasks), benchmarked beside it by `ordered-kv`.
//! * [`dispatch`]: the worker-dispatch benchmark (round robin against
//!   single-queue JBSQ against an ideal M/G/N queue simulated from the
//!   same service times).
//! * [`lincheck`]: a linearizability checker for key-value histories.
//! * [`herd`]: a HERD-style key-value store (the RDMA design guidelines'
//!   system): a bucketised hash table partitioned over the server's Rpcs,
//!   per-request handlers or burst handlers that prefetch every bucket of
//!   an RX burst before reading any; every answer checked against a model.
//! * [`sequencer`]: a networked sequencer, one atomic add per request or
//!   one per burst; every number audited (handed out exactly once).
//! * [`threads`]: one Rpc per thread on the device model or kernel UDP,
//!   for `herd-kv` and `sequencer`.
//!
//! Each runs on the device model by default, on eRPC's simulated network
//! in tests, and on kernel UDP across processes. Binaries: `raft-kv`,
//! `ordered-kv`, `dispatch-bench`, `herd-kv`, `sequencer`.

pub mod cli;
pub mod dispatch;
pub mod env;
pub mod herd;
pub mod lincheck;
pub mod orderedkv;
pub mod orderedkv_typed;
pub mod raftkv;
pub mod sequencer;
pub mod stats;
pub mod threads;

/// Installs the `tracing` subscriber every binary of this crate uses:
/// events on stderr, filtered by `RUST_LOG` (default: warnings and
/// errors), coloured only on a terminal (no escape codes in a log file).
/// erpc-tools' binaries use its `init_tracing`, the same.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// A request and a response buffer of `req` and `resp` bytes, or `None`
/// (with neither kept: a buffer allocated before the other failed is
/// freed, not leaked).
pub fn alloc_pair<T: transport::Transport, C>(
    rpc: &mut erpc::Rpc<T, C>,
    req: usize,
    resp: usize,
) -> Option<(erpc::MsgBuf, erpc::MsgBuf)> {
    match (rpc.alloc_msg_buffer(req), rpc.alloc_msg_buffer(resp)) {
        (Ok(q), Ok(r)) => Some((q, r)),
        (q, r) => {
            tracing::warn!(
                req_bytes = req,
                resp_bytes = resp,
                req = ?q.as_ref().err(),
                resp = ?r.as_ref().err(),
                "no message buffers"
            );
            q.into_iter().chain(r).for_each(|m| rpc.free_msg_buffer(m));
            None
        }
    }
}
