//! The Wireshark dissector (`tools/wireshark/erpc.lua`) against captures
//! made by `erpc-bench --pcap`, on the device model and on kernel UDP:
//! every field tshark decodes from every eRPC frame must equal what eRPC's
//! own parsers (`erpc::pkthdr`, `erpc::sm_types`, `transport::wire`) read
//! from the same bytes, and each capture must hold each kind of packet the
//! issue names: a request, a response, an explicit credit return, a
//! request-for-response, and a connect request and response.
//!
//! Needs `tshark` (Debian: `tshark`). Without it the test is reported as
//! ignored, not passed; in CI (`ERPC_CI=1`) it fails instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use erpc::wire::{PktHdr, PktType};
use erpc::wire::{SM_PKT_BYTES, SmErr, SmPkt, SmPktType};
use libtest_mimic::{Arguments, Failed, Trial};
use transport::wire::parse_frame;

const BENCH: &str = env!("CARGO_BIN_EXE_erpc-bench");

fn ci() -> bool {
    std::env::var_os("ERPC_CI").is_some_and(|v| v == "1")
}

fn find_tshark() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("tshark"))
        .find(|p| p.is_file())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    type Check = fn(&Path) -> Result<(), Failed>;
    let checks: [(&str, Check); 2] = [
        (
            "dissector_decodes_every_field_of_an_erpc_bench_capture",
            check,
        ),
        (
            "dissector_decodes_every_field_of_an_erpc_bench_capture_over_kernel_udp",
            check_udp,
        ),
    ];
    let tshark = find_tshark();
    let trials = checks
        .into_iter()
        .map(|(name, f)| match &tshark {
            Some(t) => {
                let t = t.clone();
                Trial::test(name, move || f(&t))
            }
            None if ci() => Trial::test(name, || {
                Err("tshark is not installed and ERPC_CI=1 forbids skipping (apt-get install tshark)"
                    .into())
            }),
            None => {
                if !args.list {
                    eprintln!("{name}: ignored: tshark is not installed (apt-get install tshark)");
                }
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// The fields the test compares, in tshark's `-e` order.
const FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "ip.dst",
    "udp.srcport",
    "udp.dstport",
    "erpc.req_type",
    "erpc.msg_size",
    "erpc.session",
    "erpc.pkt_type",
    "erpc.pkt_num",
    "erpc.req_num",
    "erpc.slot",
    "erpc.magic",
    "erpc.data_len",
    "erpc.sm.type",
    "erpc.sm.err",
    "erpc.sm.token",
    "erpc.sm.client.transport",
    "erpc.sm.client.hostname",
    "erpc.sm.client.sm_port",
    "erpc.sm.client.rpc_id",
    "erpc.sm.client.session",
    "erpc.sm.client.mac",
    "erpc.sm.client.ipv4",
    "erpc.sm.client.udp_port",
    "erpc.sm.client.rxq",
    "erpc.sm.client.rss_table_size",
    "erpc.sm.client.credits",
    "erpc.sm.client.end_reason",
    "erpc.sm.client.req_base",
    "erpc.sm.client.incarnation",
    "erpc.sm.client.live_rpcs",
    "erpc.sm.server.transport",
    "erpc.sm.server.hostname",
    "erpc.sm.server.sm_port",
    "erpc.sm.server.rpc_id",
    "erpc.sm.server.session",
    "erpc.sm.server.mac",
    "erpc.sm.server.ipv4",
    "erpc.sm.server.udp_port",
    "erpc.sm.server.rxq",
    "erpc.sm.server.rss_table_size",
    "erpc.sm.server.credits",
    "erpc.sm.server.end_reason",
    "erpc.sm.server.req_base",
    "erpc.sm.server.incarnation",
    "erpc.sm.server.live_rpcs",
];

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the dissector must show for one frame, from eRPC's parsers.
fn expected(number: usize, frame: &[u8]) -> Result<BTreeMap<&'static str, String>, String> {
    let f = parse_frame(frame).map_err(|e| format!("frame {number}: not IPv4/UDP: {e:?}"))?;
    let mut m = BTreeMap::new();
    m.insert("frame.number", number.to_string());
    m.insert("ip.src", f.src_ip.to_string());
    m.insert("ip.dst", f.dst_ip.to_string());
    m.insert("udp.srcport", f.src_port.to_string());
    m.insert("udp.dstport", f.dst_port.to_string());
    if f.payload.len() == SM_PKT_BYTES {
        let p = SmPkt::decode(f.payload).map_err(|e| format!("frame {number}: {e}"))?;
        m.insert("erpc.sm.type", (p.pkt_type as i32).to_string());
        m.insert("erpc.sm.err", (p.err as i32).to_string());
        m.insert("erpc.sm.token", format!("0x{:016x}", p.uniq_token));
        let ping = matches!(p.pkt_type, SmPktType::PingReq | SmPktType::PingResp);
        for (side, ep) in [("client", &p.client), ("server", &p.server)] {
            let r = ep.routing();
            let key = |k: &str| -> &'static str {
                FIELDS
                    .iter()
                    .find(|f| **f == format!("erpc.sm.{side}.{k}"))
                    .expect("listed")
            };
            m.insert(key("transport"), (ep.transport_type as i32).to_string());
            m.insert(
                key("hostname"),
                ep.hostname_str().unwrap_or("?").to_string(),
            );
            m.insert(key("sm_port"), ep.sm_udp_port.to_string());
            m.insert(key("rpc_id"), ep.rpc_id.to_string());
            m.insert(key("session"), ep.session_num.to_string());
            m.insert(key("incarnation"), ep.incarnation().to_string());
            if ping {
                // No routing info: the sender's live-Rpc bitmap.
                let ids: Vec<String> = ep
                    .rpc_bitmap()
                    .iter()
                    .enumerate()
                    .flat_map(|(i, b)| {
                        (0..8)
                            .filter(move |k| b & (1 << k) != 0)
                            .map(move |k| i * 8 + k)
                    })
                    .map(|id| id.to_string())
                    .collect();
                m.insert(key("live_rpcs"), ids.join(","));
                continue;
            }
            m.insert(key("mac"), mac(r.mac));
            m.insert(key("ipv4"), r.ipv4.to_string());
            m.insert(key("udp_port"), r.udp_port.to_string());
            m.insert(key("rxq"), r.rxq_id.to_string());
            m.insert(key("rss_table_size"), r.rss_table_size.to_string());
            m.insert(key("credits"), ep.credits().to_string());
            m.insert(key("req_base"), ep.req_base().to_string());
            if side == "server" && p.err == SmErr::SrvDisconnected {
                m.insert(key("end_reason"), ep.end_reason().to_string());
            }
        }
    } else {
        let h = PktHdr::decode(f.payload).map_err(|e| format!("frame {number}: {e}"))?;
        m.insert("erpc.req_type", h.req_type.to_string());
        m.insert("erpc.msg_size", h.msg_size.to_string());
        m.insert("erpc.session", h.dest_session_num.to_string());
        m.insert("erpc.pkt_type", (h.pkt_type as u8).to_string());
        m.insert("erpc.pkt_num", h.pkt_num.to_string());
        m.insert("erpc.req_num", h.req_num.to_string());
        m.insert("erpc.slot", (h.req_num % 8).to_string());
        m.insert("erpc.magic", "11".to_string());
        m.insert("erpc.data_len", (f.payload.len() - 14).to_string());
    }
    Ok(m)
}

fn tshark(
    tshark: &Path,
    lua: &Path,
    pcap: &Path,
    prefs: &[String],
    extra: &[&str],
) -> Result<String, Failed> {
    let out = Command::new(tshark)
        .arg("-X")
        .arg(format!("lua_script:{}", lua.display()))
        .arg("-n")
        .args(prefs.iter().flat_map(|p| ["-o", p.as_str()]))
        .arg("-r")
        .arg(pcap)
        .args(extra)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tshark.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // tshark reports Lua errors on stderr but may still exit 0.
    let lua_trouble = stderr
        .lines()
        .any(|l| l.contains("Lua") || l.contains("erpc.lua"));
    if !out.status.success() || lua_trouble {
        return Err(format!("tshark {extra:?} failed ({}): {stderr}", out.status).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Decodes `pcap` with tshark and with eRPC's parsers and compares every
/// field of every frame; returns how many frames of each kind there were.
fn compare(
    tshark_path: &Path,
    lua: &Path,
    pcap: &Path,
    prefs: &[String],
) -> Result<BTreeMap<String, usize>, Failed> {
    let bytes = std::fs::read(pcap).map_err(|e| e.to_string())?;
    let frames = mlx5_sim::pcap::parse(&bytes).ok_or("unreadable pcap")?;

    let mut args = vec!["-T", "fields", "-E", "separator=\t", "-E", "occurrence=a"];
    for f in FIELDS {
        args.push("-e");
        args.push(f);
    }
    let decoded = tshark(tshark_path, lua, pcap, prefs, &args)?;
    let rows: Vec<Vec<&str>> = decoded.lines().map(|l| l.split('\t').collect()).collect();
    if rows.len() != frames.len() {
        return Err(format!(
            "tshark shows {} frames, the pcap holds {}",
            rows.len(),
            frames.len()
        )
        .into());
    }
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (i, ((_, frame), row)) in frames.iter().zip(&rows).enumerate() {
        let want = expected(i + 1, frame)?;
        for (col, field) in FIELDS.iter().enumerate() {
            let got = row.get(col).copied().unwrap_or("");
            let exp = want.get(field).map(String::as_str).unwrap_or("");
            if got != exp {
                return Err(format!(
                    "frame {}: {field} decodes to {got:?}, eRPC reads {exp:?}\nrow: {row:?}",
                    i + 1
                )
                .into());
            }
        }
        let f = parse_frame(frame).map_err(|e| format!("{e:?}"))?;
        let kind = if f.payload.len() == SM_PKT_BYTES {
            let p = SmPkt::decode(f.payload).map_err(|e| e.to_string())?;
            format!("sm {:?} {:?}", p.pkt_type, p.err)
        } else {
            let h = PktHdr::decode(f.payload).map_err(|e| e.to_string())?;
            format!(
                "data {} type {} size {}",
                h.pkt_type.name(),
                h.req_type,
                h.msg_size
            )
        };
        *kinds.entry(kind).or_default() += 1;
    }
    Ok(kinds)
}

fn check(tshark_path: &Path) -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("erpc-dissector-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    check_bench_capture(tshark_path, &dir, &[])?;
    check_crafted(tshark_path, &dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The same on kernel UDP: node 0's transport and the SM link capture,
/// with the Ethernet/IPv4/UDP framing the datagrams would have had; the
/// ports are the kernel's choice, and erpc-bench names them for the
/// dissector's preference.
fn check_udp(tshark_path: &Path) -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("erpc-dissector-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    check_bench_capture(tshark_path, &dir, &["--transport", "udp"])?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Runs `erpc-bench --pcap` with `transport_args` and checks every frame
/// of the capture, and that it holds every kind of packet.
fn check_bench_capture(
    tshark_path: &Path,
    dir: &Path,
    transport_args: &[&str],
) -> Result<(), Failed> {
    let pcap = dir.join("bench.pcap");
    // A short run of 2000-byte RPCs (three packets each way): requests,
    // credit returns, responses and requests-for-response, after the
    // connect handshake.
    let out = Command::new(BENCH)
        .args(transport_args)
        .args([
            "--secs", "0.002", "--warmup", "0", "--batch", "1", "--window", "1", "--size", "2000",
            "--pcap",
        ])
        .arg(&pcap)
        .output()
        .map_err(|e| format!("cannot run erpc-bench: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "erpc-bench --pcap failed: {}{stderr}",
            String::from_utf8_lossy(&out.stdout),
        )
        .into());
    }
    // Ports outside the dissector's default range are named on stderr.
    let prefs: Vec<String> = stderr
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("erpc.udp_ports:"))
        })
        .map(str::to_string)
        .collect();
    if !transport_args.is_empty() && prefs.is_empty() {
        return Err(format!("erpc-bench named no UDP ports for the dissector: {stderr}").into());
    }
    let lua = Path::new(env!("CARGO_MANIFEST_DIR")).join("wireshark/erpc.lua");
    let kinds = compare(tshark_path, &lua, &pcap, &prefs)?;
    if !prefs.is_empty() {
        // Without the ports preference the heuristic must find the same:
        // the SM packets by their shape, the data packets on the ports the
        // connect packets named.
        let heuristic = compare(tshark_path, &lua, &pcap, &[])?;
        if heuristic != kinds {
            return Err(format!(
                "without -o erpc.udp_ports the capture decodes as {heuristic:?}, with it as \
                 {kinds:?}"
            )
            .into());
        }
    }
    // Exactly these kinds, independently of eRPC's parser: the connect
    // handshake both ways and the benchmark's request type and sizes.
    let connect_req = format!("sm {:?} {:?}", SmPktType::ConnectReq, SmErr::NoError);
    let connect_resp = format!("sm {:?} {:?}", SmPktType::ConnectResp, SmErr::NoError);
    let want = [
        connect_req,
        connect_resp,
        format!("data {} type 1 size 2000", PktType::Req.name()),
        format!("data {} type 1 size 2000", PktType::Resp.name()),
        format!("data {} type 1 size 0", PktType::ExplCr.name()),
        format!("data {} type 1 size 0", PktType::Rfr.name()),
    ];
    // Rpcs dropped at the end of the run may send a best-effort
    // disconnect request (and get its response): allowed, not required.
    let may = [
        format!("sm {:?} {:?}", SmPktType::DisconnectReq, SmErr::NoError),
        format!("sm {:?} {:?}", SmPktType::DisconnectResp, SmErr::NoError),
    ];
    let missing = want.iter().any(|k| !kinds.contains_key(k));
    let unexpected = kinds.keys().any(|k| !want.contains(k) && !may.contains(k));
    if missing || unexpected {
        return Err(format!("the capture holds {kinds:?}, expected each of {want:?}").into());
    }
    // The one-line summaries (as README shows them) name every kind.
    let summary = tshark(tshark_path, &lua, &pcap, &prefs, &["-c", "30"])?;
    for word in [
        "Connect request",
        "Connect response",
        "REQ ",
        "CR ",
        "RESP ",
        "RFR ",
    ] {
        if !summary.contains(word) {
            return Err(format!("no {word:?} in the summary:\n{summary}").into());
        }
    }
    println!(
        "{} frames decoded, by kind: {kinds:?}",
        kinds.values().sum::<usize>()
    );
    Ok(())
}

fn check_crafted(tshark_path: &Path, dir: &Path) -> Result<(), Failed> {
    let lua = Path::new(env!("CARGO_MANIFEST_DIR")).join("wireshark/erpc.lua");
    // Every field with a distinct, non-zero value (the run above leaves
    // some at 0): the header test vector of the wire facts, a C++-style
    // control packet with 8 trailing bytes, and an SM error response with
    // two different endpoints.
    let crafted = dir.join("crafted.pcap");
    write_crafted(&crafted)?;
    let kinds = compare(tshark_path, &lua, &crafted, &[])?;
    let want: BTreeMap<String, usize> = [
        ("data RESP type 171 size 1193046".to_string(), 1),
        ("data RFR type 2 size 0".to_string(), 1),
        ("sm ConnectResp InvalidRemoteRpcId".to_string(), 1),
        ("sm ConnectResp SrvDisconnected".to_string(), 1),
        ("sm DisconnectReq NoError".to_string(), 1),
        ("sm PingResp NoError".to_string(), 2),
    ]
    .into_iter()
    .collect();
    if kinds != want {
        return Err(format!("crafted capture: {kinds:?}, expected {want:?}").into());
    }
    Ok(())
}

fn frame(payload: &[u8], src_port: u16, dst_port: u16) -> Vec<u8> {
    use transport::wire::{FrameTemplate, HEADROOM_BYTES, build_headroom};
    let t = FrameTemplate {
        dst_mac: [0x02, 0, 0, 0, 0, 0x22],
        src_mac: [0x02, 0, 0, 0, 0, 0x11],
        src_ip: "10.9.8.7".parse().unwrap(),
        dst_ip: "10.6.5.4".parse().unwrap(),
        src_port,
        dst_port,
    };
    let mut f = vec![0u8; HEADROOM_BYTES + payload.len()];
    let len = f.len();
    build_headroom(&t, &mut f, len);
    f[HEADROOM_BYTES..].copy_from_slice(payload);
    f
}

fn write_crafted(path: &Path) -> Result<(), Failed> {
    use erpc::wire::{SmEndpoint, TransportType};
    use transport::RoutingInfo;
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut w = mlx5_sim::pcap::PcapWriter::new(Box::new(file)).map_err(|e| e.to_string())?;
    let mut write = |t: u64, f: Vec<u8>| w.write_frame(t, &f).map_err(|e| e.to_string());
    // The test vector: type 0xAB, size 0x123456, session 0xBEEF, response,
    // packet 0x1555, request 0xABCDEF01234, then 5 data bytes.
    let mut data = vec![
        0xab, 0x56, 0x34, 0x12, 0xef, 0xbe, 0x57, 0x55, 0x34, 0x12, 0xf0, 0xde, 0xbc, 0xba,
    ];
    data.extend_from_slice(b"hello");
    write(1, frame(&data, 31850, 31851))?;
    // The RFR a C++ peer sends (wire facts): 14 bytes and 8 zero bytes.
    let rfr = [
        0x02, 0, 0, 0, 0, 0, 0x09, 0, 0x08, 0, 0, 0, 0, 0xb0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    write(2, frame(&rfr, 31851, 31850))?;
    // The erpc-rs extension with distinct values on each side: credits
    // asked and granted, a request-number base, incarnations.
    let ep = |tt, host: &str, port, rpc, session, r: RoutingInfo| {
        let mut e = SmEndpoint {
            transport_type: tt,
            sm_udp_port: port,
            rpc_id: rpc,
            session_num: session,
            routing_info: r.to_bytes(),
            ..SmEndpoint::default()
        };
        e.set_hostname(host).expect("short hostname");
        e.set_credits(u32::from(port) - 31_800);
        e.set_req_base(0x0fed_cba9_8765_4328 + u64::from(rpc) * 8);
        e.set_incarnation((1_764_300_000_000 << 20) + u64::from(session));
        e
    };
    let client = ep(
        TransportType::Dpdk,
        "client.example",
        31851,
        7,
        513,
        RoutingInfo {
            mac: [0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f],
            ipv4: "192.168.7.9".parse().unwrap(),
            udp_port: 10123,
            rxq_id: 3,
            rss_table_size: 128,
        },
    );
    let server = ep(
        TransportType::Raw,
        "srv",
        31852,
        254,
        0xffff,
        RoutingInfo {
            mac: [0x06, 0x05, 0x04, 0x03, 0x02, 0x01],
            ipv4: "10.1.2.3".parse().unwrap(),
            udp_port: 31999,
            rxq_id: 15,
            rss_table_size: 64,
        },
    );
    let sm = |pkt_type, err, token| SmPkt {
        pkt_type,
        err,
        uniq_token: token,
        client,
        server,
    };
    let resp = sm(
        SmPktType::ConnectResp,
        SmErr::InvalidRemoteRpcId,
        0x0123_4567_89ab_cdef,
    );
    write(3, frame(&resp.encode(), 31852, 31851))?;
    let disc = sm(
        SmPktType::DisconnectReq,
        SmErr::NoError,
        0xfedc_ba98_7654_3210,
    );
    write(4, frame(&disc.encode(), 31851, 31852))?;
    // A "server disconnected" notice with its reason byte.
    let mut notice = sm(SmPktType::ConnectResp, SmErr::SrvDisconnected, 7);
    notice.server.set_end_reason(erpc::wire::END_BY_SERVER);
    write(5, frame(&notice.encode(), 31852, 31851))?;
    // Keep-alive ping responses: live-Rpc bitmaps instead of routing
    // info (one with Rpcs 0, 9 and 254, one with none).
    for (t, ids) in [(6, &[0usize, 9, 254][..]), (7, &[][..])] {
        let mut bitmap = [0u8; erpc::wire::EXT_RPC_BITMAP_BYTES];
        for &i in ids {
            bitmap[i / 8] |= 1 << (i % 8);
        }
        let mut ping = sm(SmPktType::PingResp, SmErr::NoError, 0x77);
        ping.client.set_rpc_bitmap(&bitmap);
        ping.server.set_rpc_bitmap(&bitmap);
        write(t, frame(&ping.encode(), 31852, 31851))?;
    }
    w.flush().map_err(|e| e.to_string())?;
    Ok(())
}
