//! HCA capabilities: the general (`cmd_hca_cap`) and Ethernet offload
//! blocks, maximum and current, describing a plausible ConnectX-5.

use mlx5::prm::ctx::{CmdHcaCap, EthCaps, FlowTableNicCap, FlowTablePropLayout};
use mlx5::prm::{Layout, View, ViewMut};

use crate::nic::NicConfig;

/// Bytes of a capability block in QUERY/SET_HCA_CAP.
pub(crate) const CAP_BYTES: usize = 0x1000;

/// The four capability blocks.
#[derive(Debug, Clone)]
pub(crate) struct Caps {
    pub gen_max: Vec<u8>,
    pub gen_cur: Vec<u8>,
    pub eth_max: Vec<u8>,
    pub eth_cur: Vec<u8>,
    /// NIC flow table capabilities (cap type 7; not settable).
    pub flow_table: Vec<u8>,
    /// General-2 capabilities (cap type 0x20; not settable), when the
    /// general block's `hca_cap_2` is set.
    pub gen2: Option<Vec<u8>>,
}

fn log2_floor(n: u32) -> u64 {
    u64::from(31 - n.max(1).leading_zeros())
}

impl Caps {
    /// The device's capabilities for `cfg`.
    pub(crate) fn new(cfg: &NicConfig) -> Caps {
        let l = &cfg.limits;
        let mut g = vec![0u8; CAP_BYTES];
        {
            type C = CmdHcaCap;
            let mut v = ViewMut::<C>::new(&mut g).expect("4 KiB");
            v.set(C::LOG_MAX_CQ_SZ, u64::from(l.log_max_cq_sz))
                .set(C::LOG_MAX_CQ, log2_floor(l.max_cqs))
                .set(C::LOG_MAX_EQ_SZ, u64::from(l.log_max_eq_sz))
                .set(C::LOG_MAX_MKEY, log2_floor(l.max_mkeys))
                .set(C::FAST_TEARDOWN, 0)
                .set(C::LOG_MAX_EQ, log2_floor(l.max_eqs).min(15))
                .set(C::NIC_FLOW_TABLE, 1)
                .set(C::PORT_TYPE, 1)
                .set(C::NUM_PORTS, 1)
                .set(C::CQE_VERSION, 1)
                .set(C::STRIDING_RQ, u64::from(cfg.striding_rq))
                .set(C::CMDIF_CHECKSUM, 0)
                .set(C::ETH_NET_OFFLOADS, 1)
                .set(C::ROCE, 0)
                .set(C::CQ_OI, u64::from(cfg.cq_oi))
                .set(C::UAR_4K, 1)
                .set(C::UAR_SZ, log2_floor(cfg.bar_pages))
                .set(C::UMEM_UID_0, 0)
                .set(C::LOG_PG_SZ, 12)
                .set(C::BF, 1)
                .set(C::DRIVER_VERSION, 0)
                .set(C::LOG_BF_REG_SIZE, 9)
                .set(C::LOG_MAX_TRANSPORT_DOMAIN, log2_floor(l.max_tds))
                .set(C::LOG_MAX_PD, log2_floor(l.max_pds))
                .set(C::LOG_MAX_RQ, log2_floor(l.max_rqs))
                .set(C::LOG_MAX_SQ, log2_floor(l.max_sqs))
                .set(C::LOG_MAX_TIR, log2_floor(l.max_tirs))
                .set(C::LOG_MAX_TIS, log2_floor(l.max_tises))
                .set(C::EXT_STRIDE_NUM_RANGE, u64::from(cfg.ext_stride_num_range))
                .set(C::LOG_MAX_WQ_SZ, u64::from(l.log_max_wq_sz))
                .set(C::LOG_MAX_CURRENT_UC_LIST, u64::from(l.log_max_uc_list))
                .set(C::LOG_UAR_PAGE_SZ, 0)
                .set(C::CQE_COMPRESSION, 0)
                .set(C::CQE_128_ALWAYS, 0)
                .set(C::VPORT_GROUP_MANAGER, u64::from(!cfg.vf))
                .set(
                    C::ESWITCH_MANAGER,
                    u64::from(cfg.eswitch == crate::nic::Eswitch::Mpfs),
                )
                .set(C::LOG_MAX_L2_TABLE, u64::from(cfg.log_max_l2_table))
                .set(C::SQ_TS_FORMAT, u64::from(cfg.sq_ts_format))
                .set(C::RQ_TS_FORMAT, u64::from(cfg.rq_ts_format))
                .set(C::HCA_CAP_2, u64::from(cfg.log_min_stride_wqe_sz.is_some()))
                .set(C::ETH_VIRT, u64::from(cfg.eth_virt))
                .set(C::MAX_QP_CNT, u64::from(l.max_q_counters.min(1023)));
        }
        let gen2 = cfg.log_min_stride_wqe_sz.map(|v| {
            let mut b = vec![0u8; CAP_BYTES];
            mlx5::prm::ctx::set_cap2_log_min_stride_wqe_sz(&mut b, v);
            b
        });
        let mut cur = g.clone();
        {
            // Settable fields start at their defaults. Q counters are given
            // to the function at INIT_HCA (`init_hca`); until then the
            // current value reads 0, so a driver must read the caps again
            // after INIT_HCA (Linux `mlx5_function_open`).
            let mut v = ViewMut::<CmdHcaCap>::new(&mut cur).expect("4 KiB");
            v.set(CmdHcaCap::UAR_4K, 0).set(CmdHcaCap::MAX_QP_CNT, 0);
        }
        let mut e = vec![0u8; CAP_BYTES];
        {
            let mut v = ViewMut::<EthCaps>::new(&mut e).expect("4 KiB");
            v.set(EthCaps::CSUM_CAP, 1)
                .set(EthCaps::MULTI_PKT_SEND_WQE, 0)
                .set(EthCaps::WQE_INLINE_MODE, u64::from(cfg.wqe_inline_mode))
                .set(EthCaps::SCATTER_FCS, 0)
                .set(EthCaps::ENHANCED_MULTI_PKT_SEND_WQE, 0);
        }
        let mut ft = vec![0u8; CAP_BYTES];
        {
            let mut v = ViewMut::<FlowTableNicCap>::new(&mut ft).expect("4 KiB");
            let mut rx = v.sub(FlowTableNicCap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE);
            type P = FlowTablePropLayout;
            rx.set(P::FT_SUPPORT, 1)
                .set(P::FLOW_MODIFY_EN, 1)
                .set(P::MODIFY_ROOT, 1)
                .set(
                    P::RESET_ROOT_TO_DEFAULT,
                    u64::from(cfg.reset_root_to_default),
                )
                .set(P::LOG_MAX_FT_SIZE, u64::from(l.log_max_ft_size))
                .set(P::MAX_FT_LEVEL, 63);
        }
        Caps {
            gen_max: g,
            gen_cur: cur,
            eth_cur: e.clone(),
            eth_max: e,
            flow_table: ft,
            gen2,
        }
    }

    /// The smallest striding WQE the device accepts (log2 bytes): the
    /// general-2 cap, or 14 (16 KiB) when the device has none to report.
    pub(crate) fn log_min_stride_wqe_sz(&self) -> u32 {
        match self
            .gen2
            .as_deref()
            .map(mlx5::prm::ctx::cap2_log_min_stride_wqe_sz)
        {
            Some(v) if v != 0 => u32::from(v),
            _ => u32::from(mlx5::prm::ctx::MPRQ_LOG_MIN_STRIDE_WQE_SZ_DEFAULT),
        }
    }

    /// A general-cap field, current value.
    pub(crate) fn cur(&self, f: mlx5::prm::Field<CmdHcaCap>) -> u64 {
        View::<CmdHcaCap>::new(&self.gen_cur).expect("4 KiB").get(f)
    }

    /// Ethernet cap `wqe_inline_mode`.
    pub(crate) fn wqe_inline_mode(&self) -> u8 {
        View::<EthCaps>::new(&self.eth_cur)
            .expect("4 KiB")
            .get(EthCaps::WQE_INLINE_MODE) as u8
    }

    /// Checks a SET_HCA_CAP general block against the maximum: no named
    /// field may exceed it. Returns the first offending field.
    pub(crate) fn check_set(&self, new: &[u8]) -> Result<(), (&'static str, u64, u64)> {
        let max = View::<CmdHcaCap>::new(&self.gen_max).expect("4 KiB");
        let Some(n) = View::<CmdHcaCap>::new(new) else {
            return Err(("capability block", 0, 0));
        };
        for f in <CmdHcaCap as Layout>::INFO.fields {
            let field = mlx5::prm::Field::<CmdHcaCap>::new(f.bit, f.width);
            let (nv, mv) = (n.get(field), max.get(field));
            if nv > mv {
                return Err((f.rust, nv, mv));
            }
        }
        Ok(())
    }
}
