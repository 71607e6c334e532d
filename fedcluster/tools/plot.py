"""Pictures of a finished run, from its ``result.json`` (and, optionally, one device's points).

``fedcluster-plot RUN_DIR [--points POINTS.npy] [--out DIR] [--overwrite]`` writes PNGs into
``RUN_DIR`` (or ``--out``; pictures already there are replaced only with ``--overwrite``) and
prints which it wrote and which it skipped, with the reason:

- ``cost.png``          cost per point per round, beside the pooled central cost when the run
                        measured it (``reference``);
- ``communication.png`` bytes up and down per round;
- ``replies.png``       replies and failures (by kind) per round;
- ``privacy.png``       FedDP-KMeans: ε spent by each privacy step;
- ``spectral.png``      FedSpectral+: subspace change and Ritz residual per round (log scale);
- ``k_range.png``       a ``k-range`` run: cost and Calinski–Harabasz score per k, the
                        elbow and the chosen k;
- ``bic.png``           a mixture's ``k-range`` run: BIC per k and the chosen k;
- ``points.png``        with ``--points``: that device's points (2-D, or their top-2 principal
                        components) coloured by nearest center, and the centers.

matplotlib is an optional extra: ``pip install 'fedcluster[plot]'``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..data import DataError, load_points
from ..lloyd import nearest
from .assign import run_centers
from .cli import ToolParser, output_folder, refuse

INSTALL_HINT = "matplotlib is not installed: pip install 'fedcluster[plot]' (or pip install matplotlib)"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise DataError(INSTALL_HINT) from None
    return plt


def load_result(run_dir: str | Path) -> dict[str, Any]:
    file = Path(run_dir) / "result.json"
    if not file.is_file():
        raise DataError(f"{file} does not exist: give the output folder of a finished run")
    try:
        result = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{file} is not valid JSON ({exc}): was the run interrupted?") from None
    except RecursionError:
        raise DataError(f"{file} nests its JSON too deeply to be a run's record") from None
    if not isinstance(result, dict):
        raise DataError(f"{file} holds a JSON {type(result).__name__}, not a run's record (a JSON object)")
    return result


# A value larger than this cannot be drawn (matplotlib's axis arithmetic overflows).
LARGEST_DRAWN = 1e300


class FieldError(DataError):
    """A field of result.json that cannot be read or drawn (the other pictures still are)."""


def _number(value: Any, field: str) -> float:
    """``value`` as a float that can be drawn, or a DataError that names ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"result.json {field} = {value!r} is not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise FieldError(f"result.json {field} is an integer too large to draw (at most {LARGEST_DRAWN:g})") from None
    if not np.isfinite(number) or abs(number) > LARGEST_DRAWN:
        raise FieldError(f"result.json {field} = {value!r} is too large to draw (at most {LARGEST_DRAWN:g})")
    return number


def _rounds(result: dict[str, Any]) -> list[dict[str, Any]]:
    rounds = result.get("rounds", [])
    if not isinstance(rounds, list):
        raise FieldError(f"result.json rounds is a {type(rounds).__name__}, not a list of rounds")
    for i, record in enumerate(rounds):
        if not isinstance(record, dict):
            raise FieldError(f"result.json rounds[{i}] is a {type(record).__name__}, not a round's record")
        _number(record.get("round"), f"rounds[{i}].round")
    return rounds


def _save(fig, plt, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _series(rounds: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """The rounds that recorded ``key`` and its values (a round without it is left out; a
    value that is not a number that can be drawn is an error naming the field)."""
    pairs = [
        (_number(r["round"], f"rounds[{i}].round"), _number(r[key], f"rounds[{i}].{key}"))
        for i, r in enumerate(rounds)
        if r.get(key) is not None
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _title(result: dict[str, Any]) -> str:
    config = result.get("config")
    k = config.get("k", "?") if isinstance(config, dict) else "?"
    return f"{result.get('algorithm', '?')}, k = {k}"


def plot_cost(result: dict[str, Any], plt, path: Path) -> str | None:
    x, y = _series(_rounds(result), "cost")
    if not x:
        return "no round recorded a cost (FedDP keeps costs private; eval-every = 0; one-shot run)"
    reference = result.get("reference") or {}
    central = (
        _number(reference["central_cost"], "reference.central_cost")
        if isinstance(reference, dict) and reference.get("central_cost") is not None
        else None
    )
    best = result.get("best_seen")
    marked = (
        (_number(best.get("round"), "best_seen.round"), _number(best.get("cost"), "best_seen.cost"))
        if isinstance(best, dict) and best
        else None
    )
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(x, y, marker="o" if len(x) <= 30 else None, label="federated cost per point")
    if central is not None:
        ax.axhline(central, color="black", linestyle="--", label="central k-means (pooled)")
    if marked:
        ax.plot([marked[0]], [marked[1]], "v", color="tab:green", label=f"returned: the cheapest (round {marked[0]:g})")
    ax.set(xlabel="round", ylabel="cost per point", title=f"Cost per round: {_title(result)}")
    ax.legend()
    return _save(fig, plt, path)


def plot_communication(result: dict[str, Any], plt, path: Path) -> str | None:
    x, up = _series(_rounds(result), "bytes_up")
    _, down = _series(_rounds(result), "bytes_down")
    if not x or len(down) != len(x):
        return "no round recorded its bytes"
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(x, np.asarray(up) / 1e3, marker="o" if len(x) <= 30 else None, label="up (devices → server)")
    ax.plot(x, np.asarray(down) / 1e3, marker="s" if len(x) <= 30 else None, label="down (server → devices)")
    ax.set(xlabel="round", ylabel="kB of arrays", title=f"Communication per round: {_title(result)}")
    ax.legend()
    return _save(fig, plt, path)


def plot_replies(result: dict[str, Any], plt, path: Path) -> str | None:
    rounds = _rounds(result)
    if not rounds:
        return "no rounds recorded"
    x = [_number(r["round"], f"rounds[{i}].round") for i, r in enumerate(rounds)]
    replies = np.array([_number(r.get("replies", 0), f"rounds[{i}].replies") for i, r in enumerate(rounds)])
    for i, r in enumerate(rounds):
        failures = r.get("failures", [])
        if not isinstance(failures, list) or not all(isinstance(f, dict) for f in failures):
            raise FieldError(f"result.json rounds[{i}].failures is not a list of failure records")
    kinds = sorted({str(f.get("kind", "error")) for r in rounds for f in r.get("failures", [])})
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.bar(x, replies, label="valid replies (every phase of the round)", color="tab:blue")
    bottom = replies.copy()
    for kind in kinds:
        counts = np.array(
            [sum(str(f.get("kind", "error")) == kind for f in r.get("failures", [])) for r in rounds], float
        )
        ax.bar(x, counts, bottom=bottom, label=f"failed: {kind}")
        bottom += counts
    ax.set(xlabel="round", ylabel="replies", title=f"Replies and failures per round: {_title(result)}")
    ax.legend()
    return _save(fig, plt, path)


def plot_privacy(result: dict[str, Any], plt, path: Path) -> str | None:
    privacy = result.get("privacy") or {}
    steps = (privacy.get("steps") if isinstance(privacy, dict) else None) or []
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise FieldError("result.json privacy.steps is not a list of step records")
    steps = [
        (str(s.get("name", f"step {i + 1}")), _number(s["epsilon"], f"privacy.steps[{i}].epsilon"))
        for i, s in enumerate(steps)
        if s.get("epsilon") is not None
    ]
    if not steps:
        return "not a FedDP-KMeans run (no privacy steps)"
    total = privacy.get("epsilon")
    total = _number(total, "privacy.epsilon") if total is not None else None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.bar(range(len(steps)), [epsilon for _, epsilon in steps], color="tab:purple")
    ax.set_xticks(range(len(steps)), [name for name, _ in steps], rotation=30, ha="right")
    ax.set(
        ylabel="ε of the step alone",
        title="Privacy budget per step" + (f" (composed total ε = {total:.3g})" if total else ""),
    )
    ax.set_xlabel("step (the composed total, by PLD accounting, is below the sum of the steps)", fontsize=9)
    return _save(fig, plt, path)


def plot_spectral(result: dict[str, Any], plt, path: Path) -> str | None:
    rounds = _rounds(result)
    x1, change = _series(rounds, "subspace_change")
    x2, residual = _series(rounds, "residual")
    if not x1 and not x2:
        return "not a FedSpectral+ run (no subspace change or residual per round)"
    fig, ax = plt.subplots(figsize=(6.4, 4))
    if x1:
        ax.semilogy(x1, np.maximum(change, 1e-300), marker="o", label="subspace change (sine)")
    if x2:
        ax.semilogy(x2, np.maximum(residual, 1e-300), marker="s", label="largest top-k Ritz residual")
    ax.set(xlabel="round", ylabel="log scale", title=f"Eigenspace convergence: {_title(result)}")
    ax.legend()
    return _save(fig, plt, path)


def plot_k_range(result: dict[str, Any], plt, path: Path) -> str | None:
    report = result.get("k_range")
    if not report:
        return "not a k-range run"
    if not isinstance(report, dict):
        raise FieldError("result.json k_range is not a record")
    try:
        ks, cost, ch = (
            [_number(v, f"k_range.{key}[{i}]") for i, v in enumerate(report[key])]
            for key in ("k", "cost", "calinski_harabasz")
        )
        elbow, best_k = (_number(report[key], f"k_range.{key}") for key in ("elbow_k", "calinski_harabasz_k"))
    except (KeyError, TypeError) as exc:
        raise FieldError(f"result.json k_range lacks a readable {exc}") from None
    report = {**report, "elbow_k": int(elbow), "calinski_harabasz_k": int(best_k)}
    fig, left = plt.subplots(figsize=(6.4, 4))
    left.plot(ks, cost, marker="o", color="tab:blue", label="cost per point (best candidate)")
    left.axvline(report["elbow_k"], color="tab:blue", linestyle=":", label=f"elbow: k = {report['elbow_k']}")
    left.set(xlabel="k", ylabel="cost per point", title="Choosing k (one federated scoring round)")
    right = left.twinx()
    right.plot(ks, ch, marker="s", color="tab:orange", label="Calinski–Harabasz")
    right.axvline(
        report["calinski_harabasz_k"],
        color="tab:orange",
        linestyle="--",
        label=f"CH maximum: k = {report['calinski_harabasz_k']}",
    )
    right.set_ylabel("Calinski–Harabasz (higher is better)")
    lines = left.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    left.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
    return _save(fig, plt, path)


def plot_bic(result: dict[str, Any], plt, path: Path) -> str | None:
    report = result.get("bic_range")
    if not report:
        return "not a mixture's k-range run"
    if not isinstance(report, dict):
        raise FieldError("result.json bic_range is not a record")
    try:
        ks, bic = ([_number(v, f"bic_range.{key}[{i}]") for i, v in enumerate(report[key])] for key in ("k", "bic"))
        chosen = _number(report["chosen_k"], "bic_range.chosen_k")
    except (KeyError, TypeError) as exc:
        raise FieldError(f"result.json bic_range lacks a readable {exc}") from None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(ks, bic, marker="o", label="BIC (lower is better)")
    ax.axvline(chosen, color="tab:orange", linestyle="--", label=f"chosen: k = {chosen:g}")
    ax.set(xlabel="k (components)", ylabel="BIC", title=f"Choosing k: {_title(result)}")
    ax.legend()
    return _save(fig, plt, path)


def device_points(run_dir: Path, points_file: str | None) -> tuple[np.ndarray, np.ndarray] | str:
    """A device's points and the run's centers, checked before anything is drawn (a
    DataError names the file), or why there is nothing to draw."""
    if not points_file:
        return "no --points given (a device's own points)"
    if not (run_dir / "centers.npy").is_file():
        return f"{run_dir / 'centers.npy'} does not exist (graph runs have no centers)"
    centers = run_centers(run_dir)
    points = load_points(points_file)
    if points.shape[1] != centers.shape[1]:
        raise DataError(f"{points_file} has {points.shape[1]} features, the run's centers {centers.shape[1]}")
    return points, centers


def plot_points(points_file: str | None, drawn: tuple[np.ndarray, np.ndarray] | str, plt, path: Path) -> str | None:
    if isinstance(drawn, str):
        return drawn
    points, centers = drawn
    labels = nearest(points, centers)
    if points.shape[1] == 1:  # 1-D: the points along x, spread a little in y to be seen
        jitter = np.random.default_rng(0).uniform(-0.4, 0.4, size=(len(points), 1))
        P, C, axes = np.hstack([points, jitter]), np.hstack([centers, np.zeros((len(centers), 1))]), ("x", "(jitter)")
    elif points.shape[1] == 2:
        P, C, axes = points, centers, ("x₁", "x₂")
    else:  # top-2 principal components of this device's points (computed here, on the device)
        mean = points.mean(0)
        _, _, vt = np.linalg.svd(points - mean, full_matrices=False)
        basis = vt[:2].T if vt.shape[0] >= 2 else np.eye(points.shape[1])[:, :2]
        P, C, axes = (points - mean) @ basis, (centers - mean) @ basis, ("PC 1 (this device)", "PC 2 (this device)")
    fig, ax = plt.subplots(figsize=(6.4, 5))
    ax.scatter(P[:, 0], P[:, 1], c=labels, cmap="tab20", s=8, alpha=0.7)
    ax.scatter(C[:, 0], C[:, 1], marker="X", s=120, c="black", label="centers")
    ax.set(xlabel=axes[0], ylabel=axes[1], title=f"{Path(points_file).name}: {len(points)} points, nearest center")
    ax.legend()
    return _save(fig, plt, path)


PICTURES = (
    "cost.png",
    "communication.png",
    "replies.png",
    "privacy.png",
    "spectral.png",
    "k_range.png",
    "bic.png",
    "points.png",
)


def plot_run(
    run_dir: str | Path, points: str | None = None, out: str | Path | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Write every picture that applies; return ``{"written": [...], "skipped": {name: reason}}``.
    Pictures already in the folder are replaced only with ``overwrite`` (else UsageError)."""
    run_dir = Path(run_dir)
    result = load_result(run_dir)
    folder = output_folder(
        run_dir if out is None else out, "RUN_DIR" if out is None else "--out", writes=PICTURES, overwrite=overwrite
    )
    drawn = device_points(run_dir, points)
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written, skipped = [], {}
    for name, draw in (
        ("cost.png", lambda p: plot_cost(result, plt, p)),
        ("communication.png", lambda p: plot_communication(result, plt, p)),
        ("replies.png", lambda p: plot_replies(result, plt, p)),
        ("privacy.png", lambda p: plot_privacy(result, plt, p)),
        ("spectral.png", lambda p: plot_spectral(result, plt, p)),
        ("k_range.png", lambda p: plot_k_range(result, plt, p)),
        ("bic.png", lambda p: plot_bic(result, plt, p)),
        ("points.png", lambda p: plot_points(points, drawn, plt, p)),
    ):
        try:
            reason = draw(folder / name)
        except FieldError as exc:  # a field it cannot read: say which, draw the rest
            reason = f"cannot draw it: {exc}"
            plt.close("all")
        if reason is None:
            written.append(str(folder / name))
        else:
            skipped[name] = reason
    return {"written": written, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(prog="fedcluster-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="output folder of a finished run (result.json)")
    parser.add_argument("--points", help="one device's points (.npy/.csv) to draw with the centers")
    parser.add_argument("--out", help="write the PNGs here instead of RUN_DIR")
    parser.add_argument("--overwrite", action="store_true", help="replace pictures already in the folder")
    args = parser.parse_args(argv)
    try:
        report = plot_run(args.run_dir, args.points, args.out, args.overwrite)
    except (DataError, ValueError, OSError) as exc:
        return refuse("fedcluster-plot", exc)
    for file in report["written"]:
        print(f"wrote   {file}")
    for name, reason in report["skipped"].items():
        print(f"skipped {name}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
