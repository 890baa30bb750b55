//! `erpc-inspect`: attach to a running process's debug endpoint and show
//! its queues, counters and sessions; bring a device up offline and show
//! what it is.
//!
//! The process side is the `debug-endpoint` crate (the socket, the
//! publication protocol) plus `mlx5::inspect` and `erpc::inspect` (what a
//! device, its queue sets, a Nexus and its Rpcs publish). This module
//! turns their snapshots into text, rates and descriptor dumps.
//!
//! # JSON
//!
//! `erpc-inspect PID --json` prints one [`Snapshot`]: the endpoint's
//! common keys (`protocol`, `pid`, `uid`, `process`, `time_unix_ns`,
//! `generation`, `complete`, `waited_ms`), then `devices`
//! ([`mlx5::inspect::DeviceView`]) and `nexuses`
//! ([`erpc::inspect::NexusView`]). Every key is a field name of those
//! types, documented there; `tools/tests/inspect_keys.txt` lists every key
//! path and the tests fail if one changes without it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use debug_endpoint::client::{Client, ClientError};
use erpc::inspect::{NexusView, RpcView, TRANSPORT_DROP_KEYS};
use mlx5::inspect::{CompareStatus, Comparison, DeviceReport, DeviceView, QueueSetView, Relation};
use mlx5::prm::codes::QueueState;
use mlx5::prm::cqe::Cqe;
use serde::{Deserialize, Serialize};

mod descriptor;
mod list;
mod offline;

pub use descriptor::*;
pub use list::*;
pub use offline::*;

/// One snapshot of a process, as `--json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Protocol version of the endpoint.
    pub protocol: u32,
    /// The process.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// Its name.
    pub process: String,
    /// Wall-clock time of the answer, ns since the Unix epoch.
    pub time_unix_ns: u64,
    /// The request generation.
    pub generation: u64,
    /// Every publisher answered in time.
    pub complete: bool,
    /// How long the endpoint waited for them, ms.
    pub waited_ms: f64,
    /// mlx5 devices.
    #[serde(default)]
    pub devices: Vec<DeviceView>,
    /// eRPC Nexuses.
    #[serde(default)]
    pub nexuses: Vec<NexusView>,
}

/// Why a snapshot could not be had.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// Talking to the endpoint failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The answer does not have the expected shape.
    #[error("unexpected snapshot from {path}: {why}")]
    Shape {
        /// The socket.
        path: PathBuf,
        /// The decoding error.
        why: String,
    },
    /// The protocol version is one this tool does not know.
    #[error("{path} speaks protocol {got}; this erpc-inspect speaks {want}")]
    Protocol {
        /// The socket.
        path: PathBuf,
        /// Its version.
        got: u64,
        /// Ours.
        want: u32,
    },
}

/// Asks for one snapshot.
pub fn fetch(c: &mut Client, rings: bool, timeout: Duration) -> Result<Snapshot, InspectError> {
    let v = c.snapshot(rings, timeout)?;
    let got = v["protocol"].as_u64().unwrap_or(0);
    if got != u64::from(debug_endpoint::PROTOCOL) {
        return Err(InspectError::Protocol {
            path: c.path().to_owned(),
            got,
            want: debug_endpoint::PROTOCOL,
        });
    }
    serde_json::from_value(v).map_err(|e| InspectError::Shape {
        path: c.path().to_owned(),
        why: e.to_string(),
    })
}

/// Output styling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    /// ANSI colors (differences red, lags yellow, headers bold).
    pub color: bool,
}

impl Style {
    fn paint(self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(self, s: &str) -> String {
        self.paint("1", s)
    }
    fn red(self, s: &str) -> String {
        self.paint("1;31", s)
    }
    fn yellow(self, s: &str) -> String {
        self.paint("33", s)
    }
}

/// Per-second rates between two snapshots of the same process.
#[derive(Debug, Clone, Copy)]
pub struct Rates<'a> {
    prev: &'a Snapshot,
    cur: &'a Snapshot,
}

impl<'a> Rates<'a> {
    /// Rates from `prev` to `cur` (`None` if not the same process).
    pub fn new(prev: &'a Snapshot, cur: &'a Snapshot) -> Option<Rates<'a>> {
        (prev.pid == cur.pid && cur.time_unix_ns > prev.time_unix_ns).then_some(Rates { prev, cur })
    }

    /// Seconds between two publications, from each snapshot's time and the
    /// age of the section.
    fn secs(&self, prev_age_ms: f64, cur_age_ms: f64) -> Option<f64> {
        let t = |s: &Snapshot, age: f64| s.time_unix_ns as f64 / 1e9 - age / 1e3;
        let d = t(self.cur, cur_age_ms) - t(self.prev, prev_age_ms);
        (d > 1e-6).then_some(d)
    }

    fn queue_set(&self, dev: &str, port: u16) -> Option<(&'a QueueSetView, &'a QueueSetView, f64)> {
        let find = |s: &'a Snapshot| {
            s.devices
                .iter()
                .find(|d| d.report.name == dev)?
                .queue_sets
                .iter()
                .find(|q| q.udp_port == port)
        };
        let (p, c) = (find(self.prev)?, find(self.cur)?);
        let dt = self.secs(p.published?.age_ms, c.published?.age_ms)?;
        Some((p, c, dt))
    }

    fn rpc(&self, uri: &str, id: u8) -> Option<(&'a RpcView, &'a RpcView, f64)> {
        let find = |s: &'a Snapshot| {
            let r = s
                .nexuses
                .iter()
                .find(|n| n.uri == uri)?
                .rpcs
                .iter()
                .find(|r| r.rpc_id == id)?;
            Some((r.rpc.as_ref()?, r.published?))
        };
        let ((p, pp), (c, cp)) = (find(self.prev)?, find(self.cur)?);
        Some((p, c, self.secs(pp.age_ms, cp.age_ms)?))
    }
}

fn rate(prev: u64, cur: u64, secs: f64) -> String {
    let r = cur.saturating_sub(prev) as f64 / secs;
    if r >= 1e6 {
        format!("[{:.2} M/s]", r / 1e6)
    } else if r >= 1e3 {
        format!("[{:.1} k/s]", r / 1e3)
    } else {
        format!("[{r:.0}/s]")
    }
}

fn state_name(v: u64) -> String {
    QueueState::from_raw(v as u8).map_or_else(|| format!("0x{v:x}"), |s| s.name().to_string())
}

fn compare_line(c: &Comparison, style: Style) -> String {
    let (sw, fw) = if c.bits == 0 {
        (state_name(c.software), state_name(c.firmware))
    } else {
        (c.software.to_string(), c.firmware.to_string())
    };
    let (mark, note) = match c.status {
        CompareStatus::Same => ("=".to_string(), String::new()),
        CompareStatus::Lagging => {
            let m = match c.relation {
                Relation::SoftwareBehind => "<",
                Relation::FirmwareBehind => ">",
                _ => "~",
            };
            (style.yellow(m), String::new())
        }
        CompareStatus::Differs => (style.red("!="), style.red("  <- differs")),
    };
    format!(
        "      {:<16} {:>10} {:>2} {:<10} {}{note}",
        c.key, sw, mark, fw, c.what
    )
}

fn mac_of(name: &str) -> &str {
    name.rsplit("mac ")
        .next()
        .map_or(name, |m| m.trim_end_matches(')'))
}

fn caps_line(r: &DeviceReport) -> String {
    let c = &r.caps;
    format!(
        "port {}, mac {}, inline {}, CQE v{}, BlueFlame {}, max WQ 2^{}, max CQ 2^{}, \
         striding RQ from 2^{} strides, timestamps sq {} rq {}{}",
        r.port_state,
        r.mac,
        c.inline_mode,
        c.cqe_version,
        if c.bf_reg_size == 0 {
            "none".to_string()
        } else {
            format!("{} B", c.bf_reg_size)
        },
        c.log_max_wq_sz,
        c.log_max_cq_sz,
        if c.ext_stride_num_range { 3 } else { 9 },
        c.sq_ts_format,
        c.rq_ts_format,
        if c.reset_root_to_default {
            ", reset_root_to_default"
        } else {
            ""
        }
    )
}

/// The lines every device report shows (live and offline).
pub fn report_text(r: &DeviceReport, style: Style) -> String {
    let mut s = String::new();
    let model = r.model.as_deref().unwrap_or("unknown model");
    let _ = writeln!(
        s,
        "{} {model} [15b3:{:04x}]{}, firmware {}",
        style.bold(&format!("device {}:", r.name)),
        r.pci_device_id,
        if r.is_vf { " VF" } else { "" },
        r.fw_version
    );
    let _ = writeln!(s, "  {}", caps_line(r));
    let h = &r.health;
    let verdict = if h.verdict == "ok" {
        h.verdict.clone()
    } else {
        style.red(&h.verdict)
    };
    let _ = writeln!(
        s,
        "  health {verdict}: heartbeat 0x{:06x}, syndrome 0x{:02x} ext 0x{:04x}, nic_interface {}, rfr {}",
        h.heartbeat, h.syndrome, h.ext_syndrome, h.nic_interface, h.rfr as u8
    );
    let p = &r.pages;
    let _ = writeln!(
        s,
        "  pages: {} given to firmware ({} MiB); driver DMA pool {} of {} 4 KiB pages in use, {} region(s)",
        p.firmware_pages,
        (p.firmware_pages * 4096) >> 20,
        p.dma_pages_in_use,
        p.dma_pages_total,
        p.dma_regions
    );
    let o = &r.objects;
    let _ = writeln!(
        s,
        "  objects: PD 0x{:x}, TD 0x{:x}, lkey 0x{:x}, EQ 0x{:x}; commands {} sent, {} failed, {} busy polls",
        o.pd, o.td, o.lkey, o.eqn, r.commands.sent, r.commands.failed, r.commands.busy_polls
    );
    s
}

fn cqe_line(hex: &str) -> String {
    match debug_endpoint::unhex(hex).and_then(|b| <[u8; 64]>::try_from(b).ok()) {
        Some(b) => Cqe::decode(&b).to_string(),
        None => "(not 64 bytes of hex)".into(),
    }
}

fn queue_set_text(
    out: &mut String,
    dev: &DeviceView,
    q: &QueueSetView,
    rates: Option<&Rates<'_>>,
    style: Style,
) {
    let age = q.published.map_or("never published".to_string(), |p| {
        let a = format!("published {:.1} ms ago", p.age_ms);
        if p.fresh {
            a
        } else {
            style.yellow(&format!("{a}, STALE: its thread did not answer"))
        }
    });
    let _ = writeln!(
        out,
        "  {} ({age})",
        style.bold(&format!("queue set :{}", q.udp_port))
    );
    let i = &q.ids;
    let _ = writeln!(
        out,
        "    objects  SQ 0x{:x}  RQ 0x{:x}  TX CQ 0x{:x}  RX CQ 0x{:x}  TIS 0x{:x}  TIR 0x{:x}  UAR {}  flow {}  Q counter {}",
        i.sqn, i.rqn, i.tx_cqn, i.rx_cqn, i.tisn, i.tirn, i.uar, i.flow_index, i.counter_set_id
    );
    let Some(sw) = &q.software else {
        let _ = writeln!(
            out,
            "    (no software state yet: the queue set's thread has not run its control service since the request)"
        );
        return;
    };
    let s = &sw.snapshot;
    let st = &s.stats;
    let r = rates.and_then(|r| r.queue_set(&dev.report.name, q.udp_port));
    let rt = |f: fn(&QueueSetView) -> u64| {
        r.map_or(String::new(), |(p, c, dt)| {
            format!(" {}", rate(f(p), f(c), dt))
        })
    };
    let sq_state = match &s.sq_error {
        Some(e) => style.red(&format!("ERR after {e}")),
        None => "RDY".into(),
    };
    let _ = writeln!(
        out,
        "    SQ       {sq_state}; pi {} ci {} of {} WQEBBs ({} in flight); {} unsignaled of {}{}",
        s.sq_pi,
        s.sq_ci,
        sw.sq_wqebbs,
        s.sq_pi.wrapping_sub(s.sq_ci),
        s.sq_unsignaled,
        sw.unsignaled_batch,
        if s.sq_signaled_outstanding {
            ", a signaled WQE outstanding"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "             {} WQEs{} ({} bytes), {} doorbells{}, BlueFlame {} ({} writes), {} SQ-full stalls, L2 inline {}",
        st.tx_wqes,
        rt(|q| q.software.as_ref().map_or(0, |s| s.snapshot.stats.tx_wqes)),
        st.tx_bytes,
        st.tx_doorbells,
        rt(|q| q
            .software
            .as_ref()
            .map_or(0, |s| s.snapshot.stats.tx_doorbells)),
        if sw.blueflame { "on" } else { "off" },
        st.tx_blueflame,
        st.tx_full,
        if sw.inline_l2 { "yes" } else { "no" }
    );
    let strides = sw.rq_strides_per_wqe;
    let posted_strides = u64::from(s.rq_head) * u64::from(strides);
    let _ = writeln!(
        out,
        "    RQ       {} WQEs x {} strides of {} B; {} WQEs posted, {} strides reported, {} posted and not yet reported; {} slots given back, not reposted",
        sw.rq_wqes,
        strides,
        sw.rq_stride_bytes,
        s.rq_head,
        sw.rx_strides_reported,
        posted_strides.wrapping_sub(u64::from(sw.rx_strides_reported)) & 0xffff_ffff,
        s.rx_to_post
    );
    let oob = q
        .firmware
        .map_or("?".to_string(), |f| f.out_of_buffer.to_string());
    let _ = writeln!(
        out,
        "             out-of-buffer drops {}",
        if oob == "0" || oob == "?" {
            oob
        } else {
            style.red(&oob)
        }
    );
    let _ = writeln!(
        out,
        "    RX CQ    {} CQEs, overrun ignored; next {}; position {} (wqe_id {:?}); {} packets{} in {} bursts, {} torn snapshots",
        sw.rx_cq_entries,
        s.rx_cqe_idx,
        s.rx_prev_position,
        s.rx_wqe_id_mode,
        st.rx_pkts,
        rt(|q| q.software.as_ref().map_or(0, |s| s.snapshot.stats.rx_pkts)),
        st.rx_bursts,
        st.rx_torn_snapshots
    );
    for (k, h) in sw.rx_cqes.iter().enumerate() {
        let next = if k == s.rx_cqe_idx { " <- next" } else { "" };
        let _ = writeln!(out, "      [{k}] {}{next}", cqe_line(h));
    }
    let _ = writeln!(
        out,
        "    TX CQ    {} CQEs; ci {}; {} CQEs in {} polls; last {}",
        sw.tx_cq_entries,
        s.tx_cq_ci,
        st.tx_cqes,
        st.tx_cq_polls,
        s.tx_last_cqe
            .map_or("none yet".to_string(), |c| c.to_string())
    );
    let _ = writeln!(
        out,
        "    UAR      page {}: next BlueFlame/doorbell register at BAR0 0x{:x} ({} B halves)",
        i.uar, sw.bf_register, sw.bf_half_bytes
    );
    let _ = writeln!(
        out,
        "    control  EQ serviced {} times by this thread (found busy {}, errors {})",
        st.control_services, st.control_busy, st.control_errors
    );
    match (&q.firmware, &q.firmware_error) {
        (Some(_), _) => {
            let _ = writeln!(
                out,
                "    firmware vs software (QUERY_SQ/RQ/CQ after the software view; = same, < > ~ moved in between or told late by design, != differs):"
            );
            for c in &q.compare {
                let _ = writeln!(out, "{}", compare_line(c, style));
            }
        }
        (None, Some(e)) => {
            let _ = writeln!(out, "    firmware view unavailable: {}", style.red(e));
        }
        (None, None) => {}
    }
}

fn device_text(out: &mut String, d: &DeviceView, rates: Option<&Rates<'_>>, style: Style) {
    out.push_str(&report_text(&d.report, style));
    if let Some(eq) = &d.eq {
        let events = if eq.events.is_empty() {
            "none".to_string()
        } else {
            eq.events
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "  EQ 0x{:x} on UAR {}: ci {}; events: {events}; last: {}",
            eq.eqn,
            eq.uar,
            eq.ci,
            eq.last_event.as_deref().unwrap_or("none")
        );
        match (&eq.firmware, &eq.firmware_error) {
            (Some((c, p, st)), _) => {
                let _ = writeln!(
                    out,
                    "     firmware: consumer {c}, producer {p}, state 0x{st:x}"
                );
                for c in &eq.compare {
                    let _ = writeln!(out, "{}", compare_line(c, style));
                }
            }
            (None, Some(e)) => {
                let _ = writeln!(out, "     QUERY_EQ failed: {}", style.red(e));
            }
            _ => {}
        }
    }
    for e in &d.cq_errors {
        let _ = writeln!(
            out,
            "  {}",
            style.red(&format!(
                "CQ error event: CQ 0x{:x} syndrome 0x{:02x}",
                e.cqn, e.syndrome
            ))
        );
    }
    for q in &d.queue_sets {
        queue_set_text(out, d, q, rates, style);
    }
}

fn drops_text(m: &BTreeMap<String, u64>, keys: Option<&[&str]>, style: Style) -> String {
    let v: Vec<String> = m
        .iter()
        .filter(|(k, v)| **v > 0 && keys.is_none_or(|ks| ks.contains(&k.as_str())))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        style.yellow(&v.join(", "))
    }
}

fn req_nums_text(nums: &[u64]) -> String {
    let Some(&base) = nums.iter().min() else {
        return "-".into();
    };
    let offs: Vec<String> = nums.iter().map(|n| (n - base).to_string()).collect();
    format!("{base}+[{}]", offs.join(" "))
}

fn rpc_text(
    out: &mut String,
    n: &NexusView,
    r: &erpc::inspect::RpcSlotView,
    snap: &Snapshot,
    rates: Option<&Rates<'_>>,
    style: Style,
) {
    let age = r.published.map_or("never published".to_string(), |p| {
        let a = format!("published {:.1} ms ago", p.age_ms);
        if p.fresh {
            a
        } else {
            style.yellow(&format!("{a}, STALE: its event loop did not run"))
        }
    });
    let Some(v) = &r.rpc else {
        let _ = writeln!(
            out,
            "  {} ({age})",
            style.bold(&format!("Rpc {}", r.rpc_id))
        );
        return;
    };
    let t = &v.transport;
    let kind = t.kind.split('<').next().unwrap_or(&t.kind);
    let kind = kind.rsplit("::").next().unwrap_or(kind);
    // The queue set of an mlx5 transport: same MAC and UDP port.
    let qs = snap.devices.iter().find_map(|d| {
        (mac_of(&d.report.name) == t.mac || d.report.mac == t.mac)
            .then(|| d.queue_sets.iter().find(|q| q.udp_port == t.udp_port))
            .flatten()
            .map(|_| d.report.name.as_str())
    });
    let _ = writeln!(
        out,
        "  {} ({age}): {kind} {}:{} mac {}{}",
        style.bold(&format!("Rpc {}", v.rpc_id)),
        t.ipv4,
        t.udp_port,
        t.mac,
        qs.map_or(String::new(), |d| format!(
            ", queue set :{} of {d}",
            t.udp_port
        ))
    );
    let c = &v.stats.counters;
    let g = |k: &str| c.get(k).copied().unwrap_or(0);
    let rr = rates.and_then(|x| x.rpc(&n.uri, v.rpc_id));
    let rt = |k: &str| {
        rr.map_or(String::new(), |(p, cur, dt)| {
            let f = |x: &RpcView| x.stats.counters.get(k).copied().unwrap_or(0);
            format!(" {}", rate(f(p), f(cur), dt))
        })
    };
    let (in_slots, in_backlog) = v
        .sessions
        .iter()
        .filter(|s| s.role == "client")
        .fold((0, 0), |(a, b), s| (a + s.slots_in_use, b + s.backlog));
    let _ = writeln!(
        out,
        "    requests   {} enqueued, {} completed{} ({} failed), {} waited in a backlog (total); served {} handled{}, {} responses; now {} in slots, {} in backlogs",
        g("reqs_enqueued"),
        g("reqs_completed"),
        rt("reqs_completed"),
        g("reqs_failed"),
        g("reqs_backlogged"),
        g("reqs_handled"),
        rt("reqs_handled"),
        g("resps_enqueued"),
        in_slots,
        in_backlog
    );
    let _ = writeln!(
        out,
        "    packets    rx {}{} ({} accepted), tx {}{} in {} bursts; {} refused, {} given up",
        g("rx_pkts"),
        rt("rx_pkts"),
        g("rx_accepted"),
        g("tx_pkts"),
        rt("tx_pkts"),
        g("tx_bursts"),
        g("tx_refused"),
        g("tx_given_up")
    );
    let _ = writeln!(
        out,
        "    loss       {} retransmissions ({} packets), {} TX drains, {} duplicate answers; sessions reset {} (peer failed {})",
        g("retransmissions"),
        g("retransmitted_pkts"),
        g("tx_flushes"),
        g("dup_req_cr_resent") + g("dup_req_resp_resent") + g("dup_rfr_resent"),
        g("sessions_reset"),
        g("sessions_peer_failed")
    );
    match &v.cc {
        Some(cc) => {
            let _ = writeln!(
                out,
                "    cc         Timely {} updates, {} bypassed{}; link {} Gbit/s, min {:.3}; wheel {} queued, {} paced, {} bypassed, {} stale, {} clamped, {} overflow",
                g("timely_updates"),
                g("timely_bypassed"),
                if cc.timely_bypass {
                    ""
                } else {
                    " (bypass off)"
                },
                cc.link_gbps,
                cc.min_gbps,
                cc.wheel_queued,
                cc.wheel_inserted,
                g("wheel_bypassed"),
                g("wheel_stale"),
                cc.wheel_clamped,
                cc.wheel_overflow,
            );
        }
        None => {
            let _ = writeln!(out, "    cc         off (no RTT, no Timely, no wheel)");
        }
    }
    let _ = writeln!(
        out,
        "    eRPC drops {}",
        drops_text(&v.stats.drops, None, style)
    );
    let ts = &t.stats;
    let tg = |k: &str| ts.get(k).copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "    transport  tx {} pkts {} B {} doorbells, rx {} pkts {} B; drops {}",
        tg("tx_pkts"),
        tg("tx_bytes"),
        tg("tx_doorbells"),
        tg("rx_pkts"),
        tg("rx_bytes"),
        drops_text(ts, Some(TRANSPORT_DROP_KEYS), style)
    );
    let _ = writeln!(
        out,
        "    memory     RX ring {} entries, {} unreserved; msgbufs {} KiB in use of {} KiB",
        v.rx_ring_entries,
        v.rx_ring_unreserved,
        v.alloc_in_use_bytes >> 10,
        v.alloc_reserved_bytes >> 10
    );
    if v.sessions.is_empty() {
        let _ = writeln!(out, "    sessions   none");
        return;
    }
    let _ = writeln!(
        out,
        "    {:>5} {:<6} {:<22} {:<20} {:>7} {:>5} {:>7} {:>5} {:>7} {:>8} {:>7} {:>7}  {:<24} BUSY SLOTS",
        "SN",
        "ROLE",
        "STATE",
        "REMOTE",
        "CREDITS",
        "SLOTS",
        "BACKLOG",
        "RETX",
        "RTT µs",
        "TIMELY",
        "QUIET",
        "PONG",
        "REQUEST NUMBERS"
    );
    let link = v.cc.map(|c| c.link_gbps);
    for s in &v.sessions {
        let opt =
            |x: Option<f64>, unit: &str| x.map_or("-".to_string(), |v| format!("{v:.1}{unit}"));
        // A session Timely slowed below the link rate is rate limited: its
        // packets go through the wheel.
        let timely = format!("{:>8}", opt(s.timely_rate_gbps, "G"));
        let timely = match (s.timely_rate_gbps, link) {
            (Some(r), Some(l)) if r < l => style.yellow(&timely),
            _ => timely,
        };
        // The keep-alive's view of the peer (a C++ peer is not pinged).
        let pong = n
            .liveness
            .peers
            .iter()
            .find(|p| p.uri == s.remote_uri)
            .map_or("-".to_string(), |p| {
                p.last_pong_ago_ms
                    .map_or("never".to_string(), |ms| duration_text(ms as f64))
            });
        let _ = writeln!(
            out,
            "    {:>5} {:<6} {:<22} {:<20} {:>7} {:>5} {:>7} {:>5} {:>7} {} {:>7} {:>7}  {:<24} {}",
            s.session,
            s.role,
            s.state,
            format!("{}/{}#{}", s.remote_uri, s.remote_rpc_id, s.remote_session),
            if s.role == "client" {
                s.credits.to_string()
            } else {
                "-".into()
            },
            format!("{}/8", s.slots_in_use),
            s.backlog,
            s.retransmits,
            opt(s.rtt_us, ""),
            timely,
            s.quiet_ms.map_or("-".to_string(), duration_text),
            pong,
            req_nums_text(&s.req_nums),
            busy_slots_text(&s.slots)
        );
    }
    let _ = writeln!(
        out,
        "    (SLOTS, BACKLOG: now; RETX: since the session began; QUIET: since the session last made progress, a packet in or a new request; PONG: since the peer's last ping response; BUSY SLOTS: slot:packets sent/acknowledged (client) or handling state (server), and time since the slot last made progress)"
    );
}

/// A duration in milliseconds, short: `0.4ms`, `12ms`, `3.2s`.
fn duration_text(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.1}ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.1}s", ms / 1e3)
    }
}

/// The busy slots of a session: `slot:tx/rx wait` at a client,
/// `slot:state wait` at a server; `-` when none is busy.
fn busy_slots_text(slots: &[erpc::inspect::SlotView]) -> String {
    let v: Vec<String> = slots
        .iter()
        .filter_map(|sl| {
            let waited = sl.waited_ms?;
            let what = match (sl.tx_pkts, sl.rx_pkts) {
                (Some(tx), Some(rx)) => format!("{tx}/{rx}"),
                _ => sl.state.clone(),
            };
            Some(format!("{}:{what} {}", sl.slot, duration_text(waited)))
        })
        .collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// The text of one snapshot; with `prev` (an earlier snapshot of the same
/// process), counters that move show their rate per second.
pub fn render(snap: &Snapshot, prev: Option<&Snapshot>, style: Style) -> String {
    let rates = prev.and_then(|p| Rates::new(p, snap));
    let rates = rates.as_ref();
    let mut out = String::new();
    let answered = if snap.complete {
        "every thread answered".to_string()
    } else {
        style.yellow("some threads did not answer in time (their sections are STALE)")
    };
    let _ = writeln!(
        out,
        "{} pid {} (uid {}): {} device(s), {} Nexus(es); snapshot {}, {answered} (waited {:.1} ms)",
        style.bold(&snap.process),
        snap.pid,
        snap.uid,
        snap.devices.len(),
        snap.nexuses.len(),
        snap.generation,
        snap.waited_ms
    );
    for d in &snap.devices {
        out.push('\n');
        device_text(&mut out, d, rates, style);
    }
    for n in &snap.nexuses {
        out.push('\n');
        let l = &n.liveness;
        let _ = writeln!(
            out,
            "{} incarnation 0x{:016x}, SM extensions {}, failure timeout {} ms, {} worker thread(s)",
            style.bold(&format!("Nexus {}:", n.uri)),
            n.incarnation,
            if n.sm_extensions { "on" } else { "off" },
            n.failure_timeout_ms,
            n.worker_threads
        );
        let sm = &n.sm;
        let _ = writeln!(
            out,
            "  SM: {} delivered, {} malformed, {} for unknown Rpcs, {} unsupported, {} inbox full; keep-alive: {} pings sent, {} answered, {} pongs, {} peers tracked, failed {} silent / {} restarted / {} Rpc gone / {} injected; {} own pauses discounted",
            sm.delivered,
            sm.malformed,
            sm.invalid_rpc_id_req + sm.invalid_rpc_id_resp,
            sm.unsupported_type,
            sm.queue_full,
            l.pings_sent,
            l.pings_answered,
            l.pongs_received,
            l.tracked,
            l.failed_silent,
            l.failed_restarted,
            l.failed_rpc_gone,
            l.failed_injected,
            l.pauses_discounted
        );
        for p in &l.peers {
            let since = |x: Option<u64>| {
                x.map_or("never".to_string(), |ms| {
                    format!("{} ago", duration_text(ms as f64))
                })
            };
            let alive = duration_text(p.alive_ago_ms as f64);
            let alive = if p.alive_ago_ms * 2 > n.failure_timeout_ms {
                style.yellow(&alive)
            } else {
                alive
            };
            let _ = writeln!(
                out,
                "  peer {} (incarnation 0x{:016x}, Rpcs {:?}): last pong {}, proven alive {alive} ago (failed at {} ms), last ping {}, {} ping(s) unanswered",
                p.uri,
                p.incarnation,
                p.rpcs,
                since(p.last_pong_ago_ms),
                n.failure_timeout_ms,
                since(p.last_ping_ago_ms),
                p.pings_outstanding
            );
        }
        for r in &n.rpcs {
            rpc_text(&mut out, n, r, snap, rates, style);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_request_numbers_read_well() {
        assert_eq!(rate(0, 1_500_000, 1.0), "[1.50 M/s]");
        assert_eq!(rate(10, 2_010, 2.0), "[1.0 k/s]");
        assert_eq!(rate(5, 3, 1.0), "[0/s]");
        assert_eq!(
            req_nums_text(&[16, 9, 10, 11, 12, 13, 14, 15]),
            "9+[7 0 1 2 3 4 5 6]"
        );
        assert_eq!(req_nums_text(&[]), "-");
        assert_eq!(duration_text(0.43), "0.4ms");
        assert_eq!(duration_text(1203.4), "1203ms");
        assert_eq!(duration_text(12_500.0), "12.5s");
        let slot = |slot, state: &str, tx, rx, waited_ms| erpc::inspect::SlotView {
            slot,
            req_num: 8 + slot as u64,
            state: state.into(),
            tx_pkts: tx,
            rx_pkts: rx,
            waited_ms,
        };
        assert_eq!(
            busy_slots_text(&[
                slot(0, "in_flight", Some(9), Some(5), Some(812.0)),
                slot(1, "idle", None, None, None),
                slot(2, "in_handler", None, Some(1), Some(3.25)),
            ]),
            "0:9/5 812ms, 2:in_handler 3.2ms"
        );
        assert_eq!(busy_slots_text(&[slot(0, "idle", None, None, None)]), "-");
        assert_eq!(
            mac_of("sim nic 0 (port 0, mac 02:00:00:00:00:01)"),
            "02:00:00:00:00:01"
        );
    }

    #[test]
    fn hexdump_is_sixteen_per_line() {
        let d = hexdump(&(0u8..20).collect::<Vec<_>>());
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].ends_with("0e 0f") && lines[1].contains("0010: 10 11 12 13"),
            "{d}"
        );
    }
}
