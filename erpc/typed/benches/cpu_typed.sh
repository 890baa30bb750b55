#!/usr/bin/env bash
# CPU time per RPC of the raw API (raw, raw34), typed closure calls and
# async calls: benches/typed_rpc.rs's count mode (32-byte RPCs, 32 in
# flight per node, both nodes client and server, one thread) under
# `perf stat -e task-clock`, which counts the process's own user and
# system time and not the time it waits descheduled. On a shared 2-core
# machine that wait is what makes the wall-clock rates of typed_rpc.rs
# move by tens of percent from run to run; CPU time still moves with
# caches and clock speed, but not with the scheduler. Per mode and
# repetition: two runs of different lengths, the difference of their CPU
# time divided by the difference of their RPCs (setup cancels); the
# repetitions are interleaved, and the table gives medians and their
# ratios (raw / mode: the rate ratio a machine bound by this process's
# CPU time would show).
#
# Usage (from any directory):  bash erpc/typed/benches/cpu_typed.sh
#   WORLD=udp N1=50000 N2=250000 REPS=5 bash erpc/typed/benches/cpu_typed.sh
#   (WORLD: devmodel (default), udp (kernel time included), sim)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../../.."
: "${CARGO_TARGET_DIR:=target}"
: "${WORLD:=devmodel}"
: "${N1:=100000}"
: "${N2:=500000}"
: "${REPS:=5}"
cargo bench -p erpc-typed --bench typed_rpc --no-run >/dev/null 2>&1
bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/typed_rpc-* | grep -v '\.d$' | head -1)
# task-clock in milliseconds of one count-mode run.
tc() {
  perf stat -x, -e task-clock "$bin" callgrind "$1" "$2" "$WORLD" 2>&1 >/dev/null |
    awk -F, '/task-clock/ { print $1 }'
}
out=$(
  for _ in $(seq 1 "$REPS"); do
    for m in raw raw34 typed async; do
      a=$(tc "$m" "$N1")
      b=$(tc "$m" "$N2")
      awk -v m="$m" -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN { printf "%s %.1f\n", m, (b - a) * 1e6 / n }'
    done
  done
)
python3 - "$WORLD" "$N1" "$N2" "$REPS" <<PY
import statistics, sys
world, n1, n2, reps = sys.argv[1:]
d = {}
for line in """$out""".split("\n"):
    m, v = line.split()
    d.setdefault(m, []).append(float(v))
med = {m: statistics.median(v) for m, v in d.items()}
print(f"typed_rpc CPU time per RPC, {world}: {reps} interleaved repetitions of {n1} and {n2} RPCs")
print(f"{'API':<8} {'median ns/RPC':>14} {'range':>14} {'raw / API':>10} {'raw34 / API':>12}")
for m, v in d.items():
    rng = f"{min(v):.0f}-{max(v):.0f}"
    print(f"{m:<8} {med[m]:>14.1f} {rng:>14} {med['raw'] / med[m]:>10.3f} {med['raw34'] / med[m]:>12.3f}")
PY
