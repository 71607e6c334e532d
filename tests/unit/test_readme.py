"""The README's two set-up commands stay true: the test command is what CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_readme_starts_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert "flwr run ." in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1].strip() in [line.strip() for line in ci]


def test_readme_task_table_is_generated_from_the_protocol():
    from fedcluster.protocol import markdown_table

    block = f"<!-- generated: python -m fedcluster.protocol -->\n{markdown_table()}\n<!-- end generated -->"
    assert block in (ROOT / "docs" / "reference.md").read_text(), (
        "regenerate: python -m fedcluster.protocol docs/reference.md"
    )
