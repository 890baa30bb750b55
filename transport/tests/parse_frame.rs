//! Property tests of the RX frame parser (`wire::parse_frame`, and
//! `parse_frame_with` accepting zero IPv4 checksums), the same checks the
//! fuzz targets (`transport/fuzz`) run: it never panics, never needs bytes
//! past the frame's end, every accepted frame is exactly what its headers
//! say, and each kind of malformation is rejected for its own reason. Also
//! the RSS source-port choice from arbitrary routing info.

// The shared transport conformance suite (a module of the tests only).
#[macro_use]
mod conformance;

use std::net::Ipv4Addr;

use conformance::{parse_frame_checked, parse_frame_checked_with, rss_source_port_checked};
use proptest::prelude::*;
use transport::wire::{
    ETH_HDR_BYTES, FrameError, FrameTemplate, IPV4_HDR_BYTES, ParseOptions, build_headroom,
    ipv4_checksum, parse_frame_verified, parse_frame_with,
};
use transport::{HEADROOM_BYTES, MTU, RoutingInfo};

const LAX: ParseOptions = ParseOptions {
    accept_zero_ip_checksum: true,
};

const IP: usize = ETH_HDR_BYTES;
const UDP: usize = ETH_HDR_BYTES + IPV4_HDR_BYTES;

fn template() -> impl Strategy<Value = FrameTemplate> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(
            |(dst_mac, src_mac, s, d, src_port, dst_port)| FrameTemplate {
                dst_mac,
                src_mac,
                src_ip: Ipv4Addr::from(s),
                dst_ip: Ipv4Addr::from(d),
                src_port,
                dst_port,
            },
        )
}

/// A valid frame: headers from `t`, then `payload`.
fn frame(t: &FrameTemplate, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; HEADROOM_BYTES + payload.len()];
    let len = f.len();
    build_headroom(t, &mut f, len);
    f[HEADROOM_BYTES..].copy_from_slice(payload);
    f
}

fn valid_frame() -> impl Strategy<Value = (FrameTemplate, Vec<u8>)> {
    (
        template(),
        prop::collection::vec(any::<u8>(), 0..=MTU - HEADROOM_BYTES),
    )
}

/// Recomputes the IPv4 header checksum after a deliberate header change,
/// so the change itself is what the parser sees.
fn fix_checksum(f: &mut [u8]) {
    f[IP + 10..IP + 12].fill(0);
    let c = ipv4_checksum(&f[IP..IP + IPV4_HDR_BYTES]);
    f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Set { at: usize, value: u8 },
    Truncate { to: usize },
    Extend { bytes: Vec<u8> },
    FixChecksum,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        // Mostly in the headers, where the parser looks.
        (0..64usize, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..1100usize, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..64usize, any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        (0..1100usize).prop_map(|to| Mutation::Truncate { to }),
        prop::collection::vec(any::<u8>(), 1..200).prop_map(|bytes| Mutation::Extend { bytes }),
        Just(Mutation::FixChecksum),
    ]
}

fn apply(f: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Flip { at, mask } => {
            if let Some(b) = f.get_mut(*at) {
                *b ^= mask;
            }
        }
        Mutation::Set { at, value } => {
            if let Some(b) = f.get_mut(*at) {
                *b = *value;
            }
        }
        Mutation::Truncate { to } => f.truncate(*to),
        Mutation::Extend { bytes } => f.extend_from_slice(bytes),
        Mutation::FixChecksum => {
            if f.len() >= UDP {
                fix_checksum(f);
            }
        }
    }
}

/// Cases per property: the default, or `PROPTEST_CASES` for a longer soak.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(512)))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1200)) {
        let _ = parse_frame_checked(&bytes);
    }

    #[test]
    fn random_bytes_behind_a_valid_ethertype_never_panic(
        mut bytes in prop::collection::vec(any::<u8>(), 42..1200),
        fix in any::<bool>(),
    ) {
        // Get past the first checks more often than uniform noise does.
        bytes[12] = 0x08;
        bytes[13] = 0x00;
        bytes[IP] = 0x45;
        if fix {
            fix_checksum(&mut bytes);
        }
        let _ = parse_frame_checked(&bytes);
    }

    #[test]
    fn valid_frames_parse_to_what_was_built(
        (t, payload) in valid_frame(),
        slack in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut f = frame(&t, &payload);
        let p = parse_frame_checked(&f).expect("a built frame parses");
        prop_assert_eq!((p.dst_mac, p.src_mac), (t.dst_mac, t.src_mac));
        prop_assert_eq!((p.src_ip, p.dst_ip), (t.src_ip, t.dst_ip));
        prop_assert_eq!((p.src_port, p.dst_port), (t.src_port, t.dst_port));
        prop_assert_eq!(p.payload, &payload[..]);
        // In a ring slot, bytes after the frame change nothing.
        f.extend_from_slice(&slack);
        let q = parse_frame_checked(&f).unwrap();
        prop_assert_eq!(q.payload, &payload[..]);
    }

    #[test]
    fn mutated_frames_never_panic_and_what_passes_is_consistent(
        (t, payload) in valid_frame(),
        muts in prop::collection::vec(mutation(), 1..5),
    ) {
        let mut f = frame(&t, &payload);
        for m in &muts {
            apply(&mut f, m);
        }
        let _ = parse_frame_checked(&f);
    }

    #[test]
    fn truncated_frames_are_short((t, payload) in valid_frame(), cut in any::<prop::sample::Index>()) {
        let f = frame(&t, &payload);
        let to = cut.index(f.len());
        prop_assert_eq!(parse_frame_checked(&f[..to]).unwrap_err(), FrameError::Short);
    }

    #[test]
    fn other_ethertypes_are_rejected((t, payload) in valid_frame(), et in any::<u16>()) {
        prop_assume!(et != 0x0800);
        let mut f = frame(&t, &payload);
        f[12..14].copy_from_slice(&et.to_be_bytes());
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), FrameError::BadEthertype);
    }

    #[test]
    fn wrong_ip_version_or_header_length_is_rejected(
        (t, payload) in valid_frame(),
        vihl in any::<u8>(),
    ) {
        prop_assume!(vihl != 0x45);
        let mut f = frame(&t, &payload);
        f[IP] = vihl;
        fix_checksum(&mut f);
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), FrameError::BadIp);
    }

    #[test]
    fn ip_length_disagreeing_with_the_frame_is_rejected(
        (t, payload) in valid_frame(),
        ip_len in any::<u16>(),
    ) {
        let mut f = frame(&t, &payload);
        let real = f.len() - ETH_HDR_BYTES;
        prop_assume!(usize::from(ip_len) != real);
        f[IP + 2..IP + 4].copy_from_slice(&ip_len.to_be_bytes());
        fix_checksum(&mut f);
        let want = if usize::from(ip_len) < 28 {
            FrameError::BadIp
        } else if ETH_HDR_BYTES + usize::from(ip_len) > MTU {
            FrameError::Oversize
        } else if usize::from(ip_len) > real {
            FrameError::Short
        } else {
            // Shorter than the frame: the UDP length no longer matches.
            FrameError::BadUdp
        };
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), want);
    }

    #[test]
    fn bad_checksums_fragments_and_other_protocols_are_rejected(
        (t, payload) in valid_frame(),
        which in 0..3u8,
        x in 1..=255u8,
    ) {
        let mut f = frame(&t, &payload);
        let want = match which {
            0 => {
                f[IP + 10] ^= x; // checksum only
                FrameError::BadIp
            }
            1 => {
                // More-fragments flag or a fragment offset.
                let bits = x & 0x3f;
                f[IP + 6] |= if bits == 0 { 0x20 } else { bits };
                fix_checksum(&mut f);
                FrameError::BadIp
            }
            _ => {
                f[IP + 9] = 17 ^ x;
                fix_checksum(&mut f);
                FrameError::BadUdp
            }
        };
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), want);
    }

    #[test]
    fn truncated_udp_length_is_rejected((t, payload) in valid_frame(), udp_len in any::<u16>()) {
        let mut f = frame(&t, &payload);
        prop_assume!(usize::from(udp_len) != f.len() - UDP);
        f[UDP + 4..UDP + 6].copy_from_slice(&udp_len.to_be_bytes());
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), FrameError::BadUdp);
    }

    #[test]
    fn zero_checksums_pass_only_when_relaxed(
        (t, payload) in valid_frame(),
        pad in 0..20usize,
    ) {
        let mut f = frame(&t, &payload);
        // Zeroing an already-zero checksum (a header summing to 0xffff)
        // changes nothing: that frame is valid either way.
        prop_assume!(f[IP + 10..IP + 12] != [0, 0]);
        f[IP + 10..IP + 12].fill(0);
        f.extend(std::iter::repeat_n(0u8, pad));
        prop_assert_eq!(parse_frame_checked(&f).unwrap_err(), FrameError::BadIp);
        let p = parse_frame_checked_with(&f, LAX).expect("relaxed");
        prop_assert!(p.ip_checksum_zero);
        prop_assert_eq!(p.payload, &payload[..]);
    }

    #[test]
    fn mutated_frames_relaxed_are_consistent(
        (t, payload) in valid_frame(),
        muts in prop::collection::vec(mutation(), 1..5),
        zero in any::<bool>(),
    ) {
        let mut f = frame(&t, &payload);
        for m in &muts {
            apply(&mut f, m);
        }
        if zero && f.len() >= UDP {
            f[IP + 10..IP + 12].fill(0);
        }
        let _ = parse_frame_checked_with(&f, LAX);
        let _ = parse_frame_checked(&f);
    }

    /// A NIC's "IPv4 header checksum OK" (mlx5 `l3_ok`) skips only the
    /// checksum: unset, the verdict is exactly the software one; set on a
    /// header that does verify, it is the same too; set on one that does
    /// not (a NIC that was wrong), only the checksum rejection goes.
    #[test]
    fn nic_verified_checksum_skips_only_the_checksum(
        (t, payload) in valid_frame(),
        muts in prop::collection::vec(mutation(), 0..4),
        lax in any::<bool>(),
    ) {
        let mut f = frame(&t, &payload);
        for m in &muts {
            apply(&mut f, m);
        }
        let opts = if lax { LAX } else { ParseOptions::STRICT };
        let sw = parse_frame_with(&f, opts);
        prop_assert_eq!(parse_frame_verified(&f, opts, false), sw);
        let hw = parse_frame_verified(&f, opts, true);
        if f.len() < UDP || ipv4_checksum(&f[IP..UDP]) == 0 {
            prop_assert_eq!(hw, sw);
        } else {
            // The checksum is wrong and was not recomputed: the verdict is
            // the software one for the same frame with a right checksum.
            let mut fixed = f.clone();
            fix_checksum(&mut fixed);
            let want = parse_frame_checked_with(&fixed, opts);
            match (hw, want) {
                (Ok(p), Ok(q)) => {
                    prop_assert!(!p.ip_checksum_zero);
                    prop_assert_eq!(p.payload, q.payload);
                    prop_assert_eq!(
                        (p.src_ip, p.dst_ip, p.src_port, p.dst_port, p.dst_mac),
                        (q.src_ip, q.dst_ip, q.src_port, q.dst_port, q.dst_mac)
                    );
                }
                (h, w) => prop_assert_eq!(h.err(), w.err()),
            }
        }
    }

    #[test]
    fn rss_source_ports_from_any_routing_info(
        bytes in any::<[u8; 48]>(),
        src in any::<u32>(),
        rxq_id in 0..20u16,
        size in prop_oneof![0..4u16, 4..600u16, any::<u16>()],
        raw in any::<bool>(),
    ) {
        let mut info = RoutingInfo::from_bytes(&bytes);
        if !raw {
            // Mostly plausible queue ids and table sizes.
            info.rxq_id = rxq_id;
            info.rss_table_size = size;
        }
        let _ = rss_source_port_checked(Ipv4Addr::from(src), &info);
    }
}
