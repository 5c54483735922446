#!/usr/bin/env bash
# RabbitMQ on 127.0.0.1:5672 (guest/guest) for the integration tests.
# `start` is idempotent: a broker that already listens is left alone;
# otherwise Debian's rabbitmq-server is installed if missing, started
# detached, and the script waits (at most 120 s) until it accepts
# connections. `stop` leaves it running: services are shared with the
# machine.
set -euo pipefail

listening() {
    # Bash's /dev/tcp, so that the check needs no client.
    { exec 3<>/dev/tcp/127.0.0.1/5672; } 2>/dev/null || return 1
    exec 3>&- 3<&-
}

case "${1:-start}" in
start)
    if listening; then exit 0; fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y rabbitmq-server >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y rabbitmq-server >/dev/null; }
    fi
    # Loopback only; guest may log in from there.
    if ! grep -qs '^listeners.tcp' /etc/rabbitmq/rabbitmq.conf; then
        mkdir -p /etc/rabbitmq
        echo 'listeners.tcp.local = 127.0.0.1:5672' >> /etc/rabbitmq/rabbitmq.conf
    fi
    # The package may have started a broker of its own meanwhile. Debian's
    # wrapper runs it as the rabbitmq user when called as root.
    if ! listening; then
        rabbitmq-server -detached
    fi
    timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
    for _ in $(seq 1 1200); do
        listening && exit 0
        sleep 0.1
    done
    echo "RabbitMQ did not listen on 127.0.0.1:5672 within 120 s" >&2
    exit 1
    ;;
stop) ;;
status) listening ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
