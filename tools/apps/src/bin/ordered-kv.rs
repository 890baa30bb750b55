//! `ordered-kv`: the ordered key-value store benchmark — 99 % GET, 1 %
//! SCAN(start, 128), uniform keys — with scans on background workers
//! against scans in the dispatch thread, in the same run; and the same
//! store on the typed API (`erpc_apps::orderedkv_typed`: serde requests,
//! closure handlers, async client tasks) beside the raw one.
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin ordered-kv
//! cargo run --release -p erpc-apps --bin ordered-kv -- --keys 100000 --secs 2 --workers 1
//! ```
//!
//! Device model (two software ConnectX NICs, wall clock): the server Rpc
//! and the client Rpc are polled by one thread (one core); the worker
//! threads (default 1) run on the other. Each mode runs `--rounds` times,
//! alternating, each on a fresh Nexus and queue sets, after a warm-up.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use erpc::{Rpc, SessionEventKind};
use erpc_apps::cli;
use erpc_apps::env::{self, DevWorld, World};
use erpc_apps::orderedkv::{self, Index, LoadConfig, LoadState, ScanMode, ServerState};
use erpc_apps::orderedkv_typed::{self as typed, ClientCtx};
use erpc_apps::stats::Percentiles;
use erpc_typed::{Endpoint, EndpointConfig, Service};

#[derive(Parser, Debug)]
#[command(
    name = "ordered-kv",
    about = "Ordered key-value store over eRPC: scans on workers vs in dispatch"
)]
struct Cli {
    /// Keys in the index (1 to 100 000 000).
    #[arg(long, default_value_t = 1_000_000, value_parser = cli::int_in::<1, 100_000_000>)]
    keys: u64,
    /// Seconds measured per round (above 0, at most 86400).
    #[arg(long, default_value_t = 3.0, value_parser = cli::secs)]
    secs: f64,
    /// Rounds per mode, alternating (1 to 1000).
    #[arg(long, default_value_t = 2, value_parser = cli::count_in::<1, 1000>)]
    rounds: usize,
    /// Requests in flight (1 to 1024).
    #[arg(long, default_value_t = 8, value_parser = cli::count_in::<1, 1024>)]
    window: usize,
    /// SCANs per 1000 requests (0 to 1000).
    #[arg(long, default_value_t = 10, value_parser = cli::int_in::<0, 1000>)]
    scans_per_mille: u64,
    /// Worker threads, scans on workers (1 to 64).
    #[arg(long, default_value_t = 1, value_parser = cli::count_in::<1, 64>)]
    workers: usize,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A line on stdout; a closed pipe ends the program quietly.
macro_rules! out {
    () => { erpc_apps::out!("ordered-kv", "") };
    ($($arg:tt)*) => { erpc_apps::out!("ordered-kv", $($arg)*) };
}

struct Outcome {
    gets: hdrhistogram::Histogram<u64>,
    scans: hdrhistogram::Histogram<u64>,
    secs: f64,
    wrong: u64,
    errors: u64,
}

fn round(
    world: &mut DevWorld,
    index: &Arc<Index>,
    mode: ScanMode,
    cli: &Cli,
    n: u16,
) -> Res<Outcome> {
    let su = world.uri("server");
    let cu = world.uri("client");
    let server_nexus =
        orderedkv::register::<<DevWorld as World>::T>(world.nexus(&su), index.clone(), mode)
            .workers(cli.workers)
            .build()?;
    let client_nexus = world.nexus(&cu).build()?;
    let (st, sa) = world.queue_set(0, 32_000 + 2 * n)?;
    let (ct, ca) = world.queue_set(1, 32_001 + 2 * n)?;
    let mut server = Rpc::builder(&server_nexus, st, sa).build()?;
    let mut sstate = ServerState::new(index.clone());
    fn on_sm<T: transport::Transport>(
        _rpc: &mut Rpc<T, LoadState>,
        st: &mut LoadState,
        ev: erpc::SessionEvent,
    ) {
        if ev.kind == SessionEventKind::Connected {
            st.set_session(ev.session);
        }
    }
    let mut client = Rpc::builder(&client_nexus, ct, ca)
        .session_handler(on_sm::<<DevWorld as World>::T>)
        .build()?;
    let mut load = LoadState::new(LoadConfig {
        keys: cli.keys,
        window: cli.window,
        scans_per_mille: cli.scans_per_mille,
        puts_per_mille: 0,
        scan_len: orderedkv::MAX_SCAN,
        seed: u64::from(n) + 1,
    });
    client.create_session(&su, 0)?;
    let mut poll = |load: &mut LoadState| {
        client.run_event_loop_once(load);
        load.drive(&mut client);
        server.run_event_loop_once(&mut sstate);
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(0.5) {
        poll(&mut load);
    }
    load.reset();
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs_f64(cli.secs) {
        poll(&mut load);
    }
    let secs = t1.elapsed().as_secs_f64();
    let out = Outcome {
        gets: load.get_latency.clone(),
        scans: load.scan_latency.clone(),
        secs,
        wrong: load.wrong,
        errors: load.errors,
    };
    load.running = false;
    let t2 = Instant::now();
    while load.in_flight() > 0 && t2.elapsed() < Duration::from_secs(10) {
        poll(&mut load);
    }
    Ok(out)
}

/// A round of the typed store: the same load, from `window` async tasks.
fn typed_round(
    world: &mut DevWorld,
    index: &Arc<Index>,
    mode: ScanMode,
    cli: &Cli,
    n: u16,
) -> Res<Outcome> {
    type T = <DevWorld as World>::T;
    let su = world.uri("server");
    let cu = world.uri("client");
    let svc = typed::service::<T>(index.clone(), mode);
    let server_nexus = svc
        .register(world.nexus(&su))
        .workers(cli.workers)
        .build()?;
    let csvc = Service::<T, ClientCtx>::new();
    let client_nexus = csvc.register(world.nexus(&cu)).build()?;
    let (st, sa) = world.queue_set(0, 32_000 + 2 * n)?;
    let (ct, ca) = world.queue_set(1, 32_001 + 2 * n)?;
    let cfg = EndpointConfig::default();
    let server_state = typed::Server {
        index: index.clone(),
    };
    let mut server = Endpoint::new(&server_nexus, 0, st, sa, cfg, &svc, server_state)?;
    let mut client = Endpoint::new(&client_nexus, 0, ct, ca, cfg, &csvc, ClientCtx)?;
    let api = client.client();
    let session = client.block_on_with(api.connect(&su, 0), || server.run_once())?;
    let load = typed::start_load(
        &client,
        session,
        LoadConfig {
            keys: cli.keys,
            window: cli.window,
            scans_per_mille: cli.scans_per_mille,
            puts_per_mille: 0,
            scan_len: orderedkv::MAX_SCAN,
            seed: u64::from(n) + 1,
        },
    );
    let mut poll = || {
        client.run_once();
        server.run_once();
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(0.5) {
        poll();
    }
    load.borrow_mut().reset();
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs_f64(cli.secs) {
        poll();
    }
    let secs = t1.elapsed().as_secs_f64();
    let out = {
        let l = load.borrow();
        Outcome {
            gets: l.get_latency.clone(),
            scans: l.scan_latency.clone(),
            secs,
            wrong: l.wrong,
            errors: l.errors,
        }
    };
    load.borrow_mut().running = false;
    let t2 = Instant::now();
    while load.borrow().tasks > 0 && t2.elapsed() < Duration::from_secs(10) {
        poll();
    }
    Ok(out)
}

/// Which store a round ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Raw,
    Typed,
}

fn main() -> ExitCode {
    erpc_apps::init_tracing();
    // With ERPC_INSPECT=1, the endpoint's socket goes with the process
    // on SIGTERM/SIGINT/SIGHUP too.
    if let Err(e) = erpc::inspect::remove_socket_on_termination() {
        tracing::warn!(error = %e, "no signal handler: a debug endpoint socket may outlive a signal");
    }
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // Bad flags were refused by clap (exit 2); this is a failed run.
        Err(e) => {
            eprintln!("ordered-kv: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Res<bool> {
    let t = Instant::now();
    let index = orderedkv::load(cli.keys);
    out!(
        "ordered-kv: {} keys in a crossbeam skip list (loaded in {:.1} s); {} % GET, {} % \
         SCAN(start, {}); {} in flight; device model, server and client polled by one thread \
         (1 core), {} worker thread(s)",
        cli.keys,
        t.elapsed().as_secs_f64(),
        100.0 - cli.scans_per_mille as f64 / 10.0,
        cli.scans_per_mille as f64 / 10.0,
        orderedkv::MAX_SCAN,
        cli.window,
        cli.workers
    );
    // Reference, same run: the index work alone, in this thread.
    let (get_ns, scan_ns) = {
        let mut rng = netsim::Rng::new(9);
        let mut buf = vec![0u8; orderedkv::scan_resp_bytes(orderedkv::MAX_SCAN)];
        let n = 20_000u32;
        let t = Instant::now();
        let mut found = 0usize;
        for _ in 0..n {
            let k = erpc_apps::raftkv::client::key(rng.next_u64() % cli.keys);
            found += usize::from(index.get(&k).is_some());
        }
        let get = t.elapsed().as_nanos() as f64 / f64::from(n);
        let t = Instant::now();
        for _ in 0..n / 10 {
            let k = erpc_apps::raftkv::client::key(rng.next_u64() % cli.keys);
            found += orderedkv::scan(&index, &k, orderedkv::MAX_SCAN, &mut buf);
        }
        let scan = t.elapsed().as_nanos() as f64 / f64::from(n / 10);
        std::hint::black_box(found);
        (get, scan)
    };
    out!(
        "index alone (this thread, no eRPC): GET {:.2} µs, SCAN of {} {:.2} µs",
        get_ns / 1e3,
        orderedkv::MAX_SCAN,
        scan_ns / 1e3
    );
    let mut world = DevWorld::threaded(1, env::region(64));
    world.endpoint();
    world.endpoint();
    let mut results: Vec<(Api, ScanMode, Outcome)> = Vec::new();
    let mut n = 0;
    for _ in 0..cli.rounds {
        for api in [Api::Raw, Api::Typed] {
            for mode in [ScanMode::Workers, ScanMode::Dispatch] {
                n += 1;
                let o = match api {
                    Api::Raw => round(&mut world, &index, mode, cli, n)?,
                    Api::Typed => typed_round(&mut world, &index, mode, cli, n)?,
                };
                results.push((api, mode, o));
            }
        }
    }
    out!(
        "{:<26} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}",
        "store, mode",
        "Mrps",
        "GET p50",
        "GET p99",
        "SCAN p50",
        "SCAN p99",
        "GET p99.9"
    );
    let mut ok = true;
    let mut summary = Vec::new();
    let mut rates = Vec::new();
    for (api, mode) in [
        (Api::Raw, ScanMode::Workers),
        (Api::Raw, ScanMode::Dispatch),
        (Api::Typed, ScanMode::Workers),
        (Api::Typed, ScanMode::Dispatch),
    ] {
        let mut gets = erpc_apps::stats::histogram();
        let mut scans = erpc_apps::stats::histogram();
        let mut secs = 0.0;
        for (_, _, o) in results.iter().filter(|(a, m, _)| *a == api && *m == mode) {
            gets.add(&o.gets).expect("same bounds");
            scans.add(&o.scans).expect("same bounds");
            secs += o.secs;
            ok &= o.wrong == 0 && o.errors == 0;
            if o.wrong + o.errors > 0 {
                eprintln!(
                    "{api:?} {mode}: {} wrong answers, {} errors",
                    o.wrong, o.errors
                );
            }
        }
        let (g, s) = (Percentiles::of(&gets), Percentiles::of(&scans));
        let rate = (g.count + s.count) as f64 / secs / 1e6;
        rates.push(rate);
        let store = match api {
            Api::Raw => "raw",
            Api::Typed => "typed",
        };
        out!(
            "{:<26} {:>9.3} {:>8.1}µ {:>8.1}µ {:>9.1}µ {:>9.1}µ {:>8.1}µ",
            format!("{store}, {mode}"),
            rate,
            g.p50_us,
            g.p99_us,
            s.p50_us,
            s.p99_us,
            g.p999_us
        );
        summary.push(g);
    }
    // Ratios of nothing (no GET completed: --scans-per-mille 1000, or a
    // round too short for one) are shown as `-`, not NaN.
    let x = |a: f64, b: f64| {
        let r = a / b;
        if r.is_finite() && b > 0.0 {
            format!("{r:.2}")
        } else {
            "-".into()
        }
    };
    let answers: u64 = results
        .iter()
        .map(|(_, _, o)| o.gets.len() + o.scans.len())
        .sum();
    if answers == 0 {
        eprintln!(
            "ordered-kv: no request completed in {} s per round",
            cli.secs
        );
        ok = false;
    }
    out!(
        "GET p99 in dispatch / on workers: {}x; GET p50: {}x (every answer checked: {})",
        x(summary[1].p99_us, summary[0].p99_us),
        x(summary[1].p50_us, summary[0].p50_us),
        if ok {
            format!("all {answers} correct")
        } else {
            "ERRORS".into()
        }
    );
    out!(
        "typed / raw, scans on workers: rate {}, GET p50 {}x; scans in dispatch: rate {}, \
         GET p50 {}x",
        x(rates[2], rates[0]),
        x(summary[2].p50_us, summary[0].p50_us),
        x(rates[3], rates[1]),
        x(summary[3].p50_us, summary[1].p50_us)
    );
    Ok(ok)
}
