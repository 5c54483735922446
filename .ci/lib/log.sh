# Shared by the service scripts; sourced, not run.

# log_says_since FILE OFFSET PATTERN: whether FILE, from byte OFFSET (1-based,
# as `tail -c +N` takes it) on, has a line matching PATTERN.
#
# Not `tail | grep -q` under `set -o pipefail`: grep stops at the first match,
# tail then dies of SIGPIPE while it still has more than a pipe buffer of log
# to write, and the pipeline fails although the line is there. A broker's
# start-up log runs past 64 KiB after its "started" line (Kafka's does), so
# that check never succeeded and the start timed out.
log_says_since() {
    local file="$1" offset="$2" pattern="$3"
    grep -q -- "$pattern" < <(tail -c +"$offset" "$file")
}
