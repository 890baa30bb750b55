//! Fuzzes the RX frame parser: `wire::parse_frame` must never panic, never
//! need bytes past the frame's end, and every verdict must be consistent
//! with the bytes (the checks of `conformance::parse_frame_checked`, which
//! the proptests in `transport/tests/parse_frame.rs` share).
//!
//! Each input is parsed as it is, then with its IPv4 header checksum made
//! valid (so that the fuzzer reaches the checks behind the checksum:
//! protocol, UDP length, payload bounds), then with the checksum field
//! zeroed, and each of those strictly and accepting zero checksums (as the
//! mlx5 transport does by default, for C++ raw peers).
#![no_main]

// The transport conformance suite's checked parsers (a module of the
// transport tests, not of the library).
#[path = "../../tests/conformance/mod.rs"]
mod conformance;

use libfuzzer_sys::fuzz_target;
use transport::MTU;
use conformance::{parse_frame_checked, parse_frame_checked_with};
use transport::wire::{ETH_HDR_BYTES, IPV4_HDR_BYTES, ParseOptions, ipv4_checksum};

const LAX: ParseOptions = ParseOptions {
    accept_zero_ip_checksum: true,
};

fn both(frame: &[u8]) {
    let _ = parse_frame_checked(frame);
    let _ = parse_frame_checked_with(frame, LAX);
}

fuzz_target!(|frame: &[u8]| {
    both(frame);

    let ip = ETH_HDR_BYTES..ETH_HDR_BYTES + IPV4_HDR_BYTES;
    if frame.len() >= ip.end && frame.len() <= 2 * MTU {
        let mut fixed = [0u8; 2 * MTU];
        let fixed = &mut fixed[..frame.len()];
        fixed.copy_from_slice(frame);
        fixed[ip.start + 10..ip.start + 12].fill(0);
        let csum = ipv4_checksum(&fixed[ip.clone()]);
        fixed[ip.start + 10..ip.start + 12].copy_from_slice(&csum.to_be_bytes());
        both(fixed);
        fixed[ip.start + 10..ip.start + 12].fill(0);
        both(fixed);
    }
});
