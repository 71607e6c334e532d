"""FedDP-KMeans: differentially private federated k-means (Scott et al. 2025;
docs/ALGORITHMS.md §3)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "feddp-kmeans",
        __name__,
        "FedDP-KMeans",
        strategy="FedDPKMeans",
        secure=True,
        uses=("data_summary", "lloyd_stats", "write_labels", "identify"),
        estimator="DPFederatedKMeans",
        estimator_keys=(("max_iter", "lloyd-rounds"),),
    ),
)
