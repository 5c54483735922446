#!/usr/bin/env bash
# Reproduces the Kafka throughput figures in BENCHMARKS.md: starts an Apache
# Kafka broker of the bench's own on 127.0.0.1:19092 (the test broker of
# .ci/services/kafka.sh, in a temporary directory, so that no test topic or
# group of the shared broker on 9092 competes with it), runs the
# throughput bench (release build) against it, and stops the broker.
#
#   crates/kafka/benches/run.sh
#   BENCH_MESSAGES=1000000 BENCH_ROUNDS=3 crates/kafka/benches/run.sh
#   BENCH_KAFKA_PORT=29092 crates/kafka/benches/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."

PORT="${BENCH_KAFKA_PORT:-19092}"
STATE_DIR="$(mktemp -d)"

log() { echo "run.sh: $*" >&2; }

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    log "something already listens on 127.0.0.1:$PORT; set BENCH_KAFKA_PORT"
    exit 1
fi

broker() {
    INTAKE_KAFKA_PORT="$PORT" INTAKE_KAFKA_STATE_DIR="$STATE_DIR" \
        bash .ci/services/kafka.sh "$1"
}
stop_broker() {
    broker stop || true
    rm -rf "$STATE_DIR"
}
trap stop_broker EXIT

broker start

KAFKA_BROKERS="127.0.0.1:$PORT" \
    BENCH_MESSAGES="${BENCH_MESSAGES:-1000000}" \
    BENCH_ROUNDS="${BENCH_ROUNDS:-3}" \
    cargo bench -p intake-kafka --bench throughput
