""".ci/docker.sh, the CI step that starts a Docker engine for the demo cluster test.

Run with a PATH holding only what the test puts there: stand-in ``docker``, ``dockerd``,
``apt-get``, ``id`` ... decide what is present and record what was called; a stand-in
``docker/build.sh`` in a scratch folder stands for the build. Nothing real is installed,
started or built."""

from __future__ import annotations

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


def run_step(tmp_path: Path, *, dockerd: str | None = "ok", packages: bool = True, uid: int = 0, env: dict | None = None):
    """dockerd: None (not installed), "dies" (exits at once), "ok" (the engine answers once it
    runs). packages: docker-compose and debootstrap present. Returns (process, calls log)."""
    bin_dir, work, calls = tmp_path / "bin", tmp_path / "work", tmp_path / "calls.log"
    bin_dir.mkdir()
    (work / "docker").mkdir(parents=True)
    calls.touch()
    for tool in ("bash", "basename", "sleep", "grep", "sort", "tail", "cat", "touch", "rm"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    log = f'echo "$(basename "$0") $*" >> {calls}'
    up = tmp_path / "engine-up"
    _script(bin_dir / "id", f"echo {uid}")
    _script(bin_dir / "apt-get", log)
    # the engine answers while the stand-in dockerd runs (it holds the marker file)
    _script(bin_dir / "docker", f'{log}\ncase "$1" in info) [ -e {up} ];; version) echo 20.10;; compose) exit 1;; *) exit 0;; esac')
    if dockerd == "dies":
        _script(bin_dir / "dockerd", f'{log}\necho "failed to start daemon: no cgroups" >&2; exit 1')
    elif dockerd == "ok":
        _script(bin_dir / "dockerd", f'{log}\ntouch {up}\ntrap "rm -f {up}; exit 0" TERM\nwhile true; do sleep 0.2; done')
    if packages:
        _script(bin_dir / "docker-compose", 'echo 1.29.2')
        _script(bin_dir / "debootstrap", "exit 0")
    _script(work / "docker" / "build.sh", f'echo "build.sh $*" >> {calls}')
    done = subprocess.run(
        [str(bin_dir / "bash"), "-c", HARNESS], capture_output=True, text=True, timeout=120, cwd=work,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **(env or {})},
    )
    return done, calls.read_text(), up


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
