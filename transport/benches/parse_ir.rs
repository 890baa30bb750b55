//! Instructions per call of the frame parser and header builder, for
//! callgrind (`transport/benches/parse_ir.sh` runs it twice with different
//! counts and divides the difference). Not a timed benchmark.
//!
//! Usage: parse_ir <sw|hw|build> <frames>
//! * `sw`: `parse_frame_with` (the IPv4 header checksum computed);
//! * `hw`: `parse_frame_verified(.., true)` (the NIC said `l3_ok`);
//! * `build`: `build_headroom` (the TX side's header and checksum).

use std::hint::black_box;
use std::net::Ipv4Addr;

use transport::wire::{FrameTemplate, ParseOptions, build_headroom, parse_frame_verified};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, n) = match (args.get(1), args.get(2).and_then(|s| s.parse::<u64>().ok())) {
        (Some(m), Some(n)) => (m.clone(), n),
        _ => {
            eprintln!("usage: parse_ir <sw|hw|build> <frames>");
            std::process::exit(2);
        }
    };
    let t = FrameTemplate {
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_mac: [2, 0, 0, 0, 0, 1],
        src_ip: Ipv4Addr::new(10, 0, 0, 1),
        dst_ip: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 31850,
        dst_port: 31851,
    };
    // A small eRPC packet (14-byte header + 32 data bytes) in a ring slot.
    let len = 42 + 14 + 32;
    let mut slot = vec![0u8; 1024];
    build_headroom(&t, &mut slot, len);
    let opts = ParseOptions {
        accept_zero_ip_checksum: true,
    };
    let mut acc = 0usize;
    match mode.as_str() {
        "sw" | "hw" => {
            let hw = mode == "hw";
            for _ in 0..n {
                let f = parse_frame_verified(black_box(&slot), black_box(opts), black_box(hw));
                acc += f.map_or(0, |p| p.payload.len() + usize::from(p.dst_port));
            }
        }
        "build" => {
            for i in 0..n {
                build_headroom(black_box(&t), black_box(&mut slot), black_box(len));
                acc += usize::from(slot[(i & 31) as usize]);
            }
        }
        _ => {
            eprintln!("mode must be sw, hw or build");
            std::process::exit(2);
        }
    }
    black_box(acc);
}
