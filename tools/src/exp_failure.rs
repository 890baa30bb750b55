//! `erpc-bench failure-detection`: failure detection time. A server
//! process on kernel UDP (loopback) holds requests without answering; the
//! benchmark kills it (SIGKILL) and measures the time until the client's
//! continuations report `PeerFailed`, over many trials, against the
//! configured failure timeout.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use erpc::{Completion, Nexus, ReqHandle, Request, Rpc, RpcConfig, RpcError, SessionEnd};
use serde::Serialize;
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

use crate::bench::{BenchError, Progress, loopback_uri};
use crate::cli::{JsonOut, Out, Quit, usage};

/// Request type the failure-detection peer holds without answering.
pub const HOLD: u8 = 7;
/// Requests in flight when the peer is killed.
pub const HELD_REQUESTS: usize = 4;

/// What the failure-detection experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    /// The configured failure timeout.
    pub timeout_ms: u64,
    /// Milliseconds from the kill to the first error continuation, per trial.
    pub trials_ms: Vec<f64>,
    /// Median of `trials_ms`.
    pub median_ms: f64,
    /// Largest of `trials_ms`.
    pub max_ms: f64,
    /// Smallest of `trials_ms`.
    pub min_ms: f64,
}

#[derive(Default)]
struct Held(Vec<ReqHandle>);

fn hold<T: Transport>(_rpc: &mut Rpc<T, Held>, c: &mut Held, req: Request<'_>) {
    c.0.push(req.handle);
}

/// The peer process of the failure-detection experiment: an Rpc on kernel
/// UDP at `uri` that holds every request it gets. Prints `READY` when its
/// Rpc exists and `HELD n` as requests arrive; runs until killed.
pub fn failure_peer(uri: &str) -> Result<(), BenchError> {
    let nexus = Nexus::builder(uri)
        .handler::<UdpTransport, Held>(HOLD, hold::<UdpTransport>)
        .build()
        .map_err(|e| BenchError::setup(format!("peer Nexus on {uri}"), e))?;
    let t = UdpTransport::new(&UdpConfig::loopback())
        .map_err(|e| BenchError::setup("peer UDP transport", e))?;
    let alloc = erpc_sim::sim_allocator(4 << 20, mempool::RegionOptions::default())
        .map_err(|e| BenchError::setup("peer buffers", e))?;
    let mut rpc: Rpc<UdpTransport, Held> = Rpc::builder(&nexus, t, alloc)
        .build()
        .map_err(|e| BenchError::setup("peer Rpc", e))?;
    let mut held = Held::default();
    println!("READY");
    let mut told = 0;
    loop {
        rpc.run_event_loop_once(&mut held);
        if held.0.len() != told {
            told = held.0.len();
            println!("HELD {told}");
        }
    }
}

struct Client {
    session: u16,
    failed_at: Option<Instant>,
    errors: Vec<RpcError>,
}

fn client_cont<T: Transport>(rpc: &mut Rpc<T, Client>, c: &mut Client, comp: Completion) {
    if let Err(e) = comp.result {
        c.failed_at.get_or_insert_with(Instant::now);
        c.errors.push(e);
    }
    rpc.free_msg_buffer(comp.req);
    rpc.free_msg_buffer(comp.resp);
}

/// Reads lines from the child until one starts with `want`.
fn expect_line(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    want: &str,
) -> Result<(), BenchError> {
    for l in lines {
        let l = l.map_err(|e| BenchError::Run(format!("reading the peer: {e}")))?;
        if l.starts_with(want) {
            return Ok(());
        }
    }
    Err(BenchError::Run(format!(
        "the peer exited before saying {want}"
    )))
}

/// Runs `trials` kills of a peer started as `exe failure-detection --peer
/// URI`.
pub fn failure_detection(
    exe: &Path,
    trials: usize,
    timeout_ms: u64,
    progress: &Progress,
) -> Result<Detection, BenchError> {
    use std::io::BufRead;
    let mut trials_ms = Vec::with_capacity(trials);
    progress.phase(
        "trials",
        Duration::from_millis(trials as u64 * (timeout_ms + 300)),
    );
    let t_all = Instant::now();
    for trial in 0..trials {
        progress.tick(t_all.elapsed());
        let peer_uri = loopback_uri()?;
        let mut child = Command::new(exe)
            .args(["failure-detection", "--peer", &peer_uri])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::setup(format!("starting {}", exe.display()), e))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let r = expect_line(&mut lines, "READY");
            let _ = tx.send(r);
            let r = expect_line(&mut lines, &format!("HELD {HELD_REQUESTS}"));
            let _ = tx.send(r);
        });
        let result = (|| {
            rx.recv_timeout(Duration::from_secs(30))
                .map_err(|_| BenchError::Run("the peer did not start".into()))??;
            let uri = loopback_uri()?;
            let nexus = Nexus::builder(&uri)
                .failure_timeout_ms(timeout_ms)
                .build()
                .map_err(|e| BenchError::setup("client Nexus", e))?;
            let t = UdpTransport::new(&UdpConfig::loopback())
                .map_err(|e| BenchError::setup("client UDP transport", e))?;
            let alloc = erpc_sim::sim_allocator(4 << 20, mempool::RegionOptions::default())
                .map_err(|e| BenchError::setup("client buffers", e))?;
            let cfg = RpcConfig {
                failure_timeout_ms: timeout_ms,
                ..RpcConfig::default()
            };
            let mut rpc: Rpc<UdpTransport, Client> = Rpc::builder(&nexus, t, alloc)
                .config(cfg)
                .build()
                .map_err(|e| BenchError::setup("client Rpc", e))?;
            let mut c = Client {
                session: 0,
                failed_at: None,
                errors: Vec::new(),
            };
            c.session = rpc
                .create_session(&peer_uri, 0)
                .map_err(|e| BenchError::setup("session to the peer", e))?;
            for k in 0..HELD_REQUESTS {
                let req = rpc
                    .alloc_msg_buffer(32)
                    .map_err(|e| BenchError::setup("request", e))?;
                let resp = rpc
                    .alloc_msg_buffer(32)
                    .map_err(|e| BenchError::setup("response", e))?;
                rpc.enqueue_request(c.session, HOLD, req, resp, client_cont::<UdpTransport>, k)
                    .map_err(|e| BenchError::Run(e.to_string()))?;
            }
            // Until the peer holds every request.
            let t0 = Instant::now();
            loop {
                rpc.run_event_loop_once(&mut c);
                match rx.try_recv() {
                    Ok(r) => break r?,
                    Err(_) if t0.elapsed() > Duration::from_secs(30) => {
                        return Err(BenchError::Run("the peer never held the requests".into()));
                    }
                    Err(_) => {}
                }
            }
            let killed = Instant::now();
            child
                .kill()
                .map_err(|e| BenchError::Run(format!("killing the peer: {e}")))?;
            while c.errors.len() < HELD_REQUESTS {
                rpc.run_event_loop_once(&mut c);
                if killed.elapsed() > Duration::from_millis(100 * timeout_ms.max(100)) {
                    return Err(BenchError::Run(format!(
                        "no error continuation {} ms after the kill",
                        killed.elapsed().as_millis()
                    )));
                }
            }
            if let Some(e) = c.errors.iter().find(|e| {
                !matches!(
                    e,
                    RpcError::SessionEnded {
                        why: SessionEnd::PeerFailed,
                        ..
                    }
                )
            }) {
                return Err(BenchError::Run(format!("expected PeerFailed, got {e}")));
            }
            let at = c.failed_at.expect("errors were recorded");
            Ok((at - killed).as_secs_f64() * 1e3)
        })();
        let _ = child.kill();
        let _ = child.wait();
        let ms = result.map_err(|e| BenchError::Run(format!("trial {trial}: {e}")))?;
        trials_ms.push(ms);
    }
    progress.clear();
    let mut sorted = trials_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Detection {
        timeout_ms,
        median_ms: sorted[sorted.len() / 2],
        max_ms: *sorted.last().unwrap_or(&0.0),
        min_ms: *sorted.first().unwrap_or(&0.0),
        trials_ms,
    })
}

// --------------------------------------------------- factor analysis

/// `erpc-bench failure-detection`: time from killing a server process
/// (kernel UDP) to the client's error continuations, against the failure
/// timeout.
#[derive(Debug, Clone, clap::Args)]
pub struct FailureArgs {
    /// Trials (1 to 1000).
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Failure timeout in ms (10 to 60000).
    #[arg(long, default_value_t = erpc::FAILURE_TIMEOUT_MS)]
    pub failure_timeout_ms: u64,
    /// (internal) Run as the peer process of a trial at this URI.
    #[arg(long, hide = true, value_name = "URI")]
    pub peer: Option<String>,
    #[command(flatten)]
    pub out: JsonOut,
}

impl FailureArgs {
    /// Checks the flags and runs the trials (or, with `--peer`, the peer
    /// process of one, until it is killed).
    pub fn run(&self) -> Result<(), Quit> {
        if let Some(uri) = &self.peer {
            return Err(Quit::Err(failure_peer(uri).err().unwrap_or_else(|| {
                BenchError::Run("the failure-detection peer returned".into())
            })));
        }
        if self.trials == 0 || self.trials > 1000 {
            return usage(format!("--trials {}: must be 1 to 1000", self.trials));
        }
        if !(10..=60_000).contains(&self.failure_timeout_ms) {
            return usage(format!(
                "--failure-timeout-ms {}: must be 10 to 60000",
                self.failure_timeout_ms
            ));
        }
        let exe = std::env::current_exe().map_err(|e| {
            BenchError::Run(format!("cannot find this program to start the peer: {e}"))
        })?;
        let progress = Progress::new();
        let mut out = Out::default();
        out.line(
            &progress,
            format!(
                "erpc-bench failure-detection: {} trials, two processes over kernel UDP \
                 (loopback), failure timeout {} ms",
                self.trials, self.failure_timeout_ms
            ),
        )?;
        let d = failure_detection(&exe, self.trials, self.failure_timeout_ms, &progress)?;
        out.line(
            &progress,
            format!(
                "kill -> error continuation: median {:.1} ms, min {:.1} ms, max {:.1} ms \
                 ({:.2} / {:.2} x the timeout)",
                d.median_ms,
                d.min_ms,
                d.max_ms,
                d.median_ms / d.timeout_ms as f64,
                d.max_ms / d.timeout_ms as f64
            ),
        )?;
        self.out.write(&d)
    }
}
