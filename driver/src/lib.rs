//! mlx5 userspace driver.
//!
//! * [`prm`]: every hardware structure (checked against independent headers).
//! * [`hw`]: the backend trait (VFIO or the device model) the driver is generic over.
//! * [`Device`]: bring-up, the polled EQ, firmware pages, health, teardown.
//! * [`QueueSet`]: one thread's SQ + TX CQ, striding RQ + overrunning RX CQ,
//!   TIR, TIS and flow rule, with the doorbell-batched datapath.
//! * [`barrier`]: memory barriers named by purpose.
//! * [`inspect`]: what a device and its queue sets show on the debug
//!   endpoint (`erpc-inspect`), and descriptor decoders.
//!
//! Unsafe code lives only in `barrier` (fence instructions), `dma` (access to
//! memory the device reads and writes) and `vfio` (ioctls and BAR mappings).

pub mod bar;
pub mod barrier;
pub mod cmd;
pub mod device;
pub mod dma;
pub mod eq;
pub mod error;
pub mod hw;
pub mod inspect;
pub mod pages;
pub mod prm;
pub mod queue;
pub mod vfio;

pub use device::{
    Device, DeviceConfig, DeviceInfo, FuncId, Health, InlineMode, MAX_RX_FRAME, MacIfUnset,
    VPORT_MTU,
};
pub use error::{Error, HealthProblem};
pub use queue::{
    Gather, HwQueueState, QueueConfig, QueueSet, QueueSnapshot, QueueStats, RxCqeFlags, RxRingView,
    RxWqeIdMode, TxFrame,
};
