"""FedSpectral and FedSpectral+: the exact mode's server algebra (fedcluster/algorithms/fedspectral/model.py),
whole runs of fedcluster/algorithms/fedspectral/strategy.py through the in-process runner, bad input, the
splitter CLI, the layout (no flwr below the strategy), and one real ``flwr run``."""

from __future__ import annotations

import re

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import split_email_eu_core
from fedcluster.config import ConfigError, with_defaults
from fedcluster.algorithms.fedspectral.model import (
    ExactEigensolver,
    RitzBasis,
    affinity_embedding,
    auto_max_basis,
    coassociation_matrix,
    degree_scaled_start,
    embedding_labels,
    initial_block,
    orthonormal_complement,
    start_block,
    subspace_distance,
)
from fedcluster.graph import canonical_edges, load_edge_list, split_edges, write_client_edge_files
from fedcluster.algorithms.fedspectral.split_tool import main as split_main
from fedcluster.linalg import orthonormalize
from fedcluster.central import central_eigenpairs, normalized_adjacency
from fedcluster.server.base import FederationError

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def planted(sizes, p_in, bridges, seed, isolated=()):
    """Planted-partition graph; ``isolated`` node ids get no edge (the others are shifted)."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum([0] + list(sizes))
    edges = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        iu = np.triu_indices(b - a, 1)
        keep = rng.random(iu[0].size) < p_in
        edges.append(np.stack([iu[0][keep] + a, iu[1][keep] + a], axis=1))
    truth = np.repeat(np.arange(len(sizes)), sizes)
    cross = rng.integers(0, offsets[-1], size=(bridges * 4, 2))
    edges.append(cross[truth[cross[:, 0]] != truth[cross[:, 1]]][:bridges])
    edges = canonical_edges(np.concatenate(edges))
    n = int(offsets[-1]) + len(isolated)
    # map the graph's ids onto the ids that are not isolated
    others = np.setdiff1d(np.arange(n), np.asarray(isolated, dtype=np.int64))
    return canonical_edges(others[edges]), n


def write_split(directory: Path, edges, clients, copies, seed=0, empty_client=None):
    parts = split_edges(edges, clients, copies, seed)
    if empty_client is not None:
        parts.insert(empty_client, np.zeros((0, 2), dtype=np.int64))
    write_client_edge_files(parts, directory)
    return directory


def run_graph(tmp_path, data_dir, num_clients, **config):
    from fedcluster.inprocess import run

    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    base = {"dataset": "edge-dir", "data-dir": str(data_dir), "output-dir": str(out), "node-settle-s": 0.2}
    result = run({**base, **config}, num_nodes=num_clients)
    return result, np.load(out / "labels.npy"), np.load(out / "embedding.npy")


def shifted_operator(edges, n):
    N = normalized_adjacency(edges, n)
    return lambda X: 0.5 * (X + N @ X)


def central_start(edges, n, b, seed):
    """X_0 of the exact protocol, from the documented formula (independent of the server):
    G = default_rng(seed).standard_normal((n, b)); X_0 = D^{1/2} G, zero on isolated rows."""
    degrees = np.bincount(canonical_edges(edges).ravel(), minlength=n).astype(float)
    G = np.random.default_rng(seed).standard_normal((n, b))
    return np.sqrt(degrees)[:, None] * G


def top_ritz(Q, MQ, k):
    H = Q.T @ MQ
    values, U = np.linalg.eigh(0.5 * (H + H.T))
    return Q @ U[:, np.argsort(values)[::-1][:k]]


# --------------------------------------------------------------------------------------------
# server algebra
# --------------------------------------------------------------------------------------------


def test_orthonormal_complement_is_orthogonal_and_drops_dependent_columns():
    rng = np.random.default_rng(0)
    V = np.linalg.qr(rng.standard_normal((50, 6)))[0]
    X = np.hstack([rng.standard_normal((50, 3)), V[:, :2] @ rng.standard_normal((2, 2))])
    U = orthonormal_complement(V, X)
    assert U.shape == (50, 3)  # the two columns inside span(V) are dropped
    assert np.allclose(U.T @ U, np.eye(3), atol=1e-12)
    assert np.abs(V.T @ U).max() < 1e-12
    assert orthonormal_complement(V, V @ rng.standard_normal((6, 4))).shape[1] == 0


def test_ritz_basis_extend_and_restart_keep_exact_products():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((40, 40))
    M = (A + A.T) / 2
    V = np.linalg.qr(rng.standard_normal((40, 5)))[0]
    basis = RitzBasis(V, M @ V)
    X = orthonormal_complement(basis.V, rng.standard_normal((40, 5)))
    basis.extend(X, M @ X)
    assert np.allclose(basis.H, basis.V.T @ M @ basis.V, atol=1e-12)
    values, Y, MY = basis.ritz(3)
    assert np.allclose(MY, M @ Y, atol=1e-12) and np.all(np.diff(values) <= 0)
    basis.restart(4)
    assert basis.size == 4 and np.allclose(basis.W, M @ basis.V, atol=1e-12)
    assert np.allclose(basis.ritz(3)[0], values, atol=1e-12)


def test_degree_scaled_start_zero_rows_for_isolated_nodes():
    G = np.ones((4, 2))
    X = degree_scaled_start(G, np.array([4.0, 0.0, 1.0, 9.0]))
    assert np.array_equal(X[:, 0], [2.0, 0.0, 1.0, 3.0])
    # fewer nodes with an edge than columns: isolated rows keep G (full rank start)
    assert np.array_equal(degree_scaled_start(np.ones((3, 2)), np.array([1.0, 0.0, 0.0]))[:, 0], [1.0, 1.0, 1.0])


def test_auto_max_basis():
    assert auto_max_basis(1005, 20) == 1005
    assert auto_max_basis(10**7, 20) == 160
    np.testing.assert_array_equal(start_block(5, 2, 3), np.random.default_rng(3).standard_normal((5, 2)))


@pytest.mark.parametrize("acceleration", ["none", "krylov"])
def test_exact_eigensolver_fed_central_products_is_the_documented_iteration(acceleration):
    """The server math on plain arrays: fed with central products it is block subspace
    iteration from qr(D^{1/2} G), or converges to the exact eigenspace (Krylov)."""
    edges, n = planted([25, 20, 30], 0.3, 12, seed=3, isolated=(7, 40))
    k, b, seed = 3, 5, 4
    N = normalized_adjacency(edges, n)
    A = (N != 0).astype(float)
    solver = ExactEigensolver(n, k, b, seed, acceleration)
    first = solver.first_block()
    np.testing.assert_array_equal(solver.first_degrees(), np.ones(n))
    solver.start(A @ first)  # sum_j (1/r) A_j [1, G] = A [1, G]
    np.testing.assert_allclose(solver.degrees, np.bincount(edges.ravel(), minlength=n))
    rounds = 12 if acceleration == "none" else 30
    for _ in range(rounds - 1):
        X = solver.next_block()
        if X is None:
            break
        solver.absorb(X, N @ X)
    values, Y, residuals = solver.result()
    assert Y.shape == (n, k) and np.all(np.diff(values) <= 0)
    np.testing.assert_array_equal(Y[[7, 40]], 0.0)  # isolated rows stay exactly zero
    M = shifted_operator(edges, n)
    if acceleration == "none":
        Q = np.linalg.qr(central_start(edges, n, b, seed))[0]
        for _ in range(rounds - 1):
            Q = np.linalg.qr(M(Q))[0]
        assert subspace_distance(Y, top_ritz(Q, M(Q), k)) < 1e-10
    else:
        exact_values, exact = central_eigenpairs(edges, n, k)
        assert subspace_distance(Y, exact) < 1e-8
        np.testing.assert_allclose(values, exact_values, atol=1e-12)
        assert residuals.max() < 1e-8
    assert solver.graph_summary()["isolated_nodes"] == 2
    assert solver.graph_summary()["edges"] == edges.shape[0]


# --------------------------------------------------------------------------------------------
# exact mode equals the central computation
# --------------------------------------------------------------------------------------------


@pytest.fixture
def small_graph(tmp_path):
    edges, n = planted([25, 20, 30], 0.3, 12, seed=3, isolated=(7, 40))
    return edges, n, write_split(tmp_path / "split", edges, clients=4, copies=2, seed=1)


def test_exact_mode_equals_central_block_subspace_iteration(tmp_path, small_graph):
    edges, n, data_dir = small_graph
    k, b, rounds, seed = 3, 5, 12, 4
    result, labels, embedding = run_graph(
        tmp_path,
        data_dir,
        4,
        algorithm="fedspectral-plus",
        mode="exact",
        acceleration="none",
        k=k,
        oversample=b - k,
        seed=seed,
        **{"num-nodes": n, "num-rounds": rounds, "edge-copies": 2},
    )
    M = shifted_operator(edges, n)
    Q = np.linalg.qr(central_start(edges, n, b, seed))[0]
    for _ in range(rounds - 1):
        Q = np.linalg.qr(M(Q))[0]
    central = top_ritz(Q, M(Q), k)
    assert subspace_distance(embedding, central) < 1e-8
    assert len(result["rounds"]) == rounds and result["final"]["communication_rounds"] == rounds
    assert labels.shape == (n,) and embedding.shape == (n, k)


def test_exact_mode_is_independent_of_the_edge_weight(tmp_path, small_graph):
    """Every edge on 2 clients: weight 1/2 (edge-copies=2) and weight 1 give the same N."""
    edges, n, data_dir = small_graph
    common = dict(algorithm="fedspectral-plus", k=3, **{"num-nodes": n, "num-rounds": 6})
    right_result, _, right = run_graph(tmp_path, data_dir, 4, **common, **{"edge-copies": 2})
    wrong_result, _, wrong = run_graph(tmp_path, data_dir, 4, **common, **{"edge-copies": 1})
    assert subspace_distance(right, wrong) < 1e-10
    assert right_result["final"]["graph"]["edges"] == pytest.approx(edges.shape[0])
    assert wrong_result["final"]["graph"]["edges"] == pytest.approx(2 * edges.shape[0])


def test_exact_krylov_equals_central_block_krylov_and_converges(tmp_path, small_graph):
    edges, n, data_dir = small_graph
    k, b, seed = 3, 4, 2
    M = shifted_operator(edges, n)
    X = central_start(edges, n, b, seed)
    blocks = [X]
    for _ in range(2):
        blocks.append(M(blocks[-1]))
    K = np.linalg.qr(np.hstack(blocks))[0]  # block Krylov space K_3(M, X_0)
    central_krylov = top_ritz(K, M(K), k)
    common = dict(algorithm="fedspectral-plus", k=k, oversample=b - k, seed=seed, **{"num-nodes": n, "edge-copies": 2})
    _, _, embedding = run_graph(tmp_path, data_dir, 4, **common, **{"num-rounds": 3})
    assert subspace_distance(embedding, central_krylov) < 1e-8
    result, labels, embedding = run_graph(tmp_path, data_dir, 4, **common, **{"num-rounds": 40, "residual-tol": 1e-10})
    _, exact = central_eigenpairs(edges, n, k)
    assert subspace_distance(embedding, exact) < 1e-8
    assert result["final"]["communication_rounds"] < 40  # stopped early on the residual
    assert result["rounds"][-1]["residual"] <= 1e-10
    assert result["central_reference"]["ari"] == pytest.approx(1.0)


def test_krylov_thick_restart_still_converges(tmp_path, small_graph):
    edges, n, data_dir = small_graph
    result, _, embedding = run_graph(
        tmp_path,
        data_dir,
        4,
        algorithm="fedspectral-plus",
        k=3,
        oversample=1,
        **{"num-nodes": n, "num-rounds": 60, "max-basis": 8, "residual-tol": 1e-9},
    )
    assert max(r["basis_columns"] for r in result["rounds"]) <= 8
    _, exact = central_eigenpairs(edges, n, 3)
    assert subspace_distance(embedding, exact) < 1e-7


def test_round_records_subspace_change_and_bytes(tmp_path, small_graph):
    _, n, data_dir = small_graph
    result, _, _ = run_graph(
        tmp_path, data_dir, 4, algorithm="fedspectral-plus", k=3, **{"num-nodes": n, "num-rounds": 5}
    )
    rounds = result["rounds"]
    assert rounds[0]["subspace_change"] is None
    assert all(0 <= r["subspace_change"] <= 1 for r in rounds[1:])
    # round 1 sends [1, G] (b + 1 columns) and unit degrees; later rounds b columns + degrees
    # (payload bytes include a 128-byte .npy header per array); k = 3: default block 3 + 10
    b = 13
    assert rounds[0]["bytes_up"] == 4 * (n * (b + 1) * 8 + 128)
    assert rounds[1]["bytes_down"] == 4 * (n * rounds[1]["block_columns"] * 8 + n * 8 + 2 * 128)


# --------------------------------------------------------------------------------------------
# isolated nodes, empty clients, bad ids
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,acceleration,oversample",
    [("exact", "krylov", -1), ("exact", "krylov", 3), ("exact", "none", 2), ("paper", "krylov", -1)],
)
def test_isolated_nodes_get_a_label_and_no_nan(tmp_path, small_graph, mode, acceleration, oversample):
    edges, n, data_dir = small_graph
    n_big = n + 3  # three more nodes with no edge at all, after the last id
    result, labels, embedding = run_graph(
        tmp_path,
        data_dir,
        4,
        algorithm="fedspectral-plus",
        mode=mode,
        k=3,
        acceleration=acceleration,
        oversample=oversample,
        **{"num-nodes": n_big, "num-rounds": 30 if acceleration == "none" else 8},
    )
    assert labels.shape == (n_big,) and np.all(labels >= 0) and np.all(labels < 3)
    np.testing.assert_allclose(embedding.T @ embedding, np.eye(3), atol=1e-10)  # finite, orthonormal
    isolated = [7, 40, n, n + 1, n + 2]
    if mode == "exact":
        assert np.all(embedding[isolated] == 0.0)
        assert result["final"]["graph"]["isolated_nodes"] == 5
        assert len(set(labels[isolated])) == 1  # all at the origin: one cluster, as centrally
        assert result["central_reference"]["ari"] == pytest.approx(1.0)


def test_fedspectral_baseline_with_isolated_nodes(tmp_path, small_graph):
    _, n, data_dir = small_graph
    result, labels, embedding = run_graph(
        tmp_path, data_dir, 4, algorithm="fedspectral", k=3, seed=5, **{"num-nodes": n + 2}
    )
    assert labels.shape == (n + 2,) and embedding.shape == (n + 2, 3)
    assert result["final"]["communication_rounds"] == 1
    assert result["final"]["nodes_held"] == n - 2
    client_labels = np.load(Path(result["output_dir"]) / "client_labels.npy")
    assert client_labels.shape == (4, n + 2)
    unheld = [7, 40, n, n + 1]
    assert np.all(client_labels[:, unheld] == -1) and np.all(
        client_labels.max(axis=0)[np.setdiff1d(np.arange(n), [7, 40])] >= 0
    )
    # the server is the documented math on the clients' labels, and nodes nobody holds sit at the origin
    expected = affinity_embedding(coassociation_matrix(list(client_labels), n + 2), 3, seed=5)
    np.testing.assert_allclose(embedding, expected, atol=1e-12)
    np.testing.assert_array_equal(labels, embedding_labels(expected, 3, 5))
    np.testing.assert_array_equal(embedding[unheld], 0.0)
    assert result["final"]["cluster_sizes"] == np.bincount(labels, minlength=3).tolist()
    assert result["central_reference"]["ari"] > 0.5  # a planted partition survives even the baseline


@pytest.mark.parametrize(
    "algorithm,mode", [("fedspectral-plus", "exact"), ("fedspectral-plus", "paper"), ("fedspectral", None)]
)
def test_a_client_without_edges_does_not_break_the_run(tmp_path, algorithm, mode):
    edges, n = planted([20, 20, 20], 0.35, 8, seed=5)
    data_dir = write_split(tmp_path / "split", edges, clients=3, copies=2, empty_client=1)
    assert load_edge_list(data_dir / "client_001.txt").shape == (0, 2)
    plus = {"mode": mode, "num-rounds": 10, "edge-copies": 2} if mode else {}  # FedSpectral+'s own keys
    result, labels, embedding = run_graph(tmp_path, data_dir, 4, algorithm=algorithm, k=3, **{"num-nodes": n, **plus})
    assert result["nodes"]["connected"] == 4 and all(r["replies"] == r["sent"] for r in result["rounds"])
    assert labels.shape == (n,) and embedding.shape == (n, 3)
    if algorithm == "fedspectral":
        client_labels = np.load(Path(result["output_dir"]) / "client_labels.npy")
        np.testing.assert_array_equal(client_labels[1], -1)  # the empty client holds no node
        assert result["final"]["nodes_held"] == n
        assert result["central_reference"]["ari"] > 0.5
    elif mode == "exact":
        _, exact = central_eigenpairs(edges, n, 3)
        assert subspace_distance(embedding, exact) < 1e-6
    else:  # paper: the empty client's halved block is averaged in, the result is still a QR factor
        np.testing.assert_allclose(embedding.T @ embedding, np.eye(3), atol=1e-10)
        assert result["rounds"][-1]["subspace_change"] < 1.0


def test_node_id_out_of_range_takes_that_client_out_with_a_clear_reason(tmp_path, small_graph):
    """A client whose edge file is bad is out of the run, the reason names its file and
    line; the run goes on over the other clients' edges (as a point run does)."""
    _, n, data_dir = small_graph
    with open(data_dir / "client_002.txt", "a") as handle:
        handle.write(f"3 {n + 5}\n")
    for algorithm in ("fedspectral-plus", "fedspectral"):
        (tmp_path / algorithm).mkdir()
        result, labels, _ = run_graph(tmp_path / algorithm, data_dir, 4, algorithm=algorithm, k=3, **{"num-nodes": n})
        assert labels.shape == (n,)
        excluded = result["nodes"]["excluded"]
        assert list(excluded) == ["1002"], excluded
        assert re.search(rf"client_002\.txt.*node id {n + 5} is out of range", excluded["1002"])
        assert result["final"]["num_nodes"] == n


def test_point_data_is_rejected_with_a_reason(tmp_path):
    with pytest.raises(FederationError, match="needs an edge list"):
        from fedcluster.inprocess import run

        run({"algorithm": "fedspectral-plus", "num-nodes": 10, "k": 2, "output-dir": str(tmp_path / "o")}, num_nodes=2)


def test_config_validation():
    with pytest.raises(ConfigError, match="needs run-config num-nodes"):
        with_defaults({"algorithm": "fedspectral-plus"})
    with pytest.raises(ConfigError, match="mode must be"):
        with_defaults({"mode": "fast"})
    with pytest.raises(ConfigError, match="acceleration must be"):
        with_defaults({"acceleration": "chebyshev"})
    with pytest.raises(ConfigError, match="larger than num-nodes"):
        with_defaults({"algorithm": "fedspectral", "num-nodes": 5, "k": 6})
    with pytest.raises(ConfigError, match="coassociation"):
        with_defaults({"coassociation": "any"})
    assert with_defaults({"algorithm": "fedspectral-plus", "num-nodes": 5})["mode"] == "exact"


def test_iters_is_ignored_in_exact_mode_with_a_note(tmp_path, small_graph):
    _, n, data_dir = small_graph
    result, _, _ = run_graph(
        tmp_path, data_dir, 4, algorithm="fedspectral-plus", k=3, iters=6, **{"num-nodes": n, "num-rounds": 3}
    )
    assert "iters=6 ignored" in result["final"]["notes"][0]


def test_paper_mode_runs_the_papers_protocol(tmp_path, small_graph):
    """One round, two local steps: the embedding is QR(mean_j M_j^2 Q_0) with local degrees."""
    edges, n, data_dir = small_graph
    result, _, embedding = run_graph(
        tmp_path,
        data_dir,
        4,
        algorithm="fedspectral-plus",
        mode="paper",
        k=3,
        iters=2,
        seed=9,
        **{"num-nodes": n, "num-rounds": 1},
    )
    Q0 = initial_block(n, 3, 9)
    steps = []
    for j in range(4):
        local = load_edge_list(data_dir / f"client_{j:03d}.txt")
        M = shifted_operator(local, n)
        steps.append(M(M(Q0)))
    assert np.allclose(embedding, orthonormalize(np.mean(steps, axis=0)), atol=1e-12)
    assert result["final"]["communication_rounds"] == 1 and result["rounds"][0]["block_columns"] == 3


def test_algorithm_and_benchmarks_import_without_flwr_or_the_server():
    """fedcluster.algorithms.fedspectral.model, the central references and the benchmarks need neither flwr
    nor fedcluster.server (the house plan: everything below the phases is plain library code)."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["flwr"] = None
        sys.modules["fedcluster.server"] = None
        sys.path.insert(0, {str(ROOT)!r})
        import fedcluster.algorithms.fedspectral.model, fedcluster.central, fedcluster.graph
        import bench.fedspectral_repro, bench.spectral_kernel
        print("OK")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


# --------------------------------------------------------------------------------------------
# the splitter CLI
# --------------------------------------------------------------------------------------------


def test_split_graph_cli_writes_clients_and_prints_the_run_config(tmp_path, capsys):
    source = tmp_path / "g.txt"
    source.write_text("0 1\n1 0\n1 2\n2 2\n3 4\n\n")
    out = tmp_path / "clients"
    assert split_main([str(source), "--clients", "5", "--overlap", "0.4", "--out", str(out), "--num-nodes", "7"]) == 0
    printed = capsys.readouterr().out
    assert "num-nodes=7 edge-copies=2" in printed and "data-path" in printed
    files = sorted(out.glob("client_*.txt"))
    assert len(files) == 5
    held = np.concatenate([load_edge_list(f) for f in files])
    assert held.shape[0] == 3 * 2  # 3 undirected edges, each on 2 clients
    # refuses to mix with an earlier split, unless --force
    assert split_main([str(source), "--clients", "2", "--copies", "1", "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err
    assert split_main([str(source), "--clients", "2", "--copies", "1", "--out", str(out), "--force"]) == 0
    assert len(list(out.glob("client_*.txt"))) == 2


def test_split_graph_cli_errors(tmp_path, capsys):
    source = tmp_path / "g.txt"
    source.write_text("0 1\n1 9\n")
    assert split_main([str(source), "--clients", "3", "--out", str(tmp_path / "o"), "--num-nodes", "5"]) == 1
    assert "node id 9 is out of range" in capsys.readouterr().err
    assert split_main([str(tmp_path / "missing.txt"), "--clients", "3", "--out", str(tmp_path / "o")]) == 1
    with pytest.raises(SystemExit) as refused:  # an argument against another: exit code 2, as argparse
        split_main([str(source), "--clients", "3", "--copies", "4", "--out", str(tmp_path / "o")])
    assert refused.value.code == 2 and "argument --copies: must be between 1 and --clients=3" in capsys.readouterr().err


def test_split_graph_script_is_declared():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedcluster-split-graph"] == "fedcluster.algorithms.fedspectral.split_tool:main"


# --------------------------------------------------------------------------------------------
# email-Eu-core (skips without the SNAP files)
# --------------------------------------------------------------------------------------------


def test_email_eu_core_exact_mode_matches_central_spectral(tmp_path):
    data_dir = split_email_eu_core(tmp_path)
    result, labels, _ = run_graph(
        tmp_path,
        data_dir,
        5,
        algorithm="fedspectral-plus",
        k=10,
        **{"num-nodes": 1005, "num-rounds": 16, "edge-copies": 2},
    )
    reference = result["central_reference"]
    assert reference["sine_to_central"] <= 1e-3
    assert reference["ari"] >= 0.75  # the central noise floor on email-Eu-core (see the engine test)
    assert labels.shape == (1005,)
    assert result["final"]["graph"] == {**result["final"]["graph"], "isolated_nodes": 19, "edges": 16064.0}


@pytest.mark.parametrize("mode,scale", [("exact", 1.0), ("exact", 1e-3), ("paper", 1.0)])
def test_a_noisy_product_takes_its_client_out_never_an_honest_one(tmp_path, small_graph, mode, scale):
    """Client 1001 adds noise to 40 rows of every power_step product, the degree column
    included: once every honest client failed ("global degree of node 1 is 0") and the
    error named them. Its reply breaks the bounds an honest product obeys; it alone is
    taken out and the run ends over the others' edges."""
    from flwr.app import Array

    _, n, data_dir = small_graph

    def noisy(node, message, reply):
        if node == 1001 and not reply.has_error() and message.metadata.message_type == "train.power_step":
            record = reply.content.array_records["arrays"]
            Q = record["Q"].numpy().copy()
            Q[:40] += scale * np.random.default_rng(0).normal(size=Q[:40].shape) * (1 + np.abs(Q[:40]).max())
            record["Q"] = Array(Q)
        return reply

    from fedcluster.inprocess import run

    config = {
        "algorithm": "fedspectral-plus",
        "mode": mode,
        "dataset": "edge-dir",
        "data-dir": str(data_dir),
        "k": 3,
        "num-nodes": n,
        "num-rounds": 6,
        "edge-copies": 2,
        "node-settle-s": 0.2,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=4, reply_hook=noisy)
    assert list(result["nodes"]["excluded"]) == ["1001"], result["nodes"]["excluded"]
    assert np.load(tmp_path / "o" / "labels.npy").shape == (n,)
    failed = {str(f["node"]) for phase in result["phases"] for f in phase["failures"]}
    assert failed == {"1001"}
