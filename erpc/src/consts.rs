//! Protocol constants and defaults, with the relationships between them
//! checked at compile time.

use transport::{MAX_DATA_PER_PKT, MTU, PKTHDR_BYTES};

/// Slots (concurrent requests) per session.
pub const SESSION_REQ_WINDOW: usize = 8;
/// Default packet credits per session.
pub const SESSION_CREDITS: usize = 32;
/// Magic nibble in every packet header.
pub const PKT_MAGIC: u8 = 11;
/// Bits of the packet number.
pub const PKT_NUM_BITS: u32 = 14;
/// Bits of the request number.
pub const REQ_NUM_BITS: u32 = 44;
/// Bits of the message size.
pub const MSG_SIZE_BITS: u32 = 24;
/// Largest message (request or response) in bytes, as the C++ eRPC allows:
/// an 8 MiB block holds the data plus the headers of all packets but the
/// first, and a request and its response together number their packets in
/// 14 bits.
pub const MAX_MSG_BYTES: usize = (8 << 20) - ((8 << 20) / MAX_DATA_PER_PKT) * PKTHDR_BYTES;
/// Packets in the largest message.
pub const MAX_MSG_PKTS: usize = MAX_MSG_BYTES.div_ceil(MAX_DATA_PER_PKT);
/// Largest Rpc id (255 is reserved as invalid).
pub const MAX_RPC_ID: u8 = 254;
/// Session number that means "none" on the wire.
pub const INVALID_SESSION_NUM: u16 = u16::MAX;
/// Largest number of sessions an Rpc can ever number (client and server).
pub(crate) const MAX_SESSIONS: usize = INVALID_SESSION_NUM as usize;
/// Default base UDP port of session management (process i uses base + i).
pub const SM_UDP_PORT_BASE: u16 = 31850;
/// Session-management request retry interval.
pub(crate) const SM_RETRY_MS: u64 = 100;
/// Default RX ring entries the Rpc assumes per transport (the transport
/// reports its own; sessions reserve credits' worth each).
pub const RX_RING_ENTRIES_DEFAULT: usize = 4096;
/// RX ring entries an Rpc needs to hold `sessions` sessions (client and
/// server together) at `credits` each: each session reserves its credits'
/// worth, so `sessions × credits`, rounded up to a power of two (what every
/// transport's ring takes). For example 2 500 sessions at the default 32
/// credits need 131 072 entries: 128 MiB of hugepages on the mlx5
/// transport (1 KiB per entry). Size the transport's ring with it:
/// `Mlx5Config::with_rx_ring_entries`, `UdpConfig::with_rx_ring_entries`,
/// `SimConfig::ring_entries`.
pub const fn rx_ring_entries_for(sessions: usize, credits: usize) -> usize {
    (sessions.saturating_mul(credits)).next_power_of_two()
}

/// Control-packet header slots (credit returns, requests for response,
/// status packets), at least: an Rpc keeps twice what its transport may
/// hold unread (`Transport::tx_depth`), if more, so a slot is rewritten
/// only after the NIC has read it.
pub(crate) const CTRL_BUFS: usize = 256;
/// Largest TX batch eRPC accumulates before calling the transport.
pub(crate) const MAX_TX_BATCH: usize = 64;
/// The most requests one call of a burst handler receives
/// ([`crate::Burst`]): an RX burst with more requests of the type calls
/// the handler again for the rest, in pieces of at most this many.
pub const MAX_BURST: usize = 64;
/// Single-packet requests of burst types one RX burst may gather for
/// their burst handlers (an Rpc's list, allocated once, only when a burst
/// handler is registered, at most its RX ring's size). Beyond it, in the
/// rare RX burst that is larger, a request goes to its handler at once, as
/// a burst of one.
pub(crate) const MAX_BURST_PENDING: usize = 1024;
/// A freed session number is reused only after it has been free this long,
/// so that stray packets for the old session cannot reach a new one.
pub(crate) const SESSION_NUM_QUARANTINE_MS: u64 = 1000;
/// Most SM packets queued for one Rpc before the Nexus drops (and counts) more.
pub(crate) const MAX_SM_QUEUE: usize = 1024;
/// Default retransmission timeout of a client slot: a request that has
/// made no progress for this long is rolled back to the last packet the
/// server acknowledged and retransmitted (go-back-N).
pub(crate) const RTO_US: u64 = 5000;
/// Default interval of the packet-loss scan (client slots are checked
/// against the retransmission timeout this often).
pub(crate) const PKT_LOSS_SCAN_US: u64 = 500;
/// Default machine-failure timeout: a remote Nexus that has answered no
/// keep-alive ping for this long is declared failed, and a connect request
/// unanswered for this long fails.
pub const FAILURE_TIMEOUT_MS: u64 = 500;
/// Keep-alive pings per failure timeout (a peer must miss this many in a
/// row to be declared failed).
pub(crate) const PINGS_PER_FAILURE_TIMEOUT: u64 = 10;
/// The least default burst of connect requests per source (see
/// `RpcConfig::connect_burst_per_source`, whose default is the sessions
/// the RX ring holds, but never less than this): more than the sessions
/// one Rpc can hold with the default ring and credits, so a legitimate
/// client opening many sessions at once is never slowed.
pub(crate) const CONNECT_BURST_PER_SOURCE: u32 = 256;
/// Default refill of that burst, per second.
pub(crate) const CONNECTS_PER_SEC_PER_SOURCE: u32 = 128;
/// Default least credits a server grants an erpc-rs client's session
/// (`RpcConfig::min_session_credits`): a quarter of the default 32, so a
/// 4096-entry ring holds at most 512 sessions however few credits their
/// clients ask for.
pub const MIN_SESSION_CREDITS: usize = 8;
/// Default age after which a server session that never received a request
/// may be reclaimed when the RX ring is short.
pub(crate) const UNUSED_SESSION_RECLAIM_MS: u64 = 10_000;
/// Default stall bound: a client request that got nothing back for this
/// long (no credit return, response packet or "in progress" notice; time
/// in which the client's own event loop did not run is not counted) fails
/// with its session (`RpcConfig::stall_timeout_ms`). An erpc-rs server
/// answers a retransmitted request whose handler still runs with an "in
/// progress" notice, so a slow handler there never reaches the bound; a
/// C++ eRPC server cannot, so toward one this is the longest a handler may
/// take.
pub const STALL_TIMEOUT_MS: u64 = 10_000;
/// Default idle time after which a served server session of an erpc-rs
/// client may be reclaimed when the RX ring is short.
pub(crate) const IDLE_SESSION_RECLAIM_MS: u64 = 60_000;
/// Tries of a TX batch the transport keeps refusing (with a TX flush
/// between tries) before the oldest queued packet is given up to loss
/// recovery (counted in `RpcStats::tx_given_up`).
pub(crate) const TX_REFUSED_TRIES: usize = 8;

const _: () = assert!(MTU == 1024 && PKTHDR_BYTES == 56 && MAX_DATA_PER_PKT == 968);
const _: () = assert!(MAX_MSG_BYTES == 7_903_368, "the C++ eRPC's kMaxMsgSize");
const _: () = assert!(MAX_MSG_BYTES < (1 << MSG_SIZE_BITS));
// A request and its response share one packet-number space:
// response packet i carries number (request packets - 1) + i.
const _: () = assert!(2 * MAX_MSG_PKTS - 1 <= (1 << PKT_NUM_BITS));
// Slot = request number mod window: the window must be a power of two.
const _: () = assert!(SESSION_REQ_WINDOW.is_power_of_two());
// A msgbuf of the largest message (first header, data, later headers) fits
// the 8 MiB size class.
const _: () = assert!(
    PKTHDR_BYTES + MAX_MSG_BYTES.next_multiple_of(8) + (MAX_MSG_PKTS - 1) * PKTHDR_BYTES
        <= (8 << 20)
);
const _: () = assert!((8 << 20) <= mempool::MAX_ALLOC);
const _: () = assert!(SESSION_CREDITS <= RX_RING_ENTRIES_DEFAULT);
const _: () = assert!(MAX_TX_BATCH <= CTRL_BUFS);
const _: () = assert!(MAX_RPC_ID < u8::MAX);
const _: () = assert!(PKT_LOSS_SCAN_US < RTO_US);
const _: () = assert!(RTO_US < FAILURE_TIMEOUT_MS * 1000);
// A request waits through many retransmissions before it stalls.
const _: () = assert!(STALL_TIMEOUT_MS * 1000 >= 100 * RTO_US);
const _: () =
    assert!(CONNECT_BURST_PER_SOURCE as usize >= RX_RING_ENTRIES_DEFAULT / SESSION_CREDITS);
// A client retries a connect for the failure timeout: an unused session
// is never reclaimed before its client could have used it.
const _: () = assert!(UNUSED_SESSION_RECLAIM_MS >= 10 * FAILURE_TIMEOUT_MS);
