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
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase).
#
# As root the server runs with --user=root: the data directory lives under the cache (usually
# in /root, which the `mysql` OS user cannot enter), and mariadbd refuses to run as root unless
# told so explicitly. Otherwise it runs as you. The server reads no option files
# (--no-defaults), so a system server's /etc/mysql settings, port 3306 and its socket in
# /run/mysqld are never involved: ours listens on a free loopback port and keeps its socket in
# its private state directory.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=mariadb
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE=$RUN_DIR/mariadb
DB_USER=$TWOPHASE_MARIADB_USER
DB_PASSWORD=$TWOPHASE_MARIADB_PASSWORD
DB_DATABASE=$TWOPHASE_MARIADB_DATABASE

find_bin() {
    command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null && command -v mariadb >/dev/null
}

require_bin() {
    find_bin && return 0
    if [[ $EUID -ne 0 ]]; then
        die "MariaDB server binaries (mariadbd, mariadb-install-db) not found. Install the server, e.g.
    sudo apt-get install mariadb-server    (Debian/Ubuntu)
    sudo dnf install mariadb-server        (Fedora/RHEL)
    brew install mariadb                   (macOS)
or use docker-compose.yml."
    fi
    log "MariaDB server not found: installing Debian's mariadb-server package"
    apt_install mariadb-server mariadb-client
    find_bin || die "mariadb-server was installed but mariadbd is still not found"
}

SOCKET=$STATE/mysqld.sock

load_port() {
    [[ -f $STATE/port ]] || die "no server state in $STATE: run '$0 up' first"
    PORT=$(<"$STATE/port")
}

url() {
    load_port
    echo "mysql+pymysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$PORT/$DB_DATABASE"
}

server_pid() {
    local pid
    [[ -f $STATE/mysqld.pid ]] || return 1
    pid=$(<"$STATE/mysqld.pid")
    pid_matches "$pid" "$STATE/data" || return 1
    echo "$pid"
}

is_running() { server_pid >/dev/null; }

# mariadb as the server's root over the private Unix socket (unix_socket authentication).
sql_admin() {
    mariadb --no-defaults --protocol=socket --socket="$SOCKET" -uroot "$@"
}

run_as=()
[[ $EUID -ne 0 ]] || run_as=(--user=root)

start_server() {
    load_port
    # innodb_flush_log_at_trx_commit=1 (the default, said here because the design relies on
    # it): an XA PREPARE is durable when it returns, so a prepared transaction survives a kill
    # of the server. --skip-log-bin: no binary log, so InnoDB alone decides what a prepared
    # transaction becomes after a crash (it stays prepared, listed by XA RECOVER).
    setsid mariadbd --no-defaults "${run_as[@]}" \
        --datadir="$STATE/data" --port="$PORT" --bind-address=127.0.0.1 \
        --socket="$SOCKET" --pid-file="$STATE/mysqld.pid" --log-error="$STATE/server.log" \
        --skip-name-resolve --skip-log-bin --max-connections="$TWOPHASE_MARIADB_MAX_CONNECTIONS" \
        --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=1 \
        --innodb-lock-wait-timeout=30 --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_bin --default-time-zone=+00:00 \
        </dev/null >>"$STATE/server.log" 2>&1 &
    local deadline=$((SECONDS + 60))
    until sql_admin -e "SELECT 1" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "the server did not start; last lines of $STATE/server.log:"
            tail -n 30 "$STATE/server.log" >&2 || true
            die "MariaDB did not start"
        fi
        sleep 0.3
    done
    log "server started: 127.0.0.1:$PORT (MariaDB $(mariadbd --version | awk '{print $3}'), log: $STATE/server.log)"
}

# The `twophase` user: all privileges on its database, the right to list prepared XA
# transactions of others (XA RECOVER; MariaDB >= 10.5 checks the SUPER-family privilege for
# other users' xids, MySQL 8 needs XA_RECOVER_ADMIN), and CREATE USER so the secret tests can
# make a user of their own with a recognisable password.
ensure_user() {
    sql_admin <<EOF
CREATE DATABASE IF NOT EXISTS \`$DB_DATABASE\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'localhost' WITH GRANT OPTION;
EOF
}

init_server() {
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    read -r PORT < <(free_ports 1)
    echo "$PORT" >"$STATE/port"
    mariadb-install-db --no-defaults "${run_as[@]}" --datadir="$STATE/data" \
        --auth-root-authentication-method=socket --skip-test-db >"$STATE/install-db.log" 2>&1 || {
        cat "$STATE/install-db.log" >&2
        die "mariadb-install-db failed"
    }
    start_server
    ensure_user
    touch "$STATE/.initialized"
}

check_login() {
    mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$PORT" -u"$DB_USER" -p"$DB_PASSWORD" \
        "$DB_DATABASE" -e "XA RECOVER" >/dev/null ||
        die "cannot log in as $DB_USER at 127.0.0.1:$PORT"
    log "ready: $(url)"
}

stop_server() {
    local pid
    pid=$(server_pid) || return 0
    log "stopping the server"
    kill -TERM "$pid"
    wait_gone "$pid" 60 || die "mariadbd $pid did not stop within 60 s"
}

kill_server() {
    local pid
    pid=$(server_pid) || return 0
    log "killing the server (SIGKILL)"
    kill -KILL "$pid"
    wait_gone "$pid" 30 || die "mariadbd $pid did not exit after SIGKILL"
}

cmd_up() {
    require_bin
    if is_running; then
        load_port
        log "already running"
        check_login
        return 0
    fi
    if [[ -f $STATE/.initialized ]]; then
        load_port
        if port_is_free "$PORT"; then
            log "resuming the stopped server in $STATE"
            start_server
            ensure_user
            check_login
            return 0
        fi
        log "port $PORT of the old server state is taken; starting from scratch"
    fi
    rm -rf "$STATE"
    init_server
    check_login
}

cmd_down() {
    stop_server
    rm -rf "$STATE"
    log "down"
}

cmd_status() {
    if is_running; then
        load_port
        echo "mariadb: running, $(url), state $STATE"
    elif [[ -f $STATE/.initialized ]]; then
        load_port
        echo "mariadb: stopped (state kept in $STATE, port was $PORT)"
        return 3
    else
        echo "mariadb: not running"
        return 3
    fi
}

cmd_start_server() {
    [[ -f $STATE/.initialized ]] || die "no server state in $STATE: run '$0 up' first"
    require_bin
    if is_running; then
        log "already running"
        return 0
    fi
    start_server
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
url) url ;;
stop-server) stop_server ;;
kill-server) kill_server ;;
start-server) cmd_start_server ;;
*)
    echo "usage: $0 up|down|status|url|stop-server|kill-server|start-server" >&2
    exit 2
    ;;
esac
