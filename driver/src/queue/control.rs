//! The control side reached from the datapath (event-queue service, debug
//! publication), the accessors, and the software and hardware snapshots.

use crate::error::Error;
use crate::hw::HwBackend;

use super::{HwQueueState, QueueConfig, QueueSet, QueueSnapshot, QueueStats};

impl<B: HwBackend> QueueSet<B> {
    /// Keeps the device's control side alive from the datapath: call it
    /// once per event-loop iteration (the mlx5 transport does, in its
    /// `rx_burst`). Every `control_interval` calls it services the event
    /// queue — answers firmware page requests (which arrive at any time,
    /// not only while a command runs), records CQ errors and port changes,
    /// and publishes the EQ consumer index before the 256-entry EQ can
    /// overrun (a fatal health condition) — and, if the device exposes the
    /// debug endpoint and a client asked, publishes this queue set's
    /// software state. It never waits: if another thread holds the control
    /// lock, it leaves the work to it. Returns true if it serviced the
    /// queue.
    #[inline]
    pub fn poll_control(&mut self) -> bool {
        self.control_countdown -= 1;
        if self.control_countdown != 0 {
            return false;
        }
        self.control_countdown = self.cfg.control_interval;
        self.service_control()
    }

    #[cold]
    fn service_control(&mut self) -> bool {
        self.inspect_if_wanted();
        let dev = &self.dev;
        let mut ctl = match dev.ctl.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.stats.control_busy += 1;
                return false;
            }
        };
        self.stats.control_services += 1;
        if let Err(e) = ctl.service(&dev.bar, &dev.pool) {
            self.stats.control_errors += 1;
            tracing::error!(device = %dev.info.name, error = %e, "event queue service failed");
        }
        true
    }

    /// Settings in effect (the unsignaled batch may have been clamped).
    pub fn config(&self) -> QueueConfig {
        QueueConfig {
            unsignaled_batch: self.sq.batch,
            ..self.cfg
        }
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The device's MAC (source of our frames).
    pub fn mac(&self) -> [u8; 6] {
        self.dev.info.mac
    }

    /// Whether frames carry the L2 header inline.
    pub fn inlines_l2(&self) -> bool {
        self.inline
    }

    /// Software state, cheap (no command).
    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot {
            device: self.dev.info.name.clone(),
            udp_port: self.cfg.udp_port,
            sqn: self.sq.sqn,
            rqn: self.rq.rqn,
            tx_cqn: self.tx_cq.cqn,
            rx_cqn: self.rx_cq.cqn,
            tisn: self.tisn,
            tirn: self.tirn,
            uar: self.uar,
            flow_index: self.flow_index,
            counter_set_id: self.counter_set_id,
            sq_pi: self.sq.pi,
            sq_ci: self.sq.ci,
            sq_unsignaled: self.sq.since_signal,
            sq_signaled_outstanding: self.sq.signaled.is_some(),
            sq_error: self.sq.error,
            tx_cq_ci: self.tx_cq.ci,
            tx_last_cqe: self.tx_cq.last,
            rq_head: self.rq.head,
            rx_recv_head: self.rq.recv_head,
            rx_to_post: self.rq.to_post,
            rx_cqe_idx: self.rx_cq.idx,
            rx_prev_position: self.rx_cq.prev,
            rx_wqe_id_mode: self.rx_cq.mode,
            stats: self.stats,
        }
    }

    /// Hardware's view: QUERY_SQ, QUERY_RQ, QUERY_CQ ×2, QUERY_Q_COUNTER.
    /// Several commands; never call it on the datapath.
    pub fn query_hw(&self) -> Result<HwQueueState, Error> {
        crate::inspect::query_objects(&self.dev, &self.inspect_ids())
    }
}
