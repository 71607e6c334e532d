"""Unit tests of the spectral math: fedcluster.algorithms.fedspectral.model's server helpers (principal
angles, aggregation, co-association), the central references (fedcluster.central),
the FedSpectral+ "exact" protocol driven through the device kernels against central subspace
iteration (the oracle), and the FedSpectral co-association server."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.algorithms.fedspectral.device import power_step
from fedcluster.algorithms.fedspectral.model import (
    affinity_embedding,
    affinity_spectral_labels,
    coassociation_matrix,
    coassociation_spectral,
    embedding_labels,
    local_degrees,
    initial_block,
    label_problem,
    local_cluster_counts,
    nodes_held,
    paper_aggregate,
    principal_angle_sines,
    row_normalize,
    shifted_global_product,
    subspace_distance,
    top_eigenpairs_by_component,
)
from fedcluster.graph import canonical_edges, load_edge_list, split_edges
from fedcluster.linalg import orthonormalize, rayleigh_ritz
from fedcluster.kernel import DeviceData
from fedcluster.central import (
    central_eigenpairs,
    central_spectral,
    central_subspace_iteration,
    normalized_adjacency,
)


from conftest import graphs_dir as graph_dir  # noqa: E402  (one place finds the SNAP graphs)


def random_graph(n: int, m: int, seed: int) -> np.ndarray:
    return canonical_edges(np.random.default_rng(seed).integers(0, n, size=(m, 2)))


def planted_partition(sizes, p_in, bridges, seed):
    rng = np.random.default_rng(seed)
    offsets = np.cumsum([0] + list(sizes))
    truth = np.repeat(np.arange(len(sizes)), sizes)
    edges = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        iu = np.triu_indices(b - a, 1)
        keep = rng.random(iu[0].size) < p_in
        edges.append(np.stack([iu[0][keep] + a, iu[1][keep] + a], axis=1))
    cross = rng.integers(0, offsets[-1], size=(bridges * 4, 2))
    edges.append(cross[truth[cross[:, 0]] != truth[cross[:, 1]]][:bridges])
    return canonical_edges(np.concatenate(edges)), truth


def same_partition(a, b) -> bool:
    pairs = set(zip(np.asarray(a).tolist(), np.asarray(b).tolist()))
    return len(pairs) == len(set(np.asarray(a).tolist())) == len(set(np.asarray(b).tolist()))


def dense_normalized(edges, n):
    A = np.zeros((n, n))
    for u, v in canonical_edges(edges):
        A[u, v] = A[v, u] = 1.0
    d = A.sum(axis=1)
    s = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)
    return s[:, None] * A * s[None, :]


# ---------------------------------------------------------------------------- linear algebra


def test_normalized_adjacency_matches_dense():
    n = 25
    edges = random_graph(n - 2, 60, seed=0)
    N = normalized_adjacency(np.concatenate([edges, edges[:, ::-1]]), n)
    np.testing.assert_allclose(N.toarray(), dense_normalized(edges, n), atol=1e-15)


def test_orthonormalize_is_orthonormal_unique_and_spans_the_same_space():
    X = np.random.default_rng(1).standard_normal((30, 5))
    Q = orthonormalize(X)
    np.testing.assert_allclose(Q.T @ Q, np.eye(5), atol=1e-13)
    assert principal_angle_sines(Q, X)[0] < 1e-12
    np.testing.assert_allclose(orthonormalize(Q), Q, atol=1e-13)  # sign-fixed: idempotent
    np.testing.assert_allclose(orthonormalize(-X), -Q, atol=1e-13)  # continuous in X, no flips
    R = Q.T @ X
    assert np.all(np.diag(R) > 0)


def test_principal_angles_self_orthogonal_and_known_angle():
    rng = np.random.default_rng(2)
    U = orthonormalize(rng.standard_normal((20, 4)))
    assert np.max(principal_angle_sines(U, U @ rng.standard_normal((4, 4)))) < 1e-12
    E = np.eye(10)
    sines = principal_angle_sines(E[:, :3], E[:, 3:6])
    np.testing.assert_allclose(sines, np.ones(3), atol=1e-15)
    assert subspace_distance(E[:, :3], E[:, 3:6]) == pytest.approx(1.0)
    theta = 0.3
    a = E[:, [0]]
    b = np.cos(theta) * E[:, [0]] + np.sin(theta) * E[:, [1]]
    assert principal_angle_sines(a, b)[0] == pytest.approx(np.sin(theta), abs=1e-14)
    # tiny angle stays accurate (no sqrt(1 - cos^2) cancellation)
    tiny = 1e-9
    c = np.cos(tiny) * E[:, [0]] + np.sin(tiny) * E[:, [1]]
    assert principal_angle_sines(a, c)[0] == pytest.approx(np.sin(tiny), rel=1e-6)
    # different dimensions: the smaller space inside the larger one
    assert principal_angle_sines(E[:, :5], E[:, 1:3]).shape == (2,)
    assert principal_angle_sines(E[:, :5], E[:, 1:3]).max() < 1e-15


def test_rayleigh_ritz_recovers_exact_eigenpairs():
    rng = np.random.default_rng(3)
    V = orthonormalize(rng.standard_normal((15, 15)))
    values = np.linspace(1.0, 0.1, 15)
    M = (V * values) @ V.T
    Q = orthonormalize(V[:, :6] @ rng.standard_normal((6, 6)))  # exact invariant subspace
    ritz_values, vectors = rayleigh_ritz(Q, M @ Q, 3)
    np.testing.assert_allclose(ritz_values, values[:3], atol=1e-13)
    assert principal_angle_sines(vectors, V[:, :3])[0] < 1e-12
    assert vectors.shape == (15, 3)
    with pytest.raises(ValueError):
        rayleigh_ritz(Q, M @ Q, 7)


def test_row_normalize_keeps_zero_rows():
    X = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(row_normalize(X), [[0.6, 0.8], [0.0, 0.0]])


def test_server_helpers():
    Q = np.ones((4, 2))
    np.testing.assert_allclose(shifted_global_product(Q, [np.ones((4, 2)), 2 * np.ones((4, 2))]), 2 * Q)
    np.testing.assert_allclose(shifted_global_product(Q, []), 0.5 * Q)
    with pytest.raises(ValueError):
        shifted_global_product(Q, [np.ones((3, 2))])
    blocks = [np.random.default_rng(s).standard_normal((6, 2)) for s in range(3)]
    np.testing.assert_allclose(paper_aggregate(blocks), orthonormalize(np.mean(blocks, axis=0)))
    with pytest.raises(ValueError):
        initial_block(3, 4, 0)


# ---------------------------------------------------------------------------- central references


def test_central_eigenpairs_match_dense():
    n = 50
    edges = random_graph(n, 200, seed=4)
    values, vectors = central_eigenpairs(edges, n, 5)
    w, V = np.linalg.eigh(dense_normalized(edges, n))
    np.testing.assert_allclose(values, 0.5 * (1 + w[::-1][:5]), atol=1e-12)
    assert principal_angle_sines(vectors[:, :4], V[:, ::-1][:, :4])[0] < 1e-8


def clique_chain(sizes, offset):
    """Cliques of the given sizes joined in a chain by single edges, ids from ``offset``."""
    edges, start, previous = [], offset, None
    for size in sizes:
        iu = np.triu_indices(size, 1)
        edges.append(np.stack([iu[0] + start, iu[1] + start], axis=1))
        if previous is not None:
            edges.append(np.array([[previous, start]]))
        previous, start = start + size - 1, start + size
    return np.concatenate(edges), start


def test_central_eigenpairs_disconnected_large_graph_finds_every_component():
    # 7 components, more nodes than the dense limit (so ARPACK runs), and a cluster of
    # eigenvalues just below 1 (cliques joined by single edges): a single Krylov sequence on
    # the whole matrix returns only 4-6 of the 7 eigenvalue-1 eigenvectors here.
    parts, start, blocks = [], 0, []
    for c in range(6):
        edges_c, end = clique_chain([60] * 6 if c == 0 else [30] * 3, start)
        parts.append(edges_c)
        blocks.append((start, end))
        start = end
    filler = random_graph(1800, 6 * 1800, seed=0) + start
    parts.append(filler)
    blocks.append((start, start + 1800))
    n = start + 1800
    edges = np.concatenate(parts)
    values, vectors = central_eigenpairs(edges, n, 10, seed=0)
    np.testing.assert_allclose(values[:7], 1.0, atol=1e-10)
    assert values[7] < 1.0 - 1e-6
    indicators = np.zeros((n, 7))
    for i, (a, b) in enumerate(blocks):
        indicators[a:b, i] = 1.0
    degrees = np.bincount(canonical_edges(edges).ravel(), minlength=n)
    assert principal_angle_sines(vectors[:, :7], np.sqrt(degrees)[:, None] * indicators)[0] < 1e-8


def test_central_spectral_recovers_planted_partition():
    edges, truth = planted_partition([40, 30, 50, 35], 0.4, 10, seed=5)
    embedding, labels = central_spectral(edges, truth.size, 4, seed=0)
    assert embedding.shape == (truth.size, 4)
    np.testing.assert_allclose(embedding.T @ embedding, np.eye(4), atol=1e-10)
    assert same_partition(labels, truth)
    _, labels_si = central_spectral(edges, truth.size, 4, seed=0, block=8, iters=200)
    assert same_partition(labels_si, truth)
    assert same_partition(embedding_labels(embedding, 4, 1), truth)


def test_central_subspace_iteration_converges_to_eigenspace():
    edges, truth = planted_partition([30, 30, 30], 0.5, 5, seed=6)
    n = truth.size
    Q, MQ = central_subspace_iteration(edges, n, 6, 150, seed=1)
    np.testing.assert_allclose(Q.T @ Q, np.eye(6), atol=1e-12)
    _, vectors = central_eigenpairs(edges, n, 3)
    assert principal_angle_sines(rayleigh_ritz(Q, MQ, 3)[1], vectors)[0] < 1e-8


# ---------------------------------------------------------------------------- exact protocol


def federated_exact(edges, n, clients, overlap, block, rounds, seed, split_seed=0):
    """The FedSpectral+ exact protocol, driven through the device kernels."""
    parts = split_edges(edges, clients, overlap, split_seed)
    devices = [DeviceData(edges=p, source=f"client {j}") for j, p in enumerate(parts)]
    weight = 1.0 / overlap
    degrees = sum(local_degrees(d, n, weight) for d in devices)
    config = {"num-nodes": n, "iters": 1, "normalization": "global", "edge-weight": weight}
    Q = initial_block(n, block, seed)
    MQ = None
    for round_index in range(rounds):
        if MQ is not None:
            Q = orthonormalize(MQ)
        replies = [power_step(d, {"Q": Q, "degrees": degrees}, config)[0]["Q"] for d in devices]
        MQ = shifted_global_product(Q, replies)
    return Q, MQ


def test_exact_mode_equals_central_subspace_iteration_random_graph():
    n = 120
    edges = random_graph(n - 4, 500, seed=7)  # with isolated nodes
    Qf, MQf = federated_exact(edges, n, clients=5, overlap=2, block=8, rounds=25, seed=3)
    Qc, MQc = central_subspace_iteration(edges, n, 8, 25, seed=3)
    np.testing.assert_allclose(Qf, Qc, rtol=0, atol=1e-8)
    np.testing.assert_allclose(MQf, MQc, rtol=0, atol=1e-8)


def test_exact_mode_equals_central_on_email_eu_core():
    directory = graph_dir()
    if directory is None:
        pytest.skip("SNAP graphs not found: run fedcluster-fetch-graphs --out graphs, or set FEDCLUSTER_GRAPHS")
    n = 1005
    edges = load_edge_list(directory / "email-Eu-core.txt", num_nodes=n)
    Qf, MQf = federated_exact(edges, n, clients=5, overlap=2, block=20, rounds=40, seed=0)
    Qc, MQc = central_subspace_iteration(edges, n, 20, 40, seed=0)
    np.testing.assert_allclose(Qf, Qc, rtol=0, atol=1e-8)
    assert principal_angle_sines(rayleigh_ritz(Qf, MQf, 10)[1], rayleigh_ritz(Qc, MQc, 10)[1])[0] < 1e-8
    # docs/ALGORITHMS.md: the 10th and 11th eigenvalues of (I + N)/2 are 0.7757 and 0.7692
    values, _ = central_eigenpairs(edges, n, 11)
    assert values[9] == pytest.approx(0.7757, abs=5e-5)
    assert values[10] == pytest.approx(0.7692, abs=5e-5)


# ---------------------------------------------------------------------------- FedSpectral server


def naive_coassociation(label_lists, n, denominator):
    S = np.zeros((n, n))
    for u in range(n):
        for v in range(n):
            both = [lab for lab in label_lists if lab[u] >= 0 and lab[v] >= 0]
            together = sum(1 for lab in both if lab[u] == lab[v])
            if denominator == "all-clients":
                S[u, v] = together / len(label_lists)
            else:
                S[u, v] = together / len(both) if both else 0.0
    return S


@pytest.mark.parametrize("denominator", ["both-present", "all-clients"])
def test_coassociation_matches_naive(denominator):
    rng = np.random.default_rng(8)
    n = 12
    label_lists = []
    for j in range(4):
        labels = rng.integers(0, 3 + j, size=n)
        labels[rng.random(n) < 0.3] = -1
        label_lists.append(labels)
    label_lists.append(np.full(n, -1))  # a client that holds nothing
    label_lists[0][5] = 7  # non-contiguous label ids are fine
    label_lists = [np.asarray(labels) for labels in label_lists]
    for lab in label_lists:
        lab[11] = -1  # node 11 absent everywhere
    S = coassociation_matrix(label_lists, n, denominator=denominator)
    np.testing.assert_allclose(S, naive_coassociation(label_lists, n, denominator), atol=1e-15)
    np.testing.assert_allclose(S, S.T)
    assert S[11, 11] == 0.0


def test_coassociation_input_errors():
    with pytest.raises(ValueError):
        coassociation_matrix([np.zeros(3)], 4)
    with pytest.raises(ValueError):
        coassociation_matrix([np.zeros(4)], 4, denominator="half")
    with pytest.raises(ValueError):
        coassociation_matrix([], 4)


def test_coassociation_spectral_recovers_consensus():
    rng = np.random.default_rng(9)
    truth = np.repeat(np.arange(4), [20, 15, 25, 10])
    n = truth.size
    label_lists = []
    for j in range(5):
        perm = rng.permutation(4)
        labels = perm[truth].copy()
        flip = rng.random(n) < 0.05
        labels[flip] = rng.integers(0, 4, size=flip.sum())
        labels[rng.random(n) < 0.2] = -1
        label_lists.append(labels)
    embedding, labels = coassociation_spectral(label_lists, n, 4, seed=0)
    assert labels.shape == (n,) and embedding.shape == (n, 4)
    assert same_partition(labels, truth)
    S = coassociation_matrix(label_lists, n)
    np.testing.assert_array_equal(labels, affinity_spectral_labels(S, 4, seed=0))
    np.testing.assert_array_equal(embedding, affinity_embedding(S, 4, seed=0))


def test_label_problem_and_baseline_summaries():
    assert label_problem(np.array([-1, 0, 3]), 4) is None
    assert label_problem(np.array([0.0, 1.0]), 4) is None  # integral floats are fine
    assert label_problem(np.array([0.5, 1.0]), 4) == "labels must be integers"
    assert label_problem(np.array([-2, 0]), 4) == "labels must be in -1 .. 3"
    assert label_problem(np.array([0, 4]), 4) == "labels must be in -1 .. 3"
    lists = [np.array([0, 0, -1, 5, -1]), np.array([-1, 1, 1, -1, -1])]
    assert nodes_held(lists) == 4
    assert local_cluster_counts(lists) == [2, 1]


def test_component_eigensolver_matches_dense_on_a_disconnected_affinity():
    # two cliques and an isolated node: eigenvalue 1 twice, one eigenvector per component
    S = np.zeros((9, 9))
    S[:4, :4] = 1.0
    S[4:8, 4:8] = 1.0
    np.fill_diagonal(S, 0.0)
    d = S.sum(axis=1)
    s = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)
    N = s[:, None] * S * s[None, :]
    values, vectors = top_eigenpairs_by_component(N, 3, seed=0)
    np.testing.assert_allclose(values[:2], 1.0, atol=1e-12)
    assert values[2] == pytest.approx(0.0, abs=1e-12)  # the isolated node (the cliques' next is -1/3)
    indicators = np.zeros((9, 2))
    indicators[:4, 0] = indicators[4:8, 1] = 1.0
    assert principal_angle_sines(vectors[:, :2], indicators)[0] < 1e-12
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(3), atol=1e-12)
    # the embedding of the affinity is the same top-2 space, zero on the isolated node
    embedding = affinity_embedding(S, 2, seed=0)
    assert principal_angle_sines(embedding, indicators)[0] < 1e-12
    np.testing.assert_array_equal(embedding[8], 0.0)
