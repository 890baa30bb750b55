//! Size and encode + decode time of erpc-typed's message shapes under
//! each serde codec considered (BENCHMARKS.md, "Typed and async calls", "The codec").
//!
//! ```sh
//! cargo run --release --manifest-path erpc/typed/codec-bench/Cargo.toml
//! ```
//!
//! Each figure is the median of 7 runs of 200 000 round trips (encode
//! into a reused buffer, decode from it), wall clock on this machine.

use std::hint::black_box;
use std::time::Instant;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The 32-byte RPC of the benchmarks: four integers.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct Small {
    id: u64,
    a: u64,
    b: u64,
    c: u64,
}

/// A key-value PUT: fixed-size key and value.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct Put {
    key: [u8; 16],
    value: [[u8; 32]; 2],
}

/// A reply with an optional value and a string.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct Reply {
    found: Option<[[u8; 32]; 2]>,
    note: String,
    seq: u32,
}

/// A scan response: 128 entries of key and value.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct Scan {
    entries: Vec<([u8; 16], [[u8; 32]; 2])>,
}

trait Codec {
    const NAME: &'static str;
    /// Encodes into `buf`; returns the encoded bytes' length (from the start).
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize;
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T;
}

struct Postcard;
impl Codec for Postcard {
    const NAME: &'static str = "postcard 1";
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize {
        // Into a caller's buffer (erpc-typed encodes into the msgbuf).
        if buf.len() < 16 << 10 {
            buf.resize(16 << 10, 0);
        }
        postcard::to_slice(v, buf).unwrap().len()
    }
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T {
        postcard::from_bytes(b).unwrap()
    }
}

struct Bitcode;
impl Codec for Bitcode {
    const NAME: &'static str = "bitcode 0.6 (serde)";
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize {
        // bitcode's serde API returns a new Vec.
        *buf = bitcode::serialize(v).unwrap();
        buf.len()
    }
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T {
        bitcode::deserialize(b).unwrap()
    }
}

struct Rmp;
impl Codec for Rmp {
    const NAME: &'static str = "rmp-serde 1 (MessagePack)";
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize {
        buf.clear();
        rmp_serde::encode::write(buf, v).unwrap();
        buf.len()
    }
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T {
        rmp_serde::from_slice(b).unwrap()
    }
}

struct Cbor;
impl Codec for Cbor {
    const NAME: &'static str = "ciborium 0.2 (CBOR)";
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize {
        buf.clear();
        ciborium::into_writer(v, &mut *buf).unwrap();
        buf.len()
    }
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T {
        ciborium::from_reader(b).unwrap()
    }
}

struct Bincode;
impl Codec for Bincode {
    const NAME: &'static str = "bincode 2 (serde; unmaintained)";
    fn enc<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> usize {
        if buf.len() < 16 << 10 {
            buf.resize(16 << 10, 0);
        }
        bincode::serde::encode_into_slice(v, buf, bincode::config::standard()).unwrap()
    }
    fn dec<T: DeserializeOwned>(b: &[u8]) -> T {
        bincode::serde::decode_from_slice(b, bincode::config::standard())
            .unwrap()
            .0
    }
}

fn measure<C: Codec, T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    v: &T,
    iters: usize,
) -> (usize, f64) {
    let mut buf = Vec::new();
    let size = C::enc(v, &mut buf);
    assert_eq!(&C::dec::<T>(&buf[..size]), v, "{} round trip", C::NAME);
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let n = C::enc(black_box(v), &mut buf);
                black_box(C::dec::<T>(black_box(&buf[..n])));
            }
            t0.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    (size, runs[3])
}

fn row<C: Codec>() {
    let small = Small {
        id: 7,
        a: 1 << 40,
        b: u64::MAX / 3,
        c: 12345,
    };
    let put = Put {
        key: [0xab; 16],
        value: [[0x5a; 32]; 2],
    };
    let reply = Reply {
        found: Some([[1; 32]; 2]),
        note: "ok".into(),
        seq: 99,
    };
    let scan = Scan {
        entries: (0..128u8).map(|i| ([i; 16], [[i ^ 0x55; 32]; 2])).collect(),
    };
    let (s1, t1) = measure::<C, _>(&small, 200_000);
    let (s2, t2) = measure::<C, _>(&put, 200_000);
    let (s3, t3) = measure::<C, _>(&reply, 200_000);
    let (s4, t4) = measure::<C, _>(&scan, 2_000);
    println!(
        "{:<32} {:>5} B {:>7.1} ns | {:>5} B {:>7.1} ns | {:>5} B {:>7.1} ns | {:>6} B {:>9.1} ns",
        C::NAME,
        s1,
        t1,
        s2,
        t2,
        s3,
        t3,
        s4,
        t4
    );
}

fn main() {
    println!(
        "encode + decode, median of 7 runs; size in bytes\n{:<32} {:>18} | {:>18} | {:>18} | {:>20}",
        "codec", "Small (32 B raw)", "Put (80 B raw)", "Reply", "Scan (128 x 80 B)"
    );
    row::<Postcard>();
    row::<Bitcode>();
    row::<Bincode>();
    row::<Rmp>();
    row::<Cbor>();
}
