"""Shared helpers of the benchmark scripts: machine info, quiet in-process runs, tables.

Not a library module: the scripts in ``bench/`` import it after putting the repository
root on ``sys.path``, so they run from a checkout without installing anything extra.
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> str:
    """Machine, library versions and the exact command line, as Markdown-friendly lines."""
    import numpy

    versions = [f"python {platform.python_version()}", f"numpy {numpy.__version__}"]
    for name in ("sklearn", "scipy", "flwr"):
        try:
            module = __import__(name)
            versions.append(f"{'scikit-learn' if name == 'sklearn' else name} {module.__version__}")
        except Exception:  # pragma: no cover - optional here
            pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    threads = {key: os.environ[key] for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS") if key in os.environ}
    lines = [
        f"machine : {platform.node()} {platform.system()} {platform.machine()}, {cpu_model()}",
        f"nproc   : {usable} usable of {os.cpu_count()}" + (f"  ({threads})" if threads else ""),
        f"load avg: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min, at start; other work on the machine skews timings)",
        f"versions: {', '.join(versions)}",
        f"command : {shlex.join([sys.executable, *sys.argv])}",
    ]
    return "\n".join(lines)


def print_header(title: str) -> None:
    print(f"# {title}\n")
    print("```")
    print(machine_info())
    print("```\n", flush=True)


def quiet_flower() -> None:
    """Silence Flower's INFO log (one line per round otherwise)."""
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


def run_inprocess(config: dict[str, Any], num_nodes: int) -> dict[str, Any]:
    """One in-process federation; the result.json dict.

    Without an ``output-dir`` in ``config`` the run writes to a temporary directory that
    is removed afterwards; the final centers (``centers.npy``) are then returned in
    ``result["centers"]`` (None if the run wrote none).
    """
    quiet_flower()
    import numpy as np

    from inprocess import run

    config = dict(config)
    if config.get("output-dir"):
        return run(config, num_nodes=num_nodes)
    with tempfile.TemporaryDirectory(prefix="fedcluster-bench-") as directory:
        config["output-dir"] = directory
        result = run(config, num_nodes=num_nodes)
        centers = Path(directory) / "centers.npy"
        result["centers"] = np.load(centers) if centers.exists() else None
    return result


def parallel_map(function: Callable, items: Iterable, jobs: int) -> list:
    """``[function(item) for item in items]``, in ``jobs`` worker processes when jobs > 1."""
    items = list(items)
    out = []
    if jobs <= 1 or len(items) <= 1:
        results = (function(item) for item in items)
        pool = None
    else:
        pool = ProcessPoolExecutor(max_workers=jobs)
        results = pool.map(function, items)
    try:
        for done, result in enumerate(results, 1):
            out.append(result)
            print(f"\r  {done}/{len(items)} runs done", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        if pool is not None:
            pool.shutdown()
    return out


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def mean_std(values: Sequence[float], digits: int = 4) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    return "\n".join(lines)
