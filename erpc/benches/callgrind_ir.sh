#!/usr/bin/env bash
# Instructions per RPC in eRPC's own code (client + server), from two
# callgrind runs of different lengths (the difference cancels setup).
# Counts functions whose symbol is in `erpc::` but not `erpc::sim`, and
# excludes lines inlined from the simulated transport or transport crate.
#
# Usage (from any directory; shown from the workspace root):
#   erpc/benches/callgrind_ir.sh             # totals and the top 15 functions
#   erpc/benches/callgrind_ir.sh --max 1000  # also fail (exit 1) above 1000
#   TOP=40 erpc/benches/callgrind_ir.sh      # a longer table
set -euo pipefail
# Paths below (the target directory) are workspace-relative.
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
max=""
if [ "${1:-}" = "--max" ]; then max="$2"; fi
cargo bench -p erpc --bench small_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/small_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
short=10000
long=30000
for n in $short $long; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$n" "$bin" callgrind "$n" >/dev/null 2>&1
  callgrind_annotate --auto=no --inclusive=no --threshold=100 "$tmp/cg.$n" >"$tmp/ann.$n" 2>/dev/null
done
python3 - "$tmp/ann.$short" "$tmp/ann.$long" $(( long - short )) "${TOP:-15}" "$max" <<'PY'
import re, sys
short, long_, rpcs, top, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# The file part has no colon: a greedy match would swallow the path of a
# function whose name has no space in it (e.g. `erpc::msgbuf::MsgBuf::write_pkt_data`).
line = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+([^:\s]+):(.*?)(?: \[[^\]]*\])?\s*$")
def load(path):
    fns, total = {}, 0
    for l in open(path):
        if "PROGRAM TOTALS" in l:
            total = int(l.split()[0].replace(",", ""))
            continue
        m = line.match(l)
        if not m:
            continue
        ir, file, fn = int(m.group(1).replace(",", "")), m.group(2), m.group(3)
        fns[(file, fn)] = fns.get((file, fn), 0) + ir
    return fns, total
a, ta = load(short)
b, tb = load(long_)
def in_erpc(fn):
    # `erpc::...`, `<impl erpc::...>` or `<erpc::... as Trait>`.
    return re.search(r"(^|[ <])erpc::", fn) is not None and "erpc::sim" not in fn
def erpc_file(file):
    return "erpc/src/" in file and "erpc/src/sim/" not in file
def ours(file, fn):
    # eRPC's functions (without what they inline from the simulated
    # transport or the transport crate), and eRPC's own lines wherever
    # they were inlined (e.g. `response_buffer` into the benchmark's
    # handler: counting by function alone would drop them).
    if in_erpc(fn):
        return "erpc/src/sim/" not in file and "transport/src/" not in file
    return erpc_file(file) and "erpc::sim" not in fn
per = {}
for k, v in b.items():
    d = (v - a.get(k, 0)) / rpcs
    if d > 0:
        per[k] = d
mine = sum(d for k, d in per.items() if ours(*k))
print(f"eRPC instructions per RPC (client + server): {round(mine)}")
print(f"whole program (eRPC + simulated network + benchmark loop) per RPC: {round((tb - ta) / rpcs)}")
print(f"top {top} functions by instructions per RPC (eRPC's marked *):")
# One row per function, its own lines and those inlined into it from
# other files together (eRPC's rows count only what the total counts).
rows = {}
for (file, fn), d in per.items():
    name = re.sub(r"::h[0-9a-f]{16}$", "", fn)
    mark = in_erpc(fn)
    if mark and not ours(file, fn):
        continue
    if not mark and ours(file, fn):
        # eRPC lines inlined into someone else's function: a row of its own.
        mark, name = True, f"(eRPC code inlined into) {name}"
    rows[(mark, name)] = rows.get((mark, name), 0) + d
for (mark, name), d in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
    if len(name) > 90:
        name = name[:87] + "..."
    print(f"  {d:7.1f} {'*' if mark else ' '} {name}")
# Event-loop iterations per RPC, and how many of them found packets:
# the rest are empty polls, whose cost the total includes (the harness
# steps the simulated network 100 ns at a time).
def calls(path, names):
    ids, counts, cur = {}, dict.fromkeys(names, 0), None
    for l in open(path.replace("ann.", "cg.")):
        # Names are compressed: "(id) name" the first time, "(id)" after,
        # in fn= and cfn= lines alike.
        m = re.match(r"c?fn=(?:\((\d+)\))?\s*(.*)", l.strip())
        if m:
            if m.group(1) and m.group(2):
                ids[m.group(1)] = m.group(2)
            name = m.group(2) or ids.get(m.group(1), "")
            if l.startswith("cfn="):
                cur = next((n for n in names if n in name), None)
        elif l.startswith("calls=") and cur:
            counts[cur] += int(l.split()[0][6:])
            cur = None
    return counts
names = ["run_event_loop_once", "::process_rx"]
ca, cb = calls(short, names), calls(long_, names)
iters = (cb[names[0]] - ca[names[0]]) / rpcs
busy = (cb[names[1]] - ca[names[1]]) / rpcs
if iters > 0:
    # An empty iteration runs only the loop's own checks: its share is
    # about the empty iterations times the loop's own cost per iteration.
    loop_own = sum(d for (f, fn), d in per.items() if fn.endswith("::run_event_loop_once"))
    empty = (iters - busy) * loop_own / iters
    print(f"event-loop iterations per RPC: {iters:.2f} ({busy:.2f} with received packets, "
          f"{iters - busy:.2f} empty, about {empty:.0f} instructions per RPC of the total)")
if limit and mine > int(limit):
    print(f"FAIL: {round(mine)} instructions per RPC is above the limit of {limit}")
    sys.exit(1)
PY
