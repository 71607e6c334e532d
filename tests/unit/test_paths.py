"""Every repository path the project's own text names exists.

What is checked: the ``*.py``, ``*.md``, ``*.toml``, ``*.yml`` and ``*.sh`` files git knows
(tracked, plus untracked ones that are not ignored, so a new file is checked before it is
committed; ``.venv``, ``*.egg-info`` and generated output are ignored by git and never
read, and generated data -- ``.json``, ``.json.gz``, ``.csv`` -- has none of these suffixes).
A path is a top-level folder of the repository (any folder git holds a file in: ``bench/``,
``docs/``, ``fedcluster/``, ``tests/``, ...) followed by a file name ending in ``.py``,
``.md``, ``.toml``, ``.yml``, ``.sh`` or ``.json``, e.g. ``tests/unit/test_privacy.py``; it
must exist relative to the repository root. User-chosen output paths (``runs/...``,
``outputs/...``) do not start with a repository folder and are never matched.

Skipped, by exactly two rules:

1. Part of a longer path or a URL: the match is preceded by a letter, digit, ``_``, ``.``,
   ``/`` or ``-``. That is an absolute path on another machine or in a container
   (``/opt/fedcluster/run_job.py``), a URL (``https://host/org/docs/x.md``), or a path
   relative to some other folder (``../docs/results/...``, ``../shared/...``; the docs'
   markdown links relative to their page are checked by test_docs.py).
2. A placeholder: the path holds ``<``, ``*`` or ``{`` (``fedcluster/<algorithm>.py``,
   ``docs/figures/*.svg``, an f-string's ``{name}``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = ("py", "md", "toml", "yml", "sh")
NAMED = ("py", "md", "toml", "yml", "sh", "json")


def tracked_files() -> list[str]:
    """Every file git knows: tracked, or untracked and not ignored."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"git is not available: {exc}")
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return sorted({name for name in done.stdout.split("\0") if name})


def path_pattern(folders) -> re.Pattern:
    """A root-relative path to a file: a top-level folder, then anything path-like up to one
    of the NAMED suffixes that ends the path (``x.json.gz`` is not ``x.json``; a sentence's
    full stop after it is not part of it). Rule 1 is the look-behind."""
    top = "|".join(sorted(map(re.escape, folders)))
    return re.compile(rf"(?<![\w./-])((?:{top})/[\w./<>*{{}}-]*?\.(?:{'|'.join(NAMED)}))(?![\w/-]|\.\w)")


def named_paths(text: str, pattern: re.Pattern):
    """(line number, path) for every path ``text`` names, placeholders (rule 2) left out."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            path = match.group(1)
            if not any(mark in path for mark in "<*{"):
                yield number, path


def test_every_repository_path_named_exists():
    files = tracked_files()
    pattern = path_pattern({name.split("/", 1)[0] for name in files if "/" in name})
    missing, seen = [], 0
    for name in files:
        path = ROOT / name
        if path.suffix[1:] not in SUFFIXES:
            continue
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        for number, named in named_paths(path.read_text(encoding="utf-8", errors="replace"), pattern):
            seen += 1
            if not (ROOT / named).exists():
                missing.append(f"{name}:{number}: {named}")
    assert seen > 50, f"only {seen} repository paths found: is the pattern still right?"
    assert not missing, "paths named that do not exist in the repository:\n  " + "\n  ".join(missing)


def test_the_rules_match_and_skip_what_the_docstring_says():
    pattern = path_pattern({"tests", "docs", "fedcluster", ".ci"})
    text = "\n".join(
        [
            "see tests/unit/test_paths.py.",  # found; the full stop is not part of it
            "`docs/results/real-data.json.gz` and .ci/docker.sh",  # .json.gz is not .json; .ci/ is a folder
            "python /opt/fedcluster/run_job.py",  # rule 1: absolute
            "https://example.org/x/docs/a.md",  # rule 1: URL
            "../shared/docs/b.md ../docs/c.md",  # rule 1: relative to another folder
            "fedcluster/<algorithm>.py docs/*.md docs/{name}.md",  # rule 2: placeholders
            "runs/tests/result.json",  # rule 1: an output folder's sub-path
        ]
    )
    assert list(named_paths(text, pattern)) == [(1, "tests/unit/test_paths.py"), (2, ".ci/docker.sh")]
