//! mlx5 userspace driver.
//!
//! * [`prm`]: every hardware structure (checked against independent headers).
//! * [`hw`]: the backend trait (VFIO or the device model) the driver is generic over.
//! * [`barrier`]: memory barriers named by purpose.
//!
//! Unsafe code lives only in `barrier` (fence instructions), `dma` (access to
//! memory the device reads and writes) and `vfio` (ioctls and BAR mappings).

pub mod barrier;
pub mod hw;
pub mod prm;
pub mod vfio;
