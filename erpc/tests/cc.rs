//! Congestion control at the Rpc, on the deterministic simulated network:
//! the bypasses, pacing through the timing wheel, and the rule that a
//! rolled-back request's packets still in the wheel are dropped, never
//! sent twice.

mod common;

use std::collections::VecDeque;

use common::app::{ECHO, Op, SIZED};
use common::scenarios::{N, check_done, connect, nodes_with};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::CcConfig;
use erpc::{DropReason, RpcConfig};

const FILE: &str = "cc";

type W = SimWorld;

fn pair(seed: u64, cc: CcConfig) -> (W, Vec<N<W>>) {
    let mut w = W::new(seed);
    let cfg = RpcConfig {
        cc,
        ..RpcConfig::default()
    };
    let mut ns = nodes_with(&mut w, 2, seed, cfg);
    connect(&mut w, &mut ns, 0, 1, 1);
    (w, ns)
}

fn run(w: &mut W, ns: &mut [N<W>], ops: VecDeque<Op>, window: usize) {
    let total = ns[0].ctx.completed + ops.len() as u64;
    ns[0].ctx.todo = ops;
    {
        let n = &mut ns[0];
        common::app::start(&mut n.rpc, &mut n.ctx, window);
    }
    run_until(w, ns, 5_000_000, "requests", |ns| {
        ns[0].ctx.completed + ns[0].ctx.failed == total
    });
    check_done::<W>(ns);
}

fn ops(n: usize, t: u8, len: usize) -> VecDeque<Op> {
    (0..n)
        .map(|_| Op {
            req_type: t,
            req_len: len,
            resp_len: len,
        })
        .collect()
}

#[test]
fn an_uncongested_session_bypasses_timely_and_the_wheel() {
    with_seeds(
        "an_uncongested_session_bypasses_timely_and_the_wheel",
        FILE,
        &[1],
        |seed| {
            let (mut w, mut ns) = pair(seed, CcConfig::default());
            run(&mut w, &mut ns, ops(500, SIZED, 3000), 8);
            let s = ns[0].rpc.stats();
            // RTTs of a few µs, at link rate: every sample and every packet
            // takes the bypass.
            assert_eq!(s.timely_updates, 0, "{s:?}");
            assert!(s.timely_bypassed >= 500, "{s:?}");
            assert!(s.wheel_bypassed >= 500 * 4, "{s:?}");
            assert_eq!(ns[0].rpc.wheel_stats().unwrap().inserted, 0);
            let sn = ns[0].ctx.sessions[0];
            assert_eq!(ns[0].rpc.session_info(sn).unwrap().cc_rate_gbps, Some(25.0));
        },
    );
}

#[test]
fn each_bypass_can_be_switched_off() {
    with_seeds("each_bypass_can_be_switched_off", FILE, &[2], |seed| {
        // Without the Timely bypass every sample is computed (the rate
        // stays at the link rate: RTTs are far below T_low).
        let (mut w, mut ns) = pair(
            seed,
            CcConfig {
                timely_bypass: false,
                ..CcConfig::default()
            },
        );
        run(&mut w, &mut ns, ops(200, ECHO, 100), 4);
        let s = ns[0].rpc.stats();
        assert!(s.timely_updates >= 200 && s.timely_bypassed == 0, "{s:?}");
        // Without the wheel bypass every client packet goes through the
        // wheel, paced at the link rate.
        let (mut w, mut ns) = pair(
            seed,
            CcConfig {
                wheel_bypass: false,
                ..CcConfig::default()
            },
        );
        run(&mut w, &mut ns, ops(200, SIZED, 3000), 4);
        let s = ns[0].rpc.stats();
        let wh = ns[0].rpc.wheel_stats().unwrap();
        assert_eq!(s.wheel_bypassed, 0, "{s:?}");
        assert!(wh.inserted >= 200 * 4, "{wh:?}");
        assert_eq!(wh.reaped, wh.inserted);
        assert_eq!(s.wheel_stale, 0, "nothing rolled back on a lossless link");
        // Off entirely: no wheel, no RTT samples.
        let (mut w, mut ns) = pair(seed, CcConfig::disabled());
        run(&mut w, &mut ns, ops(50, SIZED, 3000), 4);
        assert!(ns[0].rpc.wheel_stats().is_none());
        let s = ns[0].rpc.stats();
        assert_eq!(s.timely_updates + s.timely_bypassed + s.wheel_bypassed, 0);
    });
}

#[test]
fn a_slow_link_rate_paces_the_session() {
    with_seeds("a_slow_link_rate_paces_the_session", FILE, &[3], |seed| {
        // 0.16 Gbit/s = 20 MB/s: 50 ns per byte; the wheel bypass off so
        // the pace holds from the first packet.
        let cc = CcConfig {
            link_gbps: 0.16,
            wheel_bypass: false,
            ..CcConfig::default()
        };
        let (mut w, mut ns) = pair(seed, cc);
        let t0 = w.now_ns();
        run(&mut w, &mut ns, ops(4, SIZED, 20 * 968), 1);
        let took = w.now_ns() - t0;
        // 4 requests of 20 packets of 1024 bytes, and an RFR (56 bytes)
        // per response packet after the first: (20 + 19) × 4 paced
        // packets, 86 176 bytes, 4.3 ms at 20 MB/s (the server's packets
        // are not paced).
        let paced = ns[0].rpc.wheel_stats().unwrap().inserted;
        assert_eq!(paced, 4 * (20 + 19));
        assert!(
            (4_300_000..8_000_000).contains(&took),
            "took {took} ns for {paced} paced packets"
        );
        // The link rate itself is checked against Timely's minimum.
        let mut w2 = W::new(seed);
        let t = w2.transport();
        let nexus = common::app::register::<<W as World>::T>(w2.nexus("x:1"))
            .build()
            .unwrap();
        let e = erpc::Rpc::<_, common::app::Ctx>::builder(&nexus, t, w2.allocator(1 << 20))
            .config(RpcConfig {
                cc: CcConfig {
                    link_gbps: 0.08,
                    ..CcConfig::default()
                },
                ..RpcConfig::default()
            })
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("minimum rate 15 MB/s"), "{e}");
    });
}

#[test]
fn a_rolled_back_requests_packets_in_the_wheel_are_never_sent() {
    with_seeds(
        "a_rolled_back_requests_packets_in_the_wheel_are_never_sent",
        FILE,
        &[4],
        |seed| {
            // 16 MB/s, just above Timely's minimum: 64 µs per packet, a
            // window of 32 packets spans 2 ms, everything through the
            // wheel; a retransmission timeout of 1 ms (shorter than the
            // wheel's horizon) so that a rollback finds packets waiting.
            let cc = CcConfig {
                link_gbps: 0.128,
                wheel_bypass: false,
                ..CcConfig::default()
            };
            let mut w = W::new(seed);
            let cfg = RpcConfig {
                cc,
                rto_us: 1000,
                pkt_loss_scan_us: 100,
                ..RpcConfig::default()
            };
            let mut ns = nodes_with(&mut w, 2, seed, cfg);
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            // The first request packet is lost: the server drops the rest as
            // out of order; 1 ms after packet 0 left the slot rolls back
            // while later packets still wait in the wheel.
            ns[0].rpc.fault_drop_tx(sn, 1).unwrap();
            run(&mut w, &mut ns, ops(1, SIZED, 32 * 968), 1);
            let c = ns[0].rpc.stats();
            let stale = c.wheel_stale;
            assert_eq!(c.retransmissions, 1, "{c:?}");
            assert!(stale >= 5, "packets were still in the wheel: {c:?}");
            // Every original packet after the lost one either left before
            // the rollback (and the server dropped it as out of order) or
            // was dropped from the wheel unsent; then all 32 were resent.
            let ooo = ns[1].rpc.stats().drops(DropReason::OutOfOrder);
            assert_eq!(ooo + stale, 31, "{c:?}");
            let response_rfrs = 31;
            assert_eq!(c.tx_pkts, (32 - stale) + 32 + response_rfrs, "{c:?}");
            assert_eq!(ns[1].ctx.handled, 1);
        },
    );
}
