//! Frame parsing for steering and CQE flags, and the checksum offloads.
//!
//! The parser never panics: every offset is checked against the frame.

use mlx5::prm::ctx::FteMatchSetLyr24;
use mlx5::prm::{Layout, ViewMut};

/// Bytes of an outer-header match set (`fte_match_set_lyr_2_4`).
pub const MATCH_SET_BYTES: usize = 0x40;

/// EtherTypes.
pub const ETH_P_IPV4: u16 = 0x0800;
/// IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// 802.1Q C-VLAN.
pub const ETH_P_8021Q: u16 = 0x8100;
/// 802.1ad S-VLAN.
pub const ETH_P_8021AD: u16 = 0x88a8;
/// IP protocol numbers.
pub const IPPROTO_TCP: u8 = 6;
/// UDP.
pub const IPPROTO_UDP: u8 = 17;

/// L3 type as reported in the CQE (`l4_hdr_type_etc[3:2]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// Not IP.
    None = 0,
    /// IPv6.
    Ipv6 = 1,
    /// IPv4.
    Ipv4 = 2,
}

/// L4 type as reported in the CQE (`l4_hdr_type_etc[6:4]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// None or unknown.
    None = 0,
    /// TCP.
    Tcp = 1,
    /// UDP.
    Udp = 2,
}

/// What the parser found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Source MAC.
    pub smac: [u8; 6],
    /// EtherType after any VLAN tag.
    pub ethertype: u16,
    /// Outer VLAN: (TPID, TCI).
    pub vlan: Option<(u16, u16)>,
    /// Offset of the L3 header.
    pub l3_off: usize,
    /// L3 type.
    pub l3: L3,
    /// IP protocol (0 if not IP).
    pub ip_proto: u8,
    /// IPv4 header length in bytes.
    pub ihl_bytes: usize,
    /// Offset of the L4 header (0 if none).
    pub l4_off: usize,
    /// L4 type.
    pub l4: L4,
    /// IPv4 header checksum verified.
    pub l3_csum_ok: bool,
    /// TCP/UDP checksum verified (UDP checksum 0 counts as OK).
    pub l4_csum_ok: bool,
    /// IPv4 fragment (MF set or offset non-zero).
    pub frag: bool,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses an Ethernet frame; missing headers leave fields at zero/None.
pub fn parse(f: &[u8]) -> Parsed {
    let mut p = Parsed {
        dmac: [0; 6],
        smac: [0; 6],
        ethertype: 0,
        vlan: None,
        l3_off: 0,
        l3: L3::None,
        ip_proto: 0,
        ihl_bytes: 0,
        l4_off: 0,
        l4: L4::None,
        l3_csum_ok: false,
        l4_csum_ok: false,
        frag: false,
    };
    if f.len() < 14 {
        return p;
    }
    p.dmac.copy_from_slice(&f[0..6]);
    p.smac.copy_from_slice(&f[6..12]);
    let mut et = be16(f, 12).unwrap_or(0);
    let mut off = 14;
    if et == ETH_P_8021Q || et == ETH_P_8021AD {
        let Some(tci) = be16(f, 14) else { return p };
        p.vlan = Some((et, tci));
        et = be16(f, 16).unwrap_or(0);
        off = 18;
    }
    p.ethertype = et;
    p.l3_off = off;
    match et {
        ETH_P_IPV4 => {
            let Some(&vihl) = f.get(off) else { return p };
            let ihl = usize::from(vihl & 0xf) * 4;
            if vihl >> 4 != 4 || ihl < 20 || f.len() < off + ihl {
                return p;
            }
            p.l3 = L3::Ipv4;
            p.ihl_bytes = ihl;
            p.ip_proto = f[off + 9];
            p.l3_csum_ok = inet_csum(&f[off..off + ihl], 0) == 0;
            let frag = be16(f, off + 6).unwrap_or(0);
            p.frag = frag & 0x3fff != 0;
            let total = usize::from(be16(f, off + 2).unwrap_or(0));
            p.l4_off = off + ihl;
            if !p.frag && total >= ihl && off + total <= f.len() {
                let seg = &f[off + ihl..off + total];
                let src = &f[off + 12..off + 16];
                let dst = &f[off + 16..off + 20];
                let proto = p.ip_proto;
                classify_l4(&mut p, seg, |sum| {
                    pseudo_v4(sum, src, dst, proto, seg.len())
                });
            } else {
                classify_l4_no_csum(&mut p);
            }
        }
        ETH_P_IPV6 => {
            if f.len() < off + 40 || f[off] >> 4 != 6 {
                return p;
            }
            p.l3 = L3::Ipv6;
            p.l3_csum_ok = true;
            p.ip_proto = f[off + 6];
            p.l4_off = off + 40;
            let plen = usize::from(be16(f, off + 4).unwrap_or(0));
            if off + 40 + plen <= f.len() {
                let seg = &f[off + 40..off + 40 + plen];
                let mut addrs = [0u8; 32];
                addrs.copy_from_slice(&f[off + 8..off + 40]);
                let proto = p.ip_proto;
                classify_l4(&mut p, seg, |sum| {
                    sum_words(&addrs, sum) + seg.len() as u32 + u32::from(proto)
                });
            } else {
                classify_l4_no_csum(&mut p);
            }
        }
        _ => {}
    }
    p
}

fn classify_l4_no_csum(p: &mut Parsed) {
    p.l4 = match p.ip_proto {
        IPPROTO_TCP => L4::Tcp,
        IPPROTO_UDP => L4::Udp,
        _ => L4::None,
    };
}

fn classify_l4(p: &mut Parsed, seg: &[u8], pseudo: impl Fn(u32) -> u32) {
    match p.ip_proto {
        IPPROTO_UDP if seg.len() >= 8 => {
            p.l4 = L4::Udp;
            let stored = be16(seg, 6).unwrap_or(0);
            p.l4_csum_ok = stored == 0 || fold(sum_words(seg, pseudo(0))) == 0xffff;
        }
        IPPROTO_TCP if seg.len() >= 20 => {
            p.l4 = L4::Tcp;
            p.l4_csum_ok = fold(sum_words(seg, pseudo(0))) == 0xffff;
        }
        _ => {}
    }
}

fn pseudo_v4(mut sum: u32, src: &[u8], dst: &[u8], proto: u8, len: usize) -> u32 {
    sum = sum_words(src, sum);
    sum = sum_words(dst, sum);
    sum + u32::from(proto) + len as u32
}

fn sum_words(b: &[u8], mut sum: u32) -> u32 {
    let mut it = b.chunks_exact(2);
    for w in &mut it {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([w[0], w[1]])));
    }
    if let [last] = it.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum of `b` with an initial partial sum.
pub fn inet_csum(b: &[u8], init: u32) -> u16 {
    !fold(sum_words(b, init))
}

/// Fills in the IPv4 header checksum (`l3`) and the TCP/UDP checksum
/// (`l4`) of an IPv4 frame, as the `cs_flags` offload does. Frames that are
/// not IPv4 TCP/UDP are left alone; returns what was done.
pub fn offload_checksums(f: &mut [u8], l3: bool, l4: bool) -> (bool, bool) {
    let p = parse(f);
    let mut done = (false, false);
    if p.l3 != L3::Ipv4 {
        return done;
    }
    let off = p.l3_off;
    if l3 {
        f[off + 10] = 0;
        f[off + 11] = 0;
        let c = inet_csum(&f[off..off + p.ihl_bytes], 0);
        f[off + 10..off + 12].copy_from_slice(&c.to_be_bytes());
        done.0 = true;
    }
    let total = usize::from(be16(f, off + 2).unwrap_or(0));
    if l4 && !p.frag && total >= p.ihl_bytes && off + total <= f.len() {
        let l4_off = off + p.ihl_bytes;
        let seg_len = total - p.ihl_bytes;
        let csum_at = match p.ip_proto {
            IPPROTO_UDP if seg_len >= 8 => l4_off + 6,
            IPPROTO_TCP if seg_len >= 20 => l4_off + 16,
            _ => return done,
        };
        f[csum_at] = 0;
        f[csum_at + 1] = 0;
        let mut src = [0u8; 8];
        src.copy_from_slice(&f[off + 12..off + 20]);
        let sum = pseudo_v4(0, &src[..4], &src[4..], p.ip_proto, seg_len);
        let mut c = inet_csum(&f[l4_off..l4_off + seg_len], sum);
        if c == 0 && p.ip_proto == IPPROTO_UDP {
            c = 0xffff;
        }
        f[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        done.1 = true;
    }
    done
}

/// The frame's outer headers as an `fte_match_set_lyr_2_4` (big-endian,
/// 64 bytes), so that steering is `(key & mask) == (value & mask)`.
pub fn match_key(f: &[u8], p: &Parsed) -> [u8; MATCH_SET_BYTES] {
    type M = FteMatchSetLyr24;
    let mut key = [0u8; MATCH_SET_BYTES];
    if f.len() < 14 {
        return key;
    }
    let mut v = ViewMut::<M>::new(&mut key).expect("64 bytes");
    let mac_hi = |m: &[u8; 6]| u64::from(u32::from_be_bytes([m[0], m[1], m[2], m[3]]));
    let mac_lo = |m: &[u8; 6]| u64::from(u16::from_be_bytes([m[4], m[5]]));
    v.set(M::SMAC_47_16, mac_hi(&p.smac))
        .set(M::SMAC_15_0, mac_lo(&p.smac))
        .set(M::DMAC_47_16, mac_hi(&p.dmac))
        .set(M::DMAC_15_0, mac_lo(&p.dmac))
        .set(M::ETHERTYPE, u64::from(p.ethertype));
    if let Some((tpid, tci)) = p.vlan {
        v.set(M::FIRST_PRIO, u64::from(tci >> 13))
            .set(M::FIRST_CFI, u64::from((tci >> 12) & 1))
            .set(M::FIRST_VID, u64::from(tci & 0xfff));
        if tpid == ETH_P_8021Q {
            v.set(M::CVLAN_TAG, 1);
        } else {
            v.set(M::SVLAN_TAG, 1);
        }
    }
    let off = p.l3_off;
    match p.l3 {
        L3::Ipv4 => {
            let tos = f[off + 1];
            v.set(M::IP_VERSION, 4)
                .set(M::IP_PROTOCOL, u64::from(p.ip_proto))
                .set(M::IP_DSCP, u64::from(tos >> 2))
                .set(M::IP_ECN, u64::from(tos & 3))
                .set(M::TTL_HOPLIMIT, u64::from(f[off + 8]))
                .set(M::FRAG, u64::from(p.frag));
            let mut a = [0u8; 16];
            a[12..].copy_from_slice(&f[off + 12..off + 16]);
            v.set_bytes(M::SRC_IPV4_SRC_IPV6, &a);
            a[12..].copy_from_slice(&f[off + 16..off + 20]);
            v.set_bytes(M::DST_IPV4_DST_IPV6, &a);
        }
        L3::Ipv6 => {
            let tc = (u16::from_be_bytes([f[off], f[off + 1]]) >> 4) as u8;
            v.set(M::IP_VERSION, 6)
                .set(M::IP_PROTOCOL, u64::from(p.ip_proto))
                .set(M::IP_DSCP, u64::from(tc >> 2))
                .set(M::IP_ECN, u64::from(tc & 3))
                .set(M::TTL_HOPLIMIT, u64::from(f[off + 7]));
            v.set_bytes(M::SRC_IPV4_SRC_IPV6, &f[off + 8..off + 24]);
            v.set_bytes(M::DST_IPV4_DST_IPV6, &f[off + 24..off + 40]);
        }
        L3::None => {}
    }
    if p.l4 != L4::None && f.len() >= p.l4_off + 4 {
        let sport = u64::from(be16(f, p.l4_off).unwrap_or(0));
        let dport = u64::from(be16(f, p.l4_off + 2).unwrap_or(0));
        match p.l4 {
            L4::Udp => {
                v.set(M::UDP_SPORT, sport).set(M::UDP_DPORT, dport);
            }
            L4::Tcp => {
                v.set(M::TCP_SPORT, sport).set(M::TCP_DPORT, dport);
                if let Some(fl) = be16(f, p.l4_off + 12) {
                    v.set(M::TCP_FLAGS, u64::from(fl & 0x1ff));
                }
            }
            L4::None => {}
        }
    }
    key
}

/// The bits of a match set that [`match_key`] fills: every named field of
/// the layout. A flow group whose mask has other bits set asks for a match
/// the model cannot evaluate.
pub fn supported_match_mask() -> [u8; MATCH_SET_BYTES] {
    let mut m = [0u8; MATCH_SET_BYTES];
    for f in <FteMatchSetLyr24 as Layout>::INFO.fields {
        for b in f.bit..f.bit + f.width {
            let byte = (b / 8) as usize;
            if byte < MATCH_SET_BYTES {
                m[byte] |= 0x80 >> (b % 8);
            }
        }
    }
    m
}

/// CQE `l4_hdr_type_etc` byte: bits 6..4 L4 type, 3..2 L3 type, 0 VLAN.
pub fn cqe_hdr_type(p: &Parsed) -> u8 {
    ((p.l4 as u8) << 4) | ((p.l3 as u8) << 2) | u8::from(p.vlan.is_some())
}

/// CQE `hds_ip_ext` byte: bit 0 L2 OK, bit 1 L3 checksum OK, bit 2 L4
/// checksum OK.
pub fn cqe_csum_flags(p: &Parsed) -> u8 {
    use mlx5::prm::cqe::CqeChecksum;
    let mut b = CqeChecksum::L2_OK;
    if p.l3 != L3::None && p.l3_csum_ok {
        b |= CqeChecksum::L3_OK;
    }
    if p.l4 != L4::None && p.l4_csum_ok {
        b |= CqeChecksum::L4_OK;
    }
    b.bits()
}

/// Builds an Ethernet/IPv4/UDP frame with correct checksums (for tests and
/// examples): `payload` after a 42-byte header.
pub fn udp_frame(
    dmac: [u8; 6],
    smac: [u8; 6],
    src_ip: [u8; 4],
    dst_ip: [u8; 4],
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&dmac);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
    f.extend_from_slice(&src_ip);
    f.extend_from_slice(&dst_ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    offload_checksums(&mut f, true, true);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::prm::View;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    #[test]
    fn parses_udp_and_verifies_checksums() {
        let f = udp_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1234, 31850, b"hello");
        let p = parse(&f);
        assert_eq!(p.l3, L3::Ipv4);
        assert_eq!(p.l4, L4::Udp);
        assert!(p.l3_csum_ok && p.l4_csum_ok);
        assert_eq!(cqe_csum_flags(&p), 7);
        assert_eq!(cqe_hdr_type(&p), (2 << 4) | (2 << 2));
        let mut bad = f.clone();
        bad[45] ^= 1;
        assert!(!parse(&bad).l4_csum_ok);
        let key = match_key(&f, &p);
        let v = View::<FteMatchSetLyr24>::new(&key).unwrap();
        assert_eq!(v.get(FteMatchSetLyr24::UDP_DPORT), 31850);
        assert_eq!(v.get(FteMatchSetLyr24::IP_PROTOCOL), 17);
        assert_eq!(v.get(FteMatchSetLyr24::ETHERTYPE), 0x0800);
        assert_eq!(v.get(FteMatchSetLyr24::DMAC_15_0), 1);
        assert_eq!(&key[0x2c..0x30], &[10, 0, 0, 1]);
    }

    #[test]
    fn l3_ok_is_the_ipv4_header_checksum_verdict() {
        let f = udp_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1234, 31850, b"hello");
        let l3_ok = |f: &[u8]| cqe_csum_flags(&parse(f)) & 2 != 0;
        assert!(l3_ok(&f));
        // Any header bit flipped (outside the checksum itself, which a flip
        // also breaks) fails the check.
        for bit in 0..160 {
            let mut g = f.clone();
            g[14 + bit / 8] ^= 0x80 >> (bit % 8);
            assert!(!l3_ok(&g), "bit {bit}");
        }
        // A zero checksum field (a sender that did not compute it) is not
        // "no checksum" for IPv4: l3_ok = 0, unless 0 is the right value.
        let mut z = f.clone();
        z[24..26].fill(0);
        assert!(!l3_ok(&z));
        // The header type stays IPv4 whatever the checksum.
        assert_eq!((cqe_hdr_type(&parse(&z)) >> 2) & 3, 2);
        // Not IPv4 at all (bad version, IHL < 5, cut short): no L3 type, no
        // l3_ok.
        let mut v = f.clone();
        v[14] = 0x65;
        assert!(!l3_ok(&v) && (cqe_hdr_type(&parse(&v)) >> 2) & 3 == 0);
        let mut ihl = f.clone();
        ihl[14] = 0x44;
        assert!(!l3_ok(&ihl));
        assert!(!l3_ok(&f[..30]));
    }

    #[test]
    fn truncated_frames_do_not_panic() {
        let f = udp_frame(A, B, [1; 4], [2; 4], 1, 2, &[0; 100]);
        for n in 0..f.len() {
            let p = parse(&f[..n]);
            let _ = match_key(&f[..n], &p);
            let mut c = f[..n].to_vec();
            let _ = offload_checksums(&mut c, true, true);
        }
    }

    #[test]
    fn supported_mask_covers_the_erpc_rule() {
        let m = supported_match_mask();
        // dmac, ethertype, ip_protocol, udp_dport are all supported.
        assert_eq!(&m[0x06..0x0e], &[0xff; 8]);
        assert_eq!(m[0x10], 0xff);
        assert_eq!(&m[0x1e..0x20], &[0xff, 0xff]);
        // ipv4_ihl (dw6[15:12]) is not a named field here.
        assert_eq!(m[0x1a] & 0xf0, 0);
    }
}
