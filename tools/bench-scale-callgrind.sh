#!/usr/bin/env bash
# eRPC's instructions per RPC in the session-scalability experiment
# (`erpc-bench scale`, issue 28), counted under callgrind on a
# reduced run: two runs that differ only in RPCs per session, so that the
# setup (nodes, sessions, connects) cancels; instructions are attributed to
# eRPC by erpc/benches/callgrind_count.py's rule. The idle event-loop
# iterations of the 108 Rpcs between packets are eRPC code too and grow
# with the run's length, so this counts what one core running all of them
# would pay per RPC, an upper bound on what a core of a real deployment
# (one Rpc per core) pays.
#
# Usage (from any directory):
#   tools/bench-scale-callgrind.sh                       # 100 x 20 sessions
#   CLIENTS=100 SESSIONS=200 tools/bench-scale-callgrind.sh   # the full 20 000 (slow)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=target}"
: "${CLIENTS:=100}"
: "${SESSIONS:=20}"
: "${SHORT:=2}"
: "${LONG:=4}"
cargo build --release -p erpc-tools --bin erpc-bench --locked >/dev/null 2>&1 ||
  cargo build --release -p erpc-tools --bin erpc-bench --locked
bin="$CARGO_TARGET_DIR/release/erpc-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for k in "$SHORT" "$LONG"; do
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$tmp/cg.$k" \
    "$bin" scale --client-nodes "$CLIENTS" --sessions-per-client "$SESSIONS" \
    --rpcs-per-session "$k" >"$tmp/out.$k" 2>&1 || { cat "$tmp/out.$k" >&2; exit 1; }
done
grep '^total:' "$tmp/out.$LONG"
rpcs=$(( CLIENTS * SESSIONS * (LONG - SHORT) ))
echo "sessions: $(( CLIENTS * SESSIONS )); RPCs counted: $rpcs (the difference of two runs)"
python3 erpc/benches/callgrind_count.py "$bin" "$tmp/cg.$SHORT" "$tmp/cg.$LONG" "$rpcs" --top "${TOP:-10}"
