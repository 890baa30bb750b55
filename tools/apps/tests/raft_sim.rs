//! The Raft key-value store on the deterministic simulated network and on
//! the device model in virtual time: election, replication, leader crash
//! and failover with client retries, partition and heal (with snapshot
//! catch-up in chunks), and a linearizability check of the history under
//! packet loss and a crash. Every run is one thread on a virtual clock and
//! replays exactly from its seed; a failure prints the replay command.

mod common;

use erpc_apps::env::{DevWorld, SimWorld, World};
use erpc_apps::lincheck;
use erpc_apps::raftkv::client::{MixedWorkload, PutWorkload, ReadBack};
use erpc_apps::raftkv::{ClientConfig, Cluster, ReplicaConfig};
use erpc_sim::LinkFaults;

const FILE: &str = "raft_sim";
/// Polls of 1 µs of virtual time.
const MS: u64 = 1_000;

fn with_seeds(test: &str, defaults: &[u64], f: impl Fn(u64)) {
    common::with_seeds(FILE, test, defaults, f);
}

fn replica_cfg(
    snapshot_every: u64,
) -> impl Fn(u64, Vec<erpc_apps::raftkv::PeerAddr>) -> ReplicaConfig {
    move |id, peers| ReplicaConfig {
        snapshot_every,
        snapshot_keep: snapshot_every / 4,
        snap_chunk_bytes: 4 << 10,
        ..ReplicaConfig::new(id, peers)
    }
}

fn client_cfg(
    id: u64,
    lanes: usize,
    history: bool,
) -> impl FnOnce(Vec<erpc_apps::raftkv::PeerAddr>) -> ClientConfig {
    move |replicas| ClientConfig {
        lanes,
        record_history: history,
        ..ClientConfig::new(id, replicas)
    }
}

/// eRPC failure timeout in the tests (keep-alives every 10 ms).
const FAILURE_MS: u64 = 100;

fn sim(seed: u64, link: LinkFaults, snapshot_every: u64) -> Cluster<SimWorld> {
    Cluster::new(
        SimWorld::new(seed, link),
        3,
        FAILURE_MS,
        replica_cfg(snapshot_every),
    )
    .expect("cluster")
}

fn elect<W: World>(c: &mut Cluster<W>) -> usize {
    c.run_until(500 * MS, "election", |c| c.leader().is_some())
        .unwrap();
    c.leader().unwrap()
}

/// Writes with `workload` until done, then reads every acknowledged key
/// back through the (current) leader and checks it.
fn finish_and_read_back<W: World>(c: &mut Cluster<W>, client: usize) -> (u64, usize) {
    c.run_until(20_000 * MS, "writes done", |c| c.clients_idle())
        .unwrap();
    let acked = c.clients[client]
        .state
        .workload_as::<PutWorkload>()
        .expect("a PutWorkload")
        .acked
        .clone();
    let n = acked.len();
    c.clients[client]
        .state
        .set_workload(Box::new(ReadBack::new(&acked, 32)));
    c.run_until(20_000 * MS, "read back", |c| c.clients_idle())
        .unwrap();
    let rb = c.clients[client]
        .state
        .workload_as::<ReadBack>()
        .expect("the read-back");
    assert_eq!(rb.remaining(), 0);
    assert!(
        rb.wrong.is_empty() && rb.missing.is_empty(),
        "acknowledged writes lost: {} wrong, {} missing (first: {:?} {:?})",
        rb.wrong.len(),
        rb.missing.len(),
        rb.wrong.first(),
        rb.missing.first()
    );
    assert_eq!(rb.matched, n as u64);
    (rb.matched, n)
}

#[test]
fn a_leader_is_elected_and_writes_commit_on_every_replica() {
    with_seeds(
        "a_leader_is_elected_and_writes_commit_on_every_replica",
        &[1, 2],
        |seed| {
            let mut c = sim(seed, erpc_sim::DEFAULT_LINK, 1 << 40);
            let leader = elect(&mut c);
            c.add_client(
                client_cfg(1, 4, false),
                Box::new(PutWorkload::preload(400, 4)),
            )
            .unwrap();
            let (matched, _) = finish_and_read_back(&mut c, 0);
            assert_eq!(matched, 400);
            // Every replica applied everything (followers learn the commit
            // index with the next append or heartbeat).
            let top = c.replicas[leader].as_ref().unwrap().state.applied();
            c.run_until(100 * MS, "followers caught up", |c| {
                c.replicas
                    .iter()
                    .flatten()
                    .all(|r| r.state.applied() == top && r.state.state_machine().len() == 400)
            })
            .unwrap();
            let s = &c.replicas[leader].as_ref().unwrap().state.stats;
            assert_eq!(s.puts_applied, 400);
            assert!(s.commit_latency.len() >= 400);
            // The followers' replies rode back in the leader's requests'
            // responses.
            for r in c.replicas.iter().flatten() {
                let s = &r.state.stats;
                assert_eq!(s.bad, 0, "{s:?}");
                if !r.state.is_leader() {
                    assert!(s.msgs_piggybacked * 10 >= s.msgs_out * 9, "{s:?}");
                }
            }
        },
    );
}

#[test]
fn leader_crash_fails_over_and_loses_no_acknowledged_write() {
    with_seeds(
        "leader_crash_fails_over_and_loses_no_acknowledged_write",
        &[3, 4],
        |seed| {
            let mut c = sim(seed, erpc_sim::DEFAULT_LINK, 1 << 40);
            let old = elect(&mut c);
            c.add_client(
                client_cfg(2, 4, false),
                Box::new(PutWorkload::random(10_000, 4, 150, seed)),
            )
            .unwrap();
            c.run_until(1_000 * MS, "some writes", |c| {
                c.clients[0].state.stats.puts >= 100
            })
            .unwrap();
            c.crash(old);
            let new = c
                .run_until(2_000 * MS, "new leader", |c| c.leader().is_some())
                .map(|_| c.leader().unwrap())
                .unwrap();
            assert_ne!(new, old);
            finish_and_read_back(&mut c, 0);
            let s = &c.clients[0].state.stats;
            assert_eq!(s.puts, 600);
            assert!(
                s.rpc_errors + s.timeouts + s.redirects + s.retries > 0,
                "the client noticed the failover: {s:?}"
            );
        },
    );
}

#[test]
fn an_isolated_leader_steps_down_and_catches_up_by_snapshot_after_the_heal() {
    with_seeds(
        "an_isolated_leader_steps_down_and_catches_up_by_snapshot_after_the_heal",
        &[5, 6],
        |seed| {
            // Snapshots every 100 entries, sent in 4 KiB chunks.
            let mut c = sim(seed, erpc_sim::DEFAULT_LINK, 100);
            let old = elect(&mut c);
            c.add_client(
                client_cfg(3, 4, false),
                Box::new(PutWorkload::random(2_000, 4, 200, seed)),
            )
            .unwrap();
            c.run_until(1_000 * MS, "some writes", |c| {
                c.clients[0].state.stats.puts >= 50
            })
            .unwrap();
            c.isolate(old, true);
            // The majority elects a new leader; the old one loses its
            // quorum and steps down (check-quorum).
            c.run_until(2_000 * MS, "new leader", |c| {
                c.leader().is_some_and(|l| l != old)
                    && !c.replicas[old].as_ref().unwrap().state.is_leader()
            })
            .unwrap();
            // Writes go on without it, past a few snapshots.
            c.run_until(5_000 * MS, "writes without the old leader", |c| {
                c.clients[0].state.stats.puts >= 600
            })
            .unwrap();
            c.isolate(old, false);
            let (matched, _) = finish_and_read_back(&mut c, 0);
            assert!(matched > 0);
            let top = c.replicas[c.leader().unwrap()]
                .as_ref()
                .unwrap()
                .state
                .applied();
            c.run_until(2_000 * MS, "the healed replica caught up", |c| {
                c.replicas[old].as_ref().unwrap().state.applied() >= top
            })
            .unwrap();
            let healed = &c.replicas[old].as_ref().unwrap().state;
            assert!(
                healed.stats.snapshots_applied >= 1,
                "caught up from a snapshot: {:?}",
                healed.stats
            );
            let sent: u64 = c
                .replicas
                .iter()
                .flatten()
                .map(|r| r.state.stats.snap_chunks_sent)
                .sum();
            assert!(sent > 1, "the snapshot went in chunks ({sent})");
            let leader_sm = c.replicas[c.leader().unwrap()]
                .as_ref()
                .unwrap()
                .state
                .state_machine()
                .clone();
            c.run_until(100 * MS, "same state", |c| {
                c.replicas[old].as_ref().unwrap().state.state_machine() == &leader_sm
            })
            .unwrap();
        },
    );
}

#[test]
fn histories_stay_linearizable_under_loss_and_a_leader_crash() {
    with_seeds(
        "histories_stay_linearizable_under_loss_and_a_leader_crash",
        &[7, 8, 9],
        |seed| {
            let link = LinkFaults {
                loss: 0.005,
                duplicate: 0.002,
                reorder: 0.005,
                ..erpc_sim::delayed_link(1_000, 2_000)
            };
            let mut c = sim(seed, link, 50);
            let old = elect(&mut c);
            for id in 0..2 {
                c.add_client(
                    client_cfg(10 + id, 3, true),
                    Box::new(MixedWorkload::new(3, 3, 60, 40, seed * 10 + id)),
                )
                .unwrap();
            }
            c.run_until(2_000 * MS, "some operations", |c| {
                c.clients.iter().map(|k| k.state.stats.puts).sum::<u64>() >= 40
            })
            .unwrap();
            c.crash(old);
            c.run_until(20_000 * MS, "all operations", |c| c.clients_idle())
                .unwrap();
            let history: Vec<lincheck::HistOp> = c
                .clients
                .iter()
                .flat_map(|k| k.state.history().iter().copied())
                .collect();
            assert_eq!(history.len(), 2 * 3 * 60);
            let stats = lincheck::check(&history, 1 << 22).unwrap_or_else(|v| {
                panic!("not linearizable:\n{v}");
            });
            assert_eq!(stats.keys, 3);
            let lost: u64 = c
                .clients
                .iter()
                .map(|k| k.state.stats.rpc_errors + k.state.stats.timeouts)
                .sum();
            assert!(lost > 0, "the crash was noticed");
        },
    );
}

#[test]
fn the_checker_catches_a_store_that_loses_writes() {
    // The same workload against a cluster whose replicas answer from a
    // store that forgets: simulated by dropping every other acknowledged
    // PUT from the history's reads. A checker that passed this would
    // prove nothing.
    let mut c = sim(11, erpc_sim::DEFAULT_LINK, 1 << 40);
    elect(&mut c);
    c.add_client(
        client_cfg(20, 2, true),
        Box::new(MixedWorkload::new(2, 2, 40, 50, 11)),
    )
    .unwrap();
    c.run_until(5_000 * MS, "all operations", |c| c.clients_idle())
        .unwrap();
    let mut history = c.clients[0].state.history().to_vec();
    assert!(lincheck::check(&history, 1 << 22).is_ok());
    // A read that began after a write of its key had been acknowledged
    // must see a value (nothing deletes): make one see "absent".
    let acked_put_before = |h: &[lincheck::HistOp], key: u64, t: u64| {
        h.iter().any(|p| {
            p.key == key
                && matches!(p.op, lincheck::RegOp::Put(_))
                && p.ret_ns.is_some_and(|r| r < t)
        })
    };
    let victim = (0..history.len()).find(|&i| {
        let o = history[i];
        matches!(o.op, lincheck::RegOp::Get(Some(_)))
            && acked_put_before(&history, o.key, o.call_ns)
    });
    let i = victim.expect("a read after an acknowledged write");
    history[i].op = lincheck::RegOp::Get(None);
    assert!(lincheck::check(&history, 1 << 22).is_err());
}

#[test]
fn failover_on_the_device_model_fabric() {
    with_seeds("failover_on_the_device_model_fabric", &[12], |seed| {
        let world = DevWorld::deterministic(seed, erpc_apps::env::region(64));
        let mut c = Cluster::new(world, 3, FAILURE_MS, replica_cfg(1 << 40)).expect("cluster");
        let old = elect(&mut c);
        c.add_client(
            client_cfg(30, 2, false),
            Box::new(PutWorkload::random(1_000, 2, 100, seed)),
        )
        .unwrap();
        c.run_until(1_000 * MS, "some writes", |c| {
            c.clients[0].state.stats.puts >= 40
        })
        .unwrap();
        c.crash(old);
        c.run_until(2_000 * MS, "new leader", |c| c.leader().is_some())
            .unwrap();
        assert_ne!(c.leader(), Some(old));
        let (matched, n) = finish_and_read_back(&mut c, 0);
        assert_eq!(matched, n as u64);
        assert_eq!(c.clients[0].state.stats.puts, 200);
    });
}
