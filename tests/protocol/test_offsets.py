"""Data far from the origin (issue 42, case 1): every point algorithm, every option that
touches the statistics, on the same Gaussian mixture shifted by 1e6 … 1e12 (a Unix-time
feature is 1.7e9): the run completes, no honest device is excluded or has a reply dropped,
the centers minus the offset are those of the unshifted run (or cost within 5 % of central
k-means on the shifted data), and the cost the run reports is the true cost of the centers
it returns, computed here about the offset (no cancellation)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.cluster import KMeans

from conftest import write_npy_dir
from fedcluster.config import with_defaults
from fedcluster.node_data import generated_partition
from fedcluster.inprocess import run

OFFSETS = [1e6, 1e8, 1e9, 1.7e9, 1e12]
K, DEVICES = 5, 10
VARIANTS = {  # name: run-config overrides (defaults otherwise)
    "fedkmeans": {},
    "fedkmeans-fraction": {"fraction": 0.5},
    "fedkmeans-standardize": {"standardize": True},
    "fedkmeans-k-range": {"k-range": "3:6"},
    "kfed": {"algorithm": "kfed"},
    "da-ufl-uniform": {"algorithm": "da-ufl", "weighting": "uniform"},
    "da-ufl-som": {"algorithm": "da-ufl", "weighting": "som"},
    "da-ufl-bin": {"algorithm": "da-ufl", "weighting": "bin"},
    "feddp-kmeans": {
        "algorithm": "feddp-kmeans",
        "epsilon": 5.0,
        "lloyd-rounds": 3,
        "noise-seed": 3,
        "server-data": True,
    },
}


def mixture() -> list[np.ndarray]:
    """The issue's setup: a Gaussian mixture, d = 3, k = 5, 3000 points over 10 devices."""
    config = with_defaults({"k": K, "dim": 3, "num-points": 3000, "seed": 0})
    return [generated_partition(dict(config), i, DEVICES)[0] for i in range(DEVICES)]


def federate(folder, variant: str, offset: float) -> tuple[dict, list[np.ndarray], np.ndarray]:
    """One run of ``variant`` on the mixture shifted by ``offset``: its result.json, the
    devices' points (as stored: shifted and rounded) and the centers it wrote."""
    parts = [x + offset for x in mixture()]
    config = {
        "k": K,
        "seed": 0,
        "reference": False,
        "dataset": "npy-dir",
        "data-dir": str(write_npy_dir(folder / "data", parts)),
        "output-dir": str(folder / "out"),
        **VARIANTS[variant],
    }
    if config.get("server-data"):  # public points of the same kind, at the same offset
        pooled = np.concatenate(mixture())
        server = pooled[np.random.default_rng(5).choice(len(pooled), 150, replace=False)] + offset
        np.save(folder / "server.npy", server)
        config["server-data"] = str(folder / "server.npy")
    result = run(config, num_nodes=DEVICES)
    return result, parts, np.load(folder / "out" / "centers.npy")


def cost_about(X: np.ndarray, centers: np.ndarray, offset: float) -> float:
    """The k-means cost of ``centers`` on ``X``, both taken about ``offset`` first (exact
    for coordinates within a factor of two of it), by direct differences."""
    X, centers = X - offset, centers - offset
    return float(((X[:, None, :] - centers[None]) ** 2).sum(-1).min(1).sum())


_UNSHIFTED: dict[str, tuple] = {}


def unshifted(variant: str, tmp_path_factory) -> tuple[dict, np.ndarray]:
    if variant not in _UNSHIFTED:
        result, _, centers = federate(tmp_path_factory.mktemp(f"unshifted-{variant}"), variant, 0.0)
        _UNSHIFTED[variant] = (result, centers)
    return _UNSHIFTED[variant]


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_shifted_federation_gives_the_unshifted_result(tmp_path, tmp_path_factory, variant, offset):
    result, parts, centers = federate(tmp_path, variant, offset)
    # no honest device is excluded, or has a reply dropped
    assert not result["nodes"]["exclusions"], result["nodes"]["exclusions"]
    failures = [f for phase in result["phases"] for f in phase["failures"]]
    assert not failures, failures[:3]
    X = np.concatenate(parts)
    # the reported cost is the true cost of the centers returned (a standardized run's in its units)
    scaling = result.get("standardize")
    rounding = 0.0
    if scaling:
        mean, scale = np.asarray(scaling["mean"]), np.asarray(scaling["scale"])
        # the federation's standardization is StandardScaler's of the shifted points
        np.testing.assert_allclose(scale, (X - offset).std(0), rtol=1e-9, atol=4 * np.spacing(offset))
        np.testing.assert_allclose(mean - offset, (X - offset).mean(0), atol=1e-9 + 4 * np.spacing(offset))
        true = cost_about((X - offset - (mean - offset)) / scale, (centers - offset - (mean - offset)) / scale, 0.0)
        # the run's centers are standardized; centers.npy holds them in the original units,
        # rounded to a unit in the last place of the offset: what that moves the cost
        e = float(np.linalg.norm(np.spacing(np.abs(centers)).max(0) / scale))
        rounding = 2 * e * np.sqrt(len(X) * true) + len(X) * e * e
    else:
        true = cost_about(X, centers, offset)
    assert abs(result["final"]["total_cost"] - true) <= 1e-9 * true + rounding
    # the unshifted run's centers, moved by the offset; else within 5 % of central k-means
    reference, reference_centers = unshifted(variant, tmp_path_factory)
    if "k_range" in result:
        assert result["k_range"]["calinski_harabasz_k"] == reference["k_range"]["calinski_harabasz_k"]
    spread = float(np.sqrt(np.concatenate(mixture()).var(0).sum()))
    same = centers.shape == reference_centers.shape and np.allclose(
        centers - offset, reference_centers, atol=1e-4 * spread
    )
    if not same:
        central = KMeans(centers.shape[0], n_init=10, random_state=0).fit(X - offset).cluster_centers_
        assert cost_about(X, centers, offset) <= 1.05 * cost_about(X - offset, central, 0.0), variant


@pytest.mark.parametrize("spread", [1e132, 1e133], ids=["one-value", "eleven-values"])
@pytest.mark.parametrize("algorithm", ["fedkmeans", "kfed"])
def test_at_the_loaders_limit_a_run_completes_and_says_what_it_found_in_plain_numbers(tmp_path, algorithm, spread):
    """At 5e149 (the loader refuses 1e150) a coordinate is known to 6e133: the mixture spread
    over 1e132 is one point, over 1e133 eleven. With k = 5 the run completes, reports the true
    cost of its centers, names centers that coincide, and no sentence holds a number of
    hundreds of digits (a 190-digit percentage once, for centers that had not moved)."""
    offset = 5e149
    parts = [offset + x * spread for x in mixture()]
    config = {
        "algorithm": algorithm,
        "k": K,
        "seed": 0,
        "reference": False,
        "dataset": "npy-dir",
        "data-dir": str(write_npy_dir(tmp_path / "data", parts)),
        "output-dir": str(tmp_path / "out"),
    }
    result = run(config, num_nodes=DEVICES)
    centers = np.load(tmp_path / "out" / "centers.npy")
    assert result["final"]["total_cost"] == pytest.approx(cost_about(np.concatenate(parts), centers, offset), rel=1e-9)
    assert not any(re.search(r"\d{16}", text) for text in result["warnings"]), result["warnings"]
    duplicates = len(centers) - len(np.unique(centers, axis=0))
    assert any("coincide" in text for text in result["warnings"]) == (duplicates > 0), result["warnings"]
    assert duplicates == (K - 1 if spread == 1e132 else 0)


@pytest.mark.parametrize("offset", [1e9, 1e12], ids=lambda o: f"{o:g}")
def test_feddp_without_server_data_clips_around_a_public_point_near_the_data(tmp_path, offset):
    """Without server data FedDP-KMeans takes the points around clip-center: the origin
    clips data far from it to a sphere of radius clip-norm (garbage, no error); a public
    point near them (here the offset, as a Unix-time epoch is public) gives the unshifted
    run's centers, noise and all; a clip-center that is no point is refused by its key."""
    base = {
        "algorithm": "feddp-kmeans",
        "k": K,
        "seed": 0,
        "reference": False,
        "dataset": "npy-dir",
        "epsilon": 20.0,
        "noise-seed": 2,
        "init": "histogram",
        "lloyd-rounds": 5,
        "dimension": 3,
        "clip-norm": 30.0,
    }

    def federate_around(folder, shift):
        parts = [x + shift for x in mixture()]
        config = {
            **base,
            "data-dir": str(write_npy_dir(folder / "data", parts)),
            "output-dir": str(folder / "out"),
            "clip-center": ",".join([repr(shift)] * 3),
        }
        return run(config, num_nodes=DEVICES), np.load(folder / "out" / "centers.npy")

    near, near_centers = federate_around(tmp_path / "near", 0.0)
    far, far_centers = federate_around(tmp_path / "far", offset)
    assert far["init"]["clip_center"] == "point"
    np.testing.assert_allclose(far_centers - offset, near_centers, atol=1e-6 + 4 * np.spacing(offset))
    assert far["final"]["cost"] == pytest.approx(near["final"]["cost"], rel=1e-6)
    with pytest.raises(Exception, match="clip-center"):
        run({**base, "data-dir": str(tmp_path / "far" / "data"), "clip-center": "1e9,x"}, num_nodes=DEVICES)


def best_apart(near: np.ndarray, far: np.ndarray, k: int) -> float:
    """Central k-means' cost on two groups too far apart for a center to serve both: the
    best split of the k centers between them, each group clustered about its own mean."""

    def central(X, j):
        X = X - X.mean(0)
        return cost_about(X, KMeans(j, n_init=10, random_state=0).fit(X).cluster_centers_, 0.0)

    return min(central(near, k - j) + central(far, j) for j in range(1, min(k, len(far))))


@pytest.mark.parametrize("variant", ["fedkmeans-standardize", "da-ufl-standardize"])
def test_one_device_far_from_the_others_is_clustered_with_every_reply_accepted(tmp_path, variant):
    """One device's points 1e9 from the others' (a heavy tail, not a shift), standardize =
    true: the bulk lies off the standardized origin in clusters 1e-9 wide, tighter than the
    BLAS form's rounding there. No honest reply is dropped as "not a nearest-center
    assignment" (issue 42's probe: the run stopped), and the centers cost within 5 % of
    central k-means'."""
    parts = mixture()
    parts[3] = parts[3] + 1e9
    config = {
        "k": K,
        "seed": 0,
        "reference": False,
        "dataset": "npy-dir",
        "standardize": True,
        "data-dir": str(write_npy_dir(tmp_path / "data", parts)),
        "output-dir": str(tmp_path / "out"),
        **({"algorithm": "da-ufl"} if variant.startswith("da-ufl") else {}),
    }
    result = run(config, num_nodes=DEVICES)
    assert not result["nodes"]["exclusions"], result["nodes"]["exclusions"]
    failures = [f for phase in result["phases"] for f in phase["failures"]]
    assert not failures, failures[:3]
    centers = np.load(tmp_path / "out" / "centers.npy")
    near, far = np.concatenate(parts[:3] + parts[4:]), parts[3]
    # no center serves both groups: each group's cost with its own centers, about itself
    found = cost_about(near, centers[np.abs(centers).max(1) < 1e8], 0.0) + cost_about(
        far - 1e9, centers[np.abs(centers).max(1) >= 1e8] - 1e9, 0.0
    )
    assert found <= 1.05 * best_apart(near, far - 1e9, K)


def test_feddp_without_server_data_says_when_nothing_placed_its_clip_ball(tmp_path):
    """clip-center = auto without server data clips around the origin: on data 1e9 from it
    every point lands on the sphere (issue 42's probe: 1e18 × central's cost, no word). The
    run says so, naming clip-center and clip-norm; a clip-center given says nothing."""
    parts = [x + 1e9 for x in mixture()]
    config = {
        "algorithm": "feddp-kmeans",
        "k": K,
        "seed": 0,
        "reference": False,
        "dataset": "npy-dir",
        "epsilon": 20.0,
        "noise-seed": 2,
        "lloyd-rounds": 2,
        "dimension": 3,
        "clip-norm": 30.0,
        "data-dir": str(write_npy_dir(tmp_path / "data", parts)),
    }
    said = run({**config, "output-dir": str(tmp_path / "auto")}, num_nodes=DEVICES)["warnings"]
    assert any("clip-center" in text and "clip-norm" in text for text in said), said
    placed = run({**config, "output-dir": str(tmp_path / "point"), "clip-center": "1e9,1e9,1e9"}, num_nodes=DEVICES)
    assert not any("clip-center" in text for text in placed["warnings"]), placed["warnings"]
