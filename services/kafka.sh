#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft: broker and controller in one JVM) on 127.0.0.1, with
# transactions, for the integration tests and the demo. Needs Java 17+, Maven (first run only,
# to fetch the jars from Maven Central) and python3.
#
#   services/kafka.sh up            start a broker on free ports (reuses a stopped one's state)
#   services/kafka.sh down          stop it and delete its state
#   services/kafka.sh status        exit 0 when it is running
#   services/kafka.sh bootstrap     print host:port for bootstrap.servers
#   services/kafka.sh stop-broker   graceful stop; data and ports are kept
#   services/kafka.sh kill-broker   SIGKILL (a crash); data and ports are kept
#   services/kafka.sh start-broker  start the stopped broker again, same data and ports
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS
# (default in services/settings.env), TWOPHASE_KAFKA_READY_TIMEOUT (seconds, default 60),
# TWOPHASE_KAFKA_FEATURES (extra `--feature name=level` for formatting, e.g.
# "transaction.version=1"), PYTHON (interpreter with confluent-kafka for the readiness check),
# JAVA_HOME.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=kafka
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=$TWOPHASE_KAFKA_VERSION
POM=$SERVICES_DIR/kafka/pom.xml
LIBS=$CACHE/kafka-$VERSION/libs
STATE=$RUN_DIR/kafka
PIDFILE=$STATE/kafka.pid
PROPS=$STATE/server.properties
TXN_MAX=${TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS:-$TWOPHASE_DEFAULT_KAFKA_TXN_MAX_TIMEOUT_MS}
READY_TIMEOUT=${TWOPHASE_KAFKA_READY_TIMEOUT:-60}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

# ---------------------------------------------------------------------------------------------
# Jars: resolved once per (Kafka version, pom content) and cached.

ensure_jars() {
    local stamp=$CACHE/kafka-$VERSION/pom.sha256 want tmp
    want=$(sha256sum "$POM" | cut -d' ' -f1)
    if [[ -d $LIBS && -f $stamp && $(<"$stamp") == "$want" ]]; then
        return 0
    fi
    command -v "$JAVA" >/dev/null || die "java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)"
    if ! command -v mvn >/dev/null; then
        # Maven is needed once, to fetch the jars; as root on Debian, install it.
        if ((EUID == 0)) && command -v apt-get >/dev/null; then
            apt_install maven
        else
            die "mvn not found: Maven is needed once to fetch the Kafka jars (Debian: sudo apt-get install maven)"
        fi
    fi
    log "fetching Kafka $VERSION jars from Maven Central into $LIBS (first run only)"
    # Resolve into a scratch directory and move it into place at the end, so an interrupted
    # download never looks like a complete cache.
    tmp=$CACHE/kafka-$VERSION/libs.partial
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # -q still prints stray colour codes with Maven 3.8, so the output goes to a file, shown on
    # failure only.
    if ! mvn -q -B -f "$POM" dependency:copy-dependencies \
        -Dkafka.version="$VERSION" -DoutputDirectory="$tmp" -DincludeScope=runtime \
        >"$CACHE/kafka-$VERSION/mvn.log" 2>&1; then
        cat "$CACHE/kafka-$VERSION/mvn.log" >&2
        die "could not fetch the Kafka jars with Maven (is Maven Central reachable?)"
    fi
    rm -rf "$LIBS"
    mv "$tmp" "$LIBS"
    echo "$want" >"$stamp"
}

# ---------------------------------------------------------------------------------------------
# State: $STATE/ports.env (ports, cluster id), server.properties, log4j.properties, data/,
# broker.log (the broker's own log), stdout.log (JVM output), kafka.pid, .formatted.

broker_pid() {
    local pid
    [[ -f $PIDFILE ]] || return 1
    pid=$(<"$PIDFILE")
    # The pid must still be *our* broker: java running kafka.Kafka on this state's config.
    pid_matches "$pid" "$PROPS" || return 1
    echo "$pid"
}

is_running() { broker_pid >/dev/null; }

load_ports() {
    [[ -f $STATE/ports.env ]] || die "no broker state in $STATE: run '$0 up' first"
    # shellcheck source=/dev/null
    . "$STATE/ports.env"
}

bootstrap() {
    load_ports
    echo "127.0.0.1:$BROKER_PORT"
}

write_config() {
    local prop
    {
        echo "# Written by services/kafka.sh; single-node KRaft cluster on loopback."
        echo "process.roles=broker,controller"
        echo "node.id=1"
        # A static one-voter quorum: formatting needs no --standalone and restarts need nothing.
        echo "controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT"
        echo "controller.listener.names=CONTROLLER"
        echo "listeners=PLAINTEXT://127.0.0.1:$BROKER_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT"
        echo "advertised.listeners=PLAINTEXT://127.0.0.1:$BROKER_PORT"
        echo "inter.broker.listener.name=PLAINTEXT"
        echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        echo "log.dirs=$STATE/data"
        echo "transaction.max.timeout.ms=$TXN_MAX"
        # The settings shared with docker-compose.yml (services/settings.env).
        for prop in $TWOPHASE_KAFKA_BROKER_PROPERTIES; do
            echo "$prop"
        done
    } >"$PROPS"

    # The broker logs through slf4j -> reload4j; everything goes to broker.log in the state dir.
    cat >"$STATE/log4j.properties" <<EOF
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=$STATE/broker.log
log4j.appender.file.MaxFileSize=100MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOF
    # Kafka 4 also drives log4j2 directly (dynamic log levels); without a configuration log4j2
    # complains on stderr. Give it one: warnings only, to stderr (= stdout.log).
    cat >"$STATE/log4j2.properties" <<EOF
status = warn
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
EOF
    # Command-line tools (the storage formatter) only report warnings, on stderr.
    cat >"$STATE/tools-log4j.properties" <<EOF
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
}

# The equivalent of `kafka-storage.sh format -t <id> -c server.properties`.
format_storage() {
    local features=() f
    for f in ${TWOPHASE_KAFKA_FEATURES:-}; do
        features+=(--feature "$f")
    done
    if ! "$JAVA" -Xmx256m -Dlog4j.configuration="file:$STATE/tools-log4j.properties" \
        -Dlog4j2.configurationFile="$STATE/log4j2.properties" \
        -cp "$LIBS/*" kafka.tools.StorageTool format \
        --cluster-id "$CLUSTER_ID" --config "$PROPS" "${features[@]}" \
        >"$STATE/format.log" 2>&1; then
        cat "$STATE/format.log" >&2
        die "formatting the KRaft storage failed"
    fi
    touch "$STATE/.formatted"
}

start_java() {
    local pid
    # Where this run's lines begin in broker.log (it is appended to across restarts).
    LOG_MARK=1
    [[ ! -f $STATE/broker.log ]] || LOG_MARK=$(($(wc -l <"$STATE/broker.log") + 1))
    # setsid: the broker gets its own session, so it outlives this script and is not hit by a
    # Ctrl-C aimed at `make`. Its stdout/stderr (JVM messages, crashes) go to stdout.log.
    # shellcheck disable=SC2086  # TWOPHASE_KAFKA_HEAP_OPTS holds several JVM flags on purpose
    setsid "$JAVA" $TWOPHASE_KAFKA_HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
        -Dlog4j.configuration="file:$STATE/log4j.properties" -Dkafka.logs.dir="$STATE" \
        -Dlog4j2.configurationFile="$STATE/log4j2.properties" \
        -cp "$LIBS/*" kafka.Kafka "$PROPS" \
        </dev/null >>"$STATE/stdout.log" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"
    log "broker started, pid $pid, bootstrap 127.0.0.1:$BROKER_PORT (log: $STATE/broker.log)"
}

# Ready = the broker answers a metadata request with itself in the broker list.
metadata_ok() {
    "$PYTHON" - "127.0.0.1:$BROKER_PORT" <<'EOF' 2>/dev/null
import sys
try:
    from confluent_kafka.admin import AdminClient
except ImportError:
    sys.exit(3)
admin = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0})
metadata = admin.list_topics(timeout=3)
sys.exit(0 if metadata.brokers else 1)
EOF
}

wait_ready() {
    local pid=$1 deadline=$((SECONDS + READY_TIMEOUT)) rc warned=
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            fail_start "the broker process exited during startup"
        fi
        rc=0
        metadata_ok || rc=$?
        if ((rc == 0)); then
            log "ready: 127.0.0.1:$BROKER_PORT"
            return 0
        elif ((rc == 3)); then
            # No confluent-kafka in $PYTHON: settle for the broker's own "started" line.
            [[ -n $warned ]] || log "note: $PYTHON has no confluent_kafka; waiting for the broker log instead"
            warned=1
            if tail -n "+${LOG_MARK:-1}" "$STATE/broker.log" 2>/dev/null | grep -q "Kafka Server started"; then
                log "ready (log says started): 127.0.0.1:$BROKER_PORT"
                return 0
            fi
        fi
        sleep 1
    done
    fail_start "no metadata response from 127.0.0.1:$BROKER_PORT within ${READY_TIMEOUT}s"
}

fail_start() {
    local this_run
    this_run=$(tail -n "+${LOG_MARK:-1}" "$STATE/broker.log" 2>/dev/null || true)
    # A failed start ends in pages of shutdown chatter: show the errors first, then the tail.
    log "$1; errors in $STATE/broker.log:"
    grep -E -A1 '\] (ERROR|FATAL) ' <<<"$this_run" | head -n 30 >&2 || true
    log "last lines of $STATE/broker.log:"
    tail -n 15 <<<"$this_run" >&2 || true
    if [[ -s $STATE/stdout.log ]]; then
        log "last lines of $STATE/stdout.log:"
        tail -n 20 "$STATE/stdout.log" >&2
    fi
    stop_broker KILL
    die "Kafka did not start"
}

# stop_broker [TERM|KILL]: a TERM is a controlled shutdown; after 60 s it becomes a KILL.
stop_broker() {
    local sig=${1:-TERM} pid
    pid=$(broker_pid) || {
        rm -f "$PIDFILE"
        return 0
    }
    log "stopping broker pid $pid (SIG$sig)"
    kill -"$sig" "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" 60; then
        log "broker did not stop within 60 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || die "could not stop broker pid $pid"
    fi
    rm -f "$PIDFILE"
}

start_existing() {
    load_ports
    # Same ports and data; the configuration is rewritten so that changed settings apply.
    write_config
    start_java
    wait_ready "$(<"$PIDFILE")"
}

# ---------------------------------------------------------------------------------------------

cmd_up() {
    if is_running; then
        load_ports
        log "already running (pid $(broker_pid))"
        wait_ready "$(broker_pid)"
        return 0
    fi
    ensure_jars
    # A stopped broker (stop-broker, or a crash) is resumed when its ports are still free.
    if [[ -f $STATE/.formatted && -f $STATE/ports.env ]]; then
        load_ports
        if port_is_free "$BROKER_PORT" && port_is_free "$CONTROLLER_PORT"; then
            log "resuming the stopped broker in $STATE"
            start_existing
            return 0
        fi
        log "ports of the old broker state are taken; starting from scratch"
    fi
    rm -rf "$STATE"
    mkdir -p "$STATE"
    read -r BROKER_PORT CONTROLLER_PORT < <(free_ports 2)
    # A cluster id is 16 random bytes in URL-safe base64 without padding, like
    # `kafka-storage random-uuid`, which also avoids a leading '-'.
    CLUSTER_ID=$("$PYTHON" -c '
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break')
    printf 'BROKER_PORT=%s\nCONTROLLER_PORT=%s\nCLUSTER_ID=%s\n' \
        "$BROKER_PORT" "$CONTROLLER_PORT" "$CLUSTER_ID" >"$STATE/ports.env"
    write_config
    format_storage
    start_java
    wait_ready "$(<"$PIDFILE")"
}

cmd_down() {
    stop_broker TERM
    rm -rf "$STATE"
    log "down"
}

cmd_status() {
    if is_running; then
        load_ports
        echo "kafka: running, pid $(broker_pid), bootstrap 127.0.0.1:$BROKER_PORT, state $STATE"
    elif [[ -f $STATE/.formatted ]]; then
        load_ports
        echo "kafka: stopped (state kept in $STATE, bootstrap was 127.0.0.1:$BROKER_PORT)"
        return 3
    else
        echo "kafka: not running"
        return 3
    fi
}

cmd_start_broker() {
    [[ -f $STATE/.formatted ]] || die "no formatted broker in $STATE: run '$0 up' first"
    if is_running; then
        load_ports
        log "already running (pid $(broker_pid))"
        return 0
    fi
    ensure_jars
    start_existing
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
bootstrap) bootstrap ;;
stop-broker) stop_broker TERM ;;
kill-broker) stop_broker KILL ;;
start-broker) cmd_start_broker ;;
*)
    echo "usage: $0 up|down|status|bootstrap|stop-broker|kill-broker|start-broker" >&2
    exit 2
    ;;
esac
