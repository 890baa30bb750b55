//! erpc-bench: small-RPC rate and latency, on the device model by default.
//!
//! ```sh
//! cargo run --release -p erpc-tools --bin erpc-bench                 # the main job, device model
//! cargo run --release -p erpc-tools --bin erpc-bench -- --transport udp
//! cargo run --release -p erpc-tools --bin erpc-bench -- --json run.json --latency-csv lat.csv
//! cargo run --release -p erpc-tools --bin erpc-bench -- --secs 0.01 --batch 1 --pcap erpc.pcap
//! cargo run --release -p erpc-tools --bin erpc-bench -- incast --senders 10,20
//! cargo run --release -p erpc-tools --bin erpc-bench -- help loss
//! ```
//!
//! With no subcommand, the main job ([`erpc_tools::exp_small_rpc`]): two
//! nodes, each both client and server, small RPCs in batches against a
//! raw echo of the same packets over the same transport (the paper's
//! Figure 4 setup on two nodes). The subcommands are the other
//! experiments, each in its `erpc_tools::exp_*` module with its flags:
//! `loss`, `failure-detection`, `factors`, `incast`, `cc-overhead`,
//! `large` and `scale`.
//!
//! Bad settings are refused before anything runs, naming the limit (exit
//! code 2); a failed setup or run is one error line (exit code 1).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use erpc_tools::cli::Quit;
use erpc_tools::exp_cc::CcOverheadArgs;
use erpc_tools::exp_factors::FactorsArgs;
use erpc_tools::exp_failure::FailureArgs;
use erpc_tools::exp_incast::IncastArgs;
use erpc_tools::exp_large::LargeArgs;
use erpc_tools::exp_loss::LossArgs;
use erpc_tools::exp_scale::ScaleArgs;
use erpc_tools::exp_small_rpc::SmallRpcArgs;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "eRPC benchmarks (device model by default)",
    long_about = "eRPC benchmarks (device model by default). With no subcommand, the main \
                  job: small-RPC rate and latency against a raw echo of the same packets \
                  over the same transport (the paper's Figure 4). The subcommands are the \
                  other experiments; `erpc-bench help <COMMAND>` lists each one's options.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    main: SmallRpcArgs,
    #[command(subcommand)]
    command: Option<Command>,
    /// Gone: the experiments are subcommands. Refused with the command
    /// that replaces it, for old scripts.
    #[arg(long, hide = true, value_name = "NAME")]
    experiment: Option<String>,
}

/// The experiments besides the main job.
#[derive(Debug, Subcommand)]
enum Command {
    /// Goodput of ~8 MB messages under frame loss 1e-6..1e-2, and the
    /// small-RPC rate at loss 1e-3, each against lossless (device model).
    Loss(LossArgs),
    /// Time from killing a server process (kernel UDP) to the client's
    /// error continuations, against the failure timeout.
    FailureDetection(FailureArgs),
    /// Small-RPC rate with each of eRPC's optimisations switched off in
    /// turn, and congestion control off, against all on (device model).
    Factors(FactorsArgs),
    /// N-to-1 incast of 1 MB requests on the simulated network (virtual
    /// time), with small RPCs from an uncongested sender; CC on and off.
    Incast(IncastArgs),
    /// Small-RPC rate with congestion control (Timely, wheel, bypasses) on
    /// against off, interleaved rounds on the device model.
    CcOverhead(CcOverheadArgs),
    /// Goodput of 32 B ... 8 MB requests and responses against single-core
    /// memcpy of the same bytes, same run (device model).
    Large(LargeArgs),
    /// Session scalability (the paper's 20 000 sessions): client nodes of
    /// many sessions each against one server node of several Rpcs, small
    /// RPCs with congestion control on, on the simulated network (virtual
    /// time); every RPC checked exactly once.
    Scale(ScaleArgs),
}

fn main() -> ExitCode {
    erpc_tools::init_tracing();
    // clap's own errors (unknown or misplaced flags, unparsable values)
    // exit 2 here.
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.main.note_given(&matches);
    if let Some(name) = &cli.experiment {
        let now = match name.as_str() {
            "small-rpc" => "erpc-bench".to_owned(),
            other => format!("erpc-bench {other}"),
        };
        eprintln!("erpc-bench: --experiment {name} is now `{now}` (see erpc-bench --help)");
        return ExitCode::from(2);
    }
    let done = match &cli.command {
        None => cli.main.run(),
        Some(Command::Loss(a)) => a.run(),
        Some(Command::FailureDetection(a)) => a.run(),
        Some(Command::Factors(a)) => a.run(),
        Some(Command::Incast(a)) => a.run(),
        Some(Command::CcOverhead(a)) => a.run(),
        Some(Command::Large(a)) => a.run(),
        Some(Command::Scale(a)) => a.run(Some(&heap_count::net_bytes)),
    };
    match done {
        Ok(()) | Err(Quit::Pipe) => ExitCode::SUCCESS,
        Err(Quit::Err(e)) => {
            eprintln!("erpc-bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// A counting global allocator: the process's net heap bytes, for
/// `erpc-bench scale`'s heap per session. One relaxed atomic add per
/// allocation and free; eRPC's request path allocates nothing, so the
/// measured points are not touched by it.
mod heap_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicI64, Ordering};

    static NET: AtomicI64 = AtomicI64::new(0);

    struct Counting;

    // SAFETY: forwards every call to the system allocator unchanged; the
    // counter is an atomic, which allocates nothing.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            NET.fetch_add(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            NET.fetch_sub(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            NET.fetch_add(l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            NET.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
            // SAFETY: same contract as our caller's.
            unsafe { System.realloc(p, l, n) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Net heap bytes allocated so far.
    pub(super) fn net_bytes() -> i64 {
        NET.load(Ordering::Relaxed)
    }
}
