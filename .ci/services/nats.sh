#!/usr/bin/env bash
# NATS with JetStream for the tests: Debian's nats-server (2.9) on
# 127.0.0.1:PORT, JetStream storage in a temporary directory.
#
#   nats.sh [start]   install nats-server if missing, start it unless PORT
#                     answers, wait until it serves
#   nats.sh stop      stop the server this script started on PORT; a server
#                     it did not start (shared with the machine) is left alone
#   nats.sh restart   stop, then start on the same storage (streams,
#                     consumers and their acknowledgements survive)
#   nats.sh kill      SIGKILL the server this script started (a crash, for
#                     outage tests)
#   nats.sh status    say whether PORT answers as a NATS server
#   nats.sh env       print the TLS test settings as shell variables
#
# Environment:
#   INTAKE_NATS_PORT       client port (default 4222); a test that stops or
#                          kills a server runs one of its own on another port,
#                          so the shared server never goes down under others
#   INTAKE_NATS_STATE_DIR  config, JetStream storage, certificates, pid and
#                          log (default: a directory of its own per port under
#                          the temporary directory)
#   INTAKE_NATS_TLS=1      require TLS with a certificate for 127.0.0.1 and
#                          localhost signed by a CA this script makes (`env`
#                          prints its path); for a test's own server
#   INTAKE_NATS_INCLUDE    a config file to include (authorization blocks, for
#                          a test's own server)
#
# Idempotent: a second `start` leaves a running server alone.
set -euo pipefail
# shellcheck source=../lib/log.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/log.sh"

HOST=127.0.0.1
PORT="${INTAKE_NATS_PORT:-4222}"
STATE_DIR="${INTAKE_NATS_STATE_DIR:-${TMPDIR:-/tmp}/intake-nats-$PORT}"
STORE_DIR="$STATE_DIR/jetstream"
TLS_DIR="$STATE_DIR/tls"
PID_FILE="$STATE_DIR/server.pid"
LOG_FILE="$STATE_DIR/server.log"
CONFIG="$STATE_DIR/server.conf"

log() { echo "nats.sh [$PORT]: $*" >&2; }

# A NATS server greets every connection with `INFO {…}` at once; anything
# else on the port (or nothing) is not one.
answers() {
    local greeting
    { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
    IFS= read -r -t 2 greeting <&3 || greeting=""
    exec 3>&- 3<&-
    [[ "$greeting" == INFO* ]]
}

install_server() {
    command -v nats-server >/dev/null 2>&1 && return 0
    log "installing Debian's nats-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y nats-server >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y nats-server >/dev/null; }
}

# A CA and a server certificate it signs for 127.0.0.1 and localhost, and a
# second, unrelated CA, so that tests can show that a wrong CA is refused.
make_certificates() {
    [[ -f "$TLS_DIR/.complete" ]] && return 0
    command -v openssl >/dev/null || { log "openssl is needed for the test certificates"; return 1; }
    rm -rf "$TLS_DIR"
    mkdir -p "$TLS_DIR"
    (
        cd "$TLS_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=intake NATS test CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=unrelated test CA" \
            -keyout other-ca.key -out other-ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
            -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 3650 -extfile server.ext -out server.pem 2>/dev/null
        rm -f server.csr server.ext ca.srl
    )
    touch "$TLS_DIR/.complete"
}

write_config() {
    mkdir -p "$STORE_DIR"
    {
        echo "# Written by .ci/services/nats.sh: a test server, one node."
        echo "listen: $HOST:$PORT"
        echo "server_name: intake_test_$PORT"
        # Test payloads go up to a few MiB (hostile-input tests).
        echo "max_payload: 8MB"
        echo "jetstream {"
        echo "  store_dir: \"$STORE_DIR\""
        echo "  max_memory_store: 256MB"
        echo "  max_file_store: 8GB"
        echo "}"
        if [[ "${INTAKE_NATS_TLS:-0}" == 1 ]]; then
            echo "tls {"
            echo "  cert_file: \"$TLS_DIR/server.pem\""
            echo "  key_file: \"$TLS_DIR/server.key\""
            echo "  timeout: 5"
            echo "}"
        fi
        if [[ -n "${INTAKE_NATS_INCLUDE:-}" ]]; then
            # nats-server reads an include relative to the config's own
            # directory, whatever its form: a copy goes next to it.
            cp "${INTAKE_NATS_INCLUDE}" "$STATE_DIR/include.conf"
            echo "include \"include.conf\""
        fi
    } >"$CONFIG"
}

server_pid() {
    [[ -f "$PID_FILE" ]] && cat "$PID_FILE"
}

wait_until_serving() {
    local pid="$1" started_at="$2"
    for _ in $(seq 1 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "the server exited; last log lines:"
            tail -n 30 "$LOG_FILE" >&2 || true
            return 1
        fi
        # TLS-only servers still send their INFO in clear text first.
        if answers && log_says_since "$LOG_FILE" "$started_at" "Server is ready"; then
            return 0
        fi
        sleep 0.1
    done
    log "the server did not start within 30 s; last log lines ($LOG_FILE):"
    tail -n 30 "$LOG_FILE" >&2 || true
    return 1
}

start() {
    if answers; then
        return 0
    fi
    install_server
    mkdir -p "$STATE_DIR"
    if [[ "${INTAKE_NATS_TLS:-0}" == 1 ]]; then
        make_certificates
    fi
    write_config
    touch "$LOG_FILE"
    local started_at
    started_at=$(($(stat -c %s "$LOG_FILE") + 1))
    log "starting nats-server $(nats-server --version 2>/dev/null | awk '{print $2}') with JetStream on $HOST:$PORT (storage $STORE_DIR)"
    # A session of its own: the server outlives whatever started it (a test
    # restarting it, a CI step whose process group is cleaned up).
    setsid nohup nats-server -c "$CONFIG" >>"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    wait_until_serving "$pid" "$started_at"
    log "up (pid $pid)"
}

stop() {
    local pid
    if ! pid="$(server_pid)"; then
        log "no server started by this script on $PORT"
        return 0
    fi
    if kill -0 "$pid" 2>/dev/null; then
        # SIGTERM: nats-server flushes JetStream and exits. Bounded: one that
        # hangs is killed.
        kill "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "no exit within 10 s of SIGTERM; SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

crash() {
    local pid
    if ! pid="$(server_pid)"; then
        log "no server started by this script on $PORT"
        return 1
    fi
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    rm -f "$PID_FILE"
    log "killed (pid $pid)"
}

print_env() {
    cat <<EOF
INTAKE_NATS_URL=nats://$HOST:$PORT
INTAKE_NATS_CA=$TLS_DIR/ca.pem
INTAKE_NATS_OTHER_CA=$TLS_DIR/other-ca.pem
EOF
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    kill) crash ;;
    status)
        if answers; then log "up on $HOST:$PORT"; else log "down"; exit 1; fi
        ;;
    env) print_env ;;
    *)
        echo "usage: $0 [start|stop|restart|kill|status|env]" >&2
        exit 2
        ;;
esac
