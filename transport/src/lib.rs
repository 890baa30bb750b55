//! Packet transports for eRPC.
//!
//! eRPC sits on an unreliable, bursty packet interface: [`Transport`].
//! Two implementations (each in its own module):
//!
//! * `mlx5`: raw Ethernet/IPv4/UDP frames on the `mlx5` driver's queue set
//!   (striding RQ, overrunning RX CQ, unsignaled TX, doorbell batching),
//!   generic over the hardware backend (VFIO or the device model).
//! * `udp`: kernel UDP sockets (`recvfrom` while datagrams come one at a
//!   time, `recvmmsg` for bursts; `sendto` for a lone datagram, UDP GSO
//!   for a run to one peer, `sendmmsg` otherwise), so the same
//!   application runs on any Linux machine.
//!
//! The wire format (Ethernet/IPv4/UDP in front of the 14-byte eRPC header,
//! frames of at most 1024 bytes) and the routing info exchanged in session
//! management are in [`wire`]; they are shared by every transport.
//!
//! # Zero copy
//! A message buffer reserves [`PKTHDR_BYTES`] bytes in front of every
//! packet's data: [`HEADROOM_BYTES`] for the Ethernet/IPv4/UDP header and
//! then the eRPC header. eRPC asks the transport to fill the headroom
//! ([`Transport::fill_headroom`]) and hands it [`TxItem`]s that point into
//! the message buffer; the mlx5 transport gathers them by IOVA, the UDP
//! transport by virtual address. Received packets stay in the transport's
//! RX ring until eRPC gives their slots back with [`Transport::post_recvs`];
//! [`RxRing`] reads them without borrowing the transport, so a dispatch
//! handler can look at its request in the ring while the event loop keeps
//! sending.
//!
//! # Who may write a ring slot, and when
//! A slot the application holds (reported by `rx_burst`, not yet given
//! back) is never written by the NIC or the kernel. The type system keeps
//! every packet slice inside that window, at no run-time cost per packet:
//!
//! * a transport hands out its RX ring handle once
//!   ([`Transport::take_rx_ring`]); the handle is not `Clone`;
//! * [`RxRing::packet`] borrows the handle, so the slice lives no longer
//!   than that borrow;
//! * [`Transport::post_recvs`], the only way to give slots back, needs the
//!   handle *mutably*, so the compiler rejects any call while a packet
//!   slice is alive; it checks (once per call, not per packet) that the
//!   handle is its own;
//! * `packet` returns `None` for a slot the application does not hold.
//!
//! The one thing left to the caller is logic, not memory safety: reading
//! only the slots that `rx_burst` reported as new.
//!
//! # Talking to C++ eRPC peers
//! Both transports advertise routing info a C++ peer can use (real MAC,
//! RX queue 0, RSS table size 1: they steer by exact UDP port) and, when a
//! peer uses RSS, pick the UDP source port the way C++ does ([`rss`]).

use std::fmt;

pub mod mlx5;
pub mod pcap;
pub mod rss;
mod txitem;
pub mod udp;
pub mod wire;

pub use txitem::TxItem;

pub use wire::{
    ERPC_HDR_BYTES, FrameError, HEADROOM_BYTES, MAX_DATA_PER_PKT, MTU, PKTHDR_BYTES,
    ROUTING_INFO_BYTES, RoutingInfo,
};

/// Read access to a transport's RX ring, independent of the transport's
/// borrow. There is one handle per transport ([`Transport::take_rx_ring`]),
/// and giving slots back ([`Transport::post_recvs`]) borrows it mutably:
/// a packet slice, which borrows the handle, cannot outlive its slot.
///
/// The receive loop, with the transport used mutably (to send) while
/// packets are read in place:
///
/// ```
/// use transport::udp::{UdpConfig, UdpTransport};
/// use transport::{RxRing, Transport};
///
/// let mut t = UdpTransport::new(&UdpConfig::loopback())?;
/// let mut ring = t.take_rx_ring().expect("the first call hands it out");
/// let mut head = 0;
/// let n = t.rx_burst();
/// for k in 0..n {
///     if let Some(pkt) = ring.packet((head + k) % ring.entries()) {
///         t.tx_flush(); // the transport is free to use meanwhile
///         let _ = pkt[0];
///     }
/// }
/// head += n;
/// t.post_recvs(&mut ring, n);
/// # let _ = head;
/// # Ok::<(), transport::TransportError>(())
/// ```
///
/// Keeping a packet across `post_recvs`, after which the kernel or the NIC
/// may refill its slot, does not compile:
///
/// ```compile_fail,E0502
/// use transport::udp::{UdpConfig, UdpTransport};
/// use transport::{RxRing, Transport};
///
/// let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
/// let mut ring = t.take_rx_ring().unwrap();
/// let n = t.rx_burst();
/// let kept = ring.packet(0);
/// t.post_recvs(&mut ring, n);
/// println!("{kept:?}");
/// ```
pub trait RxRing {
    /// Number of slots.
    fn entries(&self) -> usize;

    /// The packet in ring slot `idx`, from the eRPC header to the end of the
    /// data. `None` if the frame in that slot is malformed (the transport
    /// has counted the reason), or if the application does not hold the
    /// slot (never reported by `rx_burst`, or already given back), or if
    /// `idx` is out of range.
    fn packet(&self, idx: usize) -> Option<&[u8]>;
}

/// Why a transport could not be created or a route resolved.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Routing info from a peer cannot be used.
    #[error("cannot resolve routing info {info}: {why}")]
    Resolve {
        /// The peer's routing info.
        info: RoutingInfo,
        /// Why.
        why: String,
    },
    /// An OS call failed (socket, bind, ...).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with addresses.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The driver or device refused.
    #[error("{0}")]
    Device(String),
}

/// Drop and error counters every transport keeps (each drop by reason).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Packets handed to the NIC / kernel.
    pub tx_pkts: u64,
    /// Bytes handed to the NIC / kernel (whole frames).
    pub tx_bytes: u64,
    /// Packets dropped on purpose (`TxItem::drop`).
    pub tx_dropped_on_purpose: u64,
    /// Packets the kernel or NIC refused to send (malformed, or a send
    /// error): not sent.
    pub tx_errors: u64,
    /// Packets not accepted by `tx_burst` because the send queue was full;
    /// the caller still has them (and retries).
    pub tx_refused: u64,
    /// Doorbells rung / send syscalls made.
    pub tx_doorbells: u64,
    /// Packets received (including malformed ones).
    pub rx_pkts: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames shorter than the headers they claim.
    pub rx_short: u64,
    /// Frames that are not IPv4.
    pub rx_bad_ethertype: u64,
    /// IPv4 header invalid (version, IHL, total length, checksum, fragments).
    pub rx_bad_ip: u64,
    /// Not UDP, or UDP length inconsistent with the IP length.
    pub rx_bad_udp: u64,
    /// Frames for another MAC / port that reached us anyway.
    pub rx_not_for_us: u64,
    /// Frames larger than the MTU.
    pub rx_oversize: u64,
    /// Receive calls that failed.
    pub rx_errors: u64,
    /// Frames accepted although their IPv4 header checksum was 0 (not
    /// computed by the sender, as the C++ raw transport sends them). Also
    /// counted in `rx_pkts`; a transport configured to refuse them counts
    /// them in `rx_bad_ip` instead.
    pub rx_ip_csum_zero: u64,
    /// Frames accepted whose IPv4 header checksum the NIC had verified
    /// (mlx5 CQE `l3_ok`), so it was not recomputed. Also counted in
    /// `rx_pkts`; always 0 on the UDP transport (the kernel checks).
    pub rx_ip_csum_hw: u64,
}

/// An unreliable packet transport with bursty, zero-copy TX and RX.
///
/// eRPC is generic over it (static dispatch). All methods are called from
/// the owning Rpc's thread; none blocks.
pub trait Transport {
    /// A peer's routing info, resolved into what TX needs (a prebuilt
    /// header, a socket address).
    type Route: Clone + fmt::Debug;
    /// Handle for reading the RX ring.
    type Ring: RxRing;

    /// Largest frame, all headers included ([`MTU`] for both transports).
    fn mtu(&self) -> usize {
        MTU
    }

    /// Largest data per packet ([`MAX_DATA_PER_PKT`]).
    fn max_data_per_pkt(&self) -> usize {
        MAX_DATA_PER_PKT
    }

    /// The routing info peers need to reach this transport.
    fn local_routing_info(&self) -> RoutingInfo;

    /// Turns a peer's routing info into a route. Called when a session is
    /// set up, never on the datapath: it may create OS resources (the UDP
    /// transport's send socket on a peer's RSS source port). Routing info
    /// comes from the network: anything unusable is an error, never a
    /// panic (an RSS table size of 0 included).
    fn resolve(&self, info: &RoutingInfo) -> Result<Self::Route, TransportError>;

    /// Writes the Ethernet/IPv4/UDP header for a frame of `frame_len` bytes
    /// to `route` into `headroom` (exactly [`HEADROOM_BYTES`] long). A
    /// transport that does not send raw frames leaves it alone.
    fn fill_headroom(&self, route: &Self::Route, headroom: &mut [u8], frame_len: usize);

    /// Sends a burst of packets (at most [`Transport::tx_burst_max`]). Never
    /// blocks; returns how many were accepted (all, unless the transport's
    /// queue is full, which the caller must treat as a transient drop).
    fn tx_burst(&mut self, items: &[TxItem<'_, Self::Route>]) -> usize;

    /// Largest burst `tx_burst` takes at once (the postlist, 16 for mlx5).
    fn tx_burst_max(&self) -> usize;

    /// Whether a round trip through this transport is the network's: a
    /// NIC's datapath, where delay beyond the base RTT means queues in
    /// switches (true, the default). False for a host software stack
    /// (kernel sockets), whose own socket queues and system calls add tens
    /// to hundreds of µs under load without any network congestion. eRPC's
    /// delay-based congestion control runs by default only where this is
    /// true (`erpc::cc::CcConfig::on_software_stack`).
    fn rtt_is_network(&self) -> bool {
        true
    }

    /// Returns once every packet handed to `tx_burst` has left host memory,
    /// so the buffers may be reused. The rare path.
    fn tx_flush(&mut self);

    /// The most sends this transport may still hold without having read
    /// their bytes, after `tx_burst` returned (a NIC's send queue: the
    /// mlx5 transport's WQEs; 0 for a transport that copies at
    /// `tx_burst`). Memory a queued send refers to may be rewritten only
    /// after this many later sends, or a `tx_flush` (eRPC sizes its
    /// ring of control-packet headers from it).
    fn tx_depth(&self) -> usize {
        0
    }

    /// Checks for new packets: returns how many arrived. They are in ring
    /// slots `head, head+1, ...` (mod [`RxRing::entries`]) where `head` is
    /// the sum of all previous `rx_burst` results.
    fn rx_burst(&mut self) -> usize;

    /// Whether the last `rx_burst` may have left packets behind: `false`
    /// when it took everything the transport held at that moment (a
    /// receive that came back short). A hint for a caller that wants to
    /// drain the transport (eRPC does before its loss scan) without one
    /// more poll to learn that nothing is left, which over kernel UDP is a
    /// system call. The default, `true`, is always safe: the caller polls
    /// until `rx_burst` returns 0.
    fn rx_may_hold_more(&self) -> bool {
        true
    }

    /// Gives the `n` oldest held ring slots back for reuse. `ring` is this
    /// transport's ring handle, borrowed mutably so that no packet slice
    /// read from it is still alive.
    ///
    /// # Panics
    /// If `ring` belongs to another transport, or `n` is more than the
    /// slots the application holds.
    fn post_recvs(&mut self, ring: &mut Self::Ring, n: usize);

    /// The RX ring reader: `Some` on the first call, `None` after (the
    /// handle is unique; see [`RxRing`]).
    fn take_rx_ring(&mut self) -> Option<Self::Ring>;

    /// Counters.
    fn stats(&self) -> TransportStats;
}
