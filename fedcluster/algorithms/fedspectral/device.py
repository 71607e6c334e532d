"""The device kernels of this algorithm's tasks (``protocol.TASKS``): what runs on a
device, on its own points, NumPy only. The math they share with the server is in
:mod:`.model`."""

from __future__ import annotations

import numpy as np

from fedcluster.graph import AdjacencyOperator
from fedcluster.graph import local_graph
from fedcluster.kernel import DeviceData, device_task
from fedcluster.lloyd import assign
from fedcluster.lloyd import kmeans
from fedcluster.task import named

from .model import _block, _global_product, inverse_sqrt_degrees, local_spectral_embedding, row_normalize
from .protocol import TASKS


@device_task(named(TASKS, "power_step"))
def power_step(data: DeviceData, arrays: dict, config: dict) -> tuple[dict, dict]:
    """One FedSpectral+ client step on the block ``arrays["Q"]`` (n x b).

    Config ``{"num-nodes", "iters", "normalization", "edge-weight"}``.

    * ``normalization="local"`` (default, the paper): ``iters`` steps ``Q <- (Q + N_j Q)/2``
      with the LOCAL normalized adjacency ``N_j = D_j^{-1/2} A_j D_j^{-1/2}``. A node without
      a local edge has a zero row in ``N_j``, so its row of ``Q`` is halved (the formula).
      ``edge-weight`` cancels out of the local normalization and is ignored.
    * ``normalization="global"`` (exact): exactly ONE product (``iters`` must be 1)
      ``P_j = w D^{-1/2} A_j D^{-1/2} Q`` with the GLOBAL degrees ``arrays["degrees"]`` and
      ``w = edge-weight``. With ``w = 1/r`` and every edge on r clients, ``sum_j P_j = N Q``;
      the server adds ``Q`` and halves (:func:`shifted_global_product`), so a client with no
      edges contributes exactly zero.
    """
    n, iters, normalization, weight = (
        config["num-nodes"],
        config["iters"],
        config["normalization"],
        config["edge-weight"],
    )
    Q = _block(arrays, n)
    graph = local_graph(data, n)
    metrics = {"num-examples": graph.num_edges}

    if normalization == "local":
        scale = inverse_sqrt_degrees(graph.degrees)
        for _ in range(iters):
            Q = 0.5 * (Q + graph.matmat(Q, scale, scale))
        return {"Q": Q}, metrics

    if iters != 1:
        raise ValueError(
            "normalization 'global' computes exactly one product per round (iters must be 1): "
            "a client cannot multiply by the global matrix twice on its own"
        )
    if "degrees" not in arrays:
        raise ValueError("normalization 'global' needs the global degree vector in arrays['degrees']")
    product = _global_product(data, graph, arrays["degrees"], weight)
    return {"Q": product(Q)}, metrics


@device_task(named(TASKS, "local_spectral_labels"))
def local_spectral_labels(data: DeviceData, arrays: dict, config: dict) -> tuple[dict, dict]:
    """FedSpectral client: spectral clustering of the local graph.

    Config ``{"num-nodes", "k", "seed"}`` (+ optional ``"block"``, ``"max-iters"``, ``"tol"``).
    Nodes with at least one local edge are relabelled ``0..n_j-1``; the top-``k``
    eigenvectors of the local ``(I + N_j)/2`` (:func:`local_spectral_embedding`) are
    row-normalized (Ng-Jordan-Weiss) and clustered by :func:`fedcluster.lloyd.kmeans`
    (``n_init=10``) seeded by ``seed``. Nodes without local edges get label ``-1``. When the
    local graph has at most ``k`` nodes every node is its own cluster.
    """
    n, k, seed = config["num-nodes"], config["k"], config["seed"]
    block, max_iters, tol = config["block"] or None, config["max-iters"], config["tol"]
    graph = local_graph(data, n)
    labels = np.full(n, -1, dtype=np.int64)
    present = np.flatnonzero(graph.degrees > 0)
    metrics: dict[str, float] = {"num-examples": graph.num_edges, "num-local-nodes": int(present.size)}
    if present.size == 0:
        return {"labels": labels}, metrics
    if present.size <= k:
        labels[present] = np.arange(present.size)
        return {"labels": labels}, metrics
    # The local graph on its own nodes only: absent nodes would add spurious eigenvalues 1/2.
    relabel = np.full(n, -1, dtype=np.int64)
    relabel[present] = np.arange(present.size)
    compact = AdjacencyOperator(relabel[graph.edges], present.size)
    rng = np.random.default_rng(seed)
    _, vectors, iterations, residual = local_spectral_embedding(
        compact, k, rng, block=block, max_iters=max_iters, tol=tol
    )
    embedding = row_normalize(vectors)
    centers, _ = kmeans(embedding, k, rng, n_init=10)
    labels[present] = assign(embedding, centers)[0]
    metrics.update({"iterations": iterations, "ritz-residual": residual})
    return {"labels": labels}, metrics
