#!/usr/bin/env bash
# A headless browser for the console's browser tests: Debian's chromium,
# driven through chromedriver (WebDriver) on 127.0.0.1:9515.
# `start` is idempotent: a chromedriver that already answers /status is left
# alone; otherwise Debian's chromium and chromium-driver are installed if
# missing and chromedriver is started as a daemon, and the script waits until
# it answers. The tests start their own headless browser sessions through it.
# `stop` leaves it running: services are shared with the machine.
set -euo pipefail

port="${INTAKE_WEBDRIVER_PORT:-9515}"
log="${TMPDIR:-/tmp}/intake-chromedriver.log"

answers_status() {
    # Bash's /dev/tcp, so that the check needs no curl.
    local reply
    { exec 3<>"/dev/tcp/127.0.0.1/${port}"; } 2>/dev/null || return 1
    printf 'GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3 \
        || { exec 3>&- 3<&-; return 1; }
    reply=$(timeout 2 cat <&3 || true)
    exec 3>&- 3<&-
    [[ "${reply}" == *'"ready":true'* || "${reply}" == *'"ready": true'* ]]
}

case "${1:-start}" in
start)
    if answers_status; then exit 0; fi
    if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null 2>&1 \
            || { apt-get update -qq \
                && apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; }
    fi
    if ! answers_status; then
        # setsid: the driver outlives this script and the shell that ran it.
        setsid chromedriver --port="${port}" --allowed-ips=127.0.0.1 >"${log}" 2>&1 </dev/null &
    fi
    for _ in $(seq 1 100); do
        answers_status && exit 0
        sleep 0.1
    done
    echo "chromedriver did not answer on 127.0.0.1:${port}; its log:" >&2
    cat "${log}" >&2 || true
    exit 1
    ;;
stop) ;;
status) answers_status ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
