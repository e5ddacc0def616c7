#!/usr/bin/env bash
# Kafka, PostgreSQL, MariaDB, S3 (versitygw) and a schema registry (Apicurio) together, for the
# integration tests and the demo, and a Toxiproxy with one proxy in front of each of the first
# four (`postgres`, `kafka`, `mariadb`, `s3`).
#
#   services/services.sh up      start all six (harmless when they already run), make or update
#                                the proxies and write .services.env at the repo root
#   services/services.sh down    stop all six, delete their state and .services.env
#   services/services.sh status  exit 0 when all six are running
#
# .services.env has each server's own address, which never goes through a proxy, and
# TWOPHASE_TOXIPROXY_URL, the proxies' API (integration_tests/toxiproxy.py): a client that
# wants its network disturbed connects to a proxy's listen address instead. Kafka's proxy
# forwards to a listener of its own that advertises the proxy (services/kafka.sh proxy).
#
# .services.env can be sourced by sh/bash (`set -a; . ./.services.env; set +a`) and included
# by make; integration_tests/conftest.py reads it when the variables are not in the environment.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=services
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Set n > 1 (TWOPHASE_SERVICES_SET, lib.sh) writes .services-<n>.env instead.
if [[ $SERVICES_SET == 1 ]]; then ENV_FILE=$REPO_ROOT/.services.env; else ENV_FILE=$REPO_ROOT/.services-$SERVICES_SET.env; fi

# host_port URL: the host:port of a URL (scheme, user, password and path dropped).
host_port() {
    local rest=${1#*://}
    rest=${rest##*@}
    echo "${rest%%/*}"
}

# make_proxies: one proxy per server, made or updated (services/toxiproxy.sh proxy). Kafka's
# first: its listen port is fixed by the broker's configuration, the others take free ports.
make_proxies() {
    local listen upstream
    read -r listen upstream < <("$SERVICES_DIR/kafka.sh" proxy)
    [[ -n $upstream ]] || die "services/kafka.sh proxy printed nothing"
    "$SERVICES_DIR/toxiproxy.sh" proxy kafka "$upstream" "$listen" >/dev/null
    "$SERVICES_DIR/toxiproxy.sh" proxy postgres "$(host_port "$1")" >/dev/null
    "$SERVICES_DIR/toxiproxy.sh" proxy mariadb "$(host_port "$2")" >/dev/null
    "$SERVICES_DIR/toxiproxy.sh" proxy s3 "$(host_port "$3")" >/dev/null
}

# secured_env: the `export NAME=value` lines of the secured listeners. A server script with one
# has a `secured` verb that prints its lines (addresses, and the super user's name and password,
# made at its first start); the CA they all trust is TWOPHASE_TLS_CA_FILE.
secured_env() {
    local script
    echo "export TWOPHASE_TLS_CA_FILE=$TLS_DIR/ca.pem"
    for script in kafka postgres mariadb s3 registry; do
        if grep -q '^svc_verb_secured()' "$SERVICES_DIR/$script.sh"; then
            "$SERVICES_DIR/$script.sh" secured || die "services/$script.sh secured failed"
        fi
    done
}

cmd_up() {
    local bootstrap pg_url mariadb_url s3_endpoint secured
    tls_ensure
    "$SERVICES_DIR/postgres.sh" up
    "$SERVICES_DIR/kafka.sh" up
    "$SERVICES_DIR/mariadb.sh" up
    "$SERVICES_DIR/s3.sh" up
    "$SERVICES_DIR/registry.sh" up
    "$SERVICES_DIR/toxiproxy.sh" up
    pg_url=$("$SERVICES_DIR/postgres.sh" url)
    bootstrap=$("$SERVICES_DIR/kafka.sh" bootstrap)
    mariadb_url=$("$SERVICES_DIR/mariadb.sh" url)
    s3_endpoint=$("$SERVICES_DIR/s3.sh" endpoint)
    make_proxies "$pg_url" "$mariadb_url" "$s3_endpoint"
    secured=$(secured_env)
    # Write to a temporary file and rename, so a reader never sees half a file.
    cat >"$ENV_FILE.tmp" <<EOF
# Written by services/services.sh up; removed by services/services.sh down.
export TWOPHASE_PG_URL=$pg_url
export TWOPHASE_KAFKA_BOOTSTRAP=$bootstrap
export TWOPHASE_CACHE=$CACHE
export TWOPHASE_SERVICES_SET=$SERVICES_SET
export TWOPHASE_MARIADB_URL=$mariadb_url
export TWOPHASE_S3_ENDPOINT=$s3_endpoint
export TWOPHASE_S3_ACCESS_KEY=${TWOPHASE_S3_ACCESS_KEY:-$TWOPHASE_DEFAULT_S3_ACCESS_KEY}
export TWOPHASE_S3_SECRET_KEY=${TWOPHASE_S3_SECRET_KEY:-$TWOPHASE_DEFAULT_S3_SECRET_KEY}
export TWOPHASE_S3_BUCKET=${TWOPHASE_S3_BUCKET:-$TWOPHASE_DEFAULT_S3_BUCKET}
export TWOPHASE_TOXIPROXY_URL=$("$SERVICES_DIR/toxiproxy.sh" url)
export TWOPHASE_SCHEMA_REGISTRY_URL=$("$SERVICES_DIR/registry.sh" url)
$secured
EOF
    mv "$ENV_FILE.tmp" "$ENV_FILE"
    log "wrote $ENV_FILE"
    # The secured listeners' lines carry passwords made at start: their names only.
    grep -v -F -x -e "$secured" "$ENV_FILE" | sed -n 's/^export //p'
    sed -n 's/^export \([A-Z0-9_]*\)=.*/\1=(in the file)/p' <<<"$secured"
}

cmd_down() {
    # Stop every server even when one of them fails to stop.
    local rc=0
    "$SERVICES_DIR/toxiproxy.sh" down || rc=$?
    "$SERVICES_DIR/kafka.sh" down || rc=$?
    "$SERVICES_DIR/mariadb.sh" down || rc=$?
    "$SERVICES_DIR/s3.sh" down || rc=$?
    "$SERVICES_DIR/registry.sh" down || rc=$?
    "$SERVICES_DIR/postgres.sh" down || rc=$?
    tls_remove
    rm -f "$ENV_FILE"
    return "$rc"
}

cmd_status() {
    local rc=0
    "$SERVICES_DIR/postgres.sh" status || rc=$?
    "$SERVICES_DIR/kafka.sh" status || rc=$?
    "$SERVICES_DIR/mariadb.sh" status || rc=$?
    "$SERVICES_DIR/s3.sh" status || rc=$?
    "$SERVICES_DIR/registry.sh" status || rc=$?
    "$SERVICES_DIR/toxiproxy.sh" status || rc=$?
    return "$rc"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
*)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
