#!/usr/bin/env bash
# What the debug endpoint costs erpc-bench's rate (BENCHMARKS.md, "erpc-inspect:
# the cost of being inspected"). Runs ROUNDS rounds of three runs each:
#   off      erpc-bench                    (no endpoint)
#   on       erpc-bench --inspect          (endpoint on, nobody attached)
#   watched  erpc-bench --inspect, with `erpc-inspect PID --watch` attached
# The order inside a round rotates (off on watched / on watched off / watched
# off on) so that a drift of the machine's load does not favour one kind.
# Prints each run's Mrps, each round's ratios on/off and watched/off, and per
# kind the median, min and max; the ratios reported are the medians of the
# per-round ratios (each from runs seconds apart) and the ratio of medians.
#
# Usage, from the workspace root:
#   cargo build --release -p erpc-tools --bin erpc-bench --bin erpc-inspect
#   tools/inspect-overhead.sh [ROUNDS] [erpc-bench options...]
# Default erpc-bench options: --secs 5 --warmup 0.5 --batch 8 (device model).
# WATCH_INTERVAL (seconds, default 1) is the watcher's refresh interval.
set -euo pipefail
: "${CARGO_TARGET_DIR:=target}"
bin="$CARGO_TARGET_DIR/release"
rounds="${1:-5}"
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--secs 5 --warmup 0.5 --batch 8)
interval="${WATCH_INTERVAL:-1}"
for b in erpc-bench erpc-inspect; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: build it first (see the header)" >&2; exit 2; }
done
dir=$(mktemp -d)
export ERPC_INSPECT_DIR="$dir/sock"
trap 'rm -rf "$dir"' EXIT

run() { # kind round
  local kind=$1 json="$dir/$1.$2.json"
  case $kind in
    off) "$bin/erpc-bench" "${args[@]}" --json "$json" >/dev/null 2>"$dir/$1.$2.err" ;;
    on) "$bin/erpc-bench" "${args[@]}" --inspect --json "$json" >/dev/null 2>"$dir/$1.$2.err" ;;
    watched)
      "$bin/erpc-bench" "${args[@]}" --inspect --json "$json" >/dev/null 2>"$dir/$1.$2.err" &
      local bench=$!
      while [ ! -S "$ERPC_INSPECT_DIR/$bench.sock" ] && kill -0 "$bench" 2>/dev/null; do sleep 0.05; done
      "$bin/erpc-inspect" "$bench" --watch --interval "$interval" >/dev/null 2>&1 &
      local watch_pid=$!
      wait "$bench"
      kill "$watch_pid" 2>/dev/null || true
      wait "$watch_pid" 2>/dev/null || true ;;
  esac
  python3 -c 'import json,sys; print("%-8s round %s: %s Mrps" % (sys.argv[2], sys.argv[3], " ".join("%.4f" % p["mrps"] for p in json.load(open(sys.argv[1]))["points"])))' "$json" "$kind" "$2"
}

kinds=(off on watched)
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2; do run "${kinds[$(((r - 1 + k) % 3))]}" "$r"; done
done

python3 - "$dir" "$rounds" <<'EOF'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def mrps(kind, r):
    # The first point's rate (one point with the default options).
    return json.load(open(f"{d}/{kind}.{r}.json"))["points"][0]["mrps"]
v = {k: [mrps(k, r) for r in range(1, rounds + 1)] for k in ("off", "on", "watched")}
print()
for r in range(rounds):
    print("round %d: on/off %.4f  watched/off %.4f" % (
        r + 1, v["on"][r] / v["off"][r], v["watched"][r] / v["off"][r]))
print()
med = {k: statistics.median(x) for k, x in v.items()}
for k, x in v.items():
    print("%-8s median %.4f Mrps over %d runs (min %.4f, max %.4f, spread %.1f %%)" % (
        k, med[k], len(x), min(x), max(x), 100 * (max(x) - min(x)) / med[k]))
for k in ("on", "watched"):
    per = [a / b for a, b in zip(v[k], v["off"])]
    print("%s/off: median of per-round ratios %.4f (min %.4f, max %.4f); ratio of medians %.4f" % (
        k, statistics.median(per), min(per), max(per), med[k] / med["off"]))
EOF
