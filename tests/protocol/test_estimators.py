"""The scikit-learn-style estimators: the same federation as the run-config path."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import clone

import fedcluster
from conftest import write_npy_dir
from fedcluster.inprocess import run


def clients_of(seed=0, n=6, d=3):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(40 + 7 * i, d)) + (i % 3) * 6 for i in range(n)]


@pytest.mark.parametrize("algorithm,max_iter", [("fedkmeans", 5), ("kfed", None), ("da-ufl", 3)])
def test_same_seed_same_result_as_the_run_config_path(algorithm, max_iter, tmp_path):
    clients = clients_of()
    model = fedcluster.FederatedKMeans(3, algorithm=algorithm, random_state=7, max_iter=max_iter).fit(clients)
    config = {
        "algorithm": algorithm,
        "k": 3,
        "seed": 7,
        "dataset": "npy-dir",
        "reference": False,
        "data-dir": str(write_npy_dir(tmp_path / "data", clients)),
        "output-dir": str(tmp_path / "out"),
    }
    if max_iter is not None:
        config[{"fedkmeans": "num-rounds", "da-ufl": "outer-iterations"}[algorithm]] = max_iter
    result = run(config, num_nodes=len(clients))
    np.testing.assert_array_equal(model.cluster_centers_, np.load(tmp_path / "out" / "centers.npy"))
    assert model.inertia_ == pytest.approx(result["final"]["total_cost"], rel=1e-12)
    assert model.n_iter_ == len(result["rounds"])


def test_labels_are_each_clients_nearest_centers_and_predict_agrees():
    clients = clients_of(1)
    model = fedcluster.FederatedKMeans(3, random_state=0, max_iter=4)
    labels = model.fit_predict(clients)
    assert len(labels) == len(clients)
    C = model.cluster_centers_
    for X, got in zip(clients, labels):
        expected = np.array([min(range(len(C)), key=lambda j: float(((x - C[j]) ** 2).sum())) for x in X])
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(model.predict(X), expected)
    pooled = np.concatenate(clients)
    naive = sum(min(float(((x - c) ** 2).sum()) for c in C) for x in pooled)
    assert model.inertia_ == pytest.approx(naive, rel=1e-9)
    assert model.score(pooled) == pytest.approx(-naive, rel=1e-9)
    assert 1 <= len(model.history_) == model.n_iter_ <= 4  # max_iter bounds the rounds, as scikit-learn's
    assert all("replies" in r for r in model.history_)


def test_clone_and_set_params_follow_scikit_learn():
    model = fedcluster.FederatedKMeans(4, algorithm="kfed", random_state=3, run_config={"k-prime": 2})
    copy = clone(model)
    assert copy.get_params() == model.get_params()
    copy.set_params(n_clusters=5, algorithm="fedkmeans")
    assert (copy.n_clusters, copy.algorithm, model.n_clusters) == (5, "fedkmeans", 4)
    assert set(fedcluster.DPFederatedKMeans().get_params()) >= {"n_clusters", "epsilon", "delta", "privacy_level"}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize(
    "make",
    [
        lambda verbose: fedcluster.FederatedKMeans(3, random_state=0, max_iter=3, verbose=verbose).fit(clients_of()),
        lambda verbose: fedcluster.FederatedSpectralClustering(2, verbose=verbose).fit([np.array([[0, 1], [1, 2]])]),
    ],
)
def test_estimators_are_quiet_unless_verbose(make):
    """A notebook fit shows no INFO lines (per round, the summary, the temporary folder)
    unless verbose=True; Flower's logger is left as it was."""
    logger, handler = logging.getLogger("flwr"), _Records()
    level = logger.level
    logger.addHandler(handler)
    try:
        make(False)
        assert [r.getMessage() for r in handler.records if r.levelno < logging.WARNING] == []
        assert logger.level == level
        make(True)
        info = [r.getMessage() for r in handler.records if r.levelno == logging.INFO]
        assert any("finished in" in text for text in info), info
    finally:
        logger.removeHandler(handler)
    assert logger.level == level


def test_a_quiet_estimator_still_shows_the_runs_warnings():
    logger, handler = logging.getLogger("flwr"), _Records()
    logger.addHandler(handler)
    try:
        clients = clients_of()
        fedcluster.DPFederatedKMeans(3, max_iter=0, run_config={"init": "server-kmeans++"}).fit(
            clients, server_data=np.concatenate(clients)[::5]
        )
    finally:
        logger.removeHandler(handler)
    assert any(r.levelno == logging.WARNING and "never uses client data" in r.getMessage() for r in handler.records)
    assert all(r.levelno >= logging.WARNING for r in handler.records)


def test_dp_estimator_reports_its_privacy_budget():
    clients = clients_of(2)
    server = np.concatenate(clients)[::5] + 0.1
    model = fedcluster.DPFederatedKMeans(3, epsilon=2.0, random_state=0, run_config={"noise-seed": 1})
    model.fit(clients, server_data=server)
    assert model.privacy_["epsilon"] <= 2.0 + 1e-9
    assert model.privacy_["level"] == "data-point"
    assert model.cluster_centers_.shape == (3, 3)
    assert sum(map(len, model.labels_)) == sum(map(len, clients))


@pytest.mark.parametrize(
    "make,clients,message",
    [
        (lambda: fedcluster.FederatedKMeans(2), np.zeros((5, 2)), "one 2-D array"),
        (lambda: fedcluster.FederatedKMeans(2), [], "empty"),
        (lambda: fedcluster.FederatedKMeans(2), [np.zeros((5, 2)), np.zeros((5, 3))], r"clients\[1\] has 3 features"),
        (
            lambda: fedcluster.FederatedKMeans(2),
            [np.zeros((5, 2)), np.full((5, 2), np.nan)],
            r"clients\[1\] contains NaN",
        ),
        (lambda: fedcluster.FederatedKMeans(2), [np.zeros(5)], r"clients\[0\] must be a 2-D array .*got shape \(5,\)"),
        (lambda: fedcluster.FederatedKMeans(2), [np.zeros((0, 2))], r"clients\[0\] has no points"),
        (lambda: fedcluster.FederatedKMeans(2), [[["a", "b"]]], "not numeric"),
        (
            lambda: fedcluster.FederatedKMeans(2, algorithm="kfed", max_iter=3),
            [np.zeros((5, 2))],
            "max_iter does not apply",
        ),
        (
            lambda: fedcluster.FederatedKMeans(2, algorithm="da-ufl", fraction=0.5),
            [np.zeros((5, 2))],
            "fraction does not apply",
        ),
        (lambda: fedcluster.FederatedKMeans(2, algorithm="feddp-kmeans"), [np.zeros((5, 2))], "DPFederatedKMeans"),
        (
            lambda: fedcluster.FederatedKMeans(2, run_config={"k": 3}),
            [np.zeros((5, 2))],
            r"run_config sets \['k'\].*n_clusters",
        ),
        (lambda: fedcluster.FederatedKMeans(2, run_config={"data-dir": "/x"}), [np.zeros((5, 2))], r"fit\(clients\)"),
        (lambda: fedcluster.FederatedKMeans(2, run_config={"output-dir": "/x"}), [np.zeros((5, 2))], "output_dir"),
        (lambda: fedcluster.FederatedKMeans(2, random_state=-1), [np.zeros((5, 2))], "random_state=-1"),
    ],
)
def test_bad_input_is_refused_with_its_name(make, clients, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make().fit(clients)


def test_bad_run_config_value_is_refused_by_the_config_check():
    with pytest.raises(ValueError, match="fraction"):
        fedcluster.FederatedKMeans(2, fraction=1.5).fit(clients_of())


def test_predict_before_fit_says_so():
    with pytest.raises(AttributeError, match="not fitted"):
        fedcluster.FederatedKMeans(2).predict(np.zeros((3, 2)))


def test_importing_fedcluster_does_not_import_flwr():
    code = "import sys, fedcluster; assert 'flwr' not in sys.modules; print(fedcluster.FederatedKMeans.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "FederatedKMeans"


def two_communities(seed=0):
    rng = np.random.default_rng(seed)
    edges = [
        (a, b) for a in range(40) for b in range(a + 1, 40) if rng.random() < (0.3 if (a < 20) == (b < 20) else 0.01)
    ]
    edges = np.array(edges)
    return [edges[p] for p in np.array_split(rng.permutation(len(edges)), 4)]


def test_spectral_estimator_matches_the_run_config_path_and_finds_the_communities(tmp_path):
    clients = two_communities()
    model = fedcluster.FederatedSpectralClustering(2, random_state=3).fit(clients)
    folder = tmp_path / "edges"
    folder.mkdir()
    for i, e in enumerate(clients):
        np.savetxt(folder / f"client_{i:05d}.txt", e, fmt="%d")
    run(
        {
            "algorithm": "fedspectral-plus",
            "k": 2,
            "seed": 3,
            "num-nodes": 40,
            "dataset": "edge-dir",
            "reference": False,
            "data-dir": str(folder),
            "output-dir": str(tmp_path / "out"),
        },
        num_nodes=len(clients),
    )
    np.testing.assert_array_equal(model.labels_, np.load(tmp_path / "out" / "labels.npy"))
    assert len(set(model.labels_[:20])) == 1 and len(set(model.labels_[20:])) == 1
    assert model.labels_[0] != model.labels_[20]
    assert model.embedding_.shape[0] == 40


@pytest.mark.parametrize(
    "kwargs,clients,message",
    [
        ({}, [np.array([[0, 1, 2]])], r"clients\[0\] has shape \(1, 3\)"),
        ({}, [np.array([[0.5, 1.0]])], "integer node ids"),
        ({}, [np.array([[0, -1]])], "non-negative"),
        ({"n_nodes": 3}, [np.array([[0, 5]])], "node id 5, but n_nodes=3"),
        ({"algorithm": "fedspectral", "max_iter": 4}, [np.array([[0, 1]])], "max_iter does not apply"),
        ({"algorithm": "spectral"}, [np.array([[0, 1]])], "fedspectral-plus"),
    ],
)
def test_spectral_estimator_refuses_bad_edges(kwargs, clients, message):
    with pytest.raises(ValueError, match=message):
        fedcluster.FederatedSpectralClustering(2, **kwargs).fit(clients)


def test_the_estimators_page_runs_as_written():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "estimators.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    scope = {}
    exec(compile(code, "docs/guide/estimators.md", "exec"), scope)
    assert scope["model"].cluster_centers_.shape == (3, 2)
    assert scope["dp"].privacy_["epsilon"] <= 2.0 + 1e-9
    assert len(scope["graph"].labels_) == 5


def test_the_da_ufl_page_runs_as_written():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "da-ufl.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    scope = {}
    exec(compile(code, "docs/guide/da-ufl.md", "exec"), scope)
    model = scope["model"]
    assert model.result_["algorithm"] == "da-ufl" and model.result_["da_ufl"]["weighting"] == "som"
    distances = np.linalg.norm(model.cluster_centers_[:, None] - np.array([[0, 0], [5, 0], [0, 5]])[None], axis=2)
    assert sorted(distances.argmin(0)) == [0, 1, 2] and distances.min(0).max() < 0.5  # one center per true mean


def test_the_readme_notebook_example_runs_as_written():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "FederatedKMeans" in b)
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["model"].cluster_centers_.shape == (4, 2)
    assert len(scope["model"].labels_) == 12
    assert scope["dp"].privacy_["epsilon"] <= 1.0 + 1e-9
    labels = scope["graph"].labels_
    assert len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1 and labels[0] != labels[3]
