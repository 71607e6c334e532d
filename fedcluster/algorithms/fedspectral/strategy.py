"""FedSpectral and FedSpectral+: the phases (broadcast, check, call into
:mod:`fedcluster.algorithms.fedspectral.model`, record). Paper: "FedSpectral+: Spectral Clustering using
Federated Learning" (2023); specification: docs/ALGORITHMS.md section 5.

A global graph on ``num-nodes`` nodes has its edges spread over J clients (each edge
possibly on several); a client holds only its own edge list, and every phase asks every
client still in the run (:class:`fedcluster.algorithms.fedspectral.strategy_graph.GraphStrategy`). The result
folder gets ``labels.npy``, ``embedding.npy`` (n x k, before row normalization) and, for
FedSpectral, ``client_labels.npy`` (J x n); with ``reference`` true and
``dataset="edge-dir"`` readable by the server, ``central_reference`` in ``result.json``
compares with the central spectral clustering of the union graph (reporting only).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.fedspectral.model import (
    KRYLOV_DROP,
    ExactEigensolver,
    cluster_sizes,
    coassociation_spectral,
    embedding_labels,
    initial_block,
    local_cluster_counts,
    nodes_held,
    paper_aggregate,
    product_range,
    snapped_degrees,
    subspace_distance,
)

from fedcluster.server.base import FederationError, sum_arrays
from fedcluster.algorithms.fedspectral.strategy_graph import GraphStrategy, label_check, product_check
from fedcluster.server.secure_sum import SecureSum


# --------------------------------------------------------------------------------------------
# FedSpectral (baseline)
# --------------------------------------------------------------------------------------------


class FedSpectral(GraphStrategy):
    """FedSpectral, the paper's baseline, one round: every client clusters its local graph
    (``local_spectral_labels``; -1 for nodes it does not hold) and sends the labels; the
    server clusters their co-association similarity spectrally
    (:func:`fedcluster.algorithms.fedspectral.model.coassociation_spectral`).

    Run-config parameters: ``num-nodes``, ``k``, ``seed`` (each client mixes it with its
    partition for its local k-means: fedcluster.protocol.device_seed), ``coassociation``.
    """

    name = "fedspectral"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        n, k, nodes = self.graph_setup()
        seed = cfg.seed
        self.begin_round(1)
        replies = self.all_clients(
            "local_spectral_labels",
            nodes,
            config={"num-nodes": n, "k": k, "seed": seed},
            sizes={"n": n},
            check=label_check(n),
            phase="local-spectral-labels",
        )
        label_lists = [r.arrays["labels"].astype(np.int64) for r in replies]
        embedding, labels = coassociation_spectral(label_lists, n, k, seed, denominator=cfg.coassociation)
        held = nodes_held(label_lists)
        self.end_round(local_clusters=local_cluster_counts(label_lists))
        log(INFO, "[fedcluster] fedspectral: %d clients, %d of %d nodes held by some client", len(replies), held, n)
        outcome: dict[str, Any] = {
            "arrays": {"labels": labels, "embedding": embedding, "client_labels": np.stack(label_lists)},
            "final": {
                "num_nodes": n,
                "k": k,
                "communication_rounds": 1,
                "nodes_held": held,
                "cluster_sizes": cluster_sizes(labels, k),
            },
        }
        reference = self.reference(embedding, labels, len(nodes))
        if reference is not None:
            outcome["central_reference"] = reference
        return outcome


# --------------------------------------------------------------------------------------------
# FedSpectral+
# --------------------------------------------------------------------------------------------


class FedSpectralPlus(GraphStrategy):
    """FedSpectral+: federated power/subspace iteration for the global spectral embedding.

    ``mode="paper"``: the server sends a random orthonormal ``Q`` (n x k); every client
    applies ``iters`` local power steps with its LOCAL normalized adjacency
    (``power_step``, ``normalization="local"``); the server averages the iterates and
    re-orthonormalizes. The embedding is the last ``Q`` (not power iteration on any fixed
    matrix, so it does not converge to the global embedding in general).

    ``mode="exact"`` (default): one product with the GLOBAL ``M = (I + N)/2`` per round,
    ``M X = (X + sum_j P_j)/2`` with ``P_j = w D^{-1/2} A_j D^{-1/2} X`` (``power_step``,
    ``normalization="global"``, ``w = 1/edge-copies``), fed to
    :class:`fedcluster.algorithms.fedspectral.model.ExactEigensolver` (subspace iteration or block Krylov,
    ``acceleration``); round 1 also delivers the degrees. ``residual-tol`` > 0 stops once
    every top-``k`` Ritz residual is below it; an invariant space stops the run too.
    ``iters`` does not apply (a value other than 1 is ignored with a note).

    Per round ``result.json`` records ``subspace_change`` (largest principal-angle sine to
    the previous round's top-``k`` space) and, in exact mode, the largest Ritz
    ``residual``, the basis and block sizes.

    ``secure-aggregation``: every round's products reach the server only as their sum
    (:meth:`products`); one session of keys serves every round.

    Run-config parameters: ``num-nodes``, ``k``, ``num-rounds``, ``seed``, ``mode``,
    ``iters`` (paper), ``oversample``, ``acceleration``, ``max-basis``, ``residual-tol``,
    ``edge-copies`` (exact), ``secure-aggregation``, ``secagg-threshold``, ``secagg-neighbours``.
    """

    name = "fedspectral-plus"

    def __init__(self, grid, config) -> None:
        super().__init__(grid, config)
        self.secagg = SecureSum(config, self.transport, self.members, self.results)  # the secure sum it holds

    def run(self) -> dict[str, Any]:
        cfg = self.config
        n, k, nodes = self.graph_setup()
        self.secagg.planned = cfg.num_rounds  # one secure sum per round (a run that stops early leaves keys unused)
        if cfg.mode == "paper":
            embedding, final = self.paper_mode(n, k, nodes)
        else:
            embedding, final = self.exact_mode(n, k, nodes)
        labels = embedding_labels(embedding, k, cfg.seed)
        final.update({"num_nodes": n, "k": k, "cluster_sizes": cluster_sizes(labels, k)})
        if self.secagg.enabled:
            final["secure_aggregation"] = self.secagg.record()
        log(
            INFO,
            "[fedcluster] fedspectral-plus (%s): %d communication rounds, last subspace change %.3g",
            cfg.mode,
            final["communication_rounds"],
            self.results.rounds[-1].get("subspace_change") or 0.0,
        )
        outcome: dict[str, Any] = {"arrays": {"labels": labels, "embedding": embedding}, "final": final}
        reference = self.reference(embedding, labels, len(nodes))
        if reference is not None:
            outcome["central_reference"] = reference
            log(
                INFO,
                "[fedcluster] against central spectral clustering: Rand %.4f, ARI %.4f, NMI %.4f, sine %.3g",
                reference["rand"],
                reference["ari"],
                reference["nmi"],
                reference["sine_to_central"],
            )
        return outcome

    def products(
        self,
        nodes: list[int],
        request: dict[str, np.ndarray],
        config: dict[str, Any],
        weight: float,
        first: bool,
        phase: str,
    ) -> tuple[np.ndarray, int]:
        """The sum of the clients' ``power_step`` products of ``request["Q"]``, and how many
        clients it holds: from replies each checked (``product_check``), or by secure
        aggregation, where each client clips its product to the public ``product_range``
        and only the sum is checked (``within_ranges``: a sum no honest clients could give
        stops the run, as no product can be skipped and secure aggregation hides who sent
        it). Either way a client missing from the sum is out of the rest of the run."""
        X = request["Q"]
        sizes = {"n": X.shape[0], "b": X.shape[1]}
        if not self.secagg.enabled:
            replies = self.all_clients(
                "power_step",
                nodes,
                arrays=request,
                config=config,
                sizes=sizes,
                phase=phase,
                check=product_check(X, weight, first),
            )
            return sum_arrays(replies, "Q"), len(replies)
        asked = [node for node in nodes if node not in self.members.excluded]
        total, summed = self.secagg.summed(
            "power_step", asked, request, config, sizes, None, phase, {"Q": product_range(X, weight, first)}
        )
        for node in sorted(set(asked) - set(summed)):
            self.exclude(node, "no masked product in the secure sum (a graph run goes on without its edges)")
        if total is None:  # a product cannot be skipped
            raise FederationError(f"phase {phase!r}: {self.secagg.failure}")
        return total["Q"], len(summed)

    # ------------------------------------------------------------------ paper mode
    def paper_mode(self, n: int, k: int, nodes: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Local power steps on the clients, average of the iterates, QR (the paper)."""
        cfg = self.config
        iters = cfg.iters
        Q = initial_block(n, k, cfg.seed)
        config = {"num-nodes": n, "iters": iters, "normalization": "local"}
        for t in range(1, cfg.num_rounds + 1):
            self.begin_round(t)
            total, count = self.products(nodes, {"Q": Q}, config, 1.0, False, "local-power-steps")
            new = paper_aggregate([total / count])
            change = subspace_distance(new, Q)
            Q = new
            self.end_round(subspace_change=change, block_columns=k)
        return Q, {"mode": "paper", "iters": iters, "block": k, "communication_rounds": len(self.results.rounds)}

    # ------------------------------------------------------------------ exact mode
    def block_size(self, n: int, k: int) -> int:
        """``k + oversample`` columns, ``oversample = -1``: ``max(k, 10)`` (a block of only 2k
        converges very slowly for small k; README, FedSpectral), at most n."""
        p = self.config.oversample
        return min(n, k + (max(k, 10) if p < 0 else p))

    def exact_mode(self, n: int, k: int, nodes: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Exact block subspace iteration (``acceleration="none"``) or block Krylov on the
        global ``M = (I + N)/2``; one summed product per round (class docstring)."""
        cfg = self.config
        rounds = cfg.num_rounds
        tol = cfg.residual_tol
        notes = []
        if cfg.iters != 1:
            notes.append(f"iters={cfg['iters']} ignored: exact mode multiplies once per round")
            log(WARNING, "[fedcluster] %s", notes[-1])
        solver = ExactEigensolver(n, k, self.block_size(n, k), cfg.seed, cfg.acceleration, cfg.max_basis)
        product_config = {
            "num-nodes": n,
            "iters": 1,
            "normalization": "global",
            "edge-weight": 1.0 / cfg.edge_copies,
        }

        def summed_products(X: np.ndarray, degrees: np.ndarray, phase: str, first: bool = False) -> np.ndarray:
            request = {"Q": X, "degrees": degrees}
            return self.products(nodes, request, product_config, product_config["edge-weight"], first, phase)[0]

        # Round 1: the degrees and the first product in one exchange.
        self.begin_round(1)
        first = solver.first_block()
        first_sum = summed_products(first, solver.first_degrees(), "degrees-and-first-product", first=True)
        solver.start(snapped_degrees(first_sum, product_config["edge-weight"]) if self.secagg.enabled else first_sum)
        stopped, t, sent = "num-rounds", 1, first.shape[1]
        while True:
            state = solver.observe()
            self.end_round(
                subspace_change=state["change"],
                residual=state["residual"],
                basis_columns=state["basis_columns"],
                block_columns=sent,
                ritz_value_k=state["ritz_value_k"],
            )
            if tol > 0 and state["residual"] <= tol:
                stopped = f"residual-tol: top-{k} Ritz residuals <= {tol:g}"
                break
            if t >= rounds:
                break
            X = solver.next_block()
            if X is None:
                stopped = f"invariant subspace: every block residual below {KRYLOV_DROP:g}"
                break
            t, sent = t + 1, X.shape[1]
            self.begin_round(t)
            solver.absorb(X, summed_products(X, solver.degrees, "global-product"))

        values, Y, residuals = solver.result()
        final = {
            "mode": "exact",
            "acceleration": solver.acceleration,
            "block": solver.block,
            "max_basis": solver.max_basis,
            "communication_rounds": len(self.results.rounds),
            "stopped": stopped,
            "ritz_values": values,
            "ritz_residuals": residuals,
            "graph": solver.graph_summary(),
            "notes": notes,
        }
        return Y, final
