//! N-to-1 incast on a fabric with link rates and switch buffers, written
//! once and run on both worlds: eRPC's simulated network and device-model
//! NICs driven by the mlx5 driver. Without congestion control, N senders
//! at line rate into one port fill the switch's output buffer, which
//! drops at the tail; loss recovery must still complete every request
//! exactly once.

mod common;

use common::devmodel::DevWorld;
use common::scenarios::{Incast, IncastReport, incast};
use common::{SimWorld, World, with_seeds};
use erpc::RpcConfig;
use erpc::sim::PortConfig;

const FILE: &str = "incast";

/// 10 Gbit/s links, 64 KiB of switch buffer per output port.
const RATE_BPS: u64 = 10_000_000_000;
const BUFFER_BYTES: u64 = 64 * 1024;

fn port() -> PortConfig {
    PortConfig::new(RATE_BPS, BUFFER_BYTES)
}

/// Eight senders, each streaming 64 KiB requests two at a time: 8 × 32
/// credits of 1 KiB frames in flight at once, four times the buffer.
fn plan() -> Incast {
    Incast {
        senders: 8,
        requests: 6,
        req_bytes: 64 * 1024,
        window: 2,
        cfg: RpcConfig::default(),
    }
}

fn check<W: World>(w: &W, r: &IncastReport) {
    let p = plan();
    let total = (p.senders * p.requests) as u64;
    if std::env::var_os("ERPC_VERBOSE").is_some() {
        eprintln!(
            "{:?}",
            IncastReport {
                trace: Vec::new(),
                ..r.clone()
            }
        );
    }
    // Exactly once, through loss recovery.
    assert_eq!(r.completed, total, "{r:?}");
    assert_eq!(r.handled, total, "{r:?}");
    assert!(r.retransmissions > 0, "drops were repaired: {r:?}");
    // The queue reached the buffer (within one frame) and no further, and
    // the switch dropped at the tail.
    let q = r.queue;
    assert_eq!(q.capacity_bytes, Some(BUFFER_BYTES));
    assert!(q.max_bytes <= BUFFER_BYTES, "{q:?}");
    assert!(q.max_bytes > BUFFER_BYTES - 1024, "{q:?}");
    assert!(q.drops > 0, "{q:?}");
    assert_eq!(q.bytes, 0, "drained at the end: {q:?}");
    // Drop-tail: a frame was dropped only when it did not fit, and the
    // trace saw every arrival.
    assert_eq!(r.trace.len() as u64, q.enqueued + q.drops);
    for s in r.trace.iter().filter(|s| s.dropped) {
        assert!(s.bytes + 1024 > BUFFER_BYTES, "dropped with room: {s:?}");
    }
    // The receiver's link was the bottleneck.
    assert!(r.goodput_bps < RATE_BPS as f64, "{r:?}");
    let _ = w;
}

#[test]
fn incast_fills_the_switch_buffer_on_the_simulated_network() {
    with_seeds(
        "incast_fills_the_switch_buffer_on_the_simulated_network",
        FILE,
        &[1],
        |seed| {
            let mut w = SimWorld::with_port(seed, port());
            let r = incast(&mut w, seed, plan());
            check(&w, &r);
            let s = w.net.stats();
            assert_eq!(s.queue_drops, r.queue.drops);
            assert_eq!(s.lost + s.fcs_errors + s.rx_ring_full, 0, "{s:?}");
        },
    );
}

#[test]
fn incast_fills_the_switch_buffer_on_the_device_model() {
    with_seeds(
        "incast_fills_the_switch_buffer_on_the_device_model",
        FILE,
        &[1],
        |seed| {
            let mut w = DevWorld::with_port(seed, port());
            let r = incast(&mut w, seed, plan());
            check(&w, &r);
            for n in &w.nics {
                assert_eq!(n.drops(mlx5_sim::DropReason::OutOfBuffer), 0);
            }
        },
    );
}

/// The same seed gives the same queue, drop for drop.
#[test]
fn incast_replays_exactly() {
    let run = || {
        let mut w = SimWorld::with_port(3, port());
        let r = incast(&mut w, 3, plan());
        (r.queue, r.retransmissions, r.trace)
    };
    assert_eq!(run(), run());
}
