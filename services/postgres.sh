#!/usr/bin/env bash
# A private PostgreSQL server on 127.0.0.1 with two-phase commit enabled
# (max_prepared_transactions > 0), for the integration tests and the demo. It uses the OS
# packages' server binaries (Debian: /usr/lib/postgresql/<major>/bin) and installs them with
# apt-get when they are missing and we are root.
#
#   services/postgres.sh up            start a server on a free port (reuses a stopped one's data)
#   services/postgres.sh down          stop it and delete its data
#   services/postgres.sh status        exit 0 when it is running
#   services/postgres.sh url           print the connection URL of the `twophase` role
#   services/postgres.sh stop-server   fast shutdown; data and port are kept
#   services/postgres.sh kill-server   immediate shutdown (crash-like); data and port are kept
#   services/postgres.sh start-server  start the stopped server again, same data and port
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_PG_BIN (directory holding
# pg_ctl and initdb, to use a specific installation).
#
# PostgreSQL refuses to run as root. As root the server runs as the `postgres` OS user that the
# Debian package creates; otherwise it runs as you.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=postgres
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE=$RUN_DIR/postgres # a directory, or (as root) a symlink to one the postgres user can reach
PG_OS_USER=postgres
PG_USER=$TWOPHASE_PG_USER
PG_PASSWORD=$TWOPHASE_PG_PASSWORD
PG_DATABASE=$TWOPHASE_PG_DATABASE

# ---------------------------------------------------------------------------------------------
# Server binaries.

find_pg_bin() {
    local d
    if [[ -n ${TWOPHASE_PG_BIN:-} ]]; then
        [[ -x $TWOPHASE_PG_BIN/pg_ctl ]] || die "TWOPHASE_PG_BIN=$TWOPHASE_PG_BIN has no pg_ctl"
        echo "$TWOPHASE_PG_BIN"
        return 0
    fi
    # Debian/Ubuntu keep the server binaries off PATH; take the newest major installed.
    for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
        if [[ -x $d/pg_ctl && -x $d/initdb && -x $d/postgres ]]; then
            echo "$d"
            return 0
        fi
    done
    if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(command -v pg_ctl)"
        return 0
    fi
    return 1
}

install_pg() {
    if [[ $EUID -ne 0 ]]; then
        die "PostgreSQL server binaries (initdb, pg_ctl) not found. Install the server, e.g.
    sudo apt-get install postgresql        (Debian/Ubuntu)
    sudo dnf install postgresql-server     (Fedora/RHEL)
    brew install postgresql@15             (macOS)
or point TWOPHASE_PG_BIN at the directory holding pg_ctl, or use docker-compose.yml."
    fi
    command -v apt-get >/dev/null ||
        die "PostgreSQL server binaries not found and no apt-get here: install PostgreSQL (>= 13) or set TWOPHASE_PG_BIN"
    log "PostgreSQL server not found: installing Debian's postgresql package"
    apt_install postgresql
}

# Empty when PostgreSQL is not installed: then nothing of ours can be running either, and only
# the commands that start a server install it (require_pg_bin).
PG_BIN=$(find_pg_bin) || PG_BIN=

require_pg_bin() {
    [[ -z $PG_BIN ]] || return 0
    install_pg
    PG_BIN=$(find_pg_bin) || die "PostgreSQL was installed but pg_ctl is still not found"
}

# ---------------------------------------------------------------------------------------------
# Running things as the server's OS user.

if [[ $EUID -eq 0 ]]; then
    id "$PG_OS_USER" >/dev/null 2>&1 ||
        die "running as root, but there is no '$PG_OS_USER' OS user to run the server as (PostgreSQL refuses root)"
fi

# as_pg CMD...: run CMD as the server's OS user, from a directory it can read (initdb and
# pg_ctl fail when they cannot resolve the current directory, e.g. inside /root).
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u "$PG_OS_USER" -- "$@")
    else
        "$@"
    fi
}

# The real state directory (symlink resolved): data/, server.log, port, .initialized, and the
# server's Unix socket.
state_dir() { readlink -f "$STATE"; }

# make_state_dir: create $STATE. As root, $CACHE usually lives under /root, which the postgres
# user cannot enter; then the state goes to a fresh private directory under /tmp and $STATE
# becomes a symlink to it. The same happens when the path is too long for a Unix socket
# (sun_path holds 107 bytes, and the socket is "<dir>/.s.PGSQL.<port>").
make_state_dir() {
    local dir
    mkdir -p "$RUN_DIR"
    mkdir -p "$STATE"
    # Private: the Unix socket in here accepts the superuser without a password.
    chmod 700 "$STATE"
    [[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$STATE"
    if ((${#STATE} > 85)) || ! as_pg test -w "$STATE"; then
        rmdir "$STATE"
        dir=$(mktemp -d /tmp/twophase-postgres.XXXXXX)
        [[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$dir"
        ln -s "$dir" "$STATE"
        log "state in $dir (linked from $STATE)"
    fi
}

remove_state() {
    local dir
    if [[ -L $STATE ]]; then
        dir=$(state_dir)
        rm -f "$STATE"
        [[ $dir != /tmp/twophase-postgres.* ]] || rm -rf "$dir"
    else
        rm -rf "$STATE"
    fi
}

# ---------------------------------------------------------------------------------------------

load_port() {
    [[ -f $STATE/port ]] || die "no server state in $STATE: run '$0 up' first"
    PORT=$(<"$STATE/port")
}

url() {
    load_port
    echo "postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PORT/$PG_DATABASE"
}

is_running() {
    [[ -n $PG_BIN && -d $STATE/data ]] || return 1
    as_pg "$PG_BIN/pg_ctl" status -D "$(state_dir)/data" >/dev/null 2>&1
}

# psql as the superuser over the private Unix socket (local connections are trusted).
psql_admin() {
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(state_dir)" -p "$PORT" -U postgres -d postgres "$@"
}

start_server() {
    local dir
    dir=$(state_dir)
    load_port
    if ! as_pg "$PG_BIN/pg_ctl" start -w -t 60 -D "$dir/data" -l "$dir/server.log" >/dev/null; then
        log "the server did not start; last lines of $dir/server.log:"
        tail -n 30 "$dir/server.log" >&2 || true
        die "PostgreSQL did not start"
    fi
    log "server started: 127.0.0.1:$PORT (PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}'), log: $dir/server.log)"
}

init_cluster() {
    local dir
    dir=$(state_dir)
    read -r PORT < <(free_ports 1)
    echo "$PORT" >"$STATE/port"
    # -U postgres: the superuser has the same name whoever runs initdb. Local (socket)
    # connections are trusted: the socket sits in the private state directory. TCP needs a
    # password. UTF8 with the C locale is available everywhere. --no-sync: a throwaway test
    # cluster does not need its initial catalog fsynced (the server itself keeps fsync on).
    as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        die "initdb failed"
    }
    as_pg tee -a "$dir/data/postgresql.conf" >/dev/null <<EOF

# ---- services/postgres.sh ----
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$dir'
max_prepared_transactions = $TWOPHASE_PG_MAX_PREPARED_TRANSACTIONS
max_connections = $TWOPHASE_PG_MAX_CONNECTIONS
EOF
    start_server
    # CREATEROLE: the secret tests create a role of their own with a recognisable password
    # (docker-compose's twophase user is the superuser and can too).
    psql_admin -c "CREATE ROLE $PG_USER LOGIN CREATEROLE PASSWORD '$PG_PASSWORD'"
    psql_admin -c "CREATE DATABASE $PG_DATABASE OWNER $PG_USER"
    touch "$STATE/.initialized"
}

# Ready = the twophase role can log in over TCP with its password (what the tests do).
check_login() {
    PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=10 "$PG_BIN/psql" -X -q -At \
        -h 127.0.0.1 -p "$PORT" -U "$PG_USER" -d "$PG_DATABASE" -c "SELECT 1" >/dev/null ||
        die "cannot log in as $PG_USER at 127.0.0.1:$PORT"
    log "ready: $(url)"
}

stop_server() {
    local mode=${1:-fast}
    if ! is_running; then
        return 0
    fi
    log "stopping the server (-m $mode)"
    as_pg "$PG_BIN/pg_ctl" stop -w -t 60 -m "$mode" -D "$(state_dir)/data" >/dev/null
}

# The role the tests use may create roles (the secret tests log in as one of their own); a
# cluster initialised by an older version of this script gets the attribute here.
ensure_role() {
    psql_admin -c "ALTER ROLE $PG_USER CREATEROLE"
}

cmd_up() {
    require_pg_bin
    if is_running; then
        load_port
        log "already running"
        ensure_role
        check_login
        return 0
    fi
    # A stopped server (stop-server, or a crash) is resumed when its port is still free.
    if [[ -f $STATE/.initialized ]]; then
        load_port
        if port_is_free "$PORT"; then
            log "resuming the stopped server in $STATE"
            start_server
            ensure_role
            check_login
            return 0
        fi
        log "port $PORT of the old server state is taken; starting from scratch"
    fi
    remove_state
    make_state_dir
    init_cluster
    check_login
}

cmd_down() {
    stop_server fast
    remove_state
    log "down"
}

cmd_status() {
    if is_running; then
        load_port
        echo "postgres: running, $(url), state $(state_dir)"
    elif [[ -f $STATE/.initialized ]]; then
        load_port
        echo "postgres: stopped (state kept in $(state_dir), port was $PORT)"
        return 3
    else
        echo "postgres: not running"
        return 3
    fi
}

cmd_start_server() {
    [[ -f $STATE/.initialized ]] || die "no server state in $STATE: run '$0 up' first"
    require_pg_bin
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
stop-server) stop_server fast ;;
kill-server) stop_server immediate ;;
start-server) cmd_start_server ;;
*)
    echo "usage: $0 up|down|status|url|stop-server|kill-server|start-server" >&2
    exit 2
    ;;
esac
