"""Benchmark: the NumPy device power step of FedSpectral+ against scipy.sparse.

On ego-Facebook (``facebook_combined.txt``, n = 4039, 88,234 undirected edges) with an
``n x b`` block (default b = 10) it times

* the raw adjacency product ``A @ X``: :class:`fedcluster.graph.AdjacencyOperator` vs a
  ``scipy.sparse.csr_matrix`` built from the same edges;
* the whole device task ``power_step`` (global normalization, one product, including
  input validation) vs the equivalent scipy product ``N @ Q`` with a precomputed
  normalized CSR matrix;

for the full graph and for one client's share (5 clients, every edge on 2 of them), and
prints the ratios (NumPy time / scipy time; lower is better, 1 = as fast as scipy).
Timings are the minimum over many repetitions (robust to other load on the machine).

Run: ``python bench/spectral_kernel.py [--graphs DIR] [--block 10] [--repeats 200]``;
``--quick``: best of 20 instead of 200 (the same two rows); ``--out DIR`` also writes the
page to ``DIR/spectral_kernel.md``.
The graph directory defaults to ``$FEDCLUSTER_GRAPHS`` or ``./graphs`` (``fedcluster-fetch-graphs --out graphs``) or ``../shared/data/graphs`` next to
the project.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_bench_flags, markdown_table, page_output, print_header  # noqa: E402
from fedcluster.fedspectral import local_degrees, power_step  # noqa: E402
from fedcluster.graph import AdjacencyOperator, canonical_edges, load_edge_list, split_edges  # noqa: E402
from fedcluster.device import DeviceData  # noqa: E402


def default_graph_dir() -> Path:
    """$FEDCLUSTER_GRAPHS, else ./graphs (fedcluster-fetch-graphs --out graphs), else the
    offline cache ../shared/data/graphs beside the project."""
    env = os.environ.get("FEDCLUSTER_GRAPHS")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    fetched = root / "graphs"
    return fetched if (fetched / "email-Eu-core.txt").is_file() else root.parent / "shared" / "data" / "graphs"


def best_time(fn, repeats: int) -> float:
    fn()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench(edges: np.ndarray, n: int, block: int, repeats: int, label: str, degrees: np.ndarray | None = None,
          weight: float = 1.0) -> dict:
    import scipy.sparse as sp

    graph = canonical_edges(edges)
    rows = np.concatenate([graph[:, 0], graph[:, 1]])
    cols = np.concatenate([graph[:, 1], graph[:, 0]])
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    operator = AdjacencyOperator(graph, n)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, block))
    assert np.allclose(operator.matmat(X), A @ X, rtol=0, atol=1e-10)

    device = DeviceData(edges=edges, source=label)
    if degrees is None:
        degrees = local_degrees(device, n)
    scale = np.zeros(n)
    scale[degrees > 0] = 1.0 / np.sqrt(degrees[degrees > 0])
    N = (sp.diags(scale) @ A @ sp.diags(scale)).tocsr() * weight
    config = {"num-nodes": n, "normalization": "global", "iters": 1, "edge-weight": weight}
    arrays = {"Q": X, "degrees": degrees}
    ours = power_step(device, arrays, config)[0]["Q"]
    assert np.allclose(ours, N @ X, rtol=0, atol=1e-12)

    t_scipy = best_time(lambda: A @ X, repeats)
    t_ours = best_time(lambda: operator.matmat(X), repeats)
    t_scipy_n = best_time(lambda: N @ X, repeats)
    t_task = best_time(lambda: power_step(device, arrays, config), repeats)
    row = [label, graph.shape[0], f"{t_ours * 1e3:.3f}", f"{t_scipy * 1e3:.3f}", f"{t_ours / t_scipy:.2f}",
           f"{t_task * 1e3:.3f}", f"{t_scipy_n * 1e3:.3f}", f"{t_task / t_scipy_n:.2f}"]
    return {"product_ratio": t_ours / t_scipy, "task_ratio": t_task / t_scipy_n, "row": row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=Path, default=default_graph_dir())
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=None, help="best of this many timings (default 200, quick 20)")
    add_bench_flags(parser, quick="best of 20 timings instead of 200, the same two rows")
    args = parser.parse_args()
    repeats = args.repeats or (20 if args.quick else 200)
    path = args.graphs / "facebook_combined.txt"
    if not path.is_file():
        sys.exit(f"ego-Facebook not found at {path} (set --graphs or FEDCLUSTER_GRAPHS)")
    with page_output(args.out, __file__):
        print_header("FedSpectral+ device power step (NumPy) against scipy.sparse", __doc__)
        n = 4039
        edges = load_edge_list(path, num_nodes=n)
        print(f"ego-Facebook: n={n}, block={args.block}, best of {repeats} runs; ratio = NumPy time / scipy time "
              "(lower is better, 1 = as fast as scipy)\n")
        rows = [bench(edges, n, args.block, repeats, "full graph (one device)")["row"]]
        parts = split_edges(edges, 5, 2, np.random.default_rng(0))
        global_degrees = np.bincount(canonical_edges(edges).ravel(), minlength=n).astype(np.float64)
        rows.append(bench(parts[0], n, args.block, repeats, "client 0 of 5 (r=2)", degrees=global_degrees, weight=0.5)["row"])
        print(markdown_table(["edges", "m", "A@X numpy ms", "A@X scipy ms", "ratio", "power_step ms", "scipy N@Q ms",
                              "ratio"], rows))


if __name__ == "__main__":
    main()
