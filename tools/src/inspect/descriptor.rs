//! `erpc-inspect PID --cqe N` / `--wqe N`: one descriptor of a queue,
//! hex-dumped and decoded.

use std::fmt::Write as _;

use mlx5::inspect::{decode_mprq_wqe, decode_send_wqe};
use mlx5::prm::cqe::Cqe;
use mlx5::prm::wqe::{SEND_WQE_BB, SEND_WQE_DS};

use super::*;

/// Which descriptor to dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descriptor {
    /// An RX CQE (always in the snapshot: the 8 the NIC overwrites).
    RxCqe(u32),
    /// A TX CQE (needs rings).
    TxCqe(u32),
    /// An SQ WQE starting at this WQEBB (needs rings).
    SqWqe(u32),
    /// A striding RQ WQE (needs rings).
    RqWqe(u32),
}

impl Descriptor {
    /// True if the snapshot must carry whole rings.
    pub fn needs_rings(self) -> bool {
        !matches!(self, Descriptor::RxCqe(_))
    }
}

/// Classic hex dump, 16 bytes per line.
pub fn hexdump(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(s, "      {:04x}: {}", i * 16, hex.join(" "));
    }
    s
}

fn cqe_detail(b: &[u8; 64]) -> String {
    let c = Cqe::decode(b);
    let mut s = format!("      {c}\n");
    let _ = writeln!(
        s,
        "      opcode 0x{:x} format {} owner {} wqe_id {} wqe_counter {} byte_cnt 0x{:08x} qpn 0x{:x} wqe_opcode 0x{:02x} timestamp {} l4_hdr_type_etc 0x{:02x} checksum {:?}",
        c.opcode,
        c.format,
        c.owner as u8,
        c.wqe_id,
        c.wqe_counter,
        c.byte_cnt,
        c.qpn,
        c.wqe_opcode,
        c.timestamp,
        c.l4_hdr_type_etc,
        c.checksum()
    );
    if c.op() == Some(mlx5::prm::codes::CqeOpcode::RespSend) {
        let _ = writeln!(
            s,
            "      striding RQ: {} stride(s) from stride {} of WQE {}, {} bytes{}",
            c.strides(),
            c.wqe_counter,
            c.wqe_id,
            c.mpwrq_bytes(),
            if c.is_filler() { ", filler" } else { "" }
        );
    }
    s
}

/// Dumps and decodes descriptor `d` of every queue set (or the one
/// steered by `port`).
pub fn render_descriptor(
    snap: &Snapshot,
    d: Descriptor,
    port: Option<u16>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut seen = 0;
    for dev in &snap.devices {
        for q in dev
            .queue_sets
            .iter()
            .filter(|q| port.is_none_or(|p| q.udp_port == p))
        {
            seen += 1;
            let head = format!("queue set :{} of {}", q.udp_port, dev.report.name);
            let Some(sw) = &q.software else {
                let _ = writeln!(out, "{head}: no software state published");
                continue;
            };
            let rings = sw.rings.as_ref();
            let missing =
                || format!("{head}: the snapshot carries no rings (asked without --wqe/--cqe?)");
            match d {
                Descriptor::RxCqe(n) => {
                    let Some(h) = sw.rx_cqes.get(n as usize) else {
                        return Err(format!(
                            "--cqe {n}: the RX CQ has {} entries (0 to {})",
                            sw.rx_cqes.len(),
                            sw.rx_cqes.len().saturating_sub(1)
                        ));
                    };
                    let b = debug_endpoint::unhex(h).unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "{head}: RX CQE {n} of {} (the driver reads entry {} next)",
                        sw.rx_cqes.len(),
                        sw.snapshot.rx_cqe_idx
                    );
                    out.push_str(&hexdump(&b));
                    if let Ok(a) = <[u8; 64]>::try_from(b.as_slice()) {
                        out.push_str(&cqe_detail(&a));
                    }
                }
                Descriptor::TxCqe(n) => {
                    let r = rings.ok_or_else(missing)?;
                    let b = r.tx_cq.entry(n).ok_or_else(|| {
                        format!(
                            "--cqe {n} --cq tx: the TX CQ has {} entries",
                            r.tx_cq.ring_entries
                        )
                    })?;
                    let _ = writeln!(
                        out,
                        "{head}: TX CQE {n} of {} (consumer index {})",
                        r.tx_cq.ring_entries, sw.snapshot.tx_cq_ci
                    );
                    out.push_str(&hexdump(&b));
                    if let Ok(a) = <[u8; 64]>::try_from(b.as_slice()) {
                        out.push_str(&cqe_detail(&a));
                    }
                }
                Descriptor::SqWqe(n) => {
                    let r = rings.ok_or_else(missing)?;
                    let first = r.sq.entry(n).ok_or_else(|| {
                        format!("--wqe {n}: the SQ has {} WQEBBs", r.sq.ring_entries)
                    })?;
                    let mut bytes = first;
                    // A WQE longer than one WQEBB continues in the next.
                    let ds = bytes.get(7).map_or(1, |b| usize::from(b & 0x3f));
                    let bbs = (ds * SEND_WQE_DS).div_ceil(SEND_WQE_BB).max(1);
                    for k in 1..bbs as u32 {
                        if let Some(more) = r.sq.entry((n + k) % r.sq.ring_entries) {
                            bytes.extend(more);
                        }
                    }
                    let _ = writeln!(
                        out,
                        "{head}: SQ WQEBB {n} of {} (pi {} = slot {}, ci {} = slot {})",
                        r.sq.ring_entries,
                        sw.snapshot.sq_pi,
                        sw.snapshot.sq_pi % r.sq.ring_entries,
                        sw.snapshot.sq_ci,
                        sw.snapshot.sq_ci % r.sq.ring_entries
                    );
                    out.push_str(&hexdump(&bytes));
                    match decode_send_wqe(&bytes) {
                        Some(w) => {
                            let _ = writeln!(out, "      {w}");
                        }
                        None => {
                            let _ = writeln!(out, "      (not a decodable send WQE)");
                        }
                    }
                }
                Descriptor::RqWqe(n) => {
                    let r = rings.ok_or_else(missing)?;
                    let b = r.rq.entry(n).ok_or_else(|| {
                        format!("--wqe {n} --wq rq: the RQ has {} WQEs", r.rq.ring_entries)
                    })?;
                    let _ = writeln!(
                        out,
                        "{head}: RQ WQE {n} of {} ({} posted = slot {})",
                        r.rq.ring_entries,
                        sw.snapshot.rq_head,
                        sw.snapshot.rq_head % r.rq.ring_entries
                    );
                    out.push_str(&hexdump(&b));
                    if let Some(w) = decode_mprq_wqe(&b) {
                        let _ = writeln!(out, "      {w}");
                    }
                }
            }
        }
    }
    if seen == 0 {
        return Err(match port {
            Some(p) => format!(
                "no queue set is steered by UDP port {p} in pid {}",
                snap.pid
            ),
            None => format!(
                "pid {} exposes no mlx5 queue set (an eRPC process on kernel UDP has none; a device needs DeviceConfig::inspect or ERPC_INSPECT=1)",
                snap.pid
            ),
        });
    }
    Ok(out)
}
