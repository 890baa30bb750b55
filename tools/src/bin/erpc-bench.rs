//! erpc-bench: small-RPC rate and latency, on the device model by default.
//!
//! ```sh
//! cargo run --release -p erpc-tools --bin erpc-bench                 # device model
//! cargo run --release -p erpc-tools --bin erpc-bench -- --transport udp
//! ```
//!
//! Two nodes, each both client and server, 32-byte requests and responses,
//! B requests per batch with at most `--window` in flight per node (the
//! paper's Figure 4 setup on two nodes). Every run also measures a raw echo
//! of eRPC-sized packets over the same transport and reports eRPC's rate as
//! a ratio to it.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use erpc_tools::bench::{DeviceModel, Point, Vfio, erpc_on, raw_echo_on, udp_erpc, udp_raw_echo};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    /// The mlx5 transport on the device model (a software ConnectX), one thread.
    Mlx5Sim,
    /// Kernel UDP over loopback, one thread.
    Udp,
    /// A real ConnectX bound to vfio-pci (`--pci`): both nodes are queue
    /// sets of that function, talking through the NIC's own loopback.
    Mlx5,
}

#[derive(Debug, Parser)]
#[command(version, about = "eRPC small-RPC benchmark (device model by default)")]
struct Args {
    /// Transport.
    #[arg(long, value_enum, default_value = "mlx5-sim")]
    transport: Which,
    /// Batch sizes B to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 3, 8, 16])]
    batch: Vec<usize>,
    /// Most requests in flight per node.
    #[arg(long, default_value_t = 60)]
    window: usize,
    /// Request and response size in bytes.
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// PCI address of the ConnectX for `--transport mlx5` (bind it first
    /// with `erpc-vfio bind`).
    #[arg(long)]
    pci: Option<String>,
    /// Seconds measured per point.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
}

fn main() {
    let args = Args::parse();
    let dur = Duration::from_secs_f64(args.secs);
    let warm = Duration::from_millis(200);
    let dm = (args.transport == Which::Mlx5Sim).then(DeviceModel::new);
    let hw = (args.transport == Which::Mlx5).then(|| {
        let bdf = args.pci.as_deref().unwrap_or_else(|| {
            eprintln!(
                "erpc-bench: --transport mlx5 needs --pci DDDD:BB:DD.F (see `erpc-vfio list`)"
            );
            std::process::exit(2)
        });
        Vfio::open(bdf).unwrap_or_else(|e| {
            eprintln!("erpc-bench: {e}");
            std::process::exit(1)
        })
    });
    let name = match args.transport {
        Which::Mlx5Sim => "mlx5 transport on the device model (2 NICs, 1 thread)",
        Which::Udp => "kernel UDP over loopback (1 thread)",
        Which::Mlx5 => "mlx5 transport on a ConnectX via VFIO (2 queue sets, 1 thread)",
    };
    println!(
        "erpc-bench: {}-byte RPCs, {name}, {:.1} s per point",
        args.size, args.secs
    );
    let raw = match (&dm, &hw) {
        (Some(d), _) => raw_echo_on(d, args.size, args.window, dur),
        (_, Some(h)) => raw_echo_on(h, args.size, args.window, dur),
        _ => udp_raw_echo(args.size, args.window, dur),
    };
    println!(
        "raw echo of {}-byte packets over the same transport: {:.3} M round trips/s",
        transport::PKTHDR_BYTES + args.size,
        raw / 1e6
    );
    println!(
        "{:>4} {:>7} {:>10} {:>12} {:>10} {:>10} {:>10}",
        "B", "window", "Mrps", "/ raw echo", "median µs", "p99 µs", "p99.9 µs"
    );
    for &b in &args.batch {
        if b == 0 || b > args.window {
            eprintln!("skipping B = {b}: must be 1..=window");
            continue;
        }
        let p = Point {
            batch: b,
            window: args.window,
            size: args.size,
        };
        let o = match (&dm, &hw) {
            (Some(d), _) => erpc_on(d, p, dur, warm),
            (_, Some(h)) => erpc_on(h, p, dur, warm),
            _ => udp_erpc(p, dur, warm),
        };
        println!(
            "{:>4} {:>7} {:>10.3} {:>12.2} {:>10.1} {:>10.1} {:>10.1}",
            b,
            args.window,
            o.rpcs_per_sec / 1e6,
            o.rpcs_per_sec / raw,
            o.lat_us.0,
            o.lat_us.1,
            o.lat_us.2
        );
    }
    if let Some(d) = &dm {
        let s: Vec<_> = d.nics().iter().map(|n| n.stats()).collect();
        println!(
            "device model: {} frames sent, {} doorbells, {} send CQEs (1 per 64 sends), {} out-of-buffer drops",
            s.iter().map(|s| s.tx_frames).sum::<u64>(),
            s.iter().map(|s| s.sq_doorbells).sum::<u64>(),
            s.iter().map(|s| s.tx_cqes).sum::<u64>(),
            d.nics()
                .iter()
                .map(|n| n.drops(mlx5_sim::DropReason::OutOfBuffer))
                .sum::<u64>(),
        );
    }
}
