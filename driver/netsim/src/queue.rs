//! The switch's output queue towards one port: a FIFO served at the port's
//! link rate, holding at most `buffer_bytes` (drop-tail), with occupancy
//! counters and an optional trace over time.
//!
//! The queue is exact for a FIFO with a constant-rate server: when a frame
//! arrives its departure is known (after everything queued before it), so
//! the queue keeps, per frame, the time its last bit leaves, and its
//! occupancy at any time is the frames that have not left yet.

use std::collections::VecDeque;

use crate::link::{PortConfig, serialization_ps};

/// Occupancy and drop counters of one output queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The buffer size (`None`: unlimited).
    pub capacity_bytes: Option<u64>,
    /// Bytes queued now (frames whose last bit has not left).
    pub bytes: u64,
    /// Frames queued now.
    pub frames: u64,
    /// Most bytes ever queued at once.
    pub max_bytes: u64,
    /// Most frames ever queued at once.
    pub max_frames: u64,
    /// Frames dropped because the buffer was full (drop-tail).
    pub drops: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
    /// Frames accepted into the queue.
    pub enqueued: u64,
    /// Their bytes.
    pub enqueued_bytes: u64,
}

/// The queue at one moment: after a frame was accepted, or when one was
/// dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSample {
    /// Network time of the arrival.
    pub time_ns: u64,
    /// Bytes queued after it (unchanged when dropped).
    pub bytes: u64,
    /// Frames queued after it.
    pub frames: u64,
    /// The arriving frame was dropped (the buffer was full).
    pub dropped: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Egress {
    /// (time its last bit leaves, in ps; length) per queued frame, oldest
    /// first.
    fifo: VecDeque<(u64, u32)>,
    bytes: u64,
    /// When the link is free again, in ps.
    busy_ps: u64,
    stats: QueueStats,
    trace: Vec<QueueSample>,
    trace_cap: usize,
}

/// What the queue did with an arriving frame.
pub(crate) enum Admit {
    /// Accepted; its last bit leaves at this time (ps).
    Leaves(u64),
    /// Dropped: the buffer is full.
    Full,
}

impl Egress {
    fn drain(&mut self, t_ps: u64) {
        while let Some(&(end, len)) = self.fifo.front() {
            if end > t_ps {
                break;
            }
            self.fifo.pop_front();
            self.bytes -= u64::from(len);
        }
    }

    fn sample(&mut self, time_ns: u64, dropped: bool) {
        if self.trace.len() < self.trace_cap {
            self.trace.push(QueueSample {
                time_ns,
                bytes: self.bytes,
                frames: self.fifo.len() as u64,
                dropped,
            });
        }
    }

    /// A frame of `len` bytes arrives at `t_ns`.
    pub(crate) fn admit(&mut self, cfg: &PortConfig, t_ns: u64, len: usize) -> Admit {
        let t_ps = t_ns.saturating_mul(1000);
        self.drain(t_ps);
        if let Some(cap) = cfg.buffer_bytes
            && self.bytes + len as u64 > cap
        {
            self.stats.drops += 1;
            self.stats.dropped_bytes += len as u64;
            self.sample(t_ns, true);
            return Admit::Full;
        }
        let end = t_ps.max(self.busy_ps) + serialization_ps(len, cfg.rate_bps);
        self.busy_ps = end;
        self.fifo.push_back((end, len as u32));
        self.bytes += len as u64;
        let s = &mut self.stats;
        s.enqueued += 1;
        s.enqueued_bytes += len as u64;
        s.max_bytes = s.max_bytes.max(self.bytes);
        s.max_frames = s.max_frames.max(self.fifo.len() as u64);
        self.sample(t_ns, false);
        Admit::Leaves(end)
    }

    /// Counters, with the occupancy at `now_ns`.
    pub(crate) fn stats(&self, cfg: &PortConfig, now_ns: u64) -> QueueStats {
        let t_ps = now_ns.saturating_mul(1000);
        let (mut bytes, mut frames) = (0, 0);
        for &(end, len) in self.fifo.iter().rev() {
            if end <= t_ps {
                break;
            }
            bytes += u64::from(len);
            frames += 1;
        }
        QueueStats {
            capacity_bytes: cfg.buffer_bytes,
            bytes,
            frames,
            ..self.stats
        }
    }

    pub(crate) fn set_trace(&mut self, capacity: usize) {
        self.trace_cap = capacity;
        self.trace.clear();
        self.trace.reserve(capacity.min(1 << 16));
    }

    pub(crate) fn trace(&self) -> &[QueueSample] {
        &self.trace
    }

    /// Forgets the counters and the trace (the queue itself stays).
    pub(crate) fn reset_stats(&mut self) {
        self.stats = QueueStats::default();
        self.trace.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_fills_at_the_rate_difference_and_drops_at_its_size() {
        // 1 Gbit/s: a 1000-byte frame (1024 on the wire) takes 8192 ns.
        let cfg = PortConfig::new(1_000_000_000, 3000);
        let mut q = Egress::default();
        q.set_trace(16);
        // Four frames arrive at once: three fit, the fourth is dropped.
        for _ in 0..3 {
            assert!(matches!(q.admit(&cfg, 0, 1000), Admit::Leaves(_)));
        }
        assert!(matches!(q.admit(&cfg, 0, 1000), Admit::Full));
        let s = q.stats(&cfg, 0);
        assert_eq!(
            (s.bytes, s.frames, s.max_bytes, s.drops),
            (3000, 3, 3000, 1)
        );
        // After one serialisation time, one frame has left.
        assert_eq!(q.stats(&cfg, 8192).frames, 2);
        match q.admit(&cfg, 8192, 1000) {
            Admit::Leaves(end) => assert_eq!(end, 4 * 8_192_000),
            Admit::Full => panic!("room for one"),
        }
        assert_eq!(q.stats(&cfg, 100_000).bytes, 0);
        assert_eq!(q.trace().len(), 5);
        assert!(q.trace()[3].dropped);
    }
}
