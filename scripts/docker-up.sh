#!/usr/bin/env bash
# Bring up Docker on this machine (as root; Debian's docker.io 20.10) and the fiberrl images.
#
#   bash scripts/docker-up.sh
#   eval "$(bash scripts/docker-up.sh | tail -1)"      # sets DOCKER_HOST
#
# 1. Installs docker.io (and, when the base image has to be made, debootstrap) from Debian if
#    missing.
# 2. Starts dockerd in the background (setsid; log, pid file and the "we started it" marker
#    under the state dir ${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}) unless a daemon
#    already answers `docker info`; waits until it answers (${FIBERRL_DOCKER_TIMEOUT:-60} s).
# 3. Ensures the images, building what is missing:
#      fiberrl-base:bookworm  minimal Debian 12 (debootstrap --variant=minbase, with python3,
#                             python3-venv, ca-certificates), imported with `docker import`. The
#                             rootfs tarball is cached as $STATE/base-bookworm.tar, so a
#                             re-run (even after --purge of the images only) skips debootstrap.
#      fiberrl-worker:cpu     images/Dockerfile.cpu on that base, via images/build-context.sh;
#                             rebuilt when fiberrl's sources, its pinned deps or the Dockerfile
#                             change (label fiberrl.source-hash).
# Idempotent and quick when everything is there. Progress goes to stderr; the last line of
# stdout is `export DOCKER_HOST=unix:///var/run/docker.sock`. scripts/docker-down.sh stops
# the daemon again (only if this script started it).
#
# Environment: FIBERRL_DOCKER_DIR (state dir), FIBERRL_DOCKER_TIMEOUT (s to wait for dockerd),
# FIBERRL_DEBIAN_MIRROR (debootstrap's mirror; default the one apt uses, else deb.debian.org),
# DOCKER_HOST (a daemon to use instead of starting one).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
STATE=${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}
TIMEOUT=${FIBERRL_DOCKER_TIMEOUT:-60}
SOCK=/var/run/docker.sock
export DOCKER_HOST=${DOCKER_HOST:-unix://$SOCK}

BASE_IMAGE=fiberrl-base:bookworm
WORKER_IMAGE=fiberrl-worker:cpu
BASE_TAR=$STATE/base-bookworm.tar
DOCKERD_LOG=$STATE/dockerd.log
DOCKERD_PID=$STATE/dockerd.pid    # written by dockerd itself (--pidfile)
STARTED_MARK=$STATE/started.pid   # our marker: the PID of the dockerd this script started

log() { echo "docker-up: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$STATE"
# One docker-up at a time (concurrent CI steps, or an engineer and a test run).
exec 9>"$STATE/lock"
flock -w 900 9 || die "another docker-up holds $STATE/lock"

apt_install() {
    local t0=$SECONDS aptlog=$STATE/apt.log
    log "installing $* from Debian (log: $aptlog)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"; } \
        >"$aptlog" 2>&1; then
        tail -n 30 "$aptlog" >&2
        die "could not install $*"
    fi
    log "installed $* in $((SECONDS - t0)) s"
}

docker_answers() { timeout 20 docker info >/dev/null 2>&1; }

# alive PID: the process exists and is not a zombie.
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# live_dockerd FILE: the PID in FILE if it is a running dockerd.
live_dockerd() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] &&
        echo "$pid"
}

ensure_dockerd() {
    if docker_answers; then
        if live_dockerd "$STARTED_MARK" >/dev/null; then
            log "dockerd (started by docker-up, pid $(cat "$STARTED_MARK")) answers at $DOCKER_HOST"
        else
            rm -f "$STARTED_MARK"
            log "a docker daemon already answers at $DOCKER_HOST: using it"
        fi
        return 0
    fi
    rm -f "$STARTED_MARK"
    if [ "$DOCKER_HOST" != "unix://$SOCK" ]; then
        die "DOCKER_HOST=$DOCKER_HOST does not answer (unset it to start a local dockerd)"
    fi
    # The Debian package brings dockerd, containerd, runc, iptables and /usr/bin/docker.
    command -v dockerd >/dev/null && command -v docker >/dev/null || apt_install docker.io
    if pid=$(live_dockerd "$DOCKERD_PID"); then
        die "dockerd (pid $pid) runs but does not answer at $DOCKER_HOST; see $DOCKERD_LOG"
    fi
    # A stale pid file (dead process) is fine for dockerd; one naming a live non-dockerd
    # process (PID reuse) would stop it from starting.
    rm -f "$DOCKERD_PID"
    log "starting dockerd (log: $DOCKERD_LOG)"
    local t0=$SECONDS
    echo "=== $(date -Is) docker-up.sh starts dockerd" >>"$DOCKERD_LOG"
    setsid dockerd --host="unix://$SOCK" --pidfile="$DOCKERD_PID" \
        </dev/null >>"$DOCKERD_LOG" 2>&1 9>&- &
    local spawned=$!
    local deadline=$((SECONDS + TIMEOUT))
    until docker_answers; do
        if ! alive "$spawned"; then
            tail -n 40 "$DOCKERD_LOG" >&2
            die "dockerd exited during start-up (log: $DOCKERD_LOG)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$DOCKERD_LOG" >&2
            die "dockerd does not answer after $TIMEOUT s (log: $DOCKERD_LOG)"
        fi
        sleep 0.2
    done
    # setsid execs dockerd in place (the background job is no process-group leader), so the
    # spawned PID is dockerd's; dockerd's own pid file says the same.
    live_dockerd "$DOCKERD_PID" >"$STARTED_MARK" || echo "$spawned" >"$STARTED_MARK"
    log "dockerd up (pid $(cat "$STARTED_MARK")) in $((SECONDS - t0)) s"
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# debian_mirror: the mirror apt uses here (so debootstrap goes where apt goes).
debian_mirror() {
    if [ -n "${FIBERRL_DEBIAN_MIRROR:-}" ]; then echo "$FIBERRL_DEBIAN_MIRROR"; return; fi
    local m
    m=$(grep -hE '^URIs:.*/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 |
        awk '{print $2}')
    [ -n "$m" ] || m=$(grep -hE '^deb .*/debian/? bookworm' /etc/apt/sources.list 2>/dev/null |
        head -1 | awk '{print $2}')
    echo "${m:-http://deb.debian.org/debian}"
}

ensure_base_tar() {
    [ -s "$BASE_TAR" ] && return 0
    command -v debootstrap >/dev/null || apt_install debootstrap
    local mirror rootfs=$STATE/rootfs.tmp t0=$SECONDS
    mirror=$(debian_mirror)
    log "debootstrap bookworm from $mirror (takes minutes; log: $STATE/debootstrap.log)"
    rm -rf "$rootfs"
    if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$mirror" >"$STATE/debootstrap.log" 2>&1; then
        tail -n 30 "$STATE/debootstrap.log" >&2
        rm -rf "$rootfs"
        die "debootstrap failed"
    fi
    log "debootstrap done in $((SECONDS - t0)) s"
    # Trim what a container never needs: downloaded .debs, apt lists, docs, man pages,
    # message catalogs (33 MB; containers run with LANG=C.UTF-8).
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
        "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log "$rootfs"/debootstrap
    find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias \
        -exec rm -rf {} +
    tar --numeric-owner -C "$rootfs" -cf "$BASE_TAR.tmp" .
    mv "$BASE_TAR.tmp" "$BASE_TAR"
    rm -rf "$rootfs"
    log "cached the rootfs as $BASE_TAR ($(du -h "$BASE_TAR" | cut -f1))"
}

ensure_base_image() {
    have_image "$BASE_IMAGE" && return 0
    ensure_base_tar
    log "importing $BASE_IMAGE from $BASE_TAR"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'LABEL org.opencontainers.image.title=fiberrl-base' \
        --change 'CMD ["/bin/bash"]' \
        "$BASE_TAR" "$BASE_IMAGE" >/dev/null || die "docker import failed"
}

ensure_worker_image() {
    # build-context.sh skips the build when the image's fiberrl.source-hash label matches.
    # With the docker and kubernetes clients, so a master can run in the image too
    # (`fiberrl run --backend docker` starts its own containers from inside one).
    bash "$ROOT/images/build-context.sh" cpu "$WORKER_IMAGE" \
        --build-arg "BASE=$BASE_IMAGE" --build-arg "EXTRAS=docker,kubernetes" >/dev/null
}

T0=$SECONDS
ensure_dockerd
ensure_base_image
ensure_worker_image
log "ready in $((SECONDS - T0)) s: $(docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' |
    grep -E '^fiberrl-(base|worker):' | tr '\n' ' ')"
echo "export DOCKER_HOST=$DOCKER_HOST"
