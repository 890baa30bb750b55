#!/usr/bin/env bash
# eRPC's own instructions per background RPC against a dispatch RPC (issue
# 29): the small-RPC callgrind run (32-byte RPCs, B = 8, simulated
# network) with the handler in the dispatch thread (`all`), on one stepped
# worker per node (`bg`: the worker hand-off through the SPSC links, the
# worker's side run by the benchmark's thread so the run is deterministic)
# and inline with 0 workers (`bg-inline`). Same method and counting rule as
# callgrind_ir.sh (callgrind_count.py): two runs of different lengths per
# configuration, the difference cancels setup; the worker's side counts
# (erpc/src/nexus/), the handler itself (the benchmark's) does not.
#
# The stepped workers' driver (`Nexus::step_workers` and
# `WorkerPool::run_stepped`: the lock, and the check that finds nothing in
# the many calls between jobs) is code a worker thread does not run: its
# empty polls happen on its own core while it is idle. The `bg, thread
# equivalent` row is `bg` without the instructions that run inside the
# driver (their inline chain passes through it) but not inside
# `WorkerLocal::run_next`, the per-job work a worker thread runs too
# (callgrind_count.py --exclude-fn/--keep-fn); a worker thread's loop adds
# about 5 instructions per job (its `changed` check and the call) that
# this leaves out.
# Usage: erpc/benches/callgrind_bg.sh [--max N]
#   (fails if the thread-equivalent bg - all is above N)
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${CARGO_TARGET_DIR:=target}"
max=""
if [ "${1:-}" = "--max" ]; then max=$2; fi
cargo bench -p erpc --bench small_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/small_rpc-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-24s %12s %14s\n' "handler" "eRPC Ir/RPC" "- dispatch"
base=""
for f in all bg bg-inline; do
  for n in 10000 30000; do
    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$f.$n" "$bin" callgrind "$n" "$f" >/dev/null 2>&1
  done
  e=$(python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$f.10000" "$tmp/cg.$f.30000" 20000 --total)
  [ -z "$base" ] && base=$e
  printf '%-24s %12d %14d\n' "$f" "$e" $(( e - base ))
  if [ "$f" = bg ]; then
    thr=$(python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$f.10000" "$tmp/cg.$f.30000" 20000 --total \
      --exclude-fn 'step_workers|run_stepped' --keep-fn 'run_next')
    printf '%-24s %12d %14d\n' "bg, thread equivalent" "$thr" $(( thr - base ))
    if [ -n "$max" ] && [ $(( thr - base )) -gt "$max" ]; then
      echo "FAIL: a background RPC costs eRPC $(( thr - base )) instructions more than a dispatch RPC (limit $max)"
      exit 1
    fi
  fi
done
