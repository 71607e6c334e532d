"""docs/reference.md's outputs table names every array a run can write, and nothing else.

A run writes ``<name>.npy`` for every entry of its outcome's ``"arrays"`` and for
``"centers"`` (fedcluster/server/results.py). The names are found in the source of fedcluster/server/ by
three rules, the three ways the strategies build those dicts:

1. a dict literal that is the value of the key ``"arrays"`` of a dict literal
   (``{"centers": c, "arrays": {"init_centers": ...}}``);
2. a dict literal assigned to a variable named ``arrays`` (results.py's
   ``arrays = {"centers": centers, **arrays}``, FedDP-Init's arrays);
3. an item assignment ``x["arrays"]["name"] = ...`` (FedKMeans' ``last_centers``).

Message arrays are keyword arguments (``broadcast(..., arrays={...})``), not matched.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _constant(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _keys(node: ast.Dict) -> set[str]:
    return {key for key in map(_constant, node.keys) if key is not None}


def written_arrays(source: str) -> set[str]:
    """Array names ``source`` puts into a run's output by the three rules."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):  # rule 1
            for key, value in zip(node.keys, node.values):
                if _constant(key) == "arrays" and isinstance(value, ast.Dict):
                    names |= _keys(value)
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "arrays" and isinstance(node.value, ast.Dict):  # rule 2
                names |= _keys(node.value)
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Subscript)  # rule 3
                and _constant(target.value.slice) == "arrays"
                and _constant(target.slice) is not None
            ):
                names.add(_constant(target.slice))
    return names


def documented_arrays() -> set[str]:
    """The ``name.npy`` rows of the table in reference.md's "## Outputs" section."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Outputs\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)\.npy` \|", section, flags=re.M))


def code_arrays() -> set[str]:
    files = sorted((ROOT / "fedcluster" / "server").glob("*.py")) + sorted(
        (ROOT / "fedcluster" / "algorithms").glob("*/strategy*.py")
    )
    return set().union(*(written_arrays(f.read_text()) for f in files))


def test_every_array_a_run_writes_is_in_the_outputs_table_and_only_those():
    written, documented = code_arrays(), documented_arrays()
    # the rules still find what they should (else a refactor could make this test vacuous)
    assert {"centers", "init_centers", "last_centers", "projection", "bin_counts", "labels", "client_labels"} <= written
    assert not written - documented, (
        "written by the server or a strategy but not in docs/reference.md's outputs table: "
        f"{sorted(written - documented)}"
    )
    assert not documented - written, (
        f"in docs/reference.md's outputs table but written by no strategy: {sorted(documented - written)}"
    )


def test_the_rules_find_each_way_of_writing_an_array_and_skip_messages():
    source = """
def run(self):
    arrays = {"from_rule_2": a}
    outcome = {"centers": c, "arrays": {"from_rule_1": b, **arrays}}
    outcome["arrays"]["from_rule_3"] = d
    self.broadcast("task", nodes, arrays={"message": m})
    reply.arrays["min"] = low
    return outcome
"""
    assert written_arrays(source) == {"from_rule_1", "from_rule_2", "from_rule_3"}


def test_a_data_folder_refuses_every_array_name_a_run_writes():
    from fedcluster.data import RESULT_ARRAYS

    assert set(RESULT_ARRAYS) == code_arrays()
