#!/usr/bin/env bash
# Undo scripts/docker-up.sh.
#
#   bash scripts/docker-down.sh            # containers gone, dockerd stopped (if ours)
#   bash scripts/docker-down.sh --purge    # ... and the fiberrl images and cached files too
#
# Removes every container labelled fiberrl.run (whatever its value), then stops dockerd only
# if docker-up.sh started it (the PID in $STATE/started.pid, STATE being
# ${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}), waits until it is gone, and removes that
# marker. A daemon docker-up found already running is left alone. Images, Docker's data
# (/var/lib/docker) and the cached base rootfs ($STATE/base-bookworm.tar) are kept, so the
# next docker-up.sh takes seconds.
#
# --purge also removes the images fiberrl-worker:cpu, fiberrl-worker:cuda,
# fiberrl-base:bookworm (and dangling build stages of them), the cached rootfs tarball, the
# build contexts and logs under $STATE. The next docker-up.sh then runs debootstrap again.
#
# Nothing up: does nothing, exit 0.
set -euo pipefail

STATE=${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}
export DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}
STARTED_MARK=$STATE/started.pid

PURGE=0
for arg in "$@"; do
    case "$arg" in
        --purge) PURGE=1 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "docker-down: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done

log() { echo "docker-down: $*" >&2; }

# Wait for a docker-up that is still starting or building (it holds this lock).
if [ -d "$STATE" ]; then
    exec 9>"$STATE/lock"
    flock -w 900 9 || { log "error: a docker-up still holds $STATE/lock after 900 s"; exit 1; }
fi

# alive PID: the process exists and is not a zombie (an init that does not reap leaves those).
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

live_dockerd() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] &&
        echo "$pid"
}

if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
    ids=$(docker ps -aq --filter label=fiberrl.run)
    if [ -n "$ids" ]; then
        log "removing $(echo "$ids" | wc -l) fiberrl container(s)"
        # shellcheck disable=SC2086
        docker rm -f $ids >/dev/null || log "warning: some containers could not be removed"
    fi
    if [ "$PURGE" = 1 ]; then
        for img in fiberrl-worker:cpu fiberrl-worker:cuda fiberrl-base:bookworm; do
            if docker image inspect "$img" >/dev/null 2>&1; then
                log "removing image $img"
                docker rmi -f "$img" >/dev/null || log "warning: could not remove $img"
            fi
        done
        dangling=$( (docker images -q --filter dangling=true --filter label=fiberrl.build-stage
            docker images -q --filter dangling=true \
                --filter label=org.opencontainers.image.title=fiberrl-worker) | sort -u)
        # shellcheck disable=SC2086
        [ -z "$dangling" ] || docker rmi -f $dangling >/dev/null 2>&1 || true
    fi
elif [ "$PURGE" = 1 ]; then
    log "no docker daemon answers: images (if any) are left in place"
fi

if pid=$(live_dockerd "$STARTED_MARK"); then
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 30))
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if alive "$pid"; then
        log "dockerd still runs after 30 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while alive "$pid"; do sleep 0.1; done
        # Its containerd (dockerd stops it on a clean shutdown) would outlive it.
        cpid=$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null || true)
        if [ -n "$cpid" ] && alive "$cpid" && [ "$(cat "/proc/$cpid/comm")" = containerd ]; then
            kill -TERM "$cpid" 2>/dev/null || true
        fi
    fi
    log "dockerd stopped"
fi
rm -f "$STARTED_MARK"

if [ "$PURGE" = 1 ] && [ -d "$STATE" ]; then
    log "removing the cached rootfs, build contexts and logs under $STATE"
    rm -rf "$STATE"/base-bookworm.tar "$STATE"/base-bookworm.tar.tmp "$STATE"/rootfs.tmp \
        "$STATE"/context-*/ "$STATE"/*.log
fi
exit 0
