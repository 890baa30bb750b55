//! mlx5 userspace driver.
//!
//! Will hold: the PRM layouts (`prm`), the hardware-backend trait, the VFIO
//! backend, HCA bring-up and teardown, queue sets (SQ/RQ/CQ/TIR/TIS), flow
//! steering and the doorbell datapath.

pub mod prm;
