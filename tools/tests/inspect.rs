//! `erpc-inspect` against a real process: this test binary starts itself
//! again as a fixture (two device-model NICs, two Nexuses, a client and a
//! server Rpc, all exposed on the debug endpoint), which runs a known
//! amount of traffic and then keeps its event loops turning; the tests
//! attach with the `erpc-inspect` binary and check every section of the
//! JSON against the traffic, the text views, the descriptor dumps, `list`
//! and `--watch`, and that another user is refused (by the file modes and,
//! with those opened up, by the endpoint's SO_PEERCRED check).
//!
//! The refusal test needs root (it runs `erpc-inspect` as `nobody`);
//! without root it is reported as ignored, and fails in CI (`ERPC_CI=1`).
//! No assertion depends on time: the tests ask until the snapshot is
//! complete.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use erpc::{Completion, MsgBuf, Request, Rpc};
use erpc_tools::bench::{DeviceModel, Knobs, Testbed, packets_per_direction};
use erpc_tools::inspect::Snapshot;
use erpc_tools::memory::MemoryPlan;
use libtest_mimic::{Arguments, Failed, Trial};
use mlx5::inspect::CompareStatus;
use serde_json::{Value, json};
use transport::mlx5::Mlx5Transport;

const INSPECT: &str = env!("CARGO_BIN_EXE_erpc-inspect");
const FIXTURE_ENV: &str = "ERPC_INSPECT_TEST_FIXTURE";
const ECHO: u8 = 7;
const SMALL: (usize, usize) = (100, 32);
const LARGE: (usize, usize) = (10, 3000);
const NOBODY: u32 = 65534;

fn ci() -> bool {
    std::env::var_os("ERPC_CI").is_some_and(|v| v == "1")
}

fn main() -> ExitCode {
    if std::env::var_os(FIXTURE_ENV).is_some() {
        return match fixture() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fixture: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Arguments::from_args();
    let root = debug_endpoint::server::euid() == 0;
    const REFUSE: &str = "another_user_is_refused_by_file_modes_and_by_so_peercred";
    let refuse = if root {
        Trial::test(REFUSE, another_user_is_refused)
    } else if ci() {
        Trial::test(REFUSE, || {
            Err("needs root (to run erpc-inspect as nobody); ERPC_CI=1 forbids skipping".into())
        })
    } else {
        if !args.list {
            eprintln!("{REFUSE}: ignored: needs root (to run erpc-inspect as another user)");
        }
        Trial::test(REFUSE, || Ok(())).with_ignored_flag(true)
    };
    let trials = vec![
        Trial::test(
            "snapshot_json_matches_the_known_traffic_in_every_section",
            json_matches_traffic,
        ),
        Trial::test(
            "text_descriptors_list_and_watch_show_the_process",
            text_descriptors_list_and_watch,
        ),
        Trial::test(
            "sigterm_removes_the_socket_and_watch_ends_with_a_line",
            sigterm_and_watch_end,
        ),
        refuse,
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

// ------------------------------------------------------------------ fixture

type T = Mlx5Transport<mlx5_sim::SimBackend>;

#[derive(Default)]
struct App {
    done: usize,
    failed: usize,
    bufs: Vec<(MsgBuf, MsgBuf)>,
}

fn echo(rpc: &mut Rpc<T, App>, app: &mut App, req: Request<'_>) {
    let data = req.data.to_vec();
    match rpc.response_buffer(&req.handle, data.len()) {
        Ok(mut m) => {
            m.data_mut().copy_from_slice(&data);
            if rpc.enqueue_response(req.handle, m).is_err() {
                app.failed += 1;
            }
        }
        Err(_) => app.failed += 1,
    }
}

fn done(_rpc: &mut Rpc<T, App>, app: &mut App, c: Completion) {
    app.done += 1;
    if c.result.is_err() || c.resp.data().len() != c.req.data().len() {
        app.failed += 1;
    }
    app.bufs.push((c.req, c.resp));
}

/// Runs both nodes until `cond` holds, at most `rounds` rounds of the
/// model's virtual time.
fn run_until(
    dm: &DeviceModel,
    nodes: &mut [(Rpc<T, App>, App)],
    rounds: usize,
    mut cond: impl FnMut(&[(Rpc<T, App>, App)]) -> bool,
) -> Result<(), String> {
    for _ in 0..rounds {
        if cond(nodes) {
            return Ok(());
        }
        for (r, a) in nodes.iter_mut() {
            r.run_event_loop_once(a);
        }
        dm.step();
    }
    Err("no progress within the bound of virtual time".into())
}

/// The fixture process: known traffic, then event loops until stdin closes.
fn fixture() -> Result<(), String> {
    // As the tools do: a SIGTERM removes the socket.
    debug_endpoint::remove_socket_on_termination().map_err(|e| e.to_string())?;
    let plan = MemoryPlan::decide("inspect test fixture", 28);
    let dm = DeviceModel::new(plan, None, true).map_err(|e| e.to_string())?;
    let mut nodes = Vec::new();
    let mut nexuses = Vec::new();
    for i in 0..2u8 {
        let nexus = dm
            .nexus(&format!("node{i}:31850"))
            .handler::<T, App>(ECHO, echo)
            .build()
            .map_err(|e| e.to_string())?;
        let rpc = Rpc::builder(
            &nexus,
            dm.transport(usize::from(i), 31850 + u16::from(i), &Knobs::default())
                .map_err(|e| e.to_string())?,
            dm.allocator(usize::from(i), 16 << 20)
                .map_err(|e| e.to_string())?,
        )
        .id(i)
        .build()
        .map_err(|e| e.to_string())?;
        nodes.push((rpc, App::default()));
        nexuses.push(nexus);
    }
    let sn = nodes[0]
        .0
        .create_session("node1:31850", 1)
        .map_err(|e| e.to_string())?;
    run_until(&dm, &mut nodes, 1_000_000, |n| n[0].0.is_connected(sn))?;
    // One request at a time: SMALL single-packet, then LARGE multi-packet
    // (credit returns and requests for response).
    for (count, size) in [SMALL, LARGE] {
        for k in 0..count {
            let (rpc, app) = &mut nodes[0];
            let (mut req, resp) = match app.bufs.pop() {
                Some(p) if p.0.max_len() >= size && p.1.max_len() >= size => p,
                other => {
                    if let Some((a, b)) = other {
                        rpc.free_msg_buffer(a);
                        rpc.free_msg_buffer(b);
                    }
                    let a = rpc.alloc_msg_buffer(size).map_err(|e| e.to_string())?;
                    let b = rpc.alloc_msg_buffer(size).map_err(|e| e.to_string())?;
                    (a, b)
                }
            };
            rpc.resize_msg_buffer(&mut req, size)
                .map_err(|e| e.to_string())?;
            req.data_mut().fill(k as u8);
            rpc.enqueue_request(sn, ECHO, req, resp, done, k)
                .map_err(|e| e.to_string())?;
            let want = nodes[0].1.done + 1;
            run_until(&dm, &mut nodes, 1_000_000, |n| n[0].1.done == want)?;
        }
    }
    if nodes[0].1.failed + nodes[1].1.failed > 0 {
        return Err("an RPC failed".into());
    }
    for (rpc, app) in nodes.iter_mut() {
        for (a, b) in app.bufs.drain(..) {
            rpc.free_msg_buffer(a);
            rpc.free_msg_buffer(b);
        }
    }
    let info = |n: usize| {
        let r = &nodes[n].0;
        r.session_nums()
            .into_iter()
            .map(|s| r.session_info(s).map(|i| i.req_nums.to_vec()))
            .collect::<Vec<_>>()
    };
    // The client's congestion control as the Rpc itself reports it (no
    // traffic from here on: it stays so).
    let cc = nodes[0]
        .0
        .session_info(sn)
        .map(|i| (i.rtt_us, i.cc_rate_gbps));
    let truth = json!({
        "client_req_nums": info(0),
        "server_req_nums": info(1),
        "client_cc": cc,
    });
    println!("ready {truth}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        s2.store(true, Ordering::Release);
    });
    // Idle: no traffic, no virtual time, the event loops (and with them
    // the publishers) keep turning.
    while !stop.load(Ordering::Acquire) {
        for (r, a) in nodes.iter_mut() {
            r.run_event_loop_once(a);
        }
    }
    drop(nodes);
    drop(nexuses);
    Ok(())
}

// ------------------------------------------------------------------ driver

struct Fixture {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    dir: PathBuf,
    truth: Value,
}

impl Fixture {
    fn start(tag: &str) -> Result<Fixture, Failed> {
        let dir = std::env::temp_dir().join(format!("erpc-inspect-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .env(FIXTURE_ENV, "1")
            .env(debug_endpoint::ENV_DIR, &dir)
            .env_remove(debug_endpoint::ENV_ENABLE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the fixture: {e}"))?;
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let truth = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(j) = l.strip_prefix("ready ") {
                        break serde_json::from_str(j).map_err(|e| e.to_string())?;
                    }
                }
                _ => {
                    let st = child.wait().map_err(|e| e.to_string())?;
                    return Err(format!("the fixture ended before it was ready: {st}").into());
                }
            }
        };
        let pid = child.id();
        Ok(Fixture {
            child,
            stdin,
            pid,
            dir,
            truth,
        })
    }

    fn socket(&self) -> PathBuf {
        debug_endpoint::socket_path(&self.dir, self.pid)
    }

    fn inspect(&self, args: &[&str]) -> Output {
        self.inspect_as(None, args)
    }

    fn inspect_as(&self, uid: Option<u32>, args: &[&str]) -> Output {
        let mut c = Command::new(INSPECT);
        c.args(args).arg("--dir").arg(&self.dir);
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c.output().expect("erpc-inspect runs")
    }

    /// A complete snapshot (asks again while some thread had not answered).
    fn snapshot(&self) -> Result<(Value, Snapshot), Failed> {
        loop {
            let o = self.inspect(&[&self.pid.to_string(), "--json"]);
            if !o.status.success() {
                return Err(format!(
                    "erpc-inspect --json: {}",
                    String::from_utf8_lossy(&o.stderr)
                )
                .into());
            }
            let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
            if v["complete"] == json!(true) {
                let s = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
                return Ok((v, s));
            }
        }
    }

    /// Closes stdin; the fixture exits and removes its socket.
    fn stop(mut self) -> Result<(), Failed> {
        drop(self.stdin.take());
        let st = self.child.wait().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("fixture exited with {st}").into());
        }
        if self.socket().exists() {
            return Err("the socket outlived the process's last Nexus and device".into());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond { Ok(()) } else { Err(what().into()) }
}

/// Every key path of `v` (`a.b[].c`), except inside maps keyed by data
/// (`events`).
fn key_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                if k != "events" {
                    key_paths(x, &p, out);
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                key_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// The documented keys (`tools/tests/inspect_keys.txt`) are exactly the
/// keys of the snapshot; `ERPC_INSPECT_BLESS=1` rewrites the file.
fn keys_are_the_documented_ones(v: &Value) -> Result<(), Failed> {
    let mut got = BTreeSet::new();
    key_paths(v, "", &mut got);
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspect_keys.txt");
    if std::env::var_os("ERPC_INSPECT_BLESS").is_some() {
        let mut body = String::from(
            "# Every key path of `erpc-inspect PID --json` (arrays as []; the keys of\n\
             # devices[].eq.events are event names). A stable interface: the test\n\
             # tools/tests/inspect.rs fails when the snapshot's keys differ from these.\n\
             # Regenerate with ERPC_INSPECT_BLESS=1 cargo test -p erpc-tools --test inspect\n",
        );
        body.extend(got.iter().map(|k| format!("{k}\n")));
        std::fs::write(&file, body).map_err(|e| e.to_string())?;
    }
    let want: BTreeSet<String> = std::fs::read_to_string(&file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    check(missing.is_empty() && extra.is_empty(), || {
        format!(
            "the snapshot's keys changed: gone {missing:?}, new {extra:?}; keys are a stable \
             interface: update {} (ERPC_INSPECT_BLESS=1) and the docs if intended",
            file.display()
        )
    })
}

fn json_matches_traffic() -> Result<(), Failed> {
    let f = Fixture::start("json")?;
    let (raw, s) = f.snapshot()?;
    keys_are_the_documented_ones(&raw)?;
    check(
        s.pid == f.pid && s.protocol == debug_endpoint::PROTOCOL,
        || format!("pid {} protocol {}", s.pid, s.protocol),
    )?;
    let pkts = SMALL.0 * packets_per_direction(SMALL.1) + LARGE.0 * packets_per_direction(LARGE.1);
    let rpcs = SMALL.0 + LARGE.0;

    // Devices: one queue set each, idle, firmware and software agreeing.
    check(s.devices.len() == 2, || {
        format!("{} devices", s.devices.len())
    })?;
    for (i, d) in s.devices.iter().enumerate() {
        let r = &d.report;
        check(r.mac == format!("02:00:00:00:00:0{}", i + 1), || {
            r.mac.clone()
        })?;
        check(r.port_state == "up" && r.health.verdict == "ok", || {
            format!("{r:?}")
        })?;
        check(r.pages.firmware_pages > 0 && r.commands.failed == 0, || {
            format!("{r:?}")
        })?;
        check(r.model.as_deref() == Some("ConnectX-5"), || {
            format!("{:?}", r.model)
        })?;
        let eq = d.eq.as_ref().ok_or("no EQ")?;
        check(
            eq.firmware.is_some() && eq.compare.iter().all(|c| c.status == CompareStatus::Same),
            || format!("{eq:?}"),
        )?;
        check(d.queue_sets.len() == 1 && d.cq_errors.is_empty(), || {
            format!("{d:?}")
        })?;
        let q = &d.queue_sets[0];
        check(q.udp_port == 31850 + i as u16, || q.udp_port.to_string())?;
        check(q.published.is_some_and(|p| p.fresh), || {
            format!("{:?}", q.published)
        })?;
        let fw = q
            .firmware
            .ok_or_else(|| format!("{:?}", q.firmware_error))?;
        check(
            (fw.sq_state, fw.rq_state, fw.out_of_buffer) == (1, 1, 0),
            || format!("{fw:?}"),
        )?;
        for c in &q.compare {
            check(c.status != CompareStatus::Differs, || format!("{c:?}"))?;
        }
        let status = |k: &str| q.compare.iter().find(|c| c.key == k).map(|c| c.status);
        check(status("sq.producer") == Some(CompareStatus::Same), || {
            format!("{:?}", q.compare)
        })?;
        let sw = q.software.as_ref().ok_or("no software view")?;
        check(sw.rx_cqes.len() == 8 && sw.rings.is_none(), || {
            format!("{sw:?}")
        })?;
        // The queue set carried exactly the Rpc's packets (and one NOP per
        // TX drain).
        let rpc = s.nexuses[i].rpcs[0].rpc.as_ref().ok_or("no Rpc view")?;
        let rc = |k: &str| rpc.stats.counters[k];
        let st = &sw.snapshot.stats;
        check(st.tx_wqes == rc("tx_pkts") + rc("tx_flushes"), || {
            format!("{st:?} vs Rpc {:?}", rpc.stats.counters)
        })?;
        check(
            st.rx_pkts == rc("rx_pkts") && st.rx_pkts == pkts as u64,
            || {
                format!(
                    "queue set rx {} Rpc rx {} expected {pkts}",
                    st.rx_pkts,
                    rc("rx_pkts")
                )
            },
        )?;
        let last = &sw.rx_cqes[(sw.snapshot.rx_cqe_idx + 7) % 8];
        let b: [u8; 64] = debug_endpoint::unhex(last)
            .and_then(|b| b.try_into().ok())
            .ok_or("bad CQE hex")?;
        let cqe = mlx5::prm::cqe::Cqe::decode(&b);
        check(
            cqe.op() == Some(mlx5::prm::codes::CqeOpcode::RespSend),
            || cqe.to_string(),
        )?;
    }

    // Nexuses and Rpcs: the known traffic, no drops anywhere.
    check(s.nexuses.len() == 2, || {
        format!("{} Nexuses", s.nexuses.len())
    })?;
    for (i, n) in s.nexuses.iter().enumerate() {
        check(n.uri == format!("node{i}:31850"), || n.uri.clone())?;
        check(
            n.sm.malformed + n.sm.queue_full == 0 && n.sm.delivered >= 1,
            || format!("{:?}", n.sm),
        )?;
        let l = &n.liveness;
        check(
            l.failed_silent + l.failed_restarted + l.failed_rpc_gone == 0 && l.tracked == 1,
            || format!("{l:?}"),
        )?;
        check(n.rpcs.len() == 1, || format!("{:?}", n.rpcs))?;
        let slot = &n.rpcs[0];
        check(
            slot.rpc_id == i as u8 && slot.published.is_some_and(|p| p.fresh),
            || format!("{slot:?}"),
        )?;
        let r = slot.rpc.as_ref().ok_or("no Rpc view")?;
        let c = |k: &str| r.stats.counters[k];
        let (client, server) = (i == 0, i == 1);
        let expect = [
            ("reqs_enqueued", if client { rpcs } else { 0 }),
            ("reqs_completed", if client { rpcs } else { 0 }),
            ("reqs_failed", 0),
            ("reqs_handled", if server { rpcs } else { 0 }),
            ("resps_enqueued", if server { rpcs } else { 0 }),
            ("tx_pkts", pkts),
            ("rx_pkts", pkts),
            ("rx_accepted", pkts),
            ("retransmissions", 0),
            ("sessions_reset", 0),
        ];
        for (k, want) in expect {
            check(c(k) == want as u64, || {
                format!("node {i}: {k} = {}, expected {want}", c(k))
            })?;
        }
        check(r.stats.drops.values().all(|&d| d == 0), || {
            format!("{:?}", r.stats.drops)
        })?;
        check(r.stats.drops.len() == erpc::DropReason::ALL.len(), || {
            "drop reasons".into()
        })?;
        let t = &r.transport;
        check(
            t.udp_port == 31850 + i as u16 && t.mac == format!("02:00:00:00:00:0{}", i + 1),
            || format!("{t:?}"),
        )?;
        check(
            t.stats["tx_pkts"] == pkts as u64 && t.stats["rx_pkts"] == pkts as u64,
            || format!("{:?}", t.stats),
        )?;
        for k in erpc::inspect::TRANSPORT_DROP_KEYS {
            check(t.stats[*k] == 0, || {
                format!("transport {k} = {}", t.stats[*k])
            })?;
        }
        check(r.sessions.len() == 1, || format!("{:?}", r.sessions))?;
        let se = &r.sessions[0];
        let peer = 1 - i;
        check(
            se.role == if client { "client" } else { "server" }
                && se.state == "connected"
                && se.remote_uri == format!("node{peer}:31850")
                && se.remote_rpc_id == peer as u8
                && se.slots_in_use == 0
                && se.backlog == 0
                && se.retransmits == 0,
            || format!("{se:?}"),
        )?;
        // Congestion control is on (the default): the client measured an
        // RTT on every acknowledgement and has a Timely rate within its
        // bounds, exactly what the Rpc reports in-process; a server keeps
        // neither. Nothing waits in the timing wheel once traffic stopped.
        let cc = r.cc.as_ref().ok_or("no cc view")?;
        check(
            cc.link_gbps == erpc::RpcConfig::default().cc.link_gbps
                && cc.wheel_queued == 0
                && cc.wheel_inserted == cc.wheel_reaped,
            || format!("{cc:?}"),
        )?;
        let samples = c("timely_updates") + c("timely_bypassed");
        if client {
            let rate = se.timely_rate_gbps.ok_or("no Timely rate")?;
            let rtt = se.rtt_us.ok_or("no RTT")?;
            check(
                rtt.is_finite()
                    && rtt >= 0.0
                    && (cc.min_gbps..=cc.link_gbps).contains(&rate)
                    && json!([se.rtt_us, se.timely_rate_gbps]) == f.truth["client_cc"]
                    && samples <= pkts as u64,
                || {
                    format!(
                        "{se:?} {cc:?} samples {samples} vs {}",
                        f.truth["client_cc"]
                    )
                },
            )?;
        } else {
            check(
                se.rtt_us.is_none() && se.timely_rate_gbps.is_none() && samples == 0,
                || format!("{se:?} samples {samples}"),
            )?;
        }
        if client {
            check(se.credits == erpc::SESSION_CREDITS as u32, || {
                format!("credits {}", se.credits)
            })?;
        }
        let truth = &f.truth[if client {
            "client_req_nums"
        } else {
            "server_req_nums"
        }][0];
        check(json!(se.req_nums) == *truth, || {
            format!("{:?} vs {truth}", se.req_nums)
        })?;
        // Each slot carries the numbers congruent to its index mod 8.
        for (slot, n) in se.req_nums.iter().enumerate() {
            check(n % 8 == slot as u64, || format!("slot {slot}: {n}"))?;
        }
        // Slots are objects: index, request number, state; none busy, so
        // none has waited. The session made progress (packets came in).
        check(
            se.slots.len() == 8
                && se.slots.iter().enumerate().all(|(k, sl)| {
                    sl.slot == k
                        && sl.req_num == se.req_nums[k]
                        // A server slot keeps its last response.
                        && (sl.state == "idle" || (server && sl.state == "responded"))
                        && sl.waited_ms.is_none()
                        && sl.tx_pkts.is_none()
                })
                && se.quiet_ms.is_some_and(|q| q >= 0.0),
            || format!("{:?} quiet {:?}", se.slots, se.quiet_ms),
        )?;
        // The JSON holds them as objects, not strings.
        check(
            raw["nexuses"][i]["rpcs"][0]["rpc"]["sessions"][0]["slots"][1]["state"]
                == json!("idle"),
            || raw["nexuses"][i]["rpcs"][0]["rpc"]["sessions"][0]["slots"].to_string(),
        )?;
        // The keep-alive tracks the peer (each end pings the other).
        check(
            n.liveness.peers.len() == 1
                && n.liveness.peers[0].uri == format!("node{peer}:31850")
                && n.liveness.peers[0].rpcs == vec![peer as u8],
            || format!("{:?}", n.liveness),
        )?;
    }
    f.stop()
}

/// A process ended by SIGTERM takes its socket with it; `--watch` on a
/// process that exits ends with a line saying so (exit status 0).
fn sigterm_and_watch_end() -> Result<(), Failed> {
    use std::os::unix::process::ExitStatusExt;
    let mut f = Fixture::start("sigterm")?;
    f.snapshot()?;
    let sock = f.socket();
    check(sock.exists(), || format!("no socket {}", sock.display()))?;
    let pid = f.pid.to_string();
    let watch = Command::new(INSPECT)
        .args([&pid, "--watch", "--interval", "0.05", "--color", "never"])
        .arg("--dir")
        .arg(&f.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Let it show the process at least once.
    f.snapshot()?;
    std::thread::sleep(Duration::from_millis(300));
    let st = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .map_err(|e| e.to_string())?;
    check(st.success(), || "kill -TERM failed".into())?;
    let st = f.child.wait().map_err(|e| e.to_string())?;
    check(st.signal() == Some(SIGTERM), || {
        format!("the fixture ended with {st}, not by SIGTERM")
    })?;
    check(!sock.exists(), || {
        format!("{} outlived a SIGTERM", sock.display())
    })?;
    let o = watch.wait_with_output().map_err(|e| e.to_string())?;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    check(
        o.status.success()
            && out.contains("Nexus node0:31850")
            && err.contains(&format!("process {pid} exited; --watch ended after"))
            && !err.contains("Broken pipe")
            && !err.contains("retrying"),
        || format!("{}\nstdout:\n{out}\nstderr:\n{err}", o.status),
    )?;
    let _ = std::fs::remove_dir_all(&f.dir);
    Ok(())
}

/// SIGTERM's number on Linux.
const SIGTERM: i32 = 15;

fn stdout_of(o: &Output, what: &str) -> Result<String, Failed> {
    if !o.status.success() {
        return Err(format!(
            "{what}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn must_contain(text: &str, what: &str, words: &[&str]) -> Result<(), Failed> {
    for w in words {
        check(text.contains(w), || format!("{what}: no {w:?} in\n{text}"))?;
    }
    Ok(())
}

fn text_descriptors_list_and_watch() -> Result<(), Failed> {
    let f = Fixture::start("text")?;
    let pid = f.pid.to_string();
    // Wait for a complete snapshot first, so that the text views below
    // (which show what they get) see fresh state.
    f.snapshot()?;
    let t = stdout_of(&f.inspect(&[&pid, "--color", "never"]), "text")?;
    must_contain(
        &t,
        "text",
        &[
            "device sim nic 0",
            "ConnectX-5 [15b3:1017]",
            "health ok",
            "queue set :31850",
            "queue set :31851",
            "RX CQ    8 CQEs",
            "CQE RESP_SEND",
            "firmware vs software",
            "sq.producer",
            "Nexus node0:31850",
            "Rpc 0 (published",
            "queue set :31850 of sim nic 0",
            "eRPC drops none",
            "connected",
            "node1:31850/1#",
        ],
    )?;
    check(!t.contains("<- differs"), || {
        format!("a difference on an idle process:\n{t}")
    })?;
    let d = stdout_of(&f.inspect(&[&pid, "--cqe", "7"]), "--cqe 7")?;
    must_contain(
        &d,
        "--cqe 7",
        &[
            "RX CQE 7 of 8",
            "0030:",
            "RESP_SEND",
            "striding RQ: 1 stride(s)",
        ],
    )?;
    let d = stdout_of(
        &f.inspect(&[&pid, "--cqe", "0", "--cq", "tx"]),
        "--cqe 0 --cq tx",
    )?;
    must_contain(&d, "--cq tx", &["TX CQE 0 of 128", "REQ (send completed)"])?;
    let d = stdout_of(
        &f.inspect(&[&pid, "--wqe", "0", "--queue", "31851"]),
        "--wqe 0",
    )?;
    must_contain(
        &d,
        "--wqe 0",
        &[
            "queue set :31851",
            "SQ WQEBB 0 of 128",
            "WQE SEND (0x0a) index ",
            "; data ",
        ],
    )?;
    // Slot 0 holds the WQE of some lap of the 128-WQEBB ring.
    let index: u64 = d
        .split("index ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no WQE index in {d}"))?;
    check(index.is_multiple_of(128), || {
        format!("WQEBB 0 holds WQE index {index}")
    })?;
    check(!d.contains("queue set :31850"), || {
        format!("--queue picks one queue set:\n{d}")
    })?;
    let d = stdout_of(
        &f.inspect(&[&pid, "--wqe", "3", "--wq", "rq"]),
        "--wqe 3 --wq rq",
    )?;
    must_contain(
        &d,
        "--wq rq",
        &["RQ WQE 3 of 8", "striding RQ WQE: data 524288 bytes"],
    )?;
    // Indexes past the ring: bad usage, naming the limit (exit status 2);
    // a port no queue set has: what the process published (exit status 1).
    for (args, msg, code) in [
        (vec!["--cqe", "8"], "--cqe 8: the RX CQ has 8 entries", 2),
        (
            vec!["--cqe", "99999"],
            "the RX CQ has 8 entries (0 to 7)",
            2,
        ),
        (vec!["--wqe", "128"], "--wqe 128: the SQ has 128 WQEBBs", 2),
        (
            vec!["--wqe", "0", "--queue", "9"],
            "no queue set is steered by UDP port 9",
            1,
        ),
    ] {
        let mut a = vec![pid.as_str()];
        a.extend(args.iter().copied());
        let o = f.inspect(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        check(
            o.status.code() == Some(code) && err.contains(msg) && o.stdout.is_empty(),
            || format!("{a:?}: {:?} {err}", o.status),
        )?;
    }
    // --watch: two snapshots, the second with rates (idle: zero).
    let w = stdout_of(
        &f.inspect(&[
            &pid,
            "--watch",
            "--count",
            "2",
            "--interval",
            "0.05",
            "--color",
            "never",
        ]),
        "--watch",
    )?;
    check(
        w.matches("Nexus node0:31850").count() == 2 && w.contains("[0/s]"),
        || w.clone(),
    )?;
    let w = stdout_of(
        &f.inspect(&[
            &pid,
            "--watch",
            "--count",
            "2",
            "--interval",
            "0.05",
            "--json",
        ]),
        "--watch --json",
    )?;
    check(w.lines().count() == 2, || w.clone())?;
    for l in w.lines() {
        let _: Snapshot = serde_json::from_str(l).map_err(|e| e.to_string())?;
    }
    // list: the fixture, with its devices and Nexuses.
    let l = stdout_of(&f.inspect(&["list"]), "list")?;
    must_contain(&l, "list", &[&pid, "sim nic 0", "node0:31850 (Rpcs [0])"])?;
    // Options may come after the subcommand too.
    let o = Command::new(INSPECT)
        .args(["list", "--json", "--dir"])
        .arg(&f.dir)
        .output()
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
    check(
        v[0]["pid"] == json!(f.pid) && v[0]["status"] == json!("ok"),
        || v.to_string(),
    )?;
    let dir = f.dir.clone();
    f.stop()?;
    // Once the process is gone: nothing to attach to.
    let o = Command::new(INSPECT)
        .arg("--dir")
        .arg(&dir)
        .arg(&pid)
        .output()
        .map_err(|e| e.to_string())?;
    check(o.status.code() == Some(1), || format!("{:?}", o.status))?;
    Ok(())
}

fn another_user_is_refused() -> Result<(), Failed> {
    let f = Fixture::start("uid")?;
    let pid = f.pid.to_string();
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
    check(
        mode(&f.dir).ok() == Some(0o700) && mode(&f.socket()).ok() == Some(0o600),
        || format!("modes {:?} {:?}", mode(&f.dir).ok(), mode(&f.socket()).ok()),
    )?;
    // 1. The owner-only directory keeps nobody from reaching the socket.
    let o = f.inspect_as(Some(NOBODY), &[&pid]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    check(
        o.status.code() == Some(1) && err.contains("ermission denied") && o.stdout.is_empty(),
        || format!("as nobody, default modes: {:?} {err}", o.status),
    )?;
    // 2. With the modes opened up, the endpoint itself refuses (SO_PEERCRED).
    let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    set(&f.dir, 0o755).map_err(|e| e.to_string())?;
    set(&f.socket(), 0o666).map_err(|e| e.to_string())?;
    let o = f.inspect_as(Some(NOBODY), &[&pid, "--json"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    check(
        o.status.code() == Some(1)
            && err.contains("permission denied: this endpoint serves only its owner (uid 0)")
            && err.contains(&format!("runs as uid {NOBODY}"))
            && o.stdout.is_empty(),
        || format!("as nobody, open modes: {:?} {err}", o.status),
    )?;
    let o = f.inspect_as(Some(NOBODY), &["list"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    check(
        out.contains("permission denied") && !out.contains("sim nic"),
        || out.clone(),
    )?;
    // The owner still gets in.
    let (_, s) = f.snapshot()?;
    check(s.devices.len() == 2, || "owner snapshot".into())?;
    set(&f.dir, 0o700).map_err(|e| e.to_string())?;
    f.stop()
}
