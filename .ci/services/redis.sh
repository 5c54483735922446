#!/usr/bin/env bash
# Makes sure Redis answers on 127.0.0.1:6379 for the integration tests.
#
# Idempotent: if something already answers PING there, it is left alone.
# Otherwise Debian's redis-server is installed if missing and started as a
# daemon without persistence, and the script waits until it answers.
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

if answers_ping; then
    echo "redis: already answering on 127.0.0.1:${port}"
    exit 0
fi

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis: installing redis-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq redis-server >/dev/null
fi

# The package may have started a server of its own meanwhile.
if ! answers_ping; then
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "${port}" \
        --save "" --appendonly no
fi

for _ in $(seq 1 100); do
    if answers_ping; then
        echo "redis: answering on 127.0.0.1:${port}"
        exit 0
    fi
    sleep 0.1
done
echo "redis: nothing answers PING on 127.0.0.1:${port}" >&2
exit 1
