"""Shared helpers of the benchmark scripts: the two flags every script takes (``--quick``,
``--out DIR``) and the page ``--out`` writes, machine info, quiet in-process runs, tables.

Not a library module: the scripts in ``bench/`` import it after putting the repository
root on ``sys.path``, so they run from a checkout without installing anything extra.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --------------------------------------------------------------------------- --quick, --out
def add_bench_flags(parser: argparse.ArgumentParser, *, quick: str, out: str | None = None) -> argparse.ArgumentParser:
    """Add the two flags every benchmark script takes and return ``parser``.

    ``--quick`` (``args.quick``): the fast smoke version; ``quick`` is its help, what the
    smaller run does. ``--out DIR`` (``args.out``: a ``Path``, or None without the flag):
    also write the printed page to ``DIR/<script>.md`` through :func:`page_output`;
    ``out`` replaces the help where the script writes more files into DIR.
    """
    parser.add_argument("--quick", action="store_true", help=f"fast smoke version: {quick}")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=out or "also write what is printed (header and tables) to DIR/<script name>.md",
    )
    return parser


class _Tee:
    """``sys.stdout`` that also writes into ``file``, flushed at every write, from the
    process that made it only: a forked worker inherits it, and its prints go to the
    terminal as before but never into the file."""

    def __init__(self, stream: Any, file: Any) -> None:
        self._stream, self._file, self._pid = stream, file, os.getpid()

    def _mine(self) -> bool:
        return os.getpid() == self._pid and not self._file.closed

    def write(self, text: str) -> int:
        if self._mine():
            self._file.write(text)
            self._file.flush()
        return self._stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._mine():
            self._file.flush()
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, ... of the real stream
        return getattr(self._stream, name)


@contextlib.contextmanager
def page_output(out: str | Path | None, script: str | Path) -> Iterator[Path | None]:
    """Everything printed to ``sys.stdout`` inside the block still goes there and is copied
    into ``out/<script's stem>.md`` (``out`` is created; pass ``__file__`` as ``script``).
    The file is written as the text comes and closed on the way out, also when the block
    raises (then a last line says why the run stopped). Output of worker processes (forked
    or started anew) and of subprocesses is not copied. Without ``out`` it does nothing
    and yields None; with it, the page's path.
    """
    if not out:
        yield None
        return
    path = Path(out) / f"{Path(script).stem}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = sys.stdout
    with open(path, "w", encoding="utf-8") as file:
        sys.stdout = _Tee(previous, file)
        try:
            yield path
        except BaseException as exc:
            if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
                file.write(f"\n(the run stopped early: {type(exc).__name__}: {exc})\n")
            raise
        finally:
            sys.stdout = previous
            previous.flush()
    print(f"page: {path}", file=sys.stderr)


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
    threads = {
        key: os.environ[key]
        for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        if key in os.environ
    }
    lines = [
        f"machine : {platform.node()} {platform.system()} {platform.machine()}, {cpu_model()}",
        f"nproc   : {usable} usable of {os.cpu_count()}" + (f"  ({threads})" if threads else ""),
        f"load avg: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min, at start; other work on the machine "
        "skews timings)",
        f"versions: {', '.join(versions)}",
        f"command : python {_public_command(sys.argv)}",
        f"code    : {code_version()}",
    ]
    return "\n".join(lines)


def _public_command(argv: list[str]) -> str:
    """The command line without this machine's paths: a data folder given to ``--battery``
    is DIR, an absolute ``--out`` folder its last name."""
    words = list(argv)
    for i, word in enumerate(words[:-1]):
        if word == "--battery":
            words[i + 1] = "DIR"
        elif word == "--out" and os.path.isabs(words[i + 1]):
            words[i + 1] = os.path.basename(words[i + 1].rstrip("/"))
    return shlex.join(words)


def code_version() -> str:
    """The commit of the code that runs (and whether it has uncommitted changes; the docs,
    where pages and figures are being written, are output, not code)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def print_header(title: str, doc: str | None = None) -> None:
    """The page's title, what the script measures (``doc``: its docstring, up to its
    ``Usage::``), and the machine, command and commit of this run."""
    print(f"# {title}\n")
    if doc:
        print(f"Written by `bench/{Path(sys.argv[0]).name}`.\n")
        print(doc.split("Usage::")[0].strip() + "\n")
    print("```")
    print(machine_info())
    print("```\n", flush=True)


def figure_path(out: str | Path | None, default: Path, script: str | Path, name: str) -> tuple[Path, str]:
    """Where a page's figure goes and how the page links it: beside the page
    (``out/<script>-<name>``, linked by its file name) when the run writes a page, else
    ``default/name``."""
    if out:
        path = Path(out) / f"{Path(script).stem}-{name}"
        return path, path.name
    return default / name, str(default / name)


def quiet_flower() -> None:
    """Silence Flower's INFO log (one line per round otherwise)."""
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


def interleaved_times(functions: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each function over ``repeats`` rounds after one warm-up call each, the
    functions taking turns within a round, so that a burst of other load hits all of them
    alike."""
    import time

    for function in functions.values():
        function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return times


def run_inprocess(config: dict[str, Any], num_nodes: int) -> dict[str, Any]:
    """One in-process federation; the result.json dict.

    Without an ``output-dir`` in ``config`` the run writes to a temporary directory that
    is removed afterwards; the final centers (``centers.npy``) are then returned in
    ``result["centers"]`` (None if the run wrote none).
    """
    quiet_flower()
    import numpy as np

    from fedcluster.inprocess import run

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


def nice_step(raw: float) -> float:
    """The tick step of 1, 2 or 5 times a power of ten nearest above ``raw``."""
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#555555", "#9467bd", "#ff7f0e", "#8c564b")


def svg_line_chart(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None]],
    width: int = 640,
    height: int = 400,
    xtick_labels: dict[float, str] | None = None,
) -> None:
    """A plain SVG line chart (no plotting library needed): one polyline per series
    ``label -> (xs, ys, errors or None)`` with error bars, linear axes, a legend.
    ``xtick_labels`` (x -> text) replaces the x ticks, e.g. for categories at 0, 1, 2."""
    xs = [x for s in series.values() for x in s[0]]
    lows = [y - (e or 0.0) for s in series.values() for y, e in zip(s[1], s[2] or [0.0] * len(s[1]))]
    highs = [y + (e or 0.0) for s in series.values() for y, e in zip(s[1], s[2] or [0.0] * len(s[1]))]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(lows), max(highs)
    pad = (y1 - y0) * 0.05 or abs(y1) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    L, R, T, B = 70, 170, 30, 50

    def px(x: float) -> float:
        return L + (x - x0) / ((x1 - x0) or 1.0) * (width - L - R)

    def py(y: float) -> float:
        return T + (1 - (y - y0) / (y1 - y0)) * (height - T - B)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{L}" y="18" font-size="14">{title}</text>',
        f'<line x1="{L}" y1="{height - B}" x2="{width - R}" y2="{height - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{height - B}" stroke="black"/>',
        f'<text x="{(L + width - R) / 2}" y="{height - 12}" text-anchor="middle">{xlabel}</text>',
        f'<text x="16" y="{(T + height - B) / 2}" transform="rotate(-90 16 {(T + height - B) / 2})" '
        f'text-anchor="middle">{ylabel}</text>',
    ]
    ticks = sorted(set(xs))
    if len(ticks) > 12:  # many points (e.g. rounds): round ticks instead of one per point
        xstep = nice_step((x1 - x0) / 8)
        ticks = [t * xstep for t in range(math.ceil(x0 / xstep), math.floor(x1 / xstep) + 1)]
    dense = len(set(xs)) > 20  # no markers, no error-bar offsets
    labels = {t: f"{t:g}" for t in ticks} if xtick_labels is None else dict(xtick_labels)
    for x in labels:
        out.append(f'<line x1="{px(x):.1f}" y1="{height - B}" x2="{px(x):.1f}" y2="{height - B + 5}" stroke="black"/>')
        out.append(f'<text x="{px(x):.1f}" y="{height - B + 18}" text-anchor="middle">{labels[x]}</text>')
    step = nice_step((y1 - y0) / 6)
    y = math.ceil(y0 / step) * step
    while y <= y1:
        out.append(f'<line x1="{L - 5}" y1="{py(y):.1f}" x2="{L}" y2="{py(y):.1f}" stroke="black"/>')
        out.append(f'<text x="{L - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{round(y, 10):g}</text>')
        y += step
    for index, (label, (sx, sy, se)) in enumerate(series.items()):
        color = SERIES_COLORS[index % len(SERIES_COLORS)]
        shift = 0.0 if dense else (index - (len(series) - 1) / 2) * 3.0  # keep overlapping error bars apart
        points = " ".join(f"{px(x) + shift:.1f},{py(y):.1f}" for x, y in zip(sx, sy))
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, e in zip(sx, sy, se or [None] * len(sx)):
            if dense and not e:
                continue
            out.append(f'<circle cx="{px(x) + shift:.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
            if e:
                out.append(
                    f'<line x1="{px(x) + shift:.1f}" y1="{py(y - e):.1f}" x2="{px(x) + shift:.1f}" '
                    f'y2="{py(y + e):.1f}" stroke="{color}"/>'
                )
        ly = T + 10 + 18 * index
        out.append(
            f'<line x1="{width - R + 10}" y1="{ly}" x2="{width - R + 35}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{width - R + 40}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


# --------------------------------------------------------------------------- flwr run
class SimulationSuperLink:
    """A ``flower-superlink --insecure --simulation`` of our own for ``flwr run``
    (:class:`fedcluster.tools.flower.FlowerProcesses`, the project's one launcher of Flower
    processes): a temporary folder with a private FLWR_HOME (connection ``bench``) and the
    logs, free loopback ports; stopped by process group on exit, and the folder removed
    unless ``keep`` or a run failed (``self.failed``). Never touches the shared local
    SuperLink of ``flwr run .``.
    """

    def __init__(self, keep: bool = False) -> None:
        from fedcluster.tools.flower import FlowerProcesses

        self.keep = keep
        self.failed = False
        self.processes = FlowerProcesses(Path(tempfile.mkdtemp(prefix="fedcluster-bench-flwr-")), connection="bench")
        self.home = self.processes.home
        self.log_file = self.processes.logs / "superlink.log"
        self.command: list[str] = []

    def __enter__(self) -> "SimulationSuperLink":
        try:
            self.processes.start_superlink(simulation=True)
        except BaseException:
            self.failed = True
            self.__exit__(None, None, None)
            raise
        args = list(self.processes.processes["superlink"].args)
        self.command = [Path(args[0]).name] + args[1:]  # the executable by name: a page carries no machine's paths
        return self

    def run(self, app_dir: Path, run_config: dict[str, Any], supernodes: int, timeout: float = 3600):
        """``flwr run APP bench --stream`` with ``num-supernodes`` simulated nodes; returns
        (CompletedProcess, wall seconds of the command). The caller checks the run's own
        output: ``flwr run --stream`` exits 0 even when the run failed."""
        from fedcluster.tools.flower import run_config_text

        return self.processes.run_streamed(
            app_dir, run_config_text(run_config), f"num-supernodes={supernodes}", timeout
        )

    def __exit__(self, *exc_info) -> None:
        import shutil

        self.processes.stop()
        if self.keep or self.failed or exc_info[0] is not None:
            print(f"kept {self.processes.workdir} (FLWR_HOME, SuperLink log: {self.log_file})")
        else:
            shutil.rmtree(self.processes.workdir, ignore_errors=True)
