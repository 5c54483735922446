#!/usr/bin/env bash
# A Kafka-protocol broker for the integration tests: tansu 0.6.0 on
# 127.0.0.1:9092 with sqlite storage (its memory storage skips records when a
# fetch starts inside a batch; sqlite also keeps data and committed offsets
# across a restart, which the broker-restart test needs).
#
#   kafka.sh [start]   build tansu once into the cache, start it unless 9092 answers
#   kafka.sh stop      stop the broker this script started
#   kafka.sh restart   stop, then start on the same database
#   kafka.sh status    say whether the broker answers
#
# Idempotent. Cache: ${INTAKE_CACHE_DIR:-$HOME/.cache/intake}.
set -euo pipefail

CACHE_DIR="${INTAKE_CACHE_DIR:-$HOME/.cache/intake}"
TANSU_VERSION=0.6.0
TANSU_ROOT="$CACHE_DIR/tansu-$TANSU_VERSION"
TANSU="$TANSU_ROOT/bin/tansu"
STATE_DIR="$CACHE_DIR/kafka-broker"
PID_FILE="$STATE_DIR/tansu.pid"
LOG_FILE="$STATE_DIR/tansu.log"
DATA_DIR="${INTAKE_KAFKA_DATA_DIR:-$STATE_DIR/data}"
HOST=127.0.0.1
PORT=9092

log() { echo "kafka.sh: $*" >&2; }

listening() {
    (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null
}

install_tansu() {
    if [[ -x "$TANSU" ]]; then
        return
    fi
    log "building tansu $TANSU_VERSION into $TANSU_ROOT (about 10 minutes, once)"
    mkdir -p "$TANSU_ROOT"
    cargo install tansu@"$TANSU_VERSION" --locked --features libsql --root "$TANSU_ROOT"
}

wait_for_port() {
    for _ in $(seq 1 150); do
        if listening; then
            return 0
        fi
        if [[ -f "$PID_FILE" ]] && ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
            log "tansu exited; last log lines:"
            tail -n 20 "$LOG_FILE" >&2 || true
            return 1
        fi
        sleep 0.2
    done
    log "tansu did not listen on $HOST:$PORT within 30 s; log: $LOG_FILE"
    return 1
}

start() {
    if listening; then
        log "a broker already answers on $HOST:$PORT"
        return 0
    fi
    install_tansu
    mkdir -p "$STATE_DIR" "$DATA_DIR"
    log "starting tansu on $HOST:$PORT, storage $DATA_DIR/tansu.db"
    # tansu reads the sqlite URL's path as relative to its working directory,
    # so it runs inside the data directory. A session of its own: the broker
    # outlives whatever started it (a test restarting it, a CI step whose
    # process group is cleaned up).
    (
        cd "$DATA_DIR"
        exec setsid nohup "$TANSU" broker \
            --listener-url "tcp://$HOST:$PORT" \
            --advertised-listener-url "tcp://$HOST:$PORT" \
            --storage-engine "sqlite://tansu.db" \
            >>"$LOG_FILE" 2>&1 </dev/null
    ) &
    echo $! >"$PID_FILE"
    wait_for_port
    log "tansu is up (pid $(cat "$PID_FILE"))"
}

stop() {
    if [[ ! -f "$PID_FILE" ]]; then
        log "no broker started by this script"
        return 0
    fi
    local pid
    pid="$(cat "$PID_FILE")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$PID_FILE"
    for _ in $(seq 1 50); do
        listening || break
        sleep 0.1
    done
    log "tansu stopped"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status)
        if listening; then log "up on $HOST:$PORT"; else log "down"; exit 1; fi
        ;;
    *)
        echo "usage: $0 [start|stop|restart|status]" >&2
        exit 2
        ;;
esac
