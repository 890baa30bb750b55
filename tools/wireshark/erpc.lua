-- Wireshark dissector for eRPC ("Datacenter RPCs can be General and Fast",
-- NSDI 2019) as spoken by erpc-rs and the C++ eRPC: data packets (the
-- 14-byte header after Ethernet/IPv4/UDP) and session-management packets
-- (392 bytes over UDP).
--
-- Install: copy (or symlink) this file into Wireshark's personal Lua plugin
-- folder, `~/.local/lib/wireshark/plugins/` (see Help > About > Folders),
-- or load it for one run:
--
--   tshark -X lua_script:tools/wireshark/erpc.lua -r capture.pcap
--   wireshark -X lua_script:tools/wireshark/erpc.lua capture.pcap
--
-- It registers on the UDP ports of the preference "eRPC UDP ports" (default
-- 31850-31881: eRPC's session-management base port and the 31 after it,
-- which are also the Rpc data ports erpc-rs uses by default); change it in
-- Edit > Preferences > Protocols > eRPC, or with
-- `-o erpc.udp_ports:40000-40010` on the command line. Data and SM packets
-- may share ports: the payload tells them apart (an SM packet is exactly 392
-- bytes with a small type and error code in its first 8 bytes; a data
-- packet has the magic nibble 11 in the top of byte 13).
--
-- On other ports a heuristic finds them without the preference: a UDP
-- payload of exactly 392 bytes whose type, error code and both endpoints'
-- transport types are in range and whose hostnames end in a NUL is an SM
-- packet (without it, Wireshark may take one for WireGuard); and a data
-- packet (magic 11) is claimed on a UDP port that an SM connect packet seen
-- earlier in the capture named as a data port (routing info).
--
-- Data packet header (little-endian, bytes of the UDP payload):
--   0      request type (8 bits)
--   1..3   message size in bytes (24 bits)
--   4..5   destination session number (16 bits)
--   6..13  one u64: bits 0-1 packet type, 2-15 packet number,
--          16-59 request number, 60-63 magic (11)
--
-- SM packet (little-endian, C layout with natural padding):
--   0 type (i32), 4 error (i32), 8 unique token (u64),
--   16 client endpoint (188 B), 204 server endpoint (188 B).
-- Endpoint: 0 transport type (i32), 4 hostname (char[128], NUL-terminated),
--   132 SM UDP port (u16), 134 Rpc id (u8) + 1 pad, 136 session number
--   (u16, 0xffff = none), 138 routing info (48 B), 186 2 pad.
-- Ethernet routing info: 0 MAC (6 B) + 2 pad, 8 IPv4 (u32, host order),
--   12 UDP port (u16), 14 RX queue id (u16), 16 RSS table size (u16);
--   C++ eRPC leaves 20..47 zero, erpc-rs extends it (erpc::sm_types):
--   20 session credits (u32: the client's wish, the server's grant; 0: a
--   C++ peer's fixed 32), 24 end reason of a "server disconnected" notice
--   (u8: 1 reclaimed unused, 2 ended by the server), 32 request-number
--   base (u64, a multiple of 8, proposed by the client, echoed by the
--   server), 40 Nexus incarnation (u64: ms since the Unix epoch above 20
--   random bits; 0: a C++ peer).
-- Keep-alive pings (SM types 1 and 2) carry no routing info: bytes 0..31
--   of the sender's endpoint are a bitmap of its live Rpc ids (bit i of
--   byte i / 8), 40 its incarnation.

local erpc = Proto("erpc", "eRPC")

local DATA_HDR_BYTES = 14
local SM_PKT_BYTES = 392
local SM_ENDPOINT_BYTES = 188
local PKT_MAGIC = 11
local INVALID_SESSION = 0xffff

local pkt_types = {
    [0] = "Request",
    [1] = "Request for response",
    [2] = "Explicit credit return",
    [3] = "Response",
}
local pkt_types_short = { [0] = "REQ", [1] = "RFR", [2] = "CR", [3] = "RESP" }

local SM_PING_REQ = 1
local SM_PING_RESP = 2
local SM_ERR_SRV_DISCONNECTED = 1

local end_reasons = {
    [0] = "not given",
    [1] = "reclaimed unused (no request of it ran)",
    [2] = "ended by the server (a request may have run)",
}

local sm_types = {
    [0] = "Unblock",
    [1] = "Ping request",
    [2] = "Ping response",
    [3] = "Connect request",
    [4] = "Connect response",
    [5] = "Disconnect request",
    [6] = "Disconnect response",
}

local sm_errs = {
    [0] = "No error",
    [1] = "Server disconnected",
    [2] = "RX ring exhausted",
    [3] = "Out of memory",
    [4] = "Routing resolution failure",
    [5] = "Invalid remote Rpc id",
    [6] = "Invalid transport",
}

local transport_types = {
    [0] = "InfiniBand",
    [1] = "Raw Ethernet",
    [2] = "DPDK",
    [3] = "Fake",
}

-- Status codes of erpc-rs status packets: a response header whose message
-- size is STATUS_SIZE_BASE + code (no message is that large).
local STATUS_SIZE_BASE = 0xffff00
local statuses = {
    [0] = "in progress",
    [1] = "no handler",
    [2] = "out of memory",
    [3] = "handler panicked",
}

-- Data packet fields.
local f = {
    req_type = ProtoField.uint8("erpc.req_type", "Request type", base.DEC),
    msg_size = ProtoField.uint24("erpc.msg_size", "Message size", base.DEC),
    session = ProtoField.uint16("erpc.session", "Destination session", base.DEC),
    word = ProtoField.uint64("erpc.word", "Header word", base.HEX),
    pkt_type = ProtoField.uint8("erpc.pkt_type", "Packet type", base.DEC, pkt_types),
    pkt_num = ProtoField.uint16("erpc.pkt_num", "Packet number", base.DEC),
    req_num = ProtoField.uint64("erpc.req_num", "Request number", base.DEC),
    slot = ProtoField.uint8("erpc.slot", "Session slot (request number mod 8)", base.DEC),
    magic = ProtoField.uint8("erpc.magic", "Magic", base.DEC),
    data = ProtoField.bytes("erpc.data", "Data"),
    data_len = ProtoField.uint32("erpc.data_len", "Data bytes", base.DEC),
    status = ProtoField.uint8("erpc.status", "Status (erpc-rs: the server failed the request)", base.DEC, statuses),
    -- Session management.
    sm_type = ProtoField.int32("erpc.sm.type", "SM packet type", base.DEC, sm_types),
    sm_err = ProtoField.int32("erpc.sm.err", "SM error", base.DEC, sm_errs),
    sm_token = ProtoField.uint64("erpc.sm.token", "Unique token", base.HEX),
}

-- Endpoint fields, once for the client and once for the server, so that
-- filters can say which (`erpc.sm.client.session`, `erpc.sm.server.mac`).
local function endpoint_fields(side, label)
    local p = "erpc.sm." .. side .. "."
    return {
        tree = ProtoField.none("erpc.sm." .. side, label .. " endpoint"),
        transport = ProtoField.int32(p .. "transport", "Transport type", base.DEC, transport_types),
        hostname = ProtoField.stringz(p .. "hostname", "Hostname"),
        sm_port = ProtoField.uint16(p .. "sm_port", "SM UDP port", base.DEC),
        rpc_id = ProtoField.uint8(p .. "rpc_id", "Rpc id", base.DEC),
        session = ProtoField.uint16(p .. "session", "Session number", base.DEC),
        routing = ProtoField.none(p .. "routing", "Routing info"),
        mac = ProtoField.ether(p .. "mac", "MAC"),
        ipv4 = ProtoField.ipv4(p .. "ipv4", "IPv4"),
        udp_port = ProtoField.uint16(p .. "udp_port", "UDP port", base.DEC),
        rxq = ProtoField.uint16(p .. "rxq", "RX queue id", base.DEC),
        rss = ProtoField.uint16(p .. "rss_table_size", "RSS table size", base.DEC),
        credits = ProtoField.uint32(p .. "credits", "Session credits (erpc-rs)", base.DEC),
        end_reason = ProtoField.uint8(p .. "end_reason", "End reason (erpc-rs)", base.DEC,
            end_reasons),
        req_base = ProtoField.uint64(p .. "req_base", "Request-number base (erpc-rs)", base.DEC),
        incarnation = ProtoField.uint64(p .. "incarnation", "Nexus incarnation (erpc-rs)",
            base.DEC),
        live_rpcs = ProtoField.string(p .. "live_rpcs", "Live Rpc ids (keep-alive bitmap)"),
    }
end
local ep_client = endpoint_fields("client", "Client")
local ep_server = endpoint_fields("server", "Server")

local all = {}
for _, v in pairs(f) do all[#all + 1] = v end
for _, v in pairs(ep_client) do all[#all + 1] = v end
for _, v in pairs(ep_server) do all[#all + 1] = v end
erpc.fields = all

local ef = {
    bad_magic = ProtoExpert.new("erpc.bad_magic", "Magic is not 11: not an eRPC packet?",
        expert.group.MALFORMED, expert.severity.WARN),
    short = ProtoExpert.new("erpc.short", "Shorter than the 14-byte eRPC header",
        expert.group.MALFORMED, expert.severity.ERROR),
    sm_err = ProtoExpert.new("erpc.sm.error", "Session management error",
        expert.group.RESPONSE_CODE, expert.severity.NOTE),
    bad_value = ProtoExpert.new("erpc.bad_value", "Value out of range",
        expert.group.MALFORMED, expert.severity.WARN),
}
erpc.experts = { ef.bad_magic, ef.short, ef.sm_err, ef.bad_value }

erpc.prefs.udp_ports = Pref.range("eRPC UDP ports", "31850-31881",
    "UDP ports carrying eRPC data or session-management packets", 65535)

local function is_sm(buf)
    if buf:len() ~= SM_PKT_BYTES then
        return false
    end
    local t = buf(0, 4):le_int()
    local e = buf(4, 4):le_int()
    return t >= 0 and t <= 6 and e >= 0 and e <= 6
end

-- The Rpc ids whose bits are set in a keep-alive bitmap, as "0,3,200".
local function bitmap_ids(r)
    local ids = {}
    for byte = 0, 31 do
        local v = r(byte, 1):uint()
        for bit = 0, 7 do
            if math.floor(v / 2 ^ bit) % 2 == 1 then
                ids[#ids + 1] = tostring(byte * 8 + bit)
            end
        end
    end
    return table.concat(ids, ",")
end

-- The erpc-rs extension of an endpoint's routing info (see the top).
local function dissect_extension(r, ep, fields, ping, srv_disconnected)
    if ping then
        local ids = bitmap_ids(r)
        ep:add(fields.live_rpcs, r(0, 32), ids)
    else
        local ct = ep:add_le(fields.credits, r(20, 4))
        if r(20, 4):le_uint() == 0 then
            ct:append_text(" (not given: a C++ peer's 32)")
        end
        if srv_disconnected then
            ep:add_le(fields.end_reason, r(24, 1))
        end
        ep:add_le(fields.req_base, r(32, 8))
    end
    local it = ep:add_le(fields.incarnation, r(40, 8))
    local inc = r(40, 8):le_uint64()
    if inc == UInt64.new(0) then
        it:append_text(" (none: a C++ peer)")
    else
        -- A creation time from 2020 on; simulated Nexuses (device model,
        -- eRPC's simulation) number theirs from their own clocks.
        local ms = inc:rshift(20):tonumber()
        if ms >= 1577836800000 then
            it:append_text(" (created " .. os.date("!%Y-%m-%d %H:%M:%S", math.floor(ms / 1000))
                .. string.format(".%03d UTC)", ms % 1000))
        end
    end
end

local function dissect_endpoint(buf, tree, fields, label, ping, srv_disconnected)
    local ep = tree:add(fields.tree, buf)
    local host = buf(4, 128):stringz()
    local session = buf(136, 2):le_uint()
    local t = ep:add_le(fields.transport, buf(0, 4))
    if transport_types[buf(0, 4):le_int()] == nil then
        t:add_proto_expert_info(ef.bad_value, "Unknown transport type")
    end
    ep:add(fields.hostname, buf(4, 128))
    ep:add_le(fields.sm_port, buf(132, 2))
    ep:add_le(fields.rpc_id, buf(134, 1))
    local st = ep:add_le(fields.session, buf(136, 2))
    if session == INVALID_SESSION then
        st:append_text(" (none yet)")
    end
    local r = buf(138, 48)
    if not ping then
        local rt = ep:add(fields.routing, r)
        rt:add(fields.mac, r(0, 6))
        rt:add_le(fields.ipv4, r(8, 4))
        rt:add_le(fields.udp_port, r(12, 2))
        rt:add_le(fields.rxq, r(14, 2))
        rt:add_le(fields.rss, r(16, 2))
        rt:append_text(string.format(": %s, %s, UDP port %d, RX queue %d",
            tostring(r(0, 6):ether()), tostring(r(8, 4):le_ipv4()), r(12, 2):le_uint(),
            r(14, 2):le_uint()))
    end
    dissect_extension(r, ep, fields, ping, srv_disconnected)
    local sess = session == INVALID_SESSION and "-" or tostring(session)
    ep:append_text(string.format(": %s:%d rpc %d session %s", host,
        buf(132, 2):le_uint(), buf(134, 1):le_uint(), sess))
    return string.format("%s %s:%d/%d", label, host, buf(132, 2):le_uint(), buf(134, 1):le_uint())
end

local function dissect_sm(buf, pinfo, tree)
    pinfo.cols.protocol = "eRPC SM"
    local sub = tree:add(erpc, buf(), "eRPC session management")
    local t = buf(0, 4):le_int()
    local e = buf(4, 4):le_int()
    sub:add_le(f.sm_type, buf(0, 4))
    local et = sub:add_le(f.sm_err, buf(4, 4))
    if e ~= 0 then
        et:add_proto_expert_info(ef.sm_err, sm_errs[e])
    end
    sub:add_le(f.sm_token, buf(8, 8))
    local ping = t == SM_PING_REQ or t == SM_PING_RESP
    local c = dissect_endpoint(buf(16, SM_ENDPOINT_BYTES), sub, ep_client, "client", ping, false)
    local s = dissect_endpoint(buf(16 + SM_ENDPOINT_BYTES, SM_ENDPOINT_BYTES), sub, ep_server,
        "server", ping, e == SM_ERR_SRV_DISCONNECTED)
    local info = string.format("%s, %s -> %s", sm_types[t], c, s)
    if e ~= 0 then
        info = info .. " [" .. sm_errs[e] .. "]"
    end
    pinfo.cols.info = info
    sub:append_text(": " .. sm_types[t])
end

local function dissect_data(buf, pinfo, tree)
    pinfo.cols.protocol = "eRPC"
    if buf:len() < DATA_HDR_BYTES then
        local sub = tree:add(erpc, buf())
        sub:add_proto_expert_info(ef.short)
        pinfo.cols.info = "eRPC (truncated)"
        return
    end
    local sub = tree:add(erpc, buf(0, DATA_HDR_BYTES))
    local wr = buf(6, 8)
    local word = wr:le_uint64()
    local ptype = word:band(3):tonumber()
    local pnum = word:rshift(2):band(0x3fff):tonumber()
    local reqn = word:rshift(16):band(UInt64.new(0xffffffff, 0xfff))
    local magic = word:rshift(60):tonumber()
    local size = buf(1, 3):le_uint()
    local sess = buf(4, 2):le_uint()
    sub:add_le(f.req_type, buf(0, 1))
    sub:add_le(f.msg_size, buf(1, 3))
    sub:add_le(f.session, buf(4, 2))
    local wt = sub:add_le(f.word, wr)
    wt:add(f.pkt_type, wr, ptype):append_text(" (bits 0-1)")
    wt:add(f.pkt_num, wr, pnum):append_text(" (bits 2-15)")
    wt:add(f.req_num, wr, reqn):append_text(" (bits 16-59)")
    wt:add(f.slot, wr, reqn:band(7):tonumber()):set_generated()
    local mt = wt:add(f.magic, wr, magic)
    mt:append_text(" (bits 60-63)")
    if magic ~= PKT_MAGIC then
        mt:add_proto_expert_info(ef.bad_magic)
    end
    local data_len = buf:len() - DATA_HDR_BYTES
    sub:add(f.data_len, data_len):set_generated()
    if data_len > 0 then
        tree:add(f.data, buf(DATA_HDR_BYTES))
    end
    if ptype == 3 and size >= STATUS_SIZE_BASE then
        local code = size - STATUS_SIZE_BASE
        sub:add(f.status, buf(1, 3), code):set_generated()
        local name = statuses[code] or ("status " .. code)
        pinfo.cols.info = string.format("STATUS session %d req %s pkt %d [%s] type %d",
            sess, tostring(reqn), pnum, name, buf(0, 1):uint())
        sub:append_text(string.format(": status, session %d, req %s, pkt %d, %s",
            sess, tostring(reqn), pnum, name))
        return
    end
    pinfo.cols.info = string.format("%-4s session %d req %s pkt %d size %d type %d",
        pkt_types_short[ptype], sess, tostring(reqn), pnum, size, buf(0, 1):uint())
    sub:append_text(string.format(": %s, session %d, req %s, pkt %d, size %d",
        pkt_types[ptype], sess, tostring(reqn), pnum, size))
end

-- Data ports named by the SM connect packets seen so far (for the
-- heuristic), cleared for each capture.
local learned_ports = {}

function erpc.init()
    learned_ports = {}
end

-- Learns the data ports of a connect packet's endpoints.
local function learn_ports(buf)
    local t = buf(0, 4):le_int()
    if t == SM_PING_REQ or t == SM_PING_RESP then
        return
    end
    for _, off in ipairs({ 16, 16 + SM_ENDPOINT_BYTES }) do
        local port = buf(off + 138 + 12, 2):le_uint()
        if port ~= 0 then
            learned_ports[port] = true
        end
    end
end

function erpc.dissector(buf, pinfo, tree)
    if is_sm(buf) then
        learn_ports(buf)
        dissect_sm(buf, pinfo, tree)
    else
        dissect_data(buf, pinfo, tree)
    end
    return buf:len()
end

-- An SM packet for the heuristic: is_sm, both endpoints' transport types
-- known and their hostnames NUL-terminated.
local function looks_like_sm(buf)
    if not is_sm(buf) then
        return false
    end
    for _, off in ipairs({ 16, 16 + SM_ENDPOINT_BYTES }) do
        if transport_types[buf(off, 4):le_int()] == nil then
            return false
        end
        local host = buf(off + 4, 128)
        local nul = false
        for i = 0, 127 do
            if host(i, 1):uint() == 0 then
                nul = true
                break
            end
        end
        if not nul then
            return false
        end
    end
    return true
end

local function heuristic(buf, pinfo, tree)
    if looks_like_sm(buf) then
        learn_ports(buf)
        dissect_sm(buf, pinfo, tree)
        return true
    end
    if buf:len() >= DATA_HDR_BYTES and learned_ports[pinfo.dst_port]
        and math.floor(buf(13, 1):uint() / 16) == PKT_MAGIC then
        dissect_data(buf, pinfo, tree)
        return true
    end
    return false
end

erpc:register_heuristic("udp", heuristic)

local udp_port = DissectorTable.get("udp.port")
local registered = nil

local function register_ports()
    if registered ~= nil then
        udp_port:remove(registered, erpc)
    end
    registered = erpc.prefs.udp_ports
    udp_port:add(registered, erpc)
end

function erpc.prefs_changed()
    register_ports()
end

register_ports()
