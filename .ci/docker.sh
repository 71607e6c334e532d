# Sourced by .ci/run: the Docker demo cluster's prerequisites for tests/engine/test_docker.py.
#
#   docker_ci_up    installs Debian's docker.io, docker-compose and debootstrap when absent,
#                   starts dockerd when no engine answers, builds the images (docker/build.sh)
#                   and exports FEDCLUSTER_DOCKER_TESTS=1, so that the demo tests fail rather
#                   than skip. Any step that cannot be done stops CI with the reason.
#   docker_ci_down  (the EXIT trap) removes what a test left behind (containers and networks
#                   of compose projects named fedclustertest*) and stops the dockerd it started.
#
# FEDCLUSTER_DOCKER_TESTS=0 skips all of it (and the tests skip): for a machine that cannot
# run a Docker engine (no root, no kernel support), said explicitly.

DOCKERD_PID=""
DOCKERD_LOG="${TMPDIR:-/tmp}/fedcluster-ci-dockerd.log"

docker_ci_fail() {
    echo "CI: the Docker demo cannot run: $*" >&2
    echo "CI: (on a machine that cannot run a Docker engine, set FEDCLUSTER_DOCKER_TESTS=0 to skip it)" >&2
    exit 1
}

docker_ci_up() {
    if [[ "${FEDCLUSTER_DOCKER_TESTS:-}" == 0 ]]; then
        echo "== docker: FEDCLUSTER_DOCKER_TESTS=0, the Docker demo is skipped"
        return 0
    fi
    local started=$SECONDS packages=()
    command -v dockerd >/dev/null 2>&1 || packages+=(docker.io)
    { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || packages+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || packages+=(debootstrap)
    if (( ${#packages[@]} )); then
        [[ $(id -u) == 0 ]] || docker_ci_fail "${packages[*]} missing and not root to install them"
        echo "== docker: apt-get install ${packages[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "${packages[@]}" > "${TMPDIR:-/tmp}/fedcluster-ci-apt.log" 2>&1 \
            || { apt-get update -q >> "${TMPDIR:-/tmp}/fedcluster-ci-apt.log" 2>&1 && apt-get install -y -q "${packages[@]}" >> "${TMPDIR:-/tmp}/fedcluster-ci-apt.log" 2>&1; } \
            || { tail -20 "${TMPDIR:-/tmp}/fedcluster-ci-apt.log" >&2; docker_ci_fail "apt-get install ${packages[*]} failed"; }
    fi
    if ! docker info >/dev/null 2>&1; then
        [[ $(id -u) == 0 ]] || docker_ci_fail "no Docker engine answers and not root to start dockerd"
        echo "== docker: starting dockerd (log: $DOCKERD_LOG)"
        dockerd > "$DOCKERD_LOG" 2>&1 &
        DOCKERD_PID=$!
        local waited=0
        until docker info >/dev/null 2>&1; do
            if ! kill -0 "$DOCKERD_PID" 2>/dev/null || (( waited >= 60 )); then
                tail -20 "$DOCKERD_LOG" >&2
                docker_ci_fail "dockerd did not start (see its log above)"
            fi
            sleep 1; waited=$((waited + 1))
        done
    fi
    echo "== docker: engine $(docker version --format '{{.Server.Version}}'), compose: $(docker compose version --short 2>/dev/null || docker-compose version --short)"
    bash docker/build.sh || docker_ci_fail "docker/build.sh failed (its output is above)"
    export FEDCLUSTER_DOCKER_TESTS=1
    echo "== docker: ready in $((SECONDS - started)) s"
}

docker_ci_down() {
    local project ids
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        for project in $(docker ps -a --format '{{.Label "com.docker.compose.project"}}' | grep '^fedclustertest' | sort -u); do
            echo "== docker: removing what the test left of $project"
            ids=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
            [[ -z "$ids" ]] || docker rm -f $ids >/dev/null 2>&1 || true
            docker network rm "${project}_default" >/dev/null 2>&1 || true
        done
    fi
    if [[ -n "$DOCKERD_PID" ]] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
        echo "== docker: stopping the dockerd CI started"
        kill "$DOCKERD_PID" 2>/dev/null || true
        local waited=0
        while kill -0 "$DOCKERD_PID" 2>/dev/null && (( waited < 30 )); do sleep 1; waited=$((waited + 1)); done
        kill -9 "$DOCKERD_PID" 2>/dev/null || true
    fi
}
