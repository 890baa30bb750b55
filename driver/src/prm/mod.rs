//! mlx5 PRM layouts: one definition of every hardware structure, shared by
//! the driver and the device model.
//!
//! All device structures are big-endian; fields are numbered in bits,
//! MSB-first within each dword, exactly as `mlx5_ifc.h` numbers them (see
//! [`layout`] for the machinery). One file per family:
//!
//! | module | contents |
//! |---|---|
//! | [`init_seg`] | initialization segment and health buffer (BAR0) |
//! | [`cmdq`] | command queue entry and mailbox block |
//! | [`cmd`] | command inputs and outputs (generated from `prm-gen/ifc.spec`) |
//! | [`ctx`] | contexts and capability blocks (generated) |
//! | [`wqe`] | send WQE segments, striding RQ WQE |
//! | [`cqe`] | CQE, error CQE, EQE, with `Display` |
//! | [`uar`] | UAR page offsets and doorbell records |
//! | [`codes`] | opcodes, statuses, syndromes, event types, states, with names |
//!
//! Every layout and named constant is checked against the kernel's
//! `mlx5_ifc.h`/`device.h` and rdma-core's `mlx5dv.h` by
//! `tests/prm_conformance.rs`. Known disagreements between trees
//! (`cmd_hca_cap.fast_teardown`: kernel bit 0xfb, rdma-core's private header
//! 0x111) follow the kernel.

pub mod cmd;
pub mod cmdq;
pub mod codes;
pub mod cqe;
pub mod ctx;
pub mod init_seg;
pub mod layout;
pub mod uar;
pub mod wqe;

pub use codes::{ConstDesc, ConstHeader};
pub use layout::{Field, FieldDesc, Flex, Kind, Layout, LayoutInfo, Source, Sub, View, ViewMut};

/// Every layout, for the conformance tests and the device model's
/// self-checks.
pub fn all_layouts() -> Vec<LayoutInfo> {
    macro_rules! infos {
        ($($m:ident :: $T:ident),* $(,)?) => { vec![$(<$m::$T as Layout>::INFO),*] };
    }
    infos![
        init_seg::InitSeg,
        init_seg::InitialSegBits,
        init_seg::HealthBuffer,
        cmdq::CmdLayout,
        cmdq::CmdProtBlock,
        wqe::WqeCtrlSeg,
        wqe::WqeEthSeg,
        wqe::WqeDataSeg,
        wqe::WqeSrqNextSeg,
        wqe::MprqWqe,
        cqe::Cqe64,
        cqe::ErrCqe,
        cqe::Eqe,
        cqe::EqeData,
        cqe::EqeCmd,
        cqe::EqePageReq,
        cqe::EqeCqErr,
        ctx::CmdHcaCap,
        ctx::EthCaps,
        ctx::Eqc,
        ctx::Cqc,
        ctx::Wq,
        ctx::Sqc,
        ctx::Rqc,
        ctx::Tisc,
        ctx::Tirc,
        ctx::FlowTableContext,
        ctx::FteMatchSetLyr24,
        ctx::FteMatchParam,
        ctx::DestFormatStruct,
        ctx::FlowContext,
        ctx::MacAddressLayout,
        ctx::NicVportContext,
        ctx::ModifyNicVportFieldSelect,
        ctx::Mkc,
        ctx::FlowTablePropLayout,
        ctx::FlowTableNicCap,
        cmd::MboxIn,
        cmd::MboxOut,
        cmd::EnableHcaIn,
        cmd::DisableHcaIn,
        cmd::QueryIssiOut,
        cmd::SetIssiIn,
        cmd::QueryPagesIn,
        cmd::QueryPagesOut,
        cmd::ManagePagesIn,
        cmd::ManagePagesOut,
        cmd::AccessRegisterIn,
        cmd::AccessRegisterOut,
        cmd::QueryHcaCapIn,
        cmd::QueryHcaCapOut,
        cmd::SetHcaCapIn,
        cmd::InitHcaIn,
        cmd::TeardownHcaIn,
        cmd::TeardownHcaOut,
        cmd::AllocUarOut,
        cmd::DeallocUarIn,
        cmd::AllocPdOut,
        cmd::DeallocPdIn,
        cmd::AllocTransportDomainOut,
        cmd::DeallocTransportDomainIn,
        cmd::CreateMkeyIn,
        cmd::CreateMkeyOut,
        cmd::DestroyMkeyIn,
        cmd::CreateEqIn,
        cmd::CreateEqOut,
        cmd::DestroyEqIn,
        cmd::QueryEqIn,
        cmd::QueryEqOut,
        cmd::CreateCqIn,
        cmd::CreateCqOut,
        cmd::DestroyCqIn,
        cmd::QueryCqIn,
        cmd::QueryCqOut,
        cmd::ModifyCqIn,
        cmd::CreateSqIn,
        cmd::CreateSqOut,
        cmd::ModifySqIn,
        cmd::DestroySqIn,
        cmd::QuerySqIn,
        cmd::QuerySqOut,
        cmd::CreateRqIn,
        cmd::CreateRqOut,
        cmd::ModifyRqIn,
        cmd::DestroyRqIn,
        cmd::QueryRqIn,
        cmd::QueryRqOut,
        cmd::CreateTisIn,
        cmd::CreateTisOut,
        cmd::DestroyTisIn,
        cmd::CreateTirIn,
        cmd::CreateTirOut,
        cmd::DestroyTirIn,
        cmd::CreateFlowTableIn,
        cmd::CreateFlowTableOut,
        cmd::DestroyFlowTableIn,
        cmd::CreateFlowGroupIn,
        cmd::CreateFlowGroupOut,
        cmd::DestroyFlowGroupIn,
        cmd::SetFteIn,
        cmd::DeleteFteIn,
        cmd::SetFlowTableRootIn,
        cmd::QueryNicVportContextIn,
        cmd::QueryNicVportContextOut,
        cmd::ModifyNicVportContextIn,
        cmd::QueryVportStateIn,
        cmd::QueryVportStateOut,
        cmd::AllocQCounterOut,
        cmd::DeallocQCounterIn,
        cmd::QueryQCounterIn,
        cmd::QueryQCounterOut,
        cmd::SetL2TableEntryIn,
        cmd::DeleteL2TableEntryIn,
    ]
}

/// Every named constant with an independent twin.
pub fn all_consts() -> Vec<ConstDesc> {
    use codes::*;
    let mut v = Vec::new();
    for t in [
        Opcode::CONSTS,
        CmdStatus::CONSTS,
        DeliveryStatus::CONSTS,
        HealthSyndrome::CONSTS,
        EventType::CONSTS,
        CqeOpcode::CONSTS,
        CqeSyndrome::CONSTS,
        QueueState::CONSTS,
        WqeOpcode::CONSTS,
        MISC_CONSTS,
        init_seg::CONSTS,
        cmdq::CONSTS,
        wqe::CONSTS,
        cqe::CONSTS,
        uar::CONSTS,
    ] {
        v.extend_from_slice(t);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_is_self_consistent() {
        for l in all_layouts() {
            assert!(l.bits % 8 == 0, "{} size not whole bytes", l.rust);
            let mut names = std::collections::HashSet::new();
            for f in l.fields {
                assert!(names.insert(f.rust), "{}.{} defined twice", l.rust, f.rust);
                let end = match f.kind {
                    Kind::Flex => f.bit,
                    _ => f.bit + f.width,
                };
                assert!(
                    end <= l.bits,
                    "{}.{} ends at bit {end:#x} past the layout ({:#x})",
                    l.rust,
                    f.rust,
                    l.bits
                );
            }
        }
    }

    #[test]
    fn facts_sheet_spot_checks() {
        // A few offsets quoted in the facts sheet, as an independent check of
        // the generated tables on machines without the header packages.
        use cmd::*;
        use ctx::*;
        assert_eq!(Cqc::OI.bit(), 0x0e);
        assert_eq!(CreateCqIn::CQC.byte(), 0x10);
        assert_eq!(CreateCqIn::PAS.byte(), 0x110);
        assert_eq!(CreateSqIn::CTX.byte() + Sqc::WQ.byte(), 0x50);
        assert_eq!(Wq::LOG_WQE_NUM_OF_STRIDES.dword(), 0x24);
        assert_eq!(Wq::LOG_WQE_NUM_OF_STRIDES.shift(), 8);
        assert_eq!(Wq::PAS.byte(), 0xc0);
        assert_eq!(FteMatchSetLyr24::UDP_DPORT.dword(), 0x1c);
        assert_eq!(FteMatchSetLyr24::UDP_DPORT.shift(), 0);
        assert_eq!(SetFteIn::FLOW_CONTEXT.byte(), 0x40);
        assert_eq!(FlowContext::DESTINATION.byte(), 0x300);
        assert_eq!(
            QueryNicVportContextOut::NIC_VPORT_CONTEXT.byte()
                + NicVportContext::PERMANENT_ADDRESS.byte(),
            0x104
        );
        assert_eq!(CreateEqIn::EVENT_BITMASK.byte(), 0x58);
        assert_eq!(QueryQCounterOut::OUT_OF_BUFFER.dword(), 0x30);
        assert_eq!(CmdHcaCap::CQ_OI.bit(), 0x220);
        assert_eq!(CmdHcaCap::FAST_TEARDOWN.bit(), 0xfb);
        assert_eq!(QueryIssiOut::SUPPORTED_ISSI_DW0.dword(), 0x6c);
    }
}
