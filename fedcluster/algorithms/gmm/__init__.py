"""Federated Gaussian mixtures: expectation-maximization with the E-step on the devices and
the M-step on the server from the summed statistics (docs/ALGORITHMS.md §6)."""

from fedcluster.algorithm import Algorithm

ALGORITHMS = (
    Algorithm(
        "gmm",
        __name__,
        "Federated GMM",
        strategy="FederatedGMM",
        secure=True,
        uses=("data_summary", "lloyd_stats", "score_candidates", "identify", "local_summary", "fedkmeans_train"),
        estimator="FederatedGaussianMixture",
        estimator_keys=(
            ("max_iter", "em-rounds"),
            ("tol", "em-tol"),
            ("reg_covar", "reg-covar"),
            ("n_init", "em-starts"),
            ("covariance_type", "covariance-type"),
        ),
    ),
)
