"""The code as ruff reads it ([tool.ruff] in pyproject.toml): no finding in the library,
the tests or the benchmarks, and every file as ruff formats it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = ruff("check", "--output-format", "concise", "fedcluster", "tests", "bench")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_every_file_is_as_ruff_formats_it():
    done = ruff("format", "--check", "fedcluster", "tests", "bench")
    assert done.returncode == 0, "run: ruff format fedcluster tests bench\n" + done.stdout[-4000:] + done.stderr[-2000:]
