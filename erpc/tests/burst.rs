//! Burst handlers (`NexusBuilder::burst_handler`): one test per rule, on
//! the deterministic simulated network (virtual time). A failing run
//! prints its seed and a one-line replay command.
//!
//! The server counts every run of a handler per request id, so "exactly
//! once" is checked per request; the client checks every response's bytes.

mod common;

use std::collections::{BTreeSet, HashMap};

use common::{Node, SimWorld, World, run_until, with_seeds};
use erpc::{
    Burst, Completion, DropReason, NexusBuilder, ReqHandle, Request, Rpc, RpcConfig, RpcError,
    ServerError, SessionNum,
};
use erpc_sim::{LinkFaults, SimConfig};

const FILE: &str = "burst";

/// Burst-handled echo: the response is the request's id XOR [`RESP_KEY`],
/// then the request's padding reversed.
const BURST: u8 = 10;
/// The same with an ordinary dispatch handler.
const ORDINARY: u8 = 11;
/// A second burst type (same answer).
const BURST2: u8 = 12;
/// Ordinary: responds, then resets its own (server) session.
const RESETTER: u8 = 13;

const RESP_KEY: u64 = 0x0f0f_5a5a_a5a5_f0f0;
/// Id flags, read by the burst handler: keep the handle (deferred) ...
const DEFER: u64 = 1 << 62;
/// ... do not take the request ...
const DECLINE: u64 = 1 << 61;
/// ... or reset the request's session, then respond to every request.
const RESET: u64 = 1 << 60;

type W = SimWorld;
type T = <W as World>::T;

#[derive(Default)]
struct Ctx {
    // Server side.
    /// Handler runs per request id.
    runs: HashMap<u64, u32>,
    /// Each burst: its type, and (session, id) of each request.
    bursts: Vec<(u8, Vec<(SessionNum, u64)>)>,
    /// Handles kept by the burst handler, with their ids.
    deferred: Vec<(ReqHandle, u64)>,
    errors: Vec<String>,
    // Client side.
    sessions: Vec<SessionNum>,
    /// Completions per id: Ok, or the error.
    done: HashMap<u64, Vec<Result<(), RpcError>>>,
}

fn id_of(d: &[u8]) -> u64 {
    u64::from_le_bytes(d[..8].try_into().expect("8-byte id"))
}

fn answer(d: &[u8]) -> Vec<u8> {
    let mut v = (id_of(d) ^ RESP_KEY).to_le_bytes().to_vec();
    v.extend(d[8..].iter().rev());
    v
}

fn run_once(ctx: &mut Ctx, id: u64) {
    let n = ctx.runs.entry(id).or_insert(0);
    *n += 1;
    if *n > 1 {
        ctx.errors.push(format!("request {id:#x} ran {n} times"));
    }
}

fn b_echo(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, b: &mut Burst<'_>) {
    assert!(!b.is_empty());
    assert!(b.len() <= erpc::MAX_BURST);
    let ids: Vec<(SessionNum, u64)> = (0..b.len())
        .map(|i| (b.session(i), id_of(b.data(i))))
        .collect();
    assert_eq!(b.iter().count(), b.len());
    ctx.bursts.push((b.req_type(), ids.clone()));
    if let Some(&(sn, _)) = ids.iter().find(|(_, id)| id & RESET != 0) {
        // The session goes at once; its responses are discarded.
        rpc.reset_session(sn).expect("reset a server session");
    }
    for (i, &(_, id)) in ids.iter().enumerate() {
        if id & DECLINE != 0 {
            continue;
        }
        run_once(ctx, id);
        let h = b.take(i);
        assert!(b.is_taken(i));
        if id & DEFER != 0 {
            ctx.deferred.push((h, id));
            continue;
        }
        match rpc.respond(h, &answer(b.data(i))) {
            Ok(()) => {}
            Err(erpc::RespondError::SessionReset { .. })
                if ids.iter().any(|(_, x)| x & RESET != 0) => {}
            Err(e) => ctx.errors.push(format!("respond to {id:#x}: {e}")),
        }
    }
}

fn h_ordinary(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    let id = id_of(req.data);
    run_once(ctx, id);
    rpc.respond(req.handle, &answer(req.data)).expect("respond");
}

fn h_resetter(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    let id = id_of(req.data);
    run_once(ctx, id);
    let sn = req.handle.session();
    rpc.respond(req.handle, &answer(req.data)).expect("respond");
    rpc.reset_session(sn).expect("reset");
}

fn register(b: NexusBuilder) -> NexusBuilder {
    b.burst_handler::<T, Ctx>(BURST, b_echo)
        .burst_handler::<T, Ctx>(BURST2, b_echo)
        .handler::<T, Ctx>(ORDINARY, h_ordinary)
        .handler::<T, Ctx>(RESETTER, h_resetter)
}

/// Node 0 is the server; nodes 1.. are clients.
fn nodes(w: &mut W, n: usize, cfg: RpcConfig) -> Vec<Node<T, Ctx>> {
    (0..n)
        .map(|i| {
            let nexus = register(w.nexus(&format!("node-{i}:31850")))
                .build()
                .expect("nexus");
            Node::new(w, &nexus, 0, Ctx::default(), cfg, None)
        })
        .collect()
}

/// Client `c` opens `k` sessions to node 0.
fn connect(w: &mut W, ns: &mut [Node<T, Ctx>], c: usize, k: usize) {
    for _ in 0..k {
        let sn = ns[c]
            .rpc
            .create_session("node-0:31850", 0)
            .expect("session");
        ns[c].ctx.sessions.push(sn);
    }
    run_until(w, ns, 100_000, "connect", |ns| {
        ns[c]
            .ctx
            .sessions
            .iter()
            .all(|&sn| ns[c].rpc.is_connected(sn))
    });
}

fn cont(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, c: Completion) {
    let id = c.tag as u64;
    if c.result.is_ok() {
        let want = answer(c.req.data());
        if c.resp.data() != want.as_slice() {
            ctx.errors.push(format!("request {id:#x}: wrong response"));
        }
    }
    ctx.done.entry(id).or_default().push(c.result);
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

/// Enqueues request `id` of type `t` with `len` bytes (at least the id).
fn send(n: &mut Node<T, Ctx>, sn: SessionNum, t: u8, id: u64, len: usize) {
    let len = len.max(8);
    let mut req = n.rpc.alloc_msg_buffer(len).expect("alloc");
    let d = req.data_mut();
    d[..8].copy_from_slice(&id.to_le_bytes());
    common::fill_pattern(&mut d[8..], id);
    let resp = n.rpc.alloc_msg_buffer(len).expect("alloc");
    n.rpc
        .enqueue_request(sn, t, req, resp, cont, id as usize)
        .expect("enqueue");
}

fn completions(ns: &[Node<T, Ctx>]) -> usize {
    ns.iter()
        .map(|n| n.ctx.done.values().map(Vec::len).sum::<usize>())
        .sum()
}

fn no_errors(ns: &[Node<T, Ctx>]) {
    for (i, n) in ns.iter().enumerate() {
        assert!(n.ctx.errors.is_empty(), "node {i}: {:?}", n.ctx.errors);
    }
}

/// Every id in `ids` completed exactly once, successfully, and ran its
/// handler exactly once at the server (node 0).
fn exactly_once(ns: &[Node<T, Ctx>], ids: &[(usize, u64)]) {
    no_errors(ns);
    for &(c, id) in ids {
        assert_eq!(
            ns[c].ctx.done.get(&id).map(Vec::as_slice),
            Some(&[Ok(())][..]),
            "request {id:#x} of node {c}"
        );
        assert_eq!(ns[0].ctx.runs.get(&id), Some(&1), "request {id:#x} runs");
    }
}

/// Every burst handed to a handler had one type, and the burst types'
/// requests add up to `reqs`.
fn bursts_add_up(s: &Ctx, reqs: usize) -> usize {
    let total: usize = s.bursts.iter().map(|(_, v)| v.len()).sum();
    assert_eq!(total, reqs);
    s.bursts.iter().map(|(_, v)| v.len()).max().unwrap_or(0)
}

fn world(seed: u64, link: LinkFaults) -> W {
    W::with_config(SimConfig {
        seed,
        link,
        ..SimConfig::default()
    })
}

#[test]
fn a_burst_mixed_with_ordinary_requests() {
    with_seeds(
        "a_burst_mixed_with_ordinary_requests",
        FILE,
        &[1, 2],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, RpcConfig::default());
            connect(&mut w, &mut ns, 1, 2);
            // Rounds of 16 requests, enqueued together: they reach the server
            // in one RX burst.
            let mut ids = Vec::new();
            let types = [BURST, ORDINARY, BURST2, BURST];
            for round in 0..20u64 {
                for k in 0..16u64 {
                    let id = round << 8 | k;
                    let sn = ns[1].ctx.sessions[(k % 2) as usize];
                    send(
                        &mut ns[1],
                        sn,
                        types[(k % 4) as usize],
                        id,
                        8 + (k as usize * 37) % 900,
                    );
                    ids.push((1, id));
                }
                let want = ids.len();
                run_until(&mut w, &mut ns, 100_000, "round", |ns| {
                    completions(ns) == want
                });
            }
            exactly_once(&ns, &ids);
            let s = &ns[0];
            let burst_reqs = ids.len() / 4 * 3;
            let largest = bursts_add_up(&s.ctx, burst_reqs);
            assert!(
                largest > 1,
                "requests were batched: largest burst {largest}"
            );
            for (t, v) in &s.ctx.bursts {
                assert!(*t == BURST || *t == BURST2);
                for (_, id) in v {
                    let k = id & 0xff;
                    assert_eq!(
                        types[(k % 4) as usize],
                        *t,
                        "request {id:#x} in a burst of type {t}"
                    );
                }
            }
            let st = s.rpc.stats();
            assert_eq!(st.burst_calls, s.ctx.bursts.len() as u64);
            assert!(st.burst_calls < burst_reqs as u64, "{st}");
            assert_eq!(st.reqs_handled, ids.len() as u64);
            assert_eq!(st.burst_not_taken, 0);
            assert_eq!(st.deferred_copies, 0);
            assert_eq!(st.total_drops(), 0, "{st}");
        },
    );
}

#[test]
fn a_burst_spans_sessions_and_clients() {
    with_seeds("a_burst_spans_sessions_and_clients", FILE, &[3], |seed| {
        let mut w = world(seed, erpc_sim::DEFAULT_LINK);
        let mut ns = nodes(&mut w, 4, RpcConfig::default());
        for c in 1..4 {
            connect(&mut w, &mut ns, c, 3);
        }
        let mut ids = Vec::new();
        for round in 0..10u64 {
            // 8 requests on each of the 9 sessions at once: 72, more than a
            // burst holds.
            for (c, n) in ns.iter_mut().enumerate().skip(1) {
                for s in 0..3 {
                    let sn = n.ctx.sessions[s];
                    for k in 0..8u64 {
                        let id = round << 16 | (c as u64) << 8 | (s as u64) << 4 | k;
                        send(n, sn, BURST, id, 32);
                        ids.push((c, id));
                    }
                }
            }
            let want = ids.len();
            run_until(&mut w, &mut ns, 100_000, "round", |ns| {
                completions(ns) == want
            });
        }
        exactly_once(&ns, &ids);
        let s = &ns[0].ctx;
        let largest = bursts_add_up(s, ids.len());
        assert!(largest <= erpc::MAX_BURST);
        // Some burst held requests of several clients (each client's
        // sessions are distinct server sessions; the id names the client).
        let spans = s.bursts.iter().any(|(_, v)| {
            let clients: BTreeSet<u64> = v.iter().map(|(_, id)| id >> 8 & 0xff).collect();
            let sessions: BTreeSet<SessionNum> = v.iter().map(|(sn, _)| *sn).collect();
            clients.len() >= 2 && sessions.len() >= 4
        });
        assert!(
            spans,
            "no burst spanned clients: {:?}",
            s.bursts.iter().map(|b| b.1.len()).collect::<Vec<_>>()
        );
        assert!(largest > 8, "largest burst {largest}");
    });
}

#[test]
fn lost_and_reordered_requests_run_once_each() {
    with_seeds(
        "lost_and_reordered_requests_run_once_each",
        FILE,
        &[4, 5],
        |seed| {
            let link = LinkFaults {
                loss: 0.05,
                reorder: 0.02,
                ..common::LOSSY
            };
            let mut w = world(seed, link);
            let mut ns = nodes(&mut w, 3, RpcConfig::default());
            connect(&mut w, &mut ns, 1, 2);
            connect(&mut w, &mut ns, 2, 2);
            let mut ids = Vec::new();
            let types = [BURST, BURST, ORDINARY, BURST2];
            for round in 0..30u64 {
                for (c, n) in ns.iter_mut().enumerate().skip(1) {
                    for k in 0..16u64 {
                        let id = round << 16 | (c as u64) << 8 | k;
                        let sn = n.ctx.sessions[(k % 2) as usize];
                        // Some multi-packet ones (a burst of one each).
                        let len = if k == 5 { 3000 } else { 8 + (k as usize) * 20 };
                        send(n, sn, types[(k % 4) as usize], id, len);
                        ids.push((c, id));
                    }
                }
                let want = ids.len();
                run_until(&mut w, &mut ns, 1_000_000, "round", |ns| {
                    completions(ns) == want
                });
            }
            exactly_once(&ns, &ids);
            let retrans: u64 = ns[1..].iter().map(|n| n.rpc.stats().retransmissions).sum();
            assert!(retrans > 0, "loss recovery had work to do");
            let st = ns[0].rpc.stats();
            // Retransmissions of requests the server had reached it again.
            assert!(
                st.dup_req_resp_resent + st.drops(DropReason::DupReqInProgress) > 0,
                "{st}"
            );
            assert_eq!(st.burst_not_taken, 0);
        },
    );
}

#[test]
fn duplicated_requests_enter_no_burst_twice() {
    with_seeds(
        "duplicated_requests_enter_no_burst_twice",
        FILE,
        &[6],
        |seed| {
            // Every frame twice, no loss: each duplicate arrives right behind
            // its original, in the same RX burst while the original is queued
            // for its burst.
            let link = LinkFaults {
                duplicate: 1.0,
                ..erpc_sim::delayed_link(1_000, 0)
            };
            let mut w = world(seed, link);
            let mut ns = nodes(&mut w, 2, RpcConfig::default());
            connect(&mut w, &mut ns, 1, 2);
            let mut ids = Vec::new();
            for round in 0..10u64 {
                for k in 0..16u64 {
                    let id = round << 8 | k;
                    let sn = ns[1].ctx.sessions[(k % 2) as usize];
                    send(&mut ns[1], sn, BURST, id, 100);
                    ids.push((1, id));
                }
                let want = ids.len();
                run_until(&mut w, &mut ns, 100_000, "round", |ns| {
                    completions(ns) == want
                });
            }
            // Let late duplicates arrive and be dropped.
            run_for(&mut w, &mut ns, 1_000_000);
            exactly_once(&ns, &ids);
            bursts_add_up(&ns[0].ctx, ids.len());
            let st = ns[0].rpc.stats();
            assert!(st.drops(DropReason::DupReqInProgress) > 0, "{st}");
            assert_eq!(st.reqs_handled, ids.len() as u64, "{st}");
        },
    );
}

/// Polls every node for `dur_ns` of virtual time.
fn run_for(w: &mut W, ns: &mut [Node<T, Ctx>], dur_ns: u64) {
    let until = w.now_ns() + dur_ns;
    while w.now_ns() < until {
        for n in ns.iter_mut() {
            n.poll();
        }
        w.step();
    }
}

#[test]
fn a_burst_handler_defers_responses() {
    with_seeds("a_burst_handler_defers_responses", FILE, &[7], |seed| {
        let mut w = world(seed, erpc_sim::DEFAULT_LINK);
        let mut ns = nodes(&mut w, 2, RpcConfig::default());
        connect(&mut w, &mut ns, 1, 1);
        let mut ids = Vec::new();
        for k in 0..8u64 {
            let id = if k % 2 == 0 { k | DEFER } else { k };
            let sn = ns[1].ctx.sessions[0];
            send(&mut ns[1], sn, BURST, id, 64 + k as usize);
            ids.push((1, id));
        }
        run_until(&mut w, &mut ns, 100_000, "undeferred", |ns| {
            completions(ns) == 4
        });
        assert_eq!(ns[0].ctx.deferred.len(), 4);
        // Past the retransmission timeout: retransmissions of the kept
        // requests are answered "in progress", and the handler does not
        // run again.
        run_for(&mut w, &mut ns, 12_000_000);
        assert_eq!(completions(&ns), 4);
        // The kept requests' data was copied out of the RX ring.
        let st = ns[0].rpc.stats();
        assert_eq!(st.deferred_copies, 4, "{st}");
        assert!(st.in_progress_sent > 0, "{st}");
        let s = &mut ns[0];
        for (h, id) in std::mem::take(&mut s.ctx.deferred) {
            let data = s
                .rpc
                .request_data(&h)
                .expect("a deferred request's data")
                .to_vec();
            assert_eq!(id_of(&data), id);
            s.rpc.respond(h, &answer(&data)).expect("deferred respond");
        }
        run_until(&mut w, &mut ns, 100_000, "deferred", |ns| {
            completions(ns) == 8
        });
        exactly_once(&ns, &ids);
    });
}

#[test]
fn a_multi_packet_request_is_a_burst_of_one() {
    with_seeds(
        "a_multi_packet_request_is_a_burst_of_one",
        FILE,
        &[8],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, RpcConfig::default());
            connect(&mut w, &mut ns, 1, 2);
            let mut ids = Vec::new();
            let large = |k: u64| k.is_multiple_of(3);
            for k in 0..16u64 {
                let sn = ns[1].ctx.sessions[(k % 2) as usize];
                let len = if large(k) { 5000 + k as usize } else { 40 };
                send(&mut ns[1], sn, BURST, k, len);
                ids.push((1, k));
            }
            run_until(&mut w, &mut ns, 100_000, "requests", |ns| {
                completions(ns) == 16
            });
            exactly_once(&ns, &ids);
            let s = &ns[0].ctx;
            bursts_add_up(s, 16);
            for (_, v) in &s.bursts {
                if v.iter().any(|(_, id)| large(*id)) {
                    assert_eq!(v.len(), 1, "a multi-packet request came in a burst {v:?}");
                }
            }
            assert!(s.bursts.iter().any(|(_, v)| v.len() > 1));
            // Zero-copy RX off: every request is complete only as a msgbuf,
            // and alone.
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let cfg = RpcConfig {
                zero_copy_rx: false,
                ..RpcConfig::default()
            };
            let mut ns = nodes(&mut w, 2, cfg);
            connect(&mut w, &mut ns, 1, 1);
            for k in 0..8u64 {
                let sn = ns[1].ctx.sessions[0];
                send(&mut ns[1], sn, BURST, k, 40);
            }
            run_until(&mut w, &mut ns, 100_000, "requests", |ns| {
                completions(ns) == 8
            });
            no_errors(&ns);
            assert!(ns[0].ctx.bursts.iter().all(|(_, v)| v.len() == 1));
            assert_eq!(ns[0].ctx.bursts.len(), 8);
        },
    );
}

#[test]
fn a_request_not_taken_fails_with_declined() {
    with_seeds(
        "a_request_not_taken_fails_with_declined",
        FILE,
        &[9],
        |seed| {
            let mut w = world(seed, erpc_sim::DEFAULT_LINK);
            let mut ns = nodes(&mut w, 2, RpcConfig::default());
            connect(&mut w, &mut ns, 1, 1);
            let sn = ns[1].ctx.sessions[0];
            for k in 0..8u64 {
                let id = if k % 4 == 1 { k | DECLINE } else { k };
                send(&mut ns[1], sn, BURST, id, 50);
            }
            run_until(&mut w, &mut ns, 100_000, "requests", |ns| {
                completions(ns) == 8
            });
            no_errors(&ns);
            for k in 0..8u64 {
                let declined = k % 4 == 1;
                let id = if declined { k | DECLINE } else { k };
                let want = if declined {
                    Err(RpcError::Server {
                        session: sn,
                        err: ServerError::Declined,
                    })
                } else {
                    Ok(())
                };
                assert_eq!(ns[1].ctx.done[&id], vec![want], "request {id:#x}");
                assert_eq!(ns[0].ctx.runs.get(&id).copied(), (!declined).then_some(1));
            }
            let st = ns[0].rpc.stats();
            assert_eq!(st.burst_not_taken, 2, "{st}");
            assert_eq!(st.reqs_failed_at_server, 2, "{st}");
            // The slots serve the next requests.
            for k in 8..16u64 {
                send(&mut ns[1], sn, BURST, k, 50);
            }
            run_until(&mut w, &mut ns, 100_000, "more", |ns| completions(ns) == 16);
            let ids: Vec<(usize, u64)> = (8..16).map(|k| (1, k)).collect();
            exactly_once(&ns, &ids);
        },
    );
}

#[test]
fn session_resets_around_a_burst() {
    with_seeds("session_resets_around_a_burst", FILE, &[10], |seed| {
        let mut w = world(seed, erpc_sim::DEFAULT_LINK);
        let mut ns = nodes(&mut w, 2, RpcConfig::default());
        let baseline = in_use(&ns[0].rpc);
        connect(&mut w, &mut ns, 1, 3);
        let (a, b, c) = (
            ns[1].ctx.sessions[0],
            ns[1].ctx.sessions[1],
            ns[1].ctx.sessions[2],
        );
        // Session a: an ordinary handler resets the session before the
        // burst runs; its queued burst requests never run. Session b: the
        // burst handler resets it while it runs; the responses are
        // discarded. Session c: untouched.
        send(&mut ns[1], a, RESETTER, 0xa0, 20);
        for k in 1..4u64 {
            send(&mut ns[1], a, BURST, 0xa0 | k, 20);
        }
        send(&mut ns[1], b, BURST, 0xb0 | RESET, 20);
        for k in 1..4u64 {
            send(&mut ns[1], b, BURST, 0xb0 | k, 20);
            send(&mut ns[1], c, BURST, 0xc0 | k, 20);
        }
        run_until(&mut w, &mut ns, 2_000_000, "requests", |ns| {
            completions(ns) == 11
        });
        no_errors(&ns);
        for k in 1..4u64 {
            assert_eq!(
                ns[0].ctx.runs.get(&(0xa0 | k)),
                None,
                "ran after its session's reset"
            );
            assert_eq!(ns[0].ctx.runs.get(&(0xb0 | k)), Some(&1));
            assert_eq!(ns[1].ctx.done[&(0xc0 | k)], vec![Ok(())]);
            assert!(ns[1].ctx.done[&(0xa0 | k)][0].is_err());
            assert!(ns[1].ctx.done[&(0xb0 | k)][0].is_err());
        }
        // The reset server sessions are gone, with their buffers, and the
        // RX ring reservations.
        ns[1].rpc.destroy_session(c).expect("destroy");
        run_until(&mut w, &mut ns, 2_000_000, "teardown", |ns| {
            ns[0].rpc.num_sessions() == 0 && ns[1].rpc.num_sessions() == 0
        });
        let (free, total) = ns[0].rpc.rx_ring_unreserved();
        assert_eq!(free, total);
        assert_eq!(in_use(&ns[0].rpc), baseline);
        let st = ns[0].rpc.stats();
        assert_eq!(st.sessions_reset, 2, "{st}");
    });
}

fn in_use<C>(rpc: &Rpc<T, C>) -> u64 {
    rpc.alloc_stats().classes.iter().map(|c| c.in_use).sum()
}

#[test]
fn a_handler_of_the_wrong_type_is_refused() {
    // Burst handlers are registered type-erased and checked when an Rpc
    // copies the table, as dispatch handlers are.
    let mut w = world(11, erpc_sim::DEFAULT_LINK);
    let nexus = w
        .nexus("node-0:31850")
        .burst_handler::<T, u32>(BURST, |_, _, _| {})
        .build()
        .expect("nexus");
    let t = w.transport();
    let a = w.allocator(1 << 20);
    let e = Rpc::<T, Ctx>::builder(&nexus, t, a).build().unwrap_err();
    assert!(
        matches!(
            e,
            erpc::CreateError::HandlerType {
                req_type: BURST,
                ..
            }
        ),
        "{e}"
    );
    let dup = w
        .nexus("node-1:31850")
        .burst_handler::<T, Ctx>(BURST, b_echo)
        .handler::<T, Ctx>(BURST, h_ordinary)
        .build();
    assert!(matches!(
        dup,
        Err(erpc::NexusError::DuplicateHandler(BURST))
    ));
}

#[test]
fn a_burst_hands_out_its_handles_once() {
    fn b_take_all(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, b: &mut Burst<'_>) {
        let first = b.take(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.take(0)));
        assert!(r.is_err(), "a second take of one request panics");
        let mut n = 1;
        rpc.respond(first, &answer(b.data(0))).expect("respond");
        for (h, d) in b.take_all() {
            n += 1;
            rpc.respond(h, &answer(d)).expect("respond");
        }
        assert_eq!(b.take_all().count(), 0);
        assert_eq!(n, b.len());
        ctx.bursts.push((b.req_type(), Vec::new()));
    }
    let mut w = world(12, erpc_sim::DEFAULT_LINK);
    let mut ns: Vec<Node<T, Ctx>> = (0..2)
        .map(|i| {
            let nexus = w
                .nexus(&format!("node-{i}:31850"))
                .burst_handler::<T, Ctx>(BURST, b_take_all)
                .build()
                .expect("nexus");
            Node::new(
                &mut w,
                &nexus,
                0,
                Ctx::default(),
                RpcConfig::default(),
                None,
            )
        })
        .collect();
    connect(&mut w, &mut ns, 1, 1);
    let sn = ns[1].ctx.sessions[0];
    for k in 0..8u64 {
        send(&mut ns[1], sn, BURST, k, 30);
    }
    run_until(&mut w, &mut ns, 100_000, "requests", |ns| {
        completions(ns) == 8
    });
    no_errors(&ns);
    assert!(ns[1].ctx.done.values().all(|v| v == &[Ok(())]));
}
