//! `dispatch-bench`: p99 latency against load for round-robin and
//! single-queue (JBSQ) worker dispatch, next to the ideal M/G/N queue
//! simulated from the same arrivals and the service times the workers
//! actually took.
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin dispatch-bench
//! cargo run --release -p erpc-apps --bin dispatch-bench -- --service spin --workers 2 \
//!     --short-us 10 --long-us 1000 --secs 5
//! ```
//!
//! Device model (two software ConnectX NICs, wall clock): the server's
//! dispatch thread and the open-loop client are polled by one thread; the
//! `--workers` worker threads serve. With `--service sleep` (the default)
//! the handler sleeps through its service time, so workers need no core
//! of their own and the run fits a small machine; `--service spin` busy-
//! loops, which is only meaningful with a free core per worker.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use erpc::{Rpc, RpcConfig, SessionEventKind, WorkerDispatch};
use erpc_apps::dispatch::{self, Bimodal, LoadGen, Service};
use erpc_apps::env::{self, DevWorld, World};

#[derive(Parser, Debug)]
#[command(
    name = "dispatch-bench",
    about = "Worker dispatch: round robin vs single queue vs ideal M/G/N"
)]
struct Cli {
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Loads (utilization of the workers), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.6,0.7,0.8,0.9")]
    loads: Vec<f64>,
    /// Policies: rr, sq1, sq2 (single queue, depth 1 or 2).
    #[arg(long, value_delimiter = ',', default_value = "rr,sq1,sq2")]
    policies: Vec<String>,
    /// Short service time, µs.
    #[arg(long, default_value_t = 1000)]
    short_us: u64,
    /// Long service time, µs.
    #[arg(long, default_value_t = 100_000)]
    long_us: u64,
    /// Long requests per million.
    #[arg(long, default_value_t = 5_000)]
    long_ppm: u64,
    /// Seconds of arrivals per point.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// spin or sleep.
    #[arg(long, default_value = "sleep")]
    service: String,
    /// Client sessions (8 requests in flight each).
    #[arg(long, default_value_t = 128)]
    sessions: usize,
    /// Seed of the arrival schedule (the same for every policy at a load).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn policy(name: &str) -> Res<WorkerDispatch> {
    Ok(match name {
        "rr" => WorkerDispatch::RoundRobin,
        "sq1" => WorkerDispatch::single_queue(1),
        "sq2" => WorkerDispatch::single_queue(2),
        p => return Err(format!("policy {p:?}: rr, sq1 or sq2").into()),
    })
}

struct Point {
    p50_us: f64,
    p99_us: f64,
    ideal_p50_us: f64,
    ideal_p99_us: f64,
    /// p99 of the policy's own queueing model on the same samples.
    model_p99_us: f64,
    achieved_load: f64,
    max_waiting: usize,
    jobs: Vec<u64>,
}

fn point(
    world: &mut DevWorld,
    cli: &Cli,
    dispatch_policy: WorkerDispatch,
    service: Service,
    load: f64,
    n: u16,
) -> Res<Point> {
    let dist = Bimodal {
        short_ns: cli.short_us * 1_000,
        long_ns: cli.long_us * 1_000,
        long_ppm: cli.long_ppm,
    };
    let count = (cli.secs * 1e9 * load * cli.workers as f64 / dist.mean_ns()) as usize;
    let plan = dispatch::schedule(
        count.max(100),
        load,
        cli.workers,
        dist,
        cli.seed ^ (load * 1e3) as u64,
    );
    let su = world.uri("server");
    let cu = world.uri("client");
    let server_nexus = dispatch::register(world.nexus(&su), service, Instant::now())
        .workers(cli.workers)
        .worker_dispatch(dispatch_policy)
        .build()?;
    let client_nexus = world.nexus(&cu).build()?;
    let (st, sa) = world.queue_set(0, 33_000 + 2 * n)?;
    let (ct, ca) = world.queue_set(1, 33_001 + 2 * n)?;
    let mut server: Rpc<_, ()> = Rpc::new(&server_nexus, 0, st, sa, RpcConfig::default(), None)?;
    fn on_sm<T: transport::Transport>(
        _: &mut Rpc<T, LoadGen>,
        _: &mut LoadGen,
        ev: erpc::SessionEvent,
    ) {
        if ev.kind != SessionEventKind::Connected {
            eprintln!("session {}: {}", ev.session, ev.kind);
        }
    }
    let mut client = Rpc::new(
        &client_nexus,
        0,
        ct,
        ca,
        RpcConfig::default(),
        Some(on_sm::<<DevWorld as World>::T>),
    )?;
    let mut sessions = Vec::new();
    for _ in 0..cli.sessions {
        sessions.push(client.create_session(&su, 0)?);
    }
    let mut lg = LoadGen::new(Vec::new(), Vec::new(), 0);
    let t0 = Instant::now();
    while !sessions.iter().all(|&s| client.is_connected(s)) {
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("sessions did not connect in 10 s".into());
        }
    }
    let before: Vec<u64> = server_nexus.worker_stats().iter().map(|s| s.jobs).collect();
    let mut lg = LoadGen::new(plan, sessions, client.now_ns());
    let deadline = Duration::from_secs_f64(cli.secs * 4.0 + 30.0);
    let t1 = Instant::now();
    while !lg.finished() {
        lg.drive(&mut client);
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
        if t1.elapsed() > deadline {
            return Err(format!(
                "{} of {} requests done after {:?}",
                lg.done,
                lg.plan().len(),
                deadline
            )
            .into());
        }
    }
    if lg.errors > 0 {
        return Err(format!("{} requests failed", lg.errors).into());
    }
    let jobs = server_nexus
        .worker_stats()
        .iter()
        .zip(&before)
        .map(|(s, b)| s.jobs - b)
        .collect();
    let arrivals: Vec<u64> = lg.plan().iter().map(|a| a.at_ns).collect();
    let mut ideal = dispatch::ideal(&arrivals, &lg.served_ns, cli.workers);
    let mut model = match dispatch_policy {
        WorkerDispatch::SingleQueue { depth } => {
            dispatch::model_jbsq(&arrivals, &lg.served_ns, cli.workers, depth)
        }
        _ => dispatch::model_round_robin(&arrivals, &lg.served_ns, cli.workers),
    };
    let span = *arrivals.last().unwrap_or(&1) as f64;
    let achieved_load = lg.served_ns.iter().sum::<u64>() as f64 / span / cli.workers as f64;
    let mut lat = lg.latency_ns.clone();
    let us = |ns: u64| ns as f64 / 1e3;
    Ok(Point {
        p50_us: us(dispatch::quantile(&mut lat, 0.5)),
        p99_us: us(dispatch::quantile(&mut lat, 0.99)),
        ideal_p50_us: us(dispatch::quantile(&mut ideal, 0.5)),
        ideal_p99_us: us(dispatch::quantile(&mut ideal, 0.99)),
        model_p99_us: us(dispatch::quantile(&mut model, 0.99)),
        achieved_load,
        max_waiting: lg.max_waiting,
        jobs,
    })
}

fn run(cli: &Cli) -> Res<()> {
    let service = match cli.service.as_str() {
        "spin" => Service::Spin,
        "sleep" => Service::Sleep,
        s => return Err(format!("--service {s}: spin or sleep").into()),
    };
    if cli.workers == 0 || cli.sessions == 0 || cli.sessions > 255 {
        return Err("--workers must be at least 1 and --sessions 1 to 255".into());
    }
    let policies: Vec<(String, WorkerDispatch)> = cli
        .policies
        .iter()
        .map(|p| Ok((p.clone(), policy(p)?)))
        .collect::<Res<_>>()?;
    let dist = Bimodal {
        short_ns: cli.short_us * 1_000,
        long_ns: cli.long_us * 1_000,
        long_ppm: cli.long_ppm,
    };
    println!(
        "dispatch-bench: {} workers ({}), service {} µs ({:.2} %) / {} µs ({:.2} %), mean {:.1} µs; \
         device model, dispatch thread and client polled by one thread; {:.0} s of arrivals per point",
        cli.workers,
        cli.service,
        cli.short_us,
        100.0 - cli.long_ppm as f64 / 1e4,
        cli.long_us,
        cli.long_ppm as f64 / 1e4,
        dist.mean_ns() / 1e3,
        cli.secs
    );
    println!(
        "cores: {} online; workers {} + 1 polling thread",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if service == Service::Sleep {
            "sleep (no core while serving)"
        } else {
            "spin (one core each)"
        }
    );
    let mut world = DevWorld::threaded(1, env::region(64));
    world.endpoint();
    world.endpoint();
    println!(
        "{:>5} {:<6} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>7}  jobs per worker",
        "load",
        "policy",
        "achieved",
        "p50 µs",
        "p99 µs",
        "model p99",
        "ideal p50",
        "ideal p99",
        "p99/ideal",
        "waited"
    );
    let mut n = 0;
    for &load in &cli.loads {
        for (name, p) in &policies {
            n += 1;
            let r = point(&mut world, cli, *p, service, load, n)?;
            println!(
                "{:>5.2} {:<6} {:>9.2} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>9.2} {:>7}  {:?}",
                load,
                name,
                r.achieved_load,
                r.p50_us,
                r.p99_us,
                r.model_p99_us,
                r.ideal_p50_us,
                r.ideal_p99_us,
                r.p99_us / r.ideal_p99_us,
                r.max_waiting,
                r.jobs
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dispatch-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
