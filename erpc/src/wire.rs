//! The wire format, for tools that read or write eRPC packets themselves:
//! dissectors, interoperability tests against the C++ eRPC, fuzzers.
//! An application never needs it.
//!
//! * The 14-byte packet header ([`PktHdr`]), laid out exactly as the C++
//!   eRPC's bitfields on x86, and the 44-bit request-number arithmetic.
//! * Session-management packets ([`SmPkt`], 392 bytes, the C++ `SmPkt` in
//!   its C layout), with erpc-rs's extension fields in the padding the C++
//!   eRPC leaves unread.
//!
//! `shared/erpc-wire-facts.md` and README.md ("Wire format") describe both
//! byte by byte.

pub use crate::consts::{
    INVALID_SESSION_NUM, MAX_MSG_PKTS, MSG_SIZE_BITS, PKT_MAGIC, PKT_NUM_BITS, REQ_NUM_BITS,
    SM_UDP_PORT_BASE,
};
pub use crate::pkthdr::*;
pub use crate::sm_types::*;
