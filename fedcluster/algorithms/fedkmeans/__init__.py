"""FedKMeans: federated mini-batch k-means (Triebe et al. 2019; docs/ALGORITHMS.md §1)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "fedkmeans",
        __name__,
        "FedKMeans",
        strategy="FedKMeans",
        uses=("data_summary", "lloyd_stats", "score_candidates", "write_labels", "identify", "kfed_local"),
        estimator="FederatedKMeans",
        estimator_keys=(("max_iter", "num-rounds"), ("tol", "tol"), ("fraction", "fraction"), ("n_init", "n-init")),
    ),
)
