#!/usr/bin/env bash
# Instructions per message of a pipeline benchmark's consume region:
#   (Ir(2N) - Ir(N)) / N, counted by callgrind on `consume_region` only.
# Usage: benches/callgrind.sh <bench-name> [N]     (default N = 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: benches/callgrind.sh <bench-name> [N]}
n=${2:-200000}
binary=$(cargo bench --bench "$bench" --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | grep "/$bench-" | tail -n 1 | cut -d'"' -f4)
[ -x "$binary" ] || { echo "cannot find the $bench binary" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() {
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*consume_region*' \
        --callgrind-out-file="$out/$1.out" "$binary" --once "$1" >/dev/null 2>"$out/$1.log"
    grep -E '^(summary|totals):' "$out/$1.out" | head -n 1 | awk '{print $2}'
}
ir_n=$(count "$n")
ir_2n=$(count "$((2 * n))")
per=$(( (ir_2n - ir_n) / n ))
echo "$bench: Ir(N=$n)=$ir_n Ir(2N)=$ir_2n -> $per instructions per message"
