//! eRPC transports.
//!
//! Will hold: the `Transport` trait, the mlx5 raw-Ethernet transport on the
//! driver, and the kernel-UDP transport.
#![forbid(unsafe_code)]
