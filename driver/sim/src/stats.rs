//! Counters and introspection snapshots: per NIC, per queue, drop reasons,
//! object tables.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dma::IommuStats;

/// Why a received frame was not delivered into a receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The port's link is down.
    LinkDown,
    /// Shorter than 60 bytes (64 with the FCS): a runt, dropped by the MAC.
    Runt,
    /// Longer than the port MTU allows (MTU + 18 bytes of L2 header).
    Oversize,
    /// Vport MAC filter (only with `NicConfig::vport_mac_filter`).
    VportFilter,
    /// The e-switch does not forward this unicast MAC to the function: not
    /// in a VF's vport address list, or not in a PF's MPFS L2 table.
    Eswitch,
    /// No root NIC RX flow table is set.
    NoSteeringRoot,
    /// No flow table entry matched (table miss).
    FlowMiss,
    /// The matching entry's action is drop.
    FlowDrop,
    /// Local loopback blocked by the TIR's `self_lb_block` or the vport's
    /// `disable_*_local_lb`.
    SelfLoopback,
    /// The RQ is not in RDY.
    RqNotReady,
    /// No WQE posted (also counted in the RQ's Q counter `out_of_buffer`).
    OutOfBuffer,
    /// Larger than a whole receive WQE.
    PacketTooLarge,
    /// The RQ's CQ is in error (overrun) or could not be written.
    CqError,
    /// A DMA access of the receive path faulted.
    DmaFault,
    /// The receive WQE was invalid (bad lkey, protection); the RQ moved to
    /// error.
    RqWqeError,
    /// The HCA is not initialized (or the function is disabled).
    HcaDown,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 16] = [
        DropReason::LinkDown,
        DropReason::Runt,
        DropReason::Oversize,
        DropReason::VportFilter,
        DropReason::Eswitch,
        DropReason::NoSteeringRoot,
        DropReason::FlowMiss,
        DropReason::FlowDrop,
        DropReason::SelfLoopback,
        DropReason::RqNotReady,
        DropReason::OutOfBuffer,
        DropReason::PacketTooLarge,
        DropReason::CqError,
        DropReason::DmaFault,
        DropReason::RqWqeError,
        DropReason::HcaDown,
    ];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::LinkDown => "link down",
            DropReason::Runt => "runt (under 60 bytes)",
            DropReason::Oversize => "longer than the port MTU",
            DropReason::VportFilter => "vport MAC filter",
            DropReason::Eswitch => "e-switch: unicast MAC not programmed for the function",
            DropReason::NoSteeringRoot => "no root flow table",
            DropReason::FlowMiss => "flow table miss",
            DropReason::FlowDrop => "flow entry drop action",
            DropReason::SelfLoopback => "self loopback blocked",
            DropReason::RqNotReady => "RQ not ready",
            DropReason::OutOfBuffer => "out of buffer (no RQ WQE)",
            DropReason::PacketTooLarge => "packet larger than a receive WQE",
            DropReason::CqError => "CQ in error",
            DropReason::DmaFault => "DMA fault",
            DropReason::RqWqeError => "bad receive WQE",
            DropReason::HcaDown => "HCA not initialized",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

macro_rules! counters {
    ($(#[$m:meta])* pub struct $Snap:ident / $Atom:ident { $( $(#[$fm:meta])* $f:ident, )* }) => {
        #[derive(Debug, Default)]
        pub(crate) struct $Atom {
            $( pub(crate) $f: AtomicU64, )*
        }

        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $Snap {
            $( $(#[$fm])* pub $f: u64, )*
            /// Received frames dropped, by reason (every reason present).
            pub drops: Vec<(DropReason, u64)>,
            /// IOMMU counters (DMA faults, bytes moved).
            pub dma: IommuStats,
        }

        impl $Atom {
            pub(crate) fn snapshot(&self, drops: &[AtomicU64], dma: IommuStats) -> $Snap {
                $Snap {
                    $( $f: self.$f.load(Ordering::Relaxed), )*
                    drops: DropReason::ALL
                        .iter()
                        .zip(drops)
                        .map(|(r, c)| (*r, c.load(Ordering::Relaxed)))
                        .collect(),
                    dma,
                }
            }
        }
    };
}

/// Adds each count to its counter (skipping zeros): a batch's counts,
/// once at its end, instead of an atomic add per event.
pub(crate) fn add_counts<const N: usize>(counts: [(&AtomicU64, u64); N]) {
    for (counter, n) in counts {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
}

counters! {
    /// Counters of one device-model NIC.
    pub struct NicStats / Counters {
        /// 32/64-bit register writes.
        mmio_writes,
        /// Register reads.
        mmio_reads,
        /// Accesses to offsets that mean nothing (or misaligned, or to a UAR
        /// the function does not own): ignored.
        mmio_ignored,
        /// Writes of the command queue address while the firmware was
        /// still coming out of reset (`initializing` set): ignored, as the
        /// firmware does not accept the init segment yet.
        cmdq_writes_ignored,
        /// Command doorbell writes.
        cmd_doorbells,
        /// Command doorbells ignored (firmware initializing, no cmdq, entry
        /// not owned by hardware, interface disabled).
        cmd_doorbells_ignored,
        /// Commands executed.
        commands,
        /// Commands that completed with a non-zero status or delivery status.
        commands_failed,
        /// Send doorbells (8-byte writes to a bfreg).
        sq_doorbells,
        /// BlueFlame writes.
        bf_writes,
        /// BlueFlame writes whose bytes differ from the WQE in memory.
        bf_mismatches,
        /// BlueFlame writes through a BAR that is not write-combining: they
        /// arrive as separate stores, and the NIC takes them as a plain
        /// doorbell (the WQE is fetched from memory).
        bf_uncombined,
        /// Send doorbells ignored (unknown SQ, wrong UAR, SQ in RST).
        sq_doorbells_ignored,
        /// EQ doorbells.
        eq_doorbells,
        /// CQ arm doorbells.
        cq_arm_doorbells,
        /// Send WQEs processed (including NOPs and flushed ones).
        wqes,
        /// Frames sent.
        tx_frames,
        /// Bytes sent.
        tx_bytes,
        /// Frames looped back inside the NIC.
        loopback_frames,
        /// Send CQEs written (success).
        tx_cqes,
        /// Deferred gather ([`crate::DeferredTx`]): held WQEs read after
        /// their doorbell.
        tx_deferred_reads,
        /// Deferred gather: sends whose gathered bytes changed between the
        /// doorbell and the read (a buffer reused before a CQE covered it).
        tx_deferred_mismatches,
        /// Deferred gather: sends whose memory key or IOMMU mapping was
        /// gone at the read.
        tx_deferred_faults,
        /// Error CQEs written (send and receive, including flushes).
        error_cqes,
        /// Frames that arrived at the port.
        rx_frames,
        /// Frames delivered into a receive queue.
        rx_delivered,
        /// Bytes delivered.
        rx_bytes,
        /// Receive CQEs written (including fillers).
        rx_cqes,
        /// Filler CQEs written.
        filler_cqes,
        /// EQEs written.
        eqes,
        /// Events lost because an EQ was full (async EQ overrun).
        eq_overruns,
        /// CQ overruns (non-overrun-ignore CQs that filled up).
        cq_overruns,
        /// Completion events the model would have signalled (armed EQ got
        /// an EQE); interrupts themselves are not modeled.
        interrupts,
        /// Pages the driver gave and has not taken back.
        pages_held,
        /// Pages still held when the function was disabled (leaked).
        pages_leaked,
        /// Objects destroyed implicitly by TEARDOWN_HCA/DISABLE_HCA (the
        /// driver should have destroyed them).
        objects_leaked,
    }
}

/// State of an SQ or RQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqState {
    /// Reset.
    Rst,
    /// Ready.
    Rdy,
    /// Error.
    Err,
}

impl WqState {
    /// PRM encoding.
    pub fn raw(self) -> u8 {
        match self {
            WqState::Rst => 0,
            WqState::Rdy => 1,
            WqState::Err => 3,
        }
    }

    /// From the PRM encoding.
    pub fn from_raw(v: u64) -> Option<WqState> {
        match v {
            0 => Some(WqState::Rst),
            1 => Some(WqState::Rdy),
            3 => Some(WqState::Err),
            _ => None,
        }
    }
}

/// An EQ, for introspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqInfo {
    /// EQ number.
    pub eqn: u32,
    /// Entries.
    pub entries: u32,
    /// EQEs written (producer counter).
    pub producer: u32,
    /// Consumer index from the last doorbell.
    pub consumer: u32,
    /// Armed.
    pub armed: bool,
    /// Subscribed event types (bit n = type n).
    pub event_mask: u64,
    /// Events lost to overrun.
    pub overruns: u64,
}

/// A CQ, for introspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CqInfo {
    /// CQ number.
    pub cqn: u32,
    /// Entries.
    pub entries: u32,
    /// CQEs written.
    pub producer: u32,
    /// Consumer index last read from the doorbell record.
    pub consumer: u32,
    /// Overrun ignore.
    pub overrun_ignore: bool,
    /// 0 OK, 9 overflow.
    pub status: u8,
    /// EQ for completion events.
    pub eqn: u32,
    /// CQEs dropped because the CQ was in error.
    pub dropped: u64,
}

/// An SQ, for introspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqInfo {
    /// SQ number.
    pub sqn: u32,
    /// State.
    pub state: WqState,
    /// WQEBBs in the ring.
    pub wqebbs: u32,
    /// Hardware consumer counter (WQEBBs, 16 bits).
    pub hw_counter: u16,
    /// Producer counter last read from the doorbell record.
    pub sw_counter: u16,
    /// CQ.
    pub cqn: u32,
    /// Doorbells rung for this SQ.
    pub doorbells: u64,
    /// WQEs processed.
    pub wqes: u64,
    /// CQEs written (including error CQEs).
    pub cqes: u64,
    /// Frames sent.
    pub frames: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Error CQEs written.
    pub errors: u64,
    /// The last error CQE's syndrome.
    pub last_error: Option<u8>,
}

/// An RQ, for introspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RqInfo {
    /// RQ number.
    pub rqn: u32,
    /// State.
    pub state: WqState,
    /// Striding (multi-packet) RQ.
    pub striding: bool,
    /// WQEs in the ring.
    pub wqes: u32,
    /// WQEs consumed (free-running; `& 0xffff` is the CQE `wqe_id`).
    pub hw_counter: u32,
    /// Producer counter last read from the doorbell record.
    pub sw_counter: u16,
    /// Next stride in the current WQE.
    pub stride_index: u32,
    /// CQ.
    pub cqn: u32,
    /// Packets delivered.
    pub packets: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Packets dropped for lack of a WQE.
    pub out_of_buffer: u64,
    /// Filler CQEs written.
    pub fillers: u64,
    /// CQEs written.
    pub cqes: u64,
}

/// Every queue of a NIC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queues {
    /// Event queues.
    pub eqs: Vec<EqInfo>,
    /// Completion queues.
    pub cqs: Vec<CqInfo>,
    /// Send queues.
    pub sqs: Vec<SqInfo>,
    /// Receive queues.
    pub rqs: Vec<RqInfo>,
}

/// How many objects of each kind a function holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// UARs.
    pub uars: usize,
    /// Protection domains.
    pub pds: usize,
    /// Transport domains.
    pub tds: usize,
    /// Memory keys.
    pub mkeys: usize,
    /// EQs.
    pub eqs: usize,
    /// CQs.
    pub cqs: usize,
    /// SQs.
    pub sqs: usize,
    /// RQs.
    pub rqs: usize,
    /// TISes.
    pub tises: usize,
    /// TIRs.
    pub tirs: usize,
    /// Flow tables.
    pub flow_tables: usize,
    /// Flow groups.
    pub flow_groups: usize,
    /// Flow table entries.
    pub flow_entries: usize,
    /// Q counter sets.
    pub q_counters: usize,
    /// MPFS L2 table entries.
    pub l2_entries: usize,
    /// A root NIC RX table is set.
    pub root_set: bool,
}

impl ObjectCounts {
    /// Total objects (the root pointer not counted).
    pub fn total(&self) -> usize {
        self.uars
            + self.pds
            + self.tds
            + self.mkeys
            + self.eqs
            + self.cqs
            + self.sqs
            + self.rqs
            + self.tises
            + self.tirs
            + self.flow_tables
            + self.flow_groups
            + self.flow_entries
            + self.q_counters
            + self.l2_entries
    }
}
