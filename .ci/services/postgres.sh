#!/usr/bin/env bash
# PostgreSQL on 127.0.0.1:5432, trust auth, database `test`.
# `start` is idempotent; `stop` leaves a server we did not start alone.
set -euo pipefail
state_dir="${INTAKE_CACHE_DIR:-$HOME/.cache/intake}/state"
mkdir -p "$state_dir"

ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

case "${1:-start}" in
start)
    if ready; then exit 0; fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        apt-get install -y postgresql >/dev/null
    fi
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    touch "$state_dir/postgres.started-by-ci"
    for _ in $(seq 1 60); do ready && break; sleep 0.5; done
    ready || { echo "PostgreSQL did not start" >&2; exit 1; }
    psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
        || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null
    ;;
stop)
    # Services are shared with the machine: leave them running.
    rm -f "$state_dir/postgres.started-by-ci"
    ;;
status) ready ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
