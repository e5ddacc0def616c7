# shellcheck shell=bash
# Helpers shared by services/kafka.sh, services/postgres.sh and services/services.sh.
# Sourced, not run. The caller sets SERVICE (used as the log prefix) and `set -euo pipefail`.

SERVICES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SERVICES_DIR")

# shellcheck source-path=SCRIPTDIR source=settings.env
. "$SERVICES_DIR/settings.env"

# Downloads (Kafka jars) are cached here; running servers keep their state under $RUN_DIR.
CACHE=${TWOPHASE_CACHE:-${HOME:?HOME is not set}/.cache/twophase}
# shellcheck disable=SC2034  # used by the scripts that source this file
RUN_DIR=$CACHE/run

log() { printf '[%s] %s\n' "${SERVICE:-services}" "$*" >&2; }
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

# pid_matches PID TEXT: true when process PID is alive and its command line contains TEXT. Guards
# against acting on a recycled pid from a stale pid file.
pid_matches() {
    local pid=$1 text=$2 cmdline
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmdline == *"$text"* ]]
}

# wait_gone PID SECONDS: wait until PID has exited; false if it is still there after SECONDS.
wait_gone() {
    local pid=$1 deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
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
