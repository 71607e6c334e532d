"""scikit-learn-style estimators over the in-process runner.

``fit(clients)`` takes one array per client (rows = points), writes them to a temporary
``npy-dir`` and runs the SAME ServerApp strategy and ClientApp as ``flwr run`` through
``fedcluster.inprocess.run``: there is no second implementation. The result folder is temporary
unless ``output_dir`` is given; everything needed afterwards is kept on the estimator.

Parameter names follow scikit-learn where a counterpart exists (``n_clusters``,
``random_state``, ``max_iter``, ``tol``); every other run-config key can be passed in
``run_config`` under its run-config name (docs/reference.md, "Run-config keys"). A key given both ways
is refused, as is a scikit-learn parameter the chosen algorithm has no use for.

Quiet by default: the run's INFO lines (one per round, the summary) are shown only with
``verbose=True``; its warnings always are (and the run's own are raised as
:class:`FederatedRunWarning`).

Labels: a client's points take their nearest final center, computed from the client's own
array in this process (on a real device that is ``fedcluster.lloyd.nearest`` on its data;
nothing about the points leaves it).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.utils import check_random_state

import fedcluster.registry as registry
from fedcluster.algorithms.feddp_kmeans import model as feddp_kmeans
from fedcluster.config import SEED_MAX
from fedcluster.lloyd import kmeans_cost, nearest
from fedcluster.metrics import check_points
from fedcluster.scaling import Scaling

# scikit-learn name -> run-config key, per algorithm (None: the algorithm has no such knob)


def _algorithms_of(estimator: str) -> tuple[str, ...]:
    """The algorithms the registry says ``estimator`` runs."""
    return tuple(a.name for a in registry.algorithms().values() if a.estimator == estimator)


def _own_keys(estimator: str, algorithm: str, values: dict[str, Any], others: str) -> dict[str, Any]:
    """The run-config keys this estimator's parameters set for ``algorithm`` (as its package
    declares them); a parameter it does not take, given, is refused by name."""
    if algorithm not in _algorithms_of(estimator):
        raise ValueError(
            f"algorithm={algorithm!r}: {estimator} runs "
            f"{', '.join(repr(n) for n in _algorithms_of(estimator))} ({others})"
        )
    keys = dict(registry.algorithm(algorithm).estimator_keys)
    own = {}
    for name, value in values.items():
        if value is not None:
            if name not in keys:
                raise ValueError(f"{name} does not apply to algorithm={algorithm!r}")
            own[keys[name]] = value
    return own


class FederatedRunWarning(UserWarning):
    """A run's own numbers say something the user should read (result.json ``warnings``)."""


@contextmanager
def _run_log(verbose: Any) -> Iterator[None]:
    """Flower's logger (the run's log lines) shows INFO only when ``verbose``; warnings and
    errors always. The logger's own level is restored afterwards."""
    logger = logging.getLogger("flwr")
    level = logger.level
    if not verbose:
        logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _seed(random_state: Any) -> int:
    """An int seed is the run-config ``seed`` itself (same seed, same result as ``flwr run``)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if not 0 <= int(random_state) <= SEED_MAX:
            raise ValueError(f"random_state={random_state} must lie in [0, {SEED_MAX}]")
        return int(random_state)
    return int(check_random_state(random_state).randint(0, 2**31 - 1))


def _client_arrays(clients: Sequence[Any]) -> list[np.ndarray]:
    """Every client's points as a finite float64 2-D array of one common dimension;
    ``clients`` a folder: its ``.npy``, ``.csv`` and ``.parquet`` files, one per client, as
    ``dataset = 'dir'`` reads them (every numeric column)."""
    names = None
    if isinstance(clients, (str, os.PathLike)):
        from .data import folder_files, load_points

        files = folder_files("dir", clients)
        clients, names = [load_points(path) for path in files], [str(path) for path in files]  # DataError names it
    if isinstance(clients, np.ndarray) or not isinstance(clients, Sequence) or isinstance(clients, (str, bytes)):
        raise TypeError("clients must be a list with one 2-D array (rows = points) per client")
    if len(clients) == 0:
        raise ValueError("clients is empty: give one array per client")
    names = names or [f"clients[{i}]" for i in range(len(clients))]
    arrays = []
    for name, points in zip(names, clients):
        array = check_points(points, name)
        if array.shape[1] != (arrays[0].shape[1] if arrays else array.shape[1]):
            raise ValueError(f"{name} has {array.shape[1]} features, {names[0]} has {arrays[0].shape[1]}")
        arrays.append(array)
    return arrays


# run-config key -> the estimator parameter that sets it (for error messages)
_PARAMETER_OF = {
    "k": "n_clusters",
    "seed": "random_state",
    "algorithm": "algorithm",
    "num-rounds": "max_iter",
    "outer-iterations": "max_iter",
    "lloyd-rounds": "max_iter",
    "tol": "tol",
    "fraction": "fraction",
    "epsilon": "epsilon",
    "delta": "delta",
    "privacy-level": "privacy_level",
    "num-nodes": "n_nodes",
    "n-init": "n_init",
    "em-starts": "n_init",
}
_SET_BY_FIT = {
    "dataset": "fit(clients)",
    "data-dir": "fit(clients)",
    "server-data": "fit(..., server_data=...)",
    "output-dir": "output_dir",
}


def _merged(run_config: dict[str, Any] | None, own: dict[str, Any]) -> dict[str, Any]:
    """The estimator's own keys plus ``run_config``; a key set both ways is refused."""
    extra = dict(run_config or {})
    clash = sorted(set(extra) & set(own))
    if clash:
        instead = ", ".join(f"{key!r} -> {_PARAMETER_OF.get(key, key)}" for key in clash)
        raise ValueError(f"run_config sets {clash}, which this estimator sets from its own parameters ({instead})")
    fixed = sorted(set(extra) & set(_SET_BY_FIT))
    if fixed:
        instead = ", ".join(f"{key!r} -> {_SET_BY_FIT[key]}" for key in fixed)
        raise ValueError(f"run_config sets {fixed}, which the estimator sets itself ({instead})")
    return {**extra, **own}


def _keep(estimator: Any, arguments: dict[str, Any]) -> None:
    """scikit-learn's rule for ``__init__``: every argument stored as given, under its own
    name, nothing checked (``fit`` checks)."""
    for name, value in arguments.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


class _InProcess(ClusterMixin, BaseEstimator):
    """The run every estimator makes: the clients' files in a temporary folder, the
    federation in-process, the run's records kept on the estimator."""

    def _run_config(self, algorithm: str, k: int, parameters: Sequence[str], others: str = "") -> dict[str, Any]:
        """The run config of this estimator's parameters: each of ``parameters`` as the key
        ``algorithm``'s package declares for it (one it does not take, given, is refused;
        ``others`` says which estimator runs the algorithms this one does not), ``k``, the seed
        of ``random_state``, then ``run_config`` (a key set both ways refused)."""
        values = {name: getattr(self, name) for name in parameters}
        own: dict[str, Any] = _own_keys(type(self).__name__, algorithm, values, others)
        own.update({"algorithm": algorithm, "k": k, "seed": _seed(self.random_state)})
        return _merged(self.run_config, own)

    def _federate(
        self,
        config: dict[str, Any],
        dataset: str,
        writers: list,
        load: tuple[str, ...],
        server_data: np.ndarray | None = None,
        labels: bool = False,
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """``writers[i](folder, i)`` saves client i's file; returns result.json (with
        ``labels`` when asked) and the arrays ``load`` names from the result folder."""
        from .inprocess import run

        with tempfile.TemporaryDirectory(prefix="fedcluster-") as tmp:
            folder = Path(tmp) / "clients"
            folder.mkdir()
            for i, write in enumerate(writers):
                write(folder, i)
            if server_data is not None:
                np.save(Path(tmp) / "server.npy", server_data)
                config["server-data"] = str(Path(tmp) / "server.npy")
            output = Path(self.output_dir) if self.output_dir else Path(tmp) / "result"
            config.update({"dataset": dataset, "data-dir": str(folder), "output-dir": str(output)})
            config.setdefault("reference", False)
            with _run_log(self.verbose):
                result = run(config, num_nodes=len(writers), labels=labels, journal=False)
            arrays = {name: np.load(Path(result["output_dir"]) / f"{name}.npy") for name in load}
        self.result_ = {key: value for key, value in result.items() if key != "labels"}
        for text in result.get("warnings", []):  # what the run's own numbers said, where a notebook shows it
            warnings.warn(text, FederatedRunWarning, stacklevel=3)
        self.output_dir_ = result["output_dir"] if self.output_dir else None
        self.history_ = result["rounds"]
        self.n_iter_ = len(result["rounds"])
        return result, arrays


class _Federated(_InProcess):
    """What the k-means estimators share: fitted centers, per-client labels, predict."""

    def _config(self) -> dict[str, Any]:  # the run config of this estimator's parameters
        raise NotImplementedError

    def fit(self, clients: Sequence[Any], y: Any = None, server_data: Any = None) -> "_Federated":
        """Run the federation over ``clients`` (one array per client, or a folder of one
        ``.npy``/``.csv``/``.parquet`` file per client); ``y`` is ignored."""
        arrays = _client_arrays(clients)
        if server_data is not None:
            server_data = np.asarray(server_data, dtype=np.float64)
            if server_data.ndim != 2 or server_data.shape[1] != arrays[0].shape[1]:
                raise ValueError(f"server_data has shape {server_data.shape}: expected (points, {arrays[0].shape[1]})")
        writers = [lambda folder, i, a=a: np.save(folder / f"client_{i:05d}.npy", a) for a in arrays]
        result, loaded = self._federate(self._config(), "npy-dir", writers, ("centers",), server_data, labels=True)
        self.cluster_centers_ = loaded["centers"]
        self.n_features_in_ = arrays[0].shape[1]
        self.scaling_ = Scaling.of_run(result)  # standardize: the federated mean_ and scale_ (else None)
        self.labels_ = result["labels"]  # each node's nearest centers, from its own points
        final = result.get("final") or {}
        self.inertia_ = float(
            final["total_cost"] if "total_cost" in final else sum(kmeans_cost(*self._space(a)) for a in arrays)
        )
        return self

    def _space(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``X`` and the centers in the space the run clustered in (standardized or not)."""
        if self.scaling_ is None:
            return X, self.cluster_centers_
        return self.scaling_.apply(X), self.scaling_.apply(self.cluster_centers_)

    def fit_predict(self, clients: Sequence[Any], y: Any = None, **kwargs: Any) -> list[np.ndarray]:
        """``fit`` and return ``labels_``: one label array per client."""
        return self.fit(clients, **kwargs).labels_

    def predict(self, X: Any) -> np.ndarray:
        """The nearest fitted center of every row of ``X``."""
        if not hasattr(self, "cluster_centers_"):
            raise AttributeError(f"this {type(self).__name__} is not fitted yet: call fit(clients) first")
        points = np.asarray(X, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != self.n_features_in_:
            raise ValueError(f"X has shape {points.shape}: expected (points, {self.n_features_in_})")
        return nearest(*self._space(points))

    def score(self, X: Any, y: Any = None) -> float:
        """Opposite of the k-means cost of ``X`` (scikit-learn's convention: higher is better;
        in standardized units when the run was standardized, as ``inertia_``)."""
        self.predict(X)  # checks
        return -float(kmeans_cost(*self._space(np.asarray(X, dtype=np.float64))))


class FederatedKMeans(_Federated):
    """Federated k-means: ``algorithm`` = ``"fedkmeans"`` (Triebe et al.), ``"kfed"``
    (one-shot, Dennis et al.) or ``"da-ufl"`` (dual averaging, Servetnyk et al.).

    ``max_iter``: FedKMeans rounds (``num-rounds``) or DA-UFL outer iterations; ``tol``:
    FedKMeans' stopping shift; ``fraction``: FedKMeans' share of clients per round;
    ``n_init``: FedKMeans' center sets trained side by side (``n-init``). None keeps the
    run-config default. ``verbose``: show the run's INFO log lines (default: warnings only).
    Fitted: ``cluster_centers_`` (FedKMeans: the cheapest centers its rounds measured on
    every client, not necessarily the last), ``labels_`` (a list, one
    array per client), ``inertia_`` (k-means cost over all clients), ``n_iter_`` (rounds
    recorded), ``history_`` (per-round records), ``scaling_`` (with run-config
    ``standardize``: the federated mean and scale; None otherwise), ``result_`` (the whole
    ``result.json``). What the run's own numbers warn about is raised as a
    :class:`FederatedRunWarning` (and kept in ``result_["warnings"]``).
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        algorithm: str = "fedkmeans",
        random_state: Any = None,
        max_iter: int | None = None,
        tol: float | None = None,
        fraction: float | None = None,
        n_init: int | None = None,
        run_config: dict[str, Any] | None = None,
        output_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        _keep(self, locals())

    def _config(self) -> dict[str, Any]:
        return self._run_config(
            self.algorithm,
            self.n_clusters,
            ("max_iter", "tol", "fraction", "n_init"),
            "DPFederatedKMeans runs FedDP-KMeans",
        )


class DPFederatedKMeans(_Federated):
    """FedDP-KMeans (Scott et al.): differentially private federated k-means, started from a
    private histogram of candidates (server points when server-side data is given to
    ``fit(clients, server_data=points)``; without it, points in the ball of radius
    ``run_config={"clip-norm": Δ}``) followed by relative Lloyd rounds, ``max_iter`` of them
    or, by default, as many as the budget carries for the clients' number of points
    (``fedcluster.algorithms.feddp_kmeans.model.lloyd_rounds_for``; the number of rounds, which the result
    reports, then treats that count as public: give ``max_iter`` to keep it out of the
    result). At ``privacy_level="client"`` with server data it runs FedDP-Init (Lloyd rounds
    only with ``max_iter``); without server data as above.

    ``privacy_level``: ``"data-point"`` or ``"client"``; ``epsilon``, ``delta``: the total
    budget; ``max_iter``: FedDP-Lloyd rounds; ``verbose`` as FederatedKMeans. Fitted as
    FederatedKMeans, plus ``privacy_`` (the budget ledger of ``result.json``). ``inertia_`` is
    the exact cost, a report outside the DP guarantee (``evaluate-cost``).
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        epsilon: float = 1.0,
        delta: float = 1e-6,
        privacy_level: str = "data-point",
        random_state: Any = None,
        max_iter: int | None = None,
        run_config: dict[str, Any] | None = None,
        output_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        _keep(self, locals())

    def _config(self) -> dict[str, Any]:
        own: dict[str, Any] = _own_keys("DPFederatedKMeans", "feddp-kmeans", {"max_iter": self.max_iter}, "")
        own.update(
            {
                "algorithm": "feddp-kmeans",
                "k": self.n_clusters,
                "seed": _seed(self.random_state),
                "epsilon": self.epsilon,
                "delta": self.delta,
                "privacy-level": self.privacy_level,
            }
        )
        served = getattr(self, "_served", False)
        if (
            self.max_iter is None
            and getattr(self, "_points", None)
            and "lloyd-rounds" not in (self.run_config or {})
            and (not served or self.privacy_level == "data-point")
        ):
            # as many rounds as the budget carries for this many points (lloyd_rounds_for; a
            # data-point level rule: with server data at client level FedDP-Init runs alone);
            # the count is then public-points, listed outside the guarantee
            own["lloyd-rounds"] = feddp_kmeans.lloyd_rounds_for(
                self._points, self.n_clusters, self._dimension, self.epsilon, self.delta
            )
            own["public-points"] = self._points
        if getattr(self, "_dimension", None) and not served and "dimension" not in (self.run_config or {}):
            own["dimension"] = self._dimension  # without server data: the clients' (public: their arrays' width)
        return _merged(self.run_config, own)

    def fit(self, clients: Sequence[Any], y: Any = None, server_data: Any = None) -> "DPFederatedKMeans":
        """Without ``server_data`` the run starts from a private histogram of candidates in
        the ball of radius ``clip-norm`` (give it in ``run_config``), followed by
        ``max_iter`` Lloyd rounds (default: from the budget and the clients' number of points)."""
        arrays = _client_arrays(clients)
        self._dimension, self._points = arrays[0].shape[1], sum(a.shape[0] for a in arrays)
        self._served = server_data is not None
        super().fit(clients, y, server_data=server_data)
        self.privacy_ = self.result_.get("privacy")
        return self


class FederatedSpectralClustering(_InProcess):
    """Federated spectral graph clustering: ``algorithm`` = ``"fedspectral-plus"`` (federated
    power iteration / block Krylov on the summed adjacency) or ``"fedspectral"`` (one round:
    local spectral labels, server co-association).

    ``fit(clients)``: one integer edge array (m_i × 2, node ids 0 .. n_nodes − 1) per client.
    ``n_nodes``: the global number of graph nodes (None = largest id + 1). ``max_iter``:
    FedSpectral+ communication rounds (``num-rounds``); ``verbose`` as FederatedKMeans.
    Fitted: ``labels_`` (one cluster per GRAPH node), ``embedding_`` (n_nodes × k),
    ``n_iter_``, ``history_``, ``result_``.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        algorithm: str = "fedspectral-plus",
        n_nodes: int | None = None,
        random_state: Any = None,
        max_iter: int | None = None,
        run_config: dict[str, Any] | None = None,
        output_dir: str | None = None,
        verbose: bool = False,
    ) -> None:
        _keep(self, locals())

    def fit(self, clients: Sequence[Any], y: Any = None) -> "FederatedSpectralClustering":
        own: dict[str, Any] = _own_keys(
            "FederatedSpectralClustering", self.algorithm, {"max_iter": self.max_iter}, "graphs: node ids in edge lists"
        )
        if isinstance(clients, np.ndarray) or not isinstance(clients, Sequence) or len(clients) == 0:
            raise ValueError("clients must be a non-empty list with one (edges × 2) integer array per client")
        edges = []
        for i, client in enumerate(clients):
            array = np.asarray(client)
            if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] == 0:
                raise ValueError(f"clients[{i}] has shape {array.shape}: expected (edges, 2) with at least one edge")
            if array.dtype.kind not in "iu" or (array.size and array.min() < 0):
                raise ValueError(f"clients[{i}] must hold non-negative integer node ids (dtype {array.dtype})")
            edges.append(array.astype(np.int64))
        largest = max(int(e.max()) for e in edges)
        n_nodes = self.n_nodes if self.n_nodes is not None else largest + 1
        if largest >= n_nodes:
            raise ValueError(f"a client holds node id {largest}, but n_nodes={n_nodes} (ids 0 .. {n_nodes - 1})")
        own.update(
            {"algorithm": self.algorithm, "k": self.n_clusters, "seed": _seed(self.random_state), "num-nodes": n_nodes}
        )
        writers = [lambda folder, i, e=e: np.savetxt(folder / f"client_{i:05d}.txt", e, fmt="%d") for e in edges]
        _, loaded = self._federate(_merged(self.run_config, own), "edge-dir", writers, ("labels", "embedding"))
        self.labels_, self.embedding_ = loaded["labels"], loaded["embedding"]
        return self
