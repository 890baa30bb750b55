//! Loss recovery, failure detection and session reset: one test per rule,
//! on the deterministic simulated network (virtual time). A failing run
//! prints its seed and a one-line replay command.

mod common;

use std::collections::VecDeque;

use common::app::{self, Ctx, DEFER, ECHO, Op, SIZED};
use common::scenarios::{N, check_done, connect, nodes, nodes_with};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::CcConfig;
use erpc::{DropReason, RpcConfig, RpcError};
use erpc_sim::{DeferredDma, LinkFaults, PortConfig, SimConfig};
use netsim::Rng;

const FILE: &str = "loss";
const MS: u64 = 1_000_000;

type W = SimWorld;

/// Every world of this file runs in the deferred-DMA mode: the NIC reads
/// a send later than `tx_burst`, and a buffer reused or freed before a TX
/// drain panics with the packet's name.
fn world(seed: u64, link: LinkFaults) -> W {
    W::with_config(SimConfig {
        seed,
        link,
        deferred_dma: Some(DeferredDma::default()),
        ..SimConfig::default()
    })
}

/// Issues `ops` from node 0 (window `window`) and runs until all finished.
fn run_ops(w: &mut W, ns: &mut [N<W>], ops: VecDeque<Op>, window: usize) {
    let total = ns[0].ctx.completed + ns[0].ctx.failed + ops.len() as u64;
    ns[0].ctx.todo = ops;
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, window);
    }
    run_until(w, ns, 20_000_000, "requests", |ns| {
        ns[0].ctx.completed + ns[0].ctx.failed == total
    });
}

fn op(req_type: u8, req_len: usize, resp_len: usize) -> Op {
    Op {
        req_type,
        req_len,
        resp_len,
    }
}

fn every_credit_home(ns: &[N<W>]) {
    for n in ns {
        n.rpc.check_credit_invariant().unwrap();
        for &sn in &n.ctx.sessions {
            if n.rpc.is_connected(sn) && n.rpc.outstanding_requests(sn) == Some(0) {
                assert_eq!(n.rpc.session_credits(sn), Some(erpc::SESSION_CREDITS));
            }
        }
    }
}

#[test]
fn a_lost_request_packet_is_resent_after_the_retransmission_timeout() {
    with_seeds(
        "a_lost_request_packet_is_resent_after_the_retransmission_timeout",
        FILE,
        &[1],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let sn = ns[0].ctx.sessions[0];
            ns[0].rpc.fault_drop_tx(sn, 1).unwrap();
            let t0 = w.now_ns();
            run_ops(&mut w, &mut ns, [op(ECHO, 100, 100)].into(), 1);
            let took = w.now_ns() - t0;
            check_done::<W>(&ns);
            let st = ns[0].rpc.stats();
            assert_eq!(st.retransmissions, 1, "{st}");
            assert_eq!(st.retransmitted_pkts, 1);
            assert_eq!(st.tx_fault_dropped, 1);
            // Drained before and after the retransmission.
            assert!(st.tx_flushes >= 2, "{st}");
            assert_eq!(ns[0].rpc.session_retransmits(sn), Some(1));
            // The timeout (5 ms), within one scan interval (0.5 ms) plus a step.
            assert!(
                (5 * MS..6 * MS).contains(&took),
                "completed after {took} ns"
            );
            assert_eq!(ns[1].ctx.handled, 1);
            every_credit_home(&ns);
        },
    );
}

#[test]
fn lost_credit_returns_response_packets_and_rfrs_are_recovered() {
    // Drop the k-th packet each side sends for one multi-packet exchange
    // (request packets, credit returns, response packets, RFRs), for k up
    // to the whole exchange: every request completes, with the right data,
    // and runs its handler once.
    with_seeds(
        "lost_credit_returns_response_packets_and_rfrs_are_recovered",
        FILE,
        &[2],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let csn = ns[0].ctx.sessions[0];
            let ssn = ns[1].rpc.session_nums()[0];
            let mut runs = 0;
            for side in 0..2 {
                for drops in 1..12u32 {
                    let sn = if side == 0 { csn } else { ssn };
                    ns[side].rpc.fault_drop_tx(sn, drops).unwrap();
                    run_ops(&mut w, &mut ns, [op(SIZED, 5000, 4000)].into(), 1);
                    runs += 1;
                }
            }
            check_done::<W>(&ns);
            assert_eq!(ns[0].ctx.completed, runs);
            assert_eq!(ns[1].ctx.handled, runs, "one handler run per request");
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert!(c.retransmissions >= runs, "{c}");
            // The server answered duplicates without running handlers again.
            assert!(s.dup_req_cr_resent > 0, "{s}");
            assert!(s.dup_req_resp_resent + s.dup_rfr_resent > 0, "{s}");
            every_credit_home(&ns);
        },
    );
}

#[test]
fn reordered_frames_no_longer_leave_slots_stuck() {
    // The review's case: a few reordered frames among 200 requests on one
    // session with all 8 slots busy used to stall every slot forever.
    with_seeds(
        "reordered_frames_no_longer_leave_slots_stuck",
        FILE,
        &[3, 4, 5],
        |seed| {
            let link = LinkFaults {
                reorder: 0.03,
                ..erpc_sim::delayed_link(2_000, 1_000)
            };
            let mut w = world(seed, link);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let mut rng = Rng::new(seed);
            let ops = app::random_ops(&mut rng, 200, &[ECHO, SIZED], &[12, 968, 3000]);
            run_ops(&mut w, &mut ns, ops, 8);
            check_done::<W>(&ns);
            assert_eq!(ns[0].ctx.completed, 200);
            assert!(w.net.stats().reordered >= 11, "{:?}", w.net.stats());
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            let out_of_order = c.drops(DropReason::OutOfOrder) + s.drops(DropReason::OutOfOrder);
            assert!(out_of_order > 0, "reordering is dropped as loss: {c} / {s}");
            assert!(c.retransmissions > 0, "{c}");
            assert_eq!(ns[1].ctx.handled, 200);
            every_credit_home(&ns);
        },
    );
}

#[test]
fn handlers_run_at_most_once_under_heavy_duplication_and_loss() {
    with_seeds(
        "handlers_run_at_most_once_under_heavy_duplication_and_loss",
        FILE,
        &[6, 7],
        |seed| {
            let link = LinkFaults {
                loss: 0.05,
                duplicate: 0.3,
                reorder: 0.02,
                ..erpc_sim::delayed_link(2_000, 2_000)
            };
            let mut w = world(seed, link);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 2);
            let mut rng = Rng::new(seed);
            let ops = app::random_ops(
                &mut rng,
                1500,
                &[ECHO, SIZED],
                &[0, 12, 968, 969, 5000, 20_000],
            );
            run_ops(&mut w, &mut ns, ops, 24);
            check_done::<W>(&ns);
            assert_eq!(ns[0].ctx.completed, 1500);
            // Exactly one handler run per request, though most packets arrived
            // more than once.
            assert_eq!(ns[1].ctx.handled, 1500);
            let s = ns[1].rpc.stats();
            assert!(
                s.drops(DropReason::DupReqInProgress) + s.dup_req_cr_resent + s.dup_req_resp_resent
                    > 0
            );
            assert!(w.net.stats().duplicated > 1000);
            every_credit_home(&ns);
        },
    );
}

#[test]
fn a_duplicate_request_after_the_response_gets_the_response_again_and_a_tx_drain() {
    with_seeds(
        "a_duplicate_request_after_the_response_gets_the_response_again_and_a_tx_drain",
        FILE,
        &[8],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            let ssn = ns[1].rpc.session_nums()[0];
            // The server's response is lost: the client's retransmitted
            // request finds it ready.
            ns[1].rpc.fault_drop_tx(ssn, 1).unwrap();
            let flushes = ns[1].rpc.stats().tx_flushes;
            run_ops(&mut w, &mut ns, [op(ECHO, 300, 300)].into(), 1);
            check_done::<W>(&ns);
            let s = ns[1].rpc.stats();
            assert_eq!(s.dup_req_resp_resent, 1, "{s}");
            assert_eq!(s.tx_flushes - flushes, 1, "{s}");
            assert_eq!(ns[1].ctx.handled, 1);
        },
    );
}

#[test]
fn a_duplicate_of_a_running_request_is_dropped_not_run() {
    with_seeds(
        "a_duplicate_of_a_running_request_is_dropped_not_run",
        FILE,
        &[9],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            ns[0].ctx.todo = [op(DEFER, 64, 64)].into();
            {
                let n = &mut ns[0];
                app::start(&mut n.rpc, &mut n.ctx, 1);
            }
            // The handler holds the request for 20 ms: the client retransmits
            // every 5 ms and the server drops each duplicate.
            run_for(&mut w, &mut ns, 20 * MS);
            assert_eq!(ns[1].ctx.deferred.len(), 1);
            let s = ns[1].rpc.stats();
            assert!(s.drops(DropReason::DupReqInProgress) >= 3, "{s}");
            assert!(ns[0].rpc.stats().retransmissions >= 3);
            let r = {
                let n = &mut ns[1];
                app::respond_deferred(&mut n.rpc, &mut n.ctx)
            };
            assert!(r.iter().all(Result::is_ok), "{r:?}");
            run_until(&mut w, &mut ns, 100_000, "response", |ns| {
                ns[0].ctx.completed == 1
            });
            check_done::<W>(&ns);
            assert_eq!(ns[1].ctx.handled, 1);
        },
    );
}

/// Polls and steps for `d` of virtual time.
fn run_for(w: &mut W, ns: &mut [N<W>], d: u64) {
    let end = w.now_ns() + d;
    while w.now_ns() < end {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

/// A continuation that records the outcome and frees both buffers.
fn record_cont<T: transport::Transport>(
    rpc: &mut erpc::Rpc<T, Ctx>,
    ctx: &mut Ctx,
    c: erpc::Completion,
) {
    match c.result {
        Ok(()) => ctx.completed += 1,
        Err(e) => {
            ctx.failed += 1;
            ctx.failures.push(e);
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

/// Enqueues a SIZED request asking for `resp_len` bytes into a response
/// buffer of capacity `resp_cap`, completing through [`record_cont`].
fn sized_request(n: &mut N<W>, sn: u16, resp_len: usize, resp_cap: usize) {
    let mut req = n.rpc.alloc_msg_buffer(app::SIZED_HDR).unwrap();
    req.data_mut()[..8].copy_from_slice(&7u64.to_le_bytes());
    req.data_mut()[8..12].copy_from_slice(&(resp_len as u32).to_le_bytes());
    let resp = n.rpc.alloc_msg_buffer(resp_cap).unwrap();
    n.rpc
        .enqueue_request(sn, SIZED, req, resp, record_cont::<<W as World>::T>, 0)
        .map_err(|e| e.kind)
        .unwrap();
}

#[test]
fn a_late_response_to_a_request_that_failed_is_counted_never_delivered() {
    with_seeds(
        "a_late_response_to_a_request_that_failed_is_counted_never_delivered",
        FILE,
        &[10],
        |seed| {
            // Every frame from the server arrives twice: the copy of the first
            // response packet of a request that failed (its response buffer is
            // too small) arrives after the failure.
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            w.net.set_link(
                1,
                LinkFaults {
                    duplicate: 1.0,
                    ..erpc_sim::delayed_link(1_000, 0)
                },
            );
            let sn = ns[0].ctx.sessions[0];
            sized_request(&mut ns[0], sn, 3000, 8);
            run_until(&mut w, &mut ns, 100_000, "failure", |ns| {
                ns[0].ctx.failed == 1
            });
            assert!(matches!(
                ns[0].ctx.failures[0],
                RpcError::ResponseTooLarge {
                    size: 3000,
                    capacity: 8
                }
            ));
            run_for(&mut w, &mut ns, 50_000);
            let c = ns[0].rpc.stats();
            assert!(c.drops(DropReason::AbandonedRequest) >= 1, "{c}");
            // The slots go on with new requests; nothing late reaches them.
            for _ in 0..16 {
                sized_request(&mut ns[0], sn, 2000, 2000);
            }
            run_until(&mut w, &mut ns, 1_000_000, "more", |ns| {
                ns[0].ctx.completed == 16
            });
            assert_eq!(ns[0].ctx.failed, 1);
            every_credit_home(&ns);
        },
    );
}

#[test]
fn packets_the_transport_refuses_stay_queued() {
    with_seeds(
        "packets_the_transport_refuses_stay_queued",
        FILE,
        &[11],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, seed);
            connect(&mut w, &mut ns, 0, 1, 1);
            // A few refused bursts: the packets wait in the batch and go out
            // with the next flush, with no retransmission needed.
            w.net.refuse_tx(0, 3);
            w.net.refuse_tx(1, 3);
            let mut rng = Rng::new(seed);
            let ops = app::random_ops(&mut rng, 100, &[ECHO, SIZED], &[12, 3000]);
            run_ops(&mut w, &mut ns, ops, 8);
            check_done::<W>(&ns);
            let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
            assert!(c.tx_refused > 0 && s.tx_refused > 0, "{c:?} / {s:?}");
            assert_eq!(c.tx_given_up + s.tx_given_up, 0);
            assert_eq!(c.retransmissions, 0, "refused packets were not lost");
            // A transport that refuses for long while more packets are queued
            // than a batch holds (4 sessions x 32 credits): the oldest packets
            // are given up to loss recovery, counted, and everything still
            // completes.
            connect(&mut w, &mut ns, 0, 1, 3);
            w.net.refuse_tx(0, 1000);
            let ops = app::random_ops(&mut rng, 100, &[SIZED], &[30_000]);
            run_ops(&mut w, &mut ns, ops, 32);
            check_done::<W>(&ns);
            let c = ns[0].rpc.stats();
            assert!(c.tx_given_up > 0, "{c:?}");
            assert!(c.retransmissions > 0, "{c:?}");
            assert_eq!(ns[0].ctx.completed, 200);
            every_credit_home(&ns);
        },
    );
}

#[test]
fn a_request_waiting_for_credits_is_not_retransmitted() {
    // Two 1 MiB requests on one session over a 1 Gbit/s link that loses
    // nothing: the first takes all the credits and keeps them for about
    // 9 ms (longer than the 5 ms retransmission timeout), the second gets
    // its first credit only then. Its timeout runs from when it has packets
    // in flight, not from when it was enqueued: nothing is retransmitted.
    // With congestion control on and off (off, only the slot's own
    // timestamps say when its packets left).
    with_seeds(
        "a_request_waiting_for_credits_is_not_retransmitted",
        FILE,
        &[12],
        |seed| {
            for cc in [
                CcConfig::disabled(),
                CcConfig {
                    link_gbps: 1.0,
                    ..CcConfig::default()
                },
            ] {
                let mut w = W::with_config(SimConfig {
                    seed,
                    port: PortConfig::new(1_000_000_000, 4 << 20),
                    link: erpc_sim::DEFAULT_LINK,
                    deferred_dma: Some(DeferredDma::default()),
                    ..SimConfig::default()
                });
                let cfg = RpcConfig {
                    cc,
                    ..RpcConfig::default()
                };
                let mut ns = nodes_with(&mut w, 2, seed, cfg);
                connect(&mut w, &mut ns, 0, 1, 1);
                let t0 = w.now_ns();
                let ops: VecDeque<Op> = (0..4).map(|_| op(SIZED, 1 << 20, 16)).collect();
                run_ops(&mut w, &mut ns, ops, 2);
                check_done::<W>(&ns);
                assert_eq!(ns[0].ctx.completed, 4);
                // Each request alone outlasts the timeout.
                assert!(
                    w.now_ns() - t0 > 4 * 8 * 1_000_000,
                    "{} ns",
                    w.now_ns() - t0
                );
                let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
                assert_eq!(w.net.queue(1).drops, 0, "nothing was lost");
                assert_eq!(c.retransmissions, 0, "cc {}: {c}", cc.enabled);
                assert_eq!(s.dup_req_cr_resent + s.dup_req_resp_resent, 0, "{s}");
                every_credit_home(&ns);
            }
        },
    );
}
