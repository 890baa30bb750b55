//! What a real ConnectX does that the device model once let pass: one
//! test per finding of the review against rdma-core, DPDK and the Linux and
//! FreeBSD mlx5 drivers (issue 13). Each test fails on the driver's
//! earlier behaviour because the model now behaves like the hardware.

mod common;

use std::time::Duration;

use common::*;
use mlx5::Device;
use mlx5_sim::{HcaState, NicConfig, SimNic};

fn nic_with(fab: &mlx5_sim::Fabric, i: u8, cfg: NicConfig) -> SimNic {
    SimNic::new(fab, NicConfig { mac: mac(i), ..cfg })
}

/// Item 5: the firmware comes out of reset with `initializing` set and
/// ignores the command queue address until it clears; the driver waits
/// first (as the kernel does before `mlx5_cmd_init`), then programs the
/// queue and waits again.
#[test]
fn driver_waits_for_the_firmware_before_programming_the_command_queue() {
    let fab = fabric(50);
    let nic = nic_with(
        &fab,
        1,
        NicConfig {
            reset_init_delay: Duration::from_millis(50),
            fw_init_delay: Duration::from_millis(5),
            ..Default::default()
        },
    );
    let dev = Device::open(nic.backend(), device_config()).expect("bring-up");
    assert_eq!(nic.hca_state(), HcaState::Initialized);
    assert_eq!(
        nic.stats().cmdq_writes_ignored,
        0,
        "the command queue was programmed only after initializing cleared"
    );
    assert!(fab.now_ns() >= 55_000_000, "both waits were taken");
    dev.close().unwrap();
}
