//! Bring-up, step by step in the PRM's order (facts sheet §4.2 and §8):
//! each step is a function named for what it does, its doc naming the
//! commands it sends.

use std::sync::Arc;
use std::time::Duration;

use crate::bar::Bar;
use crate::dma::{DmaPool, PAGE};
use crate::eq::EventQueue;
use crate::error::Error;
use crate::hw::{HwBackend, pci};
use crate::prm::cmd::*;
use crate::prm::codes::{
    EventType, Opcode, cap_type, flow, inline_mode, pages_op_mod, reg, ts_format, ts_format_cap,
};
use crate::prm::ctx::*;
use crate::prm::init_seg::{self, InitSeg};
use crate::prm::{Layout, View, ViewMut};

use super::fw_pages::satisfy_pages;
use super::vport::{
    MacStr, query_vport_mac_list, random_local_mac, set_mac, set_vport_mac_list, set_vport_mtu,
    wait_link_up,
};
use super::{
    CAP_BYTES, CX4_FAMILY_IDS, Ctl, DeviceConfig, DeviceInfo, EQ_VECTOR, FlowTable, InlineMode,
    MacIfUnset, Obj, VPORT_MTU, input, out_len,
};

/// Memory space and bus master on, keeping the other command bits (PCI
/// config, facts sheet §1.4).
pub(super) fn enable_bus_master<B: HwBackend>(bar: &Bar<B>) -> Result<(), Error> {
    let mut cmd = [0u8; 2];
    let pci_err = |what, source| Error::Pci {
        device: bar.name(),
        what,
        source,
    };
    bar.backend()
        .config_read(pci::COMMAND, &mut cmd)
        .map_err(|e| pci_err("read of the command register", e))?;
    let v = u16::from_le_bytes(cmd) | pci::COMMAND_MEMORY | pci::COMMAND_MASTER;
    bar.backend()
        .config_write(pci::COMMAND, &v.to_le_bytes())
        .map_err(|e| pci_err("write of the command register", e))
}

/// Polls the init segment's `initializing` bit (2 ms steps, as rdma-core)
/// until it clears: the firmware is ready for commands.
pub(super) fn wait_ready<B: HwBackend>(
    bar: &Bar<B>,
    timeout: Duration,
    what: &str,
) -> Result<(), Error> {
    let step = Duration::from_millis(2);
    let mut waited = Duration::ZERO;
    while bar.read32(InitSeg::INITIALIZING.dword()) & init_seg::INITIALIZING_BIT != 0 {
        if waited >= timeout {
            return Err(Error::Timeout {
                device: bar.name(),
                what: what.into(),
                waited,
            });
        }
        bar.wait(step);
        waited += step;
    }
    Ok(())
}

/// Brings the function up once the command queue is set up: the order of
/// rdma-core's VFIO provider (facts sheet §4.2; §8 steps 2 and 3), with
/// what Linux adds (capabilities read again after INIT_HCA, the vport MTU
/// and unicast address list), then the shared NIC RX flow table. Every
/// step records what it creates in `ctl` (`enabled`, `initialized`,
/// `objects`), so that `teardown` undoes a failed bring-up.
pub(super) fn bring_up<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    cfg: &DeviceConfig,
) -> Result<DeviceInfo, Error> {
    wait_ready(bar, cfg.init_timeout, "firmware initialization")?;
    let id = identify(bar, ctl)?;
    enable_hca(bar, pool, ctl, Opcode::EnableHca)?;
    ctl.enabled = true;
    set_issi(bar, pool, ctl)?;
    satisfy_pages(bar, pool, ctl, pages_op_mod::BOOT)?;
    if !id.is_vf {
        set_host_endianness(bar, pool, ctl)?;
    }
    set_hca_caps(bar, pool, ctl)?;
    satisfy_pages(bar, pool, ctl, pages_op_mod::INIT)?;
    init_hca(bar, pool, ctl)?;
    let caps = query_caps(bar, pool, ctl)?;
    let eqn = create_eq(bar, pool, ctl)?;
    let (pd, td) = alloc_pd_and_td(bar, pool, ctl)?;
    let lkey = create_mkey(bar, pool, ctl, pd)?;
    let vport = query_vport_context(bar, pool, ctl)?;
    let mac = choose_mac(bar, vport.permanent_mac, cfg.mac_if_unset)?;
    let inline_mode = required_inline_mode(bar, &caps, vport.min_wqe_inline_mode, &id)?;
    // The MTU: whatever the previous owner left (a PF's port MTU is often
    // 1500 or 9000) would let frames longer than a stride in.
    set_vport_mtu(bar, pool, ctl, VPORT_MTU)?;
    check_promiscuous(bar, cfg, id.is_vf)?;
    steer_unicast_mac(bar, pool, ctl, &caps, mac, vport.permanent_mac, id.is_vf)?;
    if cfg.promiscuous {
        set_promiscuous(bar, pool, ctl)?;
    }
    let vport_state = wait_link_up(bar, pool, ctl, cfg.link_up_timeout)?;
    create_flow_table(bar, pool, ctl, cfg.flow_table_log_size)?;

    let g = caps.general();
    Ok(DeviceInfo {
        name: bar.name(),
        fw_version: id.fw_version,
        mac,
        inline_mode,
        vport_state,
        pd,
        td,
        lkey,
        eqn,
        bf_reg_size: if g.get32(CmdHcaCap::BF) == 1 {
            1 << g.get32(CmdHcaCap::LOG_BF_REG_SIZE)
        } else {
            0
        },
        log_max_wq_sz: g.get32(CmdHcaCap::LOG_MAX_WQ_SZ) as u8,
        log_max_cq_sz: g.get32(CmdHcaCap::LOG_MAX_CQ_SZ) as u8,
        ext_stride_num_range: g.get32(CmdHcaCap::EXT_STRIDE_NUM_RANGE) == 1,
        log_min_stride_wqe_sz: caps.log_min_stride_wqe_sz,
        max_q_counters: g.get32(CmdHcaCap::MAX_QP_CNT),
        cqe_version: g.get32(CmdHcaCap::CQE_VERSION) as u8,
        wqe_inline_mode_cap: caps.eth_inline as u8,
        sq_ts_format: caps.sq_ts_format,
        rq_ts_format: caps.rq_ts_format,
        reset_root_to_default: ctl.reset_root_to_default,
        pci_device_id: id.pci_device_id,
        is_vf: id.is_vf,
        embedded_cpu: ctl.ecpf,
        func: ctl.func,
    })
}

/// What the PCI header and the initialization segment say before the
/// first command.
struct Identity {
    pci_device_id: u16,
    /// A virtual function (from the device id).
    is_vf: bool,
    /// `fw_rev` and `cmdif_rev_fw_sub`: major, minor, subminor.
    fw_version: (u16, u16, u16),
}

/// Reads the PCI device id and the initialization segment: whether this
/// is a BlueField embedded-CPU function (`initializing` bit), the
/// firmware's command timeout (`cmd_exec_to`, applied to the command
/// queue) and the firmware revision.
fn identify<B: HwBackend>(bar: &Bar<B>, ctl: &mut Ctl) -> Result<Identity, Error> {
    let name = bar.name();
    let mut id = [0u8; 2];
    bar.backend()
        .config_read(pci::DEVICE_ID, &mut id)
        .map_err(|source| Error::Pci {
            device: name.clone(),
            what: "read of the device id",
            source,
        })?;
    let pci_device_id = u16::from_le_bytes(id);
    let is_vf = crate::hw::mlx5_is_vf(pci_device_id);
    // A BlueField embedded-CPU function (the Arm side's PF) says so in the
    // init segment; it must name itself as one in ENABLE/DISABLE_HCA and
    // QUERY_PAGES (Linux `mlx5_read_embedded_cpu`, `mlx5_core_is_ecpf`),
    // and firmware may ask it for the host PF's pages too.
    ctl.ecpf = bar.read32(InitSeg::INITIALIZING.dword()) & init_seg::EMBEDDED_CPU_BIT != 0;
    if ctl.ecpf {
        tracing::info!(device = %name, "BlueField embedded-CPU function (ECPF)");
    }
    let to = bar.read32(InitSeg::CMD_EXEC_TO.dword());
    if to != 0 && to != 0xffff_ffff {
        ctl.cmdq
            .set_timeout(Duration::from_millis(u64::from(to)).max(Duration::from_secs(1)));
    }
    let fw = bar.read32(InitSeg::FW_REV.dword());
    let fw_sub = bar.read32(InitSeg::CMDIF_REV_FW_SUB.dword()) & 0xffff;
    Ok(Identity {
        pci_device_id,
        is_vf,
        fw_version: ((fw & 0xffff) as u16, (fw >> 16) as u16, fw_sub as u16),
    })
}

/// QUERY_ISSI, then SET_ISSI to 1: the only interface step the driver
/// speaks, so bring-up fails if the firmware does not offer it.
fn set_issi<B: HwBackend>(bar: &Bar<B>, pool: &Arc<DmaPool>, ctl: &mut Ctl) -> Result<(), Error> {
    let out = simple_out::<QueryIssiOut>(bar, pool, ctl, Opcode::QueryIssi)?;
    let issi = View::<QueryIssiOut>::new(&out)
        .expect("sized")
        .get32(QueryIssiOut::SUPPORTED_ISSI_DW0);
    if issi & 0b10 == 0 {
        return Err(Error::MissingCapability {
            device: bar.name(),
            cap: "ISSI 1",
            why: "the driver speaks interface step 1 only",
        });
    }
    let mut inp = input::<SetIssiIn>(Opcode::SetIssi, 0, 0);
    ViewMut::<SetIssiIn>::new(&mut inp)
        .expect("sized")
        .set(SetIssiIn::CURRENT_ISSI, 1);
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// ACCESS_REG write of HOST_ENDIANNESS (0x00 on a little-endian host), on
/// a PF only: the register belongs to the physical function (Linux
/// `set_hca_ctrl` and FreeBSD return early on a VF).
fn set_host_endianness<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let mut inp = input::<AccessRegisterIn>(Opcode::AccessReg, 0, 16);
    ViewMut::<AccessRegisterIn>::new(&mut inp)
        .expect("sized")
        .set(AccessRegisterIn::REGISTER_ID, reg::HOST_ENDIANNESS as u64);
    inp[AccessRegisterIn::REGISTER_DATA.byte()] =
        if cfg!(target_endian = "big") { 0x80 } else { 0 };
    ctl.exec(bar, pool, &inp, out_len::<AccessRegisterOut>(16))
        .map(|_| ())
}

/// QUERY_HCA_CAP general (current, then maximum), a check that the device
/// has what the datapath needs, then SET_HCA_CAP general from the current
/// values with no command checksums and 4 KiB UARs.
fn set_hca_caps<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let cur = query_cap(bar, pool, ctl, cap_type::GENERAL, true)?;
    let _max = query_cap(bar, pool, ctl, cap_type::GENERAL, false)?;
    check_required_caps(bar, View::<CmdHcaCap>::new(&cur).expect("cap block"))?;
    // Only the general block (cmd_hca_cap, 256 bytes) is copied, as Linux
    // and rdma-core do: the rest of the 4 KiB union is reserved on input,
    // while on output it may hold anything.
    let mut inp = input::<SetHcaCapIn>(Opcode::SetHcaCap, cap_type::GENERAL << 1, 0);
    {
        let at = SetHcaCapIn::CMD_HCA_CAP.byte();
        inp[at..at + CmdHcaCap::BYTES].copy_from_slice(&cur[..CmdHcaCap::BYTES]);
        let mut v = ViewMut::<SetHcaCapIn>::new(&mut inp).expect("sized");
        let mut c = v.sub(SetHcaCapIn::CMD_HCA_CAP);
        c.set(CmdHcaCap::CMDIF_CHECKSUM, 0)
            .set(CmdHcaCap::LOG_UAR_PAGE_SZ, 0);
    }
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// The general capabilities the datapath cannot do without.
fn check_required_caps<B: HwBackend>(bar: &Bar<B>, caps: View<'_, CmdHcaCap>) -> Result<(), Error> {
    let need = |ok: bool, cap, why| {
        if ok {
            Ok(())
        } else {
            Err(Error::MissingCapability {
                device: bar.name(),
                cap,
                why,
            })
        }
    };
    need(
        caps.get32(CmdHcaCap::PORT_TYPE) == 1,
        "port_type = Ethernet",
        "the datapath sends raw Ethernet",
    )?;
    need(
        caps.get32(CmdHcaCap::ETH_NET_OFFLOADS) == 1,
        "eth_net_offloads",
        "needed to learn the inline mode",
    )?;
    need(
        caps.get32(CmdHcaCap::NIC_FLOW_TABLE) == 1,
        "nic_flow_table",
        "each Rpc's UDP port is steered to its RQ",
    )?;
    need(
        caps.get32(CmdHcaCap::STRIDING_RQ) == 1,
        "striding_rq",
        "eRPC receives into a multi-packet RQ",
    )?;
    need(
        caps.get32(CmdHcaCap::CQ_OI) == 1,
        "cq_oi",
        "the RX CQ is created with overrun ignore",
    )
}

/// INIT_HCA (after the init pages were given).
fn init_hca<B: HwBackend>(bar: &Bar<B>, pool: &Arc<DmaPool>, ctl: &mut Ctl) -> Result<(), Error> {
    let inp = input::<InitHcaIn>(Opcode::InitHca, 0, 0);
    ctl.exec(bar, pool, &inp, 16)?;
    ctl.initialized = true;
    Ok(())
}

/// The capabilities as INIT_HCA left them.
struct Caps {
    /// The general block (`cmd_hca_cap`), current values.
    general: Vec<u8>,
    /// Ethernet cap `wqe_inline_mode`.
    eth_inline: u32,
    log_min_stride_wqe_sz: u8,
    sq_ts_format: u8,
    rq_ts_format: u8,
}

impl Caps {
    fn general(&self) -> View<'_, CmdHcaCap> {
        View::<CmdHcaCap>::new(&self.general).expect("cap block")
    }
}

/// QUERY_HCA_CAP of every capability group again (general, Ethernet
/// offloads, NIC flow table, general-2 if present), now that INIT_HCA has
/// applied SET_HCA_CAP and given the function its resources (Linux
/// `mlx5_function_open` re-queries them too): some, such as the Q counters
/// a function may allocate, are only meaningful from here on. Everything
/// after this step uses these.
fn query_caps<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<Caps, Error> {
    let cur = query_cap(bar, pool, ctl, cap_type::GENERAL, true)?;
    let caps = View::<CmdHcaCap>::new(&cur).expect("cap block");
    let eth = query_cap(bar, pool, ctl, cap_type::ETHERNET_OFFLOADS, true)?;
    let eth_inline = View::<EthCaps>::new(&eth)
        .expect("cap block")
        .get32(EthCaps::WQE_INLINE_MODE);
    let ft = query_cap(bar, pool, ctl, cap_type::NIC_FLOW_TABLE, true)?;
    ctl.reset_root_to_default = View::<FlowTableNicCap>::new(&ft)
        .expect("cap block")
        .sub(FlowTableNicCap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE)
        .get32(FlowTablePropLayout::RESET_ROOT_TO_DEFAULT)
        == 1;
    // Timestamp formats, chosen as DPDK's mlx5_ts_format_conv does: a
    // device with only a real-time clock gets REAL_TIME, otherwise the
    // free-running timer.
    let ts = |cap: u32| match cap as u8 {
        ts_format_cap::FREE_RUNNING | ts_format_cap::FREE_RUNNING_AND_REAL_TIME => {
            ts_format::FREE_RUNNING
        }
        ts_format_cap::REAL_TIME => ts_format::REAL_TIME,
        _ => ts_format::DEFAULT,
    };
    // The smallest striding WQE (DPDK `mlx5_devx_cmd_query_hca_attr`: the
    // general-2 cap, 16 KiB when the device does not report one).
    let log_min_stride_wqe_sz = if caps.get32(CmdHcaCap::HCA_CAP_2) == 1 {
        let c2 = query_cap(bar, pool, ctl, cap_type::GENERAL_2, true)?;
        cap2_log_min_stride_wqe_sz(&c2)
    } else {
        0
    };
    let log_min_stride_wqe_sz = match log_min_stride_wqe_sz {
        0 => MPRQ_LOG_MIN_STRIDE_WQE_SZ_DEFAULT,
        v => v,
    };
    let sq_ts_format = ts(caps.get32(CmdHcaCap::SQ_TS_FORMAT));
    let rq_ts_format = ts(caps.get32(CmdHcaCap::RQ_TS_FORMAT));
    Ok(Caps {
        general: cur,
        eth_inline,
        log_min_stride_wqe_sz,
        sq_ts_format,
        rq_ts_format,
    })
}

/// The polled EQ (facts sheet §1.5): ALLOC_UAR for its doorbell, an
/// interrupt sink on MSI-X vector 0, CREATE_EQ subscribed to page
/// requests, CQ errors and port changes, never armed; then one service,
/// since firmware may ask for regular pages right after INIT_HCA. Returns
/// the EQ number.
fn create_eq<B: HwBackend>(bar: &Bar<B>, pool: &Arc<DmaPool>, ctl: &mut Ctl) -> Result<u8, Error> {
    let eq_uar = alloc_u24::<AllocUarOut>(bar, pool, ctl, Opcode::AllocUar, AllocUarOut::UAR)?;
    ctl.objects.push(Obj::Uar(eq_uar));
    // MSI-X vector 0 gets an interrupt sink before the EQ names it, as in
    // every reference (rdma-core: VFIO_DEVICE_SET_IRQS at open); firmware
    // refuses an EQ on a vector that is not enabled. The EQ is still
    // polled and never armed.
    bar.backend()
        .enable_msix(EQ_VECTOR)
        .map_err(|source| Error::Pci {
            device: bar.name(),
            what: "MSI-X enable (VFIO_DEVICE_SET_IRQS)",
            source,
        })?;
    ctl.objects.push(Obj::Msix);
    let buf = EventQueue::alloc_buffer(pool)?;
    let npages = buf.len() / PAGE;
    let mut inp = input::<CreateEqIn>(Opcode::CreateEq, 0, npages * 8);
    {
        let mut v = ViewMut::<CreateEqIn>::new(&mut inp).expect("sized");
        let mask = (1u64 << EventType::PageRequest as u8)
            | (1u64 << EventType::CqError as u8)
            | (1u64 << EventType::PortChange as u8);
        assert!(v.set_flex(CreateEqIn::EVENT_BITMASK, 0, mask));
        for p in 0..npages {
            assert!(v.set_flex(CreateEqIn::PAS, p as u32, buf.iova_at(p * PAGE)));
        }
        let mut c = v.sub(CreateEqIn::EQC);
        c.set(
            Eqc::LOG_EQ_SIZE,
            crate::eq::EQ_ENTRIES.trailing_zeros() as u64,
        )
        .set(Eqc::UAR_PAGE, eq_uar as u64)
        .set(Eqc::INTR, u64::from(EQ_VECTOR))
        .set(Eqc::LOG_PAGE_SIZE, 0);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateEqOut>(0))?;
    let eqn = View::<CreateEqOut>::new(&out)
        .expect("sized")
        .get32(CreateEqOut::EQ_NUMBER) as u8;
    ctl.objects.push(Obj::Eq(eqn));
    ctl.eq = Some(EventQueue::new(buf, eqn, eq_uar));
    // Firmware may ask for regular pages right after INIT_HCA.
    ctl.service(bar, pool)?;
    Ok(eqn)
}

/// ALLOC_PD and ALLOC_TRANSPORT_DOMAIN, shared by every queue set.
fn alloc_pd_and_td<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(u32, u32), Error> {
    let pd = alloc_u24::<AllocPdOut>(bar, pool, ctl, Opcode::AllocPd, AllocPdOut::PD)?;
    ctl.objects.push(Obj::Pd(pd));
    let td = alloc_u24::<AllocTransportDomainOut>(
        bar,
        pool,
        ctl,
        Opcode::AllocTransportDomain,
        AllocTransportDomainOut::TRANSPORT_DOMAIN,
    )?;
    ctl.objects.push(Obj::Td(td));
    Ok((pd, td))
}

/// CREATE_MKEY of one physical-address mkey in `pd` (facts sheet §5.14):
/// data segments carry IOVAs directly. Returns its lkey.
fn create_mkey<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    pd: u32,
) -> Result<u32, Error> {
    const MKEY_VARIANT: u8 = 0x5a;
    let mut inp = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0);
    {
        let mut v = ViewMut::<CreateMkeyIn>::new(&mut inp).expect("sized");
        let mut m = v.sub(CreateMkeyIn::MKC);
        m.set(Mkc::ACCESS_MODE_1_0, 0)
            .set(Mkc::LR, 1)
            .set(Mkc::LW, 1)
            .set(Mkc::QPN, 0xff_ffff)
            .set(Mkc::MKEY_7_0, MKEY_VARIANT as u64)
            .set(Mkc::LENGTH64, 1)
            .set(Mkc::PD, pd as u64);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateMkeyOut>(0))?;
    let mkey_index = View::<CreateMkeyOut>::new(&out)
        .expect("sized")
        .get32(CreateMkeyOut::MKEY_INDEX);
    ctl.objects.push(Obj::Mkey(mkey_index));
    Ok((mkey_index << 8) | MKEY_VARIANT as u32)
}

/// What the vport context says about sending.
struct VportContext {
    /// The permanent MAC (zero when nobody gave the function one).
    permanent_mac: [u8; 6],
    /// `min_wqe_inline_mode`.
    min_wqe_inline_mode: u32,
}

/// QUERY_NIC_VPORT_CONTEXT: the MAC and the inline mode.
fn query_vport_context<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<VportContext, Error> {
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryNicVportContextOut>(0))?;
    let vctx = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT);
    let mac_l = vctx.sub(NicVportContext::PERMANENT_ADDRESS);
    let (hi, lo) = (
        mac_l.get32(MacAddressLayout::MAC_ADDR_47_32) as u16,
        mac_l.get32(MacAddressLayout::MAC_ADDR_31_0),
    );
    let permanent_mac = [
        (hi >> 8) as u8,
        hi as u8,
        (lo >> 24) as u8,
        (lo >> 16) as u8,
        (lo >> 8) as u8,
        lo as u8,
    ];
    Ok(VportContext {
        permanent_mac,
        min_wqe_inline_mode: vctx.get32(NicVportContext::MIN_WQE_INLINE_MODE),
    })
}

/// The MAC to use: the permanent one, or if that is zero, what
/// [`DeviceConfig::mac_if_unset`] says.
fn choose_mac<B: HwBackend>(
    bar: &Bar<B>,
    permanent: [u8; 6],
    if_unset: MacIfUnset,
) -> Result<[u8; 6], Error> {
    if permanent != [0; 6] {
        return Ok(permanent);
    }
    match if_unset {
        MacIfUnset::Random => {
            let m = random_local_mac();
            tracing::warn!(device = %bar.name(), mac = %MacStr(m), "the function has no MAC; using a random locally administered one");
            Ok(m)
        }
        MacIfUnset::Use(m) if m[0] & 1 == 0 && m != [0; 6] => Ok(m),
        MacIfUnset::Use(m) => Err(Error::Config(format!(
            "mac_if_unset {} is not a unicast MAC",
            MacStr(m)
        ))),
        MacIfUnset::Refuse => Err(Error::NoMac { device: bar.name() }),
    }
}

/// How much of each frame a send WQE must carry inline: the Ethernet
/// cap's `wqe_inline_mode`, or, when that defers to the vport context,
/// the context's requirement, trusted only with `eth_virt`; without it
/// the device id decides (DPDK `mlx5_set_min_inline`: the ConnectX-4
/// family needs the L2 header, later devices nothing). More than L2 is
/// refused.
fn required_inline_mode<B: HwBackend>(
    bar: &Bar<B>,
    caps: &Caps,
    vport_inline: u32,
    id: &Identity,
) -> Result<InlineMode, Error> {
    let eth_virt = caps.general().get32(CmdHcaCap::ETH_VIRT) == 1;
    let mode = match caps.eth_inline as u8 {
        inline_mode::L2 => 1,
        inline_mode::VPORT_CONTEXT if eth_virt => vport_inline,
        inline_mode::VPORT_CONTEXT => {
            let by_id = u32::from(CX4_FAMILY_IDS.contains(&id.pci_device_id));
            tracing::debug!(device = %bar.name(), vport_inline, by_id, "inline mode from the device id: the vport context is not trusted without eth_virt");
            by_id
        }
        _ => 0,
    };
    let inline_mode = match mode {
        0 => InlineMode::None,
        1 => InlineMode::L2,
        2 => InlineMode::Ip,
        _ => InlineMode::L4,
    };
    if matches!(inline_mode, InlineMode::Ip | InlineMode::L4) {
        return Err(Error::MissingCapability {
            device: bar.name(),
            cap: "min_wqe_inline_mode <= L2",
            why: "the driver inlines at most the L2 header",
        });
    }
    Ok(inline_mode)
}

/// Promiscuous mode on a VF is the PF's decision: its mlx5_core ignores
/// the request unless the VF is trusted, and a VF cannot see that.
fn check_promiscuous<B: HwBackend>(
    bar: &Bar<B>,
    cfg: &DeviceConfig,
    is_vf: bool,
) -> Result<(), Error> {
    if cfg.promiscuous && is_vf && !cfg.vf_trusted {
        let name = bar.name();
        return Err(Error::Config(format!(
            "{name}: promiscuous mode on a VF works only if the PF trusts it (`ip link set <pf> vf <n> trust on`); the PF ignores an untrusted VF's request. Set DeviceConfig::vf_trusted once it does"
        )));
    }
    Ok(())
}

/// Makes unicast for `mac` reach the function. It does only for MACs
/// programmed into the e-switch: MODIFY_NIC_VPORT_CONTEXT of the vport's
/// address list (from which a PF's legacy SR-IOV e-switch builds a VF's
/// forwarding rules; Linux mlx5e always sets it), read back with
/// QUERY_NIC_VPORT_CONTEXT, and on an e-switch manager SET_L2_TABLE_ENTRY
/// in the MPFS L2 table (Linux `mlx5_mpfs_add_mac`). The PF copies a VF's
/// list into its forwarding table from a work item, some time after the
/// MODIFY, and a VF cannot see when: the list is programmed before the
/// link wait, so that the copy overlaps it.
fn steer_unicast_mac<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    caps: &Caps,
    mac: [u8; 6],
    admin_mac: [u8; 6],
    is_vf: bool,
) -> Result<(), Error> {
    let name = bar.name();
    set_vport_mac_list(bar, pool, ctl, &[mac])?;
    ctl.objects.push(Obj::VportMacList);
    let listed = query_vport_mac_list(bar, pool, ctl)?;
    if !listed.contains(&mac) {
        tracing::warn!(device = %name, mac = %MacStr(mac), listed = listed.len(), "the vport address list does not hold our MAC after setting it: unicast may not reach the function");
    }
    if is_vf && mac != admin_mac {
        tracing::warn!(device = %name, mac = %MacStr(mac), "this VF has no admin MAC: if the PF checks spoofing (`spoofchk on`) it drops every frame the VF sends; give it one with `ip link set <pf> vf <n> mac ...`");
    }
    // MPFS exists only on an e-switch manager whose L2 table has more
    // than one entry (Linux `mlx5_mpfs_init`); a failure costs unicast
    // delivery on a shared port, not the function, so it is a warning
    // (Linux mlx5e logs it and carries on).
    let g = caps.general();
    if g.get32(CmdHcaCap::ESWITCH_MANAGER) == 1 && g.get32(CmdHcaCap::LOG_MAX_L2_TABLE) > 0 {
        const L2_INDEX: u32 = 0;
        let mut inp = input::<SetL2TableEntryIn>(Opcode::SetL2TableEntry, 0, 0);
        {
            let mut v = ViewMut::<SetL2TableEntryIn>::new(&mut inp).expect("sized");
            v.set(SetL2TableEntryIn::TABLE_INDEX, u64::from(L2_INDEX));
            let mut a = v.sub(SetL2TableEntryIn::MAC_ADDRESS);
            set_mac(&mut a, mac);
        }
        match ctl.exec(bar, pool, &inp, 16) {
            Ok(_) => ctl.objects.push(Obj::L2Entry(L2_INDEX)),
            Err(e @ Error::Command { .. }) => {
                tracing::warn!(device = %name, error = %e, mac = %MacStr(mac), "MPFS L2 table entry refused: unicast for this MAC may not reach the function on a shared port");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// MODIFY_NIC_VPORT_CONTEXT of `promisc_uc`.
fn set_promiscuous<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<(), Error> {
    let mut inp = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0);
    let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
    v.sub(ModifyNicVportContextIn::FIELD_SELECT)
        .set(ModifyNicVportFieldSelect::PROMISC, 1);
    v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
        .set(NicVportContext::PROMISC_UC, 1);
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// The NIC RX root table every queue set's rule goes into:
/// CREATE_FLOW_TABLE (NIC RX, `2^log_size` entries), CREATE_FLOW_GROUP
/// over all of it matching exact dmac, ethertype, IP protocol and UDP
/// destination port, then SET_FLOW_TABLE_ROOT.
fn create_flow_table<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    log_size: u8,
) -> Result<(), Error> {
    if !(1..=16).contains(&log_size) {
        return Err(Error::Config(format!(
            "flow_table_log_size {log_size} not in 1..=16"
        )));
    }
    let mut inp = input::<CreateFlowTableIn>(Opcode::CreateFlowTable, 0, 0);
    {
        let mut v = ViewMut::<CreateFlowTableIn>::new(&mut inp).expect("sized");
        v.set(
            CreateFlowTableIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        );
        v.sub(CreateFlowTableIn::FLOW_TABLE_CONTEXT)
            .set(FlowTableContext::LOG_SIZE, log_size as u64)
            .set(FlowTableContext::LEVEL, 0);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateFlowTableOut>(0))?;
    let table_id = View::<CreateFlowTableOut>::new(&out)
        .expect("sized")
        .get32(CreateFlowTableOut::TABLE_ID);
    ctl.objects.push(Obj::FlowTable(table_id));
    let size = 1usize << log_size;
    let mut inp = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0);
    {
        let mut v = ViewMut::<CreateFlowGroupIn>::new(&mut inp).expect("sized");
        v.set(
            CreateFlowGroupIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        )
        .set(CreateFlowGroupIn::TABLE_ID, table_id as u64)
        .set(CreateFlowGroupIn::START_FLOW_INDEX, 0)
        .set(CreateFlowGroupIn::END_FLOW_INDEX, (size - 1) as u64)
        .set(
            CreateFlowGroupIn::MATCH_CRITERIA_ENABLE,
            flow::MATCH_OUTER_HEADERS as u64,
        );
        let mut mc = v.sub(CreateFlowGroupIn::MATCH_CRITERIA);
        let mut o = mc.sub(FteMatchParam::OUTER_HEADERS);
        o.set(FteMatchSetLyr24::DMAC_47_16, 0xffff_ffff)
            .set(FteMatchSetLyr24::DMAC_15_0, 0xffff)
            .set(FteMatchSetLyr24::ETHERTYPE, 0xffff)
            .set(FteMatchSetLyr24::IP_PROTOCOL, 0xff)
            .set(FteMatchSetLyr24::UDP_DPORT, 0xffff);
    }
    let out = ctl.exec(bar, pool, &inp, out_len::<CreateFlowGroupOut>(0))?;
    let group_id = View::<CreateFlowGroupOut>::new(&out)
        .expect("sized")
        .get32(CreateFlowGroupOut::GROUP_ID);
    ctl.objects.push(Obj::FlowGroup(table_id, group_id));
    let mut inp = input::<SetFlowTableRootIn>(Opcode::SetFlowTableRoot, 0, 0);
    ViewMut::<SetFlowTableRootIn>::new(&mut inp)
        .expect("sized")
        .set(
            SetFlowTableRootIn::TABLE_TYPE,
            flow::TABLE_TYPE_NIC_RX as u64,
        )
        .set(SetFlowTableRootIn::TABLE_ID, table_id as u64);
    ctl.exec(bar, pool, &inp, 16)?;
    ctl.objects.push(Obj::FlowRoot);
    ctl.flow = Some(FlowTable {
        table_id,
        group_id,
        ports: vec![None; size],
    });
    Ok(())
}

/// ENABLE_HCA or DISABLE_HCA of our own function (0), with
/// `embedded_cpu_function` set on an ECPF (the two inputs share a layout).
pub(super) fn enable_hca<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
) -> Result<(), Error> {
    const _: () = assert!(
        EnableHcaIn::EMBEDDED_CPU_FUNCTION.bit() == DisableHcaIn::EMBEDDED_CPU_FUNCTION.bit()
    );
    let mut inp = input::<EnableHcaIn>(op, 0, 0);
    ViewMut::<EnableHcaIn>::new(&mut inp)
        .expect("sized")
        .set(EnableHcaIn::EMBEDDED_CPU_FUNCTION, u64::from(ctl.ecpf));
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// QUERY_HCA_CAP of one capability group: its current or maximum values.
fn query_cap<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    cap: u16,
    current: bool,
) -> Result<Vec<u8>, Error> {
    let op_mod = (cap << 1) | u16::from(current);
    let inp = input::<QueryHcaCapIn>(Opcode::QueryHcaCap, op_mod, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryHcaCapOut>(0))?;
    let at = QueryHcaCapOut::CMD_HCA_CAP.byte();
    Ok(out[at..at + CAP_BYTES].to_vec())
}

/// Runs a command that takes only the header and returns its output.
fn simple_out<O: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
) -> Result<Vec<u8>, Error> {
    let inp = input::<MboxIn>(op, 0, 0);
    ctl.exec(bar, pool, &inp, out_len::<O>(0))
}

/// Runs an ALLOC_* command and returns the object number it reports.
fn alloc_u24<O: Layout>(
    bar: &Bar<impl HwBackend>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    op: Opcode,
    f: crate::prm::Field<O>,
) -> Result<u32, Error> {
    let out = simple_out::<O>(bar, pool, ctl, op)?;
    Ok(View::<O>::new(&out).expect("sized").get32(f))
}
