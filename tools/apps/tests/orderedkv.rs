//! The ordered key-value store over eRPC's simulated network: GETs, PUTs
//! and 128-key SCANs, every answer checked, with scans in the dispatch
//! thread, on inline workers (virtual time, deterministic), and on real
//! worker threads under both dispatch policies.

use erpc::{Rpc, SessionEventKind, WorkerDispatch};
use erpc_apps::env::{SimWorld, World};
use erpc_apps::orderedkv::{self, LoadConfig, LoadState, ScanMode, ServerState};
use erpc_apps::raftkv::client::key;

fn on_sm<T: transport::Transport>(
    _rpc: &mut Rpc<T, LoadState>,
    st: &mut LoadState,
    ev: erpc::SessionEvent,
) {
    if ev.kind == SessionEventKind::Connected {
        st.set_session(ev.session);
    }
}

/// Runs `requests` requests (a tenth SCANs) and returns the client.
fn run(mode: ScanMode, workers: usize, policy: WorkerDispatch, requests: u64) -> LoadState {
    let mut w = SimWorld::new(1, erpc_sim::DEFAULT_LINK);
    let index = orderedkv::load(5_000);
    let server_nexus =
        orderedkv::register::<erpc_sim::SimTransport>(w.nexus("server:31850"), index.clone(), mode)
            .workers(workers)
            .worker_dispatch(policy)
            .build()
            .unwrap();
    let client_nexus = w.nexus("client:31850").build().unwrap();
    let (st, sa, _) = w.endpoint();
    let (ct, ca, _) = w.endpoint();
    let mut server = Rpc::builder(&server_nexus, st, sa).build().unwrap();
    let mut sstate = ServerState::new(index.clone());
    let mut client = Rpc::builder(&client_nexus, ct, ca)
        .session_handler(on_sm::<erpc_sim::SimTransport>)
        .build()
        .unwrap();
    let mut load = LoadState::new(LoadConfig {
        keys: 5_000,
        window: 8,
        scans_per_mille: 100,
        puts_per_mille: 100,
        scan_len: orderedkv::MAX_SCAN,
        seed: 3,
    });
    client.create_session("server:31850", 0).unwrap();
    // Waits only for events the loop itself causes (worker threads finish
    // their jobs however slowly they are scheduled): no time bound.
    while load.get_latency.len() + load.scan_latency.len() + load.put_latency.len() < requests {
        client.run_event_loop_once(&mut load);
        load.drive(&mut client);
        server.run_event_loop_once(&mut sstate);
        w.step();
    }
    load.running = false;
    while load.in_flight() > 0 {
        client.run_event_loop_once(&mut load);
        server.run_event_loop_once(&mut sstate);
        w.step();
    }
    assert_eq!(sstate.bad, 0);
    if mode == ScanMode::Workers && workers > 0 {
        let jobs: u64 = server_nexus.worker_stats().iter().map(|s| s.jobs).sum();
        assert_eq!(jobs, load.scan_latency.len(), "every scan ran on a worker");
    }
    load
}

fn check(l: &LoadState) {
    assert_eq!((l.wrong, l.errors), (0, 0), "{l:?}");
    assert!(l.scan_latency.len() > 50, "{}", l.scan_latency.len());
    assert!(l.get_latency.len() > 500);
    assert!(l.put_latency.len() > 50);
}

#[test]
fn scans_in_dispatch_and_on_inline_workers_answer_correctly() {
    check(&run(
        ScanMode::Dispatch,
        0,
        WorkerDispatch::RoundRobin,
        2_000,
    ));
    check(&run(
        ScanMode::Workers,
        0,
        WorkerDispatch::RoundRobin,
        2_000,
    ));
}

#[test]
fn scans_on_worker_threads_answer_correctly_under_both_policies() {
    check(&run(
        ScanMode::Workers,
        2,
        WorkerDispatch::RoundRobin,
        2_000,
    ));
    check(&run(
        ScanMode::Workers,
        2,
        WorkerDispatch::single_queue(1),
        2_000,
    ));
}

#[test]
fn a_scan_from_the_last_keys_returns_what_is_left() {
    let idx = orderedkv::load(300);
    let mut buf = vec![0u8; orderedkv::scan_resp_bytes(128)];
    let len = orderedkv::scan(&idx, &key(250), 128, &mut buf);
    assert_eq!(len, orderedkv::scan_resp_bytes(50));
}

/// The same store on the typed API: GETs, PUTs and SCANs from async
/// tasks, every answer checked, scans in dispatch and on inline workers.
#[test]
fn the_typed_store_answers_correctly() {
    use erpc_apps::orderedkv_typed::{self as typed, ClientCtx};
    use erpc_typed::{Endpoint, EndpointConfig, Service};
    type T = erpc_sim::SimTransport;
    for mode in [ScanMode::Dispatch, ScanMode::Workers] {
        let mut w = SimWorld::new(1, erpc_sim::DEFAULT_LINK);
        let index = orderedkv::load(5_000);
        let svc = typed::service::<T>(index.clone(), mode);
        let server_nexus = svc
            .register(w.nexus("server:31850"))
            .workers(0)
            .build()
            .unwrap();
        let csvc = Service::<T, ClientCtx>::new();
        let client_nexus = csvc.register(w.nexus("client:31850")).build().unwrap();
        let (st, sa, _) = w.endpoint();
        let (ct, ca, _) = w.endpoint();
        let mut server = Endpoint::new(
            &server_nexus,
            0,
            st,
            sa,
            EndpointConfig::default(),
            &svc,
            typed::Server {
                index: index.clone(),
            },
        )
        .unwrap();
        let mut client = Endpoint::new(
            &client_nexus,
            0,
            ct,
            ca,
            EndpointConfig::default(),
            &csvc,
            ClientCtx,
        )
        .unwrap();
        let api = client.client();
        let session = client
            .block_on_with(api.connect("server:31850", 0), || {
                server.run_once();
                w.step();
            })
            .unwrap();
        let load = typed::start_load(
            &client,
            session,
            LoadConfig {
                keys: 5_000,
                window: 8,
                scans_per_mille: 100,
                puts_per_mille: 100,
                scan_len: orderedkv::MAX_SCAN,
                seed: 3,
            },
        );
        while load.borrow().count() < 2_000 {
            client.run_once();
            server.run_once();
            w.step();
        }
        load.borrow_mut().running = false;
        while load.borrow().tasks > 0 {
            client.run_once();
            server.run_once();
            w.step();
        }
        let l = load.borrow();
        assert_eq!((l.wrong, l.errors), (0, 0), "{mode}: {l:?}");
        assert!(l.scan_latency.len() > 50, "{}", l.scan_latency.len());
        assert!(l.get_latency.len() > 500);
        assert!(l.put_latency.len() > 50);
        assert_eq!(server.stats().bad_requests, 0);
        assert_eq!(client.pending_calls(), 0);
    }
}
