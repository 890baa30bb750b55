//! Shared code of the command-line tools (benchmark, VFIO binding tool,
//! examples).
//!
//! * [`bench`](mod@bench): the small-RPC benchmark behind `erpc-bench`.
//! * [`cli`]: what `erpc-bench`'s jobs share on the command line.
//! * [`exp_small_rpc`]: `erpc-bench` with no subcommand, the main job
//!   (small RPCs against a raw echo); [`exp_threads`]: its `--threads N`.
//! * `erpc-bench`'s other experiments, one subcommand each:
//!   [`exp_loss`] (`loss`), [`exp_failure`] (`failure-detection`),
//!   [`exp_factors`] (`factors`), [`exp_incast`] (`incast`, virtual time),
//!   [`exp_cc`] (`cc-overhead`), [`exp_large`] (`large`) and
//!   [`exp_scale`] (`scale`, virtual time).
//! * [`capture`]: `erpc-bench --pcap` (fabric frames and SM packets in one
//!   file, for `tools/wireshark/erpc.lua`).
//! * [`inspect`](mod@inspect): `erpc-inspect` (snapshots of a running
//!   process's queues, counters and sessions; offline device reports).
//! * [`memory`]: the hugepages a run needs, and the one note when they are
//!   missing.
//! * [`vfio_tool`]: the logic of `erpc-vfio` (list, status, bind, unbind).
#![forbid(unsafe_code)]

/// README.md, whose Rust snippets compile as this crate's doctests
/// (`cargo test --doc`); its other blocks are marked `sh` or `text`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod bench;
pub mod capture;
pub mod cli;
pub mod exp_cc;
pub mod exp_factors;
pub mod exp_failure;
pub mod exp_incast;
pub mod exp_large;
pub mod exp_loss;
pub mod exp_scale;
pub mod exp_small_rpc;
pub mod exp_threads;
pub mod inspect;
pub mod memory;
pub mod vfio_tool;

/// Installs the `tracing` subscriber every binary uses: human-readable
/// events on stderr, filtered by `RUST_LOG` (default: warnings and errors).
/// A second call does nothing.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
