"""Every benchmark script takes ``--quick`` and ``--out DIR`` (bench/README.md promises both).

Static: each ``bench/*.py`` but ``_common.py`` is parsed with ``ast`` (nothing imported, no
benchmark run) and must declare both flags, directly (``add_argument("--quick", ...)``) or
through ``add_bench_flags`` imported from ``_common``, and write its page through
``_common.page_output``. Behavioural: the two helpers of bench/_common.py, imported by path
without flwr.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FLAGS = ("--quick", "--out")
HELPER, PAGE = "add_bench_flags", "page_output"
# Scripts that write their page into --out themselves (with its data and figure)
OWN_PAGE = {"real_data.py": "real-data.md (its --name), .json.gz and .svg"}


def scripts() -> dict[str, str]:
    return {
        path.name: path.read_text(encoding="utf-8") for path in sorted(BENCH.glob("*.py")) if path.name != "_common.py"
    }


def _from_common(tree: ast.AST) -> set[str]:
    """Names the script imports from ``_common`` (or ``bench._common``)."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("_common", "bench._common")
        for alias in node.names
    }


def _called(tree: ast.AST) -> list[tuple[str, list]]:
    """(function name, positional arguments) of every call."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            calls.append((name, node.args))
    return calls


def missing(source: str) -> list[str]:
    """What a script's source lacks: the flags it does not declare, and the page."""
    tree = ast.parse(source)
    imported, calls = _from_common(tree), _called(tree)
    declared = {
        arg.value
        for name, args in calls
        if name == "add_argument"
        for arg in args
        if isinstance(arg, ast.Constant) and arg.value in FLAGS
    }
    if HELPER in imported and any(name == HELPER for name, _ in calls):
        declared.update(FLAGS)
    lacks = [flag for flag in FLAGS if flag not in declared]
    if not (PAGE in imported and any(name == PAGE for name, _ in calls)):
        lacks.append(f"{PAGE}(...) from _common")
    return lacks


def offenders(sources: dict[str, str]) -> dict[str, list[str]]:
    found = {name: missing(source) for name, source in sources.items()}
    for name in OWN_PAGE:  # writes its page itself: only the flags are asked of it
        if name in found:
            found[name] = [lack for lack in found[name] if lack in FLAGS]
    return {name: lacks for name, lacks in found.items() if lacks}


def test_every_bench_script_declares_quick_and_out_and_writes_its_page():
    found = scripts()
    assert len(found) >= 20, sorted(found)
    bad = offenders(found)
    assert not bad, (
        "bench scripts without --quick / --out / the page (use _common.add_bench_flags and "
        "_common.page_output): " + "; ".join(f"{name}: {', '.join(lacks)}" for name, lacks in bad.items())
    )


def test_the_check_finds_a_script_without_the_flags():
    plain = (
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--seeds')\nargs = "
        "parser.parse_args()\n"
    )
    direct = plain + "parser.add_argument('--quick', action='store_true')\n"
    helper = (
        "from _common import add_bench_flags, page_output\nadd_bench_flags(parser, quick='x')\nwith "
        "page_output(None, __file__):\n    pass\n"
    )
    not_imported = "add_bench_flags(parser, quick='x')\npage_output(None, __file__)\n"
    assert offenders({"a.py": plain, "b.py": direct, "c.py": helper, "d.py": not_imported}) == {
        "a.py": ["--quick", "--out", "page_output(...) from _common"],
        "b.py": ["--out", "page_output(...) from _common"],
        "d.py": ["--quick", "--out", "page_output(...) from _common"],
    }


# ---------------------------------------------------------------------------- the helpers
@pytest.fixture
def common(monkeypatch):
    """bench/_common.py imported by path, with flwr made unimportable."""
    monkeypatch.setitem(sys.modules, "flwr", None)
    spec = importlib.util.spec_from_file_location("bench_common_under_test", BENCH / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_add_bench_flags_adds_quick_and_out(common, tmp_path):
    parser = common.add_bench_flags(argparse.ArgumentParser(), quick="1 seed")
    assert parser.parse_args([]).quick is False and parser.parse_args([]).out is None
    args = parser.parse_args(["--quick", "--out", str(tmp_path)])
    assert args.quick is True and args.out == tmp_path


def test_page_output_copies_what_is_printed(common, tmp_path, capsys):
    with common.page_output(tmp_path / "pages", "/somewhere/bench/my_bench.py") as path:
        print("# title\n")
        print("| a | b |", flush=True)
        sys.stdout.write("last line\n")
    assert path == tmp_path / "pages" / "my_bench.md"
    assert path.read_text() == "# title\n\n| a | b |\nlast line\n"
    assert capsys.readouterr().out == "# title\n\n| a | b |\nlast line\n"  # stdout as before


def test_page_output_keeps_the_text_when_the_body_raises(common, tmp_path):
    before = sys.stdout
    with pytest.raises(RuntimeError, match="boom"):
        with common.page_output(tmp_path, "my_bench.py"):
            print("the header")
            raise RuntimeError("boom")
    assert sys.stdout is before
    text = (tmp_path / "my_bench.md").read_text()
    assert text.startswith("the header\n") and "RuntimeError: boom" in text


def test_page_output_without_out_writes_nothing(common, tmp_path, capsys):
    with common.page_output(None, "my_bench.py") as path:
        print("only on stdout")
    assert path is None and capsys.readouterr().out == "only on stdout\n" and not list(tmp_path.iterdir())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_page_output_leaves_forked_workers_out(common, tmp_path):
    with common.page_output(tmp_path, "my_bench.py"):
        print("parent before")
        pid = os.fork()
        if pid == 0:  # a worker forked inside the block: its prints never reach the page
            try:
                print("from the worker", flush=True)
                (tmp_path / "worker-printed").touch()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        print("parent after")
    assert (tmp_path / "worker-printed").exists()
    assert (tmp_path / "my_bench.md").read_text() == "parent before\nparent after\n"


def test_a_page_says_what_ran_and_links_its_figures_beside_it(common, tmp_path, capsys, monkeypatch):
    script = "/somewhere/bench/" + "my_bench.py"  # not a path of this repository
    monkeypatch.setattr(sys, "argv", [script, "--out", "DIR"])
    common.print_header("My bench", "What it measures.\n\nUsage::\n\n    python it\n")
    text = capsys.readouterr().out
    assert text.startswith("# My bench\n\nWritten by `bench/" + "my_bench.py`.\n\nWhat it measures.\n")
    assert "Usage" not in text and f"command : python {script} --out DIR" in text
    assert "code    : " in text and "unknown" not in text  # this checkout is a git checkout
    assert common.figure_path(tmp_path, Path("elsewhere"), script, "a.svg") == (
        tmp_path / "my_bench-a.svg",
        "my_bench-a.svg",
    )
    assert common.figure_path(None, Path("elsewhere"), script, "a.svg") == (
        Path("elsewhere") / "a.svg",
        "elsewhere/a.svg",
    )
