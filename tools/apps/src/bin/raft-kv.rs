//! `raft-kv`: the Raft-replicated key-value store (tikv's raft over eRPC).
//!
//! ```sh
//! cargo run --release -p erpc-apps --bin raft-kv                 # benchmark on the device model
//! cargo run --release -p erpc-apps --bin raft-kv -- --kill-leader
//! sudo target/release/raft-kv netns-failover                     # processes in two namespaces, UDP
//! raft-kv replica --id 1 --listen 10.0.0.1:31850 --peer 2=10.0.0.2:31850 --peer 3=10.0.0.3:31850
//! raft-kv client --listen 10.0.0.4:31850 --replica 1=10.0.0.1:31850 ...
//! ```
//!
//! `bench` (the default) runs 3 replicas (or `--replicas 5`) and a client
//! in one thread on the device model (software ConnectX NICs, wall clock,
//! session management over kernel UDP on 127.0.0.1): it preloads `--keys`
//! keys (16-byte keys, 64-byte values) with 32 operations in flight,
//! measures eRPC's round trip to the leader (the reference), then
//! `--ops` PUTs one at a time (client → leader → majority commit →
//! response), prints the PUT latency, the leader's commit latency and
//! where the time went, and reads every acknowledged key back.
//! `--kill-leader` crashes the leader halfway through the PUTs (its NIC's
//! link goes down and the process is dropped).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, CommandFactory, Parser, Subcommand};

use erpc::Nexus;
use erpc_apps::cli;
use erpc_apps::env::{self, DevWorld, SimWorld, World};
use erpc_apps::raftkv::client::{PingWorkload, PutWorkload, ReadBack};
use erpc_apps::raftkv::wire::{Key, Value};
use erpc_apps::raftkv::{
    Client, ClientConfig, Cluster, PeerAddr, Replica, ReplicaConfig, rpc_config,
};
use erpc_apps::stats::Percentiles;
use transport::udp::{UdpConfig, UdpTransport};

#[derive(Parser, Debug)]
#[command(name = "raft-kv", about = "Raft-replicated key-value store over eRPC")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmark a cluster in one thread (the default).
    Bench(BenchArgs),
    /// One replica process over kernel UDP.
    Replica(ReplicaArgs),
    /// A client process over kernel UDP: preload, PUTs, read-back.
    Client(ClientArgs),
    /// Replicas and a client as processes in two network namespaces (two
    /// per namespace) over UDP; kills the leader mid-run (needs root).
    NetnsFailover(NetnsArgs),
}

#[derive(Args, Debug, Clone)]
struct BenchArgs {
    /// device-model (software ConnectX NICs, wall clock) or sim (eRPC's
    /// simulated network, virtual time: latencies are simulated).
    #[arg(long, default_value = "device-model", value_parser = ["device-model", "sim"])]
    transport: String,
    /// Replicas: 3, 5 or 7 (an odd count: an even one survives no more
    /// failures than the odd count below it).
    #[arg(long, default_value_t = 3, value_parser = odd_replicas)]
    replicas: usize,
    /// Keys preloaded (1 to 100 000 000).
    #[arg(long, default_value_t = 1_000_000, value_parser = cli::int_in::<1, 100_000_000>)]
    keys: u64,
    /// PUTs measured, one at a time (1 to 100 000 000).
    #[arg(long, default_value_t = 20_000, value_parser = cli::int_in::<1, 100_000_000>)]
    ops: u64,
    /// eRPC round trips measured for the reference (1 to 100 000 000).
    #[arg(long, default_value_t = 5_000, value_parser = cli::int_in::<1, 100_000_000>)]
    pings: u64,
    /// Crash the leader halfway through the measured PUTs.
    #[arg(long)]
    kill_leader: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args, Debug)]
struct ReplicaArgs {
    /// Raft id (1 or more; Raft reserves 0).
    #[arg(long, value_parser = cli::int_in::<1, { u64::MAX }>)]
    id: u64,
    /// This process's address: IPv4:SM-port.
    #[arg(long)]
    listen: SocketAddrV4,
    /// A peer replica, ID=IPv4:SM-port (repeat).
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<PeerAddr>,
    /// Exit after this long, seconds (1 to 86400).
    #[arg(long, default_value_t = 120, value_parser = cli::int_in::<1, 86_400>)]
    secs: u64,
    /// Raft tick (elections after 10 to 20 ticks of silence), ms (1 to
    /// 10000). Processes that share cores with busy neighbours need a
    /// longer one than the 1 ms of the single-thread benchmark.
    #[arg(long, default_value_t = 10, value_parser = cli::int_in::<1, 10_000>)]
    tick_ms: u64,
}

#[derive(Args, Debug)]
struct ClientArgs {
    /// Client id (deduplication).
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// This process's address: IPv4:SM-port.
    #[arg(long)]
    listen: SocketAddrV4,
    /// A replica, ID=IPv4:SM-port (repeat; at least one).
    #[arg(long = "replica", value_parser = parse_peer, required = true)]
    replicas: Vec<PeerAddr>,
    /// Keys preloaded, then read back with the PUTs (at least --lanes, at
    /// most 100 000 000).
    #[arg(long, default_value_t = 20_000, value_parser = cli::int_in::<1, 100_000_000>)]
    keys: u64,
    /// Random PUTs after the preload (0 to 100 000 000).
    #[arg(long, default_value_t = 4_000, value_parser = cli::int_in::<0, 100_000_000>)]
    ops: u64,
    /// Operations in flight (1 to 1024).
    #[arg(long, default_value_t = 8, value_parser = cli::count_in::<1, 1024>)]
    lanes: usize,
    /// Give up after this long, seconds (1 to 86400).
    #[arg(long, default_value_t = 100, value_parser = cli::int_in::<1, 86_400>)]
    secs: u64,
}

#[derive(Args, Debug)]
struct NetnsArgs {
    /// Keys preloaded (8 to 100 000 000: at least the client's lanes).
    #[arg(long, default_value_t = 20_000, value_parser = cli::int_in::<8, 100_000_000>)]
    keys: u64,
    /// Random PUTs after the preload; the leader dies after a third (3 to
    /// 100 000 000).
    #[arg(long, default_value_t = 6_000, value_parser = cli::int_in::<3, 100_000_000>)]
    ops: u64,
}

/// `--replicas`: 3, 5 or 7.
fn odd_replicas(s: &str) -> Result<usize, String> {
    match cli::count_in::<3, 7>(s) {
        Ok(n) if n % 2 == 1 => Ok(n),
        _ => Err("must be 3, 5 or 7 (an odd count)".into()),
    }
}

fn parse_peer(s: &str) -> Result<PeerAddr, String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ID=IPv4:PORT"))?;
    let id: u64 = id.parse().map_err(|e| format!("{s:?}: bad id: {e}"))?;
    let addr: SocketAddrV4 = addr
        .parse()
        .map_err(|e| format!("{s:?}: bad address: {e}"))?;
    Ok(PeerAddr {
        id,
        uri: addr.to_string(),
        rpc_id: 0,
    })
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A line on stdout; a closed pipe ends the program quietly.
macro_rules! out {
    () => { erpc_apps::out!("raft-kv", "") };
    ($($arg:tt)*) => { erpc_apps::out!("raft-kv", $($arg)*) };
}

fn main() -> ExitCode {
    erpc_apps::init_tracing();
    // With ERPC_INSPECT=1, the endpoint's socket goes with the process
    // on SIGTERM/SIGINT/SIGHUP too.
    if let Err(e) = erpc::inspect::remove_socket_on_termination() {
        tracing::warn!(error = %e, "no signal handler: a debug endpoint socket may outlive a signal");
    }
    let cli = Cli::parse();
    if let Some(Cmd::Client(a)) = &cli.cmd
        && a.keys < a.lanes as u64
    {
        // Each lane writes its own share of the keys.
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--keys {} is below --lanes {}: each lane needs a key of its own",
                    a.keys, a.lanes
                ),
            )
            .exit();
    }
    let r = match cli.cmd {
        None => bench(&cli.bench),
        Some(Cmd::Bench(a)) => bench(&a),
        Some(Cmd::Replica(a)) => replica(&a),
        Some(Cmd::Client(a)) => client(&a),
        Some(Cmd::NetnsFailover(a)) => netns_failover(&a),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // Bad flags were refused by clap (exit 2); this is a failed run.
        Err(e) => {
            eprintln!("raft-kv: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(a: &BenchArgs) -> Res<bool> {
    match a.transport.as_str() {
        "device-model" => {
            out!(
                "raft-kv: {} replicas + 1 client on the device model, all in one thread (1 core), \
                 wall clock; SM over kernel UDP on 127.0.0.1",
                a.replicas
            );
            run_bench(DevWorld::threaded(a.seed, env::region(96)), a, 500)
        }
        "sim" => {
            out!(
                "raft-kv: {} replicas + 1 client on eRPC's simulated network (virtual time: \
                 latencies are simulated, not measured)",
                a.replicas
            );
            run_bench(SimWorld::new(a.seed, erpc_sim::DEFAULT_LINK), a, 100)
        }
        t => Err(format!("--transport {t}: device-model or sim").into()),
    }
}

/// Polls until `done`, for at most `secs` of wall time and `polls` polls
/// (virtual worlds move 1 µs per poll).
fn run<W: World>(
    c: &mut Cluster<W>,
    what: &str,
    secs: u64,
    mut done: impl FnMut(&Cluster<W>) -> bool,
) -> Res<()> {
    let t0 = Instant::now();
    let mut i = 0u64;
    while !done(c) {
        c.poll();
        i += 1;
        if i.is_multiple_of(1024) && t0.elapsed() > Duration::from_secs(secs) {
            return Err(format!("{what}: not done after {secs} s: {c:?}").into());
        }
    }
    Ok(())
}

fn per_op(ns: u64, ops: u64) -> f64 {
    ns as f64 / ops.max(1) as f64 / 1_000.0
}

fn run_bench<W: World>(world: W, a: &BenchArgs, failure_ms: u64) -> Res<bool> {
    let mut c = Cluster::new(world, a.replicas, failure_ms, ReplicaConfig::new)?;
    run(&mut c, "election", 30, |c| c.leader().is_some())?;
    let leader = c.leader().expect("elected");
    out!("leader: replica {}", leader + 1);

    // Preload with 32 operations in flight.
    let t0 = Instant::now();
    let t0v = c.world.now_ns();
    let pre = c.add_client(
        |r| ClientConfig {
            lanes: 32,
            ..ClientConfig::new(1, r)
        },
        Box::new(PutWorkload::preload(a.keys, 32)),
    )?;
    run(&mut c, "preload", 3_600, |c| c.clients_idle())?;
    let secs = if a.transport == "sim" {
        (c.world.now_ns() - t0v) as f64 / 1e9
    } else {
        t0.elapsed().as_secs_f64()
    };
    out!(
        "preloaded {} keys in {:.1} s ({:.0} PUTs/s with 32 in flight)",
        a.keys,
        secs,
        a.keys as f64 / secs
    );

    // The measuring client: eRPC round trips first (reference), then PUTs.
    let m = c.add_client(
        |r| ClientConfig::new(2, r),
        Box::new(PingWorkload { left: a.pings }),
    )?;
    run(&mut c, "pings", 600, |c| c.clients_idle())?;
    let ping = Percentiles::of(&c.clients[m].state.stats.ping_latency);
    for r in c.replicas.iter_mut().flatten() {
        r.state.reset_stats();
    }
    c.clients[m]
        .state
        .set_workload(Box::new(PutWorkload::random(a.keys, 1, a.ops, a.seed)));
    let mut killed_at = None;
    if a.kill_leader {
        let half = a.ops / 2;
        run(&mut c, "first half", 3_600, |c| {
            c.clients[m].state.stats.puts >= half
        })?;
        let l = c.leader().ok_or("no leader")?;
        out!("crashing the leader, replica {}", l + 1);
        killed_at = Some((c.world.now_ns(), l));
        c.crash(l);
    }
    run(&mut c, "PUTs", 3_600, |c| c.clients_idle())?;
    let cs = &c.clients[m].state.stats;
    let put = Percentiles::of(&cs.put_latency);
    out!();
    out!("eRPC round trip client → leader (reference): {ping}");
    out!("PUT latency (client → leader → majority commit → client): {put}");
    out!(
        "  = {:.2}x the eRPC round trip at the median (the paper: 5.5 µs PUTs on real \
         ConnectX-4 hardware with 2.3 µs round trips, 2.4x)",
        put.p50_us / ping.p50_us
    );
    if let Some((t, l)) = killed_at {
        out!(
            "leader replica {} crashed at t = {:.3} s; the slowest PUT (the failover) took {:.1} ms; \
             client: {:?}",
            l + 1,
            t as f64 / 1e9,
            put.max_us / 1e3,
            cs
        );
    }
    let ops = cs.puts;
    if let Some(l) = c.leader() {
        let s = &c.replicas[l].as_ref().expect("leader alive").state.stats;
        out!(
            "leader commit latency (PUT arrival → applied on the leader): {}",
            Percentiles::of(&s.commit_latency)
        );
    }
    out!(
        "CPU per PUT, by replica (µs; one thread runs everything, so the PUT latency is the sum \
         of all work on its path plus idle polling):"
    );
    out!("  replica   raft-rs   protobuf   log   state machine");
    let mut total = [0u64; 4];
    for (i, r) in c.replicas.iter().enumerate() {
        let Some(r) = r else { continue };
        let s = &r.state.stats;
        let v = [s.raft_ns, s.codec_ns, s.store_ns, s.sm_ns];
        for k in 0..4 {
            total[k] += v[k];
        }
        out!(
            "  {:>7} {:>9.2} {:>10.2} {:>5.2} {:>15.2}{}",
            i + 1,
            per_op(v[0], ops),
            per_op(v[1], ops),
            per_op(v[2], ops),
            per_op(v[3], ops),
            if r.state.is_leader() {
                "  (leader)"
            } else {
                ""
            }
        );
    }
    let app: u64 = total.iter().sum();
    let mean_put = cs.put_latency.mean() / 1_000.0;
    out!(
        "  mean PUT {:.2} µs = raft-rs {:.2} + protobuf {:.2} + log {:.2} + state machine {:.2} \
         + eRPC, device model and polling {:.2}",
        mean_put,
        per_op(total[0], ops),
        per_op(total[1], ops),
        per_op(total[2], ops),
        per_op(total[3], ops),
        mean_put - per_op(app, ops)
    );

    // Read every acknowledged key back through the leader.
    let mut expected: HashMap<Key, Value> = c.clients[pre]
        .state
        .workload_as::<PutWorkload>()
        .expect("preload")
        .acked
        .clone();
    expected.extend(
        c.clients[m]
            .state
            .workload_as::<PutWorkload>()
            .expect("PUTs")
            .acked
            .iter()
            .map(|(k, v)| (*k, *v)),
    );
    c.clients[m]
        .state
        .set_workload(Box::new(ReadBack::new(&expected, 64)));
    run(&mut c, "read-back", 3_600, |c| c.clients_idle())?;
    let rb = c.clients[m]
        .state
        .workload_as::<ReadBack>()
        .expect("read-back");
    let ok = rb.mismatches == 0 && rb.matched == expected.len() as u64;
    out!(
        "read back {} acknowledged keys: {} match, {} wrong, {} missing{}",
        expected.len(),
        rb.matched,
        rb.wrong.len(),
        rb.missing.len(),
        if ok { "" } else { "  ACKNOWLEDGED WRITES LOST" }
    );
    Ok(ok)
}

fn udp_nexus_and_transport(
    listen: SocketAddrV4,
    register: impl FnOnce(erpc::NexusBuilder) -> erpc::NexusBuilder,
) -> Res<(Arc<Nexus>, UdpTransport, mempool::Allocator)> {
    let nexus = register(Nexus::builder(&listen.to_string())).build()?;
    let t = UdpTransport::new(&UdpConfig::new(SocketAddrV4::new(*listen.ip(), 0)))?;
    let alloc = erpc_sim::sim_allocator(env::PROCESS_BYTES, env::region(16))?;
    Ok((nexus, t, alloc))
}

fn replica(a: &ReplicaArgs) -> Res<bool> {
    let (nexus, t, alloc) = udp_nexus_and_transport(a.listen, Replica::<UdpTransport>::register)?;
    let mut r = Replica::new(
        &nexus,
        0,
        t,
        alloc,
        rpc_config(500),
        ReplicaConfig {
            tick_us: a.tick_ms * 1_000,
            op_timeout_ms: 40 * a.tick_ms,
            ..ReplicaConfig::new(a.id, a.peers.clone())
        },
    )?;
    let t0 = Instant::now();
    let mut term_announced = 0;
    let mut out = std::io::stdout();
    while t0.elapsed() < Duration::from_secs(a.secs) {
        for _ in 0..256 {
            r.poll();
        }
        // Processes here may share cores: let the others run.
        std::thread::yield_now();
        if r.state.is_leader() && r.state.term() != term_announced {
            term_announced = r.state.term();
            writeln!(out, "LEADER {} term {}", a.id, term_announced)?;
            out.flush()?;
        }
    }
    out!("replica {} exiting: {:?}", a.id, r.state.stats);
    Ok(true)
}

fn client(a: &ClientArgs) -> Res<bool> {
    let (nexus, t, alloc) = udp_nexus_and_transport(a.listen, |b| b)?;
    let mut c = Client::new(
        &nexus,
        0,
        t,
        alloc,
        rpc_config(500),
        ClientConfig {
            lanes: a.lanes,
            op_timeout_ms: 1_000,
            ..ClientConfig::new(a.id, a.replicas.clone())
        },
        Box::new(PutWorkload::preload(a.keys, a.lanes)),
    )?;
    let t0 = Instant::now();
    let deadline = Duration::from_secs(a.secs);
    let poll_until = |c: &mut Client<UdpTransport>, what: &str| -> Res<()> {
        let mut last = 0;
        while !c.state.idle() {
            for _ in 0..256 {
                c.poll();
            }
            std::thread::yield_now();
            if c.state.stats.puts / 500 != last {
                last = c.state.stats.puts / 500;
                out!("PUTS {}", c.state.stats.puts);
            }
            if t0.elapsed() > deadline {
                return Err(format!("{what}: not done after {} s: {:?}", a.secs, c.state).into());
            }
        }
        Ok(())
    };
    poll_until(&mut c, "preload")?;
    let mut expected = c
        .state
        .workload_as::<PutWorkload>()
        .expect("preload")
        .acked
        .clone();
    c.state.set_workload(Box::new(PutWorkload::random(
        a.keys,
        a.lanes,
        a.ops / a.lanes as u64,
        a.id,
    )));
    poll_until(&mut c, "PUTs")?;
    expected.extend(
        c.state
            .workload_as::<PutWorkload>()
            .expect("PUTs")
            .acked
            .iter()
            .map(|(k, v)| (*k, *v)),
    );
    let stats = format!("{:?}", c.state.stats);
    c.state.set_workload(Box::new(ReadBack::new(&expected, 64)));
    poll_until(&mut c, "read-back")?;
    let rb = c.state.workload_as::<ReadBack>().expect("read-back");
    let ok = rb.mismatches == 0 && rb.matched == expected.len() as u64;
    out!("client: {stats}");
    out!(
        "RAFT-KV-CLIENT {} acked {} matched {} wrong {} missing {}",
        if ok { "OK" } else { "LOST" },
        expected.len(),
        rb.matched,
        rb.wrong.len(),
        rb.missing.len()
    );
    Ok(ok)
}

fn ip(args: &[&str]) -> Res<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// Two namespaces and a veth pair, removed on drop.
struct Netns {
    names: [String; 2],
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// A child process whose stdout lines are collected by a thread.
struct Proc {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(name: &str, ns: &str, args: &[String]) -> Res<Proc> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&exe)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("piped");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        Ok(Proc {
            name: name.to_owned(),
            child,
            lines,
        })
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn netns_failover(a: &NetnsArgs) -> Res<bool> {
    let tag = std::process::id() % 50_000;
    let net = (std::process::id() % 100 + 100) as u8;
    let ns = Netns {
        names: [format!("raftkv-a-{tag}"), format!("raftkv-b-{tag}")],
    };
    let (va, vb) = (format!("rka{tag}"), format!("rkb{tag}"));
    let (ipa, ipb) = (
        Ipv4Addr::new(10, 232, net, 1),
        Ipv4Addr::new(10, 232, net, 2),
    );
    ip(&["netns", "add", &ns.names[0]])?;
    ip(&["netns", "add", &ns.names[1]])?;
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    ip(&["link", "set", &va, "netns", &ns.names[0]])?;
    ip(&["link", "set", &vb, "netns", &ns.names[1]])?;
    for (n, dev, addr) in [(&ns.names[0], &va, ipa), (&ns.names[1], &vb, ipb)] {
        ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
        ip(&["-n", n, "link", "set", dev, "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
    }
    // Two processes per namespace: replicas 1 and 2 in A; replica 3 and
    // the client in B.
    let addrs = [
        (1u64, 0usize, SocketAddrV4::new(ipa, 31850)),
        (2, 0, SocketAddrV4::new(ipa, 31851)),
        (3, 1, SocketAddrV4::new(ipb, 31850)),
    ];
    let client_addr = SocketAddrV4::new(ipb, 31851);
    out!(
        "netns-failover: replicas 1, 2 in {} ({ipa}), replica 3 and the client in {} ({ipb}), \
         eRPC over kernel UDP",
        ns.names[0],
        ns.names[1]
    );
    let mut replicas: Vec<Option<Proc>> = Vec::new();
    for &(id, n, addr) in &addrs {
        let mut args = vec![
            "replica".to_owned(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.to_string(),
            "--secs".into(),
            "150".into(),
        ];
        for &(pid, _, paddr) in addrs.iter().filter(|p| p.0 != id) {
            args.push("--peer".into());
            args.push(format!("{pid}={paddr}"));
        }
        replicas.push(Some(Proc::spawn(
            &format!("replica {id}"),
            &ns.names[n],
            &args,
        )?));
    }
    let mut args = vec![
        "client".to_owned(),
        "--listen".into(),
        client_addr.to_string(),
        "--keys".into(),
        a.keys.to_string(),
        "--ops".into(),
        a.ops.to_string(),
        "--secs".into(),
        "120".into(),
    ];
    for &(id, _, addr) in &addrs {
        args.push("--replica".into());
        args.push(format!("{id}={addr}"));
    }
    let mut client = Proc::spawn("client", &ns.names[1], &args)?;
    let t0 = Instant::now();
    let target = a.keys + a.ops / 3;
    let mut killed = None;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(status) = client.child.try_wait()? {
            let lines = client.lines();
            for l in &lines {
                out!("  client: {l}");
            }
            let Some(killed) = killed else {
                return Err(
                    format!("the client exited ({status}) before the leader was killed").into(),
                );
            };
            let ok = status.success() && lines.iter().any(|l| l.starts_with("RAFT-KV-CLIENT OK"));
            let new_leader = replicas
                .iter()
                .flatten()
                .filter_map(|p| {
                    p.lines()
                        .iter()
                        .rev()
                        .find_map(|l| l.strip_prefix("LEADER ").map(str::to_owned))
                })
                .next_back();
            out!(
                "killed the leader (replica {killed}); new leader: {}; {}",
                new_leader.unwrap_or_else(|| "?".into()),
                if ok {
                    "no acknowledged write lost"
                } else {
                    "FAILED"
                }
            );
            return Ok(ok);
        }
        if killed.is_none() {
            let puts = client
                .lines()
                .iter()
                .rev()
                .find_map(|l| l.strip_prefix("PUTS ").and_then(|n| n.parse::<u64>().ok()))
                .unwrap_or(0);
            if puts >= target {
                // The latest leader announcement across the replicas.
                let leader = replicas
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| {
                        let p = p.as_ref()?;
                        let term = p.lines().iter().rev().find_map(|l| {
                            l.strip_prefix("LEADER ")?
                                .split_once(" term ")?
                                .1
                                .parse::<u64>()
                                .ok()
                        })?;
                        Some((term, i))
                    })
                    .max();
                let Some((_, i)) = leader else {
                    return Err("no replica announced leadership".into());
                };
                let p = replicas[i].take().expect("alive");
                out!(
                    "{} PUTs acknowledged: killing {} (the leader)",
                    puts,
                    p.name
                );
                killed = Some(i + 1);
                drop(p); // SIGKILL
            }
        }
        if t0.elapsed() > Duration::from_secs(140) {
            return Err("the client did not finish in 140 s".into());
        }
    }
}
