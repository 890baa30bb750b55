//! The command-line tools as a user meets them: the built binaries run
//! with bad input must print one line naming the problem and exit non-zero
//! (2 for bad arguments, 1 for a failed setup), never a panic or a
//! backtrace; good input must work end to end.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mlx5::vfio::PciAddress;
use mlx5::vfio::sysfs::FakeSysfs;

const BENCH: &str = env!("CARGO_BIN_EXE_erpc-bench");
const VFIO: &str = env!("CARGO_BIN_EXE_erpc-vfio");

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {exe}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs erpc-bench with `args`, expects exit `code` and one stderr line
/// containing every string of `want`.
fn bench_refuses(args: &[&str], code: i32, want: &[&str]) {
    let out = run(BENCH, args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(!err.contains("stack backtrace"), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("note:")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line expected: {err}");
    assert!(lines[0].starts_with("erpc-bench: "), "{args:?}: {err}");
    for w in want {
        assert!(lines[0].contains(w), "{args:?}: {w:?} missing in {err}");
    }
    assert!(
        out.stdout.is_empty(),
        "{args:?}: nothing runs: {}",
        text(&out.stdout)
    );
}

#[test]
fn erpc_bench_refuses_bad_values_naming_the_limit() {
    let max = erpc::MAX_MSG_BYTES.to_string();
    bench_refuses(&["--size", "8000000"], 2, &["--size 8000000", &max]);
    bench_refuses(&["--size", "100000000"], 2, &["--size 100000000", &max]);
    for secs in ["nan", "inf", "0", "-1", "1e9"] {
        bench_refuses(&["--secs", secs], 2, &["--secs", "above 0", "86400"]);
    }
    bench_refuses(
        &["--warmup", "nan"],
        2,
        &["--warmup NaN", "from 0 to 86400"],
    );
    bench_refuses(&["--window", "0"], 2, &["--window 0", "1 to 1024"]);
    bench_refuses(&["--window", "5000"], 2, &["--window 5000", "1 to 1024"]);
    bench_refuses(&["--batch", "0"], 2, &["--batch 0", "1 to --window (60)"]);
    bench_refuses(
        &["--batch", "1,61"],
        2,
        &["--batch 61", "1 to --window (60)"],
    );
    bench_refuses(
        &["--size", "7000000", "--window", "1024"],
        2,
        &["MiB of message buffers per node", "the limit is 4096 MiB"],
    );
    bench_refuses(
        &["--pci", "0000:03:00.0"],
        2,
        &["--pci is for --transport mlx5", "mlx5-sim"],
    );
    bench_refuses(
        &["--transport", "udp", "--pci", "0000:03:00.0"],
        2,
        &["--pci is for --transport mlx5", "udp"],
    );
    bench_refuses(&["--transport", "mlx5"], 2, &["needs --pci"]);
    bench_refuses(
        &["--transport", "mlx5", "--pci", "garbage"],
        2,
        &["--pci garbage", "not a PCI address"],
    );
    bench_refuses(
        &[
            "--transport",
            "mlx5",
            "--pci",
            "0000:03:00.0",
            "--pcap",
            "x",
        ],
        2,
        &["--pcap works on the device model only"],
    );
}

/// Runs erpc-bench with `args` that clap itself refuses (a flag the job
/// does not take): exit 2, every string of `want` on stderr, nothing run.
fn bench_clap_refuses(args: &[&str], want: &[&str]) {
    let out = run(BENCH, args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for w in want {
        assert!(err.contains(w), "{args:?}: {w:?} missing in {err}");
    }
    assert!(
        out.stdout.is_empty(),
        "{args:?}: nothing runs: {}",
        text(&out.stdout)
    );
}

#[test]
fn erpc_bench_experiment_options_are_checked() {
    for l in ["0.5", "-0.1", "nan", "2"] {
        bench_refuses(&["--loss", l], 2, &["--loss", "below 0.5"]);
    }
    bench_refuses(
        &["--transport", "udp", "--loss", "0.01"],
        2,
        &["--loss is injected by the device model", "udp"],
    );
    bench_refuses(
        &["failure-detection", "--trials", "0"],
        2,
        &["--trials 0", "1 to 1000"],
    );
    bench_refuses(
        &["failure-detection", "--failure-timeout-ms", "1"],
        2,
        &["--failure-timeout-ms 1", "10 to 60000"],
    );
    bench_refuses(
        &["incast", "--senders", "10,0"],
        2,
        &["--senders", "1 to 1000"],
    );
    bench_refuses(
        &["incast", "--buffer-kib", "0"],
        2,
        &["--buffer-kib 0", "1 to 1048576"],
    );
    bench_refuses(
        &["incast", "--link-delay-ns", "2000000"],
        2,
        &["--link-delay-ns 2000000", "at most 1000000"],
    );
    bench_refuses(
        &["incast", "--t-low-us", "2000"],
        2,
        &["Timely", "T_low (2000 µs) <= T_high (1000 µs)"],
    );
    bench_refuses(
        &["cc-overhead", "--rounds", "0"],
        2,
        &["--rounds 0", "1 to 100"],
    );
    bench_refuses(
        &["factors", "--window", "0"],
        2,
        &["--window 0", "1 to 1024"],
    );
    bench_refuses(&["large", "--secs", "0"], 2, &["--secs", "86400"]);
    bench_refuses(
        &["scale", "--client-nodes", "0"],
        2,
        &["--client-nodes 0", "1 to 10000"],
    );
    bench_refuses(
        &["--cc", "on,off", "--latency-csv", "x.csv"],
        2,
        &["--latency-csv keeps one distribution per B"],
    );
    // A flag the experiment does not take is clap's refusal: the device
    // model's experiments take no --transport, the experiments none of
    // the main job's --loss, --pcap or --cc, and the main job's flags do
    // not go before a subcommand.
    for (args, flag) in [
        (&["loss", "--transport", "udp"][..], "--transport"),
        (&["cc-overhead", "--transport", "udp"], "--transport"),
        (&["loss", "--loss", "0.1"], "--loss"),
        (&["failure-detection", "--pcap", "x.pcap"], "--pcap"),
        (&["incast", "--pcap", "x.pcap"], "--pcap"),
        (&["incast", "--cc", "off"], "--cc"),
        (&["--batch", "3", "incast"], "--batch"),
    ] {
        bench_clap_refuses(args, &[flag]);
    }
}

/// `--cc on,off` measures each B with congestion control on and off in
/// the same run, against one reference per B: two rows per B, labelled,
/// in the table and the JSON (over kernel UDP, where it is off by
/// default, `on` switches it on).
#[test]
fn erpc_bench_cc_on_and_off_in_one_run() {
    let dir = temp_dir("cc");
    let json = dir.join("run.json");
    for (transport, ctl) in [("mlx5-sim", "timely"), ("udp", "swift")] {
        let out = run(
            BENCH,
            &[
                "--transport",
                transport,
                "--batch",
                "1,8",
                "--count",
                "2000",
                "--cc",
                "on,off",
                "--controller",
                ctl,
                "--json",
                json.to_str().unwrap(),
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let rows: Vec<Vec<&str>> = stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.len() > 3 && (w[0] == "1" || w[0] == "8") && w[1] == "60")
            .collect();
        let labels: Vec<(&str, &str)> = rows.iter().map(|w| (w[0], w[2])).collect();
        assert_eq!(
            labels,
            [("1", ctl), ("1", "off"), ("8", ctl), ("8", "off")],
            "{stdout}"
        );
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
        let points = v["points"].as_array().unwrap();
        let cc: Vec<&str> = points.iter().map(|p| p["cc"].as_str().unwrap()).collect();
        assert_eq!(cc, [ctl, "off", ctl, "off"]);
        for p in points {
            assert!(p["completed"].as_u64().unwrap() >= 2000, "{p}");
            // One reference per B, shared by both rows.
            assert!(p["raw_echo_round_trips"].as_u64().unwrap() >= 2000, "{p}");
        }
        assert_eq!(
            points[0]["raw_echo_round_trips"],
            points[1]["raw_echo_round_trips"]
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn erpc_bench_failure_detection_kills_a_peer_and_reports_the_time() {
    // Two trials with a short timeout: the peer process holds requests, is
    // killed, and the client's continuations fail. (Times are reported,
    // not checked: this machine may be loaded.)
    let dir = temp_dir("failure-detection");
    let json = dir.join("d.json");
    let out = run(
        BENCH,
        &[
            "failure-detection",
            "--trials",
            "2",
            "--failure-timeout-ms",
            "100",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    assert!(o.contains("kill -> error continuation: median"), "{o}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["timeout_ms"], 100);
    assert_eq!(v["trials_ms"].as_array().map(|a| a.len()), Some(2), "{v}");
    for t in v["trials_ms"].as_array().unwrap() {
        // Never before the peer could have been declared failed: the last
        // answered ping is at most one ping interval (timeout / 10) older
        // than the kill.
        assert!(t.as_f64().unwrap() >= 90.0, "{v}");
    }
}

#[test]
fn erpc_bench_setup_failures_are_one_line_not_a_backtrace() {
    // A function that does not exist (no VFIO here either way).
    bench_refuses(
        &["--transport", "mlx5", "--pci", "0000:99:1f.7"],
        1,
        &["0000:99:1f.7"],
    );
    // Output files are opened before anything runs.
    bench_refuses(
        &["--json", "/nonexistent-dir/run.json"],
        1,
        &["cannot write /nonexistent-dir/run.json"],
    );
    bench_refuses(
        &["--latency-csv", "/nonexistent-dir/lat.csv"],
        1,
        &["cannot write /nonexistent-dir/lat.csv"],
    );
    bench_refuses(
        &["--pcap", "/nonexistent-dir/x.pcap"],
        1,
        &["cannot write /nonexistent-dir/x.pcap"],
    );
}

#[test]
fn erpc_bench_clap_errors_exit_2() {
    for args in [
        &["--size", "-1"][..],
        &["--window", "many"],
        &["--transport", "rdma"],
        &["--bogus"],
    ] {
        let out = run(BENCH, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!text(&out.stderr).contains("panicked"), "{args:?}");
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("erpc-cli-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// `RUST_LOG=debug` shows eRPC's own session events with the peer's URI,
/// and a log that is not a terminal carries no colour codes.
#[test]
fn erpc_bench_debug_log_names_sessions_without_colour_codes() {
    let out = Command::new(BENCH)
        .args([
            "--secs", "0.05", "--warmup", "0", "--batch", "1", "--window", "4",
        ])
        .env("RUST_LOG", "erpc=debug")
        .output()
        .expect("erpc-bench runs");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a piped log:\n{stderr}"
    );
    let connected = stderr
        .lines()
        .filter(|l| {
            l.contains("DEBUG") && l.contains("client session") && l.contains(": Connected")
        })
        .collect::<Vec<_>>();
    assert!(!connected.is_empty(), "{stderr}");
    // Each names its peer (host:port).
    assert!(
        connected
            .iter()
            .all(|l| l.contains(" to ") && l.contains("peer=")),
        "{connected:#?}"
    );
    assert!(stderr.contains("server session"), "{stderr}");
}

/// A short run on the device model, multi-packet messages, with every
/// output: the table on stdout, JSON with the points and the NICs' queue
/// snapshots, the latency CSV.
#[test]
fn erpc_bench_writes_json_and_latency_csv() {
    let dir = temp_dir("json");
    let (json, csv) = (dir.join("run.json"), dir.join("lat.csv"));
    let out = run(
        BENCH,
        &[
            "--secs",
            "0.05",
            "--warmup",
            "0",
            "--batch",
            "1,2",
            "--window",
            "4",
            "--size",
            "2000",
            "--json",
            json.to_str().unwrap(),
            "--latency-csv",
            csv.to_str().unwrap(),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("this test"), "{stderr}");
    // The hugepage note, if any, comes once.
    assert!(stderr.matches("hugepages").count() <= 1, "{stderr}");
    assert!(stdout.contains("raw echo of 1024-byte packets"), "{stdout}");
    assert!(!stdout.contains("inf"), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(['1', '2']))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["tool"], "erpc-bench");
    assert_eq!(v["settings"]["transport"], "mlx5-sim");
    assert_eq!(v["raw_echo"]["frame_bytes"], 1024);
    assert_eq!(v["raw_echo"]["packets_per_rpc_per_direction"], 5);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, b) in points.iter().zip([1, 2]) {
        assert_eq!(p["point"]["batch"], b);
        assert!(p["completed"].as_u64().unwrap() > 0, "{p}");
        assert!(p["ratio_to_raw_echo"].as_f64().unwrap() > 0.0, "{p}");
        // The reference is timed as the RPCs are: its round trips have a
        // latency, and a 5-packet exchange takes more than a microsecond.
        assert!(p["raw_echo_median_us"].as_f64().unwrap() > 1.0, "{p}");
        let lat = &p["latency_us"];
        assert!(lat["median"].as_f64().unwrap() <= lat["p99"].as_f64().unwrap());
        // Both nodes' queue sets, with the driver's counters.
        let q = p["queues"].as_array().unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0]["udp_port"], 31850);
        assert_eq!(q[1]["udp_port"], 31851);
        assert!(q[0]["stats"]["tx_wqes"].as_u64().unwrap() > 0);
    }
    assert!(v["device_model"]["frames_sent"].as_u64().unwrap() > 0);
    let csv = fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("batch,window,size,percentile,latency_us,count")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|r| r.len() == 6));
    assert!(rows.iter().any(|r| r[0] == "1") && rows.iter().any(|r| r[0] == "2"));
    // The counts of a point add up to its completed RPCs.
    let count = |b: &str| -> u64 {
        rows.iter()
            .filter(|r| r[0] == b)
            .map(|r| r[5].parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(count("1"), points[0]["completed"].as_u64().unwrap());
    assert_eq!(count("2"), points[1]["completed"].as_u64().unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn erpc_bench_ends_quietly_when_stdout_is_closed() {
    use std::process::Stdio;
    let mut child = Command::new(BENCH)
        .args(["--secs", "0.01", "--warmup", "0", "--batch", "1,1,1,1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read nothing: close the pipe at once.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}

/// A fake machine for `erpc-vfio`: a lone function with no driver, the
/// default-route NIC, a bound function with its VFIO node.
struct Machine {
    fake: FakeSysfs,
    proc_root: PathBuf,
    dev_vfio: PathBuf,
    state: PathBuf,
}

fn bdf(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn machine() -> Machine {
    let fake = FakeSysfs::new().unwrap();
    fake.add_device(bdf("0000:00:02.0"), 0x15b3, 0x1017, 0x020000, Some(2))
        .unwrap();
    fake.add_device(bdf("0000:00:04.0"), 0x1af4, 0x1000, 0x020000, Some(4))
        .unwrap();
    fake.add_device(bdf("0000:00:05.0"), 0x15b3, 0x1017, 0x020000, Some(5))
        .unwrap();
    fake.add_driver("vfio-pci").unwrap();
    fake.bind(bdf("0000:00:04.0"), "virtio-pci").unwrap();
    fake.bind(bdf("0000:00:05.0"), "vfio-pci").unwrap();
    fake.add_iommu_unit("dmar0").unwrap();
    fake.add_interface(bdf("0000:00:04.0"), "eth0", true)
        .unwrap();
    let root = fake.root().to_owned();
    let proc_root = root.join("proc");
    fs::create_dir_all(proc_root.join("net")).unwrap();
    fs::create_dir_all(proc_root.join("self")).unwrap();
    fs::write(
        proc_root.join("net/route"),
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
         eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n",
    )
    .unwrap();
    fs::write(
        proc_root.join("meminfo"),
        "HugePages_Total:    1024\nHugePages_Free:     1024\nHugePages_Rsvd:        0\n\
         Hugepagesize:       2048 kB\n",
    )
    .unwrap();
    fs::write(proc_root.join("cmdline"), "intel_iommu=on\n").unwrap();
    fs::write(
        proc_root.join("self/status"),
        "Uid:\t1000\t1000\t1000\t1000\n",
    )
    .unwrap();
    let dev_vfio = root.join("dev-vfio");
    fs::create_dir_all(&dev_vfio).unwrap();
    fs::write(dev_vfio.join("5"), "").unwrap();
    Machine {
        state: root.join("run"),
        fake,
        proc_root,
        dev_vfio,
    }
}

impl Machine {
    fn vfio(&self, args: &[&str]) -> Output {
        let p = |x: &Path| x.to_str().unwrap().to_string();
        let mut all = vec![
            "--sysfs".to_string(),
            p(self.fake.root()),
            "--proc".into(),
            p(&self.proc_root),
            "--dev-vfio".into(),
            p(&self.dev_vfio),
            "--state-dir".into(),
            p(&self.state),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run(VFIO, &refs)
    }
}

#[test]
fn erpc_vfio_status_exit_codes_tell_scripts_ready_or_not() {
    let m = machine();
    // Ready: exit 0.
    let out = m.vfio(&["status", "0000:00:05.0"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("ready for VFIO  yes"));
    // Not ready: exit 3, and the advice is the bind that will work.
    let out = m.vfio(&["status", "0000:00:02.0"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("ready for VFIO  no"), "{stdout}");
    assert!(
        stdout.contains("next step       bind it: `sudo erpc-vfio bind 0000:00:02.0`"),
        "{stdout}"
    );
    // The same with --json.
    let out = m.vfio(&["--json", "status", "0000:00:02.0"]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ready"], false);
    // The default-route NIC: not ready, and no plain `bind` advice, since
    // bind refuses it.
    let out = m.vfio(&["status", "0000:00:04.0"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        !stdout.contains("bind it: `sudo erpc-vfio bind 0000:00:04.0`"),
        "{stdout}"
    );
    assert!(stdout.contains("--force 0000:00:04.0"), "{stdout}");
    let out = m.vfio(&["bind", "--dry-run", "0000:00:04.0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("refusing to bind 0000:00:04.0"));
    // Errors: exit 1; bad arguments: exit 2.
    let out = m.vfio(&["status", "0000:00:09.0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("does not exist"));
    let out = m.vfio(&["status", "nonsense"]);
    assert_eq!(out.status.code(), Some(2));
    // Not root: bind refuses with exit 1 and says what to do.
    let out = m.vfio(&["bind", "0000:00:02.0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("must run as root"));
}

#[test]
fn erpc_vfio_ends_quietly_when_stdout_is_closed() {
    use std::process::Stdio;
    let m = machine();
    let p = |x: &Path| x.to_str().unwrap().to_string();
    for cmd in [
        &["list"][..],
        &["status", "0000:00:05.0"],
        &["--json", "list"],
    ] {
        let mut child = Command::new(VFIO)
            .args(["--sysfs", &p(m.fake.root()), "--proc", &p(&m.proc_root)])
            .args(["--dev-vfio", &p(&m.dev_vfio), "--state-dir", &p(&m.state)])
            .args(cmd)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{cmd:?}: {err}");
    }
}

const INSPECT: &str = env!("CARGO_BIN_EXE_erpc-inspect");

/// Runs erpc-inspect with `args`, expects exit `code` and a stderr that
/// contains every string of `want`, without a panic.
fn inspect_refuses(args: &[&str], code: i32, want: &[&str]) {
    let out = run(INSPECT, args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("stack backtrace"),
        "{args:?}: {err}"
    );
    for w in want {
        assert!(err.contains(w), "{args:?}: {w:?} missing in {err}");
    }
    assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
}

#[test]
fn erpc_inspect_refuses_bad_values_and_explains_missing_endpoints() {
    let dir = temp_dir("inspect-cli");
    let d = dir.to_str().unwrap();
    inspect_refuses(&[], 2, &["give a process id"]);
    for (args, msg) in [
        (
            vec!["1", "--watch", "--interval", "0"],
            "--interval 0: must be 0.05 to 3600",
        ),
        (vec!["1", "--watch", "--interval", "nan"], "--interval NaN"),
        (
            vec!["1", "--timeout-ms", "0"],
            "--timeout-ms 0: must be 1 to 10000",
        ),
        (vec!["1", "--watch", "--count", "0"], "--count 0"),
        (
            vec!["1", "--queue", "31850"],
            "--queue selects the queue set of --cqe or --wqe",
        ),
        (vec!["--dir", d, "list"], "options go after the subcommand"),
    ] {
        inspect_refuses(&args, 2, &[msg]);
    }
    // clap's own refusals: exit 2 too.
    inspect_refuses(
        &["1", "--cqe", "1", "--wqe", "1"],
        2,
        &["cannot be used with"],
    );
    // Options that would be ignored: --interval and --count without
    // --watch, --json with a descriptor dump (text).
    inspect_refuses(&["1", "--interval", "2"], 2, &["--watch"]);
    inspect_refuses(&["1", "--count", "3"], 2, &["--watch"]);
    inspect_refuses(
        &["1", "--json", "--cqe", "1"],
        2,
        &["--json", "cannot be used with", "--cqe"],
    );
    inspect_refuses(&["device"], 2, &["required"]);
    inspect_refuses(&["device", "--profile", "cx7"], 2, &["--sim"]);
    inspect_refuses(&["device", "not-a-bdf"], 2, &["not a PCI address"]);
    // Nothing to attach to: one line, exit 1.
    let pid = std::process::id().to_string();
    inspect_refuses(
        &[&pid, "--dir", d],
        1,
        &["has no debug endpoint in", "ERPC_INSPECT=1"],
    );
    inspect_refuses(&["4294967295", "--dir", d], 1, &["no process 4294967295"]);
    inspect_refuses(
        &["/nonexistent/x.sock"],
        1,
        &["no endpoint socket at /nonexistent/x.sock"],
    );
    // A socket file nobody serves (a crashed process's leftover).
    let stale = dir.join(format!("{pid}.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    inspect_refuses(
        &[&pid, "--dir", d],
        1,
        &["cannot connect to", "Connection refused"],
    );
    let out = run(INSPECT, &["list", "--dir", d]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&pid), "{}", text(&out.stdout));
    // A device on the model that the driver refuses: the reason, exit 1.
    let out = run(INSPECT, &["device", "--sim", "--profile", "cx4"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing capability striding_rq"));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn erpc_inspect_device_sim_reports_and_tears_down() {
    let out = run(INSPECT, &["device", "--sim"]);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    for w in [
        "ConnectX-5 [15b3:1017], firmware 16.35.2000",
        "port up, mac 02:00:00:00:00:01",
        "health ok",
        "given to firmware",
        "QUERY_EQ consumer",
        "torn down: every object destroyed",
    ] {
        assert!(o.contains(w), "{w:?} missing in {o}");
    }
    let out = run(
        INSPECT,
        &["device", "--sim", "--profile", "cx6dx", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["model"], "ConnectX-6 Dx");
    assert_eq!(v["torn_down"], true);
    assert_eq!(v["caps"]["reset_root_to_default"], true);
    assert!(v["pages"]["firmware_pages"].as_u64().unwrap() > 0);
}
