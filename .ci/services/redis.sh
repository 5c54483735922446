#!/usr/bin/env bash
# Redis on 127.0.0.1:6379 for the integration tests.
# `start` is idempotent: a server that already answers PING is left alone;
# otherwise Debian's redis-server is installed if missing and started as a
# daemon without persistence, and the script waits until it answers.
# `stop` leaves the server running: services are shared with the machine.
set -euo pipefail

port="${INTAKE_REDIS_PORT:-6379}"

answers_ping() {
    # Bash's /dev/tcp, so that the check needs no redis-cli.
    local reply
    { exec 3<>"/dev/tcp/127.0.0.1/${port}"; } 2>/dev/null || return 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 reply <&3 || reply=""
    exec 3>&- 3<&-
    [[ "${reply}" == "+PONG"* ]]
}

case "${1:-start}" in
start)
    if answers_ping; then exit 0; fi
    if ! command -v redis-server >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y redis-server >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y redis-server >/dev/null; }
    fi
    # The package may have started a server of its own meanwhile.
    if ! answers_ping; then
        redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "${port}" \
            --save "" --appendonly no
    fi
    for _ in $(seq 1 100); do
        answers_ping && exit 0
        sleep 0.1
    done
    echo "Redis did not answer PING on 127.0.0.1:${port}" >&2
    exit 1
    ;;
stop) ;;
status) answers_ping ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
