//! eRPC: Nexus, Rpc endpoints, sessions, message buffers, the wire protocol,
//! loss recovery and congestion control.
#![forbid(unsafe_code)]
