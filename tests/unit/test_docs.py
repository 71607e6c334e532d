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


def deployment_section() -> str:
    page = (ROOT / "docs" / "deployment.md").read_text()
    return page.split("\n## Deployment\n", 1)[1].split("\n## ", 1)[0]


def test_readme_deployment_is_secure_by_default():
    section = deployment_section()
    commands = "\n".join(re.findall(r"```bash\n(.*?)\n```", section, flags=re.S))
    for option in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile", "--enable-supernode-auth",
                   "--root-certificates", "--auth-supernode-private-key", "flwr supernode register", "fedcluster-make-certs"):
        assert option in commands, option
    assert "--insecure" not in commands  # insecure is an opt-in described in prose, not the path shown
    assert "explicit opt-in" in section


def test_readme_deployment_states_what_a_new_user_hit():
    section = deployment_section()
    assert "own `--port`" in section  # several SuperNodes on one host
    assert "**8000**" in section and "Fleet API" in section
    assert "flwr ls" in section and "flwr log" in section and "returns at once" in section
    assert "working directory" in section and "output-dir" in section
    assert "--disable-runtime-dependency-installation" in section and "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in section
    assert "fedcluster-local-cluster" in section


def test_readme_docker_prerequisites_and_no_bare_sudo():
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page.split("## Demo cluster with Docker Compose", 1)[1].split("\n## ", 1)[0]
    for needed in ("apt-get install docker-compose", "debootstrap", "PyPI", "Debian's mirror", "build.sh --check"):
        assert needed in section, needed
    first_command = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)[0].splitlines()[0]
    assert not first_command.startswith("sudo"), first_command


def test_every_relative_link_in_the_docs_resolves():
    """README and every page under docs/: a link to a file of the repository names one that exists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "bench").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_stays_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
