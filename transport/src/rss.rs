//! Receive-side scaling as a C++ eRPC peer's DPDK transport expects it.
//!
//! A C++ DPDK receiver spreads its Rpcs over up to
//! [`CPP_MAX_QUEUES_PER_PORT`] RX queues of one NIC port with RSS: the NIC
//! hashes each frame's IPv4/UDP 4-tuple with the Toeplitz function and
//! eRPC's key ([`ERPC_RSS_KEY`]), looks the hash up in an indirection table
//! of `rss_table_size` entries, and the table maps entry `e` to queue
//! `e % 16`. The sender, not the receiver, makes a session land on the
//! right queue: it picks the UDP *source* port so that
//!
//! ```text
//! (toeplitz(src_ip, dst_ip, src_port, dst_port) % rss_table_size) % 16 == rxq_id
//! ```
//!
//! taking the first such port from [`RSS_BASE_SRC_PORT`] upward (the C++
//! code scans up to, not including, 65535). [`source_ports`] yields the
//! candidates in that order; [`source_port`] applies the rule to a peer's
//! routing info.
//!
//! A receiver that steers by exact UDP destination port (both of our
//! transports, and the C++ raw transport) has no RSS to satisfy: it
//! advertises a table size of 1 and queue 0 (ours) or a table size of 0
//! (the C++ raw transport, which leaves the fields zero). Both mean "any
//! source port", so [`source_port`] returns `None` for them; a table size
//! of 0 is never used as a divisor.
//!
//! The hash is DPDK's `rte_softrss` over the IPv4 4-tuple: the input is the
//! source address, destination address, source port and destination port,
//! each in network byte order, 12 bytes in all.

use std::fmt;
use std::net::Ipv4Addr;

use crate::RoutingInfo;

/// eRPC's 40-byte RSS key (the C++ DPDK transport's `default_rss_key`).
pub const ERPC_RSS_KEY: [u8; 40] = [
    0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2, 0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94,
    0x6b, 0x9e, 0x38, 0xd9, 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56, 0x3d, 0x59,
    0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a,
];

/// RX queues a C++ DPDK transport uses per NIC port; its RSS table maps
/// entry `e` to queue `e % 16`.
pub const CPP_MAX_QUEUES_PER_PORT: u16 = 16;

/// The first UDP source port the C++ DPDK transport tries.
pub const RSS_BASE_SRC_PORT: u16 = 10_000;

/// Bytes of the IPv4 4-tuple hash input.
pub const V4_L4_INPUT_BYTES: usize = 12;

/// The Toeplitz hash of `input` under `key`: for every set bit `i` of the
/// input (most significant bit of byte 0 first), the 32 key bits starting
/// at key bit `i` are XORed into the result.
///
/// # Panics
/// If `key` is shorter than `input.len() + 4` bytes (the hash would need
/// key bits past its end).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    assert!(
        key.len() >= input.len() + 4,
        "Toeplitz key of {} bytes is too short for {} input bytes",
        key.len(),
        input.len()
    );
    let mut hash = 0u32;
    // The 64-bit window holds key bits [8 * i, 8 * i + 64): its top 32
    // bits are the key bits that line up with the current input bit.
    let mut window = u64::from_be_bytes(key[..8].try_into().expect("8 bytes"));
    for (next, &byte) in (8..).zip(input) {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= (window >> (32 - bit)) as u32;
            }
        }
        // Slide by one byte, pulling in the next key byte (zero past the
        // end: those bits are never used, per the length check).
        window = (window << 8) | u64::from(key.get(next).copied().unwrap_or(0));
    }
    hash
}

/// The 12-byte hash input of an IPv4/UDP flow, as `rte_softrss` sees it.
pub fn v4_l4_input(
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
) -> [u8; V4_L4_INPUT_BYTES] {
    let mut b = [0u8; V4_L4_INPUT_BYTES];
    b[0..4].copy_from_slice(&src_ip.octets());
    b[4..8].copy_from_slice(&dst_ip.octets());
    b[8..10].copy_from_slice(&src_port.to_be_bytes());
    b[10..12].copy_from_slice(&dst_port.to_be_bytes());
    b
}

/// The RSS hash of an IPv4/UDP flow under eRPC's key.
pub fn hash_v4_udp(src_ip: Ipv4Addr, dst_ip: Ipv4Addr, src_port: u16, dst_port: u16) -> u32 {
    toeplitz(
        &ERPC_RSS_KEY,
        &v4_l4_input(src_ip, dst_ip, src_port, dst_port),
    )
}

/// The queue a C++ DPDK receiver with an RSS table of `rss_table_size`
/// (non-zero) entries puts a frame with this hash on.
#[inline]
pub fn queue_of(hash: u32, rss_table_size: u16) -> u16 {
    assert_ne!(rss_table_size, 0, "an RSS table of 0 entries maps nothing");
    ((hash % u32::from(rss_table_size)) % u32::from(CPP_MAX_QUEUES_PER_PORT)) as u16
}

/// Why no source port can make a peer's RSS pick its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RssError {
    /// The queue id is not one the C++ formula can produce for this table
    /// size (at least `min(rss_table_size, 16)`).
    QueueUnreachable {
        /// The peer's RX queue id.
        rxq_id: u16,
        /// The peer's RSS table size.
        rss_table_size: u16,
    },
    /// No port from [`RSS_BASE_SRC_PORT`] to 65534 hashes onto the queue.
    NoPort {
        /// The peer's RX queue id.
        rxq_id: u16,
        /// The peer's RSS table size.
        rss_table_size: u16,
    },
}

impl fmt::Display for RssError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RssError::QueueUnreachable {
                rxq_id,
                rss_table_size,
            } => write!(
                f,
                "RX queue {rxq_id} cannot be reached through an RSS table of \
                 {rss_table_size} entries mapped onto {CPP_MAX_QUEUES_PER_PORT} queues"
            ),
            RssError::NoPort {
                rxq_id,
                rss_table_size,
            } => write!(
                f,
                "no UDP source port from {RSS_BASE_SRC_PORT} to 65534 hashes onto RX queue \
                 {rxq_id} (RSS table of {rss_table_size} entries)"
            ),
        }
    }
}

impl std::error::Error for RssError {}

/// True if `peer` spreads flows over queues by RSS, so that the source
/// port matters: an RSS table of more than one entry. A table size of 0
/// (the C++ raw transport) or 1 (our transports) means the peer steers by
/// exact destination port.
#[inline]
pub fn uses_rss(peer: &RoutingInfo) -> bool {
    peer.rss_table_size > 1
}

/// Every UDP source port, in the C++ order (ascending from
/// [`RSS_BASE_SRC_PORT`], below 65535), that makes `peer`'s RSS put a frame
/// from `src_ip` on `peer.rxq_id`. Empty when the peer does not use RSS
/// ([`uses_rss`]) or its queue is unreachable.
pub fn source_ports(src_ip: Ipv4Addr, peer: &RoutingInfo) -> impl Iterator<Item = u16> + '_ {
    let usable = uses_rss(peer) && queue_reachable(peer);
    let ports = if usable {
        RSS_BASE_SRC_PORT..u16::MAX
    } else {
        0..0
    };
    ports.filter(move |&p| {
        queue_of(
            hash_v4_udp(src_ip, peer.ipv4, p, peer.udp_port),
            peer.rss_table_size,
        ) == peer.rxq_id
    })
}

fn queue_reachable(peer: &RoutingInfo) -> bool {
    peer.rxq_id < peer.rss_table_size.min(CPP_MAX_QUEUES_PER_PORT)
}

/// The UDP source port a C++ sender at `src_ip` would pick toward `peer`:
/// `Ok(None)` when the peer does not use RSS (any port reaches it),
/// `Ok(Some(port))` for the first port that lands on its queue.
pub fn source_port(src_ip: Ipv4Addr, peer: &RoutingInfo) -> Result<Option<u16>, RssError> {
    if !uses_rss(peer) {
        return Ok(None);
    }
    let (rxq_id, rss_table_size) = (peer.rxq_id, peer.rss_table_size);
    if !queue_reachable(peer) {
        return Err(RssError::QueueUnreachable {
            rxq_id,
            rss_table_size,
        });
    }
    source_ports(src_ip, peer)
        .next()
        .map(Some)
        .ok_or(RssError::NoPort {
            rxq_id,
            rss_table_size,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The well-known verification key (Microsoft's RSS documentation).
    const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    #[test]
    fn verification_vectors() {
        let src = Ipv4Addr::new(66, 9, 149, 187);
        let dst = Ipv4Addr::new(161, 142, 100, 80);
        let both = v4_l4_input(src, dst, 2794, 1766);
        assert_eq!(toeplitz(&MS_KEY, &both[..8]), 0x323e_8fc2, "addresses only");
        assert_eq!(toeplitz(&MS_KEY, &both), 0x51cc_c178, "addresses and ports");
    }

    #[test]
    fn more_verification_vectors() {
        // Further rows of the same published table (IPv4, with ports).
        let rows = [
            (
                (199, 92, 111, 2),
                14230,
                (65, 69, 140, 83),
                4739,
                0xc626_b0ea,
            ),
            (
                (24, 19, 198, 95),
                12898,
                (12, 22, 207, 184),
                38024,
                0x5c2b_394a,
            ),
            (
                (38, 27, 205, 30),
                48228,
                (209, 142, 163, 6),
                2217,
                0xafc7_327f,
            ),
            (
                (153, 39, 163, 191),
                44251,
                (202, 188, 127, 2),
                1303,
                0x10e8_28a2,
            ),
        ];
        for (s, sp, d, dp, want) in rows {
            let src = Ipv4Addr::new(s.0, s.1, s.2, s.3);
            let dst = Ipv4Addr::new(d.0, d.1, d.2, d.3);
            assert_eq!(
                toeplitz(&MS_KEY, &v4_l4_input(src, dst, sp, dp)),
                want,
                "{src}:{sp} -> {dst}:{dp}"
            );
        }
    }

    /// A bit-by-bit reference written straight from the definition.
    fn reference(key: &[u8], input: &[u8]) -> u32 {
        let key_bit = |i: usize| (key[i / 8] >> (7 - i % 8)) & 1;
        let mut h = 0u32;
        for i in 0..input.len() * 8 {
            if (input[i / 8] >> (7 - i % 8)) & 1 == 1 {
                let mut k = 0u32;
                for j in 0..32 {
                    k = (k << 1) | u32::from(key_bit(i + j));
                }
                h ^= k;
            }
        }
        h
    }

    #[test]
    fn matches_the_definition_on_many_inputs() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in [0, 1, 4, 8, 12, 36] {
            for _ in 0..50 {
                let input: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                assert_eq!(
                    toeplitz(&ERPC_RSS_KEY, &input),
                    reference(&ERPC_RSS_KEY, &input)
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "too short")]
    fn a_short_key_is_refused() {
        toeplitz(&ERPC_RSS_KEY[..15], &[0; 12]);
    }

    fn peer(rxq_id: u16, rss_table_size: u16) -> RoutingInfo {
        RoutingInfo {
            mac: [2, 0, 0, 0, 0, 9],
            ipv4: Ipv4Addr::new(10, 0, 0, 2),
            udp_port: 31_850,
            rxq_id,
            rss_table_size,
        }
    }

    #[test]
    fn source_port_follows_the_cpp_rule() {
        let me = Ipv4Addr::new(10, 0, 0, 1);
        for q in 0..16 {
            let p = peer(q, 128);
            let port = source_port(me, &p).unwrap().unwrap();
            assert!(port >= RSS_BASE_SRC_PORT);
            let h = hash_v4_udp(me, p.ipv4, port, p.udp_port);
            assert_eq!((h % 128) % 16, u32::from(q));
            // It is the first such port.
            for earlier in RSS_BASE_SRC_PORT..port {
                let h = hash_v4_udp(me, p.ipv4, earlier, p.udp_port);
                assert_ne!((h % 128) % 16, u32::from(q), "port {earlier} comes first");
            }
            // Every candidate lands on the queue too.
            for c in source_ports(me, &p).take(5) {
                assert_eq!(queue_of(hash_v4_udp(me, p.ipv4, c, p.udp_port), 128), q);
            }
        }
    }

    #[test]
    fn table_sizes_without_rss_and_unreachable_queues() {
        let me = Ipv4Addr::new(10, 0, 0, 1);
        // 0 (C++ raw transport) and 1 (exact-port steering): any port.
        assert_eq!(source_port(me, &peer(0, 0)), Ok(None));
        assert_eq!(source_port(me, &peer(0, 1)), Ok(None));
        assert_eq!(source_port(me, &peer(3, 1)), Ok(None));
        assert_eq!(source_ports(me, &peer(0, 0)).count(), 0);
        // A table of 4 entries reaches queues 0..4 only.
        assert!(source_port(me, &peer(3, 4)).unwrap().is_some());
        assert_eq!(
            source_port(me, &peer(4, 4)),
            Err(RssError::QueueUnreachable {
                rxq_id: 4,
                rss_table_size: 4
            })
        );
        // Queues past 15 are never reached, whatever the table size.
        assert!(source_port(me, &peer(16, 512)).is_err());
        assert!(source_port(me, &peer(15, 512)).unwrap().is_some());
    }
}
