#!/usr/bin/env bash
# Instructions per RPC charged to eRPC (client + server), from two
# callgrind runs of different lengths (the difference cancels setup), on
# eRPC's simulated network (B = 8, 60 in flight per node). The rule
# (callgrind_count.py's doc; README, "Instructions per RPC: what is
# counted"): eRPC's code with everything inlined into it, and the
# inclusive cost of every call it makes into library or transport code,
# except the transport's datapath entry points (tx_burst, rx_burst,
# tx_flush, post_recvs) and the application's handlers and continuations.
# The whole program per RPC is printed beside it.
#
# Usage (from any directory; shown from the workspace root):
#   erpc/benches/callgrind_ir.sh             # totals and the top 15 functions
#   erpc/benches/callgrind_ir.sh --max 1000  # also fail (exit 1) above 1000
#   TOP=40 erpc/benches/callgrind_ir.sh      # a longer table
set -euo pipefail
# Paths below (the target directory) are workspace-relative.
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
max=()
if [ "${1:-}" = "--max" ]; then max=(--max "$2"); fi
cargo bench -p erpc --bench small_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/small_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
short=10000
long=30000
for n in $short $long; do
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$n" "$bin" callgrind "$n" >/dev/null 2>&1
done
python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$short" "$tmp/cg.$long" $(( long - short )) \
  --top "${TOP:-15}" "${max[@]}"
