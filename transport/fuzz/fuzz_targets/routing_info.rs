//! Fuzzes what a peer's routing info (48 bytes from a session-management
//! packet, so from the network) does to the RSS source-port choice both
//! transports make when resolving it: no panic (an RSS table size of 0 is
//! not a divisor, as it is in the C++ code), and a chosen port follows the
//! C++ rule and is the first that does (`conformance::rss_source_port_checked`,
//! shared with the property tests in `transport/tests/parse_frame.rs`).
//!
//! Input: 4 bytes of our IPv4 address, then the routing info.
#![no_main]

// The transport conformance suite's checked parsers (a module of the
// transport tests, not of the library).
#[path = "../../tests/conformance/mod.rs"]
mod conformance;

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use conformance::rss_source_port_checked;
use transport::{ROUTING_INFO_BYTES, RoutingInfo};

fuzz_target!(|data: &[u8]| {
    let Some((src, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let mut info = [0u8; ROUTING_INFO_BYTES];
    let n = rest.len().min(ROUTING_INFO_BYTES);
    info[..n].copy_from_slice(&rest[..n]);
    let info = RoutingInfo::from_bytes(&info);
    let _ = rss_source_port_checked(Ipv4Addr::from(*src), &info);
});
