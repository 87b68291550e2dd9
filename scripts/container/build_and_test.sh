#!/usr/bin/env bash
# Builds the runtime image (Containerfile) with podman and checks it on a real engine:
# it reports the image's size and the time from `podman run` to a healthy /health, checks
# that the server runs as a non-root user, answers a completion, and passes its own
# HEALTHCHECK. Needs no image registry: with BASE unset, the base image is made here with
# debootstrap from Debian's packages (bookworm: Python 3.11, as the wheel built here must match).
#
#   scripts/container/build_and_test.sh ENGINE_DIR
#
# Environment: BASE (an image to build on instead; its Python must match this one's),
# WORK (a directory for the rootfs and build context; default a fresh temporary one),
# MIRROR (the Debian mirror; default deb.debian.org), PORT (host port; default 18000),
# PODMAN_FLAGS (global podman flags, e.g. "--storage-driver=vfs" where overlay is unavailable),
# CONTAINER_FLAGS (flags for every container podman build and run start). A sandbox that drops
# CAP_SYS_RESOURCE cannot raise the containers' rlimits to podman's defaults, and crun refuses
# hybrid cgroups (v1 with a v2 unified mount); there, use runc and limits at or below the host's:
#   CONTAINER_FLAGS="--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096"
set -euo pipefail

ENGINE=$(realpath "${1:?usage: $0 ENGINE_DIR}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-$(mktemp -d)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PORT=${PORT:-18000}
IMAGE=localhost/bessemer:test
NAME=bessemer-image-test
PYTHON=${PYTHON:-python3}
read -r -a PODMAN_GLOBAL <<< "${PODMAN_FLAGS:-}"
read -r -a CONTAINER <<< "${CONTAINER_FLAGS:-}"
podman() { command podman "${PODMAN_GLOBAL[@]}" "$@"; }
step() { printf '\n== %s\n' "$*"; }

[ -f "$ENGINE/config.json" ] || { echo "error: $ENGINE is not an engine directory (no config.json); build one with build-engine" >&2; exit 2; }
command -v podman >/dev/null || { echo "error: podman is not installed (apt-get install podman)" >&2; exit 2; }

if [ -z "${BASE:-}" ]; then
    BASE=localhost/bessemer-base:bookworm
    if ! podman image exists "$BASE"; then
        command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 2; }
        step "base image $BASE: debootstrap bookworm (minbase + python3, python3-venv, libgomp1)"
        rm -rf "$WORK/rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,libgomp1,ca-certificates bookworm "$WORK/rootfs" "$MIRROR" \
            > "$WORK/debootstrap.log"
        rm -rf "$WORK/rootfs"/var/cache/apt/archives/*.deb "$WORK/rootfs"/var/lib/apt/lists/*
        tar -C "$WORK/rootfs" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$BASE" > /dev/null
    fi
fi

step "build context: the bessemer wheel and its dependencies' wheels"
want=$(podman run --rm "${CONTAINER[@]}" "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$want" = "$have" ] || { echo "error: $BASE has Python $want but the wheel would be built for $have; set PYTHON to a python$want" >&2; exit 2; }
CONTEXT="$WORK/context"
rm -rf "$CONTEXT" && mkdir -p "$CONTEXT/wheels"
cp "$REPO/Containerfile" "$CONTEXT/"
# from a copy of the working tree: pip builds in the tree, and the checkout's build/ stays its own
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
tar -C "$REPO" --exclude=./.git --exclude=./build --exclude='*.so' --exclude=__pycache__ -c . | tar -C "$WORK/src" -x
BESSEMER_BUILD_JOBS=${BESSEMER_BUILD_JOBS:-2} "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation \
    -w "$CONTEXT/wheels" "$WORK/src"
"$PYTHON" -m pip wheel -q -w "$CONTEXT/wheels" "$(ls "$CONTEXT"/wheels/bessemer-*.whl)[serve]"

step "podman build (BASE=$BASE)"
start=$(date +%s)
podman build -q "${CONTAINER[@]}" --format docker --build-arg BASE="$BASE" -t "$IMAGE" "$CONTEXT" > /dev/null
echo "built in $(( $(date +%s) - start )) s"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
base_size=$(podman image inspect --format '{{.Size}}' "$BASE")
echo "image size: $(( size / 1000000 )) MB (base $(( base_size / 1000000 )) MB, bessemer and its dependencies $(( (size - base_size) / 1000000 )) MB)"

step "podman run on $ENGINE"
podman rm -f "$NAME" > /dev/null 2>&1 || true
trap 'podman rm -f "$NAME" > /dev/null 2>&1 || true' EXIT
t0=$(date +%s.%N)
podman run -d "${CONTAINER[@]}" --name "$NAME" -p "127.0.0.1:$PORT:8000" -v "$ENGINE:/engine:ro" "$IMAGE" --model-name engine --threads 2 > /dev/null
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    if [ "$(podman inspect --format '{{.State.Running}}' "$NAME")" != true ]; then
        echo "error: the container exited:" >&2; podman logs "$NAME" >&2; exit 1
    fi
    if (( $(echo "$(date +%s.%N) - $t0 > 300" | bc) )); then
        echo "error: /health not healthy after 300 s:" >&2; podman logs "$NAME" >&2; exit 1
    fi
    sleep 0.2
done
printf 'start to healthy /health: %.1f s\n' "$(echo "$(date +%s.%N) - $t0" | bc)"

uid=$(podman exec "$NAME" id -u)
echo "server runs as uid $uid"
[ "$uid" != 0 ] || { echo "error: the server runs as root" >&2; exit 1; }
curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
    -d '{"model": "engine", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' | head -c 400
echo
podman exec "$NAME" python3 -c 'import importlib.util as u; print("torch in the image:", u.find_spec("torch") is not None)'
podman healthcheck run "$NAME" && echo "HEALTHCHECK: healthy"
podman stop -t 30 "$NAME" > /dev/null
echo "exit code after SIGTERM: $(podman inspect --format '{{.State.ExitCode}}' "$NAME")"
