//! Ethernet/IPv4/UDP framing and the routing info of session management,
//! exactly as the C++ eRPC puts them on the wire.
//!
//! `build_headroom` writes the 42 bytes in front of an eRPC header;
//! `parse_frame` validates a received frame without ever reading past its
//! end, and says why it rejects one.

use std::fmt;
use std::net::Ipv4Addr;

/// Largest frame eRPC sends, all headers included.
pub const MTU: usize = 1024;
/// Ethernet header bytes.
pub const ETH_HDR_BYTES: usize = 14;
/// IPv4 header bytes (no options).
pub const IPV4_HDR_BYTES: usize = 20;
/// UDP header bytes.
pub const UDP_HDR_BYTES: usize = 8;
/// Bytes in front of the eRPC header.
pub const HEADROOM_BYTES: usize = ETH_HDR_BYTES + IPV4_HDR_BYTES + UDP_HDR_BYTES;
/// The eRPC packet header.
pub const ERPC_HDR_BYTES: usize = 14;
/// A packet header slot in a message buffer: headroom + eRPC header.
pub const PKTHDR_BYTES: usize = HEADROOM_BYTES + ERPC_HDR_BYTES;
/// Data bytes per packet.
pub const MAX_DATA_PER_PKT: usize = MTU - PKTHDR_BYTES;
/// Bytes of routing info in an SM endpoint.
pub const ROUTING_INFO_BYTES: usize = 48;

const _: () = assert!(HEADROOM_BYTES == 42 && PKTHDR_BYTES == 56 && MAX_DATA_PER_PKT == 968);

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IPv4 TOS eRPC sends.
pub const IPV4_TOS: u8 = 0x01;
/// IPv4 TTL eRPC sends.
pub const IPV4_TTL: u8 = 128;

/// Ethernet routing info (the first 20 of 48 bytes; the rest zero): MAC at
/// 0, IPv4 (host order, little-endian on x86) at 8, UDP port at 12, RX queue
/// id at 14, RSS indirection-table size at 16.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoutingInfo {
    /// MAC address of the interface that carries `ipv4` (zero on
    /// loopback, which has none).
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ipv4: Ipv4Addr,
    /// UDP port of the Rpc's RX queue.
    pub udp_port: u16,
    /// RX queue id: the queue a sender's RSS must pick (see [`crate::rss`]).
    /// 0 for a receiver that steers by exact UDP port.
    pub rxq_id: u16,
    /// RSS indirection table size: 1 for a receiver that steers by exact
    /// UDP port (ours), 0 from a C++ raw transport (same meaning), more
    /// for a C++ DPDK receiver.
    pub rss_table_size: u16,
}

impl Default for RoutingInfo {
    fn default() -> Self {
        RoutingInfo {
            mac: [0; 6],
            ipv4: Ipv4Addr::UNSPECIFIED,
            udp_port: 0,
            rxq_id: 0,
            rss_table_size: 0,
        }
    }
}

impl RoutingInfo {
    /// The 48-byte wire form (little-endian, as the C++ code on x86 lays it out).
    pub fn to_bytes(&self) -> [u8; ROUTING_INFO_BYTES] {
        let mut b = [0u8; ROUTING_INFO_BYTES];
        b[0..6].copy_from_slice(&self.mac);
        b[8..12].copy_from_slice(&u32::from(self.ipv4).to_le_bytes());
        b[12..14].copy_from_slice(&self.udp_port.to_le_bytes());
        b[14..16].copy_from_slice(&self.rxq_id.to_le_bytes());
        b[16..18].copy_from_slice(&self.rss_table_size.to_le_bytes());
        b
    }

    /// Parses the wire form. Bytes past the 20 used ones are ignored.
    pub fn from_bytes(b: &[u8; ROUTING_INFO_BYTES]) -> RoutingInfo {
        let u16le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        RoutingInfo {
            mac: [b[0], b[1], b[2], b[3], b[4], b[5]],
            ipv4: Ipv4Addr::from(u32::from_le_bytes([b[8], b[9], b[10], b[11]])),
            udp_port: u16le(12),
            rxq_id: u16le(14),
            rss_table_size: u16le(16),
        }
    }
}

impl fmt::Display for RoutingInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mac;
        write!(
            f,
            "[MAC {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, IP {}, UDP port {}, RX queue {}, \
             RSS table {}]",
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m[5],
            self.ipv4,
            self.udp_port,
            self.rxq_id,
            self.rss_table_size
        )
    }
}

impl fmt::Debug for RoutingInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The fixed parts of a frame between two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTemplate {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Source IPv4.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4.
    pub dst_ip: Ipv4Addr,
    /// Source UDP port.
    pub src_port: u16,
    /// Destination UDP port.
    pub dst_port: u16,
}

/// RFC 1071 checksum of a header: the one's complement of the one's
/// complement sum of its big-endian 16-bit words (an odd last byte padded
/// with zero). 0 for a header whose checksum field is right.
#[inline]
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    if let Some(h) = hdr.first_chunk::<IPV4_HDR_BYTES>()
        && hdr.len() == IPV4_HDR_BYTES
    {
        return ipv4_checksum_20(h);
    }
    let mut sum: u32 = 0;
    for pair in hdr.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// [`ipv4_checksum`] of an option-less IPv4 header: five 32-bit words
/// summed and folded (2^16 = 1 in one's complement arithmetic, so summing
/// 32-bit words folds to the same 16-bit sum as summing 16-bit words).
#[inline(always)]
fn ipv4_checksum_20(h: &[u8; IPV4_HDR_BYTES]) -> u16 {
    let w = |i: usize| u64::from(u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let mut sum = w(0) + w(4) + w(8) + w(12) + w(16); // < 2^35
    sum = (sum & 0xffff) + (sum >> 16); // < 2^19 + 2^16
    sum = (sum & 0xffff) + (sum >> 16); // <= 0x10007
    sum = (sum & 0xffff) + (sum >> 16); // <= 0xffff
    !(sum as u16)
}

/// Writes Ethernet + IPv4 + UDP headers for a frame of `frame_len` bytes
/// into `out[..42]`: IPv4 TOS 1, ID 0, no fragmentation, TTL 128, header
/// checksum computed; UDP checksum 0.
pub fn build_headroom(t: &FrameTemplate, out: &mut [u8], frame_len: usize) {
    let out = &mut out[..HEADROOM_BYTES];
    out[0..6].copy_from_slice(&t.dst_mac);
    out[6..12].copy_from_slice(&t.src_mac);
    out[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip_len = (frame_len - ETH_HDR_BYTES) as u16;
    let ip = &mut out[ETH_HDR_BYTES..ETH_HDR_BYTES + IPV4_HDR_BYTES];
    ip[0] = 0x45;
    ip[1] = IPV4_TOS;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..8].fill(0); // id 0, flags 0, fragment offset 0
    ip[8] = IPV4_TTL;
    ip[9] = IPPROTO_UDP;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&t.src_ip.octets());
    ip[16..20].copy_from_slice(&t.dst_ip.octets());
    let csum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let udp = &mut out[ETH_HDR_BYTES + IPV4_HDR_BYTES..];
    udp[0..2].copy_from_slice(&t.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&t.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - IPV4_HDR_BYTES as u16).to_be_bytes());
    udp[6..8].fill(0);
}

/// The headroom of every frame to one peer, built once when the route is
/// resolved: only the IPv4 total length, the UDP length and the IPv4
/// checksum depend on the frame, and the checksum is finished from a
/// precomputed partial sum (RFC 1624's incremental form) instead of summing
/// the header again per packet. Writes exactly what [`build_headroom`]
/// writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    bytes: [u8; HEADROOM_BYTES],
    /// One's-complement sum of the IPv4 header with length and checksum 0.
    ip_sum: u32,
}

impl Headroom {
    /// The fixed part of the frames described by `t`.
    pub fn new(t: &FrameTemplate) -> Headroom {
        let mut bytes = [0u8; HEADROOM_BYTES];
        build_headroom(t, &mut bytes, HEADROOM_BYTES);
        let ip = &mut bytes[ETH_HDR_BYTES..ETH_HDR_BYTES + IPV4_HDR_BYTES];
        ip[2..4].fill(0);
        ip[10..12].fill(0);
        let ip_sum = ip
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        Headroom { bytes, ip_sum }
    }

    /// Writes the headers of a frame of `frame_len` bytes into
    /// `out[..42]`. `frame_len` is at least [`HEADROOM_BYTES`] and fits
    /// the IPv4 length field.
    #[inline]
    pub fn write(&self, out: &mut [u8], frame_len: usize) {
        debug_assert!((HEADROOM_BYTES..=usize::from(u16::MAX)).contains(&frame_len));
        let out: &mut [u8; HEADROOM_BYTES] =
            out.first_chunk_mut().expect("the headroom is 42 bytes");
        *out = self.bytes;
        let ip_len = (frame_len - ETH_HDR_BYTES) as u16;
        let mut sum = self.ip_sum + u32::from(ip_len);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let csum = !(sum as u16);
        out[ETH_HDR_BYTES + 2..ETH_HDR_BYTES + 4].copy_from_slice(&ip_len.to_be_bytes());
        out[ETH_HDR_BYTES + 10..ETH_HDR_BYTES + 12].copy_from_slice(&csum.to_be_bytes());
        let udp_len = ip_len - IPV4_HDR_BYTES as u16;
        out[ETH_HDR_BYTES + IPV4_HDR_BYTES + 4..ETH_HDR_BYTES + IPV4_HDR_BYTES + 6]
            .copy_from_slice(&udp_len.to_be_bytes());
    }
}

/// Why a received frame was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than the headers.
    Short,
    /// Longer than the MTU.
    Oversize,
    /// Not IPv4.
    BadEthertype,
    /// IPv4 header invalid: version, IHL, length, checksum or fragmentation.
    BadIp,
    /// Not UDP, or UDP length inconsistent.
    BadUdp,
}

/// A validated frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Source address.
    pub src_ip: Ipv4Addr,
    /// Destination address.
    pub dst_ip: Ipv4Addr,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// UDP payload (eRPC header + data), exactly as long as UDP says.
    pub payload: &'a [u8],
    /// The IPv4 header checksum field was 0 and did not verify: the sender
    /// did not compute it (the C++ raw transport). Only ever true when
    /// [`ParseOptions::accept_zero_ip_checksum`] is set.
    pub ip_checksum_zero: bool,
}

/// What [`parse_frame_with`] accepts beyond the strict rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParseOptions {
    /// Accept an IPv4 header whose checksum field is 0 (not computed), as
    /// the C++ eRPC raw transport sends it. A non-zero checksum that does
    /// not verify is rejected either way.
    pub accept_zero_ip_checksum: bool,
}

impl ParseOptions {
    /// Every check on, as a Linux host applies them.
    pub const STRICT: ParseOptions = ParseOptions {
        accept_zero_ip_checksum: false,
    };
}

/// Validates an Ethernet/IPv4/UDP frame. `frame` may be longer than the
/// frame itself (a ring slot, or a frame padded to the 60-byte Ethernet
/// minimum, or followed by bytes that are no part of it): lengths come from
/// the IPv4 and UDP headers and are checked against `frame.len()`; nothing
/// past the IPv4 total length is read. IPv4 options are rejected (eRPC
/// never sends them), as are fragments and a wrong header checksum. A zero
/// UDP checksum is accepted; a non-zero one is not verified (eRPC sends
/// zero).
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>, FrameError> {
    parse_frame_with(frame, ParseOptions::STRICT)
}

/// [`parse_frame`], with the relaxations of `opts`.
pub fn parse_frame_with(frame: &[u8], opts: ParseOptions) -> Result<ParsedFrame<'_>, FrameError> {
    parse(frame, opts, false)
}

/// [`parse_frame_with`] for a frame whose IPv4 header checksum the NIC has
/// already verified (an mlx5 CQE with L3 header type IPv4 and `l3_ok`):
/// when `ip_checksum_verified` is true the checksum is not recomputed;
/// every other check is made. When it is false this is exactly
/// [`parse_frame_with`].
pub fn parse_frame_verified(
    frame: &[u8],
    opts: ParseOptions,
    ip_checksum_verified: bool,
) -> Result<ParsedFrame<'_>, FrameError> {
    parse(frame, opts, ip_checksum_verified)
}

/// The one parser behind [`parse_frame`], [`parse_frame_with`] and
/// [`parse_frame_verified`]. Every header field it reads is in the first 42
/// bytes, taken once as a fixed-size array, so no read after the first
/// length check needs a bounds check of its own; the checks and their
/// order (hence the reason reported) are those of the specification above.
#[inline(always)]
fn parse(
    frame: &[u8],
    opts: ParseOptions,
    ip_checksum_verified: bool,
) -> Result<ParsedFrame<'_>, FrameError> {
    const IP: usize = ETH_HDR_BYTES;
    const UDP: usize = ETH_HDR_BYTES + IPV4_HDR_BYTES;
    let Some(h) = frame.first_chunk::<HEADROOM_BYTES>() else {
        return Err(FrameError::Short);
    };
    let be16 = |o: usize| u16::from_be_bytes([h[o], h[o + 1]]);
    if be16(12) != ETHERTYPE_IPV4 {
        return Err(FrameError::BadEthertype);
    }
    // Version 4, IHL 5 (no options).
    if h[IP] != 0x45 {
        return Err(FrameError::BadIp);
    }
    let ip_len = usize::from(be16(IP + 2));
    if ip_len < IPV4_HDR_BYTES + UDP_HDR_BYTES {
        return Err(FrameError::BadIp);
    }
    let end = ETH_HDR_BYTES + ip_len;
    if end > MTU {
        return Err(FrameError::Oversize);
    }
    if end > frame.len() {
        return Err(FrameError::Short);
    }
    // More-fragments flag or a fragment offset.
    if be16(IP + 6) & 0x3fff != 0 {
        return Err(FrameError::BadIp);
    }
    let mut ip_checksum_zero = false;
    if !ip_checksum_verified {
        let ip: &[u8; IPV4_HDR_BYTES] = h[IP..UDP].try_into().expect("20 bytes");
        if ipv4_checksum_20(ip) != 0 {
            if !(opts.accept_zero_ip_checksum && be16(IP + 10) == 0) {
                return Err(FrameError::BadIp);
            }
            ip_checksum_zero = true;
        }
    }
    if h[IP + 9] != IPPROTO_UDP {
        return Err(FrameError::BadUdp);
    }
    if usize::from(be16(UDP + 4)) != ip_len - IPV4_HDR_BYTES {
        return Err(FrameError::BadUdp);
    }
    let mac = |o: usize| -> [u8; 6] { h[o..o + 6].try_into().expect("6 bytes") };
    let ip4 = |o: usize| Ipv4Addr::new(h[o], h[o + 1], h[o + 2], h[o + 3]);
    Ok(ParsedFrame {
        dst_mac: mac(0),
        src_mac: mac(6),
        src_ip: ip4(IP + 12),
        dst_ip: ip4(IP + 16),
        src_port: be16(UDP),
        dst_port: be16(UDP + 2),
        // HEADROOM_BYTES <= end <= frame.len(), both checked above.
        payload: &frame[HEADROOM_BYTES..end],
        ip_checksum_zero,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The precomputed headroom writes byte for byte what building it
        /// from scratch writes, and its checksum verifies.
        #[test]
        fn precomputed_headroom_equals_building_it(
            dst_mac: [u8; 6], src_mac: [u8; 6], src_ip: u32, dst_ip: u32,
            src_port: u16, dst_port: u16, frame_len in HEADROOM_BYTES..=65_535usize,
        ) {
            let t = FrameTemplate {
                dst_mac,
                src_mac,
                src_ip: Ipv4Addr::from(src_ip),
                dst_ip: Ipv4Addr::from(dst_ip),
                src_port,
                dst_port,
            };
            let mut a = [0xaau8; HEADROOM_BYTES];
            let mut b = [0x55u8; HEADROOM_BYTES];
            build_headroom(&t, &mut a, frame_len);
            Headroom::new(&t).write(&mut b, frame_len);
            proptest::prop_assert_eq!(a, b);
            proptest::prop_assert_eq!(ipv4_checksum(&b[ETH_HDR_BYTES..ETH_HDR_BYTES + IPV4_HDR_BYTES]), 0);
        }
    }

    fn template() -> FrameTemplate {
        FrameTemplate {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 31851,
            dst_port: 31852,
        }
    }

    #[test]
    fn build_then_parse_round_trips() {
        let mut f = vec![0u8; 100];
        build_headroom(&template(), &mut f, 100);
        f[HEADROOM_BYTES..].fill(0xab);
        let p = parse_frame(&f).unwrap();
        assert_eq!(p.dst_port, 31852);
        assert_eq!(p.src_ip, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.payload.len(), 100 - HEADROOM_BYTES);
        // TOS 1, TTL 128, ID 0, UDP checksum 0.
        assert_eq!(f[15], 0x01);
        assert_eq!(f[22], 128);
        assert_eq!(&f[18..20], &[0, 0]);
        assert_eq!(&f[40..42], &[0, 0]);
        // A ring slot longer than the frame parses the same.
        let mut slot = f.clone();
        slot.resize(1024, 0xee);
        assert_eq!(
            parse_frame(&slot).unwrap().payload.len(),
            100 - HEADROOM_BYTES
        );
    }

    #[test]
    fn rejects_malformed_frames_by_reason() {
        let mut f = vec![0u8; 100];
        build_headroom(&template(), &mut f, 100);
        assert_eq!(parse_frame(&f[..41]), Err(FrameError::Short));
        assert_eq!(parse_frame(&f[..99]), Err(FrameError::Short));
        let mut g = f.clone();
        g[12] = 0x86;
        assert_eq!(parse_frame(&g), Err(FrameError::BadEthertype));
        let mut g = f.clone();
        g[14] = 0x46;
        assert_eq!(parse_frame(&g), Err(FrameError::BadIp));
        let mut g = f.clone();
        g[24] ^= 1; // checksum
        assert_eq!(parse_frame(&g), Err(FrameError::BadIp));
        let mut g = f.clone();
        g[39] ^= 1; // UDP length
        assert_eq!(parse_frame(&g), Err(FrameError::BadUdp));
        let mut g = vec![0u8; 1100];
        build_headroom(&template(), &mut g, 1100);
        assert_eq!(parse_frame(&g), Err(FrameError::Oversize));
    }

    /// A frame of `payload_len` UDP payload bytes in a buffer of `buf_len`
    /// bytes (the rest filled with `fill`).
    fn frame(payload_len: usize, buf_len: usize, fill: u8) -> Vec<u8> {
        let len = HEADROOM_BYTES + payload_len;
        let mut f = vec![fill; buf_len.max(len)];
        build_headroom(&template(), &mut f, len);
        for (i, b) in f[HEADROOM_BYTES..len].iter_mut().enumerate() {
            *b = i as u8;
        }
        f
    }

    #[test]
    fn padded_control_packet_takes_its_length_from_the_headers() {
        // A credit return: 14-byte eRPC header, a 56-byte frame, padded by
        // the NIC to the 60-byte Ethernet minimum with zeros.
        let f = frame(ERPC_HDR_BYTES, 60, 0);
        assert_eq!(f.len(), 60);
        let p = parse_frame(&f).unwrap();
        assert_eq!(p.payload.len(), ERPC_HDR_BYTES);
        assert_eq!(p.payload.as_ptr(), f[HEADROOM_BYTES..].as_ptr());
        // The C++ form: 8 zero bytes after the header (UDP length 30), a
        // 64-byte frame with no padding needed.
        let f = frame(ERPC_HDR_BYTES + 8, 60, 0);
        assert_eq!(f.len(), 64);
        assert_eq!(parse_frame(&f).unwrap().payload.len(), 22);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 30);
    }

    #[test]
    fn trailing_garbage_is_no_part_of_the_frame() {
        for fill in [0x00, 0xff, 0x45, 0xa5] {
            let f = frame(100, 400, fill);
            let p = parse_frame(&f).unwrap();
            assert_eq!(p.payload.len(), 100);
            assert!(p.payload.iter().enumerate().all(|(i, &b)| b == i as u8));
            // The garbage is not read: changing it changes nothing.
            let mut g = f.clone();
            g[HEADROOM_BYTES + 100..].fill(fill ^ 0x5a);
            let q = parse_frame(&g).unwrap();
            assert_eq!(q.payload, p.payload);
            assert_eq!(
                (q.src_ip, q.dst_ip, q.src_port, q.dst_port, q.dst_mac),
                (p.src_ip, p.dst_ip, p.src_port, p.dst_port, p.dst_mac)
            );
        }
        // A frame followed by a whole second frame still parses as the first.
        let mut two = frame(20, 0, 0);
        two.extend_from_slice(&frame(500, 0, 0));
        assert_eq!(parse_frame(&two).unwrap().payload.len(), 20);
    }

    #[test]
    fn zero_ip_checksum_is_accepted_only_when_asked() {
        let lax = ParseOptions {
            accept_zero_ip_checksum: true,
        };
        let good = frame(30, 0, 0);
        let mut zero = good.clone();
        zero[24..26].fill(0);
        assert_eq!(parse_frame(&zero), Err(FrameError::BadIp), "strict");
        let p = parse_frame_with(&zero, lax).unwrap();
        assert!(p.ip_checksum_zero);
        assert_eq!(p.payload.len(), 30);
        // A computed checksum is not "zero" under either option.
        assert!(!parse_frame_with(&good, lax).unwrap().ip_checksum_zero);
        assert!(!parse_frame(&good).unwrap().ip_checksum_zero);
        // A wrong non-zero checksum stays a drop.
        let mut wrong = good.clone();
        wrong[25] ^= 0x10;
        assert_eq!(parse_frame_with(&wrong, lax), Err(FrameError::BadIp));
        // Zero checksum does not excuse other header errors.
        let mut bad = zero.clone();
        bad[14] = 0x46;
        assert_eq!(parse_frame_with(&bad, lax), Err(FrameError::BadIp));
        let mut frag = zero.clone();
        frag[20] = 0x20; // more fragments
        assert_eq!(parse_frame_with(&frag, lax), Err(FrameError::BadIp));
    }

    #[test]
    fn fast_header_checksum_equals_the_word_by_word_sum() {
        // The reference: 16-bit words, folded one carry at a time.
        fn slow(h: &[u8]) -> u16 {
            let mut sum: u32 = h
                .chunks(2)
                .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
                .sum();
            while sum >> 16 != 0 {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            !(sum as u16)
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut h = [0u8; 20];
        for round in 0..20_000 {
            for b in h.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Extremes: all ones, all zeros, a sum that folds to 0xffff.
            match round {
                0 => h = [0xff; 20],
                1 => h = [0; 20],
                2 => {
                    h = [0; 20];
                    h[0] = 0xff;
                    h[1] = 0xfe;
                    h[3] = 1;
                }
                _ => {}
            }
            assert_eq!(ipv4_checksum(&h), slow(&h), "{h:02x?}");
        }
    }

    #[test]
    fn routing_info_layout_matches_cpp() {
        let ri = RoutingInfo {
            mac: [1, 2, 3, 4, 5, 6],
            ipv4: Ipv4Addr::new(10, 1, 2, 3),
            udp_port: 31850,
            rxq_id: 7,
            rss_table_size: 0,
        };
        let b = ri.to_bytes();
        assert_eq!(&b[0..6], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[6..8], &[0, 0]);
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            u32::from(Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(&b[12..14], &31850u16.to_le_bytes());
        assert_eq!(&b[14..16], &7u16.to_le_bytes());
        assert!(b[20..].iter().all(|&x| x == 0));
        assert_eq!(RoutingInfo::from_bytes(&b), ri);
    }
}
