//! The HERD-style store on eRPC's simulated network and on the device
//! model, in virtual time: several client processes against a server
//! whose keys are partitioned over two Rpcs, uniform and Zipf keys, with
//! packet loss, per-request and burst handlers; every
//! answer checked against the clients' model and every written key read
//! back. One thread, virtual clock; a failure prints its replay command.

mod common;

use erpc::{Nexus, Rpc};
use erpc_apps::env::{DevWorld, SimWorld, World};
use erpc_apps::herd::{self, ClientConfig, Handlers, KeyDist, KvClient, KvServer};
use erpc_sim::LinkFaults;

const FILE: &str = "herd";

fn with_seeds(test: &str, defaults: &[u64], f: impl Fn(u64)) {
    common::with_seeds(FILE, test, defaults, f);
}

fn handlers() -> Vec<Handlers> {
    vec![Handlers::PerRequest, Handlers::Burst]
}

struct Setup {
    keys: u64,
    parts: usize,
    clients: usize,
    dist: KeyDist,
    puts_per_mille: u64,
    /// Answers per client before the read-back.
    answers: u64,
}

/// Runs the store; returns the clients and servers after the read-back.
/// `tamper` may change the server's tables after the preload.
fn run<W: World>(
    w: &mut W,
    h: Handlers,
    s: &Setup,
    seed: u64,
    tamper: impl FnOnce(&mut [herd::Table]),
) -> (Vec<KvClient>, Vec<KvServer>) {
    let su = w.uri("server");
    let snx: std::sync::Arc<Nexus> = herd::register::<W::T>(w.nexus(&su), h)
        .workers(0)
        .build()
        .unwrap();
    let mut tables = herd::preload(s.keys, s.parts);
    tamper(&mut tables);
    let mut servers = Vec::new();
    for (i, t) in tables.into_iter().enumerate() {
        let (tr, a, _) = w.endpoint();
        let rpc: Rpc<W::T, KvServer> = Rpc::builder(&snx, tr, a).id(i as u8).build().unwrap();
        servers.push((rpc, KvServer::new(t)));
    }
    let mut clients = Vec::new();
    let mut cnx = Vec::new();
    for c in 0..s.clients {
        let cu = w.uri(&format!("client{c}"));
        let nx = w.nexus(&cu).workers(0).build().unwrap();
        let (tr, a, _) = w.endpoint();
        let mut rpc: Rpc<W::T, KvClient> = Rpc::builder(&nx, tr, a).build().unwrap();
        let sessions = (0..s.parts)
            .map(|p| vec![rpc.create_session(&su, p as u8).unwrap()])
            .collect();
        let st = KvClient::new(
            ClientConfig {
                id: c as u32,
                clients: s.clients as u32,
                keys: s.keys,
                dist: s.dist,
                puts_per_mille: s.puts_per_mille,
                window: 12,
                rate: 0.0,
                seed: seed * 100 + c as u64,
            },
            sessions,
        )
        .unwrap();
        cnx.push(nx);
        clients.push((rpc, st));
    }
    let poll = |w: &mut W,
                clients: &mut Vec<(Rpc<W::T, KvClient>, KvClient)>,
                servers: &mut Vec<(Rpc<W::T, KvServer>, KvServer)>| {
        for (rpc, st) in clients.iter_mut() {
            rpc.run_event_loop_once(st);
            st.drive(rpc);
        }
        for (rpc, st) in servers.iter_mut() {
            rpc.run_event_loop_once(st);
        }
        w.step();
    };
    // No time bound: the loop only waits for what it causes itself.
    while clients.iter().any(|(_, st)| st.answered() < s.answers) {
        poll(w, &mut clients, &mut servers);
    }
    for (_, st) in clients.iter_mut() {
        st.start_read_back();
    }
    while clients.iter().any(|(_, st)| st.reading_back()) {
        poll(w, &mut clients, &mut servers);
    }
    (
        clients.into_iter().map(|(_, st)| st).collect(),
        servers.into_iter().map(|(_, st)| st).collect(),
    )
}

fn check(clients: &[KvClient], servers: &[KvServer], s: &Setup) {
    for c in clients {
        assert_eq!(
            (c.wrong, c.errors),
            (0, 0),
            "first wrong answer: {:?}",
            c.first_wrong
        );
        assert!(c.gets > s.answers / 2, "{}", c.gets);
        if s.puts_per_mille > 0 {
            assert!(
                c.puts > 0 && c.read_back > 0,
                "{} PUTs, {} read back",
                c.puts,
                c.read_back
            );
        }
    }
    for sv in servers {
        assert_eq!(
            (sv.stats.bad, sv.stats.full, sv.stats.respond_errors),
            (0, 0, 0)
        );
        assert!(sv.stats.gets > 0, "every partition served");
        assert_eq!(sv.stats.bursts > 0, sv.stats.burst_reqs > 0);
    }
}

#[test]
fn concurrent_clients_under_loss_get_what_the_model_allows() {
    with_seeds(
        "concurrent_clients_under_loss_get_what_the_model_allows",
        &[1, 2],
        |seed| {
            for h in handlers() {
                for dist in [KeyDist::Uniform, KeyDist::Zipf(0.99)] {
                    let s = Setup {
                        keys: 2_000,
                        parts: 2,
                        clients: 3,
                        dist,
                        puts_per_mille: 200,
                        answers: 1_500,
                    };
                    let mut w = SimWorld::new(
                        seed,
                        LinkFaults {
                            loss: 0.005,
                            ..erpc_sim::delayed_link(1_000, 0)
                        },
                    );
                    let (c, sv) = run(&mut w, h, &s, seed, |_| {});
                    check(&c, &sv, &s);
                    if h == Handlers::Burst {
                        let (b, r): (u64, u64) = sv.iter().fold((0, 0), |(b, r), x| {
                            (b + x.stats.bursts, r + x.stats.burst_reqs)
                        });
                        assert!(r > b, "bursts of more than one request: {r} in {b}");
                    }
                }
            }
        },
    );
}

#[test]
fn the_device_model_serves_both_handler_kinds() {
    for h in handlers() {
        let s = Setup {
            keys: 5_000,
            parts: 2,
            clients: 2,
            dist: KeyDist::Zipf(0.99),
            puts_per_mille: 50,
            answers: 1_000,
        };
        let mut w = DevWorld::deterministic(3, erpc_apps::env::region(16));
        let (c, sv) = run(&mut w, h, &s, 3, |_| {});
        check(&c, &sv, &s);
    }
}

/// The model is not vacuous: a server that holds a version its owner never
/// wrote (a lost or phantom PUT) is caught, and so is another key's value.
#[test]
fn the_model_catches_a_store_that_lies() {
    for (what, version, writer, other) in [
        ("a phantom version", 7u64, 1u64, false),
        ("another key's value", 0, 0, true),
    ] {
        let s = Setup {
            keys: 20,
            parts: 1,
            clients: 1,
            dist: KeyDist::Uniform,
            puts_per_mille: 0,
            answers: 200,
        };
        let mut w = SimWorld::new(1, erpc_sim::DEFAULT_LINK);
        let (c, _) = run(&mut w, Handlers::PerRequest, &s, 1, |t| {
            let k = herd::key(3);
            let v = if other {
                herd::value_for(&herd::key(4), version, writer)
            } else {
                herd::value_for(&k, version, writer)
            };
            t[0].put(&k, &v).unwrap();
        });
        assert!(c[0].wrong > 0, "{what} went unnoticed");
        assert!(
            c[0].first_wrong.as_deref().unwrap().contains("key 3"),
            "{what}: {:?}",
            c[0].first_wrong
        );
    }
}
