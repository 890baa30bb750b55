//! `erpc-inspect list`: the processes with a debug endpoint.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use debug_endpoint::client::Client;
use serde::Serialize;

/// One line of `erpc-inspect list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listed {
    /// The process id.
    pub pid: u32,
    /// The socket.
    pub socket: PathBuf,
    /// `ok`, `stale (removed)`, `stale`, or the error.
    pub status: String,
    /// The process name.
    pub process: Option<String>,
    /// Device names.
    pub devices: Vec<String>,
    /// Nexus URIs with their Rpc ids.
    pub nexuses: Vec<String>,
}

/// Every endpoint in `dir`: asks each for `hello`; removes sockets of
/// processes that are gone (when they are ours).
pub fn list(dir: &Path) -> std::io::Result<Vec<Listed>> {
    let me = debug_endpoint::server::euid();
    let mut out = Vec::new();
    for f in debug_endpoint::client::find(dir)? {
        let mut l = Listed {
            pid: f.pid,
            socket: f.path.clone(),
            status: String::new(),
            process: None,
            devices: Vec::new(),
            nexuses: Vec::new(),
        };
        match Client::connect(&f.path).and_then(|mut c| c.hello()) {
            Ok(h) => {
                l.status = "ok".into();
                l.process = h["process"].as_str().map(str::to_string);
                for d in h["sources"]["devices"].as_array().into_iter().flatten() {
                    l.devices.push(format!(
                        "{} ({} queue sets)",
                        d["name"].as_str().unwrap_or("?"),
                        d["queue_sets"]
                    ));
                }
                for n in h["sources"]["nexuses"].as_array().into_iter().flatten() {
                    l.nexuses.push(format!(
                        "{} (Rpcs {})",
                        n["uri"].as_str().unwrap_or("?"),
                        n["rpcs"]
                    ));
                }
            }
            Err(e) => {
                if !f.alive && f.uid == me && std::fs::remove_file(&f.path).is_ok() {
                    l.status = "stale: process gone, socket removed".into();
                } else if !f.alive {
                    l.status = "stale: process gone".into();
                } else {
                    l.status = e.to_string();
                }
            }
        }
        out.push(l);
    }
    Ok(out)
}

/// The text of `erpc-inspect list`.
pub fn list_text(dir: &Path, l: &[Listed]) -> String {
    let mut s = String::new();
    if l.is_empty() {
        let _ = writeln!(
            s,
            "no debug endpoints in {} (a process exposes one with NexusBuilder::inspect, DeviceConfig::inspect or ERPC_INSPECT=1; erpc-bench --inspect)",
            dir.display()
        );
        return s;
    }
    let _ = writeln!(
        s,
        "{:>8}  {:<16} {:<40} NEXUSES",
        "PID", "PROCESS", "DEVICES"
    );
    for x in l {
        if x.status != "ok" {
            let _ = writeln!(s, "{:>8}  {}", x.pid, x.status);
            continue;
        }
        let devs = if x.devices.is_empty() {
            "-".to_string()
        } else {
            x.devices.join(", ")
        };
        let nex = if x.nexuses.is_empty() {
            "-".to_string()
        } else {
            x.nexuses.join(", ")
        };
        let _ = writeln!(
            s,
            "{:>8}  {:<16} {:<40} {nex}",
            x.pid,
            x.process.as_deref().unwrap_or("?"),
            devs
        );
    }
    s
}
