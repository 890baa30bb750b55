//! `herd-kv`: the HERD-style key-value store benchmark — 16-byte keys,
//! 32-byte values, 8 M items preloaded, 95 % GET / 5 % PUT, uniform and
//! Zipf(0.99) keys — with per-request handlers and with burst handlers
//! (every bucket of an RX burst prefetched before any is read) in the same
//! run. Every answer is checked against the clients' model, and every key
//! a client wrote is read back after each round.
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin herd-kv
//! cargo run --release -p erpc-apps --bin herd-kv -- --transport udp --threads 2
//! cargo run --release -p erpc-apps --bin herd-kv -- --keys 100000 --secs 1
//! ```
//!
//! Thread i owns server Rpc i (partition i of the keys) and client Rpc i,
//! which has a session to every server Rpc and sends each key to the Rpc
//! that owns it. Each handler kind runs first closed loop (`--window` in
//! flight per client: its capacity), then open loop at one fixed offered
//! load for both (`--rate`, or 70 % of the per-request capacity measured
//! in the same run): throughput and p50/p99 there, latency counted from
//! when each request was due.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use erpc::{Nexus, Rpc};
use erpc_apps::herd::{self, ClientConfig, Handlers, KeyDist, KvClient, KvServer, ServerStats};
use erpc_apps::stats::Percentiles;
use erpc_apps::threads::{self, DevNet, Endpoints, Net, Phase, Res, UdpEndpoints, in_range};

#[derive(Parser, Debug)]
#[command(
    name = "herd-kv",
    about = "HERD-style key-value store over eRPC: per-request vs burst handlers"
)]
struct Cli {
    #[command(flatten)]
    round: threads::RoundArgs,
    /// Items preloaded, 1 to 100 000 000 (and at least --threads).
    #[arg(long, default_value_t = 8_000_000)]
    keys: u64,
    /// uniform, zipf or both.
    #[arg(long, default_value = "both")]
    dist: String,
    /// The Zipf exponent, above 0 and at most 10.
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// PUTs per 1000 requests, 0 to 1000.
    #[arg(long, default_value_t = 50)]
    puts_per_mille: u64,
    /// Fixed offered load in millions of requests per second, all threads
    /// together (default: 70 % of the per-request capacity of this run).
    #[arg(long)]
    rate: Option<f64>,
    /// Rounds (each handler kind once per round, alternating), 1 to 20.
    #[arg(long, default_value_t = 2)]
    rounds: u64,
    /// Seed of the key choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A point's result, all threads together.
#[derive(Default)]
struct Outcome {
    answered: u64,
    secs: f64,
    latency: Option<hdrhistogram::Histogram<u64>>,
    server: ServerStats,
}

impl Outcome {
    fn mrps(&self) -> f64 {
        self.answered as f64 / self.secs / 1e6
    }
    fn pct(&self) -> Percentiles {
        self.latency
            .as_ref()
            .map(Percentiles::of)
            .unwrap_or_default()
    }
    fn add(&mut self, o: &Outcome) {
        self.answered += o.answered;
        self.secs += o.secs;
        match &mut self.latency {
            Some(h) => h
                .add(o.latency.as_ref().expect("set"))
                .expect("same bounds"),
            None => self.latency = o.latency.clone(),
        }
        self.server.bursts += o.server.bursts;
        self.server.gets += o.server.gets;
        self.server.puts += o.server.puts;
        self.server.burst_reqs += o.server.burst_reqs;
    }
}

struct ThreadOut {
    server: KvServer,
    client: KvClient,
    answered: u64,
    latency: hdrhistogram::Histogram<u64>,
    server_delta: ServerStats,
}

/// Thread `i` of a round: its server and client Rpc, until the phase
/// stops and every client has read back what it wrote.
#[allow(clippy::too_many_arguments)]
fn thread_main<E: Endpoints>(
    e: E,
    (i, n, round, window): (usize, usize, usize, usize),
    nexus: [Arc<Nexus>; 2],
    server_uri: String,
    (mut sstate, mut cstate): (KvServer, KvClient),
    rate: f64,
    phase: &Phase,
) -> Res<ThreadOut> {
    let (st, sa) = e.make(0, i, round)?;
    let (ct, ca) = e.make(1, i, round)?;
    let mut server: Rpc<E::T, KvServer> = Rpc::builder(&nexus[0], st, sa).id(i as u8).build()?;
    let mut client: Rpc<E::T, KvClient> = Rpc::builder(&nexus[1], ct, ca).id(i as u8).build()?;
    if !phase.created(n) {
        return Err(format!("thread {i}: another thread failed to set up").into());
    }
    // Enough sessions to each partition for the window (8 slots each).
    let per_part = window.div_ceil(8 * n).max(1);
    let sessions = (0..n)
        .map(|p| {
            (0..per_part)
                .map(|_| client.create_session(&server_uri, p as u8))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    cstate.resume(sessions.clone(), rate);
    let t = Instant::now();
    while !sessions.iter().flatten().all(|&s| client.is_connected(s)) {
        client.run_event_loop_once(&mut cstate);
        server.run_event_loop_once(&mut sstate);
        if t.elapsed() > Duration::from_secs(60) || phase.stopped() {
            return Err(format!("thread {i}: sessions not connected").into());
        }
    }
    phase.ready();
    let mut from: Option<(u64, ServerStats)> = None;
    while !phase.stopped() {
        for _ in 0..16 {
            client.run_event_loop_once(&mut cstate);
            cstate.drive(&mut client);
            server.run_event_loop_once(&mut sstate);
        }
        if from.is_none() && phase.started() {
            cstate.reset();
            from = Some((cstate.answered(), sstate.stats));
        }
    }
    let (a0, s0) = from.unwrap_or((cstate.answered(), sstate.stats));
    let answered = cstate.answered() - a0;
    let latency = cstate.latency.clone();
    let s = sstate.stats;
    let server_delta = ServerStats {
        gets: s.gets - s0.gets,
        puts: s.puts - s0.puts,
        bursts: s.bursts - s0.bursts,
        burst_reqs: s.burst_reqs - s0.burst_reqs,
        ..s
    };
    // Read back, while every thread still serves its partition.
    cstate.start_read_back();
    let t = Instant::now();
    let mut done = false;
    loop {
        client.run_event_loop_once(&mut cstate);
        cstate.drive(&mut client);
        server.run_event_loop_once(&mut sstate);
        if !done && (!cstate.reading_back() || t.elapsed() > Duration::from_secs(120)) {
            done = true;
            phase.finish();
        }
        if done && phase.all_finished(n) {
            break;
        }
    }
    if cstate.reading_back() {
        cstate.errors += 1;
        eprintln!("thread {i}: read-back unfinished after 120 s");
    }
    Ok(ThreadOut {
        server: sstate,
        client: cstate,
        answered,
        latency,
        server_delta,
    })
}

/// One point: a fresh pair of Nexuses with `h`, the states moved through
/// the threads and back.
fn point<E: Endpoints>(
    e: &E,
    h: Handlers,
    round: usize,
    states: &mut Vec<(KvServer, KvClient)>,
    rate_per_thread: f64,
    cli: &Cli,
) -> Res<Outcome> {
    let uris = threads::uris();
    let nexus = [
        herd::register::<E::T>(Nexus::builder(&uris[0]), h)
            .workers(0)
            .build()?,
        Nexus::builder(&uris[1]).workers(0).build()?,
    ];
    let n = states.len();
    let window = cli.round.window as usize;
    let inputs: Vec<_> = states.drain(..).map(|st| (e.clone(), st)).collect();
    let (outs, secs) = threads::run_round(
        inputs,
        Duration::from_secs_f64(cli.round.warmup),
        Duration::from_secs_f64(cli.round.secs),
        |i, (e, st), phase| {
            let ctx = (i, n, round, window);
            thread_main(
                e,
                ctx,
                nexus.clone(),
                uris[0].clone(),
                st,
                rate_per_thread,
                phase,
            )
        },
    )?;
    let mut out = Outcome::default();
    for t in outs {
        out.add(&Outcome {
            answered: t.answered,
            secs: 0.0,
            latency: Some(t.latency),
            server: t.server_delta,
        });
        states.push((t.server, t.client));
    }
    out.secs = secs;
    Ok(out)
}

fn main() -> ExitCode {
    erpc_apps::init_tracing();
    let cli = Cli::parse();
    let plan = match validate(&cli) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("herd-kv: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&cli, &plan) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("herd-kv: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Plan {
    net: Net,
    dists: Vec<KeyDist>,
    handlers: Vec<Handlers>,
}

fn validate(cli: &Cli) -> Result<Plan, String> {
    let (net, handlers) = cli.round.check()?;
    in_range("--keys", cli.keys, cli.round.threads, 100_000_000)?;
    in_range("--puts-per-mille", cli.puts_per_mille, 0, 1000)?;
    in_range("--rounds", cli.rounds, 1, 20)?;
    if !(cli.zipf.is_finite() && cli.zipf > 0.0 && cli.zipf <= 10.0) {
        return Err(format!(
            "--zipf {}: must be above 0 and at most 10",
            cli.zipf
        ));
    }
    if let Some(r) = cli.rate
        && !(r.is_finite() && r > 0.0 && r <= 1000.0)
    {
        return Err(format!(
            "--rate {r}: must be above 0 and at most 1000 (Mrps)"
        ));
    }
    let dists = match cli.dist.as_str() {
        "uniform" => vec![KeyDist::Uniform],
        "zipf" => vec![KeyDist::Zipf(cli.zipf)],
        "both" => vec![KeyDist::Uniform, KeyDist::Zipf(cli.zipf)],
        d => return Err(format!("--dist {d:?}: uniform, zipf or both")),
    };
    Ok(Plan {
        net,
        dists,
        handlers,
    })
}

fn run(cli: &Cli, plan: &Plan) -> Res<bool> {
    let region = erpc_apps::env::region(64);
    match plan.net {
        Net::Dev => {
            let net = DevNet::new(region)?;
            run_on(&net.endpoints(), cli, plan)
        }
        Net::Udp => run_on(&UdpEndpoints { region }, cli, plan),
    }
}

fn run_on<E: Endpoints>(e: &E, cli: &Cli, plan: &Plan) -> Res<bool> {
    let n = cli.round.threads as usize;
    println!(
        "herd-kv: {} items (16 B keys, 32 B values), {:.1} % GET / {:.1} % PUT; {}; {} thread(s), \
         thread i owns server Rpc i (key partition i) and client Rpc i; window {} per client; \
         {:.1} s per point after {:.1} s warm-up, {} round(s)",
        cli.keys,
        100.0 - cli.puts_per_mille as f64 / 10.0,
        cli.puts_per_mille as f64 / 10.0,
        plan.net,
        n,
        cli.round.window,
        cli.round.secs,
        cli.round.warmup,
        cli.rounds
    );
    println!(
        "{:<10} {:<12} {:<22} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "keys", "handlers", "load", "Mrps", "p50 µs", "p99 µs", "p99.9 µs", "req/burst"
    );
    let mut ok = true;
    let mut round = 0usize;
    for &dist in &plan.dists {
        let t = Instant::now();
        let tables = herd::preload(cli.keys, n);
        eprintln!(
            "preloaded {} items in {} partition(s) in {:.1} s",
            cli.keys,
            n,
            t.elapsed().as_secs_f64()
        );
        let mut states = tables
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let c = KvClient::new(
                    ClientConfig {
                        id: i as u32,
                        clients: n as u32,
                        keys: cli.keys,
                        dist,
                        puts_per_mille: cli.puts_per_mille,
                        window: cli.round.window as usize,
                        rate: 0.0,
                        seed: cli.seed.wrapping_mul(1000).wrapping_add(i as u64),
                    },
                    vec![vec![0]],
                )?;
                Ok((KvServer::new(t), c))
            })
            .collect::<Result<Vec<_>, String>>()?;
        // Capacity (closed loop), then one fixed offered load for both.
        let mut cap: Vec<(Handlers, Outcome)> = plan
            .handlers
            .iter()
            .map(|&h| (h, Outcome::default()))
            .collect();
        for _ in 0..cli.rounds {
            for (h, o) in cap.iter_mut() {
                round += 1;
                o.add(&point(e, *h, round, &mut states, 0.0, cli)?);
            }
        }
        let rate = match cli.rate {
            Some(r) => r * 1e6,
            None => 0.7 * cap[0].1.mrps() * 1e6,
        };
        let mut fixed: Vec<(Handlers, Outcome)> = plan
            .handlers
            .iter()
            .map(|&h| (h, Outcome::default()))
            .collect();
        for _ in 0..cli.rounds {
            for (h, o) in fixed.iter_mut() {
                round += 1;
                o.add(&point(e, *h, round, &mut states, rate / n as f64, cli)?);
            }
        }
        let row = |h: Handlers, load: String, o: &Outcome| {
            let p = o.pct();
            let per_burst = if o.server.bursts > 0 {
                format!("{:.1}", o.server.burst_reqs as f64 / o.server.bursts as f64)
            } else {
                "-".into()
            };
            println!(
                "{:<10} {:<12} {:<22} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>10}",
                dist.to_string(),
                h.to_string(),
                load,
                o.mrps(),
                p.p50_us,
                p.p99_us,
                p.p999_us,
                per_burst
            );
        };
        for (h, o) in &cap {
            row(
                *h,
                format!("closed, {} in flight", cli.round.window * n as u64),
                o,
            );
        }
        for (h, o) in &fixed {
            row(*h, format!("offered {:.3} Mrps", rate / 1e6), o);
        }
        if cap.len() == 2 {
            let (c0, c1) = (&cap[0].1, &cap[1].1);
            let (f0, f1) = (fixed[0].1.pct(), fixed[1].1.pct());
            println!(
                "{dist}: burst / per-request: capacity {:.2}x; at {:.3} Mrps offered: p50 {:.2}x, \
                 p99 {:.2}x",
                c1.mrps() / c0.mrps(),
                rate / 1e6,
                f1.p50_us / f0.p50_us,
                f1.p99_us / f0.p99_us
            );
        }
        let (mut wrong, mut errors, mut read_back, mut bad) = (0, 0, 0, 0);
        for (s, c) in &states {
            wrong += c.wrong;
            errors += c.errors;
            read_back += c.read_back;
            bad += s.stats.bad + s.stats.full + s.stats.respond_errors;
            if let Some(w) = &c.first_wrong {
                eprintln!("a client's first wrong answer: {w}");
            }
        }
        println!(
            "{dist}: every answer checked against the model: {wrong} wrong, {errors} failed, \
             {bad} refused by the server; {read_back} read-back GETs of written keys"
        );
        ok &= wrong == 0 && errors == 0 && bad == 0;
    }
    Ok(ok)
}
