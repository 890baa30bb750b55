//! erpc-inspect: look inside a running eRPC / mlx5 process, or at a device.
//!
//! ```sh
//! erpc-inspect list                     # processes with a debug endpoint
//! erpc-inspect 4242                     # queues (software next to firmware), counters, sessions
//! erpc-inspect 4242 --watch             # live, with rates per second
//! erpc-inspect 4242 --json              # for scripts (keys: erpc_tools::inspect::Snapshot)
//! erpc-inspect 4242 --cqe 3             # hex dump + decode of RX CQE 3 (--cq tx: TX CQE)
//! erpc-inspect 4242 --wqe 0 --queue 31851   # SQ WQE 0 of one queue set (--wq rq: RQ WQE)
//! erpc-inspect device 0000:03:00.0      # bring a vfio-pci function up, report, tear down
//! erpc-inspect device --sim             # the same on the device model
//! ```
//!
//! A process exposes the endpoint with `NexusBuilder::inspect(true)`,
//! `DeviceConfig { inspect: true, .. }`, `ERPC_INSPECT=1`, or
//! `erpc-bench --inspect`. Exit status: 0 done, 1 the process or device
//! could not be inspected, 2 bad usage.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use debug_endpoint::client::Client;
use erpc_tools::inspect::{
    Descriptor, SimProfile, Snapshot, Style, fetch, list, list_text, offline_sim, offline_text,
    offline_vfio, render, render_descriptor,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Cq {
    /// The 8-entry RX CQ the NIC overwrites.
    Rx,
    /// The TX CQ.
    Tx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Wq {
    /// The send queue (index in 64-byte WQEBBs).
    Sq,
    /// The striding receive queue.
    Rq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Color {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Processes with a debug endpoint.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Bring a device up (no running process needed), print what it is,
    /// tear it down.
    Device {
        /// PCI address of an mlx5 function bound to vfio-pci.
        #[arg(required_unless_present = "sim", conflicts_with = "sim")]
        bdf: Option<String>,
        /// Use the device model instead.
        #[arg(long)]
        sim: bool,
        /// Device-model profile.
        #[arg(long, value_enum, default_value = "cx5", requires = "sim")]
        profile: SimProfile,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Inspect the queues, counters and sessions of a running eRPC/mlx5 process",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Process id, or the path of an endpoint socket.
    target: Option<String>,
    /// Print the snapshot as JSON (with --watch: one object per line; not
    /// with --cqe/--wqe, whose dumps are text).
    #[arg(long, conflicts_with_all = ["cqe", "wqe"])]
    json: bool,
    /// Refresh until interrupted, with rates per second.
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes of --watch (0.05 to 3600).
    #[arg(long, default_value_t = 1.0, value_name = "SECS", requires = "watch")]
    interval: f64,
    /// Stop --watch after this many snapshots.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
    /// Hex-dump and decode CQE N (see --cq).
    #[arg(long, value_name = "N", conflicts_with = "wqe")]
    cqe: Option<u32>,
    /// Which CQ --cqe reads.
    #[arg(long, value_enum, default_value = "rx")]
    cq: Cq,
    /// Hex-dump and decode WQE N (see --wq).
    #[arg(long, value_name = "N")]
    wqe: Option<u32>,
    /// Which WQ --wqe reads.
    #[arg(long, value_enum, default_value = "sq")]
    wq: Wq,
    /// Only the queue set steered by this UDP port (for --cqe/--wqe).
    #[arg(long, value_name = "PORT")]
    queue: Option<u16>,
    /// How long the process may take to publish, ms (1 to 10000).
    #[arg(long, default_value_t = 500, value_name = "MS")]
    timeout_ms: u64,
    /// Socket directory (default: $ERPC_INSPECT_DIR, $XDG_RUNTIME_DIR/erpc,
    /// /run/erpc for root, /tmp/erpc-UID for another user).
    #[arg(long, value_name = "DIR", global = true)]
    dir: Option<PathBuf>,
    /// Colors: auto (a terminal without NO_COLOR), always, never.
    #[arg(long, value_enum, default_value = "auto", global = true)]
    color: Color,
}

enum Fail {
    Usage(String),
    Run(String),
}

fn main() -> ExitCode {
    erpc_tools::init_tracing();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("erpc-inspect: {m}");
            ExitCode::from(2)
        }
        Err(Fail::Run(m)) => {
            eprintln!("erpc-inspect: {m}");
            ExitCode::from(1)
        }
    }
}

fn style(c: Color) -> Style {
    let color = match c {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    Style { color }
}

/// Whether process `pid` runs (exists and is not a zombie).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        // The state follows the command name, which is in parentheses.
        st.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Where process `pid`'s endpoint socket is: in `dir`, or, when no
/// directory was named (`named` false) and it is not there, in the
/// default directory of the user the process runs as (root inspecting
/// another user's process; see `debug_endpoint::default_dir`).
fn find_socket(dir: &std::path::Path, pid: u32, named: bool) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let p = debug_endpoint::socket_path(dir, pid);
    if named || p.exists() {
        return p;
    }
    let Ok(uid) = std::fs::metadata(format!("/proc/{pid}")).map(|m| m.uid()) else {
        return p;
    };
    [
        debug_endpoint::default_dir(uid),
        PathBuf::from(format!("/run/user/{uid}/erpc")),
    ]
    .into_iter()
    .map(|d| debug_endpoint::socket_path(&d, pid))
    .find(|q| q.exists())
    .unwrap_or(p)
}

/// Writes to stdout; a closed pipe ends the program quietly.
fn out(s: &str) -> Result<(), Fail> {
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(Fail::Run(format!("writing to standard output: {e}"))),
    }
}

fn json<T: serde::Serialize>(v: &T, pretty: bool) -> String {
    let s = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    };
    s.expect("snapshots serialize") + "\n"
}

fn run(cli: Cli) -> Result<(), Fail> {
    match cli.cmd {
        Some(Cmd::List { json: j }) => {
            let dir = cli.dir.clone().unwrap_or_else(debug_endpoint::socket_dir);
            let l = list(&dir).map_err(|e| Fail::Run(format!("reading {}: {e}", dir.display())))?;
            if j {
                out(&json(&l, true))
            } else {
                out(&list_text(&dir, &l))
            }
        }
        Some(Cmd::Device {
            bdf,
            sim,
            profile,
            json: j,
        }) => {
            let r = if sim {
                offline_sim(profile)
            } else {
                offline_vfio(bdf.as_deref().unwrap_or_default())
            };
            let r = r.map_err(|e| match e {
                erpc_tools::inspect::OfflineError::Usage(m) => Fail::Usage(m),
                e => Fail::Run(e.to_string()),
            })?;
            if j {
                out(&json(&r, true))
            } else {
                out(&offline_text(&r, style(cli.color)))
            }
        }
        None => show(cli),
    }
}

fn show(cli: Cli) -> Result<(), Fail> {
    let Some(target) = cli.target.as_deref() else {
        return Err(Fail::Usage(
            "give a process id (see `erpc-inspect list`), `list`, or `device`; --help for more"
                .into(),
        ));
    };
    if matches!(target, "list" | "device") {
        return Err(Fail::Usage(format!(
            "options go after the subcommand: `erpc-inspect {target} [OPTIONS]`"
        )));
    }
    if !cli.interval.is_finite() || !(0.05..=3600.0).contains(&cli.interval) {
        return Err(Fail::Usage(format!(
            "--interval {}: must be 0.05 to 3600 seconds",
            cli.interval
        )));
    }
    if !(1..=debug_endpoint::MAX_TIMEOUT.as_millis() as u64).contains(&cli.timeout_ms) {
        return Err(Fail::Usage(format!(
            "--timeout-ms {}: must be 1 to {}",
            cli.timeout_ms,
            debug_endpoint::MAX_TIMEOUT.as_millis()
        )));
    }
    if cli.count == Some(0) {
        return Err(Fail::Usage("--count 0: must be at least 1".into()));
    }
    let descriptor = match (cli.cqe, cli.wqe) {
        (Some(n), _) => Some(match cli.cq {
            Cq::Rx => Descriptor::RxCqe(n),
            Cq::Tx => Descriptor::TxCqe(n),
        }),
        (_, Some(n)) => Some(match cli.wq {
            Wq::Sq => Descriptor::SqWqe(n),
            Wq::Rq => Descriptor::RqWqe(n),
        }),
        _ => None,
    };
    if cli.queue.is_some() && descriptor.is_none() {
        return Err(Fail::Usage(
            "--queue selects the queue set of --cqe or --wqe".into(),
        ));
    }
    let dir = cli.dir.clone().unwrap_or_else(debug_endpoint::socket_dir);
    let (path, pid) = match target.parse::<u32>() {
        Ok(pid) => (find_socket(&dir, pid, cli.dir.is_some()), Some(pid)),
        Err(_) => (PathBuf::from(target), None),
    };
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Fail::Run(format!(
                "cannot reach {}: {e} (the endpoint is owner-only: run erpc-inspect as the user the process runs as)",
                path.display()
            )));
        }
        _ => {}
    }
    if !path.exists() {
        return Err(Fail::Run(match pid {
            Some(p) if std::path::Path::new(&format!("/proc/{p}")).exists() => format!(
                "process {p} has no debug endpoint in {} (it needs NexusBuilder::inspect, DeviceConfig::inspect, ERPC_INSPECT=1 or erpc-bench --inspect; another directory? see --dir)",
                dir.display()
            ),
            Some(p) => format!("no process {p}, and no endpoint {}", path.display()),
            None => format!("no endpoint socket at {}", path.display()),
        }));
    }
    let rings = descriptor.is_some_and(Descriptor::needs_rings);
    let timeout = Duration::from_millis(cli.timeout_ms);
    let style = style(cli.color);
    let tty = std::io::stdout().is_terminal();
    let mut client: Option<Client> = None;
    let mut prev: Option<Snapshot> = None;
    let mut shown = 0u64;
    loop {
        let got = match client.as_mut() {
            Some(c) => fetch(c, rings, timeout).map_err(|e| e.to_string()),
            None => match Client::connect(&path) {
                Ok(c) => fetch(client.insert(c), rings, timeout).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
        };
        let snap = match got {
            Ok(s) => s,
            Err(e) => {
                let alive = match pid {
                    Some(p) => process_alive(p),
                    None => path.exists(),
                };
                if cli.watch && shown > 0 && !alive {
                    // The process went away while watched: say so, once.
                    eprintln!(
                        "erpc-inspect: {} exited; --watch ended after {shown} snapshot(s)",
                        pid.map_or_else(
                            || format!("the process of {}", path.display()),
                            |p| format!("process {p}")
                        )
                    );
                    return Ok(());
                }
                if cli.watch && alive {
                    // The process lives on (its endpoint may restart
                    // between two of its Nexuses): try again next time.
                    eprintln!("erpc-inspect: {e}; retrying");
                    client = None;
                    std::thread::sleep(Duration::from_secs_f64(cli.interval));
                    continue;
                }
                return Err(Fail::Run(e));
            }
        };
        let text = match descriptor {
            // An index past the ring is bad usage (its message names the
            // flag first); anything else is what the process published.
            Some(d) => render_descriptor(&snap, d, cli.queue).map_err(|m| {
                if m.starts_with("--cqe") || m.starts_with("--wqe") {
                    Fail::Usage(m)
                } else {
                    Fail::Run(m)
                }
            })?,
            None if cli.json => json(&snap, !cli.watch),
            None => render(&snap, prev.as_ref(), style),
        };
        if cli.watch && tty && !cli.json {
            out(&format!(
                "\x1b[H\x1b[2J{text}\n(refreshing every {} s; Ctrl-C to stop)\n",
                cli.interval
            ))?;
        } else {
            out(&text)?;
            if cli.watch && !cli.json {
                out("\n")?;
            }
        }
        shown += 1;
        if !cli.watch || cli.count.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        prev = Some(snap);
        std::thread::sleep(Duration::from_secs_f64(cli.interval));
    }
}
