#!/usr/bin/env bash
# Instructions per message of each layer stack, measured with callgrind
# inside `handle` only (see benches/layer_cost.rs), minus the `bare` stack.
set -euo pipefail
cd "$(dirname "$0")/../../.."
N=${N:-10000}
cargo bench -p intake-core --bench layer_cost --no-run >/dev/null 2>&1
BIN=$(ls -t target/release/deps/layer_cost-* | grep -v '\.d$' | head -1)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
per_message() {
  valgrind --tool=callgrind --toggle-collect='*layer_cost*handle*' \
    --callgrind-out-file="$OUT/cg" "$BIN" "$1" "$N" >/dev/null 2>&1
  awk -v n="$((N + 1))" '/^summary:/ {printf "%d", $2 / n}' "$OUT/cg"
}
bare=$(per_message bare)
printf '%-14s %8s %8s\n' stack "Ir/msg" "layers"
printf '%-14s %8d %8s\n' bare "$bare" -
for stack in passthrough1 passthrough4 retry catch_panic trace metrics dead_letter full json; do
  cost=$(per_message "$stack")
  printf '%-14s %8d %8d\n' "$stack" "$cost" $((cost - bare))
done
