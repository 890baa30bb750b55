#!/usr/bin/env bash
# What a host pays per small RPC on the mlx5 path: instructions per RPC
# (client + server) in eRPC, the transport crate and the mlx5 driver,
# counted under callgrind from erpc-bench on the device model, with the
# device model's own code left out by crate (mlx5-sim in driver/sim/, the
# network model in driver/netsim/: on a real ConnectX that work is the
# NIC's). callgrind_count.py --rule host decides per instruction (see its
# doc and README, "instructions per RPC"); the benchmark's own loop,
# handler and continuation are the application's and do not count.
#
# Two runs of `erpc-bench --batch B --count N --only erpc` (device model,
# window 60, 32-byte RPCs, congestion control on as by default there):
# the difference of the two, divided by the difference of the RPCs they
# completed, cancels setup (bring-up, sessions).
#
# Usage (from any directory):
#   erpc/benches/callgrind_host.sh             # B = 8, totals and top 15
#   erpc/benches/callgrind_host.sh --max 2600  # also fail (exit 1) above 2600
#   BATCH=1 TOP=40 erpc/benches/callgrind_host.sh
# Needs valgrind and free 2 MiB hugepages (erpc-bench's default run: 18).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
: "${BATCH:=8}"
: "${SHORT:=10000}"
: "${LONG:=30000}"
max=()
if [ "${1:-}" = "--max" ]; then max=(--max "$2"); fi
cargo build --release -p erpc-tools --bin erpc-bench --locked >/dev/null 2>&1 ||
  cargo build --release -p erpc-tools --bin erpc-bench --locked
bin="$CARGO_TARGET_DIR/release/erpc-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run N: one counted run under callgrind; prints the RPCs it completed.
run() {
  local n=$1 f="$tmp/cg.$1"
  if ! valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$f.out" \
    "$bin" --batch "$BATCH" --count "$n" --only erpc >"$f.txt" 2>"$f.err"; then
    echo "callgrind_host.sh: erpc-bench --batch $BATCH --count $n --only erpc failed:" >&2
    grep -v '^==' "$f.err" >&2 || true
    exit 1
  fi
  # Both runs must run the same code: no fallback to 4 KiB pages.
  if grep -q 'using 4 KiB pages' "$f.err"; then
    grep 'using 4 KiB pages' "$f.err" >&2
    exit 1
  fi
  # The completed RPCs: the row of point B, second-to-last column.
  local done
  done=$(awk -v b="$BATCH" '$1 == b && $2 ~ /^[0-9]+$/ { print $(NF - 1) }' "$f.txt")
  if ! [[ "$done" =~ ^[0-9]+$ ]]; then
    echo "callgrind_host.sh: no count of B = $BATCH in erpc-bench's output:" >&2
    cat "$f.txt" >&2
    exit 1
  fi
  echo "$done"
}

short_done=$(run "$SHORT")
long_done=$(run "$LONG")
echo "erpc-bench --batch $BATCH --count $SHORT and $LONG --only erpc under callgrind (device model):"
echo "$(( long_done - short_done )) RPCs between the two runs"
python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$SHORT.out" "$tmp/cg.$LONG.out" \
  $(( long_done - short_done )) --rule host --top "${TOP:-15}" "${max[@]}"
