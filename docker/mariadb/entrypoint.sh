#!/bin/bash
# First start: the system tables, the user with its password and database, then the init
# scripts; the server in the foreground as `mysql` with the given options after that.
set -euo pipefail
: "${MARIADB_USER:?MARIADB_USER is required}" "${MARIADB_PASSWORD:?MARIADB_PASSWORD is required}"
DATA=/var/lib/mysql
SERVER=(mariadbd --user=mysql --datadir="$DATA" --skip-name-resolve --character-set-server=utf8mb4
    --collation-server=utf8mb4_bin)
chown -R mysql:mysql "$DATA"
if [[ ! -d $DATA/mysql ]]; then
    mariadb-install-db --user=mysql --datadir="$DATA" --auth-root-authentication-method=socket \
        --skip-test-db >/dev/null
    "${SERVER[@]}" --skip-networking --socket=/run/mysqld/init.sock &
    pid=$!
    for _ in $(seq 60); do
        mariadb -uroot --socket=/run/mysqld/init.sock -e "SELECT 1" >/dev/null 2>&1 && break
        sleep 1
    done
    sql() { mariadb -uroot --socket=/run/mysqld/init.sock "$@"; }
    # The password is given on standard input, never on a command line.
    sql <<EOSQL
CREATE USER '${MARIADB_USER}'@'%' IDENTIFIED BY '${MARIADB_PASSWORD//\'/\'\'}';
CREATE DATABASE IF NOT EXISTS \`${MARIADB_DATABASE:-$MARIADB_USER}\`;
GRANT ALL PRIVILEGES ON \`${MARIADB_DATABASE:-$MARIADB_USER}\`.* TO '${MARIADB_USER}'@'%';
EOSQL
    for script in /docker-entrypoint-initdb.d/*.sql; do
        [[ -f $script ]] && sql <"$script"
    done
    kill "$pid"
    wait "$pid" || true
fi
exec "${SERVER[@]}" --bind-address=0.0.0.0 "$@"
