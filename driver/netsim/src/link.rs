//! Links: what one direction of a port's cable does to a frame (faults and
//! propagation delay, [`LinkFaults`]) and how fast it carries it
//! ([`PortConfig::rate_bps`], with Ethernet's per-frame overhead).

use std::fmt;
use std::time::Duration;

/// A switch port (and the link and device behind it), numbered from 0 in
/// the order ports were added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(pub u32);

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port {}", self.0)
    }
}

/// Direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the port's device into the switch.
    ToSwitch,
    /// From the switch to the port's device.
    ToDevice,
}

/// What one direction of a link does to every frame, from the link's own
/// random stream. Probabilities are per frame, in `[0, 1]`.
///
/// Order of decisions for a frame: `down` (nothing is sent), then — after
/// the frame has been serialised onto the wire — `loss`, `fcs_error`,
/// `corrupt`, jitter, `reorder`, `duplicate`. A fault that is off draws
/// nothing from the link's random stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Probability that a frame is lost on the wire.
    pub loss: f64,
    /// Probability that a frame arrives twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by `reorder_delay` beyond its
    /// arrival time, so that later frames overtake it.
    pub reorder: f64,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
    /// Probability that a bit is flipped on the wire and the receiving
    /// port's frame check sequence catches it: the frame is dropped there
    /// and counted (`fcs_errors`), as every Ethernet MAC does. To the
    /// protocol above it is a lost frame.
    pub fcs_error: f64,
    /// Probability that one bit at or after byte `corrupt_from` is flipped
    /// *past* the frame check (a faulty switch or NIC buffer): the damaged
    /// frame is delivered (and counted as `corrupted`).
    pub corrupt: f64,
    /// First byte `corrupt` may damage (14: past the Ethernet header, so the
    /// switch still forwards the frame where it was going).
    pub corrupt_from: usize,
    /// Propagation delay of the link.
    pub delay: Duration,
    /// Extra random delay in `0..=jitter` per frame; frames keep their
    /// order on the link (a frame never arrives before one sent earlier)
    /// unless picked for reordering.
    pub jitter: Duration,
    /// Link down: every frame is dropped before it is sent (both ways of
    /// the port count it; devices can report the link state).
    pub down: bool,
}

impl Default for LinkFaults {
    fn default() -> Self {
        LinkFaults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(20),
            fcs_error: 0.0,
            corrupt: 0.0,
            corrupt_from: 14,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            down: false,
        }
    }
}

impl LinkFaults {
    /// No fault, no delay, link up: the frame crosses unchanged and at once.
    pub fn is_clean(&self) -> bool {
        self.loss <= 0.0
            && self.duplicate <= 0.0
            && self.reorder <= 0.0
            && self.fcs_error <= 0.0
            && self.corrupt <= 0.0
            && self.delay.is_zero()
            && self.jitter.is_zero()
            && !self.down
    }

    /// Only a fixed delay (no random draw is ever needed).
    pub(crate) fn is_fixed(&self) -> bool {
        self.loss <= 0.0
            && self.duplicate <= 0.0
            && self.reorder <= 0.0
            && self.fcs_error <= 0.0
            && self.corrupt <= 0.0
            && self.jitter.is_zero()
            && !self.down
    }
}

/// The physical side of a port: the speed of its link (the same both
/// ways, full duplex) and the switch's output buffer towards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortConfig {
    /// Link rate in bits per second; 0 is unlimited (a frame takes no time
    /// to send). Serialisation counts Ethernet's per-frame overhead, see
    /// [`wire_bytes`].
    pub rate_bps: u64,
    /// Bytes of frames the switch may hold for this port (drop-tail when
    /// full); `None` is unlimited. A frame occupies the buffer from its
    /// arrival at the switch until its last bit left on this port's link.
    pub buffer_bytes: Option<u64>,
}

impl Default for PortConfig {
    /// Unlimited rate and buffer: the network of tests that assume an
    /// infinitely fast fabric.
    fn default() -> Self {
        PortConfig {
            rate_bps: 0,
            buffer_bytes: None,
        }
    }
}

impl PortConfig {
    /// A port at `rate_bps` with a buffer of `buffer_bytes`.
    pub fn new(rate_bps: u64, buffer_bytes: u64) -> PortConfig {
        PortConfig {
            rate_bps,
            buffer_bytes: Some(buffer_bytes),
        }
    }

    /// Neither a rate nor a buffer limit: frames never queue.
    pub fn is_unlimited(&self) -> bool {
        self.rate_bps == 0 && self.buffer_bytes.is_none()
    }
}

/// Smallest Ethernet frame without its FCS; shorter frames are padded on
/// the wire.
pub const MIN_FRAME_BYTES: usize = 60;
/// Bytes on the wire per frame beyond the frame itself: preamble and start
/// delimiter (8), frame check sequence (4), inter-frame gap (12). Frames in
/// the model carry no FCS.
pub const WIRE_OVERHEAD_BYTES: usize = 24;

/// Bytes a frame of `len` bytes occupies on the wire (padding and
/// overhead included).
pub fn wire_bytes(len: usize) -> u64 {
    (len.max(MIN_FRAME_BYTES) + WIRE_OVERHEAD_BYTES) as u64
}

/// Picoseconds to serialise a frame of `len` bytes at `rate_bps` (0 when
/// the rate is unlimited).
pub fn serialization_ps(len: usize, rate_bps: u64) -> u64 {
    if rate_bps == 0 {
        return 0;
    }
    let bits = u128::from(wire_bytes(len)) * 8;
    (bits * 1_000_000_000_000).div_ceil(u128::from(rate_bps)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_counts_padding_and_overhead() {
        // 1000-byte frame at 10 Gbit/s: 1024 bytes on the wire = 819.2 ns.
        assert_eq!(serialization_ps(1000, 10_000_000_000), 819_200);
        // A 20-byte frame is padded to 60: 84 bytes = 67.2 ns.
        assert_eq!(serialization_ps(20, 10_000_000_000), 67_200);
        assert_eq!(serialization_ps(1000, 0), 0);
        assert!(LinkFaults::default().is_clean());
        assert!(PortConfig::default().is_unlimited());
    }
}
