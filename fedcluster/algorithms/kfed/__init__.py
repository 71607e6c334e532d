"""k-FED: one-shot federated clustering (Dennis, Li & Smith 2021; docs/ALGORITHMS.md §4)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "kfed",
        __name__,
        "k-FED",
        strategy="KFed",
        uses=("data_summary", "lloyd_stats", "score_candidates", "write_labels", "identify"),
        estimator="FederatedKMeans",
        estimator_keys=(),
    ),
)
