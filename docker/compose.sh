#!/usr/bin/env bash
# The compose cluster's life: a Docker engine, a Debian base image, the images, up and down.
#
#   docker/compose.sh up       engine, base image, images, then `docker compose up -d` and wait
#                              until every server is healthy (addresses: services/docker.env)
#   docker/compose.sh down     `docker compose down -v` (containers, network, volumes)
#   docker/compose.sh build    engine, base image and images only
#   docker/compose.sh engine   a running Docker engine with the compose and buildx plugins
#   docker/compose.sh base     the base image ($BASE_IMAGE), made with debootstrap when missing
#   docker/compose.sh compose ARGS...   `docker compose ARGS...` with this project's settings
#
# Where a Docker engine is missing and we are root on Debian, the engine comes from Debian's
# docker.io package and the compose and buildx plugins are built from the Go module proxy (Debian
# 12 packages neither); both are cached under TWOPHASE_CACHE/docker. No image registry needs to
# answer: the Dockerfiles start from a Debian base made here with debootstrap and `docker import`
# (cached as a tarball), unless TWOPHASE_BASE_IMAGE names another (e.g. debian:bookworm-slim).
#
# Builds reach PyPI, Maven Central and the Go module proxy with the CA bundle in
# TWOPHASE_CA_BUNDLE (default: the one pip's configuration names, else the system's), passed as
# the build secret `ca-bundle`: it never enters an image.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TWOPHASE_CACHE:-$HOME/.cache/twophase}
DOCKER_CACHE=$CACHE/docker
BASE_IMAGE=${TWOPHASE_BASE_IMAGE:-twophase/debian:bookworm}
SUITE=bookworm
MIRROR=${TWOPHASE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The plugins built from the Go module proxy when the machine has none.
COMPOSE_VERSION=v2.40.3
BUILDX_VERSION=v0.38.2
PLUGINS=$DOCKER_CACHE/cli-plugins
ENGINE_LOG=$DOCKER_CACHE/dockerd.log

log() { printf 'compose: %s\n' "$*" >&2; }
die() {
    printf 'compose: error: %s\n' "$*" >&2
    exit 1
}

# ca_bundle: the CA bundle builds trust, as pip's configuration names it.
ca_bundle() {
    local bundle=${TWOPHASE_CA_BUNDLE:-}
    if [[ -z $bundle ]] && command -v pip >/dev/null; then
        bundle=$(pip config get global.cert 2>/dev/null || true)
    fi
    bundle=${bundle:-/etc/ssl/certs/ca-certificates.crt}
    [[ -s $bundle ]] || die "no CA bundle at $bundle: set TWOPHASE_CA_BUNDLE to the PEM file that your machine trusts for PyPI and Maven Central"
    printf '%s\n' "$bundle"
}

as_root_on_debian() {
    [[ $(id -u) == 0 && -f /etc/debian_version ]] && command -v apt-get >/dev/null
}

# apt_install WHAT PACKAGE: PACKAGE from Debian's packages, because WHAT is missing.
apt_install() {
    local what=$1 package=$2 apt=$DOCKER_CACHE/apt.log
    as_root_on_debian || die "$what is missing and cannot be installed here (not root on Debian): install $package yourself"
    log "installing $package from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$package" >"$apt" 2>&1 ||
        { apt-get update -q >>"$apt" 2>&1 && apt-get install -y -q --no-install-recommends "$package" >>"$apt" 2>&1; } ||
        { tail -20 "$apt" >&2; die "apt-get could not install $package (log: $apt)"; }
}

# plugin NAME MODULE PACKAGE VERSION VERSIONVAR: a docker CLI plugin, built once from the
# module's source on the Go module proxy. Built inside the module (not `go install
# pkg@version`), so that its own replace and exclude directives apply, and with its version
# stamped in VERSIONVAR as its release builds do (compose checks buildx's).
plugin() {
    local name=$1 module=$2 package=$3 version=$4 versionvar=$5 bin=$PLUGINS/docker-$1
    if docker "$name" version >/dev/null 2>&1; then
        return 0
    fi
    if [[ ! -x $bin.$version ]]; then
        command -v go >/dev/null || die "docker $name is missing and Go is not installed to build it: install the docker-$name plugin"
        log "building docker $name $version from the Go module proxy (first run only)"
        local src buildlog=$DOCKER_CACHE/$name-build.log
        src=$(mktemp -d)
        {
            dir=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') &&
                cp -r "$dir/." "$src" && chmod -R u+w "$src" &&
                (cd "$src" && CGO_ENABLED=0 go build -trimpath \
                    -ldflags "-w -X $module/$versionvar=$version" -o "$bin.$version.partial" "$package")
        } >"$buildlog" 2>&1 ||
            { tail -20 "$buildlog" >&2; rm -rf "$src"; die "could not build docker $name (log: $buildlog)"; }
        rm -rf "$src"
        mv "$bin.$version.partial" "$bin.$version"
    fi
    ln -sf "$bin.$version" "$bin"
    mkdir -p "$HOME/.docker/cli-plugins"
    ln -sf "$bin" "$HOME/.docker/cli-plugins/docker-$name"
    docker "$name" version >/dev/null || die "docker $name $version was built but does not run (log: $DOCKER_CACHE/$name-build.log)"
}

engine() {
    mkdir -p "$DOCKER_CACHE" "$PLUGINS"
    if ! command -v docker >/dev/null; then
        apt_install docker docker.io
    fi
    if ! docker info >/dev/null 2>&1; then
        if ! command -v dockerd >/dev/null; then
            apt_install dockerd docker.io
        fi
        as_root_on_debian || die "the Docker engine is not running and cannot be started here (not root): start dockerd"
        log "starting dockerd (log: $ENGINE_LOG)"
        # Debian's package installs no running service on a machine without systemd.
        nohup dockerd >"$ENGINE_LOG" 2>&1 &
        local i
        for i in $(seq 60); do
            docker info >/dev/null 2>&1 && break
            sleep 1
        done
        docker info >/dev/null 2>&1 || { tail -20 "$ENGINE_LOG" >&2; die "dockerd did not start within 60 s (log: $ENGINE_LOG)"; }
    fi
    plugin buildx github.com/docker/buildx ./cmd/buildx "$BUILDX_VERSION" version.Version
    plugin compose github.com/docker/compose/v2 ./cmd "$COMPOSE_VERSION" internal.Version
}

# base: the Debian base image, from a cached debootstrap tarball.
base() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        return 0
    fi
    [[ $BASE_IMAGE == twophase/debian:$SUITE ]] ||
        { log "pulling $BASE_IMAGE"; docker pull "$BASE_IMAGE" && return 0; die "could not pull $BASE_IMAGE: unset TWOPHASE_BASE_IMAGE to make the base here with debootstrap"; }
    local tarball=$DOCKER_CACHE/debian-$SUITE.tar.gz
    if [[ ! -s $tarball ]]; then
        command -v debootstrap >/dev/null || apt_install debootstrap debootstrap
        local rootfs=$DOCKER_CACHE/rootfs.partial
        rm -rf "$rootfs"
        log "making the $SUITE base with debootstrap from $MIRROR (first run only)"
        debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >"$DOCKER_CACHE/debootstrap.log" 2>&1 ||
            { tail -20 "$DOCKER_CACHE/debootstrap.log" >&2; die "debootstrap could not make the base image (log: $DOCKER_CACHE/debootstrap.log); set TWOPHASE_DEBIAN_MIRROR to a Debian mirror that answers, or TWOPHASE_BASE_IMAGE to an image you can pull"; }
        # The same suites as the machine: bookworm, its updates, security and backports.
        cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $MIRROR $SUITE-backports main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -czf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
        rm -rf "$rootfs"
    fi
    log "importing $tarball as $BASE_IMAGE"
    docker import "$tarball" "$BASE_IMAGE" >/dev/null
}

compose() {
    local bundle
    bundle=$(ca_bundle)
    # Compose builds through buildx bake, which asks before reading a file outside the build
    # context: the CA bundle secret is one, named by us.
    TWOPHASE_CA_BUNDLE=$bundle TWOPHASE_BASE_IMAGE=$BASE_IMAGE BUILDX_BAKE_ENTITLEMENTS_FS=0 \
        docker compose --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" "$@"
}

build() {
    engine
    base
    local start=$SECONDS
    log "building the images (docker compose build)"
    compose build
    log "images built in $((SECONDS - start)) s"
}

up() {
    local start=$SECONDS
    build
    compose up -d --wait --wait-timeout 300
    log "up in $((SECONDS - start)) s: servers as in services/docker.env; Spark master at spark://127.0.0.1:7077 (UI http://127.0.0.1:8080)"
}

down() {
    if ! docker info >/dev/null 2>&1; then
        log "no Docker engine is running: nothing to stop"
        return 0
    fi
    compose --profile driver down -v --remove-orphans
}

case ${1:-} in
up | down | build | engine | base) "$1" ;;
compose)
    shift
    compose "$@"
    ;;
*) die "usage: docker/compose.sh up|down|build|engine|base|compose ARGS..." ;;
esac
