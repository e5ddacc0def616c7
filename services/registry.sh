#!/usr/bin/env bash
# A schema registry on 127.0.0.1 (Apicurio Registry, stored in an H2 file) that speaks the
# Confluent Schema Registry REST API at /apis/ccompat/v7, for the Kafka sink's and source's
# Avro, JSON Schema and Protobuf formats. Needs Java 17+ and Maven (first run only, to fetch the
# registry's distribution from Maven Central by its coordinates).
#
#   services/registry.sh up            start a registry on a free port (its schemas and ids are
#                                      kept in the state directory across restarts and kills)
#   services/registry.sh down          stop it and delete its state
#   services/registry.sh status        exit 0 when it is running
#   services/registry.sh url           print the Confluent-compatible API's base URL
#   services/registry.sh stop-server   SIGTERM the registry; the port is kept
#   services/registry.sh kill-server   SIGKILL the registry (crash-like); the port is kept
#   services/registry.sh start-server  start the stopped registry again, same port
#   services/registry.sh secured       print the basic-auth registry's URL, user and password
#                                      as `export NAME=value` lines
#
# Beside it, a second registry process requires HTTP basic auth on every API path: Apicurio's own
# authentication needs an OIDC server, but the Quarkus it runs on checks basic credentials against
# users given in its configuration (its embedded realm, which Apicurio's build turns on). That
# registry keeps its schemas in memory (no test relies on them across a restart); its password is
# made at the first start and kept in the state directory, readable by its owner only. stop, kill
# and start act on both processes; freeze and thaw on the first.
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), JAVA_HOME. Version and heap:
# services/settings.env. Why Apicurio: Confluent's own registry is not on Maven Central, and
# Karapace is not on PyPI; docs/kafka.md says more. The life of the server (up, down, status,
# the verbs above) is services/lib.sh's; this file says how the registry does each step.
set -euo pipefail
SERVICE=registry
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE="Apicurio Registry"
NOUN=server
ADDRESS_VERB=url
STATE=$RUN_DIR/registry
MARKER=port # the state is complete once its port is chosen
SERVER_LOG=$STATE/server.log
AUTH_LOG=$STATE/auth-server.log
EXTRA_VERBS=secured
AUTH_USER=twophase
READY_TIMEOUT=${TWOPHASE_REGISTRY_READY_TIMEOUT:-90}
READY_INTERVAL=0.5

VERSION=$TWOPHASE_APICURIO_VERSION
HOME_DIR=$CACHE/apicurio-registry-$VERSION
JAR=$HOME_DIR/apicurio-registry-app-$VERSION-runner.jar
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

# svc_install: the distribution (a runner jar and its lib/), fetched by Maven once and cached.
svc_install() {
    [[ -f $JAR ]] && return 0
    command -v "$JAVA" >/dev/null || die "java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)"
    command -v mvn >/dev/null ||
        install_or_die "mvn not found: Maven is needed once to fetch the registry (Debian: sudo apt-get install maven)" maven
    log "fetching Apicurio Registry $VERSION from Maven Central into $HOME_DIR (first run only)"
    local tmp=$HOME_DIR.partial
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! mvn -q -B dependency:copy -Dartifact="io.apicurio:apicurio-registry-app:$VERSION:zip:all" \
        -DoutputDirectory="$tmp" >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "could not fetch Apicurio Registry $VERSION with Maven (is Maven Central reachable?)"
    fi
    # The archive holds the runner jar and lib/ (maybe under one top directory): keep those.
    "$PYTHON" - "$tmp" "$VERSION" <<'EOP' || die "could not unpack Apicurio Registry $VERSION"
import pathlib, shutil, sys, zipfile
tmp, version = pathlib.Path(sys.argv[1]), sys.argv[2]
archive = next(tmp.glob("*.zip"))
with zipfile.ZipFile(archive) as z:
    z.extractall(tmp / "unpacked")
runner = next((tmp / "unpacked").rglob(f"apicurio-registry-app-{version}-runner.jar"))
out = tmp / "app"
out.mkdir()
shutil.move(str(runner), out / runner.name)
shutil.move(str(runner.parent / "lib"), out / "lib")
EOP
    rm -rf "$HOME_DIR"
    mv "$tmp/app" "$HOME_DIR"
    rm -rf "$tmp"
}

# svc_create: a free port, and the basic-auth registry's port and password.
svc_create() {
    new_port
    new_auth_state
}

# new_auth_state: the basic-auth registry's port (other than PORT) and a new password.
new_auth_state() {
    local port
    for port in $(free_ports 2); do
        [[ $port == "$PORT" ]] || break
    done
    AUTH_PORT=$port
    echo "$AUTH_PORT" >"$STATE/auth-port"
    (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(18))' >"$STATE/auth-password")
}

# svc_load, svc_ports: the state keeps its ports in $STATE/port and $STATE/auth-port (a state
# made before the basic-auth registry gets its port and password when it is resumed).
svc_load() {
    load_port
    if [[ -f $STATE/auth-port && -f $STATE/auth-password ]]; then
        AUTH_PORT=$(<"$STATE/auth-port")
    else
        new_auth_state
    fi
}
svc_ports() { echo "$PORT $AUTH_PORT"; }

# svc_launch: the registry on the state's port, bound to 127.0.0.1, its storage an H2 database
# file in the state (Apicurio's default is in memory: a restart would forget every schema and
# number ids from 1 again, so records already written would name other schemas).
svc_launch() {
    auth_launch
    # shellcheck disable=SC2086 # the heap options are several words
    start_background "$SERVER_LOG" "$STATE/pid" "$JAVA" $TWOPHASE_APICURIO_HEAP_OPTS \
        -Dtwophase.state="$STATE" \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$PORT" \
        -Dquarkus.log.level=WARN -Dquarkus.log.category.\"io.apicurio\".level=WARN \
        -Dapicurio.datasource.url="jdbc:h2:file:$STATE/data/registry;DB_CLOSE_ON_EXIT=FALSE;WRITE_DELAY=0" \
        -jar "$JAR"
    log "Apicurio Registry $VERSION starting on 127.0.0.1:$PORT (pid $STARTED_PID)"
}

# auth_launch: the basic-auth registry, unless it runs: Apicurio's own settings, and Quarkus's
# basic auth over its embedded users on every path under /apis.
auth_launch() {
    pid_from_file "$STATE/auth-pid" "-Dtwophase.auth-state=$STATE" >/dev/null && return 0
    # The password reaches the JVM through a file only it reads, not its command line.
    (umask 077 && printf 'quarkus.security.users.embedded.users.%s=%s\n' "$AUTH_USER" \
        "$(<"$STATE/auth-password")" >"$STATE/auth.properties")
    # shellcheck disable=SC2086 # the heap options are several words
    start_background "$AUTH_LOG" "$STATE/auth-pid" "$JAVA" $TWOPHASE_APICURIO_HEAP_OPTS \
        -Dtwophase.auth-state="$STATE" \
        -Dquarkus.config.locations="$STATE/auth.properties" \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$AUTH_PORT" \
        -Dquarkus.log.level=WARN -Dquarkus.log.category.\"io.apicurio\".level=WARN \
        -Dquarkus.http.auth.basic=true -Dquarkus.security.users.embedded.plain-text=true \
        -Dquarkus.security.users.embedded.roles."$AUTH_USER"=sr-admin \
        -Dquarkus.http.auth.permission.api.paths='/apis/*' \
        -Dquarkus.http.auth.permission.api.policy=authenticated \
        -jar "$JAR"
    log "the basic-auth registry starting on 127.0.0.1:$AUTH_PORT (pid $STARTED_PID)"
}

# svc_ready: the Confluent-compatible API lists the subjects.
svc_ready() {
    "$PYTHON" - "$(svc_address)" <<'EOP' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/subjects", timeout=2) as reply:
    sys.exit(0 if reply.status == 200 else 1)
EOP
}

# auth_ready: the basic-auth registry lists the subjects to its user.
auth_ready() {
    "$PYTHON" - "$(auth_address)" "$AUTH_USER" "$STATE/auth-password" <<'EOP' 2>/dev/null
import base64, sys, urllib.request
secured, user, passwordFile = sys.argv[1:4]
password = open(passwordFile).read().strip()
token = base64.b64encode(f"{user}:{password}".encode()).decode()
request = urllib.request.Request(secured + "/subjects", headers={"Authorization": f"Basic {token}"})
with urllib.request.urlopen(request, timeout=2) as reply:
    sys.exit(0 if reply.status == 200 else 1)
EOP
}

# svc_setup: the basic-auth registry running and answering (started here also when the first
# one was already running); subjects are made by the clients that register schemas.
svc_setup() {
    local deadline=$((SECONDS + READY_TIMEOUT))
    auth_launch
    until auth_ready; do
        ((SECONDS < deadline)) || die "the basic-auth registry was not ready within ${READY_TIMEOUT}s (see $AUTH_LOG)"
        sleep "$READY_INTERVAL"
    done
}

# svc_pid: the pid file's process, if it is still this state's registry.
svc_pid() { pid_from_file "$STATE/pid" "-Dtwophase.state=$STATE"; }

# svc_stop MODE PID: SIGTERM, or SIGKILL for a crash; the basic-auth registry too.
svc_stop() {
    local auth_pid
    if auth_pid=$(pid_from_file "$STATE/auth-pid" "-Dtwophase.auth-state=$STATE"); then
        stop_pid "$1" "$auth_pid"
    fi
    stop_pid "$@"
}

# svc_address: the base URL of the Confluent-compatible API.
svc_address() { echo "http://127.0.0.1:$PORT/apis/ccompat/v7"; }

# auth_address: the same API's URL on the basic-auth registry.
auth_address() { echo "http://127.0.0.1:$AUTH_PORT/apis/ccompat/v7"; }

# svc_verb_secured: what services/services.sh writes into .services.env for the basic-auth
# registry: its URL, its user and the password made at its first start.
svc_verb_secured() {
    load_state
    echo "export TWOPHASE_SCHEMA_REGISTRY_AUTH_URL=$(auth_address)"
    echo "export TWOPHASE_SCHEMA_REGISTRY_AUTH_USER=$AUTH_USER"
    echo "export TWOPHASE_SCHEMA_REGISTRY_AUTH_PASSWORD=$(<"$STATE/auth-password")"
}

service_main "$@"
