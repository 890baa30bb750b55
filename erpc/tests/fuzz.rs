//! Property test: arbitrary eRPC packets and SM packets, mixed with real
//! traffic, never panic an Rpc or a Nexus, and every received packet is
//! either acted on or counted as dropped (checked inside the harness).
//! The same harness backs the cargo-fuzz target in `erpc/fuzz/`.

use proptest::prelude::*;

proptest! {
    // proptest's default: 256 cases, or `PROPTEST_CASES` for a soak.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn arbitrary_packets_never_panic_and_are_counted(input in proptest::collection::vec(any::<u8>(), 0..1500)) {
        erpc::sim::fuzz::run(&input);
    }
}

#[test]
fn hostile_inputs_are_counted() {
    // Mostly header-level attacks aimed at live sessions, plus garbage SM.
    // Commands in the harness's byte grammar (see erpc::sim::fuzz).
    let mut input = Vec::new();
    for i in 0..200u16 {
        // A legitimate 100-byte request, then some time.
        input.extend_from_slice(&[4, 100, 0, i as u8, 5, 6]);
        // A header-only packet of every type at live sessions and slots:
        // [1, to, sel=0 (echo, size 0), session, type, pkt_num(2), req_num,
        //  dlen mode 2 (short), dlen 0, fill]
        let [lo, hi] = (i % 4).to_le_bytes();
        input.extend_from_slice(&[1, (i & 1) as u8, 0, (i % 3) as u8, (i / 3) as u8, lo, hi]);
        input.extend_from_slice(&[(8 + i % 16) as u8, 2, 0, 0]);
        // 100 bytes of garbage to the client's SM port:
        // [3, 0 (client), 0 (raw), len(2), len mode 0 (long), bytes]
        input.extend_from_slice(&[3, 0, 0, 100, 0, 0]);
        input.extend(std::iter::repeat_n(0xab, 100));
    }
    let r = erpc::sim::fuzz::run(&input);
    // 200 header-only packets at live sessions; at most a few can be
    // valid (a credit return or RFR that happens to match).
    assert!(r.dropped >= 190, "{r:?}");
    assert_eq!(r.sm_malformed, 200, "{r:?}");
    assert!(r.completed > 0, "legitimate requests still complete: {r:?}");
}
