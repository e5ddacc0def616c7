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
#   services/postgres.sh secured       print `export TWOPHASE_PG_TLS_URL=...`: the TLS role's URL
#
# The same server takes TLS (ssl=on, the set's certificate from services/lib.sh's tls_ensure)
# with scram-sha-256 passwords. Plain TCP connections of the `twophase` role keep working; the
# role `twophase_tls` (not a superuser: LOGIN CREATEROLE, CREATE on the database, a password
# made at its first start in $STATE/tls-role.password, mode 600) may connect over TLS only
# (`hostssl`), and the tests make their least-privileged roles through it.
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_PG_BIN (directory holding
# pg_ctl and initdb, to use a specific installation).
#
# PostgreSQL refuses to run as root. As root the server runs as the `postgres` OS user that the
# Debian package creates; otherwise it runs as you. The life of the server (up, down, status,
# the verbs above) is services/lib.sh's; this file says how PostgreSQL does each step.
set -euo pipefail
SERVICE=postgres
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE=PostgreSQL
NOUN=server
ADDRESS_VERB=url
STATE=$RUN_DIR/postgres # a directory, or (as root) a symlink to one the postgres user can reach
MARKER=.initialized
SERVER_LOG=$STATE/server.log
READY_TIMEOUT=60
READY_INTERVAL=0.5
EXTRA_VERBS=secured

PG_OS_USER=postgres
PG_USER=$TWOPHASE_PG_USER
PG_PASSWORD=$TWOPHASE_PG_PASSWORD
PG_DATABASE=$TWOPHASE_PG_DATABASE
TLS_ROLE=twophase_tls
TLS_PASSWORD_FILE=$STATE/tls-role.password

# find_pg_bin: print the directory of the server binaries (pg_ctl, initdb, postgres).
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

# Empty when PostgreSQL is not installed: then nothing of ours can be running either, and only
# the commands that start a server install it (svc_install).
PG_BIN=$(find_pg_bin) || PG_BIN=

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

# psql_admin ARGS...: psql as the superuser over the private Unix socket (trusted locally).
psql_admin() {
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(state_path)" -p "$PORT" -U postgres -d postgres "$@"
}

# svc_install: Debian's postgresql package when no server binaries are found.
svc_install() {
    [[ -z $PG_BIN ]] || return 0
    install_or_die "PostgreSQL server binaries (initdb, pg_ctl) not found. Install the server, e.g.
    sudo apt-get install postgresql        (Debian/Ubuntu)
    sudo dnf install postgresql-server     (Fedora/RHEL)
    brew install postgresql@15             (macOS)
or point TWOPHASE_PG_BIN at the directory holding pg_ctl, or use docker-compose.yml." postgresql
    PG_BIN=$(find_pg_bin) || die "PostgreSQL was installed but pg_ctl is still not found"
}

# svc_create: a new cluster. As root, $CACHE usually lives under /root, which the postgres user
# cannot enter; then the state goes to a fresh private directory under /tmp and $STATE becomes
# a symlink to it. The same happens when the path is too long for a Unix socket (sun_path
# holds 107 bytes, and the socket is "<dir>/.s.PGSQL.<port>").
svc_create() {
    local dir
    # Private (lib.sh made it 0700): the Unix socket in here accepts the superuser without a password.
    [[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$STATE"
    if ((${#STATE} > 85)) || ! as_pg test -w "$STATE"; then
        rmdir "$STATE"
        dir=$(mktemp -d /tmp/twophase-postgres.XXXXXX)
        [[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$dir"
        ln -s "$dir" "$STATE"
        log "state in $dir (linked from $STATE)"
    fi
    dir=$(state_path)
    new_port
    # -U postgres: the superuser has the same name whoever runs initdb. Local (socket)
    # connections are trusted: the socket sits in the private state directory. TCP needs a
    # password. UTF8 with the C locale is available everywhere. --no-sync: a throwaway test
    # cluster does not need its initial catalog fsynced (the server itself keeps fsync on).
    as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        die "initdb failed"
    }
    as_pg tee -a "$dir/data/postgresql.conf" >/dev/null <<EOC

# ---- services/postgres.sh ----
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$dir'
max_prepared_transactions = $TWOPHASE_PG_MAX_PREPARED_TRANSACTIONS
max_connections = $TWOPHASE_PG_MAX_CONNECTIONS
EOC
}

# svc_load, svc_ports: the state keeps its port in $STATE/port.
svc_load() { load_port; }
svc_ports() { echo "$PORT"; }

# svc_launch: pg_ctl starts the server and waits for it (-w).
svc_launch() {
    local dir
    dir=$(state_path)
    as_pg "$PG_BIN/pg_ctl" start -w -t "$READY_TIMEOUT" -D "$dir/data" -l "$dir/server.log" >/dev/null ||
        fail_start "pg_ctl could not start the server"
    log "server started: 127.0.0.1:$PORT (PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}'), log: $dir/server.log)"
}

# svc_ready: the superuser gets an answer over the Unix socket.
svc_ready() { psql_admin -c "SELECT 1" >/dev/null 2>&1; }

# svc_setup: the `twophase` role and its database; ready = the role logs in over TCP with its
# password (what the tests do); then TLS and its role (tls_setup, tls_role). CREATEROLE: the secret tests create a role of their own with a
# recognisable password (docker-compose's twophase user is the superuser and can too); a
# cluster made by an older version of this script gets the attribute here. EXECUTE on
# pg_reload_conf(): a test makes the server present an expired certificate for a moment.
svc_setup() {
    psql_admin <<EOS
SELECT 'CREATE ROLE $PG_USER LOGIN CREATEROLE PASSWORD ''$PG_PASSWORD'''
    WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') \gexec
ALTER ROLE $PG_USER CREATEROLE;
SELECT 'CREATE DATABASE $PG_DATABASE OWNER $PG_USER'
    WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DATABASE') \gexec
EOS
    # A function's grants are its database's: pg_reload_conf() in the tests' database.
    psql_admin -d "$PG_DATABASE" -c "GRANT EXECUTE ON FUNCTION pg_reload_conf() TO $PG_USER" >/dev/null
    PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=10 "$PG_BIN/psql" -X -q -At \
        -h 127.0.0.1 -p "$PORT" -U "$PG_USER" -d "$PG_DATABASE" -c "SELECT 1" >/dev/null ||
        die "cannot log in as $PG_USER at 127.0.0.1:$PORT"
    tls_setup
    tls_role
}

# tls_setup: TLS on the running server, for a new state, a resumed one or one a server started
# by an older version of this script: the set's certificate and key copied into the state (the
# server's OS user owns them, the key mode 600, as PostgreSQL demands), ssl and scram-sha-256
# through ALTER SYSTEM (the CA too: a client certificate is then checked against it, so an
# expired one is refused in the handshake; none is required), `hostssl` lines at the top of pg_hba.conf (the TLS role over TLS only),
# then a reload (these settings take one, no restart) and a wait until the server uses them.
tls_setup() {
    local dir hba i
    tls_ensure
    dir=$(state_path)
    mkdir -p "$dir/tls"
    cp "$TLS_DIR/server.pem" "$TLS_DIR/server.key" "$TLS_DIR/ca.pem" "$dir/tls/"
    chmod 700 "$dir/tls"
    chmod 600 "$dir/tls/server.key"
    chmod 644 "$dir/tls/server.pem" "$dir/tls/ca.pem"
    [[ $EUID -ne 0 ]] || chown -R "$PG_OS_USER:" "$dir/tls"
    hba=$dir/data/pg_hba.conf
    if ! grep -q '^hostssl all all 127.0.0.1/32 scram-sha-256' "$hba"; then
        as_pg sh -c "{ printf '%s\n' '# ---- services/postgres.sh: TLS ----' \
            'hostnossl all $TLS_ROLE 0.0.0.0/0 reject' 'hostnossl all $TLS_ROLE ::/0 reject' \
            'hostssl all all 127.0.0.1/32 scram-sha-256' 'hostssl all all ::1/128 scram-sha-256'; \
            cat '$hba'; } >'$hba.new' && mv '$hba.new' '$hba'"
    fi
    psql_admin >/dev/null <<EOS
ALTER SYSTEM SET ssl = on;
ALTER SYSTEM SET ssl_cert_file = '$dir/tls/server.pem';
ALTER SYSTEM SET ssl_key_file = '$dir/tls/server.key';
ALTER SYSTEM SET ssl_ca_file = '$dir/tls/ca.pem';
ALTER SYSTEM SET password_encryption = 'scram-sha-256';
SELECT pg_reload_conf();
EOS
    for ((i = 0; i < 50; i++)); do
        [[ $(psql_admin -At -c "SHOW ssl") == on ]] && return 0
        sleep 0.1
    done
    die "the server did not turn TLS on (see $dir/server.log)"
}

# tls_role: the ordinary role of the TLS URL, with a password made at its first start (kept in
# the state, mode 600), CREATEROLE to make the tests' roles, CREATE on the database for their
# schemas. Then it logs in over TLS, verifying the server's certificate against the set's CA.
tls_role() {
    local password
    if [[ ! -s $TLS_PASSWORD_FILE ]]; then
        (umask 077 && openssl rand -hex 16 >"$TLS_PASSWORD_FILE")
    fi
    chmod 600 "$TLS_PASSWORD_FILE"
    password=$(<"$TLS_PASSWORD_FILE")
    psql_admin <<EOS
SELECT 'CREATE ROLE $TLS_ROLE' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$TLS_ROLE') \gexec
ALTER ROLE $TLS_ROLE LOGIN CREATEROLE NOSUPERUSER PASSWORD '$password';
GRANT CREATE ON DATABASE $PG_DATABASE TO $TLS_ROLE;
EOS
    PGPASSWORD=$password PGCONNECT_TIMEOUT=10 "$PG_BIN/psql" -X -q -At \
        "host=127.0.0.1 port=$PORT user=$TLS_ROLE dbname=$PG_DATABASE sslmode=verify-full sslrootcert=$TLS_DIR/ca.pem" \
        -c "SELECT 1" >/dev/null || die "cannot log in as $TLS_ROLE over TLS at 127.0.0.1:$PORT"
}

# svc_verb_secured: the `secured` verb: the TLS role's URL, verifying the server's name.
# Quoted: the URL holds an `&`, and the line is sourced by sh.
svc_verb_secured() {
    load_state
    [[ -s $TLS_PASSWORD_FILE ]] || die "no TLS role yet in $STATE: run '$0 up' first"
    echo "export TWOPHASE_PG_TLS_URL='postgresql://$TLS_ROLE:$(<"$TLS_PASSWORD_FILE")@127.0.0.1:$PORT/$PG_DATABASE?sslmode=verify-full&sslrootcert=$TLS_DIR/ca.pem'"
}

# svc_pid: the postmaster's pid, when pg_ctl finds it running.
svc_pid() {
    [[ -n $PG_BIN && -f $STATE/data/postmaster.pid ]] || return 1
    as_pg "$PG_BIN/pg_ctl" status -D "$(state_path)/data" >/dev/null 2>&1 || return 1
    head -n 1 "$STATE/data/postmaster.pid"
}

# svc_stop MODE PID: pg_ctl's fast shutdown, or its immediate one for a crash.
svc_stop() {
    local mode=fast
    [[ $1 == graceful ]] || mode=immediate
    as_pg "$PG_BIN/pg_ctl" stop -w -t 60 -m "$mode" -D "$(state_path)/data" >/dev/null
}

# svc_address: the `twophase` role's connection URL.
svc_address() { echo "postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PORT/$PG_DATABASE"; }

service_main "$@"
