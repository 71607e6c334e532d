"""What FedSpectral and FedSpectral+ share: the graph's size, the phases every client
answers (each holds edges nobody else may hold: a client whose reply fails is taken out of
the run, so every later product is over the same clients' edges, and the run goes on while
``min-reply-fraction`` of them answer), the reply checks and the optional central reference."""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.fedspectral.model import label_problem, product_violation
from fedcluster.central import compare_with_central

from fedcluster.server.base import FederatedStrategy, FederationError, Reply


def label_check(num_nodes: int):
    return lambda reply: label_problem(reply.arrays["labels"], num_nodes)


def product_check(X: np.ndarray, weight: float, first: bool):
    """The bounds a ``power_step`` reply to the block ``X`` obeys (fedcluster.algorithms.fedspectral.model.
    product_violation), as a reply check; a reply past them is dropped and its client
    taken out of the run."""

    def check(reply: Reply) -> str | None:
        return product_violation(reply.arrays["Q"], X, weight, reply.num_examples, first)

    return check


class GraphStrategy(FederatedStrategy):
    """What FedSpectral and FedSpectral+ share: the graph size, all-clients phases, the
    result arrays and the optional central reference."""

    skips_away = False  # every client's edges are needed: a missing client fails the phase

    def graph_setup(self) -> tuple[int, int, list[int]]:
        n = self.config.num_nodes
        k = self.config.k
        if n < 1:
            raise FederationError(f"{self.name} needs run-config num-nodes (the global number of graph nodes)")
        if not 1 <= k <= n:
            raise FederationError(f"k={k} must be between 1 and num-nodes={n}")
        nodes = list(self.active_nodes)
        if not nodes:
            raise FederationError("no client connected")
        return n, k, nodes

    def all_clients(self, task: str, nodes: list[int], **kwargs: Any) -> list[Reply]:
        """Broadcast to every client still in the run (each holds its own edges). A client
        whose reply fails is taken out of the run, so every later product is over the same
        clients' edges; the run goes on while ``min-reply-fraction`` of them answer, as a
        point run does."""
        asked = [node for node in nodes if node not in self.members.excluded]
        replies = self.broadcast(task, asked, **kwargs)  # in node order: sums reproducible to the last bit
        answered = {reply.node_id for reply in replies}
        reasons = (
            {failure["node"]: failure["reason"] for failure in self.results.phases[-1]["failures"]}
            if self.results.phases
            else {}
        )
        for node in asked:
            if node not in answered:
                self.exclude(node, f"{reasons.get(node, 'no valid reply')} (a graph run goes on without its edges)")
        return replies

    def reference(self, embedding: np.ndarray, labels: np.ndarray, num_clients: int) -> dict[str, Any] | None:
        """Agreement with the central spectral clustering of the union of the client files,
        when this server can read them (simulation on one machine). Reporting only."""
        cfg = self.config
        if not cfg.reference or cfg.dataset != "edge-dir" or not cfg.data_dir:
            return None
        try:
            return compare_with_central(
                Path(cfg.data_dir), num_clients, cfg.num_nodes, cfg.k, cfg.seed, embedding, labels
            )
        except Exception as exc:  # a report, never a reason to lose a run
            log(WARNING, "[fedcluster] no central spectral reference: %s: %s", type(exc).__name__, exc)
            return None
