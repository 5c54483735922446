#!/usr/bin/env bash
# PostgreSQL on 127.0.0.1:5432, trust auth over loopback, database `test`.
# `start` is idempotent: a server that is ready is left alone; otherwise
# Debian's postgresql is installed if missing, loopback connections are set
# to trust (Debian's default asks for a password), the cluster is started
# and the database created. `stop` leaves the server running: services are
# shared with the machine.
set -euo pipefail

ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

# Trust for TCP connections from loopback, ahead of Debian's own rules (the
# first matching line wins). Test servers only: never on a shared host.
trust_loopback() {
    local hba="$1"
    if grep -qs '^# intake: trust loopback' "$hba"; then
        return 1
    fi
    local rules
    rules=$(printf '%s\n' \
        '# intake: trust loopback (test server)' \
        'host all all 127.0.0.1/32 trust' \
        'host all all ::1/128 trust')
    printf '%s\n%s\n' "$rules" "$(cat "$hba")" >"$hba"
}

case "${1:-start}" in
start)
    if ready && psql -h 127.0.0.1 -U postgres -w -tAc 'SELECT 1' >/dev/null 2>&1; then
        psql -h 127.0.0.1 -U postgres -w -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
            || psql -h 127.0.0.1 -U postgres -w -c "CREATE DATABASE test" >/dev/null
        exit 0
    fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y postgresql >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y postgresql >/dev/null; }
    fi
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    if trust_loopback "/etc/postgresql/$version/main/pg_hba.conf" && ready; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    fi
    if ! ready; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
    fi
    for _ in $(seq 1 60); do ready && break; sleep 0.5; done
    ready || { echo "PostgreSQL did not start on 127.0.0.1:5432" >&2; exit 1; }
    psql -h 127.0.0.1 -U postgres -w -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
        || psql -h 127.0.0.1 -U postgres -w -c "CREATE DATABASE test" >/dev/null
    ;;
stop) ;;
status) ready && psql -h 127.0.0.1 -U postgres -w -tAc 'SELECT 1' >/dev/null 2>&1 ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
