#!/usr/bin/env bash
# eRPC's own instructions per data packet for large messages (client +
# server), from two callgrind runs of different lengths of the large_msg
# harness (the difference cancels setup). A data packet is one request or
# response packet carrying up to MAX_DATA_PER_PKT (968) bytes; the credit
# return or RFR that paces it, and the copy of its bytes into the
# reassembly or response buffer, are counted with it. Which instructions
# are eRPC's is decided as in callgrind_ir.sh (callgrind_count.py).
#
# Usage (from any directory):
#   erpc/benches/callgrind_large.sh            # 1 MiB requests and responses
#   erpc/benches/callgrind_large.sh --max 900  # also fail (exit 1) above 900
#   SIZE=8192 erpc/benches/callgrind_large.sh  # another size
#   TOP=40 erpc/benches/callgrind_large.sh     # a longer table
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
size=${SIZE:-1048576}
max=()
if [ "${1:-}" = "--max" ]; then max=(--max "$2"); fi
cargo bench -p erpc --bench large_msg --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/large_msg-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Enough RPCs that each run moves about 40 MB (at least 20 RPCs).
short=$(( 20 + 40000000 / (2 * size) ))
long=$(( 3 * short ))
for n in $short $long; do
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$n" \
    "$bin" callgrind "$n" "$size" >/dev/null 2>&1
done
# Data packets per RPC: the request's and the response's.
max_data=968
pkts=$(( 2 * ((size + max_data - 1) / max_data) ))
echo "size $size bytes: $pkts data packets per RPC; the figures below are per data packet"
set +e
python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$short" "$tmp/cg.$long" \
  $(( (long - short) * pkts )) --top "${TOP:-15}" "${max[@]}" > "$tmp/out"
rc=$?
set -e
sed 's/per RPC/per data packet/g' "$tmp/out"
exit $rc
