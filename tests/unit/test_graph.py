"""Unit tests of the graph data layer (fedcluster.graph: edge-list loading, canonicalisation,
splitting over clients, the adjacency operator) and of the NumPy device kernels of
FedSpectral / FedSpectral+ (fedcluster.algorithms.fedspectral.model; oracles: dense NumPy matrices)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedcluster.algorithms.fedspectral.device import local_spectral_labels, power_step
from fedcluster.algorithms.fedspectral.model import (
    local_degrees,
    inverse_sqrt_degrees,
    local_spectral_embedding,
    shifted_global_product,
)
from fedcluster.graph import (
    AdjacencyOperator,
    GraphError,
    canonical_edges,
    infer_num_nodes,
    load_edge_list,
    load_node_labels,
    local_graph,
    overlap_to_clients,
    split_edges,
    write_client_edge_files,
)
from fedcluster.kernel import DeviceData
from fedcluster.device import kernels

PROJECT = Path(__file__).resolve().parents[2]


from conftest import graphs_dir as graph_dir  # noqa: E402  (one place finds the SNAP graphs)


def random_graph(n: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return canonical_edges(rng.integers(0, n, size=(m, 2)))


def dense_adjacency(edges: np.ndarray, n: int) -> np.ndarray:
    A = np.zeros((n, n))
    for u, v in canonical_edges(edges):
        A[u, v] = A[v, u] = 1.0
    return A


def dense_shifted(A: np.ndarray) -> np.ndarray:
    """(I + D^{-1/2} A D^{-1/2}) / 2 with 0 for degree-0 nodes, the oracle."""
    d = A.sum(axis=1)
    s = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)
    return 0.5 * (np.eye(A.shape[0]) + s[:, None] * A * s[None, :])


# ---------------------------------------------------------------------------- loading


def test_load_edge_list_parses_and_skips_comments(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("# a comment\n\n0 1\n  # indented comment\n2\t3\n 4   0 \n\n")
    edges = load_edge_list(path)
    assert edges.dtype == np.int64
    np.testing.assert_array_equal(edges, [[0, 1], [2, 3], [4, 0]])


def test_load_edge_list_empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n")
    assert load_edge_list(path).shape == (0, 2)


def test_load_edge_list_missing_file_names_it(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(GraphError, match="nope.txt"):
        load_edge_list(path)


def test_load_edge_list_non_integer_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("0 1\n1 2\n2 x3\n")
    with pytest.raises(GraphError, match=r"bad\.txt.*line 3"):
        load_edge_list(path)


def test_load_edge_list_float_token_rejected(tmp_path):
    path = tmp_path / "float.txt"
    path.write_text("0 1.5\n")
    with pytest.raises(GraphError, match="line 1"):
        load_edge_list(path)


def test_load_edge_list_wrong_token_count(tmp_path):
    path = tmp_path / "three.txt"
    path.write_text("0 1\n1 2 3\n")
    with pytest.raises(GraphError, match=r"three\.txt.*line 2"):
        load_edge_list(path)


def test_load_edge_list_negative_id(tmp_path):
    path = tmp_path / "neg.txt"
    path.write_text("0 -1\n")
    with pytest.raises(GraphError, match=r"neg\.txt.*-1"):
        load_edge_list(path)


def test_load_edge_list_id_out_of_range_names_file_and_id(tmp_path):
    path = tmp_path / "range.txt"
    path.write_text("0 1\n1 7\n")
    assert load_edge_list(path, num_nodes=8).shape == (2, 2)
    with pytest.raises(GraphError) as info:
        load_edge_list(path, num_nodes=7)
    message = str(info.value)
    assert "range.txt" in message and "7" in message and "line 2" in message


def test_graph_error_is_value_error():
    assert issubclass(GraphError, ValueError)


def test_load_node_labels(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("0 3\n2 1\n")
    np.testing.assert_array_equal(load_node_labels(path, num_nodes=4), [3, -1, 1, -1])
    path.write_text("0 3\n0 1\n")
    with pytest.raises(GraphError, match="more than one label"):
        load_node_labels(path)


# ---------------------------------------------------------------------------- canonical form


def test_canonical_edges_undirected_simple_sorted():
    edges = np.array([[3, 1], [1, 3], [2, 2], [0, 4], [4, 0], [1, 3], [0, 1]])
    np.testing.assert_array_equal(canonical_edges(edges), [[0, 1], [0, 4], [1, 3]])
    assert canonical_edges(edges).dtype == np.int64


def test_canonical_edges_empty_and_only_loops():
    assert canonical_edges(np.zeros((0, 2), dtype=np.int64)).shape == (0, 2)
    assert canonical_edges(np.array([[1, 1], [2, 2]])).shape == (0, 2)


def test_canonical_edges_rejects_bad_input():
    with pytest.raises(GraphError):
        canonical_edges(np.array([[0, 1, 2]]))
    with pytest.raises(GraphError):
        canonical_edges(np.array([[0, -1]]))


def test_infer_num_nodes():
    assert infer_num_nodes(np.array([[0, 5], [2, 1]])) == 6
    assert infer_num_nodes(np.zeros((0, 2), dtype=np.int64)) == 0


# ---------------------------------------------------------------------------- splitting


@pytest.mark.parametrize("clients,overlap", [(5, 2), (5, 1), (3, 3), (7, 4)])
def test_split_covers_every_edge_exactly_r_times(clients, overlap):
    edges = random_graph(60, 400, seed=1)
    # feed it directed duplicates: the split must work on the undirected simple graph
    noisy = np.concatenate([edges, edges[:, ::-1], [[5, 5]]])
    parts = split_edges(noisy, clients, overlap, np.random.default_rng(0))
    assert len(parts) == clients
    keys = {tuple(e): 0 for e in edges.tolist()}
    for part in parts:
        assert len({tuple(e) for e in part.tolist()}) == part.shape[0]  # no edge twice on a client
        for e in part.tolist():
            keys[tuple(e)] += 1
    assert set(keys.values()) == {overlap}
    assert sum(p.shape[0] for p in parts) == overlap * edges.shape[0]


def test_split_is_reproducible_and_random():
    edges = random_graph(50, 300, seed=2)
    a = split_edges(edges, 5, 2, 7)
    b = split_edges(edges, 5, 2, np.random.default_rng(7))
    c = split_edges(edges, 5, 2, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_split_rejects_bad_overlap():
    edges = random_graph(10, 20, seed=0)
    with pytest.raises(ValueError):
        split_edges(edges, 5, 0, 0)
    with pytest.raises(ValueError):
        split_edges(edges, 5, 6, 0)


def test_overlap_to_clients_paper_setting():
    assert overlap_to_clients(0.4, 5) == 2
    assert overlap_to_clients(0.0, 5) == 1
    assert overlap_to_clients(1.0, 5) == 5


def test_client_files_round_trip(tmp_path):
    edges = random_graph(30, 80, seed=3)
    parts = split_edges(edges, 3, 2, 0) + [np.zeros((0, 2), dtype=np.int64)]
    paths = write_client_edge_files(parts, tmp_path / "clients")
    assert [p.name for p in paths] == ["client_000.txt", "client_001.txt", "client_002.txt", "client_003.txt"]
    for part, path in zip(parts, paths):
        np.testing.assert_array_equal(load_edge_list(path, num_nodes=30), part)


# ---------------------------------------------------------------------------- product kernel


@pytest.mark.parametrize("sparse", [None, False])
@pytest.mark.parametrize("b", [1, 2, 3, 10])
def test_adjacency_operator_matches_dense(b, sparse):
    n = 40
    edges = random_graph(n, 150, seed=4)
    A = dense_adjacency(edges, n)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, b))
    op = AdjacencyOperator(edges, n, sparse=sparse)
    assert op.sparse is (sparse is None)  # SciPy is installed here: the default uses it
    np.testing.assert_allclose(op.matmat(X), A @ X, rtol=0, atol=1e-12)
    left, right = rng.random(n), rng.random(n)
    np.testing.assert_allclose(op.matmat(X, left, right), left[:, None] * (A @ (right[:, None] * X)), atol=1e-12)
    np.testing.assert_allclose(op.matmat(X[:, 0]), A @ X[:, 0], atol=1e-12)
    np.testing.assert_array_equal(op.degrees, A.sum(axis=1))


@pytest.mark.parametrize("sparse", [None, False])
def test_adjacency_operator_empty_graph(sparse):
    op = AdjacencyOperator(np.zeros((0, 2), dtype=np.int64), 5, sparse=sparse)
    np.testing.assert_array_equal(op.matmat(np.ones((5, 3))), np.zeros((5, 3)))
    np.testing.assert_array_equal(op.matmat(np.ones((5, 3)), np.ones(5), np.ones(5)), np.zeros((5, 3)))


def test_adjacency_operator_scaling_kept_only_while_it_is_the_same():
    """The sparse path keeps the last diag(left) A diag(right): a new scaling, or the same
    array changed in place, must give the new product."""
    n = 30
    edges = random_graph(n, 100, seed=5)
    A = dense_adjacency(edges, n)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n, 4))
    op = AdjacencyOperator(edges, n)
    left, right = rng.random(n), rng.random(n)
    for _ in range(2):
        np.testing.assert_allclose(op.matmat(X, left, right), left[:, None] * (A @ (right[:, None] * X)), atol=1e-12)
        left[3] += 1.0  # in place: the kept scaling no longer applies
        right = rng.random(n)
    np.testing.assert_allclose(op.matmat(X, left), left[:, None] * (A @ X), atol=1e-12)
    np.testing.assert_allclose(op.matmat(X, None, right), A @ (right[:, None] * X), atol=1e-12)
    np.testing.assert_allclose(op.matmat(X), A @ X, atol=1e-12)


def test_local_graph_is_cached_and_rebuilt_when_edges_change():
    data = DeviceData(edges=np.array([[0, 1], [1, 2]]), source="t")
    first = local_graph(data, 4)
    assert local_graph(data, 4) is first
    data.edges = np.array([[0, 3]])
    second = local_graph(data, 4)
    assert second is not first and second.num_edges == 1


# ---------------------------------------------------------------------------- device kernels


def test_kernels_registered():
    for name in ("power_step", "local_spectral_labels"):
        assert name in kernels()


def test_degrees_weighted_sum_over_clients_equals_global():
    n, r = 50, 2
    edges = random_graph(n, 300, seed=5)
    parts = split_edges(edges, 5, r, 0)
    total = np.zeros(n)
    for j, part in enumerate(parts):
        total += local_degrees(DeviceData(edges=part, source=f"c{j}"), n, 1 / r)
    np.testing.assert_allclose(total, dense_adjacency(edges, n).sum(axis=1), atol=1e-12)


def test_degrees_count_each_local_undirected_edge_once_per_endpoint():
    data = DeviceData(edges=np.array([[0, 1], [1, 0], [1, 1], [1, 2], [1, 2]]), source="dup")
    np.testing.assert_array_equal(local_degrees(data, 4), [1, 2, 1, 0])
    assert local_graph(data, 4).num_edges == 2


def test_node_id_out_of_range_is_a_clear_error():
    data = DeviceData(edges=np.array([[0, 9]]), source="client_003.txt")
    with pytest.raises(ValueError, match=r"client_003\.txt.*9.*num-nodes"):
        local_degrees(data, 5)
    with pytest.raises(ValueError, match="num-nodes"):
        power_step(data, {"Q": np.ones((5, 2))}, {"num-nodes": 5})


def _federated_shifted_product(parts, n, r, Q):
    devices = [DeviceData(edges=p, source=f"c{j}") for j, p in enumerate(parts)]
    degrees = sum(local_degrees(d, n, 1 / r) for d in devices)
    config = {"num-nodes": n, "iters": 1, "normalization": "global", "edge-weight": 1 / r}
    replies = [power_step(d, {"Q": Q, "degrees": degrees}, config)[0]["Q"] for d in devices]
    return shifted_global_product(Q, replies)  # the server part: add Q, halve


def test_power_step_global_sum_equals_dense_shifted_product():
    n, r = 60, 2
    edges = random_graph(n - 3, 250, seed=6)  # nodes n-3 .. n-1 are isolated
    parts = split_edges(edges, 5, r, 1)
    Q = np.random.default_rng(2).standard_normal((n, 7))
    expected = dense_shifted(dense_adjacency(edges, n)) @ Q
    got = _federated_shifted_product(parts, n, r, Q)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_power_step_global_with_overlap_three_of_four():
    n, r = 40, 3
    edges = random_graph(n, 200, seed=7)
    parts = split_edges(edges, 4, r, 2)
    Q = np.random.default_rng(3).standard_normal((n, 4))
    expected = dense_shifted(dense_adjacency(edges, n)) @ Q
    np.testing.assert_allclose(_federated_shifted_product(parts, n, r, Q), expected, atol=1e-12)


def test_power_step_local_matches_dense_local_matrix():
    n = 30
    edges = random_graph(n - 2, 90, seed=8)
    Q = np.random.default_rng(4).standard_normal((n, 5))
    M = dense_shifted(dense_adjacency(edges, n))
    arrays, metrics = power_step(
        DeviceData(edges=edges), {"Q": Q}, {"num-nodes": n, "iters": 3, "normalization": "local", "edge-weight": 0.5}
    )
    np.testing.assert_allclose(arrays["Q"], np.linalg.matrix_power(M, 3) @ Q, atol=1e-12)
    assert metrics["num-examples"] == edges.shape[0]


def test_isolated_node_gives_no_nan():
    n = 6
    edges = np.array([[0, 1], [1, 2]])  # nodes 3, 4, 5 isolated
    Q = np.ones((n, 2))
    local = power_step(DeviceData(edges=edges), {"Q": Q}, {"num-nodes": n, "normalization": "local"})[0]["Q"]
    degrees = np.array([1.0, 2.0, 1.0, 0.0, 0.0, 0.0])
    glob = power_step(
        DeviceData(edges=edges), {"Q": Q, "degrees": degrees}, {"num-nodes": n, "normalization": "global"}
    )[0]["Q"]
    assert np.all(np.isfinite(local)) and np.all(np.isfinite(glob))
    np.testing.assert_array_equal(glob[3:], 0.0)
    np.testing.assert_array_equal(local[3:], 0.5)  # (I + 0)/2 on a node without edges


def test_client_without_edges_returns_zeros():
    n = 8
    data = DeviceData(edges=np.zeros((0, 2), dtype=np.int64), source="empty")
    np.testing.assert_array_equal(local_degrees(data, n), np.zeros(n))
    Q = np.random.default_rng(0).standard_normal((n, 3))
    out, metrics = power_step(
        data, {"Q": Q, "degrees": np.ones(n)}, {"num-nodes": n, "normalization": "global", "edge-weight": 0.5}
    )
    np.testing.assert_array_equal(out["Q"], np.zeros((n, 3)))
    assert metrics["num-examples"] == 0
    labels = local_spectral_labels(data, {}, {"num-nodes": n, "k": 2, "seed": 0})[0]["labels"]
    np.testing.assert_array_equal(labels, -np.ones(n))


def test_power_step_input_errors():
    data = DeviceData(edges=np.array([[0, 1], [1, 2]]))
    Q = np.ones((4, 2))
    with pytest.raises(ValueError, match="iters"):
        power_step(data, {"Q": Q, "degrees": np.ones(4)}, {"num-nodes": 4, "normalization": "global", "iters": 2})
    with pytest.raises(ValueError, match="degrees"):
        power_step(data, {"Q": Q}, {"num-nodes": 4, "normalization": "global"})
    with pytest.raises(ValueError, match="node 1"):
        power_step(
            data, {"Q": Q, "degrees": np.array([1.0, 0.0, 1.0, 0.0])}, {"num-nodes": 4, "normalization": "global"}
        )
    with pytest.raises(ValueError, match="shape"):
        power_step(data, {"Q": np.ones((3, 2))}, {"num-nodes": 4})
    with pytest.raises(ValueError, match="NaN"):
        power_step(data, {"Q": np.full((4, 2), np.nan)}, {"num-nodes": 4})
    with pytest.raises(ValueError, match="normalization"):
        power_step(data, {"Q": Q}, {"num-nodes": 4, "normalization": "laplacian"})
    with pytest.raises(ValueError, match="edge-weight"):
        power_step(data, {"Q": Q}, {"num-nodes": 4, "edge-weight": 0.0})
    with pytest.raises(ValueError, match="num-nodes"):
        power_step(data, {"Q": Q}, {})


def planted_partition(sizes, p_in, bridges, seed):
    """Dense blocks (edge probability p_in) joined by ``bridges`` random cross edges."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum([0] + list(sizes))
    edges, truth = [], np.repeat(np.arange(len(sizes)), sizes)
    for a, b in zip(offsets[:-1], offsets[1:]):
        iu = np.triu_indices(b - a, 1)
        keep = rng.random(iu[0].size) < p_in
        edges.append(np.stack([iu[0][keep] + a, iu[1][keep] + a], axis=1))
    n = offsets[-1]
    cross = rng.integers(0, n, size=(bridges * 4, 2))
    cross = cross[truth[cross[:, 0]] != truth[cross[:, 1]]][:bridges]
    edges.append(cross)
    return canonical_edges(np.concatenate(edges)), truth


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_local_spectral_labels_recovers_planted_clusters():
    edges, truth = planted_partition([30, 25, 35, 20], 0.5, 6, seed=9)
    n = truth.size + 3  # three nodes absent from the local graph
    arrays, metrics = local_spectral_labels(DeviceData(edges=edges), {}, {"num-nodes": n, "k": 4, "seed": 1})
    labels = arrays["labels"]
    assert labels.shape == (n,) and labels.dtype == np.int64
    np.testing.assert_array_equal(labels[-3:], -1)
    assert same_partition(labels[:-3], truth)
    assert metrics["num-examples"] == edges.shape[0] and metrics["num-local-nodes"] == truth.size
    assert metrics["ritz-residual"] < 1e-6


def test_local_spectral_embedding_matches_dense_eigenpairs():
    edges, truth = planted_partition([30, 25, 35, 20], 0.5, 6, seed=9)
    n = truth.size
    values, vectors, iterations, residual = local_spectral_embedding(
        AdjacencyOperator(edges, n), 4, np.random.default_rng(0), tol=1e-9
    )
    w, V = np.linalg.eigh(dense_shifted(dense_adjacency(edges, n)))
    np.testing.assert_allclose(values, w[::-1][:4], atol=1e-9)
    top = V[:, ::-1][:, :4]
    sines = np.linalg.svd(vectors - top @ (top.T @ vectors), compute_uv=False)
    assert sines.max() < 1e-6 and residual < 1e-9 and iterations < 100


def test_inverse_sqrt_degrees_zero_for_isolated():
    np.testing.assert_array_equal(inverse_sqrt_degrees(np.array([4.0, 0.0, 0.25])), [0.5, 0.0, 2.0])


def test_local_spectral_labels_tiny_graph_each_node_own_cluster():
    labels = local_spectral_labels(DeviceData(edges=np.array([[0, 1]])), {}, {"num-nodes": 4, "k": 3, "seed": 0})[0][
        "labels"
    ]
    np.testing.assert_array_equal(labels, [0, 1, -1, -1])


def test_device_module_needs_only_numpy():
    code = (
        "import sys; import fedcluster.graph, fedcluster.algorithms.fedspectral.device, fedcluster.central; "
        "bad = [m for m in ('scipy', 'sklearn', 'flwr') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------- real data


def test_email_eu_core_loads_with_1005_nodes():
    directory = graph_dir()
    if directory is None:
        pytest.skip("SNAP graphs not found: run fedcluster-fetch-graphs --out graphs, or set FEDCLUSTER_GRAPHS")
    edges = load_edge_list(directory / "email-Eu-core.txt", num_nodes=1005)
    assert edges.shape == (25571, 2)
    assert infer_num_nodes(edges) == 1005
    assert canonical_edges(edges).shape == (16064, 2)
    with pytest.raises(GraphError, match="email-Eu-core.txt"):
        load_edge_list(directory / "email-Eu-core.txt", num_nodes=1000)
    departments = load_node_labels(directory / "email-Eu-core-department-labels.txt", num_nodes=1005)
    assert departments.shape == (1005,) and departments.min() == 0 and np.unique(departments).size == 42
