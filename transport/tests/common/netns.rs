//! Two network namespaces joined by a veth pair, and peer processes in
//! them: this test binary re-executed with `ip netns exec` to run an
//! ignored peer test with a role in `ROLE_ENV`. Shared by the UDP and the
//! device-model bridge tests.
//!
//! Namespaces get names unique to the process and are removed by a guard
//! (also on failure); stale ones from killed runs are swept at the next
//! start. Needs root and iproute2; without them the tests say why and skip,
//! except in CI (`ERPC_CI=1`), where they fail.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const ROLE_ENV: &str = "ERPC_NETNS_PEER_ROLE";
/// Addresses of the two veth ends (inside the private namespaces, so fixed
/// addresses cannot clash).
pub const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 77, 1, 1), 31850);
pub const SERVER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 77, 1, 2), 31850);
const NS_PREFIX: &str = "erpct";

pub fn ci() -> bool {
    std::env::var_os("ERPC_CI").is_some_and(|v| v == "1")
}

/// Skips `test` (or fails it in CI) with `why`.
pub fn skip(test: &str, why: &str) {
    if ci() {
        panic!("{test}: {why}; ERPC_CI=1 forbids skipping");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// Why the namespace tests cannot run on this machine, if they cannot:
/// checked before any test runs (by the binary's libtest-mimic `main`), by
/// creating and removing a probe namespace.
pub fn missing_prerequisite() -> Option<String> {
    if effective_uid() != Some(0) {
        return Some("needs root to create network namespaces".into());
    }
    if ip(&["-V"]).is_err() {
        return Some("needs iproute2 (`ip`), e.g. `apt-get install iproute2`".into());
    }
    let probe = format!("{NS_PREFIX}{}xprobe", std::process::id());
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("cannot create a network namespace: {e}")),
    }
}

/// A test of a libtest-mimic `main`: runs `f`, or is reported as ignored
/// when `missing` names a missing prerequisite (and fails in CI, where
/// nothing may be skipped).
pub fn trial(name: &str, f: fn(), missing: Option<String>) -> libtest_mimic::Trial {
    use libtest_mimic::Trial;
    match missing {
        None => Trial::test(name, move || {
            f();
            Ok(())
        }),
        Some(why) if ci() => Trial::test(name, move || {
            Err(format!("{why}; ERPC_CI=1 forbids skipping").into())
        }),
        Some(why) => {
            if !std::env::args().any(|a| a == "--list") {
                eprintln!("{name}: ignored: {why}");
            }
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    }
}

/// The peer test: ignored in ordinary runs, run by [`Netns::spawn`] with
/// `--exact NAME --ignored` inside a namespace.
pub fn peer_trial(name: &str, f: fn()) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || {
        f();
        Ok(())
    })
    .with_ignored_flag(true)
}

/// The prerequisites of this process's namespace tests: none to check in
/// a peer (it runs inside a namespace its parent made).
pub fn prerequisites() -> Option<String> {
    if std::env::var_os(ROLE_ENV).is_some() {
        return None;
    }
    missing_prerequisite()
}

pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The path of an iproute2 tool: from PATH, or from the sbin directories
/// that a non-login root shell may lack in its PATH.
pub fn tool(name: &str) -> std::path::PathBuf {
    let in_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let dirs = in_path
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()]);
    dirs.map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

/// Runs `ip args...`; returns its stderr on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new(tool("ip"))
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces joined by a veth pair, removed on drop.
pub struct Netns {
    pub client_ns: String,
    pub server_ns: String,
    pub client_dev: String,
    pub server_dev: String,
    /// Name of the (ignored) test this binary runs as the peer.
    pub peer_test: &'static str,
}

impl Netns {
    pub fn create(peer_test: &'static str) -> Result<Netns, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        // The guard exists before anything is created, so a failure half
        // way still removes what was made.
        let (vc, vs) = (format!("ev{pid}x{n}c"), format!("ev{pid}x{n}s"));
        let net = Netns {
            client_ns: format!("{NS_PREFIX}{pid}x{n}c"),
            server_ns: format!("{NS_PREFIX}{pid}x{n}s"),
            client_dev: vc.clone(),
            server_dev: vs.clone(),
            peer_test,
        };
        let (c, s) = (net.client_ns.as_str(), net.server_ns.as_str());
        ip(&["netns", "add", c])?;
        ip(&["netns", "add", s])?;
        ip(&[
            "link", "add", &vc, "netns", c, "type", "veth", "peer", "name", &vs, "netns", s,
        ])?;
        for (ns, dev, addr) in [(c, &vc, CLIENT), (s, &vs, SERVER)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", addr.ip()),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(net)
    }

    /// Starts this test binary inside `ns` as the peer with `role`.
    pub fn spawn(&self, ns: &str, role: &str, env: &[(&str, &str)]) -> Peer {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut cmd = Command::new(tool("ip"));
        cmd.args(["netns", "exec", ns])
            .arg(exe)
            .args(["--exact", self.peer_test, "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn `ip netns exec`");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Peer {
            role: role.to_string(),
            child,
            lines,
            seen: Vec::new(),
            stderr: Some(err),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace destroys its end of the veth pair, and with
        // it the pair.
        for ns in [&self.client_ns, &self.server_ns] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Removes namespaces left behind by runs that were killed before their
/// guard could (their process no longer exists).
pub fn sweep_stale() {
    let Ok(out) = Command::new(tool("ip")).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// A peer process; killed on drop if still running.
pub struct Peer {
    role: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Peer {
    /// Waits for a stdout line containing `prefix` (libtest may have
    /// printed `test netns_peer ... ` in front of it); returns the rest.
    pub fn expect_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].trim().to_string();
                    }
                }
                Err(_) => {
                    let report = self.finish();
                    panic!(
                        "{}: no `{prefix}` line within {timeout:?}\n{report}",
                        self.role
                    )
                }
            }
        }
    }

    /// Waits for the process to exit (killing it at the deadline); returns
    /// its exit status and everything it printed.
    pub fn wait(&mut self, timeout: Duration) -> (Option<ExitStatus>, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        (status, self.finish())
    }

    fn finish(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(line);
        }
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        format!(
            "--- {} stdout:\n{}\n--- {} stderr:\n{}",
            self.role,
            self.seen.join("\n"),
            self.role,
            err
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The peer's line `PEER <tag> key=value ...`, as the value of `key`.
pub fn field(report: &str, tag: &str, key: &str) -> Option<u64> {
    let tag = format!("PEER {tag} ");
    let line = report
        .lines()
        .find_map(|l| l.find(&tag).map(|at| &l[at..]))?;
    let kv = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))?;
    kv.trim_end_matches(',').parse().ok()
}

/// The namespaces for `test`, or `None` (after saying why) if this
/// machine cannot make them.
pub fn setup(test: &str, peer_test: &'static str) -> Option<Netns> {
    if effective_uid() != Some(0) {
        skip(test, "needs root to create network namespaces");
        return None;
    }
    if ip(&["-V"]).is_err() {
        skip(
            test,
            "needs iproute2 (`ip`), e.g. `apt-get install iproute2`",
        );
        return None;
    }
    sweep_stale();
    match Netns::create(peer_test) {
        Ok(net) => Some(net),
        Err(e) => {
            skip(test, &format!("cannot create namespaces and veth: {e}"));
            None
        }
    }
}
