"""FedSpectral and FedSpectral+: spectral graph clustering, one-shot and by federated power
iteration (docs/ALGORITHMS.md §5)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "fedspectral",
        __name__,
        "FedSpectral",
        strategy="FedSpectral",
        data="graph",
        uses=("identify",),
        estimator="FederatedSpectralClustering",
    ),
    Algorithm(
        "fedspectral-plus",
        __name__,
        "FedSpectral+",
        strategy="FedSpectralPlus",
        section="PLUS_RUN_CONFIG",
        data="graph",
        secure=True,
        uses=("identify",),
        estimator="FederatedSpectralClustering",
        estimator_keys=(("max_iter", "num-rounds"),),
    ),
)
