"""The house plan, checked: fedcluster never needs flwr, a device needs only NumPy, and a
strategy does no math beyond summing replies (docs/DESIGN.md, "Three places for code")."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import fedcluster

ROOT = Path(__file__).resolve().parents[2]

# What a strategy may call on NumPy: gathering and summing replies, choosing the best of
# scored candidates, building the arrays it sends. Anything else is math and belongs in
# fedcluster/<algorithm>.py.
STRATEGY_NUMPY = {
    "sum", "concatenate", "stack", "asarray", "array", "zeros", "full", "argmin", "ndarray",
    "float64", "int64", "uint64", "floating", "integer", "zeros_like", "save", "random", "isfinite", "all",
}


def test_every_fedcluster_module_imports_with_flwr_unimportable():
    # every module of every subpackage too (fedcluster.tools.*, fedcluster.privacy.*): the
    # prefix lets walk_packages import a subpackage to look inside it
    modules = sorted(
        m.name for m in pkgutil.walk_packages(fedcluster.__path__, prefix="fedcluster.")
        if not m.name.rsplit(".", 1)[-1].startswith("_")
    )
    assert "fedcluster.tools.plot" in modules, "walk_packages no longer sees inside subpackages"
    script = textwrap.dedent(
        f"""
        import importlib, sys
        sys.modules["flwr"] = None  # any "import flwr..." now raises ImportError
        sys.path.insert(0, {str(ROOT)!r})
        for name in {modules!r}:
            importlib.import_module(name)
        print("OK", len({modules!r}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"OK {len(modules)}" in done.stdout
    assert len(modules) >= 10


def test_strategies_do_no_numpy_math_beyond_summing_replies():
    offenders = []
    for path in sorted((ROOT / "server_app").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np":
                if node.attr not in STRATEGY_NUMPY:
                    offenders.append(f"{path.name}:{node.lineno} np.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedcluster"):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports private {private} from {node.module}"
    assert not offenders, "math in a strategy (move it to fedcluster/<algorithm>.py): " + ", ".join(offenders)


def test_each_strategy_has_its_fedcluster_module_of_the_same_name():
    # the ServerApp, the algorithm table and the base strategy with its bookkeeping modules
    # and the parts of strategies in files of their own (FedKMeans' start and measurements, FedDP's privacy
    # bookkeeping, DA-UFL's agents as they come and go, what both graph strategies share)
    not_strategies = {"__init__", "app", "algorithms", "base", "transport", "membership", "results", "messages",
                      "fedkmeans_start", "fedkmeans_measure", "feddp_kmeans_privacy", "da_ufl_agents", "graph_strategy",
                      "journal", "journal_file", "run_folder", "job", "resume", "release_log", "secure_session"}
    strategies = {p.stem for p in (ROOT / "server_app").glob("*.py")} - not_strategies
    library = {p.stem for p in (ROOT / "fedcluster").glob("*.py")}
    assert strategies, "no strategy found"
    assert strategies <= library, f"strategy files without a fedcluster module of the same name: {strategies - library}"


def test_no_server_file_is_longer_than_a_reader_takes_in_at_once():
    long = {p.name: n for p in sorted((ROOT / "server_app").glob("*.py")) if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"server_app files over 300 lines (split a job into a module of its own): {long}"


def test_one_launcher_starts_flower_processes():
    # SuperLinks and SuperNodes are started by fedcluster/tools/flower.py only (the local
    # cluster, the engine tests and the benchmarks use it). Not scanned: the unit tests (they
    # name the commands in what they check) and the Docker test (compose starts those)
    launcher = ROOT / "fedcluster" / "tools" / "flower.py"
    files = [p for folder in ("fedcluster", "server_app", "client_app", "inprocess", "tests/engine", "bench")
             for p in (ROOT / folder).rglob("*.py") if p.name != "test_docker.py"]
    assert launcher in files
    others = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("flower-superlink", "flower-supernode") and path != launcher:
                others.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not others, "Flower processes started outside fedcluster/tools/flower.py: " + ", ".join(others)


def test_the_server_and_the_device_start_without_the_privacy_accountant():
    """dp_accounting (with scipy.signal) takes seconds to import: only a FedDP run loads it,
    when its strategy is made, never the ServerApp or ClientApp of any other run."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import server_app.app, server_app.algorithms, client_app.app
        print("loaded" if "dp_accounting" in sys.modules else "not loaded")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("not loaded"), done.stdout
