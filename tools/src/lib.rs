//! Shared code of the command-line tools (benchmark, queue inspector, VFIO
//! binding tool, examples).
//!
//! * [`vfio_tool`]: the logic of `erpc-vfio` (list, status, bind, unbind).
//! * [`bench`]: the small-RPC benchmark behind `erpc-bench`.
#![forbid(unsafe_code)]

pub mod bench;
pub mod vfio_tool;
