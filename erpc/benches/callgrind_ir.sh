#!/usr/bin/env bash
# Instructions per RPC in eRPC's own code (client + server), from two
# callgrind runs of different lengths (the difference cancels setup).
# Counts functions whose symbol is in `erpc::` but not `erpc::sim`, and
# excludes lines inlined from the simulated transport or transport crate.
# Usage: erpc/benches/callgrind_ir.sh   (from the workspace root)
set -euo pipefail
: "${CARGO_TARGET_DIR:=target}"
cargo bench -p erpc --bench small_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/small_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
sum() {
  callgrind_annotate --auto=no --inclusive=no --threshold=100 "$1" 2>/dev/null |
    awk '/ erpc::/ && !/erpc::sim/ && !/erpc\/src\/sim\// && !/transport\/src\// {
           gsub(",", "", $1); s += $1 } END { print s + 0 }'
}
for n in 10000 30000; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$n" "$bin" callgrind "$n" >/dev/null 2>&1
done
a=$(sum "$tmp/cg.10000"); b=$(sum "$tmp/cg.30000")
all_a=$(callgrind_annotate --auto=no "$tmp/cg.10000" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
all_b=$(callgrind_annotate --auto=no "$tmp/cg.30000" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "eRPC instructions per RPC (client + server): $(( (b - a) / 20000 ))"
echo "whole program (eRPC + simulated network + benchmark loop) per RPC: $(( (all_b - all_a) / 20000 ))"
rm -rf "$tmp"
