//! `erpc-bench --pcap`: one pcap file holding what the two nodes said to
//! each other, data packets and session management alike.
//!
//! * Data packets are the fabric's own capture of node 0's switch port
//!   (every frame between the two NICs crosses it once), stamped with the
//!   fabric clock. The fabric writes a complete pcap stream into a
//!   [`FabricSink`], which splices its records into the shared file.
//! * Session-management packets do not cross the fabric: on the device
//!   model they travel through eRPC's in-memory SM hub (on real machines,
//!   kernel UDP between the hosts). [`CapturingSmLink`] wraps the SM link
//!   and writes each packet it sends as the Ethernet/IPv4/UDP frame it
//!   would have been between the two nodes' addresses (node MAC and IPv4,
//!   UDP ports from the URIs), stamped with the same clock, so that
//!   Wireshark shows the connect handshake before the first request.
//!
//! Both writers share one lock and write whole records, so the file stays
//! in time order as long as both run on the benchmark's one thread.
//!
//! On kernel UDP (`--transport udp`) there is no fabric: node 0's UDP
//! transport captures every datagram it sends and receives into a file of
//! its own ([`Capture::transport_file`], `UdpConfig::pcap`: the
//! Ethernet/IPv4/UDP framing each would have had), the SM link is wrapped
//! as above with the system clock the transport stamps with, and
//! [`Capture::finish`] merges the transport files into the capture in time
//! order. SM packets travel as real UDP datagrams between the Nexuses
//! there, but through sockets of their own that no transport sees.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use erpc::sm::{SmLink, SmRouter};
use erpc::wire::SM_PKT_BYTES;
use erpc::{NexusError, Uri};
use mlx5_sim::pcap::PcapWriter;
use pcap_file::PcapError;
use pcap_file::pcap::PcapParser;
use transport::wire::{FrameTemplate, HEADROOM_BYTES, build_headroom};

struct Inner {
    w: PcapWriter,
    data_frames: u64,
    sm_frames: u64,
    error: Option<String>,
    /// Captures of UDP transports, merged in by `finish`.
    transport_files: Vec<PathBuf>,
    /// UDP ports of the captured endpoints (for the dissector's preference).
    ports: BTreeSet<u16>,
}

/// A pcap file shared by the fabric's capture and the SM link.
#[derive(Clone)]
pub struct Capture {
    path: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Capture({})", self.path.display())
    }
}

/// What a capture holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CaptureStats {
    /// Frames from the fabric (data packets).
    pub data_frames: u64,
    /// Session-management packets, framed.
    pub sm_frames: u64,
}

impl Capture {
    /// Creates (truncates) `path` and writes the pcap header.
    pub fn create(path: &Path) -> io::Result<Capture> {
        let f = File::create(path)?;
        let w = PcapWriter::new(Box::new(BufWriter::new(f)))?;
        Ok(Capture {
            path: path.to_owned(),
            inner: Arc::new(Mutex::new(Inner {
                w,
                data_frames: 0,
                sm_frames: 0,
                error: None,
                transport_files: Vec::new(),
                ports: BTreeSet::new(),
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A sink for `Fabric::set_pcap`.
    pub fn fabric_sink(&self) -> FabricSink {
        FabricSink {
            capture: self.clone(),
            buf: Vec::new(),
            parser: None,
        }
    }

    /// Appends one frame; a write error is kept for [`Capture::finish`]
    /// and stops the capture.
    fn write(&self, time_ns: u64, frame: &[u8], sm: bool) {
        let mut g = self.lock();
        if g.error.is_some() {
            return;
        }
        match g.w.write_frame(time_ns, frame) {
            Ok(()) if sm => g.sm_frames += 1,
            Ok(()) => g.data_frames += 1,
            Err(e) => g.error = Some(e.to_string()),
        }
    }

    /// A new file for one UDP transport's own capture (`UdpConfig::pcap`),
    /// next to the capture; [`Capture::finish`] merges it in and removes it.
    pub fn transport_file(&self) -> PathBuf {
        let mut g = self.lock();
        let name = format!(
            ".{}.transport{}.pcap",
            self.path
                .file_name()
                .map_or("capture".into(), |n| n.to_string_lossy()),
            g.transport_files.len()
        );
        let p = self.path.with_file_name(name);
        g.transport_files.push(p.clone());
        p
    }

    /// Records a UDP port eRPC used (see [`Capture::ports`]).
    pub fn note_port(&self, port: u16) {
        self.lock().ports.insert(port);
    }

    /// The UDP ports noted, for the dissector's port preference
    /// (`-o erpc.udp_ports:...`) when they are not its default range.
    pub fn ports(&self) -> Vec<u16> {
        self.lock().ports.iter().copied().collect()
    }

    /// Flushes the file, merging the transport captures in by time;
    /// reports the first write error if there was one.
    pub fn finish(&self) -> io::Result<CaptureStats> {
        let mut g = self.lock();
        if let Some(e) = &g.error {
            return Err(io::Error::other(e.clone()));
        }
        g.w.flush()?;
        if !g.transport_files.is_empty() {
            let files = std::mem::take(&mut g.transport_files);
            let bad = |p: &Path| invalid(format!("{} is not a readable pcap file", p.display()));
            let mut frames = mlx5_sim::pcap::parse(&std::fs::read(&self.path)?)
                .ok_or_else(|| bad(&self.path))?;
            for f in &files {
                let more = match std::fs::read(f) {
                    Ok(b) => mlx5_sim::pcap::parse(&b).ok_or_else(|| bad(f))?,
                    // A transport that never started leaves no file.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(e),
                };
                g.data_frames += more.len() as u64;
                frames.extend(more);
            }
            // Stable: frames with the same time keep their order.
            frames.sort_by_key(|(t, _)| *t);
            let mut w = PcapWriter::new(Box::new(BufWriter::new(File::create(&self.path)?)))?;
            for (t, f) in &frames {
                w.write_frame(*t, f)?;
            }
            w.flush()?;
            for f in &files {
                let _ = std::fs::remove_file(f);
            }
        }
        Ok(CaptureStats {
            data_frames: g.data_frames,
            sm_frames: g.sm_frames,
        })
    }
}

/// Takes the pcap stream a fabric port writes (file header, then records)
/// and appends its records, whole, to the shared capture.
pub struct FabricSink {
    capture: Capture,
    buf: Vec<u8>,
    parser: Option<PcapParser>,
}

impl fmt::Debug for FabricSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FabricSink({:?}, {} bytes pending)",
            self.capture,
            self.buf.len()
        )
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Write for FabricSink {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        if self.parser.is_none() {
            match PcapParser::new(&self.buf) {
                Ok((rest, parser)) => {
                    let h = parser.header();
                    if h != mlx5_sim::pcap::header() {
                        return Err(invalid(format!(
                            "the fabric wrote an unexpected pcap header {h:?}"
                        )));
                    }
                    at = self.buf.len() - rest.len();
                    self.parser = Some(parser);
                }
                Err(PcapError::IncompleteBuffer) => return Ok(bytes.len()),
                Err(e) => return Err(invalid(e.to_string())),
            }
        }
        let parser = self.parser.as_ref().expect("set above");
        loop {
            match parser.next_raw_packet(&self.buf[at..]) {
                Ok((rest, p)) => {
                    let ns = u64::from(p.ts_sec) * 1_000_000_000 + u64::from(p.ts_frac);
                    self.capture.write(ns, &p.data, false);
                    at = self.buf.len() - rest.len();
                }
                Err(PcapError::IncompleteBuffer) => break,
                Err(e) => return Err(invalid(e.to_string())),
            }
        }
        self.buf.drain(..at);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a node's SM packets appear to come from in the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAddr {
    /// The node's MAC.
    pub mac: [u8; 6],
    /// The node's IPv4 address.
    pub ipv4: Ipv4Addr,
}

/// An SM link that writes every packet it sends into a [`Capture`] and
/// then hands it to the link it wraps.
pub struct CapturingSmLink {
    inner: Arc<dyn SmLink>,
    capture: Capture,
    nodes: HashMap<String, NodeAddr>,
    now_ns: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl fmt::Debug for CapturingSmLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CapturingSmLink({:?} into {:?})",
            self.inner, self.capture
        )
    }
}

impl CapturingSmLink {
    /// Wraps `inner`; `nodes` maps URI hosts to addresses, `now_ns` stamps
    /// the packets (the clock the fabric's capture uses).
    pub fn new(
        inner: Arc<dyn SmLink>,
        capture: Capture,
        nodes: HashMap<String, NodeAddr>,
        now_ns: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> CapturingSmLink {
        CapturingSmLink {
            inner,
            capture,
            nodes,
            now_ns: Box::new(now_ns),
        }
    }

    /// The frame `pkt` would have been from `from` to `to`.
    pub fn frame(&self, from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) -> Vec<u8> {
        let unknown = NodeAddr {
            mac: [0; 6],
            ipv4: Ipv4Addr::UNSPECIFIED,
        };
        let src = self.nodes.get(&from.host).copied().unwrap_or(unknown);
        let dst = self.nodes.get(&to.host).copied().unwrap_or(unknown);
        let t = FrameTemplate {
            dst_mac: dst.mac,
            src_mac: src.mac,
            src_ip: src.ipv4,
            dst_ip: dst.ipv4,
            src_port: from.port,
            dst_port: to.port,
        };
        let mut frame = vec![0u8; HEADROOM_BYTES + SM_PKT_BYTES];
        let len = frame.len();
        build_headroom(&t, &mut frame, len);
        frame[HEADROOM_BYTES..].copy_from_slice(pkt);
        frame
    }
}

impl SmLink for CapturingSmLink {
    fn start(&self, local: &Uri, router: Arc<SmRouter>) -> Result<(), NexusError> {
        self.inner.start(local, router)
    }

    fn send(&self, from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let frame = self.frame(from, to, pkt);
        self.capture.write((self.now_ns)(), &frame, true);
        self.inner.send(from, to, pkt);
    }

    fn stop(&self, local: &Uri) {
        self.inner.stop(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_records_are_spliced_whole_whatever_the_write_sizes() {
        let dir = std::env::temp_dir().join(format!("erpc-capture-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("splice.pcap");
        let cap = Capture::create(&path).unwrap();
        // What a fabric port writes, fed one byte at a time, with an SM
        // frame written between two of its records.
        let stream = mlx5_sim::PcapBuffer::new();
        let mut w = PcapWriter::new(Box::new(stream.clone())).unwrap();
        w.write_frame(10, &[1; 60]).unwrap();
        let first = stream.bytes();
        w.write_frame(30, &[2; 70]).unwrap();
        let all = stream.bytes();
        let mut sink = cap.fabric_sink();
        for b in &first {
            sink.write_all(std::slice::from_ref(b)).unwrap();
        }
        cap.write(20, &[3; 80], true);
        for b in &all[first.len()..] {
            sink.write_all(std::slice::from_ref(b)).unwrap();
        }
        let stats = cap.finish().unwrap();
        assert_eq!(
            stats,
            CaptureStats {
                data_frames: 2,
                sm_frames: 1
            }
        );
        let frames = mlx5_sim::pcap::parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            frames,
            vec![(10, vec![1; 60]), (20, vec![3; 80]), (30, vec![2; 70])]
        );
        // A stream that is not what the fabric writes is refused.
        let mut bad = cap.fabric_sink();
        assert!(bad.write_all(&[0xff; 40]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn transport_captures_are_merged_in_time_order_and_removed() {
        let dir = std::env::temp_dir().join(format!("erpc-capture-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("udp.pcap");
        let cap = Capture::create(&path).unwrap();
        let (t0, t1) = (cap.transport_file(), cap.transport_file());
        assert_ne!(t0, t1);
        for (file, frames) in [(&t0, vec![(10, 1u8), (40, 4)]), (&t1, vec![(25, 2)])] {
            let mut w = PcapWriter::new(Box::new(File::create(file).unwrap())).unwrap();
            for (t, b) in frames {
                w.write_frame(t, &[b; 60]).unwrap();
            }
            w.flush().unwrap();
        }
        cap.write(30, &[3; 80], true);
        cap.note_port(40000);
        cap.note_port(31850);
        assert_eq!(cap.ports(), vec![31850, 40000]);
        let stats = cap.finish().unwrap();
        assert_eq!(
            stats,
            CaptureStats {
                data_frames: 3,
                sm_frames: 1
            }
        );
        let frames = mlx5_sim::pcap::parse(&std::fs::read(&path).unwrap()).unwrap();
        let times: Vec<u64> = frames.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, vec![10, 25, 30, 40]);
        assert_eq!(frames[2].1, vec![3; 80]);
        assert!(!t0.exists() && !t1.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
