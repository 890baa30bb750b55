//! Shared code of the command-line tools (benchmark, queue inspector, VFIO
//! binding tool, examples).
#![forbid(unsafe_code)]
