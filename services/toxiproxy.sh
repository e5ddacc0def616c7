#!/usr/bin/env bash
# A private Toxiproxy on 127.0.0.1: one TCP proxy in front of each server, through which tests
# and the chaos soak cut, slow or half-break the network between a client and its server
# (integration_tests/toxiproxy.py drives it). The server is a Go module built once with
# `go install` from the Go module proxy and cached under TWOPHASE_CACHE, like versitygw.
#
#   services/toxiproxy.sh up            start it with its API on a free port (reuses a stopped
#                                       one's proxies and ports)
#   services/toxiproxy.sh down          stop it and delete its state
#   services/toxiproxy.sh status        exit 0 when it is running
#   services/toxiproxy.sh url           print the API's URL (http://127.0.0.1:<port>)
#   services/toxiproxy.sh proxy NAME UPSTREAM [LISTEN]
#                                       make (or update) proxy NAME forwarding to UPSTREAM
#                                       (host:port), listening on LISTEN, else on the address
#                                       it had, else on a free port; prints the listen address
#   services/toxiproxy.sh stop-server   SIGTERM the server; its proxies and ports are kept
#   services/toxiproxy.sh kill-server   SIGKILL the server; its proxies and ports are kept
#   services/toxiproxy.sh start-server  start the stopped server again, same proxies and ports
#
# Environment: TWOPHASE_CACHE (default ~/.cache/twophase), TWOPHASE_TOXIPROXY (a
# toxiproxy-server binary to use instead of building one).
#
# services/services.sh makes the proxies `postgres`, `mariadb`, `s3` and `kafka` after the
# servers are up (Kafka's through its PROXIED listener: services/kafka.sh proxy). The state
# keeps them (proxies: one `name listen upstream` line each), so the server recreates them
# when it starts again. A proxy does not care whether its server runs: a killed and restarted
# server is reached again on the same port. The life of the server (up, down, status, the
# verbs above) is services/lib.sh's; this file says how Toxiproxy does each step.
set -euo pipefail
SERVICE=toxiproxy
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What services/lib.sh needs to know (see there).
TITLE=Toxiproxy
NOUN=server
ADDRESS_VERB=url
STATE=$RUN_DIR/toxiproxy
MARKER=port # the state is complete once the API's port is chosen
SERVER_LOG=$STATE/server.log
READY_TIMEOUT=15
READY_INTERVAL=0.2
EXTRA_VERBS=proxy

VERSION=$TWOPHASE_TOXIPROXY_VERSION
PROXIES=$STATE/proxies   # `name listen upstream`, one line per proxy
CONFIG=$STATE/proxies.json # the same as toxiproxy's -config file, written from PROXIES

# svc_install: the server binary in BIN: TWOPHASE_TOXIPROXY, or built once with `go install`.
svc_install() {
    go_install_once toxiproxy "$VERSION" github.com/Shopify/toxiproxy/v2/cmd/server TWOPHASE_TOXIPROXY
}

# svc_create: a free port for the API, and no proxies yet.
svc_create() {
    : >"$PROXIES"
    new_port
}

# svc_load, svc_ports: the API's port in $STATE/port, and every proxy's listen port.
svc_load() { load_port; }
svc_ports() {
    local name listen upstream
    echo "$PORT"
    while read -r name listen upstream; do
        [[ -z $name ]] || echo "${listen##*:}"
    done <"$PROXIES"
}

# toxi_call OP: `config` writes $CONFIG from $PROXIES; `ready` asks the API for its version;
# `populate` makes the running server's proxies those of $CONFIG (toxiproxy's POST /populate:
# a proxy already there as recorded is left alone, toxics and connections too).
toxi_call() {
    "$PYTHON" - "$1" "$(svc_address)" "$PROXIES" "$CONFIG" <<'EOP'
import json, os, sys, urllib.error, urllib.request

op, api, proxies, config = sys.argv[1:5]
if op == "config":
    with open(proxies) as f:
        rows = [line.split() for line in f if line.strip()]
    with open(config + ".tmp", "w") as f:
        json.dump([{"name": n, "listen": l, "upstream": u, "enabled": True} for n, l, u in rows], f)
    os.replace(config + ".tmp", config)
elif op == "ready":
    urllib.request.urlopen(api + "/version", timeout=2).read()
elif op == "populate":
    with open(config, "rb") as f:
        body = f.read()
    request = urllib.request.Request(
        api + "/populate", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=10).read()
    except urllib.error.HTTPError as exc:
        sys.exit(f"toxiproxy refused the proxies: {exc.code} {exc.read().decode(errors='replace')}")
EOP
}

# svc_launch: the server, its API on the state's port, the recorded proxies made at start.
# LOG_LEVEL=warn: at info it logs every connection it forwards.
svc_launch() {
    toxi_call config
    LOG_LEVEL=warn start_background "$SERVER_LOG" "$STATE/pid" \
        "$BIN" -host 127.0.0.1 -port "$PORT" -config "$CONFIG"
    log "toxiproxy $VERSION starting on $(svc_address) (pid $STARTED_PID)"
}

# svc_ready: the API answers.
svc_ready() { toxi_call ready 2>/dev/null; }

# svc_setup: the recorded proxies, also on a server that was already running.
svc_setup() {
    toxi_call config
    toxi_call populate || die "could not make the proxies of $PROXIES at $(svc_address)"
}

# svc_pid: the pid file's process, if it is still a toxiproxy with this state's proxies.
svc_pid() { pid_from_file "$STATE/pid" "$CONFIG"; }

# svc_stop MODE PID: SIGTERM, or SIGKILL for a crash.
svc_stop() { stop_pid "$@"; }

# svc_address: the API's URL.
svc_address() { echo "http://127.0.0.1:$PORT"; }

# svc_verb_proxy NAME UPSTREAM [LISTEN]: the `proxy` verb (see the top of this file).
svc_verb_proxy() {
    local name=${1:-} upstream=${2:-} listen=${3:-} n l u kept=''
    [[ -n $name && -n $upstream ]] || die "usage: $0 proxy NAME UPSTREAM [LISTEN]"
    load_state
    while read -r n l u; do
        [[ -z $n ]] && continue
        if [[ $n == "$name" ]]; then
            [[ -n $listen ]] || listen=$l
        else
            kept+="$n $l $u"$'\n'
        fi
    done <"$PROXIES"
    if [[ -z $listen ]]; then
        listen=127.0.0.1:$(free_ports 1)
    fi
    printf '%s%s %s %s\n' "$kept" "$name" "$listen" "$upstream" >"$PROXIES.tmp"
    mv "$PROXIES.tmp" "$PROXIES"
    toxi_call config
    if svc_pid >/dev/null; then
        toxi_call populate || die "could not make proxy $name ($listen -> $upstream)"
    fi
    log "proxy $name: $listen -> $upstream"
    echo "$listen"
}

service_main "$@"
