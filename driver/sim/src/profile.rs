//! Named device profiles: the capability sets and behaviours of the
//! ConnectX generations (and function kinds) the driver must handle.
//!
//! Each profile is a [`NicConfig`] a test can start from
//! (`NicConfig { mac, ..Profile::ConnectX7Pf.config() }`). The values are
//! plausible for the named device, not measured on one: where the sources
//! (the kernel's mlx5_core, DPDK's mlx5 PMD, rdma-core) show that a
//! behaviour differs between devices or is not pinned down, the profiles
//! spread the alternatives over the devices so that the driver meets each
//! of them (see `README.md`, "Profiles").

use crate::nic::NicConfig;

/// A device the model can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// ConnectX-4 (0x1013) physical function: no striding RQ, so the
    /// driver refuses it.
    ConnectX4Pf,
    /// ConnectX-4 Lx (0x1015) physical function: L2 header always inline.
    ConnectX4LxPf,
    /// ConnectX-5 (0x1017) physical function (the default).
    ConnectX5Pf,
    /// ConnectX-5 virtual function (0x1018) behind a legacy SR-IOV e-switch.
    ConnectX5Vf,
    /// ConnectX-6 Dx (0x101d) physical function.
    ConnectX6DxPf,
    /// The VF of a ConnectX-6 Dx or ConnectX-7 (0x101e, "ConnectX family
    /// VF"), function 3, behind a legacy SR-IOV e-switch.
    ConnectX6DxVf,
    /// ConnectX-7 (0x1021) physical function: real-time timestamps only.
    ConnectX7Pf,
    /// BlueField-2 (0xa2d6) embedded-CPU function (ECPF, the Arm side's
    /// PF): says so in the init segment, must name itself as one, and is
    /// asked for the host PF's firmware pages too.
    BlueField2Ecpf,
}

impl Profile {
    /// Every profile.
    pub const ALL: &'static [Profile] = &[
        Profile::ConnectX4Pf,
        Profile::ConnectX4LxPf,
        Profile::ConnectX5Pf,
        Profile::ConnectX5Vf,
        Profile::ConnectX6DxPf,
        Profile::ConnectX6DxVf,
        Profile::ConnectX7Pf,
        Profile::BlueField2Ecpf,
    ];

    /// The profiles the driver supports (all but ConnectX-4 non-Lx, which
    /// has no striding RQ).
    pub const SUPPORTED: &'static [Profile] = &[
        Profile::ConnectX4LxPf,
        Profile::ConnectX5Pf,
        Profile::ConnectX5Vf,
        Profile::ConnectX6DxPf,
        Profile::ConnectX6DxVf,
        Profile::ConnectX7Pf,
        Profile::BlueField2Ecpf,
    ];

    /// Human-readable name.
    pub fn name(self) -> &'static str {
        match self {
            Profile::ConnectX4Pf => "ConnectX-4 PF",
            Profile::ConnectX4LxPf => "ConnectX-4 Lx PF",
            Profile::ConnectX5Pf => "ConnectX-5 PF",
            Profile::ConnectX5Vf => "ConnectX-5 VF",
            Profile::ConnectX6DxPf => "ConnectX-6 Dx PF",
            Profile::ConnectX6DxVf => "ConnectX-6 Dx / ConnectX-7 VF",
            Profile::ConnectX7Pf => "ConnectX-7 PF",
            Profile::BlueField2Ecpf => "BlueField-2 ECPF",
        }
    }

    /// The configuration (MAC 02:00:00:00:00:01; override it per NIC).
    pub fn config(self) -> NicConfig {
        let base = NicConfig::base();
        match self {
            Profile::ConnectX4Pf => NicConfig {
                device_id: 0x1013,
                fw_version: (12, 28, 2006),
                boot_pages: 64,
                init_pages: 3072,
                regular_pages: 1024,
                wqe_inline_mode: 0,
                striding_rq: false,
                ext_stride_num_range: false,
                log_min_stride_wqe_sz: None,
                ..base
            },
            Profile::ConnectX4LxPf => NicConfig {
                device_id: 0x1015,
                fw_version: (14, 32, 1010),
                wqe_id_mode: crate::nic::WqeIdMode::RingIndex,
                boot_pages: 64,
                init_pages: 3072,
                regular_pages: 1024,
                wqe_inline_mode: 0,
                ext_stride_num_range: false,
                log_min_stride_wqe_sz: None,
                ..base
            },
            Profile::ConnectX5Pf => base,
            Profile::ConnectX5Vf => NicConfig {
                device_id: 0x1018,
                vf: true,
                function_id: 1,
                eswitch: crate::nic::Eswitch::LegacyVf,
                // A VF gets few Q counters.
                limits: crate::nic::Limits {
                    max_q_counters: 2,
                    ..crate::nic::Limits::default()
                },
                boot_pages: 16,
                init_pages: 512,
                regular_pages: 256,
                ..base
            },
            Profile::ConnectX6DxPf => NicConfig {
                device_id: 0x101d,
                fw_version: (22, 39, 1002),
                wqe_id_mode: crate::nic::WqeIdMode::RingIndex,
                boot_pages: 128,
                init_pages: 8192,
                regular_pages: 2048,
                wqe_inline_mode: 2,
                reset_root_to_default: true,
                sq_ts_format: 2,
                rq_ts_format: 2,
                ..base
            },
            Profile::ConnectX6DxVf => NicConfig {
                device_id: 0x101e,
                fw_version: (22, 39, 1002),
                vf: true,
                function_id: 3,
                eswitch: crate::nic::Eswitch::LegacyVf,
                wqe_id_mode: crate::nic::WqeIdMode::RingIndex,
                boot_pages: 32,
                init_pages: 1024,
                regular_pages: 512,
                wqe_inline_mode: 2,
                reset_root_to_default: true,
                sq_ts_format: 2,
                rq_ts_format: 2,
                msix_vectors: 8,
                limits: crate::nic::Limits {
                    max_q_counters: 2,
                    ..crate::nic::Limits::default()
                },
                ..base
            },
            Profile::BlueField2Ecpf => NicConfig {
                device_id: 0xa2d6,
                fw_version: (24, 39, 1002),
                ecpf: true,
                host_pf_pages: 1024,
                // The e-switch manager of its port, with no MPFS.
                log_max_l2_table: 0,
                boot_pages: 128,
                init_pages: 8192,
                regular_pages: 2048,
                wqe_inline_mode: 2,
                reset_root_to_default: true,
                sq_ts_format: 2,
                rq_ts_format: 2,
                ..base
            },
            Profile::ConnectX7Pf => NicConfig {
                device_id: 0x1021,
                fw_version: (28, 39, 1002),
                boot_pages: 256,
                init_pages: 16384,
                regular_pages: 4096,
                wqe_inline_mode: 2,
                reset_root_to_default: true,
                sq_ts_format: 1,
                rq_ts_format: 1,
                ..base
            },
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
