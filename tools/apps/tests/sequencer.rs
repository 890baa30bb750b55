//! The sequencer on eRPC's simulated network and on the device model, in
//! virtual time: many client sessions against a server with two Rpcs that
//! share the counter, under packet loss, with a client that crashes with
//! requests outstanding; per-request and burst
//! handlers. The audit uses the server's log of every number handed out:
//! each number below the counter was taken by exactly one request, every
//! number a client received is the one the server gave that very request,
//! and each number no one received belongs to a request that failed or was
//! outstanding when its client crashed. A failure prints its replay
//! command.

mod common;

use std::collections::{HashMap, HashSet};

use erpc::Rpc;
use erpc_apps::env::{DevWorld, SimWorld, World};
use erpc_apps::sequencer::{self, Counter, Grant, Handlers, SeqClient, SeqServer};
use erpc_sim::LinkFaults;

const FILE: &str = "sequencer";

fn with_seeds(test: &str, defaults: &[u64], f: impl Fn(u64)) {
    common::with_seeds(FILE, test, defaults, f);
}

fn handlers() -> Vec<Handlers> {
    vec![Handlers::PerRequest, Handlers::Burst]
}

/// A client's record at the end (or at its crash).
struct Record {
    id: u32,
    got: Vec<(u64, u64)>,
    failed: Vec<u64>,
    sent: u64,
    crashed: bool,
}

struct Run {
    taken: u64,
    log: Vec<Grant>,
    clients: Vec<Record>,
}

/// `clients` client processes with `sessions` sessions each (spread over
/// the server's two Rpcs), `window` in flight; client `crash` (if any)
/// crashes once it has `crash_after` answers; the rest go on until each
/// has `answers`. `meddle` may change the counter once, midway.
#[allow(clippy::too_many_arguments)]
fn run<W: World>(
    w: &mut W,
    h: Handlers,
    clients: usize,
    sessions: usize,
    window: usize,
    answers: usize,
    crash: Option<(usize, usize)>,
    meddle: impl Fn(&Counter),
) -> Run {
    let su = w.uri("server");
    let snx = sequencer::register::<W::T>(w.nexus(&su), h)
        .workers(0)
        .build()
        .unwrap();
    let counter = sequencer::counter();
    let mut servers = Vec::new();
    for i in 0..2u8 {
        let (tr, a, _) = w.endpoint();
        let rpc: Rpc<W::T, SeqServer> = Rpc::builder(&snx, tr, a).id(i).build().unwrap();
        let mut st = SeqServer::new(counter.clone());
        st.log = Some(Vec::with_capacity(clients * answers * 2));
        servers.push((rpc, st));
    }
    let mut cs = Vec::new();
    for c in 0..clients {
        let cu = w.uri(&format!("client{c}"));
        let nx = w.nexus(&cu).workers(0).build().unwrap();
        let (tr, a, ep) = w.endpoint();
        let mut rpc: Rpc<W::T, SeqClient> = Rpc::builder(&nx, tr, a).build().unwrap();
        let sns = (0..sessions)
            .map(|s| rpc.create_session(&su, ((c + s) % 2) as u8).unwrap())
            .collect();
        cs.push(Some((
            nx,
            rpc,
            SeqClient::new(c as u32, sns, window),
            cu,
            ep,
        )));
    }
    let mut records: Vec<Option<Record>> = (0..clients).map(|_| None).collect();
    let mut meddled = false;
    // No time bound: the loop only waits for what it causes itself.
    loop {
        for (c, slot) in cs.iter_mut().enumerate() {
            let crash_now = match slot {
                None => continue,
                Some((_, rpc, st, _, _)) => {
                    rpc.run_event_loop_once(st);
                    st.drive(rpc);
                    crash.is_some_and(|(who, after)| who == c && st.got.len() >= after)
                }
            };
            if crash_now {
                // The process dies here: what it received so far is what
                // was handed to it.
                let (nx, rpc, st, uri, ep) = slot.take().expect("live");
                assert!(st.in_flight() > 0, "a crash with requests outstanding");
                w.crash(ep, &uri);
                records[c] = Some(Record {
                    id: st.id,
                    got: st.got.clone(),
                    failed: st.failed.clone(),
                    sent: st.sent(),
                    crashed: true,
                });
                drop(rpc);
                drop(nx);
            }
        }
        for (rpc, st) in servers.iter_mut() {
            rpc.run_event_loop_once(st);
        }
        w.step();
        let live = || cs.iter().flatten();
        if !meddled && live().all(|(_, _, st, _, _)| st.got.len() >= answers / 2) {
            meddled = true;
            meddle(&counter);
        }
        if live().all(|(_, _, st, _, _)| st.got.len() + st.failed.len() >= answers) {
            break;
        }
    }
    for (_, _, st, _, _) in cs.iter_mut().flatten() {
        st.running = false;
    }
    while cs
        .iter()
        .flatten()
        .any(|(_, _, st, _, _)| st.in_flight() > 0)
    {
        for (_, rpc, st, _, _) in cs.iter_mut().flatten() {
            rpc.run_event_loop_once(st);
        }
        for (rpc, st) in servers.iter_mut() {
            rpc.run_event_loop_once(st);
        }
        w.step();
    }
    for (c, slot) in cs.into_iter().enumerate() {
        if let Some((_, _, st, _, _)) = slot {
            records[c] = Some(Record {
                id: st.id,
                sent: st.sent(),
                got: st.got,
                failed: st.failed,
                crashed: false,
            });
        }
    }
    let mut log = Vec::new();
    for (_, st) in servers.iter_mut() {
        assert_eq!((st.stats.bad, st.stats.respond_errors), (0, 0));
        log.extend(st.log.take().unwrap());
    }
    Run {
        taken: counter.load(std::sync::atomic::Ordering::Acquire),
        log,
        clients: records.into_iter().map(Option::unwrap).collect(),
    }
}

/// The audit with the server's log; returns the gaps.
fn audit(r: &Run) -> usize {
    // Every number below the counter was taken by exactly one request.
    let mut by_x: HashMap<u64, (u32, u64)> = HashMap::new();
    for g in &r.log {
        assert!(g.x < r.taken, "{g:?} at or above the counter {}", r.taken);
        assert!(
            by_x.insert(g.x, (g.client, g.seq)).is_none(),
            "number {} handed out twice",
            g.x
        );
    }
    assert_eq!(by_x.len() as u64, r.taken, "a number taken by no request");
    // A request executed once: no (client, seq) took two numbers.
    let reqs: HashSet<(u32, u64)> = by_x.values().copied().collect();
    assert_eq!(reqs.len(), by_x.len(), "a request took two numbers");
    // Every number received is the one its own request took.
    let mut received = HashSet::new();
    for c in &r.clients {
        for &(seq, x) in &c.got {
            assert_eq!(
                by_x.get(&x),
                Some(&(c.id, seq)),
                "client {} seq {seq} got {x}",
                c.id
            );
            assert!(received.insert(x), "number {x} received twice");
        }
    }
    // Each gap is the number of a request that failed or was lost to a crash.
    let mut gaps = 0;
    for (&x, &(client, seq)) in &by_x {
        if received.contains(&x) {
            continue;
        }
        gaps += 1;
        let c = &r.clients[client as usize];
        let answered: HashSet<u64> = c.got.iter().map(|g| g.0).collect();
        let explained =
            c.failed.contains(&seq) || (c.crashed && seq < c.sent && !answered.contains(&seq));
        assert!(
            explained,
            "gap {x}: client {client} seq {seq} neither failed nor crashed"
        );
    }
    // A live client lost nothing silently.
    for c in r.clients.iter().filter(|c| !c.crashed) {
        assert_eq!(
            c.got.len() + c.failed.len(),
            c.sent as usize,
            "client {}",
            c.id
        );
    }
    // The binary's audit (without the log) agrees.
    let lost = r
        .clients
        .iter()
        .map(|c| {
            c.failed.len() as u64
                + if c.crashed {
                    c.sent - c.got.len() as u64 - c.failed.len() as u64
                } else {
                    0
                }
        })
        .sum();
    let a = sequencer::audit(r.taken, r.clients.iter().map(|c| &c.got[..]), lost);
    assert!(a.ok(), "{a}");
    assert_eq!(a.gaps, gaps as u64);
    gaps
}

#[test]
fn every_number_once_across_loss_and_a_client_crash() {
    with_seeds(
        "every_number_once_across_loss_and_a_client_crash",
        &[1, 2, 3],
        |seed| {
            for h in handlers() {
                let mut w = SimWorld::new(
                    seed,
                    LinkFaults {
                        loss: 0.01,
                        ..erpc_sim::delayed_link(1_000, 0)
                    },
                );
                let r = run(&mut w, h, 4, 4, 24, 1_500, Some((3, 400)), |_| {});
                let gaps = audit(&r);
                let crashed = &r.clients[3];
                assert!(crashed.crashed && crashed.got.len() >= 400);
                assert!(
                    gaps > 0,
                    "{h}: the crashed client's outstanding requests left no gap \
                     (they never reached the server?)"
                );
            }
        },
    );
}

#[test]
fn without_faults_the_numbers_are_exactly_the_counter() {
    for h in handlers() {
        let mut w = SimWorld::new(4, erpc_sim::DEFAULT_LINK);
        let r = run(&mut w, h, 3, 8, 48, 2_000, None, |_| {});
        assert_eq!(audit(&r), 0, "{h}: no failure, no gap");
        let received: usize = r.clients.iter().map(|c| c.got.len()).sum();
        assert_eq!(received as u64, r.taken);
    }
}

#[test]
fn the_device_model_hands_out_every_number_once() {
    for h in handlers() {
        let mut w = DevWorld::deterministic(5, erpc_apps::env::region(16));
        let r = run(&mut w, h, 2, 4, 32, 1_000, None, |_| {});
        assert_eq!(audit(&r), 0, "{h}");
    }
}

/// The audit is not vacuous: a counter that goes back hands a number out
/// twice, and the check says so.
#[test]
fn a_counter_that_goes_back_is_caught() {
    let mut w = SimWorld::new(6, erpc_sim::DEFAULT_LINK);
    let r = run(&mut w, Handlers::PerRequest, 2, 2, 8, 300, None, |c| {
        c.store(10, std::sync::atomic::Ordering::Relaxed)
    });
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| audit(&r)));
    assert!(caught.is_err(), "a duplicate went unnoticed");
    let lost = 0;
    let a = sequencer::audit(r.taken, r.clients.iter().map(|c| &c.got[..]), lost);
    assert!(a.duplicates > 0 && !a.ok(), "{a}");
}
