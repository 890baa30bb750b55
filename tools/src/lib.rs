//! Shared code of the command-line tools (benchmark, queue inspector, VFIO
//! binding tool, examples).
//!
//! * [`vfio_tool`]: the logic of `erpc-vfio` (list, status, bind, unbind).
#![forbid(unsafe_code)]

pub mod vfio_tool;
