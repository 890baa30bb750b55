//! Arbitrary eRPC data packets and SM packets, mixed with real traffic,
//! against a client and a server Rpc on the simulated network. The harness
//! panics on any panic inside and on any packet neither acted on nor
//! counted as dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    erpc_sim::fuzz::run(data);
});
