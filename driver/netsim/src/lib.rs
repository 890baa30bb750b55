//! The one network model every simulation of erpc-rs runs on: eRPC's
//! in-process network (`erpc::sim::SimNet`) and the device-model fabric
//! (`mlx5_sim::Fabric`) are thin users of it, so loss, incast and capture
//! behave the same whichever endpoints are plugged in, and a scenario is
//! written once.
//!
//! # The model
//!
//! A star: every device hangs off one port of one switch by its own
//! full-duplex link.
//!
//! ```text
//!  device 0 ──link 0──┐            ┌──link 2── device 2
//!                     ├── switch ──┤
//!  device 1 ──link 1──┘ (output    └──link 3── device 3
//!                        queue per
//!                        port)
//! ```
//!
//! A frame a device sends is serialised onto its link at the port's rate
//! ([`PortConfig::rate_bps`]; Ethernet padding and the 24 bytes of
//! preamble, FCS and inter-frame gap count, see [`wire_bytes`]), crosses
//! it (propagation delay and the link direction's seeded [`LinkFaults`]:
//! loss, FCS errors, damage past the frame check, jitter, reordering,
//! duplication, link down), and reaches the switch. The switch learns
//! source MACs (and knows the MACs ports were added with), forwards
//! unicast to the port behind the destination MAC, floods broadcast,
//! multicast and (optionally) unknown unicast, and queues the frame in its
//! output queue towards that port: a FIFO of at most
//! [`PortConfig::buffer_bytes`] (drop-tail, drops counted), served at the
//! port's link rate. The frame then crosses the port's link towards the
//! device (with that direction's faults) and is delivered. Every port
//! counts what happened ([`PortStats`]), every fault and buffer drop can be
//! logged ([`LinkEvent`]), each port can be captured to pcap, and each
//! output queue reports its occupancy now, its high-water marks and drops
//! ([`QueueStats`]) and can record a trace over time ([`QueueSample`]).
//!
//! Defaults are an infinitely fast fabric: no rate limit, no buffer limit,
//! no delay, no faults. Then a frame is delivered inside the call that
//! sent it.
//!
//! # Time and determinism
//!
//! [`Network`] is single-threaded and never reads a clock: each call takes
//! the current time, and the event queue ([`Network::run_until`]) takes
//! hops in (time, sequence) order. Each link direction draws from its own
//! stream of the one seeded generator ([`Rng`], xoshiro256++ from the
//! value-stable `rand_xoshiro`), so the fate of frames on one link does not
//! depend on traffic elsewhere, and a seed replays exactly: the same frames
//! are lost, duplicated and queued, and pcaps are byte-identical.
//! [`SharedNetwork`] puts a network behind a lock with its own clock: a
//! virtual one moved by `advance` (deterministic), or wall time with a
//! pump thread that takes delayed hops (threaded, for devices that run in
//! several threads).
//!
//! Links and queues work in picoseconds internally, so rates that do not
//! divide a second evenly do not drift.

#![deny(unsafe_code)]

mod link;
mod net;
pub mod pcap;
mod queue;
pub mod rng;
mod shared;

pub use link::{
    Direction, LinkFaults, MIN_FRAME_BYTES, PortConfig, PortId, WIRE_OVERHEAD_BYTES,
    serialization_ps, wire_bytes,
};
pub use net::{LinkEvent, LinkEventKind, NetConfig, NetStats, Network, PortStats};
pub use pcap::{PcapBuffer, PcapWriter};
pub use queue::{QueueSample, QueueStats};
pub use rng::Rng;
pub use shared::{Attachment, Frames, PortSink, SharedNetwork, Tap};
