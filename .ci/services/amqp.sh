#!/usr/bin/env bash
# Makes sure RabbitMQ listens on 127.0.0.1:5672 (guest/guest). Idempotent:
# does nothing when something already listens there; otherwise installs
# Debian's rabbitmq-server if it is missing, starts it detached and waits
# until it accepts connections.
set -euo pipefail

listening() {
    (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null
}

if listening; then
    echo "amqp: RabbitMQ already listens on 127.0.0.1:5672"
    exit 0
fi

if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "amqp: installing rabbitmq-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq rabbitmq-server >/dev/null
fi

# Listen on loopback only; guest may log in from there by default.
if [ ! -s /etc/rabbitmq/rabbitmq.conf ] || ! grep -q '^listeners.tcp' /etc/rabbitmq/rabbitmq.conf; then
    mkdir -p /etc/rabbitmq
    echo 'listeners.tcp.local = 127.0.0.1:5672' >> /etc/rabbitmq/rabbitmq.conf
fi

echo "amqp: starting RabbitMQ"
# Debian's wrapper switches to the rabbitmq user when run as root.
rabbitmq-server -detached

# rabbitmqctl await_startup waits for the node to boot; the TCP probe
# confirms the listener. Bounded: at most 120 s.
timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
for _ in $(seq 1 120); do
    if listening; then
        echo "amqp: RabbitMQ is up ($(rabbitmqctl version 2>/dev/null || echo 'version unknown'))"
        exit 0
    fi
    sleep 1
done
echo "amqp: RabbitMQ did not start listening on 127.0.0.1:5672 within 120 s" >&2
exit 1
