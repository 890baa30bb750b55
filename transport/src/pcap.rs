//! Transport-level packet capture: every frame a transport sends or
//! receives, written to a pcap file (Ethernet link type, nanosecond
//! timestamps from the system clock) with the `pcap-file` crate.
//!
//! Off by default (`pcap: None` in `UdpConfig` / `Mlx5Config`). When off,
//! the datapath pays one predictable branch per burst (per datagram in the
//! UDP transport's receive classification) and nothing else.
//!
//! When on, each burst reads the clock once, and each frame is copied into
//! a preallocated 1 KiB scratch buffer (to make it contiguous) and then
//! into a 1 MiB `BufWriter`, which writes to the file when full: a memcpy
//! of the frame twice plus a 16-byte record header per packet, and one
//! `write` syscall per MiB. The capture belongs to the transport's thread,
//! so no lock is taken. Expect it to cost far more than the packet itself
//! at high rates; it is a debugging aid.
//!
//! What the file holds:
//! * mlx5: the frames exactly as they left host memory (headers from
//!   `fill_headroom`, data gathered), and received frames as the NIC wrote
//!   them, cut to their IPv4 length (a frame rejected before its length was
//!   known is written as the whole 1 KiB stride).
//! * UDP: the Ethernet/IPv4/UDP framing the datagram would have had on the
//!   wire, built with [`crate::wire::build_headroom`]: our advertised MAC
//!   and address, the route's MAC, address and source port for TX; for RX
//!   the sender's address and port (from `recvmmsg`), a zero sender MAC
//!   (the kernel does not say) and our advertised MAC and address.
//!
//! A write error (disk full, ...) stops the capture with an error in the
//! log; the transport carries on.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{MTU, TransportError};

/// `BufWriter` capacity of a capture.
const BUF_BYTES: usize = 1 << 20;

/// Largest frame a capture record holds (longer input is cut, with the
/// original length recorded).
pub const SNAPLEN: usize = 2 * MTU;

/// The buffered file under a [`PcapWriter`], shared so that the capture can
/// flush it (the writer does not lend its inner writer out).
#[derive(Clone)]
struct SharedFile(Rc<RefCell<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.borrow_mut().write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// An open capture file.
pub(crate) struct Capture {
    writer: Option<PcapWriter<SharedFile>>,
    file: SharedFile,
    path: PathBuf,
    scratch: Box<[u8]>,
    frames: u64,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Capture({}, {} frames{})",
            self.path.display(),
            self.frames,
            if self.writer.is_some() {
                ""
            } else {
                ", stopped"
            }
        )
    }
}

impl Capture {
    /// Creates (or truncates) `path` and writes the pcap file header.
    pub(crate) fn create(path: &Path) -> Result<Capture, TransportError> {
        let fail = |what: &str, source: io::Error| TransportError::Io {
            what: format!("{what} pcap capture {}", path.display()),
            source,
        };
        let file = File::create(path).map_err(|e| fail("cannot create", e))?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN as u32,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
        };
        let shared = SharedFile(Rc::new(RefCell::new(BufWriter::with_capacity(
            BUF_BYTES, file,
        ))));
        let writer = PcapWriter::with_header(shared.clone(), header)
            .map_err(|e| fail("cannot write the header of", io::Error::other(e)))?;
        Ok(Capture {
            writer: Some(writer),
            file: shared,
            path: path.to_owned(),
            scratch: vec![0; SNAPLEN].into_boxed_slice(),
            frames: 0,
        })
    }

    /// The time stamp for the frames of one burst.
    #[inline]
    pub(crate) fn now() -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }

    /// Frames written so far.
    pub(crate) fn frames(&self) -> u64 {
        self.frames
    }

    /// The scratch buffer a frame is assembled in before [`Capture::commit`].
    pub(crate) fn scratch(&mut self) -> &mut [u8] {
        &mut self.scratch
    }

    /// Writes the concatenation of `parts` as one frame.
    pub(crate) fn write_parts(&mut self, ts: Duration, parts: &[&[u8]]) {
        let mut captured = 0;
        let mut len = 0;
        for p in parts {
            let n = p.len().min(SNAPLEN - captured);
            self.scratch[captured..captured + n].copy_from_slice(&p[..n]);
            captured += n;
            len += p.len();
        }
        self.commit(ts, captured, len);
    }

    /// Writes the first `captured` bytes of the scratch buffer as one frame
    /// that was `orig_len` bytes long on the wire.
    pub(crate) fn commit(&mut self, ts: Duration, captured: usize, orig_len: usize) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let data = &self.scratch[..captured.min(SNAPLEN)];
        let orig_len = u32::try_from(orig_len).unwrap_or(u32::MAX);
        let pkt = PcapPacket::new(ts, orig_len, data);
        match w.write_packet(&pkt) {
            Ok(_) => self.frames += 1,
            Err(e) => {
                tracing::error!(
                    path = %self.path.display(),
                    error = %e,
                    frames = self.frames,
                    "pcap capture failed; capture stopped"
                );
                self.writer = None;
            }
        }
    }

    /// Pushes buffered frames to the file.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self.writer.as_mut() {
            Some(_) => self.file.flush(),
            None => Err(io::Error::other(format!(
                "pcap capture {} stopped after an earlier write error",
                self.path.display()
            ))),
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.writer.is_some()
            && let Err(e) = self.file.flush()
        {
            tracing::error!(path = %self.path.display(), error = %e, "pcap capture: final flush failed");
        }
    }
}
