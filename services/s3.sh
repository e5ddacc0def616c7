#!/usr/bin/env bash
# A private S3 API server on 127.0.0.1 (versitygw, posix backend) with one bucket, for the files
# sink's S3 path (multipart upload), the integration tests and the demo. The gateway is a Go
# module built once with `go install` from the Go module proxy and cached under TWOPHASE_CACHE.
# docs/files.md says why versitygw rather than S3Proxy.
#
#   services/s3.sh up            start a server on a free port (reuses a stopped one's data) and
#                                create the bucket
#   services/s3.sh down          stop it and delete its data
#   services/s3.sh status        exit 0 when it is running
#   services/s3.sh endpoint      print the endpoint URL (http://127.0.0.1:<port>)
#   services/s3.sh kill-server   SIGKILL the server (crash-like); data and port are kept
#   services/s3.sh start-server  start the killed server again, same data and port
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_VERSITYGW (a versitygw
# binary to use instead of building one). Credentials and bucket: services/settings.env.
#
# The posix backend keeps object metadata (ETags, multipart state) in user extended attributes,
# so the data directory must be on a filesystem with user xattrs (ext4, xfs, btrfs; not every
# tmpfs or overlay); `up` checks that before starting.
set -euo pipefail
# shellcheck disable=SC2034  # SERVICE is the log prefix, used in lib.sh
SERVICE=s3
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=$TWOPHASE_VERSITYGW_VERSION
STATE=$RUN_DIR/s3
DATA=$STATE/data
ACCESS_KEY=${TWOPHASE_S3_ACCESS_KEY:-$TWOPHASE_DEFAULT_S3_ACCESS_KEY}
SECRET_KEY=${TWOPHASE_S3_SECRET_KEY:-$TWOPHASE_DEFAULT_S3_SECRET_KEY}
BUCKET=${TWOPHASE_S3_BUCKET:-$TWOPHASE_DEFAULT_S3_BUCKET}

# ---------------------------------------------------------------------------------------------
# The gateway binary.

binary() {
    if [[ -n ${TWOPHASE_VERSITYGW:-} ]]; then
        [[ -x $TWOPHASE_VERSITYGW ]] || die "TWOPHASE_VERSITYGW=$TWOPHASE_VERSITYGW is not executable"
        echo "$TWOPHASE_VERSITYGW"
        return 0
    fi
    local dir=$CACHE/versitygw-$VERSION
    if [[ ! -x $dir/versitygw ]]; then
        command -v go >/dev/null || die "versitygw $VERSION is not built and there is no Go
    toolchain to build it: install Go (https://go.dev/dl/) or set TWOPHASE_VERSITYGW"
        log "building versitygw $VERSION with go install (once; cached in $dir)"
        mkdir -p "$dir"
        GOBIN=$dir go install "github.com/versity/versitygw/cmd/versitygw@v$VERSION" >&2 ||
            die "go install of versitygw $VERSION failed"
    fi
    echo "$dir/versitygw"
}

# ---------------------------------------------------------------------------------------------
# The server.

load_port() { cat "$STATE/port" 2>/dev/null || true; }
endpoint() { echo "http://127.0.0.1:$(load_port)"; }

server_pid() {
    local pid
    pid=$(cat "$STATE/pid" 2>/dev/null || true)
    pid_matches "$pid" "versitygw" && echo "$pid"
}

is_running() { [[ -n $(server_pid) ]]; }

check_xattrs() {
    "$PYTHON" - "$DATA" <<'EOF' || die "the S3 data directory $DATA has no user extended attributes, which versitygw's posix backend needs: set TWOPHASE_CACHE to a directory on ext4, xfs or btrfs"
import os, sys
probe = os.path.join(sys.argv[1], ".xattr-probe")
open(probe, "wb").close()
try:
    os.setxattr(probe, "user.twophase", b"1")
finally:
    os.unlink(probe)
EOF
}

# s3_call OP...: a small S3 request with the project's credentials (bucket checks, readiness).
s3_call() {
    "$PYTHON" - "$(endpoint)" "$ACCESS_KEY" "$SECRET_KEY" "$BUCKET" "$@" <<'EOF'
import sys
import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, access, secret, bucket, op = sys.argv[1:6]
client = botocore.session.get_session().create_client(
    "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
    region_name="us-east-1", config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                           read_timeout=5),
)
if op == "ready":
    client.list_buckets()
elif op == "bucket":
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)
EOF
}

start_server() {
    local bin port pid deadline
    bin=$(binary)
    port=$(load_port)
    mkdir -p "$DATA"
    check_xattrs
    if [[ -z $port ]] || ! port_is_free "$port"; then
        port=$(free_ports 1)
        echo "$port" >"$STATE/port"
    fi
    # Credentials through the environment, so they are not in the process list.
    ROOT_ACCESS_KEY=$ACCESS_KEY ROOT_SECRET_KEY=$SECRET_KEY nohup "$bin" \
        --port "127.0.0.1:$port" posix "$DATA" >>"$STATE/server.log" 2>&1 &
    pid=$!
    echo "$pid" >"$STATE/pid"
    deadline=$((SECONDS + 30))
    until s3_call ready 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || die "versitygw exited at start; see $STATE/server.log"
        ((SECONDS < deadline)) || die "versitygw did not answer within 30s; see $STATE/server.log"
        sleep 0.2
    done
    log "versitygw $VERSION listening on $(endpoint) (pid $pid, data $DATA)"
}

kill_server() {
    local pid
    pid=$(server_pid) || true
    [[ -n $pid ]] || return 0
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "versitygw pid $pid did not exit after SIGKILL"
}

cmd_up() {
    mkdir -p "$STATE"
    if ! is_running; then
        start_server
    fi
    s3_call bucket || die "could not create bucket $BUCKET at $(endpoint)"
    log "bucket $BUCKET ready at $(endpoint)"
}

cmd_down() {
    local pid
    pid=$(server_pid) || true
    if [[ -n $pid ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || kill_server
    fi
    rm -rf "$STATE"
    log "stopped and removed $STATE"
}

cmd_status() {
    if is_running && s3_call ready 2>/dev/null; then
        log "running at $(endpoint)"
        return 0
    fi
    log "not running"
    return 1
}

cmd_start_server() {
    [[ -s $STATE/port ]] || die "no server to start again: run services/s3.sh up"
    is_running || start_server
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
endpoint)
    [[ -s $STATE/port ]] || die "not set up: run services/s3.sh up"
    endpoint
    ;;
kill-server) kill_server ;;
start-server) cmd_start_server ;;
*)
    echo "usage: $0 up|down|status|endpoint|kill-server|start-server" >&2
    exit 2
    ;;
esac
