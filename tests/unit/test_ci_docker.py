""".ci/docker.sh, the CI step that starts a Docker engine for the demo cluster test.

Run with a PATH holding only what the test puts there: stand-in ``docker``, ``dockerd``,
``apt-get``, ``id`` ... decide what is present and record what was called; a stand-in
``docker/build.sh`` in a scratch folder stands for the build. Nothing real is installed,
started or built."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_DOCKER = ROOT / ".ci" / "docker.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

HARNESS = f"""set -euo pipefail
. {CI_DOCKER}
trap docker_ci_down EXIT
docker_ci_up
echo "TESTS=${{FEDCLUSTER_DOCKER_TESTS:-unset}}"
"""


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


def run_step(
    tmp_path: Path,
    *,
    dockerd: str | None = "ok",
    packages: bool = True,
    uid: int = 0,
    env: dict | None = None,
    projects: tuple[str, ...] = (),
    name: str = "run",
):
    """dockerd: None (not installed), "dies" (exits at once), "ok" (the engine answers once it
    runs). packages: docker-compose and debootstrap present. projects: the compose projects
    the engine holds (each has a container, a network and a volume named "<kind>-<project>").
    Calls with other ``name``s in one ``tmp_path`` are other CI runs on the same machine.
    Returns (process, calls log, engine marker)."""
    bin_dir, work, calls = tmp_path / "bin", tmp_path / name, tmp_path / f"calls-{name}.log"
    (work / "docker").mkdir(parents=True)
    calls.write_text("")
    log = f'echo "$(basename "$0") $*" >> {calls}'
    up = tmp_path / "engine-up"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("bash", "basename", "sleep", "grep", "sort", "tail", "cat", "touch", "rm", "mkdir", "flock"):
        if not (bin_dir / tool).exists():
            os.symlink(shutil.which(tool), bin_dir / tool)
    _script(bin_dir / "id", f"echo {uid}")
    _script(bin_dir / "apt-get", log)
    # the engine answers while the stand-in dockerd runs (it holds the marker file)
    listed = "".join(f"echo {project}; " for project in projects)
    _script(
        bin_dir / "docker",
        f"""{log}
last="${{@: -1}}"
case "$1" in
    info) [ -e {up} ];;
    version) echo 20.10;;
    compose) exit 1;;
    ps|network|volume)
        case "$*" in
            *--format*) {listed}:;;
            *--filter*) kind="$1"; [ "$kind" != ps ] || kind=container; echo "$kind-${{last##*=}}";;
        esac;;
    *) exit 0;;
esac""",
    )
    if dockerd == "dies":
        _script(bin_dir / "dockerd", f'{log}\necho "failed to start daemon: no cgroups" >&2; exit 1')
    elif dockerd == "ok":
        _script(
            bin_dir / "dockerd", f'{log}\ntouch {up}\ntrap "rm -f {up}; exit 0" TERM\nwhile true; do sleep 0.2; done'
        )
    if packages:
        _script(bin_dir / "docker-compose", "echo 1.29.2")
        _script(bin_dir / "debootstrap", "exit 0")
    _script(work / "docker" / "build.sh", f'echo "build.sh $*" >> {calls}')
    done = subprocess.run(
        [str(bin_dir / "bash"), "-c", HARNESS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **(env or {})},
    )
    return done, calls.read_text(), up


def stop_stand_in_engine(tmp_path: Path) -> None:
    pid_file = tmp_path / "fedcluster-docker-ci" / "dockerd.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 9)
        except ProcessLookupError:
            pass


def test_it_starts_an_engine_builds_and_makes_the_docker_tests_required_then_stops_the_engine(tmp_path):
    done, calls, up = run_step(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "TESTS=1" in done.stdout
    assert "dockerd " in calls and "build.sh" in calls
    assert "apt-get" not in calls  # everything was there
    assert "stopping the dockerd CI started" in done.stdout
    assert not up.exists()  # the stand-in engine was stopped (its TERM handler removed the marker)


def test_missing_packages_are_installed_with_apt_get(tmp_path):
    done, calls, _ = run_step(tmp_path, dockerd="ok", packages=False)
    assert done.returncode == 0, done.stderr
    assert "apt-get install -y -q docker-compose debootstrap" in calls


def test_an_engine_that_cannot_start_fails_ci_with_the_reason(tmp_path):
    done, calls, _ = run_step(tmp_path, dockerd="dies")
    assert done.returncode == 1
    assert "dockerd did not start" in done.stderr and "no cgroups" in done.stderr  # its log is shown
    assert "FEDCLUSTER_DOCKER_TESTS=0" in done.stderr  # and how to skip on such a machine
    assert "build.sh" not in calls and "TESTS=" not in done.stdout


def test_not_root_without_an_engine_fails_with_the_reason(tmp_path):
    done, calls, _ = run_step(tmp_path, dockerd=None, uid=1000)
    assert done.returncode == 1
    assert "not root" in done.stderr and "docker.io" in done.stderr
    assert "apt-get" not in calls


def test_an_explicit_zero_skips_everything(tmp_path):
    done, calls, _ = run_step(tmp_path, dockerd=None, packages=False, uid=1000, env={"FEDCLUSTER_DOCKER_TESTS": "0"})
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout and "TESTS=0" in done.stdout
    assert "apt-get" not in calls and "build.sh" not in calls


def test_it_removes_what_its_own_run_left_and_never_another_runs_projects(tmp_path):
    mine, other = "fedclustertest-ci1a-0123456789ab", "fedclustertest-ci2b-ba9876543210"
    done, calls, _ = run_step(tmp_path, projects=(mine, other, "unrelated"), env={"FEDCLUSTER_DOCKER_RUN": "ci1a"})
    assert done.returncode == 0, done.stderr
    assert "TESTS=1" in done.stdout
    assert f"-{other}" not in calls and "unrelated" not in calls  # listed by the engine, never touched
    for removal in (
        f"docker rm -f container-{mine}",
        f"docker network rm network-{mine}",
        f"docker volume rm volume-{mine}",
    ):
        assert removal in calls
    assert f"removing what the test left of {mine}" in done.stdout and other not in done.stdout


def test_each_run_gets_its_own_id_for_its_projects(tmp_path):
    ids = []
    for name in ("one", "two"):
        done, _, _ = run_step(tmp_path, name=name)
        assert done.returncode == 0, done.stderr
        (line,) = [line for line in done.stdout.splitlines() if "this run's projects" in line]
        ids.append(line.rsplit("fedclustertest-", 1)[1])
    assert ids[0] != ids[1] and all(i.endswith("-*") for i in ids)


def test_the_engine_stays_while_another_run_uses_it_and_the_last_one_stops_it(tmp_path):
    state = tmp_path / "fedcluster-docker-ci"
    state.mkdir()
    try:
        # another CI run on this machine is using the engine (it holds the users' lock shared)
        with open(state / "users.lock", "a") as other:
            fcntl.flock(other, fcntl.LOCK_SH)
            done, calls, up = run_step(tmp_path, name="first")
            assert done.returncode == 0, done.stderr
            assert "dockerd " in calls  # this run started the engine ...
            assert up.exists() and "stopping" not in done.stdout  # ... and left it to the other run
            assert "another run on this machine still uses the engine" in done.stdout
        # a later run finds the engine running, starts none, and leaves last: it stops it
        done, calls, up = run_step(tmp_path, name="second")
        assert done.returncode == 0, done.stderr
        assert "dockerd " not in calls and "starting dockerd" not in done.stdout
        assert "stopping the dockerd CI started" in done.stdout
        assert not up.exists()
    finally:
        stop_stand_in_engine(tmp_path)


def test_a_dockerd_no_ci_run_started_is_left_running(tmp_path):
    (tmp_path / "engine-up").touch()  # a developer's engine answers
    done, calls, up = run_step(tmp_path, dockerd=None)
    assert done.returncode == 0, done.stderr
    assert "dockerd" not in calls and "stopping" not in done.stdout
    assert up.exists()
