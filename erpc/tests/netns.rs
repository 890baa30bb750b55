//! Two processes in two network namespaces joined by a veth pair, talking
//! eRPC, with session management over kernel UDP and the data path either
//! over kernel UDP or over the mlx5 transport on a device-model NIC whose
//! fabric is bridged (AF_PACKET) onto the process's veth end. Needs root
//! and `ip`; reported as ignored with the reason otherwise (a libtest-mimic
//! harness checks before running), except in CI (`ERPC_CI=1`), where it
//! must run.
//!
//! The test re-runs this test binary inside each namespace as a child
//! (`netns_child`, an ignored test, idle unless `ERPC_NETNS_ROLE` is set).

mod common;

fn main() -> std::process::ExitCode {
    use libtest_mimic::{Arguments, Trial};
    let args = Arguments::from_args();
    let missing = if std::env::var_os("ERPC_NETNS_ROLE").is_some() {
        None
    } else {
        missing_prerequisite()
    };
    let test = |name: &str, f: fn()| {
        let run = Trial::test(name, move || {
            f();
            Ok(())
        });
        match &missing {
            None => run,
            Some(why) if std::env::var_os("ERPC_CI").is_some() => {
                let why = why.clone();
                Trial::test(name, move || {
                    Err(format!("ERPC_CI is set but the namespace test cannot run: {why}").into())
                })
            }
            Some(why) => {
                if !args.list {
                    eprintln!("{name}: ignored: {why}");
                }
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            }
        }
    };
    let trials = vec![
        test(
            "two_processes_two_namespaces_over_udp",
            two_processes_two_namespaces_over_udp,
        ),
        test(
            "two_processes_two_namespaces_over_the_device_model_bridge",
            two_processes_two_namespaces_over_the_device_model_bridge,
        ),
        test(
            "a_killed_server_process_fails_the_clients_requests",
            a_killed_server_process_fails_the_clients_requests,
        ),
        Trial::test("netns_child", || {
            netns_child();
            Ok(())
        })
        .with_ignored_flag(true),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

/// Why two namespaces cannot be made here, if they cannot: root, `ip`, and
/// a probe namespace created and removed.
fn missing_prerequisite() -> Option<String> {
    if !is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` command (iproute2) is missing".into());
    }
    let probe = format!("erpc-probe-{}", std::process::id());
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("cannot create a network namespace: {e}")),
    }
}

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

use common::app::{self, Ctx, ECHO, SIZED};
use erpc::{Nexus, Rpc};
use mempool::Allocator;
use netsim::Rng;
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

const OPS: usize = 1000;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Two namespaces and a veth pair, removed on drop.
struct Netns {
    a: String,
    b: String,
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and its peer.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn skip_or_fail(why: &str) {
    if std::env::var_os("ERPC_CI").is_some() {
        panic!("ERPC_CI is set but the namespace test cannot run: {why}");
    }
    eprintln!("skipping the two-namespace test: {why}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn two_processes_two_namespaces_over_udp() {
    two_processes("udp");
}

fn two_processes_two_namespaces_over_the_device_model_bridge() {
    two_processes("bridge");
}

/// Two namespaces joined by a veth pair with addresses, or why not.
struct Pair {
    ns: Netns,
    va: String,
    vb: String,
    ipa: Ipv4Addr,
    ipb: Ipv4Addr,
}

fn make_pair(variant: u32) -> Option<Pair> {
    if std::env::var_os("ERPC_NETNS_ROLE").is_some() {
        return None;
    }
    if !is_root() {
        skip_or_fail("not root (network namespaces need CAP_SYS_ADMIN)");
        return None;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        skip_or_fail("the `ip` command (iproute2) is missing");
        return None;
    }
    let tag = (std::process::id() % 20_000) * 3 + variant;
    let net = ((std::process::id() % 70) * 3 + 20 + variant) as u8;
    let ns = Netns {
        a: format!("erpc-a-{tag}"),
        b: format!("erpc-b-{tag}"),
    };
    let (va, vb) = (format!("era{tag}"), format!("erb{tag}"));
    let (ipa, ipb) = (
        Ipv4Addr::new(10, 231, net, 1),
        Ipv4Addr::new(10, 231, net, 2),
    );
    let setup = || -> Result<(), String> {
        ip(&["netns", "add", &ns.a])?;
        ip(&["netns", "add", &ns.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &ns.a])?;
        ip(&["link", "set", &vb, "netns", &ns.b])?;
        for (n, dev, addr) in [(&ns.a, &va, ipa), (&ns.b, &vb, ipb)] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", n, "link", "set", dev, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(())
    };
    if let Err(e) = setup() {
        drop(ns);
        skip_or_fail(&e);
        return None;
    }
    Some(Pair {
        ns,
        va,
        vb,
        ipa,
        ipb,
    })
}

fn two_processes(data_path: &str) {
    let Some(Pair {
        ns,
        va,
        vb,
        ipa,
        ipb,
    }) = make_pair(u32::from(data_path == "bridge"))
    else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let spawn = |n: &str, dev: &str, me: Ipv4Addr, peer: Ipv4Addr, id: u64| {
        Command::new("ip")
            .args(["netns", "exec", n])
            .arg(&exe)
            .args(["--exact", "netns_child", "--ignored", "--nocapture"])
            .arg("--test-threads=1")
            .env("ERPC_NETNS_ROLE", id.to_string())
            .env("ERPC_NETNS_SELF", me.to_string())
            .env("ERPC_NETNS_PEER", peer.to_string())
            .env("ERPC_NETNS_DATA", data_path)
            .env("ERPC_NETNS_DEV", dev)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child")
    };
    let ca = spawn(&ns.a, &va, ipa, ipb, 1);
    let cb = spawn(&ns.b, &vb, ipb, ipa, 2);
    for (name, c) in [("A", ca), ("B", cb)] {
        let out = c.wait_with_output().expect("child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains(&format!("NETNS-OK data {data_path}")),
            "child {name} failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
    }
}

/// A server process in one namespace holds a client's requests (its
/// handler keeps them unanswered) and is killed (SIGKILL): the client, in
/// the other namespace, must see every request fail with `PeerFailed`
/// once the failure timeout passes, and say how long it took.
fn a_killed_server_process_fails_the_clients_requests() {
    use std::io::{BufRead, BufReader};
    let Some(p) = make_pair(2) else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let spawn = |n: &str, role: &str, me: Ipv4Addr, peer: Ipv4Addr| {
        Command::new("ip")
            .args(["netns", "exec", n])
            .arg(&exe)
            .args(["--exact", "netns_child", "--ignored", "--nocapture"])
            .arg("--test-threads=1")
            .env("ERPC_NETNS_ROLE", role)
            .env("ERPC_NETNS_SELF", me.to_string())
            .env("ERPC_NETNS_PEER", peer.to_string())
            .env("ERPC_NETNS_DATA", "udp")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child")
    };
    let mut server = spawn(&p.ns.a, "holder", p.ipa, p.ipb);
    let mut client = spawn(&p.ns.b, "victim", p.ipb, p.ipa);
    // Kill the server once it holds every request.
    let out = server.stdout.take().expect("piped");
    let mut held = false;
    let mut seen = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.expect("server output");
        seen.push(line.clone());
        if line.contains(&format!("HOLDING {HELD}")) {
            held = true;
            break;
        }
    }
    if !held {
        let _ = client.kill();
        let c = client.wait_with_output().expect("client");
        let s = server.wait_with_output().expect("server");
        panic!(
            "the server exited before holding the requests:\nserver: {seen:?}\n{}\nclient: {}\n{}",
            String::from_utf8_lossy(&s.stderr),
            String::from_utf8_lossy(&c.stdout),
            String::from_utf8_lossy(&c.stderr)
        );
    }
    server.kill().expect("kill the server");
    let _ = server.wait();
    let out = client.wait_with_output().expect("client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("KILL-OK {HELD} PeerFailed")),
        "client failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("KILL-OK"))
        .unwrap_or_default();
    println!("{line}");
}

/// Requests the killed server holds.
const HELD: usize = 4;

/// The two sides of the kill test.
fn kill_test_child(role: &str, me: Ipv4Addr, peer: Ipv4Addr) {
    let t = UdpTransport::new(&UdpConfig::new(SocketAddrV4::new(me, 0))).expect("udp");
    let nexus = app::register::<UdpTransport>(Nexus::builder(&format!("{me}:31850")))
        .build()
        .expect("nexus");
    let mut rpc: Rpc<UdpTransport, Ctx> =
        Rpc::builder(&nexus, t, erpc_sim::test_allocator(8 << 20))
            .session_handler(app::sm_handler::<UdpTransport>)
            .build()
            .expect("rpc");
    let mut ctx = Ctx::new(1);
    let clock = nexus.clock().clone();
    let deadline = clock.now_ns() + 60_000_000_000;
    if role == "holder" {
        let mut told = 0;
        loop {
            rpc.run_event_loop_once(&mut ctx);
            if ctx.deferred.len() != told {
                told = ctx.deferred.len();
                println!("HOLDING {told}");
            }
            assert!(clock.now_ns() < deadline, "never killed");
        }
    }
    let sn = loop {
        ctx.events.clear();
        let sn = rpc
            .create_session(&format!("{peer}:31850"), 0)
            .expect("session");
        while ctx.events.is_empty() {
            rpc.run_event_loop_once(&mut ctx);
            assert!(clock.now_ns() < deadline, "no session event");
        }
        if rpc.is_connected(sn) {
            break sn;
        }
        rpc.run_event_loop(&mut ctx, std::time::Duration::from_millis(50));
    };
    ctx.sessions.push(sn);
    ctx.todo = (0..HELD)
        .map(|_| app::Op {
            req_type: app::DEFER,
            req_len: 64,
            resp_len: 64,
        })
        .collect();
    app::start(&mut rpc, &mut ctx, HELD);
    let mut first_failure = None;
    while ctx.failed + ctx.completed < HELD as u64 {
        rpc.run_event_loop_once(&mut ctx);
        if ctx.failed > 0 {
            first_failure.get_or_insert_with(|| clock.now_ns());
        }
        assert!(
            clock.now_ns() < deadline,
            "{} of {HELD} requests failed; {}",
            ctx.failed,
            rpc.stats()
        );
    }
    let all_peer_failed = ctx.failures.iter().all(|e| {
        matches!(
            e,
            erpc::RpcError::SessionEnded {
                why: erpc::SessionEnd::PeerFailed,
                ..
            }
        )
    });
    assert!(all_peer_failed && ctx.completed == 0, "{:?}", ctx.failures);
    assert!(
        ctx.events
            .iter()
            .any(|e| e.kind == erpc::SessionEventKind::Ended(erpc::SessionEnd::PeerFailed))
    );
    assert_eq!(rpc.num_sessions(), 0);
    println!(
        "KILL-OK {HELD} PeerFailed (pings sent {}, failure timeout {} ms)",
        nexus.liveness_stats().pings_sent,
        nexus.failure_timeout_ns() / 1_000_000
    );
}

/// The child: one Nexus and one Rpc in this namespace, client of the peer
/// and server for it. Idle unless run by the test above.
fn netns_child() {
    let Ok(role) = std::env::var("ERPC_NETNS_ROLE") else {
        return;
    };
    if role == "holder" || role == "victim" {
        let me: Ipv4Addr = std::env::var("ERPC_NETNS_SELF").unwrap().parse().unwrap();
        let peer: Ipv4Addr = std::env::var("ERPC_NETNS_PEER").unwrap().parse().unwrap();
        return kill_test_child(&role, me, peer);
    }
    let me: Ipv4Addr = std::env::var("ERPC_NETNS_SELF").unwrap().parse().unwrap();
    let peer: Ipv4Addr = std::env::var("ERPC_NETNS_PEER").unwrap().parse().unwrap();
    let data = std::env::var("ERPC_NETNS_DATA").unwrap();
    let id: u8 = role.parse().unwrap();
    if data == "bridge" {
        use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimNic};
        let dev = std::env::var("ERPC_NETNS_DEV").unwrap();
        let fabric = Fabric::new(FabricConfig {
            seed: u64::from(id),
            deterministic: false,
            ..Default::default()
        });
        let nic = SimNic::new(
            &fabric,
            NicConfig {
                mac: [0x02, 0xc0, 0, 0, 0, id],
                ..Default::default()
            },
        );
        let bridge = fabric.add_bridge(&dev).expect("bridge onto the veth");
        let region = common::devmodel::region();
        let device = mlx5::Device::open(
            nic.backend(),
            mlx5::DeviceConfig {
                region,
                ..Default::default()
            },
        )
        .expect("bring-up");
        let cfg = transport::mlx5::Mlx5Config::new(
            Ipv4Addr::new(10, 233, 0, id),
            mlx5::QueueConfig {
                udp_port: 31900,
                ..Default::default()
            },
        );
        let t = transport::mlx5::Mlx5Transport::new(&device, cfg).expect("mlx5 transport");
        let alloc = Allocator::new(
            device.dma_mapper(),
            mempool::AllocatorConfig {
                initial_bytes: 8 << 20,
                region,
                ..Default::default()
            },
        )
        .expect("allocator");
        child(&role, me, peer, t, alloc);
        let b = bridge.stats();
        assert!(b.from_link > 0 && b.to_link > 0, "{b:?}");
        println!("NETNS-OK data bridge role {role}: bridge {b:?}");
    } else {
        let t = UdpTransport::new(&UdpConfig::new(SocketAddrV4::new(me, 0))).expect("udp");
        child(&role, me, peer, t, erpc_sim::test_allocator(8 << 20));
        println!("NETNS-OK data udp role {role}");
    }
}

/// One Nexus (SM over kernel UDP) and one Rpc on `t`, client of the peer
/// and server for it.
fn child<T: Transport + 'static>(role: &str, me: Ipv4Addr, peer: Ipv4Addr, t: T, alloc: Allocator) {
    let nexus = app::register::<T>(Nexus::builder(&format!("{me}:31850")))
        .workers(1)
        .build()
        .expect("nexus");
    let mut rpc: Rpc<T, Ctx> = Rpc::builder(&nexus, t, alloc)
        .session_handler(app::sm_handler::<T>)
        .build()
        .expect("rpc");
    let mut ctx = Ctx::new(role.parse().unwrap());
    let clock = nexus.clock().clone();
    let deadline = clock.now_ns() + 60_000_000_000;
    // The peer's Rpc may not exist yet when our connect request reaches its
    // Nexus (it then answers "invalid remote Rpc id"): try again.
    let sn = loop {
        ctx.events.clear();
        let sn = rpc
            .create_session(&format!("{peer}:31850"), 0)
            .expect("session");
        while ctx.events.is_empty() {
            rpc.run_event_loop_once(&mut ctx);
            assert!(clock.now_ns() < deadline, "role {role}: no session event");
        }
        if rpc.is_connected(sn) {
            break sn;
        }
        rpc.run_event_loop(&mut ctx, std::time::Duration::from_millis(50));
    };
    ctx.sessions.push(sn);
    let mut rng = Rng::new(role.parse().unwrap());
    ctx.todo = app::random_ops(&mut rng, OPS, &[ECHO, SIZED], &[12, 968, 969, 5000, 30_000]);
    app::start(&mut rpc, &mut ctx, 8);
    let mut destroyed = false;
    loop {
        rpc.run_event_loop_once(&mut ctx);
        if !destroyed && ctx.completed + ctx.failed == OPS as u64 {
            rpc.destroy_session(sn).expect("destroy");
            destroyed = true;
        }
        // Done when our session is gone and the peer has disconnected too.
        if destroyed && rpc.num_sessions() == 0 {
            break;
        }
        assert!(
            clock.now_ns() < deadline,
            "role {role}: {} of {OPS} done, {} sessions; {}",
            ctx.completed,
            rpc.num_sessions(),
            rpc.stats()
        );
    }
    assert!(ctx.errors.is_empty(), "{:?}", ctx.errors);
    assert_eq!(ctx.completed, OPS as u64);
    println!(
        "role {role} completed {} handled {}",
        ctx.completed, ctx.handled
    );
}
