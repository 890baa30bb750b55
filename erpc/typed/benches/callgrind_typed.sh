#!/usr/bin/env bash
# Instructions per RPC of the raw API (a 32-byte echo, and raw34: the typed
# layer's wire sizes), typed closure calls and async calls
# (benches/typed_rpc.rs's four modes, 32-byte RPCs, 32 in flight per
# node, both nodes client and server) on eRPC's simulated network or on
# the device model, whose virtual clocks make a count the same work every
# time. Per mode: two
# callgrind runs of different lengths; the difference of the whole
# program's instructions divided by the difference of the RPCs cancels
# setup. `eRPC core` is the part callgrind_count.py attributes to eRPC's
# own source (erpc/src), which should not move between the modes: the
# typed layer sits on the same core path.
#
# Usage (from any directory):  bash erpc/typed/benches/callgrind_typed.sh
#   SHORT=20000 LONG=60000 bash erpc/typed/benches/callgrind_typed.sh
#   WORLD=devmodel bash erpc/typed/benches/callgrind_typed.sh   # the device model
#     (two software ConnectX NICs: the NIC model's instructions count too)
#   WORLD=udp ...    # kernel UDP on loopback (user-space instructions only:
#     callgrind does not see the kernel's, which dominate there)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../../.."
: "${CARGO_TARGET_DIR:=target}"
: "${SHORT:=20000}"
: "${LONG:=60000}"
: "${WORLD:=sim}"
cargo bench -p erpc-typed --bench typed_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/typed_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total_ir() {
  callgrind_annotate --auto=no "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
printf '%-8s %16s %14s %12s\n' "API" "program Ir/RPC" "/ raw" "eRPC core"
raw=""
for m in raw raw34 typed async; do
  for n in "$SHORT" "$LONG"; do
    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$m.$n" "$bin" callgrind "$m" "$n" "$WORLD" >/dev/null 2>&1
  done
  t=$(( ($(total_ir "$tmp/cg.$m.$LONG") - $(total_ir "$tmp/cg.$m.$SHORT")) / (LONG - SHORT) ))
  e=$(python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$m.$SHORT" "$tmp/cg.$m.$LONG" $(( LONG - SHORT )) --total)
  [ -z "$raw" ] && raw=$t
  printf '%-8s %16d %14s %12s\n' "$m" "$t" "$(awk -v a="$t" -v b="$raw" 'BEGIN { printf "%.3f", a / b }')" "$e"
done
