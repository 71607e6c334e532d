#!/usr/bin/env bash
# Build the images of the docker compose demo cluster from scratch, with no image registry:
#
#   1. fedcluster-base  a minimal Debian bookworm root filesystem made with debootstrap from
#                       Debian's mirror, with python3 + python3-venv, imported with
#                       `docker import` (skipped when the image exists)
#   2. wheelhouse       wheels of the project's runtime dependencies, downloaded on the host
#                       from PyPI for the base image's Python and platform (kept until the
#                       dependencies change), and the project's own wheel
#                       (docker/build/context, gitignored)
#   3. fedcluster       FROM fedcluster-base: a venv at /opt/venv installed offline from the
#                       wheelhouse (--no-index), the Flower app at /app (what `flwr run /app`
#                       submits), the demo scripts in /opt/fedcluster. The dependency stage
#                       is tagged fedcluster-deps: it is the cache that makes a rebuild after
#                       a code change take seconds. Each build is also tagged with a name of
#                       its own, fedcluster:b-<image id>, written to docker/build/image-tag:
#                       what this clone's tests run, whatever another clone's build does to
#                       the shared tag fedcluster (the compose files' default) meanwhile.
#
# Usage (as root, or `sudo bash docker/build.sh`: step 1 needs root for debootstrap):
#   bash docker/build.sh [--from-scratch]     # --from-scratch: redo steps 1 and 2 as well
#   bash docker/build.sh --check              # only check the prerequisites, build nothing
# Prerequisites (checked first; every missing one is named): a Docker engine that answers
# (Debian: apt-get install docker.io, then start dockerd), Docker Compose (the v2 plugin,
# `docker compose`, or v1: apt-get install docker-compose), debootstrap (apt-get install
# debootstrap) and root while the base image is to be made, a host python3 with venv, and
# network access to Debian's mirror and PyPI.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SUITE
# (bookworm), BASE_IMAGE (fedcluster-base), IMAGE (fedcluster), PYTHON (a host python3 with
# venv, for pip; default python3), FEDCLUSTER_BUILD_LOCK (/tmp/fedcluster-docker-build.lock:
# builds on one machine take turns on it). Only the build talks to the outside (Debian's mirror,
# PyPI); the images and the containers never do.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="$HERE/build"
CONTEXT="$BUILD/context"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SUITE="${DEBIAN_SUITE:-bookworm}"
BASE_IMAGE="${BASE_IMAGE:-fedcluster-base}"
IMAGE="${IMAGE:-fedcluster}"
IMAGE_REPO="$IMAGE"
[[ "${IMAGE##*/}" != *:* ]] || IMAGE_REPO="${IMAGE%:*}"  # IMAGE may carry a tag
PYTHON="${PYTHON:-python3}"
FROM_SCRATCH=0
CHECK_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --from-scratch) FROM_SCRATCH=1 ;;
        --check) CHECK_ONLY=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done

step_started=0
step() { step_started=$SECONDS; echo; echo "== $*"; }
done_step() { echo "   ($((SECONDS - step_started)) s)"; }

# --- prerequisites: every missing one is named, then the build stops ----------------------
missing=()
if ! command -v docker >/dev/null 2>&1; then
    missing+=("no 'docker' command: install a Docker engine (Debian: apt-get install docker.io) and start dockerd")
elif ! docker info >/dev/null 2>&1; then
    missing+=("no Docker engine answers ('docker info' fails): start dockerd (or: service docker start), or run as a user allowed to use it")
fi
if ! { command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; } && ! command -v docker-compose >/dev/null 2>&1; then
    missing+=("no Docker Compose: neither the v2 plugin ('docker compose version' fails) nor v1 'docker-compose' (Debian: apt-get install docker-compose)")
fi
needs_base=1
if [[ $FROM_SCRATCH == 0 ]] && command -v docker >/dev/null 2>&1 && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then needs_base=0; fi
if [[ $needs_base == 1 ]]; then
    command -v debootstrap >/dev/null 2>&1 || missing+=("no 'debootstrap' (needed to make the base image $BASE_IMAGE): apt-get install debootstrap")
    [[ $(id -u) == 0 ]] || missing+=("not root: debootstrap (base image $BASE_IMAGE) needs root; run as root or with sudo bash docker/build.sh")
fi
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=("no host python with venv and ensurepip ('$PYTHON'; Debian: apt-get install python3-venv, or set PYTHON)")
if (( ${#missing[@]} )); then
    echo "docker/build.sh: missing prerequisites:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    echo "The build also needs network access to $DEBIAN_MIRROR and PyPI." >&2
    exit 1
fi
if [[ $CHECK_ONLY == 1 ]]; then
    echo "docker/build.sh: prerequisites present (engine, compose$([[ $needs_base == 1 ]] && echo ", debootstrap, root")); the build also needs network access to $DEBIAN_MIRROR and PyPI"
    exit 0
fi
mkdir -p "$BUILD"
# One build at a time on this machine: builds beside each other (two clones) would prune each
# other's untagged layers in the middle of a build and race for the shared tags.
BUILD_LOCK="${FEDCLUSTER_BUILD_LOCK:-/tmp/fedcluster-docker-build.lock}"
if command -v flock >/dev/null 2>&1; then
    exec {build_lock}>>"$BUILD_LOCK"
    if ! flock -n "$build_lock"; then
        echo "== waiting for another docker/build.sh on this machine to finish ($BUILD_LOCK)"
        flock "$build_lock"
    fi
else
    echo "== no 'flock' (util-linux): not guarded against another build running beside this one" >&2
fi

# --- 1. the base image ---------------------------------------------------------------------
if [[ $FROM_SCRATCH == 1 ]] || ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    step "1/3 base image $BASE_IMAGE: debootstrap --variant=minbase $DEBIAN_SUITE + python3, python3-venv"
    ROOTFS="$BUILD/rootfs"
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include=python3,python3-venv "$DEBIAN_SUITE" "$ROOTFS" "$DEBIAN_MIRROR" > "$BUILD/debootstrap.log" 2>&1 \
        || { tail -20 "$BUILD/debootstrap.log" >&2; exit 1; }
    chroot "$ROOTFS" apt-get clean
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
    tar -C "$ROOTFS" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$ROOTFS"
    done_step
else
    echo "== 1/3 base image $BASE_IMAGE exists (pass --from-scratch to rebuild it)"
fi
IMAGE_PYTHON="$(docker run --rm "$BASE_IMAGE" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
ARCH="$(docker run --rm "$BASE_IMAGE" uname -m)"
GLIBC="$(docker run --rm "$BASE_IMAGE" getconf GNU_LIBC_VERSION | awk '{print $2}' | tr . _)"
echo "   base image: Python $IMAGE_PYTHON, $ARCH, glibc ${GLIBC/_/.}"

# --- 2. the wheelhouse -------------------------------------------------------------------------
step "2/3 wheelhouse (PyPI, for cp${IMAGE_PYTHON/./} manylinux_${GLIBC}_${ARCH})"
# The wheelhouse is kept between builds (see below); the rest of the context is restaged.
if [[ $FROM_SCRATCH == 1 ]]; then rm -rf "$CONTEXT"; fi
rm -rf "$CONTEXT/project" "$CONTEXT/app" "$CONTEXT/scripts"
mkdir -p "$CONTEXT/wheelhouse" "$CONTEXT/project" "$CONTEXT/app" "$CONTEXT/scripts"
# The Flower app as `flwr run /app` will submit it: the project without what never runs in
# a container (VCS, virtual environments, tests, benchmarks, outputs, this docker folder).
tar -C "$ROOT" \
    --exclude=./.git --exclude=./.venv --exclude=./venv --exclude=./.flwr-home --exclude=./outputs \
    --exclude=./docker --exclude=./tests --exclude=./bench --exclude=./graphs --exclude=./certs --exclude=./local-cluster --exclude=./.ci --exclude=./build --exclude=./dist \
    --exclude=.pytest_cache --exclude=__pycache__ --exclude='*.egg-info' --exclude='*.pyc' \
    -c . | tar -C "$CONTEXT/app" -x
cp "$HERE/run_job.py" "$HERE/make_demo_data.py" "$CONTEXT/scripts/"

HOSTVENV="$BUILD/host-venv"
[[ -x "$HOSTVENV/bin/pip" ]] || "$PYTHON" -m venv "$HOSTVENV"
PIP=("$HOSTVENV/bin/python" -m pip --disable-pip-version-check -q)
# Runtime requirements = the project's dependencies, with flwr's [simulation] extra dropped:
# the cluster never runs the simulation engine (Ray), and Ray is most of the install size.
TARGET="cp${IMAGE_PYTHON/./} manylinux_${GLIBC}_${ARCH}"
"$HOSTVENV/bin/python" - "$CONTEXT/app/pyproject.toml" "$TARGET" > "$BUILD/requirements.txt" <<'EOF'
import re, sys
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(f"# wheels for {sys.argv[2]}, from pyproject.toml's dependencies (written by docker/build.sh)")
for requirement in project["dependencies"]:
    print(re.sub(r"^(flwr)\[[^]]*\]", r"\1", requirement))
EOF
# Every manylinux tag the base image's glibc accepts (older pips do not expand them).
PLATFORMS=()
for minor in $(seq "${GLIBC#*_}" -1 5); do PLATFORMS+=(--platform "manylinux_2_${minor}_${ARCH}"); done
PLATFORMS+=(--platform "manylinux2014_${ARCH}" --platform "manylinux2010_${ARCH}" --platform "manylinux1_${ARCH}")
# Downloaded again only when the requirements or the target change (or --from-scratch): the
# same wheels, hence the same cached image dependency layer, until then.
if ! cmp -s "$BUILD/requirements.txt" "$CONTEXT/wheelhouse/requirements.txt"; then
    rm -rf "$CONTEXT/wheelhouse" && mkdir -p "$CONTEXT/wheelhouse"
    "${PIP[@]}" download --dest "$CONTEXT/wheelhouse" --only-binary=:all: \
        --python-version "$IMAGE_PYTHON" --implementation cp --abi "cp${IMAGE_PYTHON/./}" "${PLATFORMS[@]}" \
        -r "$BUILD/requirements.txt" > "$BUILD/pip.log" 2>&1 || { tail -20 "$BUILD/pip.log" >&2; exit 1; }
    cp "$BUILD/requirements.txt" "$CONTEXT/wheelhouse/requirements.txt"  # written last: marks it complete
else
    echo "   requirements unchanged: wheelhouse kept (--from-scratch downloads it again)"
fi
# The project's own (pure-Python) wheel, built from a scratch copy so the work tree stays
# clean; kept apart so a code change does not invalidate the image's dependency layer.
rm -rf "$BUILD/app-wheel-src"
cp -r "$CONTEXT/app" "$BUILD/app-wheel-src"
"${PIP[@]}" wheel --no-deps --wheel-dir "$CONTEXT/project" "$BUILD/app-wheel-src" >> "$BUILD/pip.log" 2>&1 || { tail -20 "$BUILD/pip.log" >&2; exit 1; }
rm -rf "$BUILD/app-wheel-src"
echo "   $(ls "$CONTEXT/wheelhouse"/*.whl | wc -l) wheels, $(du -sh "$CONTEXT/wheelhouse" | cut -f1), + $(basename "$CONTEXT"/project/*.whl)"
grep -v '^#' "$CONTEXT/wheelhouse/requirements.txt" | sed 's/^/   requires /'
done_step

# --- 3. the project image ------------------------------------------------------------------
step "3/3 image $IMAGE (FROM $BASE_IMAGE, offline pip install from the wheelhouse)"
: > "$BUILD/docker-build.log"
# The dependency stage is tagged ($IMAGE-deps) so that it stays the build cache of the next
# build; older, untagged copies of it are pruned below. The image is built under a name no
# other build uses (so it is never untagged, hence never pruned, by a build running beside
# this one), then tagged $IMAGE_REPO:b-<its id> (this build's own tag) and $IMAGE.
BUILDING="$IMAGE_REPO:building-$$-$RANDOM"
for target in "--target install -t $IMAGE-deps" "-t $BUILDING --iidfile $BUILD/image.id"; do
    # shellcheck disable=SC2086
    docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "$HERE/Dockerfile" $target "$CONTEXT" >> "$BUILD/docker-build.log" 2>&1 \
        || { tail -30 "$BUILD/docker-build.log" >&2; docker rmi "$BUILDING" >/dev/null 2>&1 || true; exit 1; }
done
IMAGE_ID="$(cat "$BUILD/image.id")"
IMAGE_ID="${IMAGE_ID#sha256:}"
BUILT="$IMAGE_REPO:b-${IMAGE_ID:0:12}"
docker tag "$BUILDING" "$BUILT"
docker tag "$BUILDING" "$IMAGE"
docker rmi "$BUILDING" >/dev/null  # only the temporary name: the image keeps its two tags
docker run --rm "$BUILT" python -c 'import flwr, numpy, scipy, sklearn, dp_accounting, fedcluster, fedcluster.server.app, fedcluster.client.app; print("   flwr", flwr.__version__, "| numpy", numpy.__version__, "| scipy", scipy.__version__, "| scikit-learn", sklearn.__version__)'
echo "$BUILT" > "$BUILD/image-tag"  # written once the image imports: the tests run this build
for stage in install image; do docker image prune -f --filter "label=fedcluster.stage=$stage" >/dev/null 2>&1 || true; done  # stale, untagged builds (housekeeping: a prune already running is fine)
for name in "$BASE_IMAGE" "$BUILT"; do echo "   $name: $(docker image inspect -f '{{.Size}}' "$name" | awk '{printf "%.0f MB", $1 / 1e6}')"; done
echo "   tagged $BUILT (this build, in docker/build/image-tag) and $IMAGE; earlier builds keep their b- tags (docker image ls $IMAGE_REPO)"
done_step
echo
echo "Built. Next: python3 docker/make_demo_data.py   (or: docker run --rm -v \"\$PWD/docker/data:/data\" $IMAGE python /opt/fedcluster/make_demo_data.py --out /data)"
echo "      then: docker compose up   (docker-compose up with Compose v1)"
