//! Device model of an mlx5 NIC and a simulated fabric.
//!
//! Will hold: the software ConnectX (firmware command interface, TX/RX
//! engines, flow steering), the switch with seeded fault injection and pcap,
//! and the bridge to a Linux interface.
#![forbid(unsafe_code)]
