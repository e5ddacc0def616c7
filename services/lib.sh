# shellcheck shell=bash
# The life of one local server (install, start, wait until ready, stop, clean up), shared by
# services/{postgres,kafka,mariadb,s3,registry,toxiproxy}.sh, and the helpers services/services.sh uses.
# Sourced, not run; the caller has `set -euo pipefail`.
#
# A server script sets these variables, defines the hooks below, and ends with
# `service_main "$@"`:
#
#   SERVICE        log prefix, and the name `status` prints
#   TITLE          the server's name in messages (PostgreSQL, Kafka, ...)
#   STATE          its state directory, under $RUN_DIR
#   MARKER         a file in $STATE that exists once the state is complete (resumable)
#   NOUN           `server` or `broker`: the verbs are stop-<noun>, kill-<noun>, start-<noun>,
#                  freeze-<noun> and thaw-<noun>
#   ADDRESS_VERB   the verb that prints the address: `url`, `bootstrap`, `endpoint`
#   SERVER_LOG     the log shown when a start fails (OUTPUT_LOG: a second one, optional)
#   READY_TIMEOUT  seconds a start may take to get ready; READY_INTERVAL between two probes
#   EXTRA_VERBS    optional: more verbs of the script's own, space separated; verb V runs the
#                  function svc_verb_V with the remaining arguments
#
#   svc_install         the binaries are there afterwards (installs them when missing)
#   svc_create          a fresh state in the new, empty $STATE: free ports, data, configuration
#   svc_load            reads the state's ports into variables (the state exists)
#   svc_ports           prints those ports: a stopped state resumes only when all are free
#   svc_launch          starts the server on its state in the background (start_background)
#   svc_ready           one readiness probe: true once the server answers
#   svc_setup           what clients need (a role, a user, a bucket), idempotent; checks a login
#   svc_pid             prints the running server's pid; false when it is not running
#   svc_stop MODE PID   stops it: MODE `graceful`, or `crash` (SIGKILL or the like)
#   svc_address         prints the address clients use (URL, host:port)

SERVICES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SERVICES_DIR")

# shellcheck source-path=SCRIPTDIR source=settings.env
. "$SERVICES_DIR/settings.env"

# Downloads (Kafka jars) are cached here; running servers keep their state under $RUN_DIR.
CACHE=${TWOPHASE_CACHE:-${HOME:?HOME is not set}/.cache/twophase}
# TWOPHASE_SERVICES_SET=<n> (n > 1) names another set of the servers, with state and
# ports of its own, beside the first: `make test` gives each of its pytest workers one.
SERVICES_SET=${TWOPHASE_SERVICES_SET:-1}
[[ $SERVICES_SET =~ ^[1-9][0-9]*$ ]] ||
    { echo "TWOPHASE_SERVICES_SET=$SERVICES_SET: want a number from 1 (the default set)" >&2; exit 2; }
# shellcheck disable=SC2034  # used by the scripts that source this file
if [[ $SERVICES_SET == 1 ]]; then RUN_DIR=$CACHE/run; else RUN_DIR=$CACHE/run-$SERVICES_SET; fi

# log MESSAGE...: one line on stderr, prefixed with the service's name.
log() { printf '[%s] %s\n' "${SERVICE:-services}" "$*" >&2; }

# die MESSAGE...: log an error and exit 1.
die() {
    log "ERROR: $*"
    exit 1
}

# A Python interpreter for the small helpers below (any python3 works for them). The Kafka
# readiness check wants confluent-kafka, so prefer the project's venv when the caller gave none.
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $REPO_ROOT/.venv/bin/python ]]; then
        PYTHON=$REPO_ROOT/.venv/bin/python
    else
        PYTHON=python3
    fi
fi

# ---------------------------------------------------------------------------------------------
# Ports, processes and packages.

# free_ports N: print N distinct TCP ports that are free on 127.0.0.1 right now. All sockets are
# held open until every port is picked, so the kernel cannot hand out the same port twice.
free_ports() {
    "$PYTHON" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# port_is_free PORT: true when nothing listens on 127.0.0.1:PORT (so a server can bind it).
port_is_free() {
    "$PYTHON" - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: ignore TIME_WAIT
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# new_port: pick a free port for a fresh state; it goes to PORT and to $STATE/port.
new_port() {
    read -r PORT < <(free_ports 1)
    echo "$PORT" >"$STATE/port"
}

# load_port: read PORT back from $STATE/port.
load_port() { PORT=$(<"$STATE/port"); }

# pid_matches PID TEXT: true when process PID is alive and its command line contains TEXT. Guards
# against acting on a recycled pid from a stale pid file.
pid_matches() {
    local pid=$1 text=$2 cmdline
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmdline == *"$text"* ]]
}

# pid_from_file FILE TEXT: print the pid FILE holds when that process is alive and its command
# line contains TEXT (the state's own path, so that it is this server and not another).
pid_from_file() {
    local pid
    [[ -f $1 ]] || return 1
    pid=$(<"$1")
    pid_matches "$pid" "$2" || return 1
    echo "$pid"
}

# wait_gone PID SECONDS: wait until PID has exited; false if it is still there after SECONDS.
wait_gone() {
    local pid=$1 deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# start_background LOG PIDFILE CMD...: run CMD in a session of its own, so it outlives this
# script and a Ctrl-C aimed at `make` misses it; output appended to LOG. Its pid goes to
# STARTED_PID and, unless PIDFILE is empty (the server writes its own), into PIDFILE.
start_background() {
    local out=$1 pidfile=$2
    shift 2
    setsid "$@" </dev/null >>"$out" 2>&1 &
    STARTED_PID=$!
    [[ -z $pidfile ]] || echo "$STARTED_PID" >"$pidfile"
}

# stop_pid MODE PID: SIGTERM (graceful) or SIGKILL (crash) PID, and wait until it has exited; a
# SIGTERM not obeyed within 60 s becomes a SIGKILL.
stop_pid() {
    local sig=TERM pid=$2
    [[ $1 == graceful ]] || sig=KILL
    kill -"$sig" "$pid" 2>/dev/null || true
    wait_gone "$pid" 60 && return 0
    log "pid $pid did not exit within 60 s of SIG$sig; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "could not stop pid $pid"
}

# apt_install PKG...: install Debian packages (root only). Packages that ship a service (the
# postgresql package starts a cluster of its own on port 5432) must not start it: while
# installing, an invoke-rc.d policy forbids service starts (exit 101). The policy is only put
# in place when the machine has none, and removed afterwards.
apt_install() {
    local policy=/usr/sbin/policy-rc.d created='' rc=0
    ((EUID == 0)) || die "apt_install needs root"
    command -v apt-get >/dev/null || die "no apt-get on this machine to install: $*"
    log "installing Debian packages: $*"
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# temporary, from twophase services/lib.sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created=1
    fi
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
    } >&2 || rc=$?
    [[ -z $created ]] || rm -f "$policy"
    ((rc == 0)) || die "apt-get install $* failed (exit $rc)"
}

# install_or_die HINT PKG...: as root on Debian, install the packages PKG; anywhere else exit
# with HINT, which tells the user how to install the server by hand.
install_or_die() {
    local hint=$1
    shift
    if ((EUID != 0)) || ! command -v apt-get >/dev/null; then
        die "$hint"
    fi
    apt_install "$@"
}

# go_install_once TITLE VERSION MODULE OVERRIDE: set BIN to the binary of the Go module
# MODULE (path@v$VERSION) built once with `go install` into $CACHE/<name>-VERSION, or to the
# executable named by the variable OVERRIDE when it is set.
go_install_once() {
    local title=$1 version=$2 module=$3 override=$4
    if [[ -n ${!override:-} ]]; then
        [[ -x ${!override} ]] || die "$override=${!override} is not executable"
        BIN=${!override}
        return 0
    fi
    local dir=$CACHE/$title-$version binary=${module##*/}
    if [[ ! -x $dir/$binary ]]; then
        command -v go >/dev/null || die "$title $version is not built and there is no Go
    toolchain to build it: install Go (https://go.dev/dl/) or set $override"
        log "building $title $version with go install (once; cached in $dir)"
        mkdir -p "$dir"
        GOBIN=$dir go install "$module@v$version" >&2 || die "go install of $title $version failed"
    fi
    BIN=$dir/$binary
}

# ---------------------------------------------------------------------------------------------
# The life of the server, through the hooks of the script that sourced this file.

# state_path: the real state directory (a link resolved).
state_path() { readlink -f "$STATE"; }

# load_state: read the state's ports; exit with a hint when there is no complete state.
load_state() {
    [[ -f $STATE/$MARKER ]] || die "no $NOUN state in $STATE: run '$0 up' first"
    svc_load
}

# remove_state: delete $STATE; when it is a link to a private directory under /tmp named after
# the service (postgres.sh makes one), that directory too.
remove_state() {
    local dir
    if [[ -L $STATE ]]; then
        dir=$(state_path)
        rm -f "$STATE"
        [[ $dir != /tmp/twophase-"$SERVICE".* ]] || rm -rf "$dir"
    else
        rm -rf "$STATE"
    fi
}

# can_resume: true when $STATE holds a complete state (loaded then) whose ports are all free.
can_resume() {
    local port
    [[ -f $STATE/$MARKER ]] || return 1
    svc_load
    for port in $(svc_ports); do
        if ! port_is_free "$port"; then
            log "port $port of the old $NOUN state is taken; starting from scratch"
            return 1
        fi
    done
}

# start_server: launch the server on its state and wait until it is ready.
start_server() {
    LOG_MARK=1 # where this run's lines begin in SERVER_LOG, which restarts append to
    [[ ! -f $SERVER_LOG ]] || LOG_MARK=$(($(wc -l <"$SERVER_LOG") + 1))
    STARTED_PID=
    svc_launch
    wait_ready "$STARTED_PID"
}

# wait_ready PID: probe every READY_INTERVAL seconds until svc_ready succeeds; fail_start when
# PID (if not empty) exits or READY_TIMEOUT seconds pass first.
wait_ready() {
    local pid=$1 deadline=$((SECONDS + READY_TIMEOUT))
    until svc_ready; do
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
            fail_start "the $NOUN process exited during startup"
        fi
        ((SECONDS < deadline)) || fail_start "the $NOUN was not ready within ${READY_TIMEOUT}s"
        sleep "$READY_INTERVAL"
    done
}

# fail_start WHY: show this run's errors and last lines of the logs, stop the server, exit 1.
fail_start() {
    local this_run errors
    this_run=$(tail -n "+${LOG_MARK:-1}" "$SERVER_LOG" 2>/dev/null || true)
    # A failed start may end in pages of shutdown chatter: the errors first, then the tail.
    errors=$(grep -E -A1 'ERROR|FATAL' <<<"$this_run" | head -n 30 || true)
    log "$1"
    if [[ -n $errors ]]; then
        log "errors in $SERVER_LOG:"
        printf '%s\n' "$errors" >&2
    fi
    log "last lines of $SERVER_LOG:"
    tail -n 20 <<<"$this_run" >&2 || true
    if [[ -n ${OUTPUT_LOG:-} && -s ${OUTPUT_LOG:-} ]]; then
        log "last lines of $OUTPUT_LOG:"
        tail -n 20 "$OUTPUT_LOG" >&2
    fi
    stop_server crash
    die "$TITLE did not start"
}

# stop_server MODE: stop the running server (`graceful` or `crash`); nothing when none runs.
stop_server() {
    local pid
    pid=$(svc_pid) || return 0
    log "stopping the $NOUN, pid $pid ($1)"
    svc_stop "$1" "$pid"
}

# tree_pids PID: PID and every process below it.
tree_pids() {
    local child
    echo "$1"
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree_pids "$child"; done
}

# signal_server STOP|CONT: a frozen server (every process of it stopped, its sockets left open
# and unanswered, as a paused VM or a long pause leaves them), or the same server resumed.
# Resuming a server that is not running does nothing.
signal_server() {
    local pid
    if ! pid=$(svc_pid); then
        [[ $1 == CONT ]] && return 0
        die "the $NOUN is not running"
    fi
    log "SIG$1 to the $NOUN, pid $pid and the processes it started"
    # shellcheck disable=SC2046 # one pid per word
    kill -"$1" $(tree_pids "$pid")
}

# ---------------------------------------------------------------------------------------------
# TLS: one certificate authority per set of servers, and one server certificate it signs, for the
# secured listeners (Kafka's SASL_SSL, PostgreSQL, MariaDB, S3 over HTTPS). Made at the first
# start under $RUN_DIR/tls and deleted with the set (services/services.sh down); never committed.
#
#   $TLS_DIR/ca.pem        the CA's certificate: what clients trust (TWOPHASE_TLS_CA_FILE)
#   $TLS_DIR/ca.key        the CA's key, so that tests can sign certificates of their own
#   $TLS_DIR/server.pem    the servers' certificate, for 127.0.0.1 and localhost
#   $TLS_DIR/server.key    its key, unencrypted PKCS#8, readable by its owner only
TLS_DIR=$RUN_DIR/tls

# tls_ensure: make the CA and the server certificate when they are missing. Idempotent, and safe
# when two servers of a set start at once (a lock, and files renamed into place).
tls_ensure() {
    [[ -f $TLS_DIR/server.pem && -f $TLS_DIR/server.key && -f $TLS_DIR/ca.pem ]] && return 0
    command -v openssl >/dev/null || install_or_die "openssl not found (Debian: sudo apt-get install openssl)" openssl
    mkdir -p "$TLS_DIR"
    chmod 700 "$TLS_DIR"
    (
        flock 9
        [[ -f $TLS_DIR/server.pem && -f $TLS_DIR/server.key && -f $TLS_DIR/ca.pem ]] && exit 0
        local tmp=$TLS_DIR/partial
        rm -rf "$tmp"
        mkdir -p "$tmp"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
            -subj "/CN=twophase test CA $SERVICES_SET" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -keyout "$tmp/ca.key" -out "$tmp/ca.pem" >"$tmp/openssl.log" 2>&1 ||
            { cat "$tmp/openssl.log" >&2; exit 1; }
        openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" \
            -keyout "$tmp/server.key" -out "$tmp/server.csr" >>"$tmp/openssl.log" 2>&1 ||
            { cat "$tmp/openssl.log" >&2; exit 1; }
        printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$tmp/server.ext"
        openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
            -CAcreateserial -days 825 -sha256 -extfile "$tmp/server.ext" \
            -out "$tmp/server.pem" >>"$tmp/openssl.log" 2>&1 ||
            { cat "$tmp/openssl.log" >&2; exit 1; }
        chmod 600 "$tmp/ca.key" "$tmp/server.key"
        mv "$tmp/ca.key" "$tmp/ca.pem" "$tmp/server.key" "$TLS_DIR/"
        mv "$tmp/server.pem" "$TLS_DIR/"
        rm -rf "$tmp"
    ) 9>"$TLS_DIR/.lock" || die "could not make the test CA and server certificate in $TLS_DIR"
}

# tls_remove: delete the set's TLS material (services/services.sh down).
tls_remove() { rm -rf "$TLS_DIR"; }

# service_up: the `up` command. A running server is checked, a stopped one resumed when its
# ports are still free, else a fresh one made on free ports; then what clients need is set up.
service_up() {
    local pid
    svc_install
    if pid=$(svc_pid); then
        svc_load
        log "already running (pid $pid)"
        wait_ready "$pid"
    elif can_resume; then
        log "resuming the stopped $NOUN in $STATE"
        start_server
    else
        remove_state
        mkdir -p "$STATE"
        chmod 700 "$STATE"
        svc_create
        start_server
    fi
    svc_setup
    touch "$STATE/$MARKER"
    log "ready: $(svc_address)"
}

# service_down: the `down` command: stop the server gracefully and delete its state.
service_down() {
    stop_server graceful
    remove_state
    log "down"
}

# service_status: the `status` command: one line on stdout; exit 0 when running, else 3.
service_status() {
    local pid
    if pid=$(svc_pid); then
        svc_load
        echo "$SERVICE: running, pid $pid, $(svc_address), state $(state_path)"
    elif [[ -f $STATE/$MARKER ]]; then
        svc_load
        echo "$SERVICE: stopped (state kept in $(state_path), was $(svc_address))"
        return 3
    else
        echo "$SERVICE: not running"
        return 3
    fi
}

# service_start: the `start-<noun>` command: the stopped server again, same state and ports.
service_start() {
    local pid
    load_state
    svc_install
    if pid=$(svc_pid); then
        log "already running (pid $pid)"
        return 0
    fi
    start_server
    log "ready: $(svc_address)"
}

# service_main ARGS...: run the command ARGS name (the script's own command line).
service_main() {
    case ${1:-} in
    up) service_up ;;
    down) service_down ;;
    status) service_status ;;
    "$ADDRESS_VERB")
        load_state
        svc_address
        ;;
    "stop-$NOUN") stop_server graceful ;;
    "kill-$NOUN") stop_server crash ;;
    "start-$NOUN") service_start ;;
    "freeze-$NOUN") signal_server STOP ;;
    "thaw-$NOUN") signal_server CONT ;;
    *)
        if [[ -n ${1:-} && " ${EXTRA_VERBS:-} " == *" $1 "* ]]; then
            "svc_verb_$1" "${@:2}"
            return
        fi
        local extra=${EXTRA_VERBS:+|${EXTRA_VERBS// /|}}
        echo "usage: $0 up|down|status|$ADDRESS_VERB|stop-$NOUN|kill-$NOUN|start-$NOUN|freeze-$NOUN|thaw-$NOUN$extra" >&2
        exit 2
        ;;
    esac
}
