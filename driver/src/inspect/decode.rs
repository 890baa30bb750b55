//! Send and striding-RQ WQEs decoded for display.

use std::fmt;

use serde::Serialize;

use crate::prm::codes::WqeOpcode;
use crate::prm::wqe::{
    ETH_L2_INLINE_HEADER_SIZE, MprqWqe, SEND_WQE_BB, SEND_WQE_DS, WqeCtrlSeg, WqeDataSeg,
    WqeEthSeg, WqeSrqNextSeg,
};
use crate::prm::{Layout, View};

/// A data (gather) segment, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DataSeg {
    /// Bytes (bit 31: inline, never set here).
    pub byte_count: u32,
    /// Memory key.
    pub lkey: u32,
    /// IOVA.
    pub addr: u64,
}

impl fmt::Display for DataSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data {} bytes lkey 0x{:x} addr 0x{:x}",
            self.byte_count, self.lkey, self.addr
        )
    }
}

/// A send WQE, decoded from its WQEBBs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SendWqe {
    /// Opcode (`SEND`, `NOP`, ...).
    pub opcode: u8,
    /// Opcode modifier.
    pub opmod: u8,
    /// WQE index (the producer counter when it was written, 16 bits).
    pub wqe_index: u16,
    /// SQ number.
    pub sqn: u32,
    /// Size in 16-byte units.
    pub ds: u8,
    /// `fm_ce_se`: fence, completion mode, solicited.
    pub fm_ce_se: u8,
    /// A completion is requested.
    pub signaled: bool,
    /// Immediate / TIS.
    pub imm: u32,
    /// Ethernet segment: checksum flags, MSS, inline header bytes (hex).
    pub eth: Option<(u8, u16, String)>,
    /// Gather segments.
    pub data: Vec<DataSeg>,
}

/// Decodes the send WQE starting at the first byte of `bytes` (its
/// WQEBBs, in order; the WQE's `ds` says how many 16-byte units count).
pub fn decode_send_wqe(bytes: &[u8]) -> Option<SendWqe> {
    let ctrl = View::<WqeCtrlSeg>::new(bytes.get(..WqeCtrlSeg::BYTES)?)?;
    let oio = ctrl.get32(WqeCtrlSeg::OPMOD_IDX_OPCODE);
    let qds = ctrl.get32(WqeCtrlSeg::QPN_DS);
    let ds = (qds & 0x3f) as u8;
    let fm_ce_se = ctrl.get32(WqeCtrlSeg::FM_CE_SE) as u8;
    let mut w = SendWqe {
        opcode: oio as u8,
        opmod: (oio >> 24) as u8,
        wqe_index: (oio >> 8) as u16,
        sqn: qds >> 8,
        ds,
        fm_ce_se,
        signaled: fm_ce_se & crate::prm::wqe::CTRL_CQ_UPDATE != 0,
        imm: ctrl.get32(WqeCtrlSeg::IMM),
        eth: None,
        data: Vec::new(),
    };
    let units = usize::from(ds).min(bytes.len() / SEND_WQE_DS);
    let mut u = 1;
    if WqeOpcode::from_raw(w.opcode) != Some(WqeOpcode::Nop) && u < units {
        let eth = View::<WqeEthSeg>::new(bytes.get(SEND_WQE_DS..SEND_WQE_DS + WqeEthSeg::BYTES)?)?;
        let sz = eth.get32(WqeEthSeg::INLINE_HDR_SZ) as usize;
        let start = SEND_WQE_DS + (WqeEthSeg::INLINE_HDR_START.bit() / 8) as usize;
        let inline = bytes.get(start..start + sz.min(ETH_L2_INLINE_HEADER_SIZE))?;
        w.eth = Some((
            eth.get32(WqeEthSeg::CS_FLAGS) as u8,
            eth.get32(WqeEthSeg::MSS) as u16,
            debug_endpoint::hex(inline),
        ));
        // The Ethernet segment and the inline bytes past its first 16.
        u += 1 + sz.saturating_sub(2).div_ceil(SEND_WQE_DS);
        while u < units {
            let d = View::<WqeDataSeg>::new(bytes.get(u * SEND_WQE_DS..(u + 1) * SEND_WQE_DS)?)?;
            w.data.push(DataSeg {
                byte_count: d.get32(WqeDataSeg::BYTE_COUNT),
                lkey: d.get32(WqeDataSeg::LKEY),
                addr: d.get(WqeDataSeg::ADDR),
            });
            u += 1;
        }
    }
    Some(w)
}

impl fmt::Display for SendWqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = WqeOpcode::from_raw(self.opcode).map_or("unknown opcode", |o| o.name());
        write!(
            f,
            "WQE {op} (0x{:02x}) index {} sqn 0x{:x} ds {} ({} WQEBB){}",
            self.opcode,
            self.wqe_index,
            self.sqn,
            self.ds,
            (usize::from(self.ds) * SEND_WQE_DS).div_ceil(SEND_WQE_BB),
            if self.signaled { " signaled" } else { "" }
        )?;
        if let Some((cs, mss, inline)) = &self.eth {
            write!(f, "; eth cs_flags 0x{cs:02x} mss {mss}")?;
            if !inline.is_empty() {
                write!(f, " inline {} bytes {inline}", inline.len() / 2)?;
            }
        }
        for d in &self.data {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

/// A striding RQ WQE, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MprqWqeDecoded {
    /// Next WQE index (unused for cyclic RQs).
    pub next_wqe_index: u16,
    /// The buffer all strides of the WQE share.
    pub buffer: DataSeg,
}

/// Decodes a 32-byte striding RQ WQE.
pub fn decode_mprq_wqe(bytes: &[u8]) -> Option<MprqWqeDecoded> {
    let v = View::<MprqWqe>::new(bytes.get(..MprqWqe::BYTES)?)?;
    let n = v.sub(MprqWqe::NSEG);
    let d = v.sub(MprqWqe::DSEG);
    Some(MprqWqeDecoded {
        next_wqe_index: n.get32(WqeSrqNextSeg::NEXT_WQE_INDEX) as u16,
        buffer: DataSeg {
            byte_count: d.get32(WqeDataSeg::BYTE_COUNT),
            lkey: d.get32(WqeDataSeg::LKEY),
            addr: d.get(WqeDataSeg::ADDR),
        },
    })
}

impl fmt::Display for MprqWqeDecoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "striding RQ WQE: {}", self.buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_wqes_decode_with_and_without_the_inline_header() {
        // A signaled SEND with the 18-byte L2 header inline and two gathers
        // (5 DS, 2 WQEBBs), as QueueSet::write_send_wqe builds it.
        let mut b = vec![0u8; 128];
        b[0..4].copy_from_slice(&((0x1234u32 << 8) | 0x0a).to_be_bytes());
        b[4..8].copy_from_slice(&((0x56u32 << 8) | 5).to_be_bytes());
        b[11] = crate::prm::wqe::CTRL_CQ_UPDATE;
        b[16 + 12..16 + 14].copy_from_slice(&18u16.to_be_bytes());
        for (i, x) in b[16 + 14..16 + 32].iter_mut().enumerate() {
            *x = i as u8;
        }
        b[48..52].copy_from_slice(&70u32.to_be_bytes());
        b[52..56].copy_from_slice(&0x77u32.to_be_bytes());
        b[56..64].copy_from_slice(&0x1000u64.to_be_bytes());
        b[64..68].copy_from_slice(&900u32.to_be_bytes());
        b[68..72].copy_from_slice(&0x77u32.to_be_bytes());
        b[72..80].copy_from_slice(&0x2000u64.to_be_bytes());
        let w = decode_send_wqe(&b).unwrap();
        assert_eq!(
            (w.opcode, w.wqe_index, w.sqn, w.ds, w.signaled),
            (0x0a, 0x1234, 0x56, 5, true)
        );
        let (_, _, inline) = w.eth.as_ref().unwrap();
        assert_eq!(inline.len(), 36);
        assert!(inline.starts_with("0001"));
        assert_eq!(w.data.len(), 2);
        assert_eq!((w.data[0].byte_count, w.data[0].addr), (70, 0x1000));
        assert_eq!((w.data[1].byte_count, w.data[1].addr), (900, 0x2000));
        let s = w.to_string();
        assert!(
            s.contains("SEND") && s.contains("2 WQEBB") && s.contains("signaled"),
            "{s}"
        );
        // A NOP: control segment only.
        let mut n = vec![0u8; 64];
        n[0..4].copy_from_slice(&(7u32 << 8).to_be_bytes());
        n[4..8].copy_from_slice(&((0x56u32 << 8) | 1).to_be_bytes());
        let w = decode_send_wqe(&n).unwrap();
        assert_eq!((w.opcode, w.wqe_index, w.ds), (0, 7, 1));
        assert!(w.eth.is_none() && w.data.is_empty());
        assert!(decode_send_wqe(&n[..8]).is_none());
    }
}
