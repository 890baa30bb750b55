#!/usr/bin/env bash
# The deterministic companion of erpc-bench's small-RPC ratio (issue 16):
# instructions per RPC of the eRPC point and per round trip of its raw-echo
# reference, each run for a fixed amount of work under callgrind, and
# their ratio raw / eRPC (the rate ratio a machine bound by instructions
# would show; erpc-bench's wall-clock ratio on a shared VM is noise).
#
# Per B: four runs of `erpc-bench --batch B --count N --only SIDE` on the
# device model (its clock is virtual, so a count is the same work every
# time): eRPC and raw echo, each at two counts. Instructions are callgrind's
# whole-program totals (callgrind_annotate's PROGRAM TOTALS, as
# erpc/benches/callgrind_factors.sh reads them), and the per-RPC figure is
# the difference of the two runs divided by the difference of the RPCs
# (round trips) they completed, both nodes, as erpc-bench counts them: the
# setup (device bring-up, sessions, the start of the window) cancels.
#
# `eRPC - raw` is the difference per RPC: what eRPC's point costs the
# whole program beyond the packet work of the raw echo (eRPC itself, the
# transport work its packets need and the echo's do not, the benchmark's
# per-RPC bookkeeping beyond the echo's).
#
# TRANSPORT=udp runs the same over kernel UDP on loopback. Callgrind sees
# user space only, so there the figures leave out the kernel, which does
# most of the work of a UDP round trip (system calls and their datagrams):
# count those with `perf stat -e 'syscalls:sys_enter_*'` (BENCHMARKS.md,
# issue 32). Kernel UDP is not deterministic either: which datagrams share
# a system call depends on timing, so the counts move a little from run
# to run.
#
# Usage (from any directory):
#   tools/bench-callgrind.sh                        # B = 1 and 8
#   BATCHES="1 3 8 16" tools/bench-callgrind.sh     # other points
#   SHORT=20000 LONG=60000 tools/bench-callgrind.sh # other counts
#   TRANSPORT=udp tools/bench-callgrind.sh          # kernel UDP, user space
# Needs valgrind and free 2 MiB hugepages (erpc-bench's default run: 18).
set -euo pipefail
# A failed run inside $(...) stops the script too.
shopt -s inherit_errexit
# Paths below (the target directory) are workspace-relative.
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=target}"
: "${BATCHES:=1 8}"
: "${SHORT:=50000}"
: "${LONG:=150000}"
: "${TRANSPORT:=mlx5-sim}"
if [ "$LONG" -le "$SHORT" ]; then
  echo "bench-callgrind.sh: LONG ($LONG) must be above SHORT ($SHORT)" >&2
  exit 2
fi
cargo build --release -p erpc-tools --bin erpc-bench --locked >/dev/null 2>&1 ||
  cargo build --release -p erpc-tools --bin erpc-bench --locked
bin="$CARGO_TARGET_DIR/release/erpc-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

total_ir() {
  callgrind_annotate --auto=no "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

# run B SIDE N: prints "instructions completed" of one run.
run() {
  local b=$1 side=$2 n=$3 f="$tmp/cg.$1.$2.$3"
  if ! valgrind --tool=callgrind --callgrind-out-file="$f.out" \
    "$bin" --transport "$TRANSPORT" --batch "$b" --count "$n" --only "$side" >"$f.txt" 2>"$f.err"; then
    echo "bench-callgrind.sh: erpc-bench --transport $TRANSPORT --batch $b --count $n --only $side failed:" >&2
    grep -v '^==' "$f.err" >&2 || true
    exit 1
  fi
  # Both runs of a pair must run the same code: no fallback to 4 KiB pages.
  if grep -q 'using 4 KiB pages' "$f.err"; then
    grep 'using 4 KiB pages' "$f.err" >&2
    exit 1
  fi
  # The row of point B: completed RPCs and round trips are the last two
  # columns (`-` for the side not run).
  local col done
  if [ "$side" = erpc ]; then col=1; else col=0; fi
  done=$(awk -v b="$b" -v c="$col" '$1 == b && $2 ~ /^[0-9]+$/ { print $(NF - c) }' "$f.txt")
  if ! [[ "$done" =~ ^[0-9]+$ ]]; then
    echo "bench-callgrind.sh: no count of B = $b in erpc-bench's output:" >&2
    cat "$f.txt" >&2
    exit 1
  fi
  local ir
  ir=$(total_ir "$f.out")
  if ! [[ "$ir" =~ ^[0-9]+$ ]]; then
    echo "bench-callgrind.sh: no PROGRAM TOTALS in $f.out" >&2
    exit 1
  fi
  echo "$ir $done"
}

# per_unit B SIDE: instructions per RPC (round trip), one decimal.
per_unit() {
  local short long
  short=$(run "$1" "$2" "$SHORT")
  long=$(run "$1" "$2" "$LONG")
  awk -v s="$short" -v l="$long" 'BEGIN {
    split(s, a, " "); split(l, b, " ")
    printf "%.1f %d\n", (b[1] - a[1]) / (b[2] - a[2]), b[2] - a[2]
  }'
}

printf 'erpc-bench --transport %s --count %s and %s under callgrind (window 60, 32-byte RPCs),\n' "$TRANSPORT" "$SHORT" "$LONG"
if [ "$TRANSPORT" = udp ]; then
  printf 'user-space instructions per RPC / round trip (the kernel is not counted) from the difference of the two runs\n'
else
  printf 'whole-program instructions per RPC / round trip from the difference of the two runs\n'
fi
printf '%4s %14s %22s %12s %12s %22s\n' B "eRPC Ir/RPC" "raw echo Ir/round trip" "eRPC - raw" "raw / eRPC" "RPCs, round trips"
for b in $BATCHES; do
  erpc=$(per_unit "$b" erpc)
  raw=$(per_unit "$b" raw-echo)
  read -r e en <<<"$erpc"
  read -r r rn <<<"$raw"
  printf '%4s %14s %22s %12s %12s %22s\n' "$b" "$e" "$r" \
    "$(awk -v r="$r" -v e="$e" 'BEGIN { printf "%.1f", e - r }')" \
    "$(awk -v r="$r" -v e="$e" 'BEGIN { printf "%.3f", r / e }')" "$en, $rn"
done
