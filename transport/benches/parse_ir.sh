#!/usr/bin/env bash
# Instructions per call of wire::parse_frame (software IPv4 checksum, and
# with the NIC's l3_ok) and wire::build_headroom, from two callgrind runs
# of different lengths (the difference cancels start-up).
# Usage: transport/benches/parse_ir.sh   (from the workspace root)
set -euo pipefail
: "${CARGO_TARGET_DIR:=target}"
cargo bench -p transport --bench parse_ir --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/parse_ir-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
total() {
  callgrind_annotate --auto=no "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
for mode in sw hw build; do
  for n in 100000 300000; do
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$mode.$n" "$bin" "$mode" "$n" >/dev/null 2>&1
  done
  a=$(total "$tmp/cg.$mode.100000"); b=$(total "$tmp/cg.$mode.300000")
  echo "$mode: $(( (b - a) / 200000 )) instructions per frame (loop included)"
done
rm -rf "$tmp"
