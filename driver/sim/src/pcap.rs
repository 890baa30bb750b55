//! pcap writer (nanosecond-resolution classic pcap, Ethernet link type),
//! one per switch port, stamped with the fabric clock.

use std::fmt;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// Magic of a nanosecond-resolution pcap file.
pub const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;
/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Snapshot length written in the header.
pub const SNAPLEN: u32 = 65535;

/// Writes frames in pcap format to any `Write`.
pub struct PcapWriter {
    out: Box<dyn Write + Send>,
    frames: u64,
}

impl fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PcapWriter({} frames)", self.frames)
    }
}

impl PcapWriter {
    /// Writes the file header.
    pub fn new(mut out: Box<dyn Write + Send>) -> io::Result<PcapWriter> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&PCAP_MAGIC_NS.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, frames: 0 })
    }

    /// Appends one frame captured at `time_ns`.
    pub fn write_frame(&mut self, time_ns: u64, frame: &[u8]) -> io::Result<()> {
        let caplen = frame.len().min(SNAPLEN as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((time_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((time_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(caplen as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&frame[..caplen])?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
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

/// Parses a pcap produced by [`PcapWriter`] into `(time_ns, frame)` pairs
/// (for tests and tools); `None` if it is not one.
pub fn parse(bytes: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let magic = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    if magic != PCAP_MAGIC_NS {
        return None;
    }
    let mut at = 24;
    let mut out = Vec::new();
    while at < bytes.len() {
        let h = bytes.get(at..at + 16)?;
        let sec = u32::from_le_bytes(h[0..4].try_into().ok()?) as u64;
        let ns = u32::from_le_bytes(h[4..8].try_into().ok()?) as u64;
        let caplen = u32::from_le_bytes(h[8..12].try_into().ok()?) as usize;
        let frame = bytes.get(at + 16..at + 16 + caplen)?.to_vec();
        out.push((sec * 1_000_000_000 + ns, frame));
        at += 16 + caplen;
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
        let b = buf.bytes();
        assert_eq!(&b[0..4], &PCAP_MAGIC_NS.to_le_bytes());
        assert_eq!(b.len(), 24 + 16 + 3 + 16 + 60);
        let p = parse(&b).unwrap();
        assert_eq!(p[0], (1_500_000_123, vec![1, 2, 3]));
        assert_eq!(p[1].1.len(), 60);
    }
}
