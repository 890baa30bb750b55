#!/usr/bin/env bash
# Instructions per RPC with each eRPC-level optimisation of the factor
# analysis switched off in turn (simulated network, deterministic): the
# complement of `erpc-bench factors`, whose wall-clock rates on
# two shared cores are noisy. Same method and counting rule as
# callgrind_ir.sh (callgrind_count.py): two runs of different lengths per
# configuration, the difference cancels setup.
# Usage: erpc/benches/callgrind_factors.sh   (from any directory)
set -euo pipefail
# Paths below (the target directory) are workspace-relative.
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
cargo bench -p erpc --bench small_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/small_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total_ir() {
  callgrind_annotate --auto=no "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
printf '%-16s %14s %14s %10s\n' "switched off" "eRPC Ir/RPC" "program Ir/RPC" "/ all on"
base=""
for f in all batch-ts timely-bypass wheel-bypass prealloc zero-copy cc-off; do
  for n in 10000 30000; do
    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$f.$n" "$bin" callgrind "$n" "$f" >/dev/null 2>&1
  done
  e=$(python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$f.10000" "$tmp/cg.$f.30000" 20000 --total)
  t=$(( ($(total_ir "$tmp/cg.$f.30000") - $(total_ir "$tmp/cg.$f.10000")) / 20000 ))
  [ -z "$base" ] && base=$e
  printf '%-16s %14d %14d %10s\n' "$f" "$e" "$t" "$(awk -v a="$e" -v b="$base" 'BEGIN { printf "%.3f", a / b }')"
done
