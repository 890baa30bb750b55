//! Reading back pcap captures in tests.

/// A unique path in the temp directory, removed on drop.
pub struct TempPath(pub std::path::PathBuf);

impl TempPath {
    /// `erpc-transport-<pid>-<name>.pcap` in the temp directory.
    pub fn new(name: &str) -> TempPath {
        TempPath(
            std::env::temp_dir().join(format!("erpc-transport-{}-{name}.pcap", std::process::id())),
        )
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The frames of a pcap file (Ethernet link type): original length and
/// captured bytes of each.
pub fn read_pcap(path: &std::path::Path) -> Vec<(u32, Vec<u8>)> {
    let file = std::fs::File::open(path).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(file).unwrap();
    assert_eq!(r.header().datalink, pcap_file::DataLink::ETHERNET);
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        out.push((p.orig_len, p.data.into_owned()));
    }
    out
}
