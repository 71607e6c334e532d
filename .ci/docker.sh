# Sourced by .ci/run: the Docker demo cluster's prerequisites for tests/engine/test_docker.py.
#
#   docker_ci_up    installs Debian's docker.io, docker-compose and debootstrap when absent,
#                   starts dockerd when no engine answers, builds the images (docker/build.sh)
#                   and exports FEDCLUSTER_DOCKER_TESTS=1, so that the demo tests fail rather
#                   than skip, and FEDCLUSTER_DOCKER_RUN, this run's id: the tests name their
#                   compose projects fedclustertest-<id>-*. Any step that cannot be done stops
#                   CI with the reason.
#   docker_ci_down  (the EXIT trap) removes what this run's tests left behind (containers,
#                   networks and volumes of the projects fedclustertest-<id>-*, never another
#                   run's) and stops the dockerd a CI run started once no other run uses it.
#
# Runs on one machine (two clones, two CI runs) share one engine. Each holds a shared lock on
# $DOCKER_CI_STATE/users.lock while it uses it; packages are installed and the engine started
# under an exclusive start.lock (one apt-get and one dockerd at a time); the pid of a dockerd
# started here is kept in dockerd.pid, and the run that leaves last (it gets users.lock
# exclusively) stops it. A dockerd no CI run started is never stopped.
#
# FEDCLUSTER_DOCKER_TESTS=0 skips all of it (and the tests skip): for a machine that cannot
# run a Docker engine (no root, no kernel support), said explicitly.

DOCKER_CI_STATE="${FEDCLUSTER_DOCKER_CI_STATE:-${TMPDIR:-/tmp}/fedcluster-docker-ci}"
DOCKER_CI_USERS_FD=""

docker_ci_fail() {
    echo "CI: the Docker demo cannot run: $*" >&2
    echo "CI: (on a machine that cannot run a Docker engine, set FEDCLUSTER_DOCKER_TESTS=0 to skip it)" >&2
    exit 1
}

# The dockerd a CI run started, when it still runs: its pid, else nothing.
docker_ci_dockerd() {
    local pid="" comm=""
    [[ -f "$DOCKER_CI_STATE/dockerd.pid" ]] && read -r pid < "$DOCKER_CI_STATE/dockerd.pid" || true
    [[ "$pid" =~ ^[0-9]+$ ]] && read -r comm < "/proc/$pid/comm" 2>/dev/null || true
    if [[ "$comm" == dockerd ]]; then echo "$pid"; fi
}

# Packages and the engine, one run at a time (the caller holds start.lock).
docker_ci_engine() {
    local packages=() log="$DOCKER_CI_STATE/apt.log" pid waited=0
    command -v dockerd >/dev/null 2>&1 || packages+=(docker.io)
    { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || packages+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || packages+=(debootstrap)
    if (( ${#packages[@]} )); then
        [[ $(id -u) == 0 ]] || docker_ci_fail "${packages[*]} missing and not root to install them"
        echo "== docker: apt-get install ${packages[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "${packages[@]}" > "$log" 2>&1 \
            || { apt-get update -q >> "$log" 2>&1 && apt-get install -y -q "${packages[@]}" >> "$log" 2>&1; } \
            || { tail -20 "$log" >&2; docker_ci_fail "apt-get install ${packages[*]} failed"; }
    fi
    docker info >/dev/null 2>&1 && return 0
    [[ $(id -u) == 0 ]] || docker_ci_fail "no Docker engine answers and not root to start dockerd"
    echo "== docker: starting dockerd (log: $DOCKER_CI_STATE/dockerd.log)"
    # without the lock files: the engine must not hold a run's locks
    dockerd > "$DOCKER_CI_STATE/dockerd.log" 2>&1 9>&- {DOCKER_CI_USERS_FD}>&- &
    pid=$!
    echo "$pid" > "$DOCKER_CI_STATE/dockerd.pid"
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null || (( waited >= 60 )); then
            tail -20 "$DOCKER_CI_STATE/dockerd.log" >&2
            docker_ci_fail "dockerd did not start (see its log above)"
        fi
        sleep 1; waited=$((waited + 1))
    done
}

docker_ci_up() {
    if [[ "${FEDCLUSTER_DOCKER_TESTS:-}" == 0 ]]; then
        echo "== docker: FEDCLUSTER_DOCKER_TESTS=0, the Docker demo is skipped"
        return 0
    fi
    local started=$SECONDS
    mkdir -p "$DOCKER_CI_STATE"
    export FEDCLUSTER_DOCKER_RUN="${FEDCLUSTER_DOCKER_RUN:-$(printf 'ci%x%04x%04x' $$ $RANDOM $RANDOM)}"
    exec {DOCKER_CI_USERS_FD}>>"$DOCKER_CI_STATE/users.lock"
    flock -s "$DOCKER_CI_USERS_FD"
    { flock -x 9; docker_ci_engine; } 9>>"$DOCKER_CI_STATE/start.lock"
    echo "== docker: engine $(docker version --format '{{.Server.Version}}'), compose: $(docker compose version --short 2>/dev/null || docker-compose version --short); this run's projects: fedclustertest-$FEDCLUSTER_DOCKER_RUN-*"
    bash docker/build.sh || docker_ci_fail "docker/build.sh failed (its output is above)"
    export FEDCLUSTER_DOCKER_TESTS=1
    echo "== docker: ready in $((SECONDS - started)) s"
}

docker_ci_down() {
    [[ -n "$DOCKER_CI_USERS_FD" ]] || return 0  # docker_ci_up skipped or never reached the engine
    local project ids pid waited=0
    if docker info >/dev/null 2>&1; then
        for project in $( { docker ps -a --format '{{.Label "com.docker.compose.project"}}'
                            docker network ls --format '{{.Label "com.docker.compose.project"}}'
                            docker volume ls --format '{{.Label "com.docker.compose.project"}}'; } \
                          | grep "^fedclustertest-$FEDCLUSTER_DOCKER_RUN-" | sort -u); do
            echo "== docker: removing what the test left of $project"
            ids=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
            [[ -z "$ids" ]] || docker rm -f $ids >/dev/null 2>&1 || true
            ids=$(docker network ls -q --filter "label=com.docker.compose.project=$project")
            [[ -z "$ids" ]] || docker network rm $ids >/dev/null 2>&1 || true
            ids=$(docker volume ls -q --filter "label=com.docker.compose.project=$project")
            [[ -z "$ids" ]] || docker volume rm $ids >/dev/null 2>&1 || true
        done
    fi
    flock -u "$DOCKER_CI_USERS_FD"
    exec {DOCKER_CI_USERS_FD}>&-
    DOCKER_CI_USERS_FD=""
    {
        if ! flock -xn 8; then
            echo "== docker: another run on this machine still uses the engine: it stops it when it leaves"
        elif pid=$(docker_ci_dockerd) && [[ -n "$pid" ]]; then
            echo "== docker: stopping the dockerd CI started"
            kill "$pid" 2>/dev/null || true
            while kill -0 "$pid" 2>/dev/null && (( waited < 30 )); do sleep 1; waited=$((waited + 1)); done
            kill -9 "$pid" 2>/dev/null || true
            rm -f "$DOCKER_CI_STATE/dockerd.pid"
        fi
    } 8>>"$DOCKER_CI_STATE/users.lock"
}
