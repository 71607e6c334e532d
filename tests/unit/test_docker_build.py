"""docker/build.sh checks its prerequisites first and names every missing one.

Run with ``--check`` and a PATH holding only what the test puts there: stand-in ``docker``,
``debootstrap`` and ``id`` commands decide what is present; nothing is built."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "docker" / "build.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def run_check(
    tmp_path: Path, *, docker: str | None = None, compose_v1: bool = False, debootstrap: bool = False, uid: int = 0
):
    """docker: None (absent), "dead" (no engine answers), "nocompose" (engine, no v2 plugin), "ok"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "mkdir", "flock"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    _script(bin_dir / "id", f"echo {uid}")
    if docker == "dead":
        _script(bin_dir / "docker", "exit 1")
    elif docker == "nocompose":
        _script(
            bin_dir / "docker",
            'case "$1" in info) exit 0;; compose) echo "unknown flag" >&2; exit 125;; *) exit 1;; esac',
        )
    elif docker == "ok":
        _script(bin_dir / "docker", 'case "$1" in info|compose) exit 0;; *) exit 1;; esac')  # no base image yet
    if compose_v1:
        _script(bin_dir / "docker-compose", "exit 0")
    if debootstrap:
        _script(bin_dir / "debootstrap", "exit 0")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYTHON": sys.executable}
    return subprocess.run(
        [str(bin_dir / "bash"), str(BUILD), "--check"], capture_output=True, text=True, env=env, timeout=60
    )


def test_without_docker_it_says_what_to_install(tmp_path):
    done = run_check(tmp_path)
    assert done.returncode == 1
    assert "no 'docker' command" in done.stderr and "docker.io" in done.stderr
    assert "apt-get install docker-compose" in done.stderr
    assert "apt-get install debootstrap" in done.stderr
    assert "network access" in done.stderr


def test_an_engine_that_does_not_answer_is_named(tmp_path):
    done = run_check(tmp_path, docker="dead", compose_v1=True, debootstrap=True)
    assert done.returncode == 1
    assert "no Docker engine answers" in done.stderr
    assert "Compose" not in done.stderr and "debootstrap'" not in done.stderr


def test_missing_compose_plugin_points_at_compose_v1(tmp_path):
    done = run_check(tmp_path, docker="nocompose", debootstrap=True)
    assert done.returncode == 1
    assert "no Docker Compose" in done.stderr and "apt-get install docker-compose" in done.stderr


def test_compose_v1_is_enough(tmp_path):
    done = run_check(tmp_path, docker="nocompose", compose_v1=True, debootstrap=True)
    assert done.returncode == 0, done.stderr


def test_not_root_is_named_without_calling_sudo(tmp_path):
    done = run_check(tmp_path, docker="ok", debootstrap=True, uid=1000)
    assert done.returncode == 1
    assert "not root" in done.stderr
    assert "command not found" not in done.stderr  # never calls a sudo that is not there


def test_everything_present_passes_the_check(tmp_path):
    done = run_check(tmp_path, docker="ok", debootstrap=True)
    assert done.returncode == 0, done.stderr
    assert "prerequisites present" in done.stdout


def test_a_build_waits_for_another_build_on_the_machine(tmp_path):
    # builds beside each other would prune each other's untagged layers mid-build
    lock = tmp_path / "build.lock"
    run_check(tmp_path, docker="ok", debootstrap=True)  # makes the stand-ins in tmp_path/bin
    env = {
        "PATH": str(tmp_path / "bin"),
        "HOME": str(tmp_path),
        "PYTHON": sys.executable,
        "FEDCLUSTER_BUILD_LOCK": str(lock),
    }
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another build holds it
        build = subprocess.Popen(
            [str(tmp_path / "bin" / "bash"), str(BUILD)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            out, _ = build.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGKILL)
            out, _ = build.communicate()
    assert "waiting for another docker/build.sh" in out
    assert "1/3" not in out  # nothing built while the other build runs
