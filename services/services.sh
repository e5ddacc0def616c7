#!/usr/bin/env bash
# Kafka, PostgreSQL, MariaDB and S3 (versitygw) together, for the integration tests and the demo.
#
#   services/services.sh up      start all four (harmless when they already run) and write
#                                .services.env at the repo root
#   services/services.sh down    stop all four, delete their state and .services.env
#   services/services.sh status  exit 0 when all four are running
#
# .services.env can be sourced by sh/bash (`set -a; . ./.services.env; set +a`) and included
# by make; integration_tests/conftest.py reads it when the variables are not in the environment.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=services
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ENV_FILE=$REPO_ROOT/.services.env

cmd_up() {
    local bootstrap pg_url
    "$SERVICES_DIR/postgres.sh" up
    "$SERVICES_DIR/kafka.sh" up
    "$SERVICES_DIR/mariadb.sh" up
    "$SERVICES_DIR/s3.sh" up
    pg_url=$("$SERVICES_DIR/postgres.sh" url)
    bootstrap=$("$SERVICES_DIR/kafka.sh" bootstrap)
    # Write to a temporary file and rename, so a reader never sees half a file.
    cat >"$ENV_FILE.tmp" <<EOF
# Written by services/services.sh up; removed by services/services.sh down.
export TWOPHASE_PG_URL=$pg_url
export TWOPHASE_KAFKA_BOOTSTRAP=$bootstrap
export TWOPHASE_CACHE=$CACHE
export TWOPHASE_MARIADB_URL=$("$SERVICES_DIR/mariadb.sh" url)
export TWOPHASE_S3_ENDPOINT=$("$SERVICES_DIR/s3.sh" endpoint)
export TWOPHASE_S3_ACCESS_KEY=${TWOPHASE_S3_ACCESS_KEY:-$TWOPHASE_DEFAULT_S3_ACCESS_KEY}
export TWOPHASE_S3_SECRET_KEY=${TWOPHASE_S3_SECRET_KEY:-$TWOPHASE_DEFAULT_S3_SECRET_KEY}
export TWOPHASE_S3_BUCKET=${TWOPHASE_S3_BUCKET:-$TWOPHASE_DEFAULT_S3_BUCKET}
EOF
    mv "$ENV_FILE.tmp" "$ENV_FILE"
    log "wrote $ENV_FILE"
    sed -n 's/^export //p' "$ENV_FILE"
}

cmd_down() {
    # Stop every server even when one of them fails to stop.
    local rc=0
    "$SERVICES_DIR/kafka.sh" down || rc=$?
    "$SERVICES_DIR/mariadb.sh" down || rc=$?
    "$SERVICES_DIR/s3.sh" down || rc=$?
    "$SERVICES_DIR/postgres.sh" down || rc=$?
    rm -f "$ENV_FILE"
    return "$rc"
}

cmd_status() {
    local rc=0
    "$SERVICES_DIR/postgres.sh" status || rc=$?
    "$SERVICES_DIR/kafka.sh" status || rc=$?
    "$SERVICES_DIR/mariadb.sh" status || rc=$?
    "$SERVICES_DIR/s3.sh" status || rc=$?
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
