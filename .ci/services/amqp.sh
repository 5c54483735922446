#!/usr/bin/env bash
# RabbitMQ on 127.0.0.1 for the integration tests (guest/guest), with two
# listeners:
#
#   5672  AMQP
#   5671  AMQP over TLS (amqps://). The server certificate (for localhost
#         and 127.0.0.1) is signed by a test CA this script makes, and the
#         broker asks every client for a certificate signed by the same CA,
#         refusing a connection without one.
#
#   amqp.sh [start]  make the certificates once, configure both listeners,
#                    start the broker, or restart one already running
#                    without the TLS listener or with other certificates
#                    (once: both are read at boot), and wait until both
#                    listeners answer
#   amqp.sh stop     leaves the broker running: services are shared with
#                    the machine
#   amqp.sh status   say whether both listeners answer with the certificates
#                    in the cache
#   amqp.sh env      print the TLS test settings as shell variables
#
# Environment:
#   INTAKE_CACHE_DIR  the certificates go to $INTAKE_CACHE_DIR/amqp-tls
#                     (default ~/.cache/intake/amqp-tls): ca.pem, client.pem
#                     and client.key (PKCS#8) for clients, other-ca.pem (an
#                     unrelated CA, for tests that a wrong CA is refused).
#                     The broker reads its copies in /etc/rabbitmq/intake-tls,
#                     which the rabbitmq user may read.
#
# Idempotent: a second `start` leaves a broker with both listeners alone, and
# the certificates are made only when missing.
set -euo pipefail

HOST=127.0.0.1
PORT=5672
TLS_PORT=5671
CONFIG=/etc/rabbitmq/rabbitmq.conf
CACHE_DIR="${INTAKE_CACHE_DIR:-$HOME/.cache/intake}"
TLS_DIR="$CACHE_DIR/amqp-tls"
BROKER_TLS_DIR=/etc/rabbitmq/intake-tls

log() { echo "amqp.sh: $*" >&2; }

listening() {
    # Bash's /dev/tcp, so that the check needs no client.
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# A CA, a server certificate it signs for localhost and 127.0.0.1 (clients
# verify the host name), a client certificate it signs, and an unrelated CA.
make_certificates() {
    if [[ -f "$TLS_DIR/.complete" ]]; then
        return
    fi
    command -v openssl >/dev/null || { log "openssl is needed for the test certificates"; return 1; }
    log "generating a test CA, server and client certificates in $TLS_DIR"
    rm -rf "$TLS_DIR"
    mkdir -p "$TLS_DIR"
    (
        cd "$TLS_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=intake AMQP test CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=unrelated test CA" \
            -keyout other-ca.key -out other-ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
            -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 3650 -extfile server.ext -out server.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=intake-test-client" \
            -keyout client.key -out client.csr 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 3650 -extfile client.ext -out client.pem 2>/dev/null
        rm -f ./*.csr ./*.ext ca.srl
    )
    touch "$TLS_DIR/.complete"
}

# The broker's copies, readable by the user it runs as.
install_broker_certificates() {
    mkdir -p "$BROKER_TLS_DIR"
    cp "$TLS_DIR/ca.pem" "$TLS_DIR/server.pem" "$TLS_DIR/server.key" "$BROKER_TLS_DIR/"
    if id rabbitmq >/dev/null 2>&1; then
        chown -R rabbitmq:rabbitmq "$BROKER_TLS_DIR"
    fi
    chmod 600 "$BROKER_TLS_DIR/server.key"
}

configure() {
    mkdir -p "$(dirname "$CONFIG")"
    # Loopback only; guest may log in from there.
    if ! grep -qs '^listeners.tcp' "$CONFIG"; then
        echo "listeners.tcp.local = $HOST:$PORT" >>"$CONFIG"
    fi
    if ! grep -qs '^listeners.ssl' "$CONFIG"; then
        cat >>"$CONFIG" <<EOF
# Written by .ci/services/amqp.sh: TLS with client certificates.
listeners.ssl.default = $HOST:$TLS_PORT
ssl_options.cacertfile = $BROKER_TLS_DIR/ca.pem
ssl_options.certfile = $BROKER_TLS_DIR/server.pem
ssl_options.keyfile = $BROKER_TLS_DIR/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
EOF
    fi
}

wait_for() {
    for _ in $(seq 1 1200); do
        if listening "$PORT" && listening "$TLS_PORT"; then
            return 0
        fi
        sleep 0.1
    done
    log "RabbitMQ did not listen on $HOST:$PORT and $HOST:$TLS_PORT within 120 s"
    return 1
}

# Whether the broker's copies are the certificates in the cache (a wiped
# cache makes new ones, which the running broker must then load).
certificates_installed() {
    cmp -s "$TLS_DIR/ca.pem" "$BROKER_TLS_DIR/ca.pem" \
        && cmp -s "$TLS_DIR/server.pem" "$BROKER_TLS_DIR/server.pem"
}

start() {
    make_certificates
    if listening "$PORT" && listening "$TLS_PORT" && certificates_installed; then
        return 0
    fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y rabbitmq-server >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y rabbitmq-server >/dev/null; }
    fi
    local reload=false
    certificates_installed || reload=true
    install_broker_certificates
    configure
    # The package may have started a broker of its own meanwhile, before the
    # configuration was complete; the configuration and the certificates
    # are read at boot.
    if listening "$PORT" && { ! listening "$TLS_PORT" || "$reload"; }; then
        log "restarting RabbitMQ once to load its TLS listener and certificates"
        rabbitmqctl stop >/dev/null 2>&1 || true
        for _ in $(seq 1 300); do
            listening "$PORT" || break
            sleep 0.1
        done
    fi
    if ! listening "$PORT"; then
        # Debian's wrapper runs it as the rabbitmq user when called as root.
        rabbitmq-server -detached
    fi
    timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
    wait_for
}

case "${1:-start}" in
start) start ;;
stop) ;;
status) listening "$PORT" && listening "$TLS_PORT" && certificates_installed ;;
env)
    echo "INTAKE_AMQP_TLS_URL=amqps://guest:guest@localhost:$TLS_PORT/%2f"
    echo "INTAKE_AMQP_TLS_DIR=$TLS_DIR"
    ;;
*) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
