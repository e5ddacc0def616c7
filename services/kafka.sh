#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft: broker and controller in one JVM) on 127.0.0.1, with
# transactions, for the integration tests and the demo. Needs Java 17+, Maven (first run only,
# to fetch the jars from Maven Central) and python3.
#
#   services/kafka.sh up            start a broker on free ports (reuses a stopped one's state)
#   services/kafka.sh down          stop it and delete its state
#   services/kafka.sh status        exit 0 when it is running
#   services/kafka.sh bootstrap     print host:port for bootstrap.servers
#   services/kafka.sh proxy         print what the broker's proxy listens on and forwards to
#                                   (`127.0.0.1:<proxy port> 127.0.0.1:<proxied port>`)
#   services/kafka.sh stop-broker   graceful stop; data and ports are kept
#   services/kafka.sh kill-broker   SIGKILL (a crash); data and ports are kept
#   services/kafka.sh start-broker  start the stopped broker again, same data and ports
#   services/kafka.sh secured       print `export NAME=value` lines: the SASL_SSL listener and
#                                   its super user's name and password
#
# A client that bootstraps through a proxy (services/toxiproxy.sh) is told by the broker where
# the broker is and then connects there. So the broker has a second listener, PROXIED, that
# advertises the proxy's port instead of its own: clients that bootstrap at the proxy stay on
# the proxy, clients that bootstrap at the plain listener (`bootstrap`) never see it.
#
# A third listener, SASL_SSL, takes SCRAM-SHA-512 over TLS (the set's certificate from
# services/lib.sh's tls_ensure, read as PEM). KRaft's StandardAuthorizer guards every listener
# with allow.everyone.if.no.acl.found=false; its super users are the admin user (a SCRAM
# credential set through the plain listener after each start, its password made at the first
# start in $STATE/admin.password, mode 600) and User:ANONYMOUS, which is who the PLAINTEXT,
# PROXIED and CONTROLLER listeners' clients are: they keep every right. Whoever connects over
# SASL_SSL as another user has exactly the ACLs made for it.
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS
# (default in services/settings.env), TWOPHASE_KAFKA_READY_TIMEOUT (seconds, default 60),
# TWOPHASE_KAFKA_FEATURES (extra `--feature name=level` for formatting, e.g.
# "transaction.version=1"), PYTHON (interpreter with confluent-kafka for the readiness check),
# JAVA_HOME.
#
# The life of the broker (up, down, status, the verbs above) is services/lib.sh's; this file
# says how Kafka does each step.
set -euo pipefail
SERVICE=kafka
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE=Kafka
NOUN=broker
ADDRESS_VERB=bootstrap
STATE=$RUN_DIR/kafka
MARKER=.formatted
SERVER_LOG=$STATE/broker.log # the broker's own log
OUTPUT_LOG=$STATE/stdout.log # the JVM's output (crashes, log4j2 warnings)
READY_TIMEOUT=${TWOPHASE_KAFKA_READY_TIMEOUT:-60}
READY_INTERVAL=1
EXTRA_VERBS='proxy secured'
ADMIN_USER=twophase-admin
ADMIN_PASSWORD_FILE=$STATE/admin.password

# The state: ports.env (ports, the proxy's port, the SASL_SSL port, cluster id), admin.password,
# server.pem and server.key (copies of the set's), server.properties, log4j.properties, data/,
# broker.log, stdout.log, kafka.pid, .formatted.
VERSION=$TWOPHASE_KAFKA_VERSION
POM=$SERVICES_DIR/kafka/pom.xml
LIBS=$CACHE/kafka-$VERSION/libs
PIDFILE=$STATE/kafka.pid
PROPS=$STATE/server.properties
TXN_MAX=${TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS:-$TWOPHASE_DEFAULT_KAFKA_TXN_MAX_TIMEOUT_MS}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

# svc_install: the jars, resolved by Maven once per (Kafka version, pom content) and cached.
svc_install() {
    local stamp=$CACHE/kafka-$VERSION/pom.sha256 want tmp
    want=$(sha256sum "$POM" | cut -d' ' -f1)
    if [[ -d $LIBS && -f $stamp && $(<"$stamp") == "$want" ]]; then
        return 0
    fi
    command -v "$JAVA" >/dev/null || die "java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)"
    # Maven is needed once, to fetch the jars; as root on Debian, it is installed.
    command -v mvn >/dev/null ||
        install_or_die "mvn not found: Maven is needed once to fetch the Kafka jars (Debian: sudo apt-get install maven)" maven
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

# svc_load, svc_ports: ports.env holds the ports and the cluster id. The proxy's port is not
# the broker's to bind (toxiproxy listens there), so it is not among the ports a resume needs.
svc_load() {
    PROXIED_PORT='' PROXY_PORT='' SASL_PORT=''
    # shellcheck source=/dev/null
    . "$STATE/ports.env"
    if [[ -z $PROXIED_PORT || -z $PROXY_PORT ]]; then
        # A state made before the broker had a listener for its proxy: two ports more, kept
        # from now on; the configuration takes them at the next start (svc_launch).
        read -r PROXIED_PORT PROXY_PORT < <(free_ports 2)
        printf 'PROXIED_PORT=%s\nPROXY_PORT=%s\n' "$PROXIED_PORT" "$PROXY_PORT" >>"$STATE/ports.env"
    fi
    if [[ -z $SASL_PORT ]]; then
        # A state made before the SASL_SSL listener: one port more, kept from now on.
        SASL_PORT=$(free_ports 1)
        printf 'SASL_PORT=%s\n' "$SASL_PORT" >>"$STATE/ports.env"
    fi
    ensure_admin_password
}
svc_ports() { echo "$BROKER_PORT $CONTROLLER_PORT $PROXIED_PORT $SASL_PORT"; }

# ensure_admin_password: the super user's random password, made once per state (mode 600).
ensure_admin_password() {
    [[ -s $ADMIN_PASSWORD_FILE ]] && return 0
    (
        umask 077
        "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))' >"$ADMIN_PASSWORD_FILE.tmp"
    )
    mv "$ADMIN_PASSWORD_FILE.tmp" "$ADMIN_PASSWORD_FILE"
}

# copy_tls: the set's server key and certificate, in one PEM key store of the state's that
# only its owner reads (Kafka's ssl.keystore.type=PEM takes the key and the chain in one file).
copy_tls() {
    tls_ensure
    (
        umask 077
        cat "$TLS_DIR/server.key" "$TLS_DIR/server.pem" >"$STATE/server.keystore.pem.tmp"
    )
    mv "$STATE/server.keystore.pem.tmp" "$STATE/server.keystore.pem"
}

# write_config: server.properties and the log configurations, from the state's ports.
write_config() {
    local prop
    {
        echo "# Written by services/kafka.sh; single-node KRaft cluster on loopback."
        echo "process.roles=broker,controller"
        echo "node.id=1"
        # A static one-voter quorum: formatting needs no --standalone and restarts need nothing.
        echo "controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT"
        echo "controller.listener.names=CONTROLLER"
        echo "listeners=PLAINTEXT://127.0.0.1:$BROKER_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT,PROXIED://127.0.0.1:$PROXIED_PORT,SASL_SSL://127.0.0.1:$SASL_PORT"
        # PROXIED is reached through the proxy only, so it advertises the proxy's port.
        echo "advertised.listeners=PLAINTEXT://127.0.0.1:$BROKER_PORT,PROXIED://127.0.0.1:$PROXY_PORT,SASL_SSL://127.0.0.1:$SASL_PORT"
        echo "inter.broker.listener.name=PLAINTEXT"
        echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,SASL_SSL:SASL_SSL"
        # The secured listener: SCRAM-SHA-512 over TLS with the set's certificate (PEM files).
        echo "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512"
        echo "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
        echo "sasl.enabled.mechanisms=SCRAM-SHA-512"
        echo "ssl.keystore.type=PEM"
        echo "ssl.keystore.location=$STATE/server.keystore.pem"
        echo "ssl.client.auth=none"
        # ACLs on every listener; the plain listeners' clients (User:ANONYMOUS) and the admin
        # are super users, so only SASL_SSL's other users are held to their ACLs.
        echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        echo "allow.everyone.if.no.acl.found=false"
        echo "super.users=User:$ADMIN_USER;User:ANONYMOUS"
        echo "log.dirs=$STATE/data"
        echo "transaction.max.timeout.ms=$TXN_MAX"
        # The settings shared with docker-compose.yml (services/settings.env).
        for prop in $TWOPHASE_KAFKA_BROKER_PROPERTIES; do
            echo "$prop"
        done
    } >"$PROPS"

    # The broker logs through slf4j -> reload4j; everything goes to broker.log in the state dir.
    cat >"$STATE/log4j.properties" <<EOC
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=$SERVER_LOG
log4j.appender.file.MaxFileSize=100MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOC
    # Kafka 4 also drives log4j2 directly (dynamic log levels); without a configuration log4j2
    # complains on stderr. Give it one: warnings only, to stderr (= stdout.log).
    cat >"$STATE/log4j2.properties" <<EOC
status = warn
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
EOC
    # Command-line tools (the storage formatter) only report warnings, on stderr.
    cat >"$STATE/tools-log4j.properties" <<EOC
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOC
}

# svc_create: five free ports, a cluster id, the configuration, then the equivalent of
# `kafka-storage.sh format -t <id> -c server.properties`.
svc_create() {
    local features=() f
    read -r BROKER_PORT CONTROLLER_PORT PROXIED_PORT PROXY_PORT SASL_PORT < <(free_ports 5)
    # A cluster id is 16 random bytes in URL-safe base64 without padding, like
    # `kafka-storage random-uuid`, which also avoids a leading '-'.
    CLUSTER_ID=$("$PYTHON" -c '
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break')
    printf 'BROKER_PORT=%s\nCONTROLLER_PORT=%s\nPROXIED_PORT=%s\nPROXY_PORT=%s\nSASL_PORT=%s\nCLUSTER_ID=%s\n' \
        "$BROKER_PORT" "$CONTROLLER_PORT" "$PROXIED_PORT" "$PROXY_PORT" "$SASL_PORT" "$CLUSTER_ID" \
        >"$STATE/ports.env"
    ensure_admin_password
    copy_tls
    write_config
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

# svc_launch: the broker JVM on the state's data and ports; the configuration is written again
# first, so that changed settings apply.
svc_launch() {
    copy_tls
    write_config
    # shellcheck disable=SC2086  # TWOPHASE_KAFKA_HEAP_OPTS holds several JVM flags on purpose
    start_background "$OUTPUT_LOG" "$PIDFILE" \
        "$JAVA" $TWOPHASE_KAFKA_HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
        -Dlog4j.configuration="file:$STATE/log4j.properties" -Dkafka.logs.dir="$STATE" \
        -Dlog4j2.configurationFile="$STATE/log4j2.properties" \
        -cp "$LIBS/*" kafka.Kafka "$PROPS"
    log "broker started, pid $STARTED_PID, bootstrap 127.0.0.1:$BROKER_PORT (log: $SERVER_LOG)"
}

# svc_ready: the broker answers a metadata request with itself in the broker list. Without
# confluent-kafka in $PYTHON, the broker's own "started" line in this run's log.
svc_ready() {
    local rc=0
    "$PYTHON" - "127.0.0.1:$BROKER_PORT" <<'EOP' 2>/dev/null || rc=$?
import sys
try:
    from confluent_kafka.admin import AdminClient
except ImportError:
    sys.exit(3)
admin = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0})
metadata = admin.list_topics(timeout=3)
sys.exit(0 if metadata.brokers else 1)
EOP
    ((rc != 3)) && return "$rc"
    [[ -n ${NOTED_NO_CLIENT:-} ]] || log "note: $PYTHON has no confluent_kafka; waiting for the broker log instead"
    NOTED_NO_CLIENT=1
    # grep without -q reads to the end: with -q it would stop at the match, tail would die of
    # SIGPIPE, and pipefail would turn the match into a failure.
    tail -n "+${LOG_MARK:-1}" "$SERVER_LOG" 2>/dev/null | grep "Kafka Server started" >/dev/null
}

# svc_setup: the admin's SCRAM credential (set, or set again, through the plain listener, whose
# clients are super users), then a login as the admin over SASL_SSL that must succeed. Topics
# are created by their users (auto.create.topics.enable as well).
svc_setup() {
    "$PYTHON" - "127.0.0.1:$BROKER_PORT" "127.0.0.1:$SASL_PORT" "$ADMIN_USER" "$ADMIN_PASSWORD_FILE" "$TLS_DIR/ca.pem" <<'EOP' || die "could not set up the SASL_SSL listener's admin user (see $SERVER_LOG)"
import sys
import time

from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

plain, secured, user, passwordFile, ca = sys.argv[1:]
password = open(passwordFile).read().strip()
admin = AdminClient({"bootstrap.servers": plain, "log_level": 0})
upsert = UserScramCredentialUpsertion(
    user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
)
admin.alter_user_scram_credentials([upsert])[user].result(timeout=30)
config = {
    "bootstrap.servers": secured,
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": user,
    "sasl.password": password,
    "ssl.ca.location": ca,
    "log_level": 0,
}
client = AdminClient(config)
deadline = time.monotonic() + 90
while True:  # the credential reaches the listener through the metadata log: soon, not at once
    try:
        client.describe_cluster(request_timeout=5).result(timeout=10)
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
EOP
}

# svc_pid: the pid file's process, if it is still java running kafka.Kafka on this state.
svc_pid() { pid_from_file "$PIDFILE" "$PROPS"; }

# svc_stop MODE PID: SIGTERM is a controlled shutdown, SIGKILL a crash.
svc_stop() { stop_pid "$@"; }

# svc_address: host:port for bootstrap.servers.
svc_address() { echo "127.0.0.1:$BROKER_PORT"; }

# svc_verb_proxy: the `proxy` verb: where the broker's proxy listens and what it forwards to.
# A broker still running on a configuration without the PROXIED listener would be unreachable
# through the proxy: that needs a restart first.
svc_verb_proxy() {
    load_state
    if svc_pid >/dev/null && ! grep -q "^listeners=.*PROXIED://127.0.0.1:$PROXIED_PORT" "$PROPS"; then
        die "the running broker was started without a listener for its proxy; restart it on the
    same data (services/kafka.sh stop-broker && services/kafka.sh start-broker), or start afresh
    (services/services.sh down && services/services.sh up)"
    fi
    echo "127.0.0.1:$PROXY_PORT 127.0.0.1:$PROXIED_PORT"
}

# svc_verb_secured: the `secured` verb: the SASL_SSL listener and its super user.
svc_verb_secured() {
    load_state
    [[ -s $ADMIN_PASSWORD_FILE ]] || die "no admin password yet in $STATE: run '$0 up' first"
    echo "export TWOPHASE_KAFKA_SASL_BOOTSTRAP=127.0.0.1:$SASL_PORT"
    echo "export TWOPHASE_KAFKA_ADMIN_USER=$ADMIN_USER"
    echo "export TWOPHASE_KAFKA_ADMIN_PASSWORD=$(<"$ADMIN_PASSWORD_FILE")"
}

service_main "$@"
