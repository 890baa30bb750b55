//! The client side (used by `erpc-inspect`): find endpoints, connect,
//! ask.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::server::Request;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting or talking failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The endpoint answered with an error (e.g. a refusal).
    #[error("{path}: {message}")]
    Refused {
        /// The socket.
        path: PathBuf,
        /// The endpoint's message.
        message: String,
    },
    /// The answer is not JSON.
    #[error("{path}: malformed answer: {why}")]
    Malformed {
        /// The socket.
        path: PathBuf,
        /// The parse error.
        why: String,
    },
    /// The endpoint closed the connection.
    #[error("{path}: the process closed the connection (it may have exited)")]
    Closed {
        /// The socket.
        path: PathBuf,
    },
}

/// A connection to one process's endpoint.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let s = UnixStream::connect(path).map_err(|source| ClientError::Io {
            what: "cannot connect to",
            path: path.to_owned(),
            source,
        })?;
        Ok(Client {
            path: path.to_owned(),
            reader: BufReader::new(s),
        })
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request line as is and reads the answer (errors included,
    /// as JSON).
    pub fn raw(&mut self, line: &str) -> Result<Value, ClientError> {
        let io = |what| {
            let path = self.path.clone();
            move |source| ClientError::Io { what, path, source }
        };
        let mut s = self.reader.get_ref();
        let sent = s
            .write_all(line.as_bytes())
            .and_then(|()| s.write_all(b"\n"));
        let mut answer = String::new();
        let read = self.reader.read_line(&mut answer);
        // An endpoint that refuses the connection answers before it reads
        // (and closes): its answer counts even if sending failed.
        let n = match (sent, read) {
            (_, Ok(n)) if n > 0 => n,
            (Err(e), _) => return Err(io("cannot send to")(e)),
            (Ok(()), r) => r.map_err(io("cannot read from"))?,
        };
        if n == 0 {
            return Err(ClientError::Closed {
                path: self.path.clone(),
            });
        }
        serde_json::from_str(&answer).map_err(|e| ClientError::Malformed {
            path: self.path.clone(),
            why: e.to_string(),
        })
    }

    fn ask(&mut self, req: &Request) -> Result<Value, ClientError> {
        let line = serde_json::to_string(req).expect("requests serialize");
        let v = self.raw(&line)?;
        if let Some(msg) = v.get("error") {
            return Err(ClientError::Refused {
                path: self.path.clone(),
                message: msg.as_str().map_or_else(|| msg.to_string(), str::to_string),
            });
        }
        Ok(v)
    }

    /// Who the process is and what it exposes.
    pub fn hello(&mut self) -> Result<Value, ClientError> {
        self.ask(&Request::Hello)
    }

    /// One snapshot; `rings` also copies whole descriptor rings; the
    /// endpoint waits up to `timeout` for the datapath threads.
    pub fn snapshot(&mut self, rings: bool, timeout: Duration) -> Result<Value, ClientError> {
        self.ask(&Request::Snapshot {
            rings,
            timeout_ms: Some(timeout.as_millis() as u64),
        })
    }
}

/// A socket found in the endpoint directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The process id its name says.
    pub pid: u32,
    /// The socket.
    pub path: PathBuf,
    /// Its owner.
    pub uid: u32,
    /// True if `/proc/<pid>` exists (the process may still be another
    /// one that reused the pid).
    pub alive: bool,
}

/// The sockets in `dir`, by pid (an absent directory holds none).
pub fn find(dir: &Path) -> io::Result<Vec<Found>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e?;
        let path = e.path();
        let Some(pid) = crate::pid_of_socket(&path) else {
            continue;
        };
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        out.push(Found {
            pid,
            uid: md.uid(),
            alive: Path::new(&format!("/proc/{pid}")).exists(),
            path,
        });
    }
    out.sort_by_key(|f| f.pid);
    Ok(out)
}

/// A request line for a snapshot, for tools that speak the protocol
/// themselves.
pub fn snapshot_request(rings: bool, timeout: Duration) -> String {
    json!({ "cmd": "snapshot", "rings": rings, "timeout_ms": timeout.as_millis() as u64 })
        .to_string()
}
