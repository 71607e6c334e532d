"""FedKMeans' start as a device computes it: the local summary
(fedcluster.algorithms.fedkmeans.device) and the candidates' scores
(fedcluster.shared_kernels.score_candidates)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.device import kernels
from fedcluster.kernel import DeviceData
from fedcluster.lloyd import SEPARATION_MAX_FLOATS, kmeans


def summary(points: np.ndarray, k: int, min_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    arrays, metrics = kernels()["local_summary"](
        DeviceData(points=points), {}, {"k": k, "min-count": min_count, "seed": 3}
    )
    assert metrics["num-examples"] == points.shape[0]
    return arrays["centers"], arrays["counts"]


def as_rows(centers: np.ndarray, counts: np.ndarray) -> list[tuple]:
    """The summary as a sorted list of (point, count): its order carries nothing."""
    return sorted((tuple(c), float(n)) for c, n in zip(centers, counts))


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_a_device_asked_for_as_many_clusters_as_points_sends_its_distinct_points(offset):
    """k at or above the device's point count: each distinct point is a center, counted as
    often as it occurs, exactly (not a mean that rounds), and clusters under min-count are
    still suppressed."""
    points = offset + np.array([[0.5, 1.0], [2.0, -1.0], [0.5, 1.0], [7.0, 3.0], [2.0, -1.0], [0.5, 1.0]])
    for k in (6, 9):
        centers, counts = summary(points, k)
        assert as_rows(centers, counts) == [
            ((offset + 0.5, offset + 1.0), 3.0),
            ((offset + 2.0, offset - 1.0), 2.0),
            ((offset + 7.0, offset + 3.0), 1.0),
        ]
    centers, counts = summary(points, 6, min_count=2)
    assert as_rows(centers, counts) == [((offset + 0.5, offset + 1.0), 3.0), ((offset + 2.0, offset - 1.0), 2.0)]
    centers, counts = summary(points, 6, min_count=4)
    assert centers.shape == (0, 2) and counts.shape == (0,)


def test_the_distinct_points_are_the_local_kmeans_with_as_many_clusters():
    """The summary at k = n is what k-means with n clusters reaches on distinct points (each
    point its own cluster, cost 0), and below n points the device still runs k-means."""
    rng = np.random.default_rng(0)
    points = rng.normal(size=(40, 3))
    centers, counts = summary(points, 40)
    reached, cost = kmeans(points, 40, np.random.default_rng(1), n_init=1, max_iter=100)
    assert cost == 0.0
    np.testing.assert_allclose(sorted(map(tuple, centers)), sorted(map(tuple, reached)), rtol=0, atol=1e-15)
    assert np.array_equal(counts, np.ones(40))
    fewer, fewer_counts = summary(points, 39)
    assert fewer.shape[0] <= 39 and fewer_counts.sum() == 40 and fewer_counts.max() >= 2


def scores(points: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    arrays, _ = kernels()["score_candidates"](DeviceData(points=points), {"candidates": candidates}, {})
    return arrays["costs"]


def brute_costs(points: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Each candidate's cost by every point's own differences from every center."""
    return np.array([sum(min(float(np.sum((x - c) ** 2)) for c in centers) for x in points) for centers in candidates])


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_stacked_candidates_too_many_to_separate_are_each_scored_within_itself(offset):
    """More stacked candidate centers than the separation is computed for (so the stacked
    array's separation says nothing), sets sharing centers, and one set with two centers
    1e-5 apart 1e4 from the centers' middle, points on one of them, where the BLAS form
    cannot tell the two apart: every cost is the one by each point's own differences."""
    rng = np.random.default_rng(5)
    k, d = 100, 2
    m = int(np.sqrt(SEPARATION_MAX_FLOATS / d) / k) + 2  # m·k stacked centers are past the limit
    points = offset + rng.normal(size=(60, d))
    candidates = offset + rng.normal(size=(m, k, d))
    candidates[1, :50] = candidates[0, :50]  # shared centers: the stacked array has exact duplicates
    points[:5] = offset + 1e4  # five points on a center far from the others' middle ...
    candidates[2, 0] = points[0] + np.array([1e-5, 0.0])  # ... whose neighbour, first among ties, ...
    candidates[2, 1] = points[0]  # ... is 1e-10 away (squared)
    candidates[2, 2] = offset - 1e4
    expected = brute_costs(points, candidates)
    np.testing.assert_allclose(scores(points, candidates), expected, rtol=1e-13, atol=0)
