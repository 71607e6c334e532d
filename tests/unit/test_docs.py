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
    assert headings == {"1", "2", "3", "4", "5", "6"}
    cited = set()
    for rel, text in project_text_files():
        if rel.parts[0] == "docs" or rel == Path("tests/unit/test_docs.py"):
            continue
        for match in re.finditer(r"(\S*)ALGORITHMS\.md(?:\]\([^)]*\))?(?:,? (?:§|section )(\d+))?", text):
            assert match.group(1).endswith("docs/") or match.group(1).endswith("[docs/"), (
                f"{rel}: {match.group(0)!r} should cite docs/ALGORITHMS.md"
            )
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
    for option in (
        "--ssl-ca-certfile",
        "--ssl-certfile",
        "--ssl-keyfile",
        "--enable-supernode-auth",
        "--root-certificates",
        "--auth-supernode-private-key",
        "flwr supernode register",
        "fedcluster-make-certs",
    ):
        assert option in commands, option
    assert "--insecure" not in commands  # insecure is an opt-in described in prose, not the path shown


def test_readme_deployments_commands_cover_what_a_new_user_hit():
    # the commands shown, not the prose around them: several SuperNodes on one host, the
    # run's status and log, no dependency installation at run time, the local cluster
    commands = "\n".join(re.findall(r"```(?:bash|sh)?\n(.*?)\n```", deployment_section(), flags=re.S))
    for needed in (
        "--port",
        "flwr ls",
        "flwr log",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1",
    ):
        assert needed in commands, needed


def test_readme_docker_prerequisites_and_no_bare_sudo():
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page.split("## Demo cluster with Docker Compose", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"```bash\n(.*?)\n```", section, flags=re.S))
    for needed in ("build.sh",):
        assert needed in commands, needed
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


def supernode_commands(text: str) -> list[list[str]]:
    """Every ``flower-supernode`` command in the code blocks of ``text``, as its arguments
    (continuation lines joined, comments and leading ``VAR=value`` assignments dropped)."""
    import shlex

    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if language not in ("", "bash", "sh", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True) if "flower-supernode" in line else []
            if "flower-supernode" in words:
                commands.append(words[words.index("flower-supernode") + 1 :])
    return commands


def test_every_supernode_command_in_the_docs_parses_and_has_its_own_port():
    """A second SuperNode on a host needs its own --port (Flower's Runtime API, 9094 by
    default): every flower-supernode command the docs show gives one, no two in a page the
    same, and (when this Flower's parser can be reached) Flower accepts its options."""
    try:
        from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode as flower_parser
    except ImportError:  # a Flower without that (private) parser: the port checks still run
        flower_parser = None
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = 0
    for page in pages:
        commands = supernode_commands(page.read_text())
        ports = []
        for args in commands:
            found += 1
            assert "--port" in args, f"{page.relative_to(ROOT)}: flower-supernode {' '.join(args)} has no --port"
            ports.append(args[args.index("--port") + 1])
            if flower_parser is not None:
                flower_parser().parse_args(args)  # SystemExit on an option Flower does not know
        assert len(set(ports)) == len(ports), f"{page.relative_to(ROOT)}: SuperNodes share a --port: {ports}"
    assert found, "no flower-supernode command found in the docs: is the pattern still right?"
    assert supernode_commands("```bash\nX=1 flower-supernode --superlink s:8000 \\\n    --port 9095  # one\n```") == [
        ["--superlink", "s:8000", "--port", "9095"]
    ]


def test_the_guides_commands_write_where_git_does_not_look():
    """Following a guide in a clone leaves `git status` clean: every folder or file its
    commands write (output-dir, --out, --figures, np.save) is absolute (outside the clone)
    or one git ignores (runs/, outputs/, graphs/)."""
    import subprocess

    pages = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
    written = []
    for page in pages:
        for language, block in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), flags=re.S | re.M):
            if language in ("", "bash", "sh"):
                written += [
                    (page, path)
                    for path in re.findall(r"""(?:output-dir=|--out |--figures |np\.save\()['"]?([^'"\s,)]+)""", block)
                ]
    assert len(written) >= 8, written  # the pattern still finds the guides' outputs
    inside = [(page, path) for page, path in written if not path.startswith(("/", "~"))]
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        return  # not a git checkout: nothing to leave untracked
    for page, path in inside:
        ignored = any(
            subprocess.run(["git", "check-ignore", "-q", candidate], cwd=ROOT).returncode == 0
            for candidate in (path, f"{path.rstrip('/')}/x")
        )
        assert ignored, f"{page.relative_to(ROOT)}: a command writes {path}, which git does not ignore"
