//! The deterministic scenarios on the device model: every Rpc on its own
//! software ConnectX, brought up by the mlx5 driver, talking through the
//! mlx5 raw-Ethernet transport (striding RQ, overrunning RX CQ, unsignaled
//! TX, doorbell batching), all in one thread on the fabric's virtual clock.
//! Unless a test's name says `lossless`, the NICs' links lose, duplicate
//! and reorder frames (`common::LOSSY`) and loss recovery has to repair
//! them. A failing run prints its seed and a one-line replay command.

mod common;

use std::collections::VecDeque;

use common::app::{self, BG_SIZED, ECHO, Op, SIZED, SIZED_HDR};
use common::devmodel::DevWorld;
use common::scenarios::{check_done, client_server, connect, nodes};
use common::{World, run_until, with_seeds};
use erpc::MAX_MSG_BYTES;
use netsim::Rng;

const FILE: &str = "device_model";

#[test]
fn single_packet_echo() {
    with_seeds("single_packet_echo", FILE, &[1, 2], |seed| {
        let mut w = DevWorld::lossy(seed);
        let mut rng = Rng::new(seed);
        let ops = app::random_ops(&mut rng, 2000, &[ECHO, SIZED], &[0, 1, 12, 100, 967, 968]);
        client_server(&mut w, seed, ops, 4, 1);
        // The NICs really carried the traffic.
        let rx: u64 = w.nics.iter().map(|n| n.stats().rx_delivered).sum();
        assert!(rx >= 4000, "{rx}");
    });
}

#[test]
fn every_size_class_up_to_the_largest_message_lossless() {
    with_seeds(
        "every_size_class_up_to_the_largest_message_lossless",
        FILE,
        &[7],
        |seed| {
            let mut w = DevWorld::new(seed);
            let mut ops = VecDeque::new();
            for shift in 0..=23 {
                let len = (1usize << shift).min(MAX_MSG_BYTES - 1);
                ops.push_back(Op {
                    req_type: SIZED,
                    req_len: len.max(SIZED_HDR),
                    resp_len: len,
                });
                ops.push_back(Op {
                    req_type: ECHO,
                    req_len: len + 1,
                    resp_len: len + 1,
                });
            }
            ops.push_back(Op {
                req_type: SIZED,
                req_len: MAX_MSG_BYTES,
                resp_len: MAX_MSG_BYTES,
            });
            client_server(&mut w, seed, ops, 2, 1);
        },
    );
}

#[test]
fn many_concurrent_requests_per_session() {
    with_seeds(
        "many_concurrent_requests_per_session",
        FILE,
        &[11],
        |seed| {
            let mut w = DevWorld::lossy(seed);
            let mut rng = Rng::new(seed);
            let ops = app::random_ops(
                &mut rng,
                2000,
                &[ECHO, SIZED],
                &[12, 500, 968, 969, 3000, 20_000],
            );
            client_server(&mut w, seed, ops, 40, 2);
        },
    );
}

#[test]
fn nested_rpcs() {
    with_seeds("nested_rpcs", FILE, &[31], |seed| {
        let mut w = DevWorld::lossy(seed);
        common::scenarios::nested_rpcs(&mut w, seed);
    });
}

#[test]
fn background_handlers() {
    with_seeds("background_handlers", FILE, &[41], |seed| {
        let mut w = DevWorld::lossy(seed);
        let mut rng = Rng::new(seed);
        let ops = app::random_ops(&mut rng, 600, &[BG_SIZED, SIZED], &[12, 968, 969, 30_000]);
        client_server(&mut w, seed, ops, 20, 1);
    });
}

#[test]
fn many_sessions_per_rpc() {
    // 4096-entry striding rings and 32 credits: 128 sessions per Rpc.
    with_seeds("many_sessions_per_rpc", FILE, &[51], |seed| {
        let mut w = DevWorld::lossy(seed);
        let mut ns = nodes(&mut w, 3, seed);
        connect(&mut w, &mut ns, 0, 1, 64);
        connect(&mut w, &mut ns, 0, 2, 64);
        let err = ns[0].rpc.create_session("node-1:31850", 1).unwrap_err();
        assert!(err.to_string().contains("RX ring exhausted"), "{err}");
        let mut rng = Rng::new(seed);
        ns[0].ctx.todo = app::random_ops(&mut rng, 2000, &[ECHO, SIZED], &[12, 968, 5000]);
        {
            let n = &mut ns[0];
            app::start(&mut n.rpc, &mut n.ctx, 128);
        }
        run_until(&mut w, &mut ns, 2_000_000, "requests", |ns| {
            ns[0].ctx.completed == 2000
        });
        check_done::<DevWorld>(&ns);
    });
}

#[test]
fn session_create_destroy_churn() {
    with_seeds("session_create_destroy_churn", FILE, &[61], |seed| {
        let mut w = DevWorld::lossy(seed);
        common::scenarios::session_create_destroy_churn(&mut w, seed);
    });
}

#[test]
fn few_credits_stall_and_resume() {
    with_seeds("few_credits_stall_and_resume", FILE, &[111], |seed| {
        let mut w = DevWorld::lossy(seed);
        common::scenarios::few_credits_stall_and_resume(&mut w, seed);
    });
}

#[test]
fn packets_sent_exactly_once_lossless() {
    for credits in [1, 2, 32] {
        with_seeds("packets_sent_exactly_once_lossless", FILE, &[131], |seed| {
            let mut w = DevWorld::new(seed);
            common::scenarios::packets_sent_exactly_once(&mut w, seed, credits);
        });
    }
}

/// The same seed gives the same run, down to the packet counts.
#[test]
fn replays_exactly_from_a_seed() {
    let run = |seed: u64| {
        let mut w = DevWorld::lossy(seed);
        let mut rng = Rng::new(seed);
        let ops = app::random_ops(&mut rng, 300, &[ECHO, SIZED], &[12, 968, 5000]);
        client_server(&mut w, seed, ops, 8, 1);
        (
            w.now_ns(),
            w.nics
                .iter()
                .map(|n| n.stats().rx_delivered)
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(run(5), run(5));
}

/// An Rpc holds 2 500 sessions at 32 credits each on the mlx5 transport
/// (issue 28): the striding RQ is sized for them
/// (`Mlx5Config::with_rx_ring_entries(rx_ring_entries_for(2500, 32))`, 128
/// MiB of hugepages per NIC), a client opens them all to one server Rpc,
/// and each carries an RPC.
#[test]
fn an_rpc_holds_2500_sessions_lossless() {
    with_seeds("an_rpc_holds_2500_sessions_lossless", FILE, &[3], |seed| {
        let k = 2500;
        let mut w = DevWorld::new(seed);
        let ring = erpc::rx_ring_entries_for(k, erpc::SESSION_CREDITS);
        w.ring_entries = Some(ring);
        let mut ns = nodes(&mut w, 2, seed);
        assert_eq!(ns[1].rpc.rx_ring_unreserved(), (ring, ring));
        common::scenarios::many_sessions(&mut w, &mut ns, 0, 1, k, 64);
        assert_eq!(ns[0].rpc.stats().total_drops(), 0, "{}", ns[0].rpc.stats());
        assert_eq!(ns[1].rpc.stats().total_drops(), 0, "{}", ns[1].rpc.stats());
    });
}
