#!/bin/bash
# First start: initdb (superuser `postgres`, reached only over the container's socket), then
# POSTGRES_USER as services/postgres.sh makes it (LOGIN CREATEROLE, not a superuser) owning
# POSTGRES_DB, password authentication from any address. Then the server in the foreground as
# `postgres`, with the command's settings.
set -euo pipefail
: "${POSTGRES_USER:?POSTGRES_USER is required}" "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
DB=${POSTGRES_DB:-$POSTGRES_USER}
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [[ ! -s $PGDATA/PG_VERSION ]]; then
    gosu postgres initdb -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    # The password goes in on standard input, never on a command line.
    gosu postgres postgres --single -D "$PGDATA" postgres >/dev/null <<EOSQL
CREATE ROLE "$POSTGRES_USER" LOGIN CREATEROLE PASSWORD '${POSTGRES_PASSWORD//\'/\'\'}';
CREATE DATABASE "$DB" OWNER "$POSTGRES_USER";
EOSQL
fi
if [[ ${1:-} == postgres ]]; then
    shift
    exec gosu postgres postgres -D "$PGDATA" "$@"
fi
exec "$@"
