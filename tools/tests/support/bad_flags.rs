//! Shared by the bad-flag tests of erpc-tools (tools/tests/bad_flags.rs)
//! and erpc-apps (tools/apps/tests/bad_flags.rs), each of which can reach
//! only its own crate's binaries: every binary of the crate, run with bad
//! flags, must refuse them as a usage error (exit status 2, a message
//! naming the flag and its limit on stderr), never panic, never hang, and
//! print nothing on stdout; and every binary the crate's manifest builds
//! must have a row, so that a new binary without one fails the test.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One bad command line and what its refusal must say.
pub struct Case {
    /// The binary's name (as `[[bin]]` or `src/bin/` names it).
    pub bin: &'static str,
    pub args: &'static [&'static str],
    /// Every string must appear on stderr.
    pub want: &'static [&'static str],
}

/// A case, in a table.
pub const fn case(
    bin: &'static str,
    args: &'static [&'static str],
    want: &'static [&'static str],
) -> Case {
    Case { bin, args, want }
}

/// How long a refusal may take before it counts as a hang. Every case
/// fails while parsing its flags, before any work, so this bound is about
/// hangs only (a loaded 2-core machine takes well under a second).
const HANG: Duration = Duration::from_secs(120);

/// The binaries the crate at `manifest_dir` builds: its `[[bin]]` names
/// and the files and directories of its `src/bin` (cargo's automatic
/// binaries).
pub fn bins_of(manifest_dir: &str) -> BTreeSet<String> {
    let dir = Path::new(manifest_dir);
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    let mut bins = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(v) = line.strip_prefix("name") {
            let name = v
                .trim_start()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"');
            bins.insert(name.to_owned());
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("src/bin")) {
        for e in rd.flatten() {
            let p = e.path();
            let name = if p.is_dir() {
                p.join("main.rs").exists().then(|| p.file_name())
            } else {
                (p.extension().is_some_and(|x| x == "rs")).then(|| p.file_stem())
            };
            if let Some(Some(n)) = name {
                bins.insert(n.to_string_lossy().into_owned());
            }
        }
    }
    bins
}

/// Runs one case; `Err` says what was wrong.
fn run_case(exe: &str, c: &Case) -> Result<(), String> {
    let mut child = Command::new(exe)
        .args(c.args)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    // Both pipes drain in threads, so a chatty child cannot block on a
    // full pipe while we wait.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if t0.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("hangs: still running after {} s", HANG.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if err.contains("panicked") || status.code() == Some(101) {
        return Err(format!("panics: {status}: {err}"));
    }
    if status.code() != Some(2) {
        return Err(format!("exit status {status}, not 2: {err}"));
    }
    if let Some(w) = c.want.iter().find(|w| !err.contains(*w)) {
        return Err(format!("stderr lacks {w:?}: {err}"));
    }
    if !out.is_empty() {
        return Err(format!("refused, yet printed on stdout: {out}"));
    }
    Ok(())
}

/// Runs every case against `exes` (name, path) and checks that every
/// binary of the crate at `manifest_dir` has a path and at least one case.
pub fn check(manifest_dir: &str, exes: &[(&str, &str)], cases: &[Case]) {
    let mut fails = Vec::new();
    for bin in bins_of(manifest_dir) {
        if !exes.iter().any(|(n, _)| *n == bin) {
            fails.push(format!(
                "binary {bin} has no entry in this test's table: add its \
                 CARGO_BIN_EXE path and bad-flag cases"
            ));
        } else if !cases.iter().any(|c| c.bin == bin) {
            fails.push(format!("binary {bin} has no bad-flag case"));
        }
    }
    for c in cases {
        let Some((_, exe)) = exes.iter().find(|(n, _)| *n == c.bin) else {
            fails.push(format!("case for unknown binary {}", c.bin));
            continue;
        };
        if let Err(e) = run_case(exe, c) {
            fails.push(format!("{} {}: {e}", c.bin, c.args.join(" ")));
        }
    }
    assert!(fails.is_empty(), "\n{}", fails.join("\n"));
}
