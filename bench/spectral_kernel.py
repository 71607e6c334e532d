"""Benchmark: the FedSpectral+ device power step against scipy.sparse.

On ego-Facebook (``facebook_combined.txt``, n = 4039, 88,234 undirected edges) with an
``n x b`` block (default b = 10) it times

* the raw adjacency product ``A @ X``: :class:`fedcluster.graph.AdjacencyOperator` on its
  default path (a ``scipy.sparse`` CSR matrix where SciPy is installed) and on its NumPy
  path (``sparse=False``, what a device without SciPy runs) vs a
  ``scipy.sparse.csr_matrix`` built here from the same edges;
* the normalized product ``diag(w D^{-1/2}) A_j diag(D^{-1/2}) Q`` that the device task
  computes, on the default path, vs the equivalent scipy product ``N @ Q`` with a
  precomputed normalized CSR matrix (target: ≤ 1.1 × scipy), and the whole device task
  ``power_step`` (global normalization, one product, including the request's validation)
  on both paths against the same;

for the full graph and for one client's share (5 clients, every edge on 2 of them), and
prints the ratios (our time / scipy time; lower is better, 1 = as fast as scipy).
Timings are the median over many repetitions, each compared pair taking turns (the
NumPy path is timed apart: its gathers would evict the others' matrices from the cache).

Run: ``python bench/spectral_kernel.py [--graphs DIR] [--block 10] [--repeats 200]``;
``--quick``: 20 repetitions instead of 200 (the same two rows); ``--out DIR`` also writes the
page to ``DIR/spectral_kernel.md``.
The graph directory defaults to ``$FEDCLUSTER_GRAPHS`` or ``./graphs`` (``fedcluster-fetch-graphs --out graphs``)
or the offline cache ``../shared/data/graphs`` next to the project.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_bench_flags, interleaved_times, markdown_table, page_output, print_header  # noqa: E402
from fedcluster.algorithms.fedspectral.device import power_step  # noqa: E402
from fedcluster.algorithms.fedspectral.model import local_degrees  # noqa: E402
from fedcluster.graph import AdjacencyOperator, _CachedGraph, canonical_edges, load_edge_list, local_graph, split_edges  # noqa: E402
from fedcluster.kernel import DeviceData  # noqa: E402


def default_graph_dir() -> Path:
    """$FEDCLUSTER_GRAPHS, else ./graphs (fedcluster-fetch-graphs --out graphs), else the
    offline cache ../shared/data/graphs beside the project."""
    env = os.environ.get("FEDCLUSTER_GRAPHS")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    fetched = root / "graphs"
    return fetched if (fetched / "email-Eu-core.txt").is_file() else root.parent / "shared" / "data" / "graphs"


def median_times(functions: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function (:func:`bench._common.interleaved_times`)."""
    return {name: float(np.median(values)) for name, values in interleaved_times(functions, repeats).items()}


def bench(
    edges: np.ndarray,
    n: int,
    block: int,
    repeats: int,
    label: str,
    degrees: np.ndarray | None = None,
    weight: float = 1.0,
) -> dict:
    import scipy.sparse as sp

    graph = canonical_edges(edges)
    rows = np.concatenate([graph[:, 0], graph[:, 1]])
    cols = np.concatenate([graph[:, 1], graph[:, 0]])
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    operator = AdjacencyOperator(graph, n)
    numpy_operator = AdjacencyOperator(graph, n, sparse=False)
    assert operator.sparse, "SciPy is installed here, so the default path must use it"
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, block))
    for op in (operator, numpy_operator):
        assert np.allclose(op.matmat(X), A @ X, rtol=0, atol=1e-10)

    device = DeviceData(edges=edges, source=label)
    numpy_device = DeviceData(edges=edges, source=label)
    numpy_device.extra["fedcluster.graph.adjacency"] = _CachedGraph(numpy_device.edges, numpy_operator)
    if degrees is None:
        degrees = local_degrees(device, n)
    scale = np.zeros(n)
    scale[degrees > 0] = 1.0 / np.sqrt(degrees[degrees > 0])
    N = (sp.diags(scale) @ A @ sp.diags(scale)).tocsr() * weight
    config = {"num-nodes": n, "normalization": "global", "iters": 1, "edge-weight": weight}
    arrays = {"Q": X, "degrees": degrees}
    for d in (device, numpy_device):
        assert np.allclose(power_step(d, arrays, config)[0]["Q"], N @ X, rtol=0, atol=1e-12)
    assert local_graph(numpy_device, n) is numpy_operator and not numpy_operator.sparse

    t = median_times({"scipy": lambda: A @ X, "ours": lambda: operator.matmat(X)}, repeats)
    product = operator.scaled(weight * scale, scale)  # what power_step keeps and calls
    assert np.allclose(product(X), N @ X, rtol=0, atol=1e-12)
    t.update(
        median_times(
            {
                "scipy N": lambda: N @ X,
                "product": lambda: product(X),
                "task": lambda: power_step(device, arrays, config),
            },
            repeats,
        )
    )
    t.update(
        median_times(
            {"numpy": lambda: numpy_operator.matmat(X), "numpy task": lambda: power_step(numpy_device, arrays, config)},
            repeats,
        )
    )
    ratio = t["product"] / t["scipy N"]
    row = [
        label,
        graph.shape[0],
        f"{t['scipy'] * 1e3:.3f}",
        f"{t['ours'] / t['scipy']:.2f}",
        f"{t['numpy'] / t['scipy']:.2f}",
        f"{t['scipy N'] * 1e3:.3f}",
        f"**{ratio:.2f}**" + ("" if ratio <= 1.1 else " (target missed)"),
        f"{t['task'] * 1e3:.3f}",
        f"{t['task'] / t['scipy N']:.2f}",
        f"{t['numpy task'] / t['scipy N']:.2f}",
    ]
    return {"product_ratio": ratio, "row": row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=Path, default=default_graph_dir())
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per timing (default 200, quick 20)")
    add_bench_flags(parser, quick="20 repetitions instead of 200, the same two rows")
    args = parser.parse_args()
    repeats = args.repeats or (20 if args.quick else 200)
    path = args.graphs / "facebook_combined.txt"
    if not path.is_file():
        sys.exit(f"ego-Facebook not found at {path} (set --graphs or FEDCLUSTER_GRAPHS)")
    with page_output(args.out, __file__):
        print_header("FedSpectral+ device power step against scipy.sparse", __doc__)
        n = 4039
        edges = load_edge_list(path, num_nodes=n)
        print(
            f"ego-Facebook: n={n}, block={args.block}, median of {repeats} runs, compared pairs taking turns; ratio = "
            "our time / "
            "scipy time (lower is better, 1 = as fast as scipy); default = scipy.sparse inside "
            "AdjacencyOperator, NumPy = sparse=False (a device without SciPy)\n"
        )
        rows = [bench(edges, n, args.block, repeats, "full graph (one device)")["row"]]
        parts = split_edges(edges, 5, 2, np.random.default_rng(0))
        global_degrees = np.bincount(canonical_edges(edges).ravel(), minlength=n).astype(np.float64)
        rows.append(
            bench(parts[0], n, args.block, repeats, "client 0 of 5 (r=2)", degrees=global_degrees, weight=0.5)["row"]
        )
        print(
            markdown_table(
                [
                    "edges",
                    "m",
                    "scipy A@X ms",
                    "A@X default / scipy",
                    "A@X NumPy / scipy",
                    "scipy N@Q ms",
                    "normalized product default / scipy N@Q (target ≤ 1.1)",
                    "power_step default ms",
                    "power_step default / scipy N@Q",
                    "power_step NumPy / scipy N@Q",
                ],
                rows,
            )
        )
        print(
            "\nThe normalized product is what power_step computes (diag(w D^-1/2) A_j diag(D^-1/2) Q, its "
            "scaled matrix kept between rounds); power_step adds the request's validation (finite, "
            "non-negative degrees, shapes, config), which scipy's product does not do."
        )


if __name__ == "__main__":
    main()
