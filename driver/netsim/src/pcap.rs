//! pcap capture (nanosecond-resolution classic pcap, Ethernet link type),
//! one writer per port, stamped with network time. The format itself is
//! the `pcap-file` crate's; this module adapts it to the network (a
//! type-erased sink that can still be flushed, a frame counter) and gives
//! tests an in-memory sink and a parser.

use std::fmt;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

/// Magic of a nanosecond-resolution pcap file (as written, little-endian).
pub const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;
/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Snapshot length written in the header.
pub const SNAPLEN: u32 = 65535;

/// The file header every capture of the network starts with.
pub fn header() -> PcapHeader {
    PcapHeader {
        version_major: 2,
        version_minor: 4,
        ts_correction: 0,
        ts_accuracy: 0,
        snaplen: SNAPLEN,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::Little,
    }
}

fn io_error(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// The writer `pcap-file` writes into: the sink behind a lock that
/// [`PcapWriter::flush`] can reach too (`pcap-file`'s writer does not hand
/// its sink out while it is in use).
struct SharedSink(Arc<Mutex<Box<dyn Write + Send>>>);

impl SharedSink {
    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn Write + Send>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Write for SharedSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.lock().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}

/// Writes frames in pcap format to any `Write`.
pub struct PcapWriter {
    w: pcap_file::pcap::PcapWriter<SharedSink>,
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    frames: u64,
}

impl fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PcapWriter({} frames)", self.frames)
    }
}

impl PcapWriter {
    /// Writes the file header.
    pub fn new(out: Box<dyn Write + Send>) -> io::Result<PcapWriter> {
        let out = Arc::new(Mutex::new(out));
        let w = pcap_file::pcap::PcapWriter::with_header(SharedSink(out.clone()), header())
            .map_err(io_error)?;
        Ok(PcapWriter { w, out, frames: 0 })
    }

    /// Appends one frame captured at `time_ns` (truncated to the snapshot
    /// length, with its original length recorded).
    pub fn write_frame(&mut self, time_ns: u64, frame: &[u8]) -> io::Result<()> {
        let caplen = frame.len().min(SNAPLEN as usize);
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let packet = PcapPacket::new(Duration::from_nanos(time_ns), orig_len, &frame[..caplen]);
        self.w.write_packet(&packet).map_err(io_error)?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        SharedSink(self.out.clone()).flush()
    }
}

/// An in-memory pcap sink that can be read back while it is in use.
#[derive(Debug, Clone, Default)]
pub struct PcapBuffer {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl PcapBuffer {
    /// An empty buffer.
    pub fn new() -> PcapBuffer {
        PcapBuffer::default()
    }

    /// Everything written so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Write for PcapBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Parses a classic pcap file (any byte order and timestamp resolution)
/// into `(time_ns, frame)` pairs, for tests and tools; `None` if it is not
/// one or a record is cut short. Records are read raw: `pcap-file`'s
/// checked reader refuses a frame whose original length exceeds the
/// snapshot length, which is exactly what a truncated capture holds.
pub fn parse(bytes: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let mut reader = PcapReader::new(bytes).ok()?;
    let frac_ns = match reader.header().ts_resolution {
        TsResolution::NanoSecond => 1,
        TsResolution::MicroSecond => 1000,
    };
    let mut out = Vec::new();
    while let Some(p) = reader.next_raw_packet() {
        let p = p.ok()?;
        let ns = u64::from(p.ts_sec) * 1_000_000_000 + u64::from(p.ts_frac) * frac_ns;
        out.push((ns, p.data.into_owned()));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_parses() {
        let buf = PcapBuffer::new();
        let mut w = PcapWriter::new(Box::new(buf.clone())).unwrap();
        w.write_frame(1_500_000_123, &[1, 2, 3]).unwrap();
        w.write_frame(2, &[9; 60]).unwrap();
        assert_eq!(w.frames(), 2);
        let b = buf.bytes();
        // The classic layout: magic, version 2.4, snaplen, LINKTYPE_ETHERNET,
        // then 16-byte record headers (sec, nsec, caplen, len).
        assert_eq!(&b[0..4], &PCAP_MAGIC_NS.to_le_bytes());
        assert_eq!(&b[4..8], &[2, 0, 4, 0]);
        assert_eq!(&b[16..20], &SNAPLEN.to_le_bytes());
        assert_eq!(&b[20..24], &LINKTYPE_ETHERNET.to_le_bytes());
        assert_eq!(b.len(), 24 + 16 + 3 + 16 + 60);
        assert_eq!(&b[24..28], &1u32.to_le_bytes());
        assert_eq!(&b[28..32], &500_000_123u32.to_le_bytes());
        assert_eq!(&b[32..36], &3u32.to_le_bytes());
        let p = parse(&b).unwrap();
        assert_eq!(p[0], (1_500_000_123, vec![1, 2, 3]));
        assert_eq!(p[1], (2, vec![9; 60]));
    }

    #[test]
    fn oversize_frames_are_truncated_to_the_snapshot_length() {
        let buf = PcapBuffer::new();
        let mut w = PcapWriter::new(Box::new(buf.clone())).unwrap();
        let big = vec![7u8; SNAPLEN as usize + 10];
        w.write_frame(5, &big).unwrap();
        let b = buf.bytes();
        assert_eq!(&b[32..36], &SNAPLEN.to_le_bytes(), "caplen");
        assert_eq!(&b[36..40], &(SNAPLEN + 10).to_le_bytes(), "original length");
        let p = parse(&b).unwrap();
        assert_eq!(p[0].1.len(), SNAPLEN as usize);
    }

    #[test]
    fn truncated_files_do_not_parse() {
        let buf = PcapBuffer::new();
        let mut w = PcapWriter::new(Box::new(buf.clone())).unwrap();
        w.write_frame(1, &[1; 20]).unwrap();
        let b = buf.bytes();
        assert!(parse(&b[..b.len() - 1]).is_none());
        assert!(parse(&b[..10]).is_none());
        assert!(parse(b"not a pcap file at all, no").is_none());
    }
}
