"""The repository stands on its own: the docs it cites ship with it, no machine paths."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "venv", ".flwr-home", "outputs", "build", "graphs", "__pycache__", ".pytest_cache"}


def project_text_files():
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if path.is_file() and path.suffix in {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".cfg", ".ini"}:
            yield rel, path.read_text(errors="replace")


def test_cited_sections_of_algorithms_md_exist():
    headings = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "ALGORITHMS.md").read_text(), flags=re.M))
    assert headings == {"1", "2", "3", "4", "5"}
    cited = set()
    for rel, text in project_text_files():
        if rel.parts[0] == "docs" or rel == Path("tests/unit/test_docs.py"):
            continue
        for match in re.finditer(r"(\S*)ALGORITHMS\.md(?:\]\([^)]*\))?(?:,? (?:§|section )(\d+))?", text):
            assert match.group(1).endswith("docs/") or match.group(1).endswith("[docs/"), f"{rel}: {match.group(0)!r} should cite docs/ALGORITHMS.md"
            if match.group(2):
                cited.add(match.group(2))
    assert cited and cited <= headings, cited


def test_no_file_points_outside_the_repository():
    for rel, text in project_text_files():
        if rel == Path("tests/unit/test_docs.py"):
            continue
        assert "../shared/DESIGN" not in text and "../shared/ALGORITHMS" not in text, rel
        assert not re.search(r"(?<![\w.])/work/", text), f"{rel} holds a machine-specific path"
        for line in text.splitlines():
            if "../shared/data/graphs" in line:  # allowed only as the offline cache
                assert "cache" in line.lower() or "or" in line, f"{rel}: {line.strip()}"


def test_readme_links_to_the_docs_and_the_fetch_command():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target
    assert "docs/ALGORITHMS.md" in readme and "docs/DESIGN.md" in readme
    assert "fedcluster-fetch-graphs" in readme
