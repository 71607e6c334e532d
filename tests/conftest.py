"""Shared test helpers, and the tiers.

Tests live in ``tests/unit`` (kernels and math on small arrays, oracles), ``tests/protocol``
(whole algorithms through the in-process runner) and ``tests/engine`` (real Flower
processes). The folder sets the marker (``-m unit`` / ``protocol`` / ``engine``); the tiers
run in that order (pytest.ini ``testpaths``), and when a unit test fails the slower tiers
are not started, so a red unit test fails the run in about a minute.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One BLAS thread per process: on a busy 2-core machine OpenBLAS threads oversubscribe
# the cores and slow dense linear algebra down 10x. Set before NumPy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):  # the project, conftest
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def graphs_dir() -> Path | None:
    """The SNAP graphs: $FEDCLUSTER_GRAPHS, ./graphs (where ``fedcluster-fetch-graphs`` puts
    them), or ../shared/data/graphs beside the project (an offline cache)."""
    candidates = [
        os.environ.get("FEDCLUSTER_GRAPHS", ""),
        str(ROOT / "graphs"),
        str(ROOT.parent / "shared" / "data" / "graphs"),
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "email-Eu-core.txt").is_file():
            return Path(candidate).resolve()
    return None


def split_email_eu_core(tmp_path: Path, clients: int = 5, copies: int = 2) -> Path:
    """email-Eu-core split over ``clients`` edge files (every edge on ``copies``), or a skip."""
    from fedcluster.algorithms.fedspectral.split_tool import main as split_main

    graphs = graphs_dir()
    if graphs is None:
        pytest.skip("SNAP graphs not found: run fedcluster-fetch-graphs --out graphs, or set FEDCLUSTER_GRAPHS")
    out = tmp_path / f"email{clients}"
    assert (
        split_main(
            [str(graphs / "email-Eu-core.txt"), "--clients", str(clients), "--copies", str(copies), "--out", str(out)]
        )
        == 0
    )
    return out


def lloyd_step(X, C):
    """One Lloyd step written out directly, independent of fedcluster.lloyd (empty
    clusters keep their center): the oracle of several tests."""
    labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    out = C.copy()
    for j in range(C.shape[0]):
        if np.any(labels == j):
            out[j] = X[labels == j].mean(0)
    return out


def state_partition(record, sent, own, labels_of) -> bool:
    """Make the ``fedkmeans_train`` reply ``record`` (full batch, client-lr 1) state, for each
    center set s of ``sent``, the partition ``labels_of(s)`` of the points ``own``: the true
    statistics of a (possibly false) partition and its cost for the received centers. When
    ``labels_of`` gives None for a set, the record is left as it was and False returned."""
    from flwr.app import Array

    labelling = [labels_of(s) for s in range(sent.shape[0])]
    if any(labels is None for labels in labelling):
        return False
    centers, counts = record["centers"].numpy().copy(), record["counts"].numpy().copy()
    scatter, cost = np.zeros_like(centers), np.zeros(sent.shape[0])
    for s, labels in enumerate(labelling):
        counts[s], centers[s], scatter[s] = 0, sent[s], 0
        for j in np.unique(labels):
            mine = own[labels == j]
            counts[s, j], centers[s, j], scatter[s, j] = len(mine), mine.mean(0), ((mine - mine.mean(0)) ** 2).sum(0)
        cost[s] = float(((own - sent[s][labels]) ** 2).sum())
    record["centers"], record["counts"], record["scatter"], record["cost"] = (
        Array(centers),
        Array(counts),
        Array(scatter),
        Array(cost),
    )
    return True


def write_npy_dir(directory: Path, arrays: list[np.ndarray]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, array in enumerate(arrays):
        np.save(directory / f"client_{i:03d}.npy", array)
    return directory


def spread_clusters(tmp_path: Path, seed: int) -> tuple[Path, np.ndarray]:
    """Ten devices, five clusters in 3-D: device i holds 60 points of cluster i mod 5 and 15
    of the next (each cluster mostly on two devices: losing a few devices loses clusters).
    Returns the data folder and the pooled points."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=10.0, size=(5, 3))
    parts = [
        np.vstack([means[i % 5] + rng.normal(size=(60, 3)), means[(i + 1) % 5] + rng.normal(size=(15, 3))])
        for i in range(10)
    ]
    return write_npy_dir(tmp_path / "data", parts), np.vstack(parts)


def central_cost(X: np.ndarray, k: int) -> float:
    """The bar of the churn tests: scikit-learn's KMeans(n_init=10) on the pooled points."""
    from sklearn.cluster import KMeans

    return float(KMeans(k, n_init=10, random_state=0).fit(X).inertia_)


@pytest.fixture
def blobs():
    """Three well separated 2-D blobs split over 4 clients (non-IID)."""
    rng = np.random.default_rng(7)
    means = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    parts = []
    for i in range(4):
        chosen = means[[i % 3, (i + 1) % 3]]
        parts.append(np.concatenate([m + rng.normal(size=(30 + 5 * i, 2)) for m in chosen]))
    return parts


TIERS = ("unit", "protocol", "engine")


def _tier(item) -> str | None:
    parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier(item)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "engine":  # with -n 2 --dist loadgroup: one worker runs them, in order, beside the others
            item.add_marker(pytest.mark.xdist_group("engine"))
        if item.get_closest_marker("nightly") and os.environ.get("FEDCLUSTER_NIGHTLY") != "1":
            item.add_marker(pytest.mark.skip(reason="nightly only: bash .ci/run --nightly (FEDCLUSTER_NIGHTLY=1)"))
    items.sort(key=lambda item: TIERS.index(_tier(item)) if _tier(item) else len(TIERS))


_UNIT_FAILURES: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and report.nodeid.replace("\\", "/").startswith("tests/unit/"):
        _UNIT_FAILURES.append(report.nodeid)


def pytest_runtest_setup(item):
    if _UNIT_FAILURES and _tier(item) in ("protocol", "engine") and "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.exit(
            f"{len(_UNIT_FAILURES)} unit test(s) failed (first: {_UNIT_FAILURES[0]}); the protocol and engine tiers "
            "were not run",
            returncode=1,
        )
