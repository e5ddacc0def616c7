#!/usr/bin/env bash
# A private MariaDB server on 127.0.0.1 with XA transactions (InnoDB), for the twophase.sql
# integration tests, chaos pipeline and bench. It uses the OS packages' server (Debian 12:
# MariaDB 10.11) and installs it with apt-get when it is missing and we are root.
#
#   services/mariadb.sh up            start a server on a free port (reuses a stopped one's data)
#   services/mariadb.sh down          stop it and delete its data
#   services/mariadb.sh status        exit 0 when it is running
#   services/mariadb.sh url           print the SQLAlchemy URL of the `twophase` user
#   services/mariadb.sh stop-server   clean shutdown; data and port are kept
#   services/mariadb.sh kill-server   SIGKILL (crash-like); data and port are kept
#   services/mariadb.sh start-server  start the stopped server again, same data and port
#   services/mariadb.sh secured       print `export TWOPHASE_MARIADB_TLS_URL=...`: the TLS user's URL
#
# The server takes TLS (the set's certificate from services/lib.sh's tls_ensure) beside plain
# connections. The user `twophase_tls` (no global privilege but CREATE USER; all privileges on
# the database, with GRANT OPTION, to make the tests' least-privileged users) must use TLS
# (REQUIRE SSL); its password is made at its first start in $STATE/tls-user.password, mode 600.
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase).
#
# As root the server runs with --user=root: the data directory lives under the cache (usually
# in /root, which the `mysql` OS user cannot enter), and mariadbd refuses to run as root unless
# told so explicitly. Otherwise it runs as you. The server reads no option files
# (--no-defaults), so a system server's /etc/mysql settings, port 3306 and its socket in
# /run/mysqld are never involved: ours listens on a free loopback port and keeps its socket in
# its private state directory. The life of the server (up, down, status, the verbs above) is
# services/lib.sh's; this file says how MariaDB does each step.
set -euo pipefail
SERVICE=mariadb
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE=MariaDB
NOUN=server
ADDRESS_VERB=url
STATE=$RUN_DIR/mariadb
MARKER=.initialized
SERVER_LOG=$STATE/server.log
READY_TIMEOUT=60
READY_INTERVAL=0.3
EXTRA_VERBS=secured

DB_USER=$TWOPHASE_MARIADB_USER
DB_PASSWORD=$TWOPHASE_MARIADB_PASSWORD
DB_DATABASE=$TWOPHASE_MARIADB_DATABASE
SOCKET=$STATE/mysqld.sock
TLS_USER=twophase_tls
TLS_PASSWORD_FILE=$STATE/tls-user.password
run_as=()
[[ $EUID -ne 0 ]] || run_as=(--user=root)

# find_bin: true when the server, its installer and the client are on PATH.
find_bin() {
    command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null && command -v mariadb >/dev/null
}

# svc_install: Debian's mariadb-server and mariadb-client when the server is not found.
svc_install() {
    find_bin && return 0
    install_or_die "MariaDB server binaries (mariadbd, mariadb-install-db) not found. Install the server, e.g.
    sudo apt-get install mariadb-server    (Debian/Ubuntu)
    sudo dnf install mariadb-server        (Fedora/RHEL)
    brew install mariadb                   (macOS)
or use docker-compose.yml." mariadb-server mariadb-client
    find_bin || die "mariadb-server was installed but mariadbd is still not found"
}

# sql_admin ARGS...: mariadb as the server's root over the private Unix socket (unix_socket
# authentication).
sql_admin() {
    mariadb --no-defaults --protocol=socket --socket="$SOCKET" -uroot "$@"
}

# svc_create: a free port and a new data directory.
svc_create() {
    new_port
    mariadb-install-db --no-defaults "${run_as[@]}" --datadir="$STATE/data" \
        --auth-root-authentication-method=socket --skip-test-db >"$STATE/install-db.log" 2>&1 || {
        cat "$STATE/install-db.log" >&2
        die "mariadb-install-db failed"
    }
}

# svc_load, svc_ports: the state keeps its port in $STATE/port.
svc_load() { load_port; }
svc_ports() { echo "$PORT"; }

# svc_launch: mariadbd on the state's data and port; it writes its own pid file.
svc_launch() {
    # innodb_flush_log_at_trx_commit=1 (the default, said here because the design relies on
    # it): an XA PREPARE is durable when it returns, so a prepared transaction survives a kill
    # of the server. --skip-log-bin: no binary log, so InnoDB alone decides what a prepared
    # transaction becomes after a crash (it stays prepared, listed by XA RECOVER).
    # TLS: the set's certificate, copied into the state (a resumed state gets it too).
    tls_ensure
    mkdir -p "$STATE/tls"
    chmod 700 "$STATE/tls"
    cp "$TLS_DIR/server.pem" "$TLS_DIR/server.key" "$TLS_DIR/ca.pem" "$STATE/tls/"
    chmod 600 "$STATE/tls/server.key"
    start_background "$SERVER_LOG" "" mariadbd --no-defaults "${run_as[@]}" \
        --datadir="$STATE/data" --port="$PORT" --bind-address=127.0.0.1 \
        --socket="$SOCKET" --pid-file="$STATE/mysqld.pid" --log-error="$SERVER_LOG" \
        --skip-name-resolve --skip-log-bin --max-connections="$TWOPHASE_MARIADB_MAX_CONNECTIONS" \
        --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=1 \
        --innodb-lock-wait-timeout=30 --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_bin --default-time-zone=+00:00 \
        --ssl-cert="$STATE/tls/server.pem" --ssl-key="$STATE/tls/server.key" --ssl-ca="$STATE/tls/ca.pem"
    log "starting MariaDB $(mariadbd --version | awk '{print $3}') on 127.0.0.1:$PORT (log: $SERVER_LOG)"
}

# svc_ready: root gets an answer over the Unix socket.
svc_ready() { sql_admin -e "SELECT 1" >/dev/null 2>&1; }

# svc_setup: the `twophase` user: all privileges, with GRANT OPTION (the secret tests make a
# user of their own with a recognisable password). Then it logs in over TCP. Then the TLS user
# (tls_user). A server started by an older version of this script, without TLS, is restarted.
svc_setup() {
    if [[ $(sql_admin -N -e "SELECT @@have_ssl") != YES ]]; then
        log "the running server has no TLS: restarting it with the set's certificate"
        stop_server graceful
        start_server
    fi
    sql_admin <<EOS
CREATE DATABASE IF NOT EXISTS \`$DB_DATABASE\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'localhost' WITH GRANT OPTION;
EOS
    mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$PORT" -u"$DB_USER" -p"$DB_PASSWORD" \
        "$DB_DATABASE" -e "XA RECOVER" >/dev/null ||
        die "cannot log in as $DB_USER at 127.0.0.1:$PORT"
    tls_user
}

# tls_user: the ordinary user of the TLS URL, with a password made at its first start (kept in
# the state, mode 600); it logs in over TLS, verifying the server's certificate.
tls_user() {
    local password host
    if [[ ! -s $TLS_PASSWORD_FILE ]]; then
        (umask 077 && openssl rand -hex 16 >"$TLS_PASSWORD_FILE")
    fi
    chmod 600 "$TLS_PASSWORD_FILE"
    password=$(<"$TLS_PASSWORD_FILE")
    for host in 127.0.0.1 localhost; do
        sql_admin <<EOS
CREATE USER IF NOT EXISTS '$TLS_USER'@'$host';
ALTER USER '$TLS_USER'@'$host' IDENTIFIED BY '$password' REQUIRE SSL;
GRANT CREATE USER ON *.* TO '$TLS_USER'@'$host';
GRANT ALL PRIVILEGES ON \`$DB_DATABASE\`.* TO '$TLS_USER'@'$host' WITH GRANT OPTION;
EOS
    done
    mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$PORT" -u"$TLS_USER" -p"$password" \
        --ssl-ca="$TLS_DIR/ca.pem" --ssl-verify-server-cert "$DB_DATABASE" -e "SELECT 1" >/dev/null ||
        die "cannot log in as $TLS_USER over TLS at 127.0.0.1:$PORT"
}

# svc_verb_secured: the `secured` verb: the TLS user's SQLAlchemy URL, verifying the server.
svc_verb_secured() {
    load_state
    [[ -s $TLS_PASSWORD_FILE ]] || die "no TLS user yet in $STATE: run '$0 up' first"
    echo "export TWOPHASE_MARIADB_TLS_URL='mysql+pymysql://$TLS_USER:$(<"$TLS_PASSWORD_FILE")@127.0.0.1:$PORT/$DB_DATABASE?ssl_ca=$TLS_DIR/ca.pem'"
}

# svc_pid: the pid mariadbd wrote, if it is still a mariadbd on this state's data.
svc_pid() { pid_from_file "$STATE/mysqld.pid" "$STATE/data"; }

# svc_stop MODE PID: SIGTERM is a clean shutdown, SIGKILL a crash.
svc_stop() { stop_pid "$@"; }

# svc_address: the `twophase` user's SQLAlchemy URL.
svc_address() { echo "mysql+pymysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$PORT/$DB_DATABASE"; }

service_main "$@"
