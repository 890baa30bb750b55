//! Two processes in two network namespaces joined by a veth pair, talking
//! eRPC over kernel UDP (data path and session management). Needs root
//! and `ip`; skips with a message otherwise, except in CI (`ERPC_CI=1`),
//! where it must run.
//!
//! The test re-runs this test binary inside each namespace as a child
//! (`netns_child`, idle unless `ERPC_NETNS_ROLE` is set).

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

use common::app::{self, Ctx, ECHO, SIZED};
use erpc::rng::Rng;
use erpc::{Nexus, Rpc, RpcConfig};
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
    eprintln!("skipping two_processes_two_namespaces_over_udp: {why}");
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

#[test]
fn two_processes_two_namespaces_over_udp() {
    if std::env::var_os("ERPC_NETNS_ROLE").is_some() {
        return;
    }
    if !is_root() {
        return skip_or_fail("not root (network namespaces need CAP_SYS_ADMIN)");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return skip_or_fail("the `ip` command (iproute2) is missing");
    }
    let tag = std::process::id() % 100_000;
    let net = (std::process::id() % 200 + 20) as u8;
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
        return skip_or_fail(&e);
    }
    let exe = std::env::current_exe().unwrap();
    let spawn = |n: &str, me: Ipv4Addr, peer: Ipv4Addr, id: u64| {
        Command::new("ip")
            .args(["netns", "exec", n])
            .arg(&exe)
            .args(["--exact", "netns_child", "--nocapture", "--test-threads=1"])
            .env("ERPC_NETNS_ROLE", id.to_string())
            .env("ERPC_NETNS_SELF", me.to_string())
            .env("ERPC_NETNS_PEER", peer.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child")
    };
    let ca = spawn(&ns.a, ipa, ipb, 1);
    let cb = spawn(&ns.b, ipb, ipa, 2);
    for (name, c) in [("A", ca), ("B", cb)] {
        let out = c.wait_with_output().expect("child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("NETNS-OK"),
            "child {name} failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
    }
}

/// The child: one Nexus and one Rpc in this namespace, client of the peer
/// and server for it. Idle unless run by the test above.
#[test]
fn netns_child() {
    let Ok(role) = std::env::var("ERPC_NETNS_ROLE") else {
        return;
    };
    let me: Ipv4Addr = std::env::var("ERPC_NETNS_SELF").unwrap().parse().unwrap();
    let peer: Ipv4Addr = std::env::var("ERPC_NETNS_PEER").unwrap().parse().unwrap();
    let nexus = app::register::<UdpTransport>(Nexus::builder(&format!("{me}:31850")))
        .workers(1)
        .build()
        .expect("nexus");
    let t = UdpTransport::new(&UdpConfig::new(SocketAddrV4::new(me, 0))).expect("udp");
    let mut rpc: Rpc<UdpTransport, Ctx> = Rpc::new(
        &nexus,
        0,
        t,
        erpc::sim::test_allocator(8 << 20),
        RpcConfig::default(),
        Some(app::sm_handler::<UdpTransport>),
    )
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
        "NETNS-OK role {role} completed {} handled {}",
        ctx.completed, ctx.handled
    );
}
