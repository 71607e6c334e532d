"""Clustering quality metrics and the pooled central reference (server side).

Two families:

* **Internal metrics** judge centers or a labelling against the data alone:
  :func:`cost_per_point`, :func:`intra_cluster_distance`, :func:`davies_bouldin`.
* **External metrics** compare two labellings ``labels_a, labels_b`` (array-like of shape
  ``(n,)``) of the same points (typically the true mixture components against the clusters
  found): :func:`rand_index`,
  :func:`adjusted_rand`, :func:`nmi`, :func:`variation_of_information`,
  :func:`hungarian_accuracy`. All of them are computed from the contingency table of the
  two labellings, never from the ``n^2`` pairs of points: encoding the labels costs
  ``O(n)`` for small non-negative integer labels (``O(n log n)`` otherwise), and the rest
  costs ``O(number of non-empty cells)``, at most ``O(k_a * k_b)``.

:func:`central_kmeans` is the pooled reference every federated algorithm is compared with
(scikit-learn ``KMeans``, k-means++, several starts).

The module itself needs only NumPy; SciPy and scikit-learn are imported inside the
functions that use them (:func:`hungarian_accuracy`, :func:`central_kmeans`), so that a
device importing ``fedcluster`` does not need them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster.lloyd import kmeans_cost, label_sums

__all__ = [
    "cost_per_point",
    "intra_cluster_distance",
    "davies_bouldin",
    "contingency_matrix",
    "rand_index",
    "adjusted_rand",
    "nmi",
    "variation_of_information",
    "hungarian_accuracy",
    "central_kmeans",
]


# ---------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------


def check_points(X: np.ndarray, name: str = "X") -> np.ndarray:
    """Return ``X`` as a finite float64 (n, d) array with n >= 1, or raise ``ValueError``
    naming ``name``."""
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not numeric: {exc}") from None
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n points x d dimensions), got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError(f"{name} has no points (shape {X.shape})")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return X


def _check_labels(labels: np.ndarray, name: str) -> np.ndarray:
    """Return ``labels`` as a non-empty 1-D array, or raise ``ValueError``."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of labels, got shape {labels.shape}")
    if labels.size == 0:
        raise ValueError(f"{name} is empty: a labelling needs at least one point")
    return labels


def _check_labellings(
    labels_a: np.ndarray, labels_b: np.ndarray, name_a: str = "labels_a", name_b: str = "labels_b"
) -> tuple[np.ndarray, np.ndarray]:
    labels_a = _check_labels(labels_a, name_a)
    labels_b = _check_labels(labels_b, name_b)
    if labels_a.shape[0] != labels_b.shape[0]:
        raise ValueError(
            f"length mismatch: {name_a} has {labels_a.shape[0]} labels but {name_b} has {labels_b.shape[0]}"
        )
    return labels_a, labels_b


def _check_points_and_labels(X: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    X = check_points(X)
    labels = _check_labels(labels, "labels")
    if labels.shape[0] != X.shape[0]:
        raise ValueError(f"length mismatch: X has {X.shape[0]} points but labels has {labels.shape[0]} entries")
    return X, labels


# ---------------------------------------------------------------------------------------
# Label encoding and the contingency table
# ---------------------------------------------------------------------------------------


def _encode(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Map arbitrary labels to codes ``0 .. number_of_labels - 1`` (in sorted label order).

    Small non-negative integer labels (the usual case) are encoded in ``O(n)`` with
    ``bincount``; anything else (strings, negative or huge integers, floats) by sorting.
    """
    if labels.dtype.kind in "iub" and labels.size:
        smallest = int(labels.min())
        largest = int(labels.max())
        if smallest >= 0 and largest <= 4 * labels.size + 1024:
            values = labels.astype(np.int64)
            present = np.bincount(values, minlength=largest + 1) > 0
            code_of_value = np.cumsum(present) - 1
            return code_of_value[values], int(present.sum())
    _, codes = np.unique(labels, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    return codes, int(codes.max()) + 1


@dataclass
class _Contingency:
    """Sparse contingency table of two labellings of the same n points.

    ``rows[c]``, ``columns[c]``, ``cells[c]``: label code in the first labelling, in the
    second, and the number of points in that cell, for every non-empty cell ``c``.
    ``row_totals`` (k_a,) and ``column_totals`` (k_b,) are the cluster sizes.
    """

    rows: np.ndarray
    columns: np.ndarray
    cells: np.ndarray
    row_totals: np.ndarray
    column_totals: np.ndarray
    n: int


def _contingency(labels_a: np.ndarray, labels_b: np.ndarray) -> _Contingency:
    codes_a, k_a = _encode(labels_a)
    codes_b, k_b = _encode(labels_b)
    n = codes_a.shape[0]
    joint = codes_a * k_b + codes_b
    if k_a * k_b <= max(4 * n, 1 << 20):
        dense = np.bincount(joint, minlength=k_a * k_b)
        nonzero = np.flatnonzero(dense)
        cells = dense[nonzero]
    else:  # many labels on both sides (e.g. singletons): never build the k_a x k_b table
        nonzero, cells = np.unique(joint, return_counts=True)
    return _Contingency(
        rows=nonzero // k_b,
        columns=nonzero % k_b,
        cells=cells.astype(np.int64),
        row_totals=np.bincount(codes_a, minlength=k_a).astype(np.int64),
        column_totals=np.bincount(codes_b, minlength=k_b).astype(np.int64),
        n=n,
    )


def contingency_matrix(labels_a: np.ndarray, labels_b: np.ndarray) -> np.ndarray:
    """Dense contingency table of two labellings.

    Parameters
    ----------
    labels_a, labels_b : array-like of shape (n,)
        Two labellings of the same n points (any hashable, sortable label values).

    Returns
    -------
    table : ndarray of shape (k_a, k_b), int64
        ``table[i, j]`` is the number of points with the i-th smallest label of
        ``labels_a`` and the j-th smallest label of ``labels_b``.
    """
    labels_a, labels_b = _check_labellings(labels_a, labels_b)
    table = _contingency(labels_a, labels_b)
    dense = np.zeros((table.row_totals.size, table.column_totals.size), dtype=np.int64)
    dense[table.rows, table.columns] = table.cells
    return dense


def _pairs(counts: np.ndarray) -> np.ndarray:
    """Number of unordered pairs, ``c * (c - 1) / 2``, elementwise, as float64."""
    counts = counts.astype(np.float64)
    return counts * (counts - 1.0) / 2.0


def _pair_counts(table: _Contingency) -> tuple[float, float, float, float]:
    """Pairs of points by agreement: (same in both, same in a only, same in b only, total).

    "Same" means "in the same cluster". Computed from cluster and cell sizes only.
    """
    together_in_both = float(_pairs(table.cells).sum())
    together_in_a = float(_pairs(table.row_totals).sum())
    together_in_b = float(_pairs(table.column_totals).sum())
    total = table.n * (table.n - 1) / 2.0
    return together_in_both, together_in_a - together_in_both, together_in_b - together_in_both, total


def _entropy(counts: np.ndarray, n: int) -> float:
    """Shannon entropy (nats) of the distribution ``counts / n``."""
    p = counts[counts > 0].astype(np.float64) / n
    return float(-(p * np.log(p)).sum())


def _mutual_information(table: _Contingency) -> float:
    """Mutual information (nats) between the two labellings of ``table``."""
    n = float(table.n)
    cells = table.cells.astype(np.float64)
    expected = table.row_totals[table.rows].astype(np.float64) * table.column_totals[table.columns]
    value = float(np.sum(cells / n * (np.log(cells * n) - np.log(expected))))
    return max(value, 0.0)  # rounding can make an exact 0 slightly negative


# ---------------------------------------------------------------------------------------
# External metrics: compare two labellings
# ---------------------------------------------------------------------------------------


def rand_index(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Rand index: fraction of pairs of points on which two labellings agree.

    A pair agrees when both labellings put its two points in the same cluster, or both
    put them in different clusters. Computed from the contingency table (no pair loop).
    With a single point there are no pairs and the index is 1. Returns a float in [0, 1].
    """
    labels_a, labels_b = _check_labellings(labels_a, labels_b)
    _, only_a, only_b, total = _pair_counts(_contingency(labels_a, labels_b))
    if total == 0:
        return 1.0
    return float((total - only_a - only_b) / total)


def adjusted_rand(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985): Rand index corrected for chance.

    ``ARI = (RI - E[RI]) / (max RI - E[RI])`` under the permutation model, written with
    the pair counts: ``2 (tp tn - fn fp) / ((tp + fn)(fn + tn) + (tp + fp)(fp + tn))``.
    It is 1 for identical partitions (up to renaming), about 0 for independent ones, and
    can be negative. When neither labelling puts any two points in different clusters
    from the other (``fp = fn = 0``) it is 1. Returns a float in [-1, 1].
    """
    labels_a, labels_b = _check_labellings(labels_a, labels_b)
    both, only_a, only_b, total = _pair_counts(_contingency(labels_a, labels_b))
    apart_in_both = total - both - only_a - only_b
    if only_a == 0 and only_b == 0:
        return 1.0
    numerator = 2.0 * (both * apart_in_both - only_a * only_b)
    denominator = (both + only_a) * (only_a + apart_in_both) + (both + only_b) * (only_b + apart_in_both)
    return float(numerator / denominator)


def nmi(labels_a: np.ndarray, labels_b: np.ndarray, average: str = "arithmetic") -> float:
    """Normalized mutual information ``I(a; b) / mean(H(a), H(b))``.

    Parameters
    ----------
    labels_a, labels_b : array-like of shape (n,)
        Two labellings of the same points.
    average : {"arithmetic", "geometric", "min", "max"}
        How the two entropies are combined into the normalizer (scikit-learn's default
        is "arithmetic").

    Returns
    -------
    float in [0, 1]
        1 when both labellings are a single cluster (nothing to disagree on), 0 when the
        mutual information is 0.
    """
    means = {
        "arithmetic": lambda h_a, h_b: (h_a + h_b) / 2.0,
        "geometric": lambda h_a, h_b: float(np.sqrt(h_a * h_b)),
        "min": min,
        "max": max,
    }
    if average not in means:
        raise ValueError(f"average must be one of {sorted(means)}, got {average!r}")
    labels_a, labels_b = _check_labellings(labels_a, labels_b)
    table = _contingency(labels_a, labels_b)
    if table.row_totals.size == 1 and table.column_totals.size == 1:
        return 1.0
    information = _mutual_information(table)
    if information == 0.0:
        return 0.0
    normalizer = means[average](_entropy(table.row_totals, table.n), _entropy(table.column_totals, table.n))
    return float(min(information / max(normalizer, np.finfo(np.float64).eps), 1.0))


def variation_of_information(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Variation of information (Meila 2007): ``H(a) + H(b) - 2 I(a; b)``, in nats.

    Equivalently ``H(a | b) + H(b | a)``. A metric on partitions: 0 for identical
    partitions (up to renaming), at most ``log(n)``.
    """
    labels_a, labels_b = _check_labellings(labels_a, labels_b)
    table = _contingency(labels_a, labels_b)
    value = (
        _entropy(table.row_totals, table.n) + _entropy(table.column_totals, table.n) - 2.0 * _mutual_information(table)
    )
    return float(max(value, 0.0))


def hungarian_accuracy(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """Accuracy after the best one-to-one matching of predicted to true labels.

    The matching maximizes the number of points whose predicted cluster is matched to
    their true label (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``, on
    the contingency table). The two sides may have different numbers of labels: only
    ``min(k_true, k_pred)`` pairs can be matched, and every point of an unmatched label
    counts as wrong.

    Parameters
    ----------
    labels_true : array-like of shape (n,)
        Ground-truth labels.
    labels_pred : array-like of shape (n,)
        Cluster labels to evaluate.

    Returns
    -------
    float in [0, 1]
    """
    from scipy.optimize import linear_sum_assignment

    table = contingency_matrix(labels_true, labels_pred)
    rows, columns = linear_sum_assignment(table, maximize=True)
    return float(table[rows, columns].sum() / table.sum())


# ---------------------------------------------------------------------------------------
# Internal metrics: judge a clustering against the data
# ---------------------------------------------------------------------------------------


def cost_per_point(X: np.ndarray, centers: np.ndarray) -> float:
    """k-means cost of ``centers`` on ``X`` divided by the number of points.

    ``(1 / n) * sum_i min_j ||x_i - c_j||^2``, the "cost" every algorithm reports.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Data points (n >= 1).
    centers : array-like of shape (k, d)
        Cluster centers.

    Returns
    -------
    float
    """
    X = check_points(X)
    centers = check_points(centers, "centers")
    if centers.shape[1] != X.shape[1]:
        raise ValueError(f"dimension mismatch: X has {X.shape[1]} columns but centers have {centers.shape[1]}")
    return kmeans_cost(X, centers) / X.shape[0]


def _cluster_means(X: np.ndarray, codes: np.ndarray, number_of_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster means (k, d) and sizes (k,) of the points of ``X`` by label code (every
    code in use)."""
    sums, sizes = label_sums(X, codes, number_of_clusters)
    return sums / sizes[:, None], sizes


def intra_cluster_distance(X: np.ndarray, labels: np.ndarray) -> float:
    """Mean Euclidean distance of the points to the mean of their own cluster.

    Definition (the "mean Euclidean intra-cluster distance" of Triebe & Rajagopal 2019):

        (1 / n) * sum_i || x_i - m_{labels_i} ||,   m_j = mean of the points labelled j,

    an average over POINTS (so large clusters weigh more), of plain, not squared,
    distances. The cluster means are recomputed from ``labels``; centers the labels came
    from are not used, so the value judges the partition itself.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Data points.
    labels : array-like of shape (n,)
        Cluster of every point.

    Returns
    -------
    float >= 0
    """
    X, labels = _check_points_and_labels(X, labels)
    codes, number_of_clusters = _encode(labels)
    means, _ = _cluster_means(X, codes, number_of_clusters)
    return float(np.linalg.norm(X - means[codes], axis=1).mean())


def davies_bouldin(X: np.ndarray, labels: np.ndarray) -> float:
    """Davies–Bouldin index (Davies & Bouldin 1979); lower is better.

    With ``m_j`` the mean of cluster j and ``s_j`` the mean Euclidean distance of its
    points to ``m_j``:

        DB = (1 / k) * sum_j max_{l != j} (s_j + s_l) / ||m_j - m_l||.

    Two clusters with the same mean contribute nothing (their distance is taken as
    infinite), as in scikit-learn's ``davies_bouldin_score``.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Data points.
    labels : array-like of shape (n,)
        Cluster of every point; needs between 2 and n - 1 distinct labels.

    Returns
    -------
    float >= 0
    """
    X, labels = _check_points_and_labels(X, labels)
    codes, number_of_clusters = _encode(labels)
    if not 2 <= number_of_clusters <= X.shape[0] - 1:
        raise ValueError(
            f"the Davies-Bouldin index needs between 2 and n - 1 = {X.shape[0] - 1} clusters, got {number_of_clusters}"
        )
    means, sizes = _cluster_means(X, codes, number_of_clusters)
    spread = np.bincount(codes, weights=np.linalg.norm(X - means[codes], axis=1), minlength=number_of_clusters) / sizes
    # Direct differences (k x k x d, k is small): exact zeros for coinciding means, which
    # the BLAS form ||a||^2 - 2 a.b + ||b||^2 would turn into tiny positive distances.
    distances = np.linalg.norm(means[:, None, :] - means[None, :, :], axis=2)
    if np.allclose(spread, 0.0) and np.allclose(distances, 0.0):
        return 0.0
    np.fill_diagonal(distances, np.inf)  # a cluster is not compared with itself
    distances[distances == 0.0] = np.inf  # two clusters with the same mean: ignored
    ratios = (spread[:, None] + spread[None, :]) / distances
    return float(ratios.max(axis=1).mean())


# ---------------------------------------------------------------------------------------
# The pooled reference
# ---------------------------------------------------------------------------------------


def central_kmeans(X: np.ndarray, k: int, seed: int, n_init: int = 10) -> tuple[np.ndarray, float]:
    """Pooled central k-means: the reference point of every federated run.

    scikit-learn ``KMeans`` (k-means++ seeding, Lloyd, ``n_init`` starts, best kept) on
    all the data in one place.

    Parameters
    ----------
    X : array-like of shape (n, d)
        All points, pooled.
    k : int
        Number of clusters (1 <= k <= n).
    seed : int
        Random seed of scikit-learn's ``random_state``.
    n_init : int, default 10
        Number of k-means++ starts.

    Returns
    -------
    centers : ndarray of shape (k, d)
    cost : float
        TOTAL k-means cost of ``centers`` on ``X`` (sum of squared distances, recomputed
        with :func:`fedcluster.lloyd.kmeans_cost`), not divided by n; divide by
        ``len(X)`` or call :func:`cost_per_point` for the per-point cost.
    """
    from sklearn.cluster import KMeans

    X = check_points(X)
    if not 1 <= k <= X.shape[0]:
        raise ValueError(f"k must be between 1 and the number of points {X.shape[0]}, got {k}")
    if n_init < 1:
        raise ValueError(f"n_init must be >= 1, got {n_init}")
    model = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(X)
    centers = np.asarray(model.cluster_centers_, dtype=np.float64)
    return centers, kmeans_cost(X, centers)
