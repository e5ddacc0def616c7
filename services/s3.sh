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
#   services/s3.sh stop-server   SIGTERM the server; data and port are kept
#   services/s3.sh kill-server   SIGKILL the server (crash-like); data and port are kept
#   services/s3.sh start-server  start the stopped server again, same data and port
#   services/s3.sh secured       print `export TWOPHASE_S3_TLS_ENDPOINT=https://127.0.0.1:<port>`
#
# Beside the HTTP endpoint, a second gateway process serves the same data over HTTPS with the
# set's server certificate (services/lib.sh's tls_ensure): versitygw's --cert applies to every
# listener of a process, so one process cannot serve both. The two share the posix root and the
# IAM directory (accounts other than root, made through the admin API on either port), with the
# IAM cache off so that an account made on one is seen by the other at once. stop, kill and start
# act on both processes; freeze and thaw on the HTTP one only.
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_VERSITYGW (a versitygw
# binary to use instead of building one). Credentials and bucket: services/settings.env.
#
# The posix backend keeps object metadata (ETags, multipart state) in user extended attributes,
# so the data directory must be on a filesystem with user xattrs (ext4, xfs, btrfs; not every
# tmpfs or overlay); `up` checks that before starting. The life of the server (up, down,
# status, the verbs above) is services/lib.sh's; this file says how versitygw does each step.
set -euo pipefail
SERVICE=s3
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE=versitygw
NOUN=server
ADDRESS_VERB=endpoint
STATE=$RUN_DIR/s3
MARKER=port # the state is complete once its port is chosen
SERVER_LOG=$STATE/server.log
TLS_LOG=$STATE/tls-server.log
EXTRA_VERBS=secured
READY_TIMEOUT=60
READY_INTERVAL=0.2

VERSION=$TWOPHASE_VERSITYGW_VERSION
DATA=$STATE/data
IAM=$STATE/iam
ACCESS_KEY=${TWOPHASE_S3_ACCESS_KEY:-$TWOPHASE_DEFAULT_S3_ACCESS_KEY}
SECRET_KEY=${TWOPHASE_S3_SECRET_KEY:-$TWOPHASE_DEFAULT_S3_SECRET_KEY}
BUCKET=${TWOPHASE_S3_BUCKET:-$TWOPHASE_DEFAULT_S3_BUCKET}

# svc_install: the gateway binary in BIN: TWOPHASE_VERSITYGW, or built once with `go install`.
svc_install() {
    go_install_once versitygw "$VERSION" github.com/versity/versitygw/cmd/versitygw TWOPHASE_VERSITYGW
}

# svc_create: a data directory with user extended attributes, and a free port.
svc_create() {
    mkdir -p "$DATA"
    "$PYTHON" - "$DATA" <<'EOP' || die "the S3 data directory $DATA has no user extended attributes, which versitygw's posix backend needs: set TWOPHASE_CACHE to a directory on ext4, xfs or btrfs"
import os, sys
probe = os.path.join(sys.argv[1], ".xattr-probe")
open(probe, "wb").close()
try:
    os.setxattr(probe, "user.twophase", b"1")
finally:
    os.unlink(probe)
EOP
    mkdir -p "$IAM"
    new_port
    new_tls_port
}

# new_tls_port: a free port for the HTTPS process, other than PORT, into TLS_PORT and its file.
new_tls_port() {
    local port
    for port in $(free_ports 2); do
        [[ $port == "$PORT" ]] || break
    done
    TLS_PORT=$port
    echo "$TLS_PORT" >"$STATE/tls-port"
}

# svc_load, svc_ports: the state keeps its ports in $STATE/port and $STATE/tls-port (a state
# made before the HTTPS process gets a TLS port and an IAM directory when it is resumed).
svc_load() {
    load_port
    if [[ -f $STATE/tls-port ]]; then
        TLS_PORT=$(<"$STATE/tls-port")
    else
        mkdir -p "$IAM"
        new_tls_port
    fi
}
svc_ports() { echo "$PORT $TLS_PORT"; }

# svc_launch: the gateway on the state's data and port; credentials through the environment,
# so they are not in the process list.
svc_launch() {
    local tls_pid
    tls_ensure
    mkdir -p "$IAM"
    if ! tls_pid=$(pid_from_file "$STATE/tls-pid" "$DATA"); then
        # A copy of its own, as the other servers have: a test makes it present an expired
        # certificate for a moment (the file swapped, then SIGHUP: versitygw reloads its TLS).
        mkdir -p "$STATE/tls"
        chmod 700 "$STATE/tls"
        cp "$TLS_DIR/server.pem" "$TLS_DIR/server.key" "$STATE/tls/"
        chmod 600 "$STATE/tls/server.key"
        ROOT_ACCESS_KEY=$ACCESS_KEY ROOT_SECRET_KEY=$SECRET_KEY \
            start_background "$TLS_LOG" "$STATE/tls-pid" "$BIN" --port "127.0.0.1:$TLS_PORT" \
            --cert "$STATE/tls/server.pem" --key "$STATE/tls/server.key" \
            --iam-dir "$IAM" --iam-cache-disable posix "$DATA"
        tls_pid=$STARTED_PID
    fi
    ROOT_ACCESS_KEY=$ACCESS_KEY ROOT_SECRET_KEY=$SECRET_KEY \
        start_background "$SERVER_LOG" "$STATE/pid" "$BIN" --port "127.0.0.1:$PORT" \
        --iam-dir "$IAM" --iam-cache-disable posix "$DATA"
    log "versitygw $VERSION starting on $(svc_address) and $(tls_address) (pids $STARTED_PID and $tls_pid, data $DATA)"
}

# s3_call OP: a small S3 request with the project's credentials: `ready` lists the buckets,
# `bucket` creates the bucket unless it exists.
s3_call() {
    local endpoint=${S3_CALL_ENDPOINT:-$(svc_address)}
    "$PYTHON" - "$endpoint" "$ACCESS_KEY" "$SECRET_KEY" "$BUCKET" "$TLS_DIR/ca.pem" "$@" <<'EOP'
import sys
import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, access, secret, bucket, ca, op = sys.argv[1:7]
client = botocore.session.get_session().create_client(
    "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
    region_name="us-east-1", config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                           read_timeout=5),
    verify=ca if endpoint.startswith("https:") else None,
)
if op == "ready":
    client.list_buckets()
elif op == "bucket":
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)
EOP
}

# svc_ready: both gateways list the buckets (the HTTPS one with the set's CA).
svc_ready() {
    s3_call ready 2>/dev/null && S3_CALL_ENDPOINT=$(tls_address) s3_call ready 2>/dev/null
}

# svc_setup: the bucket.
svc_setup() {
    s3_call bucket || die "could not create bucket $BUCKET at $(svc_address)"
    log "bucket $BUCKET ready at $(svc_address)"
}

# svc_pid: the pid file's process, if it is still versitygw on this state's data.
svc_pid() { pid_from_file "$STATE/pid" "$DATA"; }

# svc_stop MODE PID: SIGTERM, or SIGKILL for a crash; the HTTPS process too.
svc_stop() {
    local tls_pid
    if tls_pid=$(pid_from_file "$STATE/tls-pid" "$DATA"); then stop_pid "$1" "$tls_pid"; fi
    stop_pid "$@"
}

# svc_address: the endpoint URL.
svc_address() { echo "http://127.0.0.1:$PORT"; }

# tls_address: the HTTPS endpoint's URL, on the same data.
tls_address() { echo "https://127.0.0.1:$TLS_PORT"; }

# svc_verb_secured: what services/services.sh writes into .services.env for the HTTPS endpoint.
svc_verb_secured() {
    load_state
    echo "export TWOPHASE_S3_TLS_ENDPOINT=$(tls_address)"
}

service_main "$@"
