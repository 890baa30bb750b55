//! `dispatch-bench`: p99 latency against load for round-robin and
//! single-queue (JBSQ) worker dispatch, next to the ideal M/G/N queue
//! simulated from the same arrivals and the service times the workers
//! actually took.
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin dispatch-bench
//! cargo run --release -p erpc-apps --bin dispatch-bench -- --transport sim
//! cargo run --release -p erpc-apps --bin dispatch-bench -- --service sleep \
//!     --short-us 1000 --long-us 100000 --secs 15
//! ```
//!
//! Device model (two software ConnectX NICs, wall clock; the default):
//! the server's dispatch thread and the open-loop client are polled by one
//! thread; the `--workers` worker threads serve, spinning when idle
//! (`--park-after-us` to let them park). With `--service spin` (the
//! default) the handler busy-loops through its service time, which is
//! meaningful only with a free core per worker plus two (the polling
//! thread and the rest of the system); `--service sleep` sleeps instead,
//! so that workers need no core of their own, which takes service times
//! long against the OS's wake-up latency.
//!
//! Before the points, the run measures the polling thread's *capacity*:
//! RPCs per second it serves (client and server) with zero-work
//! background handlers, every session slot busy. A point whose arrival
//! rate exceeds 80 % of it is flagged: it measures the dispatcher, not the
//! policy.
//!
//! `--transport sim`: eRPC's simulated network on virtual time, with
//! stepped workers (`NexusBuilder::stepped_workers`) whose service times
//! are modelled: a worker takes a job, and the driver finishes it when
//! the service time has passed on the virtual clock. The polling thread
//! costs no virtual time, so this shows the policies through eRPC's own
//! hand-off (links, JBSQ reservations, the backlog), the hand-off itself
//! reduced to the virtual step (`--sim-step-ns`), on any machine.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

use erpc::{Nexus, Rpc, SessionEventKind, WorkerDispatch, WorkerIdle};
use erpc_apps::cli;
use erpc_apps::dispatch::{self, Arrival, Bimodal, LoadGen, Service};
use erpc_apps::env::{self, DevWorld, World};

#[derive(Parser, Debug)]
#[command(
    name = "dispatch-bench",
    about = "Worker dispatch: round robin vs single queue vs ideal M/G/N"
)]
struct Cli {
    /// Worker threads (1 to 64).
    #[arg(long, default_value_t = 4, value_parser = cli::count_in::<1, 64>)]
    workers: usize,
    /// Loads (utilization of the workers), comma-separated, each above 0
    /// and below 1.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.5,0.6,0.7,0.8,0.9",
        value_parser = cli::load
    )]
    loads: Vec<f64>,
    /// Policies: rr, sq1, sq2 (single queue, depth 1 or 2).
    #[arg(long, value_delimiter = ',', default_value = "rr,sq1,sq2", value_parser = ["rr", "sq1", "sq2"])]
    policies: Vec<String>,
    /// Short service time, µs (1 to 10 000 000).
    #[arg(long, default_value_t = 10, value_parser = cli::int_in::<1, 10_000_000>)]
    short_us: u64,
    /// Long service time, µs (1 to 10 000 000).
    #[arg(long, default_value_t = 1000, value_parser = cli::int_in::<1, 10_000_000>)]
    long_us: u64,
    /// Long requests per million (0 to 1 000 000).
    #[arg(long, default_value_t = 5_000, value_parser = cli::int_in::<0, 1_000_000>)]
    long_ppm: u64,
    /// Seconds of arrivals per point (device model; above 0, at most
    /// 86400).
    #[arg(long, default_value_t = 5.0, value_parser = cli::secs)]
    secs: f64,
    /// spin or sleep (device model).
    #[arg(long, default_value = "spin", value_parser = ["spin", "sleep"])]
    service: String,
    /// dev (device model, wall clock) or sim (simulated network, virtual
    /// time, modelled service times).
    #[arg(long, default_value = "dev", value_parser = ["dev", "sim"])]
    transport: String,
    /// Idle workers park after this many µs (default: they spin; device
    /// model).
    #[arg(long)]
    park_after_us: Option<u64>,
    /// Seconds of the capacity measurement (device model; above 0, at most
    /// 86400).
    #[arg(long, default_value_t = 1.0, value_parser = cli::secs)]
    capacity_secs: f64,
    /// Virtual seconds of arrivals per point (simulated network; above 0,
    /// at most 86400).
    #[arg(long, default_value_t = 0.2, value_parser = cli::secs)]
    sim_secs: f64,
    /// Virtual time per step of the simulated network, ns (1 to 1 000 000).
    #[arg(long, default_value_t = 100, value_parser = cli::int_in::<1, 1_000_000>)]
    sim_step_ns: u64,
    /// Client sessions, 8 requests in flight each (1 to 255).
    #[arg(long, default_value_t = 128, value_parser = cli::count_in::<1, 255>)]
    sessions: usize,
    /// Seed of the arrival schedule (the same for every policy at a load).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A line on stdout; a closed pipe ends the program quietly.
macro_rules! out {
    () => { erpc_apps::out!("dispatch-bench", "") };
    ($($arg:tt)*) => { erpc_apps::out!("dispatch-bench", $($arg)*) };
}

/// The options that apply to one transport only, refused with the other
/// (they would be silently ignored).
const DEV_ONLY: [&str; 4] = ["secs", "service", "park_after_us", "capacity_secs"];
const SIM_ONLY: [&str; 2] = ["sim_secs", "sim_step_ns"];

/// The command line: clap's errors, and options of the other transport,
/// exit 2.
fn parse() -> Cli {
    let m = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    let (theirs, other) = if cli.transport == "sim" {
        (&DEV_ONLY[..], "dev")
    } else {
        (&SIM_ONLY[..], "sim")
    };
    if let Some(id) = theirs
        .iter()
        .find(|id| m.value_source(id) == Some(ValueSource::CommandLine))
    {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--{} applies to --transport {other} only, not {}",
                    id.replace('_', "-"),
                    cli.transport
                ),
            )
            .exit();
    }
    cli
}

fn policy(name: &str) -> Res<WorkerDispatch> {
    Ok(match name {
        "rr" => WorkerDispatch::RoundRobin,
        "sq1" => WorkerDispatch::single_queue(1),
        "sq2" => WorkerDispatch::single_queue(2),
        p => return Err(format!("policy {p:?}: rr, sq1 or sq2").into()),
    })
}

struct Point {
    /// Requests per second the schedule asked for.
    arrival_rate: f64,
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

fn dist(cli: &Cli) -> Bimodal {
    Bimodal {
        short_ns: cli.short_us * 1_000,
        long_ns: cli.long_us * 1_000,
        long_ppm: cli.long_ppm,
    }
}

/// The arrivals of a point: `secs` of them at `load`.
fn plan(cli: &Cli, load: f64, secs: f64) -> Vec<Arrival> {
    let d = dist(cli);
    let count = (secs * 1e9 * load * cli.workers as f64 / d.mean_ns()) as usize;
    dispatch::schedule(
        count.max(100),
        load,
        cli.workers,
        d,
        cli.seed ^ (load * 1e3) as u64,
    )
}

fn idle(cli: &Cli) -> WorkerIdle {
    match cli.park_after_us {
        None => WorkerIdle::Spin,
        Some(us) => WorkerIdle::SpinThenPark {
            after: Duration::from_micros(us),
        },
    }
}

/// The policy's p50 and p99 and the references, from a finished run.
fn summarize(
    cli: &Cli,
    lg: &LoadGen,
    dispatch_policy: WorkerDispatch,
    jobs: Vec<u64>,
) -> Res<Point> {
    if lg.errors > 0 {
        return Err(format!("{} requests failed", lg.errors).into());
    }
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
        arrival_rate: arrivals.len() as f64 / span * 1e9,
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

/// A server (worker threads) and a client on the device model, sessions
/// connected: (server Nexus, server Rpc, client Rpc, sessions).
#[allow(clippy::type_complexity)]
fn dev_pair(
    world: &mut DevWorld,
    cli: &Cli,
    dispatch_policy: WorkerDispatch,
    service: Service,
    n: u16,
) -> Res<(
    std::sync::Arc<Nexus>,
    Rpc<<DevWorld as World>::T, ()>,
    Rpc<<DevWorld as World>::T, LoadGen>,
    Vec<erpc::SessionNum>,
)> {
    let su = world.uri("server");
    let cu = world.uri("client");
    let server_nexus = dispatch::register(world.nexus(&su), service, Instant::now())
        .workers(cli.workers)
        .worker_dispatch(dispatch_policy)
        .worker_idle(idle(cli))
        .build()?;
    let client_nexus = world.nexus(&cu).build()?;
    let (st, sa) = world.queue_set(0, 33_000 + 2 * n)?;
    let (ct, ca) = world.queue_set(1, 33_001 + 2 * n)?;
    let mut server: Rpc<_, ()> = Rpc::builder(&server_nexus, st, sa).build()?;
    fn on_sm<T: transport::Transport>(
        _: &mut Rpc<T, LoadGen>,
        _: &mut LoadGen,
        ev: erpc::SessionEvent,
    ) {
        if ev.kind != SessionEventKind::Connected {
            eprintln!("session {}: {}", ev.session, ev.kind);
        }
    }
    let mut client = Rpc::builder(&client_nexus, ct, ca)
        .session_handler(on_sm::<<DevWorld as World>::T>)
        .build()?;
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
    Ok((server_nexus, server, client, sessions))
}

/// RPCs per second the polling thread serves (client and server) with
/// zero-work background handlers and every session slot busy.
fn capacity(world: &mut DevWorld, cli: &Cli, service: Service, n: u16) -> Res<f64> {
    let (_nexus, mut server, mut client, sessions) =
        dev_pair(world, cli, WorkerDispatch::RoundRobin, service, n)?;
    // Everything due at once: the client keeps every slot busy.
    let count = 4_000_000;
    let zero = vec![
        Arrival {
            at_ns: 0,
            service_ns: 0,
        };
        count
    ];
    let mut lg = LoadGen::new(zero, sessions, client.now_ns());
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs_f64(cli.capacity_secs / 4.0) && !lg.finished() {
        lg.drive(&mut client);
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
    }
    let (t0, done0) = (Instant::now(), lg.done);
    while t0.elapsed() < Duration::from_secs_f64(cli.capacity_secs) && !lg.finished() {
        lg.drive(&mut client);
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
    }
    if lg.errors > 0 {
        return Err(format!("capacity: {} requests failed", lg.errors).into());
    }
    Ok((lg.done - done0) as f64 / t0.elapsed().as_secs_f64())
}

fn point(
    world: &mut DevWorld,
    cli: &Cli,
    dispatch_policy: WorkerDispatch,
    service: Service,
    load: f64,
    n: u16,
) -> Res<Point> {
    let plan = plan(cli, load, cli.secs);
    let (server_nexus, mut server, mut client, sessions) =
        dev_pair(world, cli, dispatch_policy, service, n)?;
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
    let jobs = server_nexus
        .worker_stats()
        .iter()
        .zip(&before)
        .map(|(s, b)| s.jobs - b)
        .collect();
    summarize(cli, &lg, dispatch_policy, jobs)
}

/// A point on the simulated network in virtual time: stepped workers, a
/// job finished when its service time has passed.
fn sim_point(cli: &Cli, dispatch_policy: WorkerDispatch, load: f64, n: u64) -> Res<Point> {
    let plan = plan(cli, load, cli.sim_secs);
    let (lg, jobs) = dispatch::run_simulated(
        plan,
        &dispatch::SimSetup {
            workers: cli.workers,
            policy: dispatch_policy,
            sessions: cli.sessions,
            step_ns: cli.sim_step_ns,
            seed: cli.seed ^ n,
        },
    )?;
    summarize(cli, &lg, dispatch_policy, jobs)
}

fn run(cli: &Cli) -> Res<()> {
    // clap checked the names.
    let service = if cli.service == "sleep" {
        Service::Sleep
    } else {
        Service::Spin
    };
    let sim = cli.transport == "sim";
    let policies: Vec<(String, WorkerDispatch)> = cli
        .policies
        .iter()
        .map(|p| Ok((p.clone(), policy(p)?)))
        .collect::<Res<_>>()?;
    let d = dist(cli);
    if sim {
        out!(
            "dispatch-bench: {} stepped workers, service {} µs ({:.2} %) / {} µs ({:.2} %), mean {:.1} µs \
             (modelled); simulated network, virtual time, step {} ns; {} s of arrivals per point",
            cli.workers,
            cli.short_us,
            100.0 - cli.long_ppm as f64 / 1e4,
            cli.long_us,
            cli.long_ppm as f64 / 1e4,
            d.mean_ns() / 1e3,
            cli.sim_step_ns,
            cli.sim_secs
        );
        out!("capacity: not measured (the polling thread costs no virtual time)");
    } else {
        out!(
            "dispatch-bench: {} workers ({}, idle: {}), service {} µs ({:.2} %) / {} µs ({:.2} %), \
             mean {:.1} µs; device model, dispatch thread and client polled by one thread; \
             {:.0} s of arrivals per point",
            cli.workers,
            cli.service,
            idle(cli),
            cli.short_us,
            100.0 - cli.long_ppm as f64 / 1e4,
            cli.long_us,
            cli.long_ppm as f64 / 1e4,
            d.mean_ns() / 1e3,
            cli.secs
        );
        out!(
            "cores: {} online; needs workers {} + 2 for spinning service",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            cli.workers
        );
    }
    let mut world = None;
    let mut cap = f64::INFINITY;
    if !sim {
        let mut w = DevWorld::threaded(1, env::region(64));
        w.endpoint();
        w.endpoint();
        cap = capacity(&mut w, cli, service, 0)?;
        out!(
            "capacity: {:.0} RPCs/s (zero-work background handlers, {} sessions, every slot busy, \
             the same polling thread); points above 80 % ({:.0}/s) are flagged DISPATCH",
            cap,
            cli.sessions,
            0.8 * cap
        );
        world = Some(w);
    }
    out!(
        "{:>5} {:<6} {:>9} {:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7}  jobs per worker",
        "load",
        "policy",
        "achieved",
        "arrivals/s",
        "p50 µs",
        "p99 µs",
        "model p99",
        "ideal p50",
        "ideal p99",
        "p50/ideal",
        "p99/ideal",
        "waited"
    );
    let mut n = 0;
    for &load in &cli.loads {
        for (name, p) in &policies {
            n += 1;
            let r = match world.as_mut() {
                Some(w) => point(w, cli, *p, service, load, n)?,
                None => sim_point(cli, *p, load, u64::from(n))?,
            };
            let flag = if r.arrival_rate > 0.8 * cap {
                "  DISPATCH (arrivals above 80 % of capacity)"
            } else {
                ""
            };
            out!(
                "{:>5.2} {:<6} {:>9.2} {:>10.0} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>9.2} {:>9.2} {:>7}  {:?}{flag}",
                load,
                name,
                r.achieved_load,
                r.arrival_rate,
                r.p50_us,
                r.p99_us,
                r.model_p99_us,
                r.ideal_p50_us,
                r.ideal_p99_us,
                r.p50_us / r.ideal_p50_us,
                r.p99_us / r.ideal_p99_us,
                r.max_waiting,
                r.jobs
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    erpc_apps::init_tracing();
    // With ERPC_INSPECT=1, the endpoint's socket goes with the process
    // on SIGTERM/SIGINT/SIGHUP too.
    if let Err(e) = erpc::inspect::remove_socket_on_termination() {
        tracing::warn!(error = %e, "no signal handler: a debug endpoint socket may outlive a signal");
    }
    let cli = parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dispatch-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
