"""The scikit-learn-style estimator of federated Gaussian mixtures,
``fedcluster.FederatedGaussianMixture``: the in-process run every estimator makes
(:mod:`fedcluster.estimators`), its parameters as scikit-learn's ``GaussianMixture``."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fedcluster.estimators import _client_arrays, _InProcess, _keep
from fedcluster.metrics import check_points

from .model import Mixture, bic


class FederatedGaussianMixture(_InProcess):
    """Federated Gaussian mixture (EM: the E-step on every client, the M-step on the server
    from the summed statistics; docs/guide/gmm.md). Parameters as scikit-learn's
    ``GaussianMixture``: ``n_components``, ``covariance_type`` (``"full"``, ``"diag"``,
    ``"spherical"``), ``max_iter`` (``em-rounds``), ``tol`` (``em-tol``), ``reg_covar``
    (``reg-covar``), ``n_init`` (``em-starts``: EM starts side by side, the best kept); None
    keeps the run-config default. ``run_config`` takes any other key
    (``secure-aggregation``, ``k-range``, ...). Fitted, with scikit-learn's shapes and
    meanings: ``weights_``, ``means_``, ``covariances_``, ``precisions_cholesky_``,
    ``converged_``, ``n_iter_`` (EM rounds), ``lower_bound_`` (mean log-likelihood per point
    of the last E-step), ``labels_`` (one array per client: its points' most probable
    component, computed from the client's own array), ``history_``, ``result_``.
    """

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        random_state: Any = None,
        max_iter: int | None = None,
        tol: float | None = None,
        reg_covar: float | None = None,
        n_init: int | None = None,
        run_config: dict[str, Any] | None = None,
        output_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        _keep(self, locals())

    def _config(self) -> dict[str, Any]:
        parameters = ("max_iter", "tol", "reg_covar", "n_init", "covariance_type")
        return self._run_config("gmm", self.n_components, parameters)

    def fit(self, clients: Sequence[Any], y: Any = None) -> "FederatedGaussianMixture":
        """Run the federation over ``clients`` (one array per client); ``y`` is ignored."""
        arrays = _client_arrays(clients)
        writers = [lambda folder, i, a=a: np.save(folder / f"client_{i:05d}.npy", a) for a in arrays]
        result, loaded = self._federate(self._config(), "npy-dir", writers, ("centers", "weights", "covariances"))
        final = result["final"]
        self.covariance_type_ = final["covariance_type"]
        self._mixture = Mixture(loaded["weights"], loaded["centers"], loaded["covariances"], self.covariance_type_)
        self.weights_, self.means_, self.covariances_ = loaded["weights"], loaded["centers"], loaded["covariances"]
        self.precisions_cholesky_ = self._mixture.precision_chol()
        if self.covariance_type_ == "spherical":
            self.precisions_cholesky_ = self.precisions_cholesky_[:, 0]
        self.converged_, self.n_iter_, self.lower_bound_ = final["converged"], final["n_iter"], final["lower_bound"]
        self.n_features_in_ = arrays[0].shape[1]
        self.bic_range_ = result.get("bic_range")
        self.labels_ = [self.predict(a) for a in arrays]
        return self

    def fit_predict(self, clients: Sequence[Any], y: Any = None) -> list[np.ndarray]:
        """``fit`` and return ``labels_``: one label array per client."""
        return self.fit(clients).labels_

    def _points(self, X: Any) -> np.ndarray:
        if not hasattr(self, "means_"):
            raise AttributeError(f"this {type(self).__name__} is not fitted yet: call fit(clients) first")
        points = check_points(X, "X")
        if points.shape[1] != self.n_features_in_:
            raise ValueError(f"X has shape {points.shape}: expected (points, {self.n_features_in_})")
        return points

    def score_samples(self, X: Any) -> np.ndarray:
        """log p(x) of every row of ``X``."""
        return self._mixture.log_likelihood(self._points(X))

    def score(self, X: Any, y: Any = None) -> float:
        """The mean log-likelihood per point of ``X`` (scikit-learn's ``score``)."""
        return float(np.mean(self.score_samples(X)))

    def predict_proba(self, X: Any) -> np.ndarray:
        """Every row's responsibilities (n, n_components)."""
        return self._mixture.responsibilities(self._points(X))

    def predict(self, X: Any) -> np.ndarray:
        """Every row's most probable component."""
        return np.argmax(self.predict_proba(X), axis=1)

    def bic(self, X: Any) -> float:
        """Bayesian information criterion of ``X`` (scikit-learn's ``bic``)."""
        points = self._points(X)
        k, d = self.means_.shape
        return bic(float(np.sum(self.score_samples(points))), points.shape[0], k, d, self.covariance_type_)
