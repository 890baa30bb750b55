//! The eRPC paper's case studies on this stack, as programs users can copy:
//!
//! * [`raftkv`]: a replicated key-value store, Raft state-machine
//!   replication with tikv's `raft` crate (unmodified) whose messages,
//!   snapshots and client requests travel over eRPC; leader failover with
//!   client retries and at-most-once PUTs; a simulated cluster harness.
//! * [`orderedkv`]: an ordered key-value store on a concurrent skip list
//!   (`crossbeam-skiplist`): GET and PUT in the dispatch thread, 128-key
//!   SCANs on background workers.
//! * [`dispatch`]: the worker-dispatch benchmark (round robin against
//!   single-queue JBSQ against an ideal M/G/N queue simulated from the
//!   same service times).
//! * [`lincheck`]: a linearizability checker for key-value histories.
//!
//! Each runs on the device model by default, on eRPC's simulated network
//! in tests, and on kernel UDP across processes. Binaries: `raft-kv`,
//! `ordered-kv`, `dispatch-bench`.

pub mod dispatch;
pub mod env;
pub mod lincheck;
pub mod orderedkv;
pub mod raftkv;
pub mod stats;
