//! Completion and event queue entries: the 64-byte CQE (incl. the error
//! CQE view) from rdma-core's `mlx5dv.h`, and the 64-byte EQE with its
//! event-data layouts from the kernel's `device.h`.
//!
//! [`Cqe`] and [`Eqe`] are decoded copies with one-line `Display`s for logs
//! and dumps; the layouts are what the device model writes and the driver
//! reads.

use std::fmt;

use crate::layout;
use crate::prm::codes::{CqeOpcode, CqeSyndrome, EventType};
use crate::prm::{ConstDesc, ConstHeader, Source, View};

layout! {
    /// A 64-byte CQE (`cqe_sz = 0`).
    pub struct Cqe64: Source::Dv("mlx5_cqe64"), 64 * 8;
    /// Striding RQ: the multi-packet WQE the packet landed in (free-running 16-bit counter).
    WQE_ID: field = "wqe_id" @ 8 * 0x02, 16;
    /// Multi-path bits.
    ML_PATH: field = "ml_path" @ 8 * 0x11, 8;
    /// Source LID (IB only).
    SLID: field = "slid" @ 8 * 0x16, 16;
    /// Flags and remote QPN.
    FLAGS_RQPN: field = "flags_rqpn" @ 8 * 0x18, 32;
    /// Bit 0 L2 OK, bit 1 L3 checksum OK, bit 2 L4 checksum OK.
    HDS_IP_EXT: field = "hds_ip_ext" @ 8 * 0x1c, 8;
    /// `[6:4]` L4 type, `[3:2]` L3 type, `[0]` VLAN present.
    L4_HDR_TYPE_ETC: field = "l4_hdr_type_etc" @ 8 * 0x1d, 8;
    /// VLAN tag.
    VLAN_INFO: field = "vlan_info" @ 8 * 0x1e, 16;
    /// `[31:24]` LRO segments, `[23:0]` user index (cqe_version 1) or SRQ number.
    SRQN_UIDX: field = "srqn_uidx" @ 8 * 0x20, 32;
    /// Immediate / invalidated rkey / pkey / flow metadata.
    IMM_INVAL_PKEY: field = "imm_inval_pkey" @ 8 * 0x24, 32;
    /// Striding RQ: `[31]` filler, `[30:16]` strides consumed, `[15:0]` bytes. Otherwise bytes.
    BYTE_CNT: field = "byte_cnt" @ 8 * 0x2c, 32;
    /// Device clock at completion.
    TIMESTAMP: field = "timestamp" @ 8 * 0x30, 64;
    /// `[31:24]` opcode of the WQE (send CQE), `[23:0]` queue number.
    SOP_DROP_QPN: field = "sop_drop_qpn" @ 8 * 0x38, 32;
    /// SQ: WQE index. Striding RQ: stride index of the packet's first stride.
    WQE_COUNTER: field = "wqe_counter" @ 8 * 0x3c, 16;
    /// Signature / validity iteration count.
    SIGNATURE: field = "signature" @ 8 * 0x3e, 8;
    /// `[7:4]` opcode, `[3:2]` format, `[1]` solicited, `[0]` owner.
    OP_OWN: field = "op_own" @ 8 * 0x3f, 8;
}

layout! {
    /// The error view of a CQE (opcode REQ_ERR or RESP_ERR).
    pub struct ErrCqe: Source::Dv("mlx5_err_cqe"), 64 * 8;
    /// SRQ number.
    SRQN: field = "srqn" @ 8 * 0x20, 32;
    /// Vendor-specific syndrome.
    VENDOR_ERR_SYND: field = "vendor_err_synd" @ 8 * 0x36, 8;
    /// Syndrome (see `CqeSyndrome`).
    SYNDROME: field = "syndrome" @ 8 * 0x37, 8;
    /// `[31:24]` WQE opcode, `[23:0]` queue number.
    S_WQE_OPCODE_QPN: field = "s_wqe_opcode_qpn" @ 8 * 0x38, 32;
    /// WQE index of the failed WQE.
    WQE_COUNTER: field = "wqe_counter" @ 8 * 0x3c, 16;
    /// Signature.
    SIGNATURE: field = "signature" @ 8 * 0x3e, 8;
    /// Opcode and owner.
    OP_OWN: field = "op_own" @ 8 * 0x3f, 8;
}

layout! {
    /// A 64-byte event queue entry.
    pub struct Eqe: Source::Kernel { header: "device.h", name: "mlx5_eqe" }, 64 * 8;
    /// Event type (see `EventType`).
    TYPE: field = "type" @ 8 * 0x01, 8;
    /// Event sub-type.
    SUB_TYPE: field = "sub_type" @ 8 * 0x03, 8;
    /// 28 bytes of event data (`EqeCmd`, `EqePageReq`, `EqeCqErr`).
    DATA: sub<EqeData> = "data" @ 8 * 0x20;
    /// Signature.
    SIGNATURE: field = "signature" @ 8 * 0x3e, 8;
    /// Bit 0: owner (hardware writes pass number & 1).
    OWNER: field = "owner" @ 8 * 0x3f, 8;
}

layout! {
    /// Raw event data (28 bytes).
    pub struct EqeData: Source::Kernel { header: "device.h", name: "ev_data" }, 28 * 8;
    /// The seven data dwords.
    RAW: field = "raw" @ 0, 28 * 8;
}

layout! {
    /// Command-completion event data.
    pub struct EqeCmd: Source::Kernel { header: "device.h", name: "mlx5_eqe_cmd" }, 28 * 8;
    /// Bit n = command slot n finished.
    VECTOR: field = "vector" @ 0, 32;
}

layout! {
    /// Page-request event data.
    pub struct EqePageReq: Source::Kernel { header: "device.h", name: "mlx5_eqe_page_req" }, 28 * 8;
    /// Embedded-CPU function flag.
    EC_FUNCTION: field = "ec_function" @ 8 * 0x00, 16;
    /// Function id.
    FUNC_ID: field = "func_id" @ 8 * 0x02, 16;
    /// Pages wanted (> 0) or offered back (< 0), signed.
    NUM_PAGES: field = "num_pages" @ 8 * 0x04, 32;
}

layout! {
    /// CQ-error event data.
    pub struct EqeCqErr: Source::Kernel { header: "device.h", name: "mlx5_eqe_cq_err" }, 12 * 8;
    /// `[23:0]` CQ number.
    CQN: field = "cqn" @ 0, 32;
    /// Error syndrome (1 overrun, 2 access violation).
    SYNDROME: field = "syndrome" @ 8 * 0x0b, 8;
}

/// `op_own` bit 0: owner.
pub const CQE_OWNER_MASK: u8 = 1;
/// `op_own` opcode shift.
pub const CQE_OPCODE_SHIFT: u32 = 4;
/// `op_own` format field: bits `[3:2]`; 3 = compressed.
pub const CQE_FORMAT_SHIFT: u32 = 2;
/// What software writes into `op_own` of every CQE before handing a CQ to
/// the device: opcode INVALID, owner 0.
pub const CQE_OP_OWN_INVALID: u8 = 0xf0;

/// CQE `hds_ip_ext`: the L2 header is fine.
pub const CQE_L2_OK: u8 = 1 << 0;
/// CQE `hds_ip_ext`: the IPv4 header checksum is right.
pub const CQE_L3_OK: u8 = 1 << 1;
/// CQE `hds_ip_ext`: the TCP/UDP checksum is right.
pub const CQE_L4_OK: u8 = 1 << 2;

/// CQE `l4_hdr_type_etc`: the L3 header type is bits `[3:2]`.
pub const CQE_L3_HDR_TYPE_SHIFT: u32 = 2;
/// CQE `l4_hdr_type_etc`: L3 header type mask (after the shift).
pub const CQE_L3_HDR_TYPE_MASK: u8 = 3;
/// CQE L3 header type: none (not IP).
pub const CQE_L3_HDR_TYPE_NONE: u8 = 0;
/// CQE L3 header type: IPv6.
pub const CQE_L3_HDR_TYPE_IPV6: u8 = 1;
/// CQE L3 header type: IPv4.
pub const CQE_L3_HDR_TYPE_IPV4: u8 = 2;

bitflags::bitflags! {
    /// A receive CQE's `hds_ip_ext` checksum flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CqeChecksum: u8 {
        /// L2 OK.
        const L2_OK = CQE_L2_OK;
        /// L3 (IPv4 header) checksum OK.
        const L3_OK = CQE_L3_OK;
        /// L4 checksum OK.
        const L4_OK = CQE_L4_OK;
        const _ = !0;
    }
}
/// Striding RQ `byte_cnt`: filler CQE flag.
pub const MPWRQ_FILLER: u32 = 1 << 31;
/// Striding RQ `byte_cnt`: strides consumed, bits `[30:16]`.
pub const MPWRQ_STRIDES_SHIFT: u32 = 16;
/// Striding RQ `byte_cnt`: strides mask after shifting (15 bits).
pub const MPWRQ_STRIDES_MASK: u32 = 0x7fff;
/// Striding RQ `byte_cnt`: byte count mask.
pub const MPWRQ_BYTES_MASK: u32 = 0xffff;

/// Independent twins.
pub const CONSTS: &[ConstDesc] = &[
    ConstDesc {
        rust: "cqe::CQE_OWNER_MASK",
        value: CQE_OWNER_MASK as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_OWNER_MASK",
    },
    ConstDesc {
        rust: "cqe::CQE_L2_OK",
        value: CQE_L2_OK as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L2_OK",
    },
    ConstDesc {
        rust: "cqe::CQE_L3_OK",
        value: CQE_L3_OK as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L3_OK",
    },
    ConstDesc {
        rust: "cqe::CQE_L4_OK",
        value: CQE_L4_OK as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L4_OK",
    },
    ConstDesc {
        rust: "cqe::CQE_L3_HDR_TYPE_NONE",
        value: CQE_L3_HDR_TYPE_NONE as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L3_HDR_TYPE_NONE",
    },
    ConstDesc {
        rust: "cqe::CQE_L3_HDR_TYPE_IPV6",
        value: CQE_L3_HDR_TYPE_IPV6 as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L3_HDR_TYPE_IPV6",
    },
    ConstDesc {
        rust: "cqe::CQE_L3_HDR_TYPE_IPV4",
        value: CQE_L3_HDR_TYPE_IPV4 as u64,
        header: ConstHeader::Dv,
        c_name: "MLX5_CQE_L3_HDR_TYPE_IPV4",
    },
];

/// A CQE, decoded (a copy, never a reference into the ring).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cqe {
    /// Opcode, raw (`op_own >> 4`).
    pub opcode: u8,
    /// Format field.
    pub format: u8,
    /// Owner bit.
    pub owner: bool,
    /// Striding RQ WQE id (16-bit free-running).
    pub wqe_id: u16,
    /// WQE counter / stride index.
    pub wqe_counter: u16,
    /// Raw byte count.
    pub byte_cnt: u32,
    /// Queue number (`sop_drop_qpn[23:0]`).
    pub qpn: u32,
    /// WQE opcode (`sop_drop_qpn[31:24]`, send CQEs).
    pub wqe_opcode: u8,
    /// Timestamp.
    pub timestamp: u64,
    /// L3/L4 header types and VLAN flag.
    pub l4_hdr_type_etc: u8,
    /// Checksum-OK flags.
    pub hds_ip_ext: u8,
    /// Error syndrome (error CQEs only; 0 in every other CQE, whose bytes
    /// at that offset belong to the timestamp).
    pub syndrome: u8,
    /// Vendor syndrome (error CQEs only; 0 otherwise).
    pub vendor_err_synd: u8,
}

impl Cqe {
    /// Decodes a 64-byte CQE.
    pub fn decode(bytes: &[u8; 64]) -> Cqe {
        let v = View::<Cqe64>::new(bytes).expect("64 bytes");
        let e = View::<ErrCqe>::new(bytes).expect("64 bytes");
        let op_own = v.get32(Cqe64::OP_OWN) as u8;
        let sop = v.get32(Cqe64::SOP_DROP_QPN);
        // The error layout's syndrome bytes are the low bytes of the
        // timestamp in every other CQE: decoded for error CQEs only (0
        // otherwise), so no reader takes a timestamp for a syndrome.
        let err = matches!(
            CqeOpcode::from_raw(op_own >> CQE_OPCODE_SHIFT),
            Some(CqeOpcode::ReqErr | CqeOpcode::RespErr)
        );
        let err_byte = |f| if err { e.get32(f) as u8 } else { 0 };
        Cqe {
            opcode: op_own >> CQE_OPCODE_SHIFT,
            format: (op_own >> CQE_FORMAT_SHIFT) & 3,
            owner: op_own & CQE_OWNER_MASK != 0,
            wqe_id: v.get32(Cqe64::WQE_ID) as u16,
            wqe_counter: v.get32(Cqe64::WQE_COUNTER) as u16,
            byte_cnt: v.get32(Cqe64::BYTE_CNT),
            qpn: sop & 0x00ff_ffff,
            wqe_opcode: (sop >> 24) as u8,
            timestamp: v.get(Cqe64::TIMESTAMP),
            l4_hdr_type_etc: v.get32(Cqe64::L4_HDR_TYPE_ETC) as u8,
            hds_ip_ext: v.get32(Cqe64::HDS_IP_EXT) as u8,
            syndrome: err_byte(ErrCqe::SYNDROME),
            vendor_err_synd: err_byte(ErrCqe::VENDOR_ERR_SYND),
        }
    }

    /// The opcode, if known.
    pub fn op(&self) -> Option<CqeOpcode> {
        CqeOpcode::from_raw(self.opcode)
    }

    /// The receive checksum flags (`hds_ip_ext`).
    pub fn checksum(&self) -> CqeChecksum {
        CqeChecksum::from_bits_retain(self.hds_ip_ext)
    }

    /// True for REQ_ERR and RESP_ERR.
    pub fn is_error(&self) -> bool {
        matches!(self.op(), Some(CqeOpcode::ReqErr | CqeOpcode::RespErr))
    }

    /// Striding RQ: filler CQE.
    pub fn is_filler(&self) -> bool {
        self.byte_cnt & MPWRQ_FILLER != 0
    }

    /// Striding RQ: strides consumed.
    pub fn strides(&self) -> u32 {
        (self.byte_cnt >> MPWRQ_STRIDES_SHIFT) & MPWRQ_STRIDES_MASK
    }

    /// Striding RQ: packet bytes.
    pub fn mpwrq_bytes(&self) -> u32 {
        self.byte_cnt & MPWRQ_BYTES_MASK
    }
}

impl fmt::Display for Cqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.op().map(|o| o.name()).unwrap_or("unknown opcode");
        if self.is_error() {
            let synd = CqeSyndrome::from_raw(self.syndrome)
                .map(|s| s.name())
                .unwrap_or("unknown syndrome");
            return write!(
                f,
                "CQE {op} (0x{:x}) qpn 0x{:x} wqe_counter {} syndrome 0x{:02x} {synd} vendor 0x{:02x} owner {}",
                self.opcode,
                self.qpn,
                self.wqe_counter,
                self.syndrome,
                self.vendor_err_synd,
                self.owner as u8
            );
        }
        write!(
            f,
            "CQE {op} (0x{:x}) qpn 0x{:x} wqe_id {} wqe_counter {} byte_cnt 0x{:08x}",
            self.opcode, self.qpn, self.wqe_id, self.wqe_counter, self.byte_cnt
        )?;
        if self.op() == Some(CqeOpcode::RespSend) {
            write!(
                f,
                " (strides {} bytes {}{})",
                self.strides(),
                self.mpwrq_bytes(),
                if self.is_filler() { " filler" } else { "" }
            )?;
        }
        write!(f, " owner {}", self.owner as u8)
    }
}

/// An EQE, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EqeDecoded {
    /// Event type, raw.
    pub event_type: u8,
    /// Sub-type.
    pub sub_type: u8,
    /// Owner bit.
    pub owner: bool,
    /// The 28 data bytes.
    pub data: [u8; 28],
}

impl EqeDecoded {
    /// Decodes a 64-byte EQE.
    pub fn decode(bytes: &[u8; 64]) -> EqeDecoded {
        let v = View::<Eqe>::new(bytes).expect("64 bytes");
        let mut data = [0u8; 28];
        data.copy_from_slice(v.sub(Eqe::DATA).bytes(EqeData::RAW));
        EqeDecoded {
            event_type: v.get32(Eqe::TYPE) as u8,
            sub_type: v.get32(Eqe::SUB_TYPE) as u8,
            owner: v.get32(Eqe::OWNER) & 1 != 0,
            data,
        }
    }

    /// Page request: signed page count (positive = give, negative = take).
    pub fn page_request(&self) -> Option<(u16, i32)> {
        (self.event_type == EventType::PageRequest as u8).then(|| {
            let d = View::<EqePageReq>::new(&self.data).expect("28 bytes");
            (
                d.get32(EqePageReq::FUNC_ID) as u16,
                d.get32(EqePageReq::NUM_PAGES) as i32,
            )
        })
    }

    /// Page request with the function it is for: (`ec_function`,
    /// `func_id`, `num_pages`). MANAGE_PAGES must echo both.
    pub fn page_request_for(&self) -> Option<(bool, u16, i32)> {
        (self.event_type == EventType::PageRequest as u8).then(|| {
            let d = View::<EqePageReq>::new(&self.data).expect("28 bytes");
            (
                d.get32(EqePageReq::EC_FUNCTION) & 1 == 1,
                d.get32(EqePageReq::FUNC_ID) as u16,
                d.get32(EqePageReq::NUM_PAGES) as i32,
            )
        })
    }

    /// Command completion: slot vector.
    pub fn command_vector(&self) -> Option<u32> {
        (self.event_type == EventType::Command as u8).then(|| {
            View::<EqeCmd>::new(&self.data)
                .expect("28 bytes")
                .get32(EqeCmd::VECTOR)
        })
    }

    /// CQ error: CQ number and syndrome.
    pub fn cq_error(&self) -> Option<(u32, u8)> {
        (self.event_type == EventType::CqError as u8).then(|| {
            let d = View::<EqeCqErr>::new(&self.data).expect("28 bytes");
            (
                d.get32(EqeCqErr::CQN) & 0x00ff_ffff,
                d.get32(EqeCqErr::SYNDROME) as u8,
            )
        })
    }
}

impl fmt::Display for EqeDecoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = EventType::from_raw(self.event_type)
            .map(|e| e.name())
            .unwrap_or("unknown event");
        write!(
            f,
            "EQE {name} (0x{:02x}) sub 0x{:02x}",
            self.event_type, self.sub_type
        )?;
        if let Some((func, n)) = self.page_request() {
            write!(f, " function {func} num_pages {n}")?;
        } else if let Some(vec) = self.command_vector() {
            write!(f, " slots 0x{vec:08x}")?;
        } else if let Some((cqn, synd)) = self.cq_error() {
            write!(f, " cqn 0x{cqn:x} syndrome 0x{synd:02x}")?;
        }
        write!(f, " owner {}", self.owner as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prm::ViewMut;

    #[test]
    fn display_error_cqe_names_syndrome() {
        let mut b = [0u8; 64];
        let mut v = ViewMut::<ErrCqe>::new(&mut b).unwrap();
        v.set(ErrCqe::SYNDROME, 0x05)
            .set(ErrCqe::OP_OWN, 0xd1)
            .set(ErrCqe::S_WQE_OPCODE_QPN, 0x0a00_0042);
        let cqe = Cqe::decode(&b);
        assert!(cqe.is_error());
        let s = cqe.to_string();
        assert!(
            s.contains("REQ_ERR") && s.contains("WR flushed") && s.contains("qpn 0x42"),
            "{s}"
        );
        assert!(!s.contains('\n'));
    }

    /// A send CQE's timestamp fills the bytes where an error CQE keeps its
    /// syndromes: they are not read as syndromes.
    #[test]
    fn only_error_cqes_have_syndromes() {
        let mut b = [0u8; 64];
        let mut v = ViewMut::<Cqe64>::new(&mut b).unwrap();
        v.set(Cqe64::OP_OWN, 0x01)
            .set(Cqe64::TIMESTAMP, 0x03cb_c364);
        let cqe = Cqe::decode(&b);
        assert_eq!(cqe.op(), Some(CqeOpcode::Req));
        assert_eq!(cqe.timestamp, 0x03cb_c364);
        assert_eq!((cqe.syndrome, cqe.vendor_err_synd), (0, 0));
        // The same bytes under an error opcode are its syndromes.
        let mut v = ViewMut::<Cqe64>::new(&mut b).unwrap();
        v.set(Cqe64::OP_OWN, 0xd1);
        let cqe = Cqe::decode(&b);
        assert!(cqe.is_error());
        assert_eq!((cqe.syndrome, cqe.vendor_err_synd), (0x64, 0xc3));
    }

    #[test]
    fn display_rx_cqe_shows_strides() {
        let mut b = [0u8; 64];
        let mut v = ViewMut::<Cqe64>::new(&mut b).unwrap();
        v.set(Cqe64::OP_OWN, 0x20)
            .set(Cqe64::BYTE_CNT, (1 << 16) | 1000)
            .set(Cqe64::WQE_ID, 3);
        let s = Cqe::decode(&b).to_string();
        assert!(
            s.contains("RESP_SEND") && s.contains("strides 1 bytes 1000"),
            "{s}"
        );
    }

    #[test]
    fn page_request_eqe_is_signed() {
        let mut b = [0u8; 64];
        let mut v = ViewMut::<Eqe>::new(&mut b).unwrap();
        v.set(Eqe::TYPE, EventType::PageRequest as u64);
        let mut d = v.sub(Eqe::DATA);
        let raw = d.as_bytes_mut();
        raw[4..8].copy_from_slice(&(-7i32).to_be_bytes());
        let e = EqeDecoded::decode(&b);
        assert_eq!(e.page_request(), Some((0, -7)));
        assert!(e.to_string().contains("num_pages -7"));
    }
}
