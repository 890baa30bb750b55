//! Numbers with names: command opcodes, command and delivery statuses,
//! health syndromes, event types, CQE opcodes and syndromes, queue states.
//!
//! Every value that an independent header also defines carries that
//! header's constant name; the conformance test compiles the headers and
//! compares the values.

use std::fmt;

/// Which header defines a constant's independent twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstHeader {
    /// Any kernel header under `include/linux/mlx5/` (enum entries and
    /// `#define`s, read as text and evaluated).
    Kernel,
    /// rdma-core `infiniband/mlx5dv.h`.
    Dv,
}

/// One named constant and where to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstDesc {
    /// Our name.
    pub rust: &'static str,
    /// Our value.
    pub value: u64,
    /// Header with the twin.
    pub header: ConstHeader,
    /// The twin's C name.
    pub c_name: &'static str,
}

/// Declares a `#[repr]` enum of named codes with lookup, a name, `Display`,
/// and its conformance table.
macro_rules! codes {
    (
        $(#[$meta:meta])*
        pub enum $E:ident : $repr:ty, $header:ident {
            $( $(#[$vmeta:meta])* $V:ident = $val:expr, $name:literal $(, $cname:literal)?; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $E {
            $( $(#[$vmeta])* $V = $val, )*
        }

        impl $E {
            /// Every value, in declaration order.
            pub const ALL: &'static [$E] = &[$($E::$V),*];

            /// The code for a raw value, if it is one we know.
            pub const fn from_raw(raw: $repr) -> Option<$E> {
                match raw {
                    $( $val => Some($E::$V), )*
                    _ => None,
                }
            }

            /// The PRM name.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $E::$V => $name, )*
                }
            }

            /// Conformance table: values with an independent C twin.
            pub const CONSTS: &'static [ConstDesc] = &[
                $( $( ConstDesc {
                    rust: concat!(stringify!($E), "::", stringify!($V)),
                    value: $val as u64,
                    header: ConstHeader::$header,
                    c_name: $cname,
                }, )? )*
            ];
        }

        impl fmt::Display for $E {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

codes! {
    /// Command opcodes (input header `opcode`).
    pub enum Opcode: u16, Kernel {
        QueryHcaCap = 0x100, "QUERY_HCA_CAP", "MLX5_CMD_OP_QUERY_HCA_CAP";
        QueryAdapter = 0x101, "QUERY_ADAPTER", "MLX5_CMD_OP_QUERY_ADAPTER";
        InitHca = 0x102, "INIT_HCA", "MLX5_CMD_OP_INIT_HCA";
        TeardownHca = 0x103, "TEARDOWN_HCA", "MLX5_CMD_OP_TEARDOWN_HCA";
        EnableHca = 0x104, "ENABLE_HCA", "MLX5_CMD_OP_ENABLE_HCA";
        DisableHca = 0x105, "DISABLE_HCA", "MLX5_CMD_OP_DISABLE_HCA";
        QueryPages = 0x107, "QUERY_PAGES", "MLX5_CMD_OP_QUERY_PAGES";
        ManagePages = 0x108, "MANAGE_PAGES", "MLX5_CMD_OP_MANAGE_PAGES";
        SetHcaCap = 0x109, "SET_HCA_CAP", "MLX5_CMD_OP_SET_HCA_CAP";
        QueryIssi = 0x10a, "QUERY_ISSI", "MLX5_CMD_OP_QUERY_ISSI";
        SetIssi = 0x10b, "SET_ISSI", "MLX5_CMD_OP_SET_ISSI";
        SetDriverVersion = 0x10d, "SET_DRIVER_VERSION", "MLX5_CMD_OP_SET_DRIVER_VERSION";
        CreateMkey = 0x200, "CREATE_MKEY", "MLX5_CMD_OP_CREATE_MKEY";
        QueryMkey = 0x201, "QUERY_MKEY", "MLX5_CMD_OP_QUERY_MKEY";
        DestroyMkey = 0x202, "DESTROY_MKEY", "MLX5_CMD_OP_DESTROY_MKEY";
        QuerySpecialContexts = 0x203, "QUERY_SPECIAL_CONTEXTS", "MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS";
        CreateEq = 0x301, "CREATE_EQ", "MLX5_CMD_OP_CREATE_EQ";
        DestroyEq = 0x302, "DESTROY_EQ", "MLX5_CMD_OP_DESTROY_EQ";
        QueryEq = 0x303, "QUERY_EQ", "MLX5_CMD_OP_QUERY_EQ";
        CreateCq = 0x400, "CREATE_CQ", "MLX5_CMD_OP_CREATE_CQ";
        DestroyCq = 0x401, "DESTROY_CQ", "MLX5_CMD_OP_DESTROY_CQ";
        QueryCq = 0x402, "QUERY_CQ", "MLX5_CMD_OP_QUERY_CQ";
        ModifyCq = 0x403, "MODIFY_CQ", "MLX5_CMD_OP_MODIFY_CQ";
        QueryVportState = 0x750, "QUERY_VPORT_STATE", "MLX5_CMD_OP_QUERY_VPORT_STATE";
        QueryNicVportContext = 0x754, "QUERY_NIC_VPORT_CONTEXT", "MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT";
        ModifyNicVportContext = 0x755, "MODIFY_NIC_VPORT_CONTEXT", "MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT";
        AllocQCounter = 0x771, "ALLOC_Q_COUNTER", "MLX5_CMD_OP_ALLOC_Q_COUNTER";
        DeallocQCounter = 0x772, "DEALLOC_Q_COUNTER", "MLX5_CMD_OP_DEALLOC_Q_COUNTER";
        QueryQCounter = 0x773, "QUERY_Q_COUNTER", "MLX5_CMD_OP_QUERY_Q_COUNTER";
        AllocPd = 0x800, "ALLOC_PD", "MLX5_CMD_OP_ALLOC_PD";
        DeallocPd = 0x801, "DEALLOC_PD", "MLX5_CMD_OP_DEALLOC_PD";
        AllocUar = 0x802, "ALLOC_UAR", "MLX5_CMD_OP_ALLOC_UAR";
        DeallocUar = 0x803, "DEALLOC_UAR", "MLX5_CMD_OP_DEALLOC_UAR";
        AccessReg = 0x805, "ACCESS_REG", "MLX5_CMD_OP_ACCESS_REG";
        Nop = 0x80d, "NOP", "MLX5_CMD_OP_NOP";
        SetL2TableEntry = 0x829, "SET_L2_TABLE_ENTRY", "MLX5_CMD_OP_SET_L2_TABLE_ENTRY";
        DeleteL2TableEntry = 0x82b, "DELETE_L2_TABLE_ENTRY", "MLX5_CMD_OP_DELETE_L2_TABLE_ENTRY";
        AllocTransportDomain = 0x816, "ALLOC_TRANSPORT_DOMAIN", "MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN";
        DeallocTransportDomain = 0x817, "DEALLOC_TRANSPORT_DOMAIN", "MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN";
        CreateTir = 0x900, "CREATE_TIR", "MLX5_CMD_OP_CREATE_TIR";
        ModifyTir = 0x901, "MODIFY_TIR", "MLX5_CMD_OP_MODIFY_TIR";
        DestroyTir = 0x902, "DESTROY_TIR", "MLX5_CMD_OP_DESTROY_TIR";
        QueryTir = 0x903, "QUERY_TIR", "MLX5_CMD_OP_QUERY_TIR";
        CreateSq = 0x904, "CREATE_SQ", "MLX5_CMD_OP_CREATE_SQ";
        ModifySq = 0x905, "MODIFY_SQ", "MLX5_CMD_OP_MODIFY_SQ";
        DestroySq = 0x906, "DESTROY_SQ", "MLX5_CMD_OP_DESTROY_SQ";
        QuerySq = 0x907, "QUERY_SQ", "MLX5_CMD_OP_QUERY_SQ";
        CreateRq = 0x908, "CREATE_RQ", "MLX5_CMD_OP_CREATE_RQ";
        ModifyRq = 0x909, "MODIFY_RQ", "MLX5_CMD_OP_MODIFY_RQ";
        DestroyRq = 0x90a, "DESTROY_RQ", "MLX5_CMD_OP_DESTROY_RQ";
        QueryRq = 0x90b, "QUERY_RQ", "MLX5_CMD_OP_QUERY_RQ";
        CreateTis = 0x912, "CREATE_TIS", "MLX5_CMD_OP_CREATE_TIS";
        ModifyTis = 0x913, "MODIFY_TIS", "MLX5_CMD_OP_MODIFY_TIS";
        DestroyTis = 0x914, "DESTROY_TIS", "MLX5_CMD_OP_DESTROY_TIS";
        QueryTis = 0x915, "QUERY_TIS", "MLX5_CMD_OP_QUERY_TIS";
        SetFlowTableRoot = 0x92f, "SET_FLOW_TABLE_ROOT", "MLX5_CMD_OP_SET_FLOW_TABLE_ROOT";
        CreateFlowTable = 0x930, "CREATE_FLOW_TABLE", "MLX5_CMD_OP_CREATE_FLOW_TABLE";
        DestroyFlowTable = 0x931, "DESTROY_FLOW_TABLE", "MLX5_CMD_OP_DESTROY_FLOW_TABLE";
        QueryFlowTable = 0x932, "QUERY_FLOW_TABLE", "MLX5_CMD_OP_QUERY_FLOW_TABLE";
        CreateFlowGroup = 0x933, "CREATE_FLOW_GROUP", "MLX5_CMD_OP_CREATE_FLOW_GROUP";
        DestroyFlowGroup = 0x934, "DESTROY_FLOW_GROUP", "MLX5_CMD_OP_DESTROY_FLOW_GROUP";
        QueryFlowGroup = 0x935, "QUERY_FLOW_GROUP", "MLX5_CMD_OP_QUERY_FLOW_GROUP";
        SetFlowTableEntry = 0x936, "SET_FLOW_TABLE_ENTRY", "MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY";
        QueryFlowTableEntry = 0x937, "QUERY_FLOW_TABLE_ENTRY", "MLX5_CMD_OP_QUERY_FLOW_TABLE_ENTRY";
        DeleteFlowTableEntry = 0x938, "DELETE_FLOW_TABLE_ENTRY", "MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY";
    }
}

codes! {
    /// Command completion status (output byte 0).
    pub enum CmdStatus: u8, Kernel {
        Ok = 0x00, "OK", "MLX5_CMD_STAT_OK";
        InternalError = 0x01, "internal error", "MLX5_CMD_STAT_INT_ERR";
        BadOpcode = 0x02, "bad opcode", "MLX5_CMD_STAT_BAD_OP_ERR";
        BadParameter = 0x03, "bad parameter", "MLX5_CMD_STAT_BAD_PARAM_ERR";
        BadSystemState = 0x04, "bad system state", "MLX5_CMD_STAT_BAD_SYS_STATE_ERR";
        BadResource = 0x05, "bad resource", "MLX5_CMD_STAT_BAD_RES_ERR";
        ResourceBusy = 0x06, "resource busy", "MLX5_CMD_STAT_RES_BUSY";
        LimitsExceeded = 0x08, "limits exceeded", "MLX5_CMD_STAT_LIM_ERR";
        BadResourceState = 0x09, "bad resource state", "MLX5_CMD_STAT_BAD_RES_STATE_ERR";
        BadIndex = 0x0a, "bad index", "MLX5_CMD_STAT_IX_ERR";
        NoResources = 0x0f, "no resources", "MLX5_CMD_STAT_NO_RES_ERR";
        BadQpState = 0x10, "bad QP state", "MLX5_CMD_STAT_BAD_QP_STATE_ERR";
        BadPacket = 0x30, "bad packet", "MLX5_CMD_STAT_BAD_PKT_ERR";
        BadSize = 0x40, "bad size / too many outstanding CQEs", "MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR";
        BadInputLength = 0x50, "bad input length", "MLX5_CMD_STAT_BAD_INP_LEN_ERR";
        BadOutputLength = 0x51, "bad output length", "MLX5_CMD_STAT_BAD_OUTP_LEN_ERR";
    }
}

codes! {
    /// Delivery status of a command entry (`status_own >> 1`): whether the
    /// firmware could read the command at all. These values live in the
    /// kernel's `cmd.c`, not in an installed header, so they have no
    /// conformance twin (facts sheet §3.2, marked `[ext]`).
    pub enum DeliveryStatus: u8, Kernel {
        Ok = 0x0, "OK";
        SignatureError = 0x1, "signature error";
        TokenError = 0x2, "token error";
        BadBlockNumber = 0x3, "bad block number";
        OutputPointerNotAligned = 0x4, "output pointer not aligned";
        InputPointerNotAligned = 0x5, "input pointer not aligned";
        FwInternalError = 0x6, "firmware internal error";
        InputLengthError = 0x7, "input length error";
        OutputLengthError = 0x8, "output length error";
        ReservedNotZero = 0x9, "reserved fields not cleared";
        BadDescriptorType = 0x10, "bad command descriptor type";
    }
}

codes! {
    /// Health buffer syndromes (`synd`, 0 = healthy). Defined in the
    /// kernel's `health.c`, not in an installed header: no conformance twin.
    pub enum HealthSyndrome: u8, Kernel {
        FwInternal = 0x1, "firmware internal error";
        IriscNotResponding = 0x7, "iRISC not responding";
        UnrecoverableHw = 0x8, "unrecoverable hardware error";
        FwCrc = 0x9, "firmware CRC error";
        IcmFetchPciError = 0xa, "ICM fetch PCI error";
        HwFatal = 0xb, "hardware fatal error";
        AsyncEqOverrun = 0xc, "async EQ buffer overrun";
        EqError = 0xd, "EQ error";
        EqInvalid = 0xe, "invalid EQ referenced";
        Ffser = 0xf, "FFSER error";
        HighTemperature = 0x10, "high temperature";
    }
}

codes! {
    /// Event types (EQE `type`; bit n of CREATE_EQ's event mask).
    pub enum EventType: u8, Kernel {
        Completion = 0x00, "completion", "MLX5_EVENT_TYPE_COMP";
        CqError = 0x04, "CQ error", "MLX5_EVENT_TYPE_CQ_ERROR";
        WqCatastrophic = 0x05, "WQ catastrophic error", "MLX5_EVENT_TYPE_WQ_CATAS_ERROR";
        InternalError = 0x08, "internal error", "MLX5_EVENT_TYPE_INTERNAL_ERROR";
        PortChange = 0x09, "port change", "MLX5_EVENT_TYPE_PORT_CHANGE";
        Command = 0x0a, "command completion", "MLX5_EVENT_TYPE_CMD";
        PageRequest = 0x0b, "page request", "MLX5_EVENT_TYPE_PAGE_REQUEST";
        WqInvalidRequest = 0x10, "WQ invalid request", "MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR";
        WqAccessError = 0x11, "WQ access error", "MLX5_EVENT_TYPE_WQ_ACCESS_ERROR";
    }
}

codes! {
    /// CQE opcodes (`op_own >> 4`).
    pub enum CqeOpcode: u8, Dv {
        Req = 0x0, "REQ (send completed)", "MLX5_CQE_REQ";
        RespWrImm = 0x1, "RESP_WR_IMM", "MLX5_CQE_RESP_WR_IMM";
        RespSend = 0x2, "RESP_SEND (packet received)", "MLX5_CQE_RESP_SEND";
        RespSendImm = 0x3, "RESP_SEND_IMM", "MLX5_CQE_RESP_SEND_IMM";
        RespSendInv = 0x4, "RESP_SEND_INV", "MLX5_CQE_RESP_SEND_INV";
        Resize = 0x5, "RESIZE_CQ", "MLX5_CQE_RESIZE_CQ";
        NoPacket = 0x6, "NO_PACKET", "MLX5_CQE_NO_PACKET";
        SigErr = 0xc, "SIG_ERR", "MLX5_CQE_SIG_ERR";
        ReqErr = 0xd, "REQ_ERR", "MLX5_CQE_REQ_ERR";
        RespErr = 0xe, "RESP_ERR", "MLX5_CQE_RESP_ERR";
        Invalid = 0xf, "INVALID", "MLX5_CQE_INVALID";
    }
}

codes! {
    /// Error CQE syndromes (error CQE byte 0x37).
    pub enum CqeSyndrome: u8, Dv {
        LocalLength = 0x01, "local length error", "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR";
        LocalQpOperation = 0x02, "local QP operation error", "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR";
        LocalProtection = 0x04, "local protection error", "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR";
        WrFlushed = 0x05, "WR flushed", "MLX5_CQE_SYNDROME_WR_FLUSH_ERR";
        MwBind = 0x06, "memory window bind error", "MLX5_CQE_SYNDROME_MW_BIND_ERR";
        BadResponse = 0x10, "bad response", "MLX5_CQE_SYNDROME_BAD_RESP_ERR";
        LocalAccess = 0x11, "local access error", "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR";
        RemoteInvalidRequest = 0x12, "remote invalid request", "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR";
        RemoteAccess = 0x13, "remote access error", "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR";
        RemoteOperation = 0x14, "remote operation error", "MLX5_CQE_SYNDROME_REMOTE_OP_ERR";
        TransportRetryExceeded = 0x15, "transport retry exceeded", "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR";
        RnrRetryExceeded = 0x16, "RNR retry exceeded", "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR";
        RemoteAborted = 0x22, "remote aborted", "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR";
    }
}

codes! {
    /// SQ/RQ states (`sqc.state`, `rqc.state`).
    pub enum QueueState: u8, Kernel {
        Rst = 0x0, "RST", "MLX5_SQC_STATE_RST";
        Rdy = 0x1, "RDY", "MLX5_SQC_STATE_RDY";
        Err = 0x3, "ERR", "MLX5_SQC_STATE_ERR";
    }
}

codes! {
    /// Send WQE opcodes (control segment bits `[7:0]`).
    pub enum WqeOpcode: u8, Dv {
        Nop = 0x00, "NOP", "MLX5_OPCODE_NOP";
        Send = 0x0a, "SEND", "MLX5_OPCODE_SEND";
        Tso = 0x0e, "TSO", "MLX5_OPCODE_TSO";
    }
}

/// `wq.wq_type` values.
pub mod wq_type {
    /// Linked list.
    pub const LINKED_LIST: u8 = 0;
    /// Cyclic (SQs).
    pub const CYCLIC: u8 = 1;
    /// Linked-list striding RQ.
    pub const LINKED_LIST_STRIDING: u8 = 2;
    /// Cyclic striding RQ (the multi-packet RQ used here).
    pub const CYCLIC_STRIDING: u8 = 3;
}

/// QUERY_HCA_CAP / SET_HCA_CAP capability types (`op_mod >> 1`).
pub mod cap_type {
    /// General device capabilities.
    pub const GENERAL: u16 = 0;
    /// Ethernet offloads.
    pub const ETHERNET_OFFLOADS: u16 = 1;
    /// NIC flow tables.
    pub const NIC_FLOW_TABLE: u16 = 7;
    /// General device capabilities 2 (`cmd_hca_cap_2`).
    pub const GENERAL_2: u16 = 0x20;
    /// QUERY_HCA_CAP mode bit: current values (0 = maximum).
    pub const MODE_CURRENT: u16 = 1;
}

/// QUERY_PAGES op_mod values.
pub mod pages_op_mod {
    /// Boot pages.
    pub const BOOT: u16 = 1;
    /// Init pages.
    pub const INIT: u16 = 2;
    /// Regular (post-init) pages.
    pub const REGULAR: u16 = 3;
}

/// MANAGE_PAGES op_mod values.
pub mod manage_pages_op_mod {
    /// Firmware asked but we cannot give.
    pub const CANNOT_GIVE: u16 = 0;
    /// Give pages.
    pub const GIVE: u16 = 1;
    /// Take pages back.
    pub const TAKE: u16 = 2;
}

/// Access-register ids.
pub mod reg {
    /// HOST_ENDIANNESS.
    pub const HOST_ENDIANNESS: u16 = 0x7004;
}

/// Flow steering numbers.
pub mod flow {
    /// NIC receive table type.
    pub const TABLE_TYPE_NIC_RX: u8 = 0;
    /// Match criteria enable: outer headers.
    pub const MATCH_OUTER_HEADERS: u8 = 1 << 0;
    /// Flow context action: forward to the destination list.
    pub const ACTION_FWD_DEST: u16 = 0x4;
    /// Flow context action: drop.
    pub const ACTION_DROP: u16 = 0x2;
    /// Destination type: TIR.
    pub const DEST_TIR: u8 = 0x2;
    /// Destination type: flow table.
    pub const DEST_FLOW_TABLE: u8 = 0x1;
    /// SET_FLOW_TABLE_ROOT op_mod: back to the default root (table id
    /// ignored); only with the `reset_root_to_default` flow table cap.
    pub const SET_ROOT_OP_MOD_DISCONNECT: u16 = 1;
}

/// Ethernet cap `wqe_inline_mode`: where the send inline requirement comes
/// from.
pub mod inline_mode {
    /// The L2 header must always be inline (ConnectX-4 class).
    pub const L2: u8 = 0;
    /// The requirement is `nic_vport_context.min_wqe_inline_mode`; only
    /// then does `sqc.min_wqe_inline_mode` apply.
    pub const VPORT_CONTEXT: u8 = 1;
    /// Nothing needs to be inline.
    pub const NOT_REQUIRED: u8 = 2;
}

/// `sqc.ts_format` / `rqc.ts_format`: the CQE timestamp format.
pub mod ts_format {
    /// The free-running internal timer.
    pub const FREE_RUNNING: u8 = 0;
    /// The device default.
    pub const DEFAULT: u8 = 1;
    /// Real time (seconds << 32 | nanoseconds).
    pub const REAL_TIME: u8 = 2;
}

/// `cmd_hca_cap.sq_ts_format` / `rq_ts_format`: formats a queue may use.
pub mod ts_format_cap {
    /// Free-running only.
    pub const FREE_RUNNING: u8 = 0;
    /// Real time only.
    pub const REAL_TIME: u8 = 1;
    /// Either.
    pub const FREE_RUNNING_AND_REAL_TIME: u8 = 2;
}

/// Independent twins of the sub-field constants in this module's siblings.
pub const MISC_CONSTS: &[ConstDesc] = &[
    k(
        "cap_type::GENERAL",
        cap_type::GENERAL as u64,
        "MLX5_CAP_GENERAL",
    ),
    k(
        "cap_type::ETHERNET_OFFLOADS",
        cap_type::ETHERNET_OFFLOADS as u64,
        "MLX5_CAP_ETHERNET_OFFLOADS",
    ),
    k(
        "cap_type::NIC_FLOW_TABLE",
        cap_type::NIC_FLOW_TABLE as u64,
        "MLX5_CAP_FLOW_TABLE",
    ),
    k(
        "cap_type::GENERAL_2",
        cap_type::GENERAL_2 as u64,
        "MLX5_CAP_GENERAL_2",
    ),
    k(
        "pages_op_mod::BOOT",
        pages_op_mod::BOOT as u64,
        "MLX5_QUERY_PAGES_IN_OP_MOD_BOOT_PAGES",
    ),
    k(
        "pages_op_mod::INIT",
        pages_op_mod::INIT as u64,
        "MLX5_QUERY_PAGES_IN_OP_MOD_INIT_PAGES",
    ),
    k(
        "pages_op_mod::REGULAR",
        pages_op_mod::REGULAR as u64,
        "MLX5_QUERY_PAGES_IN_OP_MOD_REGULAR_PAGES",
    ),
    k(
        "reg::HOST_ENDIANNESS",
        reg::HOST_ENDIANNESS as u64,
        "MLX5_REG_HOST_ENDIANNESS",
    ),
    k(
        "flow::TABLE_TYPE_NIC_RX",
        flow::TABLE_TYPE_NIC_RX as u64,
        "MLX5_FLOW_TABLE_TYPE_NIC_RX",
    ),
    k(
        "flow::MATCH_OUTER_HEADERS",
        flow::MATCH_OUTER_HEADERS as u64,
        "MLX5_MATCH_OUTER_HEADERS",
    ),
    k(
        "flow::ACTION_FWD_DEST",
        flow::ACTION_FWD_DEST as u64,
        "MLX5_FLOW_CONTEXT_ACTION_FWD_DEST",
    ),
    k(
        "flow::ACTION_DROP",
        flow::ACTION_DROP as u64,
        "MLX5_FLOW_CONTEXT_ACTION_DROP",
    ),
    k(
        "flow::DEST_TIR",
        flow::DEST_TIR as u64,
        "MLX5_IFC_FLOW_DESTINATION_TYPE_TIR",
    ),
    k(
        "flow::DEST_FLOW_TABLE",
        flow::DEST_FLOW_TABLE as u64,
        "MLX5_IFC_FLOW_DESTINATION_TYPE_FLOW_TABLE",
    ),
    k(
        "inline_mode::L2",
        inline_mode::L2 as u64,
        "MLX5_CAP_INLINE_MODE_L2",
    ),
    k(
        "inline_mode::VPORT_CONTEXT",
        inline_mode::VPORT_CONTEXT as u64,
        "MLX5_CAP_INLINE_MODE_VPORT_CONTEXT",
    ),
    k(
        "inline_mode::NOT_REQUIRED",
        inline_mode::NOT_REQUIRED as u64,
        "MLX5_CAP_INLINE_MODE_NOT_REQUIRED",
    ),
    k(
        "ts_format::FREE_RUNNING",
        ts_format::FREE_RUNNING as u64,
        "MLX5_TIMESTAMP_FORMAT_FREE_RUNNING",
    ),
    k(
        "ts_format::DEFAULT",
        ts_format::DEFAULT as u64,
        "MLX5_TIMESTAMP_FORMAT_DEFAULT",
    ),
    k(
        "ts_format::REAL_TIME",
        ts_format::REAL_TIME as u64,
        "MLX5_TIMESTAMP_FORMAT_REAL_TIME",
    ),
    k(
        "ts_format_cap::FREE_RUNNING",
        ts_format_cap::FREE_RUNNING as u64,
        "MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING",
    ),
    k(
        "ts_format_cap::REAL_TIME",
        ts_format_cap::REAL_TIME as u64,
        "MLX5_TIMESTAMP_FORMAT_CAP_REAL_TIME",
    ),
    k(
        "ts_format_cap::FREE_RUNNING_AND_REAL_TIME",
        ts_format_cap::FREE_RUNNING_AND_REAL_TIME as u64,
        "MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING_AND_REAL_TIME",
    ),
    k(
        "wq_type::LINKED_LIST",
        wq_type::LINKED_LIST as u64,
        "MLX5_WQ_TYPE_LINKED_LIST",
    ),
    k(
        "wq_type::CYCLIC",
        wq_type::CYCLIC as u64,
        "MLX5_WQ_TYPE_CYCLIC",
    ),
    k(
        "wq_type::LINKED_LIST_STRIDING",
        wq_type::LINKED_LIST_STRIDING as u64,
        "MLX5_WQ_TYPE_LINKED_LIST_STRIDING_RQ",
    ),
    k(
        "wq_type::CYCLIC_STRIDING",
        wq_type::CYCLIC_STRIDING as u64,
        "MLX5_WQ_TYPE_CYCLIC_STRIDING_RQ",
    ),
];

const fn k(rust: &'static str, value: u64, c_name: &'static str) -> ConstDesc {
    ConstDesc {
        rust,
        value,
        header: ConstHeader::Kernel,
        c_name,
    }
}
