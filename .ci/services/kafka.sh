#!/usr/bin/env bash
# Apache Kafka for the tests: one node in KRaft mode (broker and controller in
# one JVM) on 127.0.0.1, with three client listeners:
#
#   PORT     (9092)  PLAINTEXT
#   PORT+1   (9093)  SSL, server certificate signed by a CA this script makes
#   PORT+2   (9094)  SASL_SSL with SCRAM-SHA-512, user `intake`
#   PORT+3   (9095)  the KRaft controller (not for clients)
#
#   kafka.sh [start]   fetch the jars once, format storage once, start the
#                      broker unless PORT answers, wait until it serves
#   kafka.sh stop      stop the broker this script started on PORT
#   kafka.sh restart   stop, then start on the same storage (data and
#                      committed offsets survive)
#   kafka.sh kill      SIGKILL the broker (a crash, for outage tests)
#   kafka.sh status    say whether PORT answers
#   kafka.sh env       print the TLS/SASL test settings as shell variables
#
# Environment:
#   INTAKE_KAFKA_PORT   first port (default 9092); a test that stops or kills
#                       a broker runs one of its own on another port, so the
#                       shared broker never goes down under other tests
#   INTAKE_CACHE_DIR    jars and broker state (default ~/.cache/intake); the
#                       jars are shared by every port, the state is per port
#   INTAKE_KAFKA_STATE_DIR  the broker's state (config, storage, certificates,
#                       pid, log) elsewhere: a test's own broker in its own
#                       temporary directory
#   INTAKE_KAFKA_FRESH  1: `start` drops the storage first when no broker
#                       answers (what .ci/run does: its broker holds only
#                       the topics earlier runs left behind, and a broker
#                       with thousands of them spends minutes loading them)
#   JAVA_HOME           a JDK of 17 or later (Kafka 4 brokers need 17)
#
# Version: Apache Kafka 4.1.1, the newest maintenance release of 4.1 that
# Maven Central serves here with all of its dependencies. 4.x is KRaft only
# (no ZooKeeper to run), serves both group protocols (classic, which
# librdkafka uses by default, and KIP-848's consumer protocol), transactions
# and SCRAM, and runs on the machine's Java 17.
#
# Idempotent: a second `start` leaves a running broker alone; the jars are
# downloaded (with Maven, from Maven Central) and the storage formatted only
# when missing.
set -euo pipefail
# shellcheck source=../lib/log.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/log.sh"

KAFKA_VERSION=4.1.1
# The SLF4J binding Kafka's own distribution ships (log4j 2).
LOG4J_VERSION=2.24.3
SLF4J_VERSION=2.0.17

HOST=127.0.0.1
PORT="${INTAKE_KAFKA_PORT:-9092}"
TLS_PORT=$((PORT + 1))
SASL_PORT=$((PORT + 2))
CONTROLLER_PORT=$((PORT + 3))

CACHE_DIR="${INTAKE_CACHE_DIR:-$HOME/.cache/intake}"
LIBS_DIR="$CACHE_DIR/apache-kafka-$KAFKA_VERSION/libs"
STATE_DIR="${INTAKE_KAFKA_STATE_DIR:-$CACHE_DIR/kafka-$PORT}"
DATA_DIR="$STATE_DIR/data"
TLS_DIR="$STATE_DIR/tls"
PID_FILE="$STATE_DIR/broker.pid"
LOG_FILE="$STATE_DIR/broker.log"
CONFIG="$STATE_DIR/server.properties"

# Test credentials: a test broker on loopback, nothing else trusts them.
SCRAM_USER=intake
SCRAM_PASSWORD=intake-secret
STORE_PASSWORD=intake-store

log() { echo "kafka.sh [$PORT]: $*" >&2; }

listening() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

java_bin() {
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        echo "$JAVA_HOME/bin/java"
    else
        command -v java
    fi
}

# The broker's jars and their dependencies, resolved by Maven from Maven
# Central into the cache (once; a partial download is never used).
fetch_jars() {
    if [[ -f "$LIBS_DIR/.complete" ]]; then
        return
    fi
    log "fetching Apache Kafka $KAFKA_VERSION from Maven Central into $LIBS_DIR"
    local work
    work="$(mktemp -d)"
    cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>intake.ci</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$work/libs" -DincludeScope=runtime >&2
    rm -rf "$LIBS_DIR"
    mkdir -p "$(dirname "$LIBS_DIR")"
    mv "$work/libs" "$LIBS_DIR"
    touch "$LIBS_DIR/.complete"
    rm -rf "$work"
}

# A CA, and a broker certificate it signs for 127.0.0.1 and localhost (so
# clients verify the hostname, as librdkafka does by default). The broker
# reads a PKCS#12 keystore; clients take ca.pem. A second, unrelated CA
# (other-ca.pem) lets tests show that a wrong CA is refused.
make_certificates() {
    if [[ -f "$TLS_DIR/.complete" ]]; then
        return
    fi
    log "generating a test CA and broker certificate in $TLS_DIR"
    rm -rf "$TLS_DIR"
    mkdir -p "$TLS_DIR"
    (
        cd "$TLS_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=intake test CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=unrelated test CA" \
            -keyout other-ca.key -out other-ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
            -keyout broker.key -out broker.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >broker.ext
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 3650 -extfile broker.ext -out broker.pem 2>/dev/null
        openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem \
            -name broker -passout "pass:$STORE_PASSWORD" -out broker.p12
        rm -f broker.csr broker.ext ca.srl
    )
    touch "$TLS_DIR/.complete"
}

write_config() {
    mkdir -p "$DATA_DIR"
    cat >"$CONFIG" <<EOF
# Written by .ci/services/kafka.sh: a one-node test cluster.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://$HOST:$PORT,SSL://$HOST:$TLS_PORT,SASL_SSL://$HOST:$SASL_PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT,SSL://$HOST:$TLS_PORT,SASL_SSL://$HOST:$SASL_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DATA_DIR

# TLS on the SSL and SASL_SSL listeners.
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/broker.p12
ssl.keystore.password=$STORE_PASSWORD
ssl.key.password=$STORE_PASSWORD
ssl.client.auth=none

# SCRAM-SHA-512 on the SASL_SSL listener; the user is created when the
# storage is formatted.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;

# One node: every internal topic has one replica, and fewer partitions than
# the defaults (50) so that the first group or transaction starts quickly.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
default.replication.factor=1

# A new group's first rebalance waits 1.5 s for more members (Kafka's default
# is 3 s): consumers started together share the first assignment, as in
# production, instead of the first one draining a small backlog alone before
# the second is in (the chaos two-consumer scenario's victim got nothing
# that way: 20,000 records took the first member under a second). Session
# timeouts as short as 1 s are allowed (tests of a crashed member's
# takeover use short sessions).
group.initial.rebalance.delay.ms=1500
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=500

# Producers and tests may write to a topic before creating it.
auto.create.topics.enable=true
num.partitions=1

# Test data is small and short-lived; small segments keep deletes cheap.
log.segment.bytes=67108864
log.retention.hours=24
EOF
}

format_storage() {
    if [[ -f "$DATA_DIR/meta.properties" ]]; then
        return
    fi
    local java cluster_id
    java="$(java_bin)"
    cluster_id="$("$java" -cp "$LIBS_DIR/*" kafka.tools.StorageTool random-uuid)"
    log "formatting storage in $DATA_DIR (cluster $cluster_id)"
    "$java" -cp "$LIBS_DIR/*" kafka.tools.StorageTool format \
        -t "$cluster_id" -c "$CONFIG" \
        --add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$SCRAM_PASSWORD]" >&2
}

write_logging() {
    cat >"$STATE_DIR/log4j2.properties" <<'EOF'
# Broker logs to stdout (the script sends it to broker.log); state changes
# and the request log stay quiet.
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
EOF
}

# The broker answers metadata on PORT once it has finished starting; the
# port alone opens earlier. `kafka.tools` has no small probe, so the check
# is the listener plus the log line Kafka writes when it is ready. A broker
# loading many partitions logs each one: the wait gives up after 120 s
# without a new log line, or after 15 min in all.
wait_until_serving() {
    local pid="$1" started_at="$2"
    local size last_size=-1 quiet_ticks=0
    for _ in $(seq 1 4500); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "the broker exited; last log lines:"
            tail -n 30 "$LOG_FILE" >&2 || true
            return 1
        fi
        if listening "$PORT" && listening "$SASL_PORT" \
            && log_says_since "$LOG_FILE" "$started_at" "Kafka Server started"; then
            return 0
        fi
        size=$(stat -c %s "$LOG_FILE" 2>/dev/null || echo 0)
        if [[ "$size" == "$last_size" ]]; then
            quiet_ticks=$((quiet_ticks + 1))
            if ((quiet_ticks >= 600)); then
                break
            fi
        else
            last_size=$size
            quiet_ticks=0
        fi
        sleep 0.2
    done
    log "the broker did not start (120 s without progress, or 15 min in all); last log lines ($LOG_FILE):"
    tail -n 30 "$LOG_FILE" >&2 || true
    return 1
}

# Test storage from earlier runs: dropped on request, so that the broker
# starts in seconds instead of loading every topic those runs created.
drop_storage_if_fresh_requested() {
    if [[ "${INTAKE_KAFKA_FRESH:-0}" == 1 && -d "$DATA_DIR" ]]; then
        log "INTAKE_KAFKA_FRESH=1: dropping the storage earlier runs left in $DATA_DIR"
        rm -rf "$DATA_DIR"
    fi
}

start() {
    if listening "$PORT"; then
        log "a broker already answers on $HOST:$PORT"
        return 0
    fi
    command -v openssl >/dev/null || { log "openssl is needed for the test certificates"; return 1; }
    fetch_jars
    mkdir -p "$STATE_DIR"
    make_certificates
    write_config
    write_logging
    drop_storage_if_fresh_requested
    format_storage
    local java started_at
    java="$(java_bin)"
    touch "$LOG_FILE"
    started_at=$(($(stat -c %s "$LOG_FILE") + 1))
    log "starting Apache Kafka $KAFKA_VERSION on $HOST:$PORT (TLS $TLS_PORT, SASL_SSL $SASL_PORT)"
    # A session of its own: the broker outlives whatever started it (a test
    # restarting it, a CI step whose process group is cleaned up).
    setsid nohup "$java" \
        -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$STATE_DIR/log4j2.properties" \
        -cp "$LIBS_DIR/*" kafka.Kafka "$CONFIG" \
        >>"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    wait_until_serving "$pid" "$started_at"
    log "Apache Kafka is up (pid $pid)"
}

broker_pid() {
    [[ -f "$PID_FILE" ]] && cat "$PID_FILE"
}

stop() {
    local pid
    if ! pid="$(broker_pid)"; then
        log "no broker started by this script on $PORT"
        return 0
    fi
    if kill -0 "$pid" 2>/dev/null; then
        # SIGTERM is Kafka's controlled shutdown: logs flushed, the next
        # start needs no recovery. Bounded: a broker that hangs is killed.
        kill "$pid"
        for _ in $(seq 1 300); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "no exit within 30 s of SIGTERM; SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$PID_FILE"
    for _ in $(seq 1 100); do
        listening "$PORT" || break
        sleep 0.1
    done
    log "stopped"
}

crash() {
    local pid
    if ! pid="$(broker_pid)"; then
        log "no broker started by this script on $PORT"
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
INTAKE_KAFKA_BROKERS=$HOST:$PORT
INTAKE_KAFKA_TLS_BROKERS=$HOST:$TLS_PORT
INTAKE_KAFKA_SASL_BROKERS=$HOST:$SASL_PORT
INTAKE_KAFKA_CA=$TLS_DIR/ca.pem
INTAKE_KAFKA_OTHER_CA=$TLS_DIR/other-ca.pem
INTAKE_KAFKA_SCRAM_USER=$SCRAM_USER
INTAKE_KAFKA_SCRAM_PASSWORD=$SCRAM_PASSWORD
EOF
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    kill) crash ;;
    status)
        if listening "$PORT"; then log "up on $HOST:$PORT"; else log "down"; exit 1; fi
        ;;
    env) print_env ;;
    *)
        echo "usage: $0 [start|stop|restart|kill|status|env]" >&2
        exit 2
        ;;
esac
