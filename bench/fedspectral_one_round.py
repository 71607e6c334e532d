"""FedSpectral's one round against FedSpectral+ on the same graph, in the same run.

The graph: scikit-learn's handwritten digits (1797 points) as an undirected 10-nearest-
neighbour graph, its edges dealt to J clients, each edge on r of them
(``fedcluster.graph.split_edges``, seed 0). Each row fits
``FederatedSpectralClustering(n_clusters=10, random_state=0)`` through the in-process
runner twice, ``algorithm="fedspectral"`` (one round: local spectral labels, server
co-association) and ``"fedspectral-plus"`` (its defaults), and gives the CPU seconds of
each fit (``time.process_time``, one BLAS thread: other work on the machine does not count),
their ratio (target <= 10), and the ARI / NMI of each against the digit labels.

Usage::

    python bench/fedspectral_one_round.py [--quick] [--out docs/results]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._common import add_bench_flags, markdown_table, page_output, print_header, quiet_flower  # noqa: E402
from fedcluster import FederatedSpectralClustering  # noqa: E402
from fedcluster.graph import split_edges  # noqa: E402
from fedcluster.metrics import adjusted_rand, nmi  # noqa: E402

SPLITS = ((5, 2), (10, 1), (20, 2))


def digits_graph(neighbours: int = 10) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.neighbors import kneighbors_graph

    points, labels = load_digits(return_X_y=True)
    adjacency = kneighbors_graph(points, neighbours).tocoo()
    return np.stack([adjacency.row, adjacency.col], axis=1), labels


def fit(algorithm: str, parts: list[np.ndarray], n: int) -> tuple[float, np.ndarray]:
    """CPU seconds of one in-process fit, and its labels."""
    start = time.process_time()
    model = FederatedSpectralClustering(10, algorithm=algorithm, n_nodes=n, random_state=0).fit(parts)
    return time.process_time() - start, model.labels_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("Usage::")[0])
    add_bench_flags(parser, quick="the first split only")
    args = parser.parse_args()
    quiet_flower()
    with page_output(args.out, __file__):
        print_header("FedSpectral one round against FedSpectral+", __doc__)
        edges, truth = digits_graph()
        n = truth.size
        rows = []
        for clients, copies in SPLITS[:1] if args.quick else SPLITS:
            parts = split_edges(edges, clients, copies, 0)
            one, one_labels = fit("fedspectral", parts, n)
            plus, plus_labels = fit("fedspectral-plus", parts, n)
            rows.append(
                [
                    f"{clients} clients, r = {copies}",
                    f"{one:.2f}",
                    f"{plus:.2f}",
                    f"**{one / plus:.2f}**",
                    f"{adjusted_rand(truth, one_labels):.4f} / {nmi(truth, one_labels):.4f}",
                    f"{adjusted_rand(truth, plus_labels):.4f} / {nmi(truth, plus_labels):.4f}",
                ]
            )
            print(rows[-1], file=sys.stderr, flush=True)
        print(
            f"digits 10-NN graph: n = {n}, {len(np.unique(np.sort(edges, axis=1), axis=0))} undirected edges, k = 10\n"
        )
        headers = [
            "split",
            "FedSpectral CPU s",
            "FedSpectral+ CPU s",
            "ratio (target <= 10)",
            "FedSpectral ARI / NMI",
            "FedSpectral+ ARI / NMI",
        ]
        print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
