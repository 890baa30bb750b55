//! Queue-set settings and their checks against what the device can do.

use crate::device::Inner;
use crate::error::Error;
use crate::hw::HwBackend;

/// Queue-set settings (eRPC's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// UDP destination port steered to this queue set.
    pub udp_port: u16,
    /// log2 of the SQ size in 64-byte WQEBBs (7 = 128).
    pub sq_log_wqebbs: u8,
    /// One signaled WQE per this many (64).
    pub unsignaled_batch: u32,
    /// log2 of strides per RQ WQE (9 = 512).
    pub rq_log_strides: u8,
    /// log2 of the stride size (10 = 1 KiB, one frame per stride).
    pub rq_log_stride_bytes: u8,
    /// log2 of RQ WQEs (3 = 8, so 4096 ring entries).
    pub rq_log_wqes: u8,
    /// log2 of RX CQEs (3 = 8, overrun ignored).
    pub rx_cq_log_size: u8,
    /// Use BlueFlame (copy the WQE into the doorbell register) for
    /// single-WQE bursts.
    pub blueflame: bool,
    /// [`QueueSet::poll_control`](super::QueueSet::poll_control) services the device's event queue once
    /// per this many calls.
    pub control_interval: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            udp_port: 31850,
            sq_log_wqebbs: 7,
            unsignaled_batch: 64,
            rq_log_strides: 9,
            rq_log_stride_bytes: 10,
            rq_log_wqes: 3,
            rx_cq_log_size: 3,
            blueflame: false,
            control_interval: 1024,
        }
    }
}

impl QueueConfig {
    /// RX ring entries (strides).
    pub fn rx_ring_entries(&self) -> usize {
        1 << (self.rq_log_strides + self.rq_log_wqes)
    }
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::Config(msg()))
    }
}

impl QueueConfig {
    /// Checks the settings against the device before anything is created:
    /// every limit the device reports, and what the datapath assumes (one
    /// frame per stride, at least one WQE per signaled batch).
    pub(super) fn validate<B: HwBackend>(&self, dev: &Inner<B>) -> Result<(), Error> {
        let cfg = self;
        let info = &dev.info;
        check(
            (6..=15).contains(&cfg.sq_log_wqebbs) && cfg.sq_log_wqebbs <= info.log_max_wq_sz,
            || {
                format!(
                    "sq_log_wqebbs {} outside 6..=min(15, log_max_wq_sz {})",
                    cfg.sq_log_wqebbs, info.log_max_wq_sz
                )
            },
        )?;
        let min_strides = if info.ext_stride_num_range { 3 } else { 9 };
        check((min_strides..=16).contains(&cfg.rq_log_strides), || {
            format!(
                "rq_log_strides {} outside {min_strides}..=16",
                cfg.rq_log_strides
            )
        })?;
        let log_wqe = u32::from(cfg.rq_log_strides) + u32::from(cfg.rq_log_stride_bytes);
        check(log_wqe >= u32::from(info.log_min_stride_wqe_sz), || {
            format!(
                "a striding RQ WQE of 2^{} strides of 2^{} bytes ({} KiB) is below the device's minimum WQE size of {} KiB (log_min_stride_wqe_sz {}): use more strides",
                cfg.rq_log_strides,
                cfg.rq_log_stride_bytes,
                (1u64 << log_wqe) >> 10,
                (1u64 << info.log_min_stride_wqe_sz) >> 10,
                info.log_min_stride_wqe_sz
            )
        })?;
        check((6..=13).contains(&cfg.rq_log_stride_bytes), || {
            format!(
                "rq_log_stride_bytes {} outside 6..=13",
                cfg.rq_log_stride_bytes
            )
        })?;
        check(
            1usize << cfg.rq_log_stride_bytes >= crate::device::MAX_RX_FRAME,
            || {
                format!(
                    "strides must hold a whole {}-byte frame (rq_log_stride_bytes >= 10): RX counting assumes one stride per packet, which the vport MTU guarantees only for such strides",
                    crate::device::MAX_RX_FRAME
                )
            },
        )?;
        check(
            (1..=info.log_max_wq_sz.min(10)).contains(&cfg.rq_log_wqes),
            || format!("rq_log_wqes {}", cfg.rq_log_wqes),
        )?;
        check(
            (1..=info.log_max_cq_sz.min(12)).contains(&cfg.rx_cq_log_size),
            || format!("rx_cq_log_size {}", cfg.rx_cq_log_size),
        )?;
        check(cfg.unsignaled_batch >= 1, || {
            "unsignaled_batch must be at least 1".into()
        })?;
        check(cfg.control_interval >= 1, || {
            "control_interval must be at least 1".into()
        })?;
        check(!cfg.blueflame || info.bf_reg_size >= 128, || {
            "BlueFlame requested but the device has none".into()
        })?;
        check(
            !cfg.blueflame || dev.bar.backend().bar_write_combining(),
            || {
                "BlueFlame needs BAR0 mapped write-combining; vfio-pci maps it uncached, so the 64-byte copy would reach the NIC as separate stores: leave `blueflame` off".into()
            },
        )?;
        Ok(())
    }
}
