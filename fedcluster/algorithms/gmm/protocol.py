"""Federated GMM's task: the E-step of the current mixtures (the ``em-starts`` run side by
side) on the device's points, as the sums the server's M-step needs (summable: secure
aggregation can carry it, every start's sums in the one masked vector)."""

from __future__ import annotations

from fedcluster.task import NUM_EXAMPLES, ArrayField, Param, Task

TASKS = (
    Task(
        "gmm_estep",
        "query",
        "E-step of each of the m mixtures (EM starts side by side): responsibilities (log-sum-exp), their sums, "
        "the weighted first and second moments about the current means, and the log-likelihood",
        request=(
            ArrayField("means", ("m", "k", "d"), "every mixture's means"),
            ArrayField("weights", ("m", "k"), "the mixing weights", nonnegative=True),
            ArrayField(
                "precision-chol",
                ("m", "k", "d", "d"),
                "full: each precision's Cholesky factor U (precision = U Uᵀ, upper)",
                when=("full", True),
            ),
            ArrayField(
                "precision-chol-diag", ("m", "k", "d"), "diag/spherical: 1/σ per coordinate", when=("full", False)
            ),
        ),
        config=(
            Param("full", bool, True, doc="full covariances (else diagonal)"),
            Param("hard", bool, False, doc="hard E-step: each point wholly to its nearest mean (a Lloyd step)"),
        ),
        reply=(
            ArrayField("counts", ("m", "k"), "Σ r, per component", nonnegative=True, role="count"),
            ArrayField("sums", ("m", "k", "d"), "Σ r (x − μ), about the component's current mean"),
            ArrayField("outer", ("m", "k", "d", "d"), "Σ r (x − μ)(x − μ)ᵀ", when=("full", True)),
            ArrayField(
                "squares", ("m", "k", "d"), "Σ r (x − μ)², per coordinate", nonnegative=True, when=("full", False)
            ),
            ArrayField("loglik", ("m",), "Σ log p(x) under the current mixture"),
        ),
        metrics=(NUM_EXAMPLES,),
        summable=True,
        used_by=("gmm",),
        counts="all",
    ),
)
