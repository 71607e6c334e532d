"""The house plan, checked: fedcluster never needs flwr, a device needs only NumPy, and a
strategy does no math beyond summing replies (docs/DESIGN.md, "Three places for code")."""

from __future__ import annotations

import ast
import re
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import fedcluster

ROOT = Path(__file__).resolve().parents[2]

# What a strategy may call on NumPy: gathering and summing replies, choosing the best of
# scored candidates, building the arrays it sends. Anything else is math and belongs in
# the algorithm's own modules.
STRATEGY_NUMPY = {
    "sum",
    "concatenate",
    "stack",
    "asarray",
    "array",
    "zeros",
    "full",
    "argmin",
    "ndarray",
    "float64",
    "int64",
    "uint64",
    "floating",
    "integer",
    "zeros_like",
    "save",
    "random",
    "isfinite",
    "all",
}


# The parts that talk to Flower: the ServerApp and its parts, the ClientApp, the in-process
# runner, and each algorithm's strategy (fedcluster/algorithms/<name>/strategy*.py).
# Everything else in fedcluster is the library and never needs flwr.
FLOWER_PARTS = ("fedcluster.server", "fedcluster.client", "fedcluster.inprocess")
# ... and Flower's SecAgg+ cryptography, which the secure sum reuses: loaded in one function
# of one module, when a secure-aggregation task runs.
FLOWER_CRYPTO = "fedcluster.secagg.crypto"


def strategy_module(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and parts[:2] == ["fedcluster", "algorithms"] and parts[3].startswith("strategy")


def flower_part(name: str) -> bool:
    return any(name == part or name.startswith(part + ".") for part in FLOWER_PARTS) or strategy_module(name)


def server_files() -> list[Path]:
    """The files that run on the server under Flower: its parts and every strategy."""
    return sorted((ROOT / "fedcluster" / "server").glob("*.py")) + sorted(
        (ROOT / "fedcluster" / "algorithms").glob("*/strategy*.py")
    )


def test_every_library_module_imports_with_flwr_unimportable():
    # every module of every subpackage too (fedcluster.tools.*, fedcluster.privacy.*): the
    # prefix lets walk_packages import a subpackage to look inside it
    modules = sorted(
        m.name
        for m in pkgutil.walk_packages(fedcluster.__path__, prefix="fedcluster.")
        if not m.name.rsplit(".", 1)[-1].startswith("_") and not flower_part(m.name)
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
    for path in server_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np":
                if node.attr not in STRATEGY_NUMPY:
                    offenders.append(f"{path.name}:{node.lineno} np.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedcluster"):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports private {private} from {node.module}"
    assert not offenders, "math in a strategy (move it to its algorithm's server module): " + ", ".join(offenders)


def test_each_algorithm_is_a_package_with_a_file_per_audience():
    # fedcluster/algorithms/<name>/: its run-config section, its protocol tasks, its device
    # kernels, its strategy; registered once, in fedcluster/algorithms/__init__.py
    from fedcluster import registry

    packages = {p.parent.name for p in (ROOT / "fedcluster" / "algorithms").glob("*/__init__.py")}
    assert packages == {a.package.rsplit(".", 1)[-1] for a in registry.algorithms().values()}, (
        "a package under fedcluster/algorithms/ that the registry does not list, or the other way round"
    )
    for name in packages:
        files = {p.stem for p in (ROOT / "fedcluster" / "algorithms" / name).glob("*.py")}
        missing = {"config", "protocol", "device", "strategy"} - files
        assert not missing, f"fedcluster/algorithms/{name} has no {sorted(missing)}"


# As ruff formats them (a call that does not fit on a line takes a line per argument).
SERVER_FILE_LINES = 400


def test_no_server_file_is_longer_than_a_reader_takes_in_at_once():
    long = {
        str(p.relative_to(ROOT)): n
        for p in server_files()
        if (n := len(p.read_text().splitlines())) > SERVER_FILE_LINES
    }
    assert not long, f"server files over {SERVER_FILE_LINES} lines (split a job into a module of its own): {long}"


def test_only_the_flower_parts_import_flwr():
    offenders = []
    for path in sorted((ROOT / "fedcluster").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if flower_part(name) or name == FLOWER_CRYPTO:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            imported = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [f"{name}:{node.lineno}" for module in imported if module.split(".")[0] == "flwr"]
    assert not offenders, "flwr imported outside " + ", ".join(FLOWER_PARTS) + ": " + ", ".join(offenders)


def test_one_launcher_starts_flower_processes():
    # SuperLinks and SuperNodes are started by fedcluster/tools/flower.py only (the local
    # cluster, the engine tests and the benchmarks use it). Not scanned: the unit tests (they
    # name the commands in what they check) and the Docker test (compose starts those)
    launcher = ROOT / "fedcluster" / "tools" / "flower.py"
    files = [
        p
        for folder in ("fedcluster", "tests/engine", "bench")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "test_docker.py"
    ]
    assert launcher in files
    others = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and node.value in ("flower-superlink", "flower-supernode")
                and path != launcher
            ):
                others.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not others, "Flower processes started outside fedcluster/tools/flower.py: " + ", ".join(others)


def test_the_server_and_the_device_start_without_the_privacy_accountant():
    """dp_accounting (with scipy.signal) takes seconds to import: only a FedDP run loads it,
    when its strategy is made, never the ServerApp or ClientApp of any other run."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import fedcluster.server.app, fedcluster.server.algorithms, fedcluster.client.app
        print("loaded" if "dp_accounting" in sys.modules else "not loaded")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("not loaded"), done.stdout


def _algorithm_packages_named(path: Path, packages: dict[str, str]) -> set[str]:
    """The algorithm packages ``path`` names: by an algorithm's run-config name as a string
    of its own (``"kfed"``), or by importing from its package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in packages:
            found.add(packages[node.value])
        modules = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            else []
        )
        found |= {p for p in packages.values() for m in modules if m == p or m.startswith(p + ".")}
    return found


def test_an_algorithm_is_named_in_at_most_four_library_files_outside_its_package():
    # adding an algorithm is its package plus a line in fedcluster/algorithms/__init__.py;
    # the rest of the library reads the registry (docs/DESIGN.md, "Adding an algorithm")
    from fedcluster import registry

    packages = {a.name: a.package for a in registry.algorithms().values()}
    outside: dict[str, list[str]] = {}
    for path in sorted((ROOT / "fedcluster").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in _algorithm_packages_named(path, packages):
            if not module.startswith(package + "."):
                outside.setdefault(package, []).append(str(path.relative_to(ROOT)))
    assert outside, "no file names an algorithm: the scan no longer sees them"
    crowded = {p: files for p, files in outside.items() if len(files) > 4}
    assert not crowded, f"algorithms named in more than 4 files outside their package: {crowded}"


# Where the library imports by name at run time (importlib), and what it may load there:
# the registry reads each algorithm's declaration, run-config section and tasks; the device
# loads the kernels of the tasks it runs; the server loads the strategy of its run; the
# privacy package loads its own modules on first use; the package loads an algorithm's own
# estimator when asked for it.
DYNAMIC = {
    "fedcluster": ("fedcluster.algorithms.*.estimator",),
    "fedcluster.registry": (
        "fedcluster.algorithms.*",
        "fedcluster.algorithms.*.config",
        "fedcluster.algorithms.*.protocol",
    ),
    "fedcluster.protocol": ("fedcluster.algorithms.*.protocol",),
    "fedcluster.device": ("fedcluster.algorithms.*.device", "fedcluster.shared_kernels", "fedcluster.secagg.device"),
    "fedcluster.server.algorithms": ("fedcluster.algorithms.*.strategy",),
    "fedcluster.privacy": ("fedcluster.privacy.*",),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every library module -> the library modules it imports, at the top or inside a
    function (a lazy import is an import), and by name at run time (:data:`DYNAMIC`)."""
    paths = {_module_name(p): p for p in (ROOT / "fedcluster").rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    dynamic = set()
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "import_module":
                dynamic.add(name)
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
        for pattern in DYNAMIC.get(name, ()):
            rule = re.compile(re.escape(pattern).replace(r"\*", r"[^.]+") + "$")  # *: one name
            graph[name] |= {m for m in paths if rule.match(m) and m != name}
    assert dynamic == set(DYNAMIC), (
        f"imports by name at run time not declared in DYNAMIC (or gone): {dynamic ^ set(DYNAMIC)}"
    )
    return graph


def test_no_import_circle_among_the_librarys_modules():
    graph = import_graph()
    assert "fedcluster.lloyd" in graph["fedcluster.algorithms.fedkmeans.model"], "the scan no longer sees imports"
    state: dict[str, int] = {}  # 1: on the path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles (lazy and by-name imports count): " + "; ".join(
        " -> ".join(c) for c in circles[:5]
    )


def test_no_two_test_files_share_a_name():
    # the tiers are folders, not packages: pytest imports each test file by its basename, and
    # a second file of the same name in another tier is an error at collection (seen in CI)
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not shared, f"test files of the same name in different folders: {shared}"
