#!/usr/bin/env bash
# Instructions per message (callgrind, benches/callgrind.sh) of the raw-bytes
# pipeline as the consumer's shape grows, one dimension at a time, for a
# no-op handler and for one that awaits once; prints BENCHMARKS.md's table.
# Usage: benches/scaling.sh [N]      (default N = 100000 messages)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
measure() { # env assignments...
    env "$@" benches/callgrind.sh scaling "$n" | sed -E 's/.*-> ([0-9]+) instructions.*/\1/'
}
row() { # label, env assignments...
    local label=$1
    shift
    local noop awaiting
    noop=$(measure "$@" INTAKE_BENCH_HANDLER=noop)
    awaiting=$(measure "$@" INTAKE_BENCH_HANDLER=await)
    printf '| %s | %s | %s |\n' "$label" "$noop" "$awaiting"
}
echo "| shape (one dimension changed from 4 partitions, no keys, 256 in flight) | no-op handler | awaits once |"
echo "|---|---|---|"
for partitions in 1 4 64 1024; do
    row "$partitions partitions" INTAKE_BENCH_PARTITIONS=$partitions
done
for keys in 10 1000 100000; do
    row "$keys keys (key order)" INTAKE_BENCH_KEYS=$keys
done
for in_flight in 16 256 4096 65536; do
    row "$in_flight in flight" INTAKE_BENCH_IN_FLIGHT=$in_flight
done
