//! The small-RPC benchmark behind `erpc-bench` (the paper's Figure 4 setup
//! scaled to a small machine): every node is both client and server, sends
//! requests of `size` bytes in batches of B with at most `window` in
//! flight, and answers the other node's requests with responses of the
//! same size. Each run also measures a raw echo of eRPC-sized frames over
//! the same transport, so the eRPC rate is reported as a ratio against
//! what the transport itself can do in the same run.
//!
//! Nothing here panics on user input or on a failed setup: every setting
//! is checked by [`Settings::validate`] (each error names the limit), and
//! every failure of a run is a [`BenchError`].

use std::time::Duration;

mod points;
mod progress;
mod raw_echo;
mod settings;
mod testbed;
mod udp;
mod workload;

pub use points::{Knobs, erpc_on, erpc_until};
pub use progress::Progress;
pub use raw_echo::{
    RawEcho, raw_echo, raw_echo_data_bytes, raw_echo_frames_in_flight, raw_echo_on,
};
pub use settings::{BenchError, MAX_NODE_BYTES, MAX_SECS, MAX_WINDOW, Settings, Stop, Which};
pub use testbed::{DeviceModel, Testbed, Vfio};
pub(crate) use udp::loopback_uri;
pub use udp::{udp_erpc, udp_erpc_until, udp_erpc_with, udp_raw_echo};
pub use workload::{
    Ctx, Latency, MAX_STRETCH, Outcome, Point, packets_per_direction, ratio_to_raw,
    sessions_per_node,
};
pub(crate) use workload::{issue, new_ctx, register};

/// Request type of the benchmark's RPC.
pub const REQ: u8 = 1;
/// First UDP port of the nodes' Rpcs (node i uses `DATA_PORT + i`): the
/// C++ eRPC's base port, inside the dissector's default range.
pub const DATA_PORT: u16 = 31850;
/// First UDP port of the raw echo (outside the dissector's range: its
/// frames carry no eRPC header).
pub const RAW_ECHO_PORT: u16 = 41000;
/// Bound on event-loop rounds while sessions connect (device model: rounds
/// of virtual time, so this is about 0.5 s of simulated time).
const CONNECT_ROUNDS: usize = 1_000_000;
/// Bound on event-loop rounds while the RPCs in flight at the end of a
/// device-model point complete (about 10 s of virtual time).
const DRAIN_ROUNDS: usize = 20_000_000;
/// A counted run (`Stop::Count`) fails after this many event-loop rounds
/// without one completion (device model: 10 s of virtual time), instead of
/// hanging; no wall clock is read to decide it.
const STALL_ROUNDS: usize = DRAIN_ROUNDS;
/// Wall-clock bound for connecting over kernel UDP (SM retries every
/// 100 ms; a refusal arrives within one round trip).
const UDP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
