"""DA-UFL: dual-averaging federated k-means for unbalanced, overlapping data (Servetnyk et al.
2020; docs/ALGORITHMS.md §2)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "da-ufl",
        __name__,
        "DA-UFL",
        strategy="DAUFL",
        uses=("data_summary", "lloyd_stats", "score_candidates", "write_labels", "identify"),
        estimator="FederatedKMeans",
        estimator_keys=(("max_iter", "outer-iterations"),),
    ),
)
