//! The debug endpoint that `erpc-inspect` attaches to.
//!
//! A process that enables it (an eRPC `Nexus` built with
//! `NexusBuilder::inspect(true)`, an mlx5 `Device` opened with
//! `DeviceConfig { inspect: true, .. }`, or either of them with
//! `ERPC_INSPECT=1` in the environment) listens on one Unix socket,
//! `<dir>/<pid>.sock`, where `<dir>` is [`socket_dir`]:
//! `$ERPC_INSPECT_DIR`, else `$XDG_RUNTIME_DIR/erpc`, else `/run/erpc` for
//! root and `/tmp/erpc-UID` for another user ([`default_dir`]).
//! The directory is made owner-only (0700), the socket 0600, and a
//! connection from a process of another user is refused after
//! `SO_PEERCRED` names its uid (see [`server`]).
//!
//! # The datapath is never blocked, and barely touched
//!
//! Datapath objects (an `Rpc`, a driver `QueueSet`) belong to one thread and
//! are not `Sync`; nothing outside that thread may read them. Each one owns
//! a [`Publisher`]; the endpoint's socket thread owns nothing of theirs and
//! serves what they last published.
//!
//! * When nobody is attached, the datapath's whole cost is
//!   [`Publisher::wanted`]: one relaxed load of a process-wide request
//!   generation (on its own cache line, written only when a client asks)
//!   compared with a field of the publisher.
//! * A client's request bumps the generation (at most once per
//!   [`MIN_REQUEST_INTERVAL`], so no client can make the datapath publish
//!   faster than that). Each datapath thread notices at its next check,
//!   builds its snapshot (a copy of its counters and state) and stores it
//!   with a `try_lock` it never waits for; if the socket thread happens to
//!   hold that lock (for the few nanoseconds of cloning an `Arc`), the
//!   thread tries again at its next check.
//! * The socket thread waits (up to the client's timeout) until every
//!   publisher has answered that generation, then serializes the snapshots
//!   and whatever its sources read themselves (an mlx5 device's firmware
//!   view through QUERY_* commands, which the datapath never waits for).
//!   A publisher that did not answer in time is served as it last
//!   published, marked stale with its age.
//!
//! # Protocol
//!
//! One JSON object per line each way ([`Request`]): `{"cmd":"hello"}`
//! answers who the process is and what it exposes;
//! `{"cmd":"snapshot","rings":false,"timeout_ms":500}` answers one
//! snapshot of every source, grouped by kind (`"devices"`, `"nexuses"`),
//! after the common keys documented on [`server`]. Errors come back as
//! `{"error":"..."}`. A connection may carry any number of requests.
//!
//! # Where this code lives, and why
//!
//! Both the mlx5 driver (a bare `Device` can expose the endpoint) and eRPC
//! (a `Nexus`) use it, and the driver sits below the transports, which sit
//! below eRPC. A module of the driver would make eRPC on kernel UDP depend
//! on a NIC driver for a Unix socket server; a module of eRPC could not be
//! used by the driver at all. So it is a crate of its own, with no
//! dependency on any other crate of the workspace, below both: generic
//! publication and serving here, what to publish in each user (`mlx5`'s
//! `inspect` module, `erpc`'s `inspect` module), and the client,
//! `erpc-inspect`, in `tools`.

#![forbid(unsafe_code)]

pub mod client;
mod publish;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub use publish::{Latest, Pending, PublishInfo, Publisher, Slot};
pub use server::{
    EndpointError, Query, Registration, Request, Source, prepare_socket_dir, register,
    remove_socket_on_termination,
};

/// Version of the wire protocol and of the snapshot's common keys.
pub const PROTOCOL: u32 = 1;

/// Environment variable that turns the endpoint on for every Nexus and
/// Device of a process (`1`, `true`, `yes` or `on`).
pub const ENV_ENABLE: &str = "ERPC_INSPECT";

/// Environment variable naming the socket directory (overrides
/// `$XDG_RUNTIME_DIR/erpc` and [`default_dir`]).
pub const ENV_DIR: &str = "ERPC_INSPECT_DIR";

/// The shortest time between two snapshot requests reaching the datapath:
/// publishers build at most this many snapshots per second, however many
/// clients ask how often.
pub const MIN_REQUEST_INTERVAL: Duration = Duration::from_millis(20);

/// How long the socket thread waits for publishers by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest wait a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);

/// True if [`ENV_ENABLE`] asks for the endpoint.
pub fn env_enabled() -> bool {
    std::env::var(ENV_ENABLE).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

static DIR_OVERRIDE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Makes endpoints started from now on put their socket in `dir` (`None`:
/// back to [`socket_dir`]'s environment rules). For programs that choose
/// the directory themselves, and for tests.
pub fn set_socket_dir(dir: Option<PathBuf>) {
    *DIR_OVERRIDE.lock().unwrap_or_else(|p| p.into_inner()) = dir;
}

/// The directory holding the sockets: the one given to
/// [`set_socket_dir`], else [`ENV_DIR`] if set, else
/// `$XDG_RUNTIME_DIR/erpc` (an absolute `XDG_RUNTIME_DIR` only, as the
/// XDG specification requires), else `/run/erpc`.
pub fn socket_dir() -> PathBuf {
    if let Some(d) = DIR_OVERRIDE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    {
        return d;
    }
    if let Some(d) = std::env::var_os(ENV_DIR).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_absolute()) {
        return Path::new(&x).join("erpc");
    }
    default_dir(server::euid())
}

/// The directory when neither the program nor the environment names one:
/// `/run/erpc` for root; for another user, who cannot create that,
/// `/tmp/erpc-UID` (made owner-only, and refused if someone else owns it).
pub fn default_dir(euid: u32) -> PathBuf {
    if euid == 0 {
        PathBuf::from("/run/erpc")
    } else {
        PathBuf::from(format!("/tmp/erpc-{euid}"))
    }
}

/// The socket of process `pid` in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The pid a socket file name stands for (`1234.sock` → 1234).
pub fn pid_of_socket(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let pid = name.strip_suffix(".sock")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Lowercase hex of `bytes` (descriptor dumps in snapshots).
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from_digit(u32::from(b >> 4), 16).expect("nibble"));
        s.push(char::from_digit(u32::from(b & 15), 16).expect("nibble"));
    }
    s
}

/// The bytes of a [`hex`] string, or `None` if it is not one.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes()
        .chunks(2)
        .map(|p| {
            let d = |c: u8| char::from(c).to_digit(16);
            Some((d(p[0])? << 4 | d(p[1])?) as u8)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_round_trip() {
        assert_eq!(default_dir(0), Path::new("/run/erpc"));
        assert_eq!(default_dir(1000), Path::new("/tmp/erpc-1000"));
        let p = socket_path(Path::new("/run/erpc"), 4242);
        assert_eq!(p, Path::new("/run/erpc/4242.sock"));
        assert_eq!(pid_of_socket(&p), Some(4242));
        for bad in [
            "x.sock",
            ".sock",
            "12.sock.tmp",
            "-1.sock",
            "12a.sock",
            "99999999999.sock",
        ] {
            assert_eq!(pid_of_socket(Path::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("0001abff").unwrap(), b);
        assert_eq!(unhex("0001ABFF").unwrap(), b);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
