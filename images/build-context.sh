#!/usr/bin/env bash
# Build a fiberrl worker image from wheels prepared on this host (no network needed inside
# `docker build`).
#
#   bash images/build-context.sh cpu|cuda [TAG] [--force] [--context-only DIR] [docker build args...]
#
#   bash images/build-context.sh cpu fiberrl-worker:cpu --build-arg BASE=fiberrl-base:bookworm
#   bash images/build-context.sh cuda fiberrl-worker:cuda --build-arg BASE=fiberrl-base:bookworm
#   bash images/build-context.sh cuda my/worker:rl --build-arg EXTRAS=rl      # torch & co. too
#
# TAG defaults to fiberrl-worker:<flavor>. Every argument after the flavor and the tag goes to
# `docker build` unchanged (e.g. --build-arg BASE=..., --build-arg EXTRAS=..., --pull).
#
# The context (${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}/context-<flavor>) holds
#   Dockerfile            a copy of images/Dockerfile.<flavor>
#   wheels/               fiberrl's wheel (built from this checkout) and wheels of all its
#                         dependencies (plus those of EXTRAS), made with `pip wheel` on the host
#   wheels/constraints.txt  the host venv's exact versions (`pip freeze`), so that the image
#                         runs the same cloudpickle/numpy/... as the driver (pickles match)
# The image's Python is the host venv's major.minor (build arg PYTHON_VERSION), for the same
# reason: cloudpickle sends functions by value, and their bytecode differs between versions.
#
# The image is labelled fiberrl.source-hash=<hash of everything it is built from: setup.py,
# pyproject.toml, the packages' files, the Dockerfile, this script, the pins, the build args,
# the base image's id>. When TAG already carries that hash the build is skipped (--force
# rebuilds anyway), so re-running this is cheap.
#
# Environment:
#   FIBERRL_PYTHON        the host interpreter whose packages are pinned (default: ./.venv's)
#   FIBERRL_DOCKER_DIR    state dir, for the build context (default /var/tmp/fiberrl-docker)
#   DOCKER                the docker client (default: docker)
# Progress goes to stderr; the last line of stdout is the image tag.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
STATE=${FIBERRL_DOCKER_DIR:-/var/tmp/fiberrl-docker}
DOCKER=${DOCKER:-docker}

log() { echo "build-context: $*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }

[ $# -ge 1 ] || usage
FLAVOR=$1
shift
case "$FLAVOR" in
    cpu | cuda) ;;
    -h | --help) usage ;;
    *) die "flavor must be cpu or cuda, not '$FLAVOR'" ;;
esac
DOCKERFILE=$HERE/Dockerfile.$FLAVOR
[ -f "$DOCKERFILE" ] || die "missing $DOCKERFILE"

TAG=fiberrl-worker:$FLAVOR
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    TAG=$1
    shift
fi

FORCE=0
CONTEXT=$STATE/context-$FLAVOR
CONTEXT_ONLY=0
BUILD_ARGS=()
BASE=""
EXTRAS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1 ;;
        --context-only)
            [ $# -ge 2 ] || die "--context-only needs a directory"
            CONTEXT=$2
            CONTEXT_ONLY=1
            shift
            ;;
        --build-arg)
            [ $# -ge 2 ] || die "--build-arg needs a value"
            BUILD_ARGS+=("$1" "$2")
            case "$2" in BASE=*) BASE=${2#BASE=} ;; EXTRAS=*) EXTRAS=${2#EXTRAS=} ;; esac
            shift
            ;;
        --build-arg=*)
            BUILD_ARGS+=("$1")
            case "${1#--build-arg=}" in
                BASE=*) BASE=${1#--build-arg=BASE=} ;;
                EXTRAS=*) EXTRAS=${1#--build-arg=EXTRAS=} ;;
            esac
            ;;
        *) BUILD_ARGS+=("$1") ;;
    esac
    shift
done
# The Dockerfile's own default base, when none is given.
[ -n "$BASE" ] || BASE=$(sed -n 's/^ARG BASE=//p' "$DOCKERFILE" | head -1)

# The host interpreter whose versions the image copies.
PY=${FIBERRL_PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
command -v "$PY" >/dev/null || die "no host python '$PY' (set FIBERRL_PYTHON)"
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

mkdir -p "$STATE"
PINS=$(mktemp)
SRC=$(mktemp -d)
trap 'rm -rf "$PINS" "$SRC"' EXIT

# Exact versions of everything in the host venv (minus fiberrl itself).
"$PY" -m pip freeze --disable-pip-version-check --exclude fiberrl 2>/dev/null |
    grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' | LC_ALL=C sort >"$PINS" || true
for dep in cloudpickle psutil numpy; do
    grep -qi "^$dep==" "$PINS" || log "warning: $dep is not installed in $PY: its version is not pinned"
done

# The package directories setup.py ships (find_packages(include=[fiberrl, cpe, rl])).
PKGS=()
for d in fiberrl cpe rl; do [ -d "$ROOT/$d" ] && PKGS+=("$d"); done

source_hash() {
    local base_id
    base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$BASE" 2>/dev/null || echo "$BASE")
    {
        echo "flavor=$FLAVOR python=$PYVER base=$base_id extras=$EXTRAS"
        printf '%s\n' "${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"}"
        cat "$PINS"
        cd "$ROOT"
        {
            printf '%s\0' setup.py pyproject.toml
            find "${PKGS[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0
        } | LC_ALL=C sort -z | xargs -0 sha256sum
        sha256sum <"$DOCKERFILE"
        sha256sum <"$HERE/build-context.sh"
    } | sha256sum | cut -c1-16
}

# One build per flavor at a time (the context directory is shared).
exec 8>"$STATE/context-$FLAVOR.lock"
flock -w 1800 8 || die "another build of $FLAVOR holds $STATE/context-$FLAVOR.lock"

HASH=$(source_hash)
if [ "$CONTEXT_ONLY" = 0 ] && [ "$FORCE" = 0 ]; then
    have=$("$DOCKER" image inspect -f '{{index .Config.Labels "fiberrl.source-hash"}}' "$TAG" 2>/dev/null || true)
    if [ "$have" = "$HASH" ]; then
        log "$TAG is up to date (source hash $HASH)"
        echo "$TAG"
        exit 0
    fi
    [ -n "$have" ] && log "$TAG was built from other sources ($have): rebuilding"
fi

t0=$SECONDS
log "preparing the build context in $CONTEXT (python $PYVER, extras '${EXTRAS}')"
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT/wheels"
cp "$DOCKERFILE" "$CONTEXT/Dockerfile"
install -m 0644 "$PINS" "$CONTEXT/wheels/constraints.txt"

# pip, quiet, minus the warnings about missing local index directories (this machine's pip.conf).
pip_q() {
    "$PY" -m pip "$@" --disable-pip-version-check -q 2>&1 |
        grep -v 'is ignored: it is neither a file nor a directory' >&2
    return "${PIPESTATUS[0]}"
}

# fiberrl's wheel, built from a copy of the sources (so nothing is written into the checkout).
tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' \
    -cf - setup.py pyproject.toml README.md "${PKGS[@]}" | tar -C "$SRC" -xf -
pip_q wheel --no-deps "$SRC" -w "$CONTEXT/wheels" || die "could not build fiberrl's wheel"
WHEEL=$(ls "$CONTEXT"/wheels/fiberrl-*.whl | head -1)

# Wheels of every dependency (and of EXTRAS), at the host's versions.
REQ=$WHEEL
[ -z "$EXTRAS" ] || REQ="$WHEEL[$EXTRAS]"
pip_q wheel --prefer-binary -c "$CONTEXT/wheels/constraints.txt" -w "$CONTEXT/wheels" "$REQ" ||
    die "could not get the wheels of fiberrl's dependencies"
log "context ready in $((SECONDS - t0)) s: $(ls "$CONTEXT/wheels" | grep -c '\.whl$') wheels, $(du -sh "$CONTEXT" | cut -f1)"

if [ "$CONTEXT_ONLY" = 1 ]; then
    echo "$CONTEXT"
    exit 0
fi

t1=$SECONDS
log "building $TAG from $BASE"
# The classic builder: works with the Debian docker.io 20.10 daemon and with any client,
# without the buildx plugin.
BUILD_LOG=$STATE/build-$FLAVOR.log
OLD_ID=$("$DOCKER" image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
if ! DOCKER_BUILDKIT=0 "$DOCKER" build \
    --build-arg "PYTHON_VERSION=$PYVER" \
    "${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"}" \
    --label "fiberrl.source-hash=$HASH" \
    -t "$TAG" "$CONTEXT" >"$BUILD_LOG" 2>&1; then
    tail -n 40 "$BUILD_LOG" >&2
    die "docker build of $TAG failed (log: $BUILD_LOG)"
fi
# Drop what this rebuild left behind (no use as cache: the wheels change with every source
# change): the previous image of TAG, unless a container or another tag still uses it, and the
# untagged build stages.
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$("$DOCKER" image inspect -f '{{.Id}}' "$TAG")" ]; then
    "$DOCKER" rmi "$OLD_ID" >/dev/null 2>&1 || true
fi
"$DOCKER" image prune -f --filter "label=fiberrl.build-stage=$FLAVOR" >/dev/null 2>&1 || true
log "built $TAG in $((SECONDS - t1)) s ($("$DOCKER" image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$TAG"
