#!/usr/bin/env bash
# Driver instructions per frame on the device model, sent and received, at
# bursts of 16 and 1, from two callgrind runs of different lengths (the
# difference cancels bring-up). Counts only the driver: functions whose
# symbol is in `mlx5::` (not `mlx5_sim::`) minus lines inlined into them
# from the model, plus driver lines inlined into the bench's loop. The
# model's own code (doorbell handling, steering, DMA, CQE writes) is out.
# Send: mode tx (B's steering drops the frames, B never polls).
# Receive: mode txrx minus mode tx (B polls once per burst, no busy loop).
# Usage: driver/benches/callgrind_driver.sh [--top]   (from any directory)
set -euo pipefail
# callgrind names files relative to the directory it ran in; the patterns
# below expect workspace-relative paths.
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
cargo bench -p mlx5 --bench callgrind_driver --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/callgrind_driver-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lines() {
  callgrind_annotate --auto=no --inclusive=no --threshold=100 "$1" 2>/dev/null |
    awk '{ ir = $1; gsub(",", "", ir); if (ir !~ /^[0-9]+$/) next
           # "N (p%)  file:function [object]"
           if (!match($0, /%\) +/)) next
           loc = substr($0, RSTART + RLENGTH); sub(/ \[[^]]*\]$/, "", loc)
           i = index(loc, ":"); file = substr(loc, 1, i - 1); fn = substr(loc, i + 1)
           model = (file ~ /driver\/sim\// || file ~ /transport\//)
           driver_fn = (fn ~ /^<?mlx5::/)
           inlined_driver = (file ~ /^driver\/src\// && fn ~ /^callgrind_driver::/)
           if (!model && (driver_fn || inlined_driver)) print ir "\t" fn }'
}
sum() { lines "$1" | awk -F'\t' '{ s += $1 } END { print s + 0 }'; }
n1=32000; n2=96000
declare -A ir
for burst in 16 1; do
  for mode in tx txrx; do
    for n in $n1 $n2; do
      valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$mode.$burst.$n" \
        "$bin" "$mode" "$burst" "$n" >/dev/null 2>&1
    done
    a=$(sum "$tmp/cg.$mode.$burst.$n1"); b=$(sum "$tmp/cg.$mode.$burst.$n2")
    ir[$mode.$burst]=$(( (b - a) ))
  done
  d=$(( n2 - n1 ))
  tx=$(( ${ir[tx.$burst]} / d )); all=$(( ${ir[txrx.$burst]} / d ))
  echo "burst $burst: driver instructions per frame sent $tx, received $(( all - tx ))"
  if [ "${1:-}" = "--top" ]; then
    for mode in tx txrx; do
      echo "  $mode, per frame, by function (top 12):"
      paste <(lines "$tmp/cg.$mode.$burst.$n2" | awk -F'\t' '{ s[$2] += $1 } END { for (f in s) print s[f] "\t" f }' | sort -k2) \
            <(lines "$tmp/cg.$mode.$burst.$n1" | awk -F'\t' '{ s[$2] += $1 } END { for (f in s) print s[f] "\t" f }' | sort -k2) |
        awk -F'\t' -v d="$d" '$2 == $4 { printf "%8.1f  %s\n", ($1 - $3) / d, $2 }' | sort -rn | head -12
    done
  fi
done
