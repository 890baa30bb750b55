//! `sequencer`: the networked sequencer benchmark — client sessions ask
//! for the next number — with per-request handlers (one atomic add per
//! request) and burst handlers (one add of N per burst of N) in the same
//! run, every number audited: none received twice, none beyond the
//! counter, no gap without a failed request.
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin sequencer
//! cargo run --release -p erpc-apps --bin sequencer -- --transport udp --threads 2
//! ```
//!
//! Thread i owns server Rpc i and client Rpc i; the server Rpcs share one
//! counter. Client Rpc i opens `--sessions` sessions, spread over the
//! server Rpcs, and keeps `--window` requests in flight over them.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use erpc::{Nexus, Rpc};
use erpc_apps::sequencer::{self, Handlers, SeqClient, SeqServer};
use erpc_apps::stats::Percentiles;
use erpc_apps::threads::{self, DevNet, Endpoints, Net, Phase, Res, UdpEndpoints, in_range};

#[derive(Parser, Debug)]
#[command(
    name = "sequencer",
    about = "Networked sequencer over eRPC: per-request vs burst handlers"
)]
struct Cli {
    #[command(flatten)]
    round: threads::RoundArgs,
    /// Sessions per client Rpc, 1 to 64.
    #[arg(long, default_value_t = 8)]
    sessions: u64,
    /// Rounds (each handler kind once per round, alternating), 1 to 20.
    #[arg(long, default_value_t = 3)]
    rounds: u64,
}

struct ThreadOut {
    client: SeqClient,
    server: SeqServer,
    answered: u64,
    latency: hdrhistogram::Histogram<u64>,
}

fn thread_main<E: Endpoints>(
    e: E,
    (i, n, round): (usize, usize, usize),
    nexus: [Arc<Nexus>; 2],
    server_uri: String,
    (counter, sessions, window): (sequencer::Counter, usize, usize),
    phase: &Phase,
) -> Res<ThreadOut> {
    let (st, sa) = e.make(0, i, round)?;
    let (ct, ca) = e.make(1, i, round)?;
    let mut server: Rpc<E::T, SeqServer> = Rpc::builder(&nexus[0], st, sa).id(i as u8).build()?;
    let mut client: Rpc<E::T, SeqClient> = Rpc::builder(&nexus[1], ct, ca).id(i as u8).build()?;
    if !phase.created(n) {
        return Err(format!("thread {i}: another thread failed to set up").into());
    }
    let mut sstate = SeqServer::new(counter);
    let sns = (0..sessions)
        .map(|s| client.create_session(&server_uri, ((i + s) % n) as u8))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cstate = SeqClient::new(i as u32, sns.clone(), window);
    let t = Instant::now();
    while !sns.iter().all(|&s| client.is_connected(s)) {
        client.run_event_loop_once(&mut cstate);
        server.run_event_loop_once(&mut sstate);
        if t.elapsed() > Duration::from_secs(60) || phase.stopped() {
            return Err(format!("thread {i}: sessions not connected").into());
        }
    }
    phase.ready();
    let mut from = None;
    while !phase.stopped() {
        for _ in 0..16 {
            client.run_event_loop_once(&mut cstate);
            cstate.drive(&mut client);
            server.run_event_loop_once(&mut sstate);
        }
        if from.is_none() && phase.started() {
            cstate.latency.reset();
            from = Some(cstate.got.len());
        }
    }
    let answered = (cstate.got.len() - from.unwrap_or(cstate.got.len())) as u64;
    let latency = cstate.latency.clone();
    cstate.running = false;
    // Drain while every thread still serves.
    let t = Instant::now();
    let mut done = false;
    loop {
        client.run_event_loop_once(&mut cstate);
        server.run_event_loop_once(&mut sstate);
        if !done && (cstate.in_flight() == 0 || t.elapsed() > Duration::from_secs(60)) {
            done = true;
            phase.finish();
        }
        if done && phase.all_finished(n) {
            break;
        }
    }
    Ok(ThreadOut {
        client: cstate,
        server: sstate,
        answered,
        latency,
    })
}

#[derive(Default)]
struct Outcome {
    answered: u64,
    secs: f64,
    latency: Option<hdrhistogram::Histogram<u64>>,
    handed: u64,
    bursts: u64,
    audit_failures: u64,
}

fn point<E: Endpoints>(e: &E, h: Handlers, round: usize, cli: &Cli) -> Res<Outcome> {
    let n = cli.round.threads as usize;
    let uris = threads::uris();
    let nexus = [
        sequencer::register::<E::T>(Nexus::builder(&uris[0]), h)
            .workers(0)
            .build()?,
        Nexus::builder(&uris[1]).workers(0).build()?,
    ];
    let counter = sequencer::counter();
    let (sessions, window) = (cli.sessions as usize, cli.round.window as usize);
    let inputs: Vec<_> = (0..n).map(|_| (e.clone(), counter.clone())).collect();
    let (outs, secs) = threads::run_round(
        inputs,
        Duration::from_secs_f64(cli.round.warmup),
        Duration::from_secs_f64(cli.round.secs),
        |i, (e, counter), phase| {
            let work = (counter, sessions, window);
            thread_main(
                e,
                (i, n, round),
                nexus.clone(),
                uris[0].clone(),
                work,
                phase,
            )
        },
    )?;
    let taken = counter.load(std::sync::atomic::Ordering::Acquire);
    let lost: u64 = outs
        .iter()
        .map(|t| t.client.failed.len() as u64 + t.client.in_flight() as u64)
        .sum();
    let audit = sequencer::audit(taken, outs.iter().map(|t| &t.client.got[..]), lost);
    let wrong: u64 = outs.iter().map(|t| t.client.wrong + t.client.errors).sum();
    if !audit.ok() || wrong > 0 {
        eprintln!(
            "{h} round {round}: audit FAILED: {audit}; {wrong} malformed answers or send errors"
        );
    }
    let mut latency = erpc_apps::stats::histogram();
    for t in &outs {
        latency.add(&t.latency).expect("same bounds");
    }
    Ok(Outcome {
        answered: outs.iter().map(|t| t.answered).sum(),
        secs,
        latency: Some(latency),
        handed: outs.iter().map(|t| t.server.stats.handed).sum(),
        bursts: outs.iter().map(|t| t.server.stats.bursts).sum(),
        audit_failures: u64::from(!audit.ok() || wrong > 0),
    })
}

fn main() -> ExitCode {
    erpc_apps::init_tracing();
    let cli = Cli::parse();
    let plan = match validate(&cli) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sequencer: {e}");
            return ExitCode::from(2);
        }
    };
    let region = erpc_apps::env::region(64);
    let r = match plan.0 {
        Net::Dev => DevNet::new(region).and_then(|net| run_on(&net.endpoints(), &cli, &plan)),
        Net::Udp => run_on(&UdpEndpoints { region }, &cli, &plan),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sequencer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn validate(cli: &Cli) -> Result<(Net, Vec<Handlers>), String> {
    let (net, handlers) = cli.round.check()?;
    in_range("--sessions", cli.sessions, 1, 64)?;
    in_range("--rounds", cli.rounds, 1, 20)?;
    Ok((net, handlers))
}

fn run_on<E: Endpoints>(e: &E, cli: &Cli, plan: &(Net, Vec<Handlers>)) -> Res<bool> {
    let n = cli.round.threads as usize;
    println!(
        "sequencer: {}; {} thread(s), thread i owns server Rpc i and client Rpc i, one shared \
         counter; {} sessions and {} in flight per client; {:.1} s per point after {:.1} s \
         warm-up, {} round(s)",
        plan.0, n, cli.sessions, cli.round.window, cli.round.secs, cli.round.warmup, cli.rounds
    );
    let mut res: Vec<(Handlers, Outcome)> =
        plan.1.iter().map(|&h| (h, Outcome::default())).collect();
    let mut round = 0;
    for _ in 0..cli.rounds {
        for (h, o) in res.iter_mut() {
            round += 1;
            let p = point(e, *h, round, cli)?;
            o.answered += p.answered;
            o.secs += p.secs;
            o.handed += p.handed;
            o.bursts += p.bursts;
            o.audit_failures += p.audit_failures;
            match &mut o.latency {
                Some(l) => l
                    .add(p.latency.as_ref().expect("set"))
                    .expect("same bounds"),
                None => o.latency = p.latency,
            }
        }
    }
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>12} {:>10}",
        "handlers", "Mops", "p50 µs", "p99 µs", "numbers/add", "audit"
    );
    let mut ok = true;
    for (h, o) in &res {
        let p = o.latency.as_ref().map(Percentiles::of).unwrap_or_default();
        let per_add = if o.bursts > 0 {
            o.handed as f64 / o.bursts as f64
        } else {
            1.0
        };
        println!(
            "{:<12} {:>9.3} {:>9.1} {:>9.1} {:>12.1} {:>10}",
            h.to_string(),
            o.answered as f64 / o.secs / 1e6,
            p.p50_us,
            p.p99_us,
            per_add,
            if o.audit_failures == 0 {
                "exact"
            } else {
                "FAILED"
            }
        );
        ok &= o.audit_failures == 0;
    }
    if res.len() == 2 {
        let r = |o: &Outcome| o.answered as f64 / o.secs;
        println!(
            "burst / per-request: {:.2}x Mops (every number of every round audited: {})",
            r(&res[1].1) / r(&res[0].1),
            if ok { "each handed out once" } else { "FAILED" }
        );
    }
    Ok(ok)
}
