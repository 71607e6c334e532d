"""FedSpectral / FedSpectral+ reproduction: the paper's numbers beside ours.

Setup of the paper: 5 clients, 10 clusters, 40 % overlap (every undirected edge on 2 random
clients, ``split_edges`` seed 0), email-Eu-core (made undirected) and ego-Facebook. Every
federated row is a real run of the ServerApp + ClientApp through the in-process runner
(``fedcluster.inprocess.run``; the same code as ``flwr run``) over ``--seeds`` seeds, compared with the
"global clustering": central spectral clustering of the whole graph (exact top-k
eigenvectors of (I + N)/2, row-normalized, KMeans n_init=10, random_state=0).

Every row reports (docs/ALGORITHMS.md section 5 explains why the Rand index alone misleads):
Rand index (the paper's "similarity"), ARI and NMI to the global clustering, the largest
principal-angle sine between the federated and the central top-k eigenspaces, the
communication rounds and the bytes moved per client. The central-vs-central noise floor
row is the central embedding clustered with k-means seeds 1..S against seed 0.

The rounds-to-target table follows the exact protocol round by round. It uses the central
twin of the exact mode: the same server code (``ExactEigensolver``) fed with central
products ``N X`` instead of summed client replies -- identical up to round-off (the
federated runs of the main table are checked against it to 1e-8), and cheap enough to
record the sine after every round.

Usage::

    python bench/fedspectral_repro.py             # main table + rounds-to-target
    python bench/fedspectral_repro.py --sweeps    # + the paper's sweeps (Figs. 1-3)
    python bench/fedspectral_repro.py --flwr      # + per-round time in a real flwr run
    python bench/fedspectral_repro.py --privacy   # + can a server rebuild a client's edges?
    python bench/fedspectral_repro.py --quick     # email-Eu-core only, 1 seed (sweeps: 1 seed per cell)
    python bench/fedspectral_repro.py --quick --out DIR   # also writes DIR/fedspectral_repro.md

Graphs: ``--graphs DIR`` or ``$FEDCLUSTER_GRAPHS`` or ``./graphs`` (``fedcluster-fetch-graphs --out graphs``)
or the offline cache ``../shared/data/graphs``.
"""

from __future__ import annotations

import os

# Single-threaded BLAS: on a loaded 2-core machine OpenBLAS threads spin against each other
# (dense eigh slowed down 10x). Override by setting the variables yourself.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    add_bench_flags,
    figure_path,
    markdown_table,
    page_output,
    print_header,
    run_inprocess,
    svg_line_chart,
)  # noqa: E402
from fedcluster.graph import canonical_edges, load_edge_list, load_node_labels, split_edges, write_client_edge_files  # noqa: E402
from fedcluster.metrics import adjusted_rand, nmi, rand_index  # noqa: E402
from fedcluster.algorithms.fedspectral.model import ExactEigensolver, embedding_labels, row_normalize, subspace_distance  # noqa: E402
from fedcluster.central import central_eigenpairs, normalized_adjacency  # noqa: E402

K = 10
CLIENTS = 5
COPIES = 2
GRAPHS = {
    # name: (file, paper FedSpectral+ setting (iters, rounds), paper FedSpectral+ %, paper FedSpectral %)
    "email-Eu-core": ("email-Eu-core.txt", (1, 1), 99.8, 87.05),
    "ego-Facebook": ("facebook_combined.txt", (6, 20), 98.85, 77.63),
}
TARGETS = (1e-1, 1e-2, 1e-3, 1e-6)


def default_graph_dir() -> Path:
    """$FEDCLUSTER_GRAPHS, else ./graphs (fedcluster-fetch-graphs --out graphs), else the
    offline cache ../shared/data/graphs beside the project."""
    env = os.environ.get("FEDCLUSTER_GRAPHS")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    fetched = root / "graphs"
    return fetched if (fetched / "email-Eu-core.txt").is_file() else root.parent / "shared" / "data" / "graphs"


# --------------------------------------------------------------------------------------------
# Graphs, splits and the central reference
# --------------------------------------------------------------------------------------------


@dataclass
class Graph:
    name: str
    edges: np.ndarray
    n: int
    workdir: Path
    departments: np.ndarray | None = None
    _central: dict = field(default_factory=dict)
    _splits: dict = field(default_factory=dict)

    def central(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(eigenvalues (k+1), top-k eigenvectors, global clustering with seed 0)."""
        if k not in self._central:
            values, vectors = central_eigenpairs(self.edges, self.n, k + 1, seed=0)
            self._central[k] = (values, vectors[:, :k], embedding_labels(vectors[:, :k], k, 0))
        return self._central[k]

    def central_labels(self, k: int, seed: int) -> np.ndarray:
        """The central embedding clustered with k-means seed ``seed``."""
        key = ("labels", k, seed)
        if key not in self._central:
            self._central[key] = embedding_labels(self.central(k)[1], k, seed)
        return self._central[key]

    def split(self, clients: int, copies: int, seed: int = 0) -> Path:
        key = (clients, copies, seed)
        if key not in self._splits:
            directory = self.workdir / f"{self.name}-J{clients}-r{copies}-s{seed}"
            write_client_edge_files(split_edges(self.edges, clients, copies, seed), directory)
            self._splits[key] = directory
        return self._splits[key]


def load_graph(name: str, graphs: Path, workdir: Path) -> Graph:
    file = GRAPHS[name][0]
    edges = canonical_edges(load_edge_list(graphs / file))
    n = int(edges.max()) + 1
    graph = Graph(name, edges, n, workdir)
    labels_file = graphs / "email-Eu-core-department-labels.txt"
    if name == "email-Eu-core" and labels_file.is_file():
        graph.departments = load_node_labels(labels_file, n)
    return graph


def compare(graph: Graph, k: int, labels: np.ndarray, embedding: np.ndarray | None, seed: int = 0) -> dict[str, float]:
    """Agreement with the global clustering (k-means seed 0), ARI with the central embedding
    clustered with the run's own k-means seed (separates embedding error from k-means
    noise), the sine to the central eigenspace, and the departments (email-Eu-core)."""
    _, vectors, reference = graph.central(k)
    out = {
        "rand": rand_index(labels, reference),
        "ari": adjusted_rand(labels, reference),
        "nmi": nmi(labels, reference),
        "ari_same_seed": adjusted_rand(labels, graph.central_labels(k, seed)),
        "sine": subspace_distance(embedding, vectors) if embedding is not None else float("nan"),
    }
    if graph.departments is not None:
        known = graph.departments >= 0
        out["dept_ari"] = adjusted_rand(labels[known], graph.departments[known])
        out["dept_nmi"] = nmi(labels[known], graph.departments[known])
    return out


def noise_floor(graph: Graph, k: int, seeds: int) -> dict[str, Any]:
    """The exact central embedding clustered with k-means seeds 0..seeds: each of seeds
    1..seeds against the global clustering (seed 0), every pair of seeds, and the k-means
    objective (inertia) of every seed's solution."""
    from sklearn.cluster import KMeans

    _, vectors, reference = graph.central(k)
    rows = [compare(graph, k, graph.central_labels(k, seed), vectors) for seed in range(seeds + 1)]
    out: dict[str, Any] = {key: [row[key] for row in rows[1:]] for key in rows[0]}
    out["seed0"] = rows[0]
    labels = [graph.central_labels(k, seed) for seed in range(seeds + 1)]
    pairs = [(a, b) for a in range(seeds + 1) for b in range(a + 1, seeds + 1)]
    out["pair_rand"] = [rand_index(labels[a], labels[b]) for a, b in pairs]
    out["pair_ari"] = [adjusted_rand(labels[a], labels[b]) for a, b in pairs]
    out["pair_nmi"] = [nmi(labels[a], labels[b]) for a, b in pairs]
    X = row_normalize(vectors)
    out["inertia"] = [float(KMeans(k, n_init=10, random_state=seed).fit(X).inertia_) for seed in range(seeds + 1)]
    return out


# --------------------------------------------------------------------------------------------
# Federated runs (in-process runner: the real ServerApp and ClientApp)
# --------------------------------------------------------------------------------------------


def edge_copies(config: dict, copies: int) -> dict:
    """FedSpectral+ weighs every edge by 1 / edge-copies; FedSpectral does not read the key."""
    return {"edge-copies": copies} if config["algorithm"] == "fedspectral-plus" else {}


def federated(
    graph: Graph,
    config: dict[str, Any],
    seeds: int,
    clients: int = CLIENTS,
    copies: int = COPIES,
    k: int = K,
    twin_check: tuple | None = None,
) -> dict[str, Any]:
    """Run ``config`` for seeds 0..seeds-1; metrics against the global clustering."""
    data_dir = graph.split(clients, copies)
    rows = []
    for seed in range(seeds):
        out = Path(tempfile.mkdtemp(prefix="fedspectral-bench-"))
        full = {
            "k": k,
            "num-nodes": graph.n,
            "dataset": "edge-dir",
            "data-dir": str(data_dir),
            **edge_copies(config, copies),
            "seed": seed,
            "reference": False,
            "node-settle-s": 0.2,
            "output-dir": str(out),
            **config,
        }
        started = time.perf_counter()
        result = run_inprocess(full, clients)
        wall = time.perf_counter() - started
        labels = np.load(out / "labels.npy")
        embedding = np.load(out / "embedding.npy")
        row = compare(graph, k, labels, embedding, seed)
        rounds = result["rounds"]
        row.update(
            rounds=result["final"]["communication_rounds"],
            mb_per_client=(result["communication"]["bytes_up"] + result["communication"]["bytes_down"]) / clients / 1e6,
            wall=wall,
            round_seconds=statistics.median(r["seconds"] for r in rounds),
            stopped=result["final"].get("stopped", ""),
        )
        if twin_check is not None and seed == 0:  # the federated run equals its central twin
            row["twin_distance"] = subspace_distance(
                embedding, twin_embedding(graph, k, seed, *twin_check, rounds=len(rounds))
            )
        rows.append(row)
        shutil.rmtree(out, ignore_errors=True)
    return {key: [row.get(key, float("nan")) for row in rows] for key in rows[0]}


def twin_solver(graph: Graph, k: int, seed: int, block: int, method: str):
    """The exact mode's server code fed with central products (N X) instead of client sums."""
    import scipy.sparse as sp

    n = graph.n
    rows = np.concatenate([graph.edges[:, 0], graph.edges[:, 1]])
    cols = np.concatenate([graph.edges[:, 1], graph.edges[:, 0]])
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    N = normalized_adjacency(graph.edges, n)
    solver = ExactEigensolver(n, k, block, seed, method)
    first = solver.first_block()
    solver.start(A @ first)  # sum_j (1/r) A_j [1, G] = A [1, G]
    return solver, first.shape[1], (lambda X: N @ X)


def twin_embedding(graph: Graph, k: int, seed: int, block: int, method: str, rounds: int) -> np.ndarray:
    solver, _, product = twin_solver(graph, k, seed, block, method)
    for _ in range(rounds - 1):
        X = solver.next_block()
        if X is None:
            break
        solver.absorb(X, product(X))
    return solver.result()[1]


def twin_curve(graph: Graph, k: int, block: int, method: str, max_rounds: int, stop_at: float = 1e-7) -> dict[str, Any]:
    """Sine to the central top-k space after every round (round 1 = degrees + first product)."""
    _, vectors, reference = graph.central(k)
    solver, columns, product = twin_solver(graph, k, 0, block, method)
    sines, residuals, megabytes, at_target = [], [], [], {}
    sent = 0.0
    for t in range(1, max_rounds + 1):
        sent += graph.n * 8 * (2 * columns + 1) / 1e6  # down: block + degree vector; up: block
        state = solver.observe()
        sine = subspace_distance(state["embedding"], vectors)
        sines.append(sine)
        residuals.append(state["residual"])
        megabytes.append(sent)
        for target in TARGETS:
            if sine <= target and target not in at_target:
                labels = embedding_labels(state["embedding"], k, 0)
                at_target[target] = {
                    "round": t,
                    "mb": sent,
                    "residual": state["residual"],
                    "rand": rand_index(labels, reference),
                    "ari": adjusted_rand(labels, reference),
                }
        if sine <= stop_at:
            break
        X = solver.next_block()
        if X is None:
            break
        columns = X.shape[1]
        solver.absorb(X, product(X))
    return {"sines": sines, "residuals": residuals, "mb": megabytes, "at": at_target}


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def fmt(values: list[float], digits: int = 4, percent: bool = False) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    scale = 100.0 if percent else 1.0
    mean = statistics.fmean(values) * scale
    if len(values) == 1 or max(values) == min(values):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def fmt_sine(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    return f"{max(values):.1e}" if max(values) < 0.01 else f"{statistics.fmean(values):.3f}"


def row_cells(name: str, paper: str, result: dict[str, Any], departments: bool) -> list[str]:
    cells = [
        name,
        paper,
        fmt(result["rand"], 2, percent=True),
        fmt(result["ari"], 3) + (f" (min {min(result['ari']):.3f})" if len(set(result["ari"])) > 1 else ""),
        fmt(result["nmi"], 3),
        fmt(result["ari_same_seed"], 3),
        fmt_sine(result["sine"]),
        f"{statistics.fmean(result['rounds']):g}",
        f"{statistics.fmean(result['mb_per_client']):.1f}",
    ]
    if departments:
        cells += [fmt(result["dept_ari"], 3), fmt(result["dept_nmi"], 3)]
    return cells


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def main_table(graph: Graph, seeds: int) -> dict[str, Any]:
    name = graph.name
    _, (paper_iters, paper_rounds), paper_plus, paper_base = GRAPHS[name]
    values, vectors, _ = graph.central(K)
    floor = noise_floor(graph, K, seeds)
    departments = graph.departments is not None
    print(
        f"## {name}: n = {graph.n}, {graph.edges.shape[0]} undirected edges, {CLIENTS} clients, every edge on "
        f"{COPIES}\n"
    )
    print(
        f"central (I+N)/2: lambda_{K} = {values[K - 1]:.5f}, lambda_{K + 1} = {values[K]:.5f} (gap "
        f"{values[K - 1] - values[K]:.2e})\n"
    )
    rows, raw = [], {}

    def add(label: str, paper: str, config: dict, **kwargs) -> None:
        started = time.perf_counter()
        result = federated(graph, config, kwargs.pop("seeds", seeds), **kwargs)
        raw[label] = result
        rows.append(row_cells(label, paper, result, departments))
        print(f"  ... {label}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    def span(values, scale=1.0, digits=3):
        return f"{min(values) * scale:.{digits}f}–{max(values) * scale:.{digits}f}"

    floor_cells = [
        "noise floor: central, k-means seeds 1..S vs seed 0",
        "",
        span(floor["rand"], 100, 2),
        span(floor["ari"]),
        span(floor["nmi"]),
        "1",
        "0",
        "",
        "",
    ]
    pair_cells = [
        "noise floor: central, every pair of k-means seeds 0..S",
        "",
        span(floor["pair_rand"], 100, 2),
        span(floor["pair_ari"]),
        span(floor["pair_nmi"]),
        "",
        "0",
        "",
        "",
    ]
    if departments:
        floor_cells += [
            fmt([floor["seed0"]["dept_ari"]] + floor["dept_ari"], 3),
            fmt([floor["seed0"]["dept_nmi"]] + floor["dept_nmi"], 3),
        ]
        pair_cells += ["", ""]
    rows += [floor_cells, pair_cells]
    inertia = ", ".join(f"{value:.1f}" for value in floor["inertia"])
    add("FedSpectral (co-association, both-present)", f"{paper_base} %", {"algorithm": "fedspectral"})
    add(
        "FedSpectral (co-association, all-clients)",
        f"{paper_base} %",
        {"algorithm": "fedspectral", "coassociation": "all-clients"},
    )
    add(
        f"FedSpectral+ paper mode, iters {paper_iters}, rounds {paper_rounds}",
        f"{paper_plus} %",
        {"algorithm": "fedspectral-plus", "mode": "paper", "iters": paper_iters, "num-rounds": paper_rounds},
    )
    add(
        "FedSpectral+ exact, subspace iteration, block 20, 60 rounds",
        "",
        {"algorithm": "fedspectral-plus", "acceleration": "none", "num-rounds": 60},
        seeds=1,
        twin_check=(2 * K, "none"),
    )
    for block, tol in ((2 * K, 1e-5), (K, 1e-5)):
        add(
            f"FedSpectral+ exact, Krylov, block {block}, stop at residual <= {tol:g}",
            "",
            {"algorithm": "fedspectral-plus", "oversample": block - K, "num-rounds": 100, "residual-tol": tol},
            twin_check=(block, "krylov"),
        )
    add(
        "FedSpectral+ exact, Krylov, block 20, 20 rounds (defaults + num-rounds)",
        "",
        {"algorithm": "fedspectral-plus", "num-rounds": 20},
        twin_check=(2 * K, "krylov"),
    )
    headers = [
        "method",
        "paper (Rand)",
        "Rand %",
        "ARI",
        "NMI",
        "ARI same seed",
        "sine to central",
        "rounds",
        "MB/client",
    ]
    if departments:
        headers += ["ARI vs depts", "NMI vs depts"]
    print(markdown_table(headers, rows))
    twins = [f"{label}: {result['twin_distance'][0]:.1e}" for label, result in raw.items() if "twin_distance" in result]
    print(
        f"\nmean ± sd over seeds 0..{seeds - 1} (seed = start block, client and server k-means seeds; the global "
        f"clustering is fixed at seed 0; the noise-floor rows give min–max; k-means objective of the central embedding "
        f"for seeds 0..{seeds}: {inertia}); 'ARI same seed' "
        "= ARI to the central embedding clustered with the run's own k-means seed (embedding error without k-means "
        f"noise); 'sine' = largest principal-angle sine to the central top-{K} eigenspace "
        f"(max over seeds when < 0.01); MB/client = bytes up + down per client. "
        f"Federated exact runs vs their central twin (subspace distance): {'; '.join(twins)}.\n"
    )
    return raw


def rounds_to_target(graph: Graph, figures: Path | None = None, out: Path | None = None) -> None:
    print(
        f"### {graph.name}: communication rounds to reach a sine to the central top-{K} eigenspace "
        "(exact mode; round 1 = degrees + first product)\n"
    )
    rows = []
    curves = {}
    setups = [
        ("none", 20, 300),
        ("none", 40, 300),
        ("krylov", 10, 80),
        ("krylov", 15, 80),
        ("krylov", 20, 80),
        ("krylov", 30, 80),
    ]
    for method, block, max_rounds in setups:
        started = time.perf_counter()
        curve = twin_curve(graph, K, block, method, max_rounds)
        curves[("plain" if method == "none" else "Krylov") + f" b={block}"] = curve["sines"]
        at = curve["at"]
        cells = [("subspace iteration" if method == "none" else "block Krylov"), str(block)]
        cells += [str(at[t]["round"]) if t in at else f"> {len(curve['sines'])}" for t in TARGETS]
        best = at.get(1e-3)
        cells += [
            f"{best['mb']:.1f}" if best else "–",
            f"{best['residual']:.1e}" if best else "–",
            f"{100 * best['rand']:.2f} / {best['ari']:.3f}" if best else "–",
            f"{curve['sines'][59]:.2e}" if len(curve["sines"]) >= 60 else "–",
        ]
        rows.append(cells)
        print(f"  ... {method} b={block}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(
        markdown_table(
            [
                "method",
                "block",
                *(f"sine ≤ {t:g}" for t in TARGETS),
                "MB/client to 1e-3",
                "residual at 1e-3",
                "Rand % / ARI at 1e-3",
                "sine after 60 rounds",
            ],
            rows,
        )
    )
    print()
    if figures or out:
        series = {
            label: (list(range(1, min(len(sines), 80) + 1)), [math.log10(max(v, 1e-16)) for v in sines[:80]], None)
            for label, sines in curves.items()
        }
        path, link = figure_path(out, figures, __file__, f"sine-per-round-{graph.name}.svg")
        svg_line_chart(
            path,
            f"FedSpectral+ on {graph.name}: sine to the central top-{K} space",
            "communication round",
            "log10 sine",
            series,
        )
        print(f"![FedSpectral+ on {graph.name}: sine to the central space per round]({link})\n")


def performance(graph: Graph, use_flwr: bool) -> None:
    print(f"### {graph.name}: per-round cost (5 clients, in-process runner{' and flwr run' if use_flwr else ''})\n")
    data_dir = graph.split(CLIENTS, COPIES)
    setups = [
        ("exact, Krylov, block 20", {"algorithm": "fedspectral-plus", "num-rounds": 20}),
        (
            "exact, subspace iteration, block 20",
            {"algorithm": "fedspectral-plus", "acceleration": "none", "num-rounds": 20},
        ),
        ("paper mode, iters 6", {"algorithm": "fedspectral-plus", "mode": "paper", "iters": 6, "num-rounds": 20}),
    ]
    rows = []
    for label, config in setups:
        full = {
            "k": K,
            "num-nodes": graph.n,
            "dataset": "edge-dir",
            "data-dir": str(data_dir),
            **edge_copies(config, COPIES),
            "reference": False,
            "node-settle-s": 0.2,
            **config,
        }
        runners = [("in-process", lambda c: run_inprocess(c, CLIENTS))]
        if use_flwr:
            runners.append(("flwr run (simulation)", flwr_run))
        for runner, function in runners:
            out = Path(tempfile.mkdtemp(prefix="fedspectral-perf-"))
            result = function({**full, "output-dir": str(out)})
            later = result["rounds"][1:] or result["rounds"]
            rows.append(
                [
                    label,
                    runner,
                    f"{statistics.median(r['bytes_down'] for r in later) / CLIENTS / 1e3:.0f}",
                    f"{statistics.median(r['bytes_up'] for r in later) / CLIENTS / 1e3:.0f}",
                    f"{statistics.median(r['seconds'] for r in later):.3f}",
                    f"{result['wall_time_s']:.1f}",
                ]
            )
            shutil.rmtree(out, ignore_errors=True)
    print(
        markdown_table(
            ["setup", "runner", "kB down/client/round", "kB up/client/round", "s/round (median)", "run wall s"], rows
        )
    )
    print(
        f"\n(n = {graph.n}: a block of b columns is n·b·8 bytes = {graph.n * 8 / 1e3:.1f} kB per column; exact mode "
        "also sends the degree vector each round. Round 1 of exact mode carries b + 1 columns and is not in the "
        "median.)\n"
    )


def flwr_run(config: dict[str, Any]) -> dict[str, Any]:
    """The same run config through a real ``flwr run`` simulation (own SuperLink)."""
    from fedcluster.tools.flower import FlowerProcesses, run_config_text

    root = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="fedspectral-flwr-"))
    try:
        with FlowerProcesses(work, connection="bench") as flower:
            flower.start_superlink(simulation=True)
            run_id = flower.submit(root, run_config_text({**config, "node-settle-s": 1.0}), f"num-supernodes={CLIENTS}")
            status = flower.wait(run_id, timeout=900)
            if status != "finished:completed":
                raise RuntimeError(f"flwr run ended {status}:\n{flower.run_log(run_id)[-3000:]}\n{flower.all_logs()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return json.loads((Path(config["output-dir"]) / "result.json").read_text())


def privacy(graph: Graph, rounds: int = 20, sample: int = 300) -> None:
    """What a curious server can do with one client's replies (exact mode).

    In exact mode the server knows every block it sent and the global degrees, so client
    j's replies give ``Y = A_j Z`` for a known n x m matrix Z (m = b per round; round 1
    also gives the local degree vector exactly). Every row of A_j is a 0/1 vector with a
    known number of ones: a sparse-recovery problem. Orthogonal matching pursuit with the
    known local degree as sparsity, on ``sample`` random rows of client 0, for (a) the
    blocks an honest server sends (block Krylov, default block) and (b) Gaussian blocks of
    the same total size that a malicious server could send instead.
    """
    import scipy.sparse as sp
    from sklearn.linear_model import orthogonal_mp_gram

    print(
        f"### {graph.name}: can the server rebuild a client's edges from its replies? "
        f"(exact mode, {rounds} rounds, client 0 of {CLIENTS}, {sample} random nodes)\n"
    )
    part = split_edges(graph.edges, CLIENTS, COPIES, 0)[0]
    n = graph.n
    rows_ = np.concatenate([part[:, 0], part[:, 1]])
    cols_ = np.concatenate([part[:, 1], part[:, 0]])
    A_j = sp.csr_matrix((np.ones(rows_.size), (rows_, cols_)), shape=(n, n))
    local_degree = np.asarray(A_j.sum(axis=1)).ravel().astype(int)
    neighbours = A_j.tolil().rows
    block = K + max(K, 10)
    solver, _, product = twin_solver(graph, K, 0, block, "krylov")
    scale = np.zeros(n)
    scale[solver.degrees > 0] = 1.0 / np.sqrt(solver.degrees[solver.degrees > 0])
    measured = [solver.first_block()[:, 1:]]  # round 1: A_j G (and A_j 1 = local degrees)
    for _ in range(rounds - 1):
        X = solver.next_block()
        if X is None:
            break
        solver.absorb(X, product(X))
        measured.append(scale[:, None] * X)  # P_j = w D^-1/2 A_j (D^-1/2 X): A_j times this
    honest = np.hstack(measured)
    rng = np.random.default_rng(1)
    nodes = rng.choice(
        np.flatnonzero(local_degree > 0), size=min(sample, int(np.count_nonzero(local_degree))), replace=False
    )
    rows = []
    for label, Z in (
        ("honest server (protocol blocks)", honest),
        ("malicious server (Gaussian blocks)", rng.standard_normal(honest.shape)),
    ):
        gram = Z @ Z.T
        Y = A_j[nodes] @ Z
        exact_rows = found = total = 0
        for index, node in enumerate(nodes):
            coef = orthogonal_mp_gram(gram, Z @ Y[index], n_nonzero_coefs=int(local_degree[node]))
            support = set(np.flatnonzero(np.abs(coef) > 0.5).tolist())
            truth = set(neighbours[node])
            exact_rows += support == truth
            found += len(support & truth)
            total += len(truth)
        rows.append([label, str(Z.shape[1]), f"{100 * exact_rows / len(nodes):.1f} %", f"{100 * found / total:.1f} %"])
    print(
        markdown_table(
            [
                "server",
                "measurements per node (columns)",
                "nodes whose local edges are all recovered",
                "local edges recovered",
            ],
            rows,
        )
    )
    print(
        f"\n(median local degree {int(np.median(local_degree[nodes]))}; round 1 also reveals every node's local "
        "degree exactly. After about n / b rounds any server can solve for A_j by plain linear algebra.)\n"
    )


# --------------------------------------------------------------------------------------------
# Sweeps (the paper's Figs. 1-3), modest sizes
# --------------------------------------------------------------------------------------------


def sweeps(graphs: dict[str, Graph], seeds: int) -> None:
    print("## Sweeps (the paper's Figs. 1-3)\n")
    print(f"Rand % / ARI to the global clustering, mean over seeds 0..{seeds - 1}; paper mode unless said.\n")
    fb, email = graphs.get("ego-Facebook"), graphs.get("email-Eu-core")

    def cell(graph, config, **kwargs) -> str:
        result = federated(graph, config, seeds, **kwargs)
        return f"{100 * statistics.fmean(result['rand']):.2f} / {statistics.fmean(result['ari']):.3f}"

    def paper(iters, rounds):
        return {"algorithm": "fedspectral-plus", "mode": "paper", "iters": iters, "num-rounds": rounds}

    # Fig. 1a: iterations (FB 20 rounds, email 1 round)
    rows = []
    for iters in (1, 2, 4, 6, 8, 10):
        started = time.perf_counter()
        rows.append([str(iters)] + [cell(g, paper(iters, r)) if g else "–" for g, r in ((fb, 20), (email, 1))])
        print(f"  ... iters {iters}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print("### Fig. 1a: similarity vs local iterations\n")
    print(markdown_table(["iters", "ego-Facebook (20 rounds)", "email-Eu-core (1 round)"], rows) + "\n")

    # Fig. 1b / 2a: global rounds (iters 10), with exact Krylov for comparison
    rows = []
    for rounds in (1, 2, 5, 10, 20, 30):
        started = time.perf_counter()
        row = [str(rounds)]
        for g in (fb, email):
            row.append(cell(g, paper(10, rounds)) if g else "–")
            row.append(cell(g, {"algorithm": "fedspectral-plus", "num-rounds": rounds}) if g else "–")
        rows.append(row)
        print(f"  ... rounds {rounds}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(
        "### Fig. 1b / 2a: similarity vs global rounds (paper mode iters 10; exact = Krylov, default block k + max(k, "
        "10))\n"
    )
    print(markdown_table(["rounds", "FB paper", "FB exact", "email paper", "email exact"], rows) + "\n")

    # Fig. 2b: number of clusters (FB, paper iters 6 rounds 20 vs exact 20 rounds)
    if fb:
        rows = []
        for k in (2, 5, 10, 15, 20):
            started = time.perf_counter()
            rows.append(
                [
                    str(k),
                    cell(fb, paper(6, 20), k=k),
                    cell(fb, {"algorithm": "fedspectral-plus", "num-rounds": 20}, k=k),
                ]
            )
            print(f"  ... k {k}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        print("### Fig. 2b: ego-Facebook, similarity vs number of clusters k (global clustering recomputed per k)\n")
        print(markdown_table(["k", "paper mode iters 6 rounds 20", "exact Krylov 20 rounds"], rows) + "\n")

    # Fig. 3a: overlap (copies of every edge among 5 clients)
    rows = []
    for copies in (1, 2, 3, 4, 5):
        started = time.perf_counter()
        row = [f"{copies} ({100 * copies // CLIENTS} %)"]
        for g, (iters, rounds) in ((fb, (6, 20)), (email, (1, 1))):
            row.append(cell(g, paper(iters, rounds), copies=copies) if g else "–")
            row.append(cell(g, {"algorithm": "fedspectral-plus", "num-rounds": 20}, copies=copies) if g else "–")
        rows.append(row)
        print(f"  ... copies {copies}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print("### Fig. 3a: similarity vs overlap (5 clients; paper settings per graph; exact = Krylov 20 rounds)\n")
    print(markdown_table(["edge on r clients", "FB paper", "FB exact", "email paper", "email exact"], rows) + "\n")

    # Fig. 3b: number of clients at 40 % overlap, FedSpectral vs FedSpectral+
    rows = []
    for clients in (2, 5, 10):
        started = time.perf_counter()
        copies = max(1, round(0.4 * clients))
        row = [f"{clients} (r = {copies})"]
        for g, (iters, rounds) in ((fb, (6, 20)), (email, (1, 1))):
            if g is None:
                row += ["–"] * 3
                continue
            row.append(cell(g, {"algorithm": "fedspectral"}, clients=clients, copies=copies))
            row.append(cell(g, paper(iters, rounds), clients=clients, copies=copies))
            row.append(cell(g, {"algorithm": "fedspectral-plus", "num-rounds": 20}, clients=clients, copies=copies))
        rows.append(row)
        print(f"  ... clients {clients}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print("### Fig. 3b: similarity vs number of clients (40 % overlap)\n")
    print(
        markdown_table(
            ["clients", "FB FedSpectral", "FB paper", "FB exact", "email FedSpectral", "email paper", "email exact"],
            rows,
        )
        + "\n"
    )


def departments_table(email: Graph, raw: dict[str, Any], seeds: int) -> None:
    """ARI/NMI against the email-Eu-core departments (42 ground-truth classes)."""
    if email.departments is None:
        return
    print("### email-Eu-core: agreement with the 42 departments (ground truth), k = 10\n")
    floor = noise_floor(email, K, seeds)
    rows = [
        [
            "central spectral clustering (k-means seeds 0..S)",
            fmt([floor["seed0"]["dept_ari"]] + floor["dept_ari"], 3),
            fmt([floor["seed0"]["dept_nmi"]] + floor["dept_nmi"], 3),
        ]
    ]
    for label, result in raw.items():
        rows.append([label, fmt(result["dept_ari"], 3), fmt(result["dept_nmi"], 3)])
    # central spectral with k = 42 (the number of departments), for scale
    _, vectors, labels = email.central(42)
    known = email.departments >= 0
    rows.append(
        [
            "central spectral clustering, k = 42",
            f"{adjusted_rand(labels[known], email.departments[known]):.3f}",
            f"{nmi(labels[known], email.departments[known]):.3f}",
        ]
    )
    print(markdown_table(["method", "ARI vs departments", "NMI vs departments"], rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=Path, default=default_graph_dir())
    parser.add_argument("--seeds", type=int, default=None, help="seeds per federated row (default 5, quick 1)")
    parser.add_argument("--sweep-seeds", type=int, default=None, help="seeds per sweep cell (default 2, quick 1)")
    parser.add_argument("--only", choices=sorted(GRAPHS), default=None, help="one graph only")
    parser.add_argument("--sweeps", action="store_true", help="also run the paper's sweeps (Figs. 1-3)")
    parser.add_argument("--no-main", action="store_true", help="skip the main table (e.g. with --sweeps)")
    parser.add_argument(
        "--flwr", action="store_true", help="also time ego-Facebook rounds in a real flwr run simulation"
    )
    parser.add_argument(
        "--privacy", action="store_true", help="also try to rebuild a client's edges from its replies (ego-Facebook)"
    )
    parser.add_argument(
        "--convergence-only", action="store_true", help="only the rounds-to-target tables (plain vs Krylov)"
    )
    parser.add_argument("--figures", type=Path, default=None, help="write sine-per-round SVGs (plain vs Krylov) here")
    add_bench_flags(parser, quick="email-Eu-core only (unless --only), 1 seed per row and per sweep cell")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 5)
    args.sweep_seeds = args.sweep_seeds or (1 if args.quick else 2)
    if args.quick and not args.only:
        args.only = "email-Eu-core"
    if not (args.graphs / "email-Eu-core.txt").is_file():
        print(f"SNAP graphs not found in {args.graphs} (use --graphs or $FEDCLUSTER_GRAPHS)", file=sys.stderr)
        return 2
    with page_output(args.out, __file__):
        print_header("FedSpectral / FedSpectral+ reproduction", __doc__)
        workdir = Path(tempfile.mkdtemp(prefix="fedspectral-splits-"))
        try:
            names = [args.only] if args.only else list(GRAPHS)
            graphs = {name: load_graph(name, args.graphs, workdir) for name in names}
            if args.convergence_only:
                for graph in graphs.values():
                    rounds_to_target(graph, args.figures, args.out)
            elif not args.no_main:
                raws = {}
                for name, graph in graphs.items():
                    raws[name] = main_table(graph, args.seeds)
                    rounds_to_target(graph, args.figures, args.out)
                if "email-Eu-core" in graphs:
                    departments_table(graphs["email-Eu-core"], raws["email-Eu-core"], args.seeds)
                if "ego-Facebook" in graphs:
                    performance(graphs["ego-Facebook"], args.flwr)
            if args.privacy and "ego-Facebook" in graphs:
                privacy(graphs["ego-Facebook"])
            if args.sweeps:
                sweeps(graphs, args.sweep_seeds)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
