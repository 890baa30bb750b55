//! The socket and the thread that serves it.
//!
//! Started by the first [`register`] of a process, stopped (socket file
//! removed) when the last [`Registration`] is dropped.
//!
//! # The snapshot answer
//!
//! `{"cmd":"snapshot"}` is answered with one JSON object whose common keys
//! are (protocol [`crate::PROTOCOL`]):
//!
//! | key | meaning |
//! |---|---|
//! | `protocol` | the protocol version |
//! | `pid`, `uid` | the process and its effective uid |
//! | `process` | its name (`/proc/self/comm`) |
//! | `time_unix_ns` | wall-clock time of the answer (rates are computed from it and each section's `age_ms`) |
//! | `generation` | the request generation every fresh section answered |
//! | `complete` | true if every publisher answered within the timeout |
//! | `waited_ms` | how long the socket thread waited for them |
//!
//! followed by one array per kind of source, in registration order
//! (`devices` for mlx5 devices, `nexuses` for eRPC Nexuses; their keys are
//! documented on `mlx5::inspect::DeviceView` and `erpc::inspect::NexusView`).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::{
    DEFAULT_TIMEOUT, MAX_TIMEOUT, MIN_REQUEST_INTERVAL, PROTOCOL, socket_dir, socket_path,
};

/// Most connections served at once; more are refused with an error line.
pub const MAX_CONNECTIONS: usize = 8;
/// Longest request line.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// A connection idle for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Something the endpoint serves: an mlx5 device, an eRPC Nexus.
///
/// `render` runs on the endpoint's threads, never on a datapath thread: it
/// may read what its datapath publishers stored in their [`crate::Slot`]s,
/// take control-path locks, and (an mlx5 device) run firmware commands.
pub trait Source: Send + Sync + 'static {
    /// The key of the snapshot array this source's sections go into
    /// (`"devices"`, `"nexuses"`).
    fn kind(&self) -> &'static str;
    /// A short description for `hello` and `erpc-inspect list` (cheap; no
    /// publication is requested).
    fn summary(&self) -> Value;
    /// True while one of this source's publishers has not answered
    /// `generation`.
    fn pending(&self, generation: u64) -> bool;
    /// A snapshot of `generation` was just requested (once per request,
    /// before the endpoint waits for the publishers): a source whose
    /// datapath threads look at the request flag only now and then can
    /// wake them here. Does nothing by default.
    fn requested(&self, generation: u64) {
        let _ = generation;
    }
    /// This source's section of a snapshot (`Value::Null`: nothing to
    /// show, e.g. the object is being torn down).
    fn render(&self, query: &Query) -> Value;
}

/// What a snapshot request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// The generation fresh sections answer.
    pub generation: u64,
    /// Whole descriptor rings were asked for.
    pub rings: bool,
}

/// A request line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Who is this process, what does it expose.
    Hello,
    /// A snapshot of every source.
    Snapshot {
        /// Also copy whole descriptor rings (SQ, RQ, TX CQ).
        #[serde(default)]
        rings: bool,
        /// How long to wait for publishers (default 500, at most 10 000).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
}

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// An OS call failed.
    #[error("debug endpoint: {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The directory is not safe to put the socket in.
    #[error(
        "debug endpoint: {path} is owned by uid {owner}, not by this process's uid {uid}; \
         set {env} to a directory of your own",
        env = crate::ENV_DIR
    )]
    ForeignDir {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        uid: u32,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> EndpointError + use<> {
    let path = path.to_owned();
    move |source| EndpointError::Io { what, path, source }
}

struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

struct Registry {
    next_id: u64,
    sources: Vec<(u64, Arc<dyn Source>)>,
    server: Option<Server>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_id: 1,
    sources: Vec::new(),
    server: None,
});

/// Serializes generation bumps and paces them.
static LAST_REQUEST: Mutex<Option<Instant>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn sources() -> Vec<Arc<dyn Source>> {
    registry().sources.iter().map(|(_, s)| s.clone()).collect()
}

/// Keeps a source registered; dropping it unregisters the source (and
/// stops the endpoint when it was the last one).
#[derive(Debug)]
pub struct Registration {
    id: u64,
    path: PathBuf,
}

impl Registration {
    /// The socket clients connect to.
    pub fn socket(&self) -> &Path {
        &self.path
    }
}

/// Registers `source`, starting the endpoint if this is the process's
/// first source.
pub fn register(source: Arc<dyn Source>) -> Result<Registration, EndpointError> {
    let mut r = registry();
    if r.server.is_none() {
        r.server = Some(start()?);
    }
    let id = r.next_id;
    r.next_id += 1;
    r.sources.push((id, source));
    let path = r.server.as_ref().expect("started above").path.clone();
    Ok(Registration { id, path })
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut r = registry();
        r.sources.retain(|(id, _)| *id != self.id);
        if r.sources.is_empty()
            && let Some(s) = r.server.take()
        {
            s.stop.store(true, Ordering::Release);
            // Wake the accept loop so that it sees the flag; it exits
            // without touching the path, which a new endpoint of this
            // process may reuse at once.
            let _ = UnixStream::connect(&s.path);
            let _ = std::fs::remove_file(&s.path);
            tracing::debug!(socket = %s.path.display(), "debug endpoint stopped");
        }
    }
}

/// Makes SIGTERM, SIGINT and SIGHUP remove this process's endpoint socket
/// (whichever runs when the signal comes) and then end the process as
/// their default action does. Without it a process killed by a signal
/// leaves its socket behind (`erpc-inspect list` removes such sockets once
/// their process is gone).
///
/// The signals are taken by signal-hook's self-pipe and handled on a
/// thread of their own ("erpc-signals"), so no code of ours runs in a
/// signal handler: the thread removes the socket, then re-raises the
/// signal with its default action.
///
/// For programs, not libraries: an endpoint does not install it itself,
/// since a library must not take over its process's signals. Call it only
/// in a program that lets these signals end it (the tools' binaries do);
/// a program with its own handling of them ends cleanly anyway, dropping
/// its Nexuses and devices, which removes the socket. Calling it again
/// does nothing.
pub fn remove_socket_on_termination() -> io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static HOOKED: Mutex<bool> = Mutex::new(false);
    let mut hooked = HOOKED.lock().unwrap_or_else(|p| p.into_inner());
    if *hooked {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("erpc-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                if let Some(s) = registry().server.as_ref() {
                    let _ = std::fs::remove_file(&s.path);
                }
                // Ends the process (its fallback is abort).
                let _ = signal_hook::low_level::emulate_default_handler(sig);
            }
        })?;
    *hooked = true;
    Ok(())
}

/// This process's effective uid.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Makes the directory (0700) if needed and checks it is ours; tightens
/// its mode if it is ours but open to others.
fn prepare_dir(dir: &Path) -> Result<(), EndpointError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("cannot create the socket directory", dir))?;
    let md = std::fs::metadata(dir).map_err(io_err("cannot stat", dir))?;
    let uid = euid();
    if md.uid() != uid {
        return Err(EndpointError::ForeignDir {
            path: dir.to_owned(),
            owner: md.uid(),
            uid,
        });
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("cannot make owner-only", dir))?;
    }
    Ok(())
}

/// The socket directory endpoints of this process will use
/// ([`crate::socket_dir`]), made and checked as an endpoint start would:
/// for a program that announces where its endpoint will be before it
/// starts one (an error says why none can start there).
pub fn prepare_socket_dir() -> Result<PathBuf, EndpointError> {
    let dir = crate::socket_dir();
    prepare_dir(&dir)?;
    Ok(dir)
}

fn start() -> Result<Server, EndpointError> {
    let dir = socket_dir();
    prepare_dir(&dir)?;
    let pid = std::process::id();
    let path = socket_path(&dir, pid);
    // A file under our pid is a leftover of an earlier process that had
    // the same pid (or of this one, stopped without cleanup).
    let _ = std::fs::remove_file(&path);
    // Bind under a temporary name, restrict, then rename: the socket is
    // never reachable under its real name with the default mode.
    let tmp = dir.join(format!(".{pid}.sock.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io_err("cannot bind", &tmp))?;
    let cleanup = |e| {
        let _ = std::fs::remove_file(&tmp);
        e
    };
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("cannot chmod", &tmp))
        .map_err(cleanup)?;
    std::fs::rename(&tmp, &path)
        .map_err(io_err("cannot rename the socket to", &path))
        .map_err(cleanup)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::Builder::new()
        .name("erpc-inspect".into())
        .spawn(move || accept_loop(listener, s))
        .map_err(io_err("cannot start the endpoint thread for", &path))?;
    tracing::info!(socket = %path.display(), "debug endpoint listening");
    Ok(Server { path, stop })
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);

fn accept_loop(listener: UnixListener, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match conn {
            Ok(stream) => {
                if ACTIVE.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    ACTIVE.fetch_sub(1, Ordering::AcqRel);
                    let _ = reply(
                        &mut &stream,
                        &error(format!(
                            "too many inspector connections (at most {MAX_CONNECTIONS})"
                        )),
                    );
                    continue;
                }
                let spawned = std::thread::Builder::new()
                    .name("erpc-inspect-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve(stream) {
                            tracing::debug!(error = %e, "inspector connection ended");
                        }
                        ACTIVE.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    ACTIVE.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(error = %e, "cannot start a thread for an inspector connection");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "debug endpoint: accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn error(msg: String) -> Value {
    json!({ "error": msg })
}

fn reply(w: &mut impl Write, v: &Value) -> io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(io::Error::from)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// The uid of the process at the other end of `stream`.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let c = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(io::Error::from)?;
    Ok(c.uid())
}

/// Serves one connection: the peer check, then requests until EOF.
pub(crate) fn serve(stream: UnixStream) -> io::Result<()> {
    let me = euid();
    let peer = peer_uid(&stream)?;
    let mut w = &stream;
    if peer != me {
        tracing::warn!(
            peer_uid = peer,
            "debug endpoint: refused a connection from another user"
        );
        return reply(
            &mut w,
            &error(format!(
                "permission denied: this endpoint serves only its owner (uid {me}); \
                 the connecting process runs as uid {peer}"
            )),
        );
    }
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let mut reader = BufReader::new(&stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_REQUEST_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            let why = if n > MAX_REQUEST_BYTES {
                format!("request longer than {MAX_REQUEST_BYTES} bytes")
            } else {
                "request not terminated by a newline".into()
            };
            return reply(&mut w, &error(why));
        }
        let answer = match serde_json::from_slice::<Request>(&line) {
            Ok(req) => handle(req),
            Err(e) => error(format!(
                "bad request ({e}); send one JSON object per line, e.g. {{\"cmd\":\"snapshot\"}}"
            )),
        };
        reply(&mut w, &answer)?;
    }
}

fn common(obj: &mut Map<String, Value>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    obj.insert("protocol".into(), json!(PROTOCOL));
    obj.insert("pid".into(), json!(std::process::id()));
    obj.insert("uid".into(), json!(euid()));
    obj.insert("process".into(), json!(process_name()));
    obj.insert("time_unix_ns".into(), json!(now));
}

/// Answers one request.
pub(crate) fn handle(req: Request) -> Value {
    match req {
        Request::Hello => {
            let mut obj = Map::new();
            common(&mut obj);
            let mut kinds = Map::new();
            for s in sources() {
                let e = kinds
                    .entry(s.kind())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(a) = e {
                    a.push(s.summary());
                }
            }
            obj.insert("sources".into(), Value::Object(kinds));
            Value::Object(obj)
        }
        Request::Snapshot { rings, timeout_ms } => {
            let timeout = timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
            if timeout > MAX_TIMEOUT {
                return error(format!(
                    "timeout_ms {}: at most {}",
                    timeout.as_millis(),
                    MAX_TIMEOUT.as_millis()
                ));
            }
            snapshot(rings, timeout)
        }
    }
}

/// Asks every publisher for a snapshot (paced), waits for them up to
/// `timeout`, and renders every source.
fn snapshot(rings: bool, timeout: Duration) -> Value {
    let generation = {
        let mut last = LAST_REQUEST.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = *last {
            let since = t.elapsed();
            if since < MIN_REQUEST_INTERVAL {
                std::thread::sleep(MIN_REQUEST_INTERVAL - since);
            }
        }
        let g = crate::publish::bump(rings);
        *last = Some(Instant::now());
        g
    };
    for s in sources() {
        s.requested(generation);
    }
    let start = Instant::now();
    let complete = loop {
        if !sources().iter().any(|s| s.pending(generation)) {
            break true;
        }
        if start.elapsed() >= timeout {
            break false;
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    let waited_ms = start.elapsed().as_secs_f64() * 1e3;
    let q = Query { generation, rings };
    let mut obj = Map::new();
    common(&mut obj);
    obj.insert("generation".into(), json!(generation));
    obj.insert("complete".into(), json!(complete));
    obj.insert("waited_ms".into(), json!(waited_ms));
    for s in sources() {
        let section = s.render(&q);
        if section.is_null() {
            continue;
        }
        let e = obj
            .entry(s.kind())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = e {
            a.push(section);
        }
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Client;
    use crate::publish::tests::SERIAL;
    use crate::{Publisher, Slot};
    use std::sync::atomic::AtomicU64;

    struct Counter {
        slot: Arc<Slot<u64>>,
    }

    impl Source for Counter {
        fn kind(&self) -> &'static str {
            "counters"
        }
        fn summary(&self) -> Value {
            json!("a counter")
        }
        fn pending(&self, g: u64) -> bool {
            self.slot.pending(g)
        }
        fn render(&self, q: &Query) -> Value {
            match self.slot.latest() {
                Some(l) => {
                    json!({ "value": *l.value, "published": l.info(q.generation), "rings": q.rings })
                }
                None => json!({ "value": null }),
            }
        }
    }

    fn env_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("debug-endpoint-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn serves_fresh_snapshots_owner_only_and_cleans_up() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let dir = env_dir("serve");
        with_dir(&dir, || {
            let (mut p, slot) = Publisher::<u64>::new();
            let reg = register(Arc::new(Counter { slot })).unwrap();
            let path = reg.socket().to_owned();
            assert_eq!(path, dir.join(format!("{}.sock", std::process::id())));
            let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
            assert_eq!(mode(&dir), 0o700);
            assert_eq!(mode(&path), 0o600);
            // A datapath thread that checks its publisher in a loop.
            let stop = Arc::new(AtomicBool::new(false));
            let published = Arc::new(AtomicU64::new(0));
            let (s2, n2) = (stop.clone(), published.clone());
            let t = std::thread::spawn(move || {
                let mut v = 0u64;
                while !s2.load(Ordering::Acquire) {
                    v += 1;
                    if p.wanted() {
                        let pend = p.begin();
                        if p.publish(pend, v) {
                            n2.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    std::thread::yield_now();
                }
            });
            let mut c = Client::connect(&path).unwrap();
            let hello = c.hello().unwrap();
            assert_eq!(hello["pid"], json!(std::process::id()));
            assert_eq!(hello["sources"]["counters"][0], json!("a counter"));
            let mut last = 0;
            for _ in 0..3 {
                // No wall-clock bound: ask until the answer is complete.
                let s = loop {
                    let s = c.snapshot(false, Duration::from_secs(2)).unwrap();
                    if s["complete"] == json!(true) {
                        break s;
                    }
                };
                let sec = &s["counters"][0];
                assert_eq!(sec["published"]["fresh"], json!(true));
                assert_eq!(sec["published"]["generation"], s["generation"]);
                let v = sec["value"].as_u64().unwrap();
                assert!(v > last, "a newer snapshot each time");
                last = v;
            }
            let s = c.snapshot(true, Duration::from_secs(2)).unwrap();
            assert_eq!(s["counters"][0]["rings"], json!(true));
            // Malformed requests are answered with an error, the connection lives on.
            let e = c.raw("{\"cmd\":\"nope\"}").unwrap();
            assert!(e["error"].as_str().unwrap().contains("bad request"), "{e}");
            let e = c
                .raw("{\"cmd\":\"snapshot\",\"timeout_ms\":99999}")
                .unwrap();
            assert!(e["error"].as_str().unwrap().contains("at most"), "{e}");
            assert!(c.hello().is_ok());
            stop.store(true, Ordering::Release);
            t.join().unwrap();
            assert!(published.load(Ordering::Acquire) >= 4);
            // With the publisher gone, a snapshot does not wait for it.
            let s = c.snapshot(false, Duration::from_secs(10)).unwrap();
            assert_eq!(s["complete"], json!(true));
            drop(c);
            drop(reg);
            assert!(!path.exists(), "the socket is removed with the last source");
            // A new source starts a new endpoint under the same name.
            let (_p2, slot2) = Publisher::<u64>::new();
            let reg2 = register(Arc::new(Counter { slot: slot2 })).unwrap();
            assert!(reg2.socket().exists());
            assert!(Client::connect(reg2.socket()).unwrap().hello().is_ok());
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_overlong_and_unterminated_requests() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || serve(b));
        let mut w = &a;
        w.write_all(&vec![b'x'; MAX_REQUEST_BYTES + 10]).unwrap();
        let mut r = BufReader::new(&a);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains("longer than"), "{line}");
        t.join().unwrap().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || serve(b));
        (&a).write_all(b"{\"cmd\":\"hello\"}").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        let mut line = String::new();
        BufReader::new(&a).read_line(&mut line).unwrap();
        assert!(line.contains("not terminated"), "{line}");
        t.join().unwrap().unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if euid() != 0 {
            return; // only root can make a directory owned by someone else
        }
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let dir = env_dir("foreign");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let e = prepare_dir(&dir).unwrap_err();
        assert!(
            matches!(e, EndpointError::ForeignDir { owner: 65534, .. }),
            "{e}"
        );
        assert!(e.to_string().contains(crate::ENV_DIR));
        // One of our own, left open to others, is tightened.
        std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs `f` with endpoints started in `dir` (callers hold SERIAL).
    fn with_dir(dir: &Path, f: impl FnOnce()) {
        crate::set_socket_dir(Some(dir.to_owned()));
        f();
        crate::set_socket_dir(None);
    }
}
