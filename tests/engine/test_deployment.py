"""Engine tier: the secure deployment path for real (SuperLink + SuperNodes on loopback).

One SuperLink with TLS and SuperNode authentication serves the module (started by the same
``LocalCluster`` that ``fedcluster-local-cluster`` uses): an unregistered SuperNode is
refused and each algorithm runs through it. A cluster of its own sees a SuperNode connect
and another die mid-run. Every process is started here and stopped by PID (process group)
at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedcluster.tools.flower import flower_installed, run_config_text

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,  # real processes; every message is a fresh ClientApp process (~6 s a round trip)
    pytest.mark.skipif(not flower_installed(), reason="flwr / flower-superlink / flower-supernode not installed"),
]
pytest.importorskip("cryptography")

from fedcluster.tools.local_cluster import LocalCluster  # noqa: E402

MEANS = np.array([[0, 0, 0, 0], [12, 0, 0, 0], [0, 12, 0, 0], [0, 0, 12, 0]], dtype=float)
NODES = 3
QUICK = f"min-nodes={NODES} node-settle-s=1.0 reference=false"  # each round trip is ~6 s: no extra phases


def node_data(directory: Path) -> list[Path]:
    """Node i holds blobs i and i+1 (mod 4) of four well-separated 4-D blobs (non-IID)."""
    rng = np.random.default_rng(11)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(NODES):
        X = np.concatenate([MEANS[(i + j) % 4] + rng.normal(size=(40, 4)) for j in range(2)])
        paths.append(directory / f"node_{i + 1}.npy")
        np.save(paths[-1], X)
    return paths


def pooled(paths) -> np.ndarray:
    return np.concatenate([np.load(p) for p in paths])


def lloyd_reference(X, k):
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=10, random_state=0).fit(X).inertia_ / X.shape[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("deployment")
    handle = LocalCluster(workdir, node_data(workdir / "data"), echo=lambda *_: None)
    try:
        handle.start()
        yield handle
    finally:
        handle.stop()


def run_to_end(cluster: LocalCluster, run_config: str, timeout: float = 400) -> tuple[str, str]:
    run_id = cluster.submit(ROOT, run_config)
    return run_id, cluster.wait(run_id, timeout)


def processes_of(workdir: Path) -> list[int]:
    """PIDs whose command line names ``workdir`` (this test's processes only)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(workdir) in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


# ------------------------------------------------------------------ TLS + SuperNode auth


def test_an_unregistered_supernode_is_refused(cluster, tmp_path):
    from fedcluster.tools.certs import make_certs

    stranger = make_certs(tmp_path / "stranger", supernodes=1).supernode_keys[0]  # never registered
    before = cluster.flwr("supernode", "list", "local", "--format", "json")
    process = cluster.start_supernode(0, key=stranger)
    name = next(n for n, p in cluster.processes.items() if p is process)
    try:
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and process.poll() is None
            and "Failed to activate SuperNode" not in cluster.tail(name)
        ):
            time.sleep(1)
        log = cluster.tail(name)
        # Flower's exit code 305: "Failed to activate SuperNode" -- the SuperLink refused its key
        # (the same CA and options with a registered key connect: the module's SuperNodes).
        assert "Failed to activate SuperNode" in log, log
    finally:
        cluster.stop_process(name)
        del cluster.processes[name]
    after = cluster.flwr("supernode", "list", "local", "--format", "json")
    assert after.stdout.count('"node-id"') == before.stdout.count('"node-id"'), (before.stdout, after.stdout)


def test_tls_and_auth_deployment_runs_fedkmeans_to_the_central_cost(cluster):
    out = cluster.workdir / "out-fedkmeans"
    run_id, status = run_to_end(cluster, f"k=4 num-rounds=2 eval-every=0 {QUICK} output-dir='{out}'")
    assert status == "finished:completed", cluster.run_log(run_id)
    result = json.loads((out / "result.json").read_text())
    assert result["nodes"]["connected"] == NODES and not result["nodes"]["exclusions"]
    X = pooled(cluster.data_files)
    assert result["final"]["num_points"] == X.shape[0]
    assert result["final"]["cost"] <= 1.02 * lloyd_reference(X, 4)
    # Dependencies are installed ahead of time: nothing was `uv sync`ed at run time.
    assert not list(cluster.home.rglob("runtime-envs")), sorted(cluster.home.rglob("*"))[:20]
    # Its SuperNodes have partition-ids (LocalCluster): the in-process runner over the same
    # files repeats the run (docs/DESIGN.md, one seed, one result).
    from fedcluster.inprocess import run

    again = cluster.workdir / "out-fedkmeans-inprocess"
    run(
        {"k": 4, "num-rounds": 2, "eval-every": 0, "reference": False, "output-dir": str(again)},
        node_configs=[{"data-path": str(path), "partition-id": i} for i, path in enumerate(cluster.data_files)],
    )
    np.testing.assert_allclose(np.load(out / "centers.npy"), np.load(again / "centers.npy"), rtol=0, atol=1e-9)


def test_kfed_through_the_deployment(cluster):
    out = cluster.workdir / "out-kfed"
    run_id, status = run_to_end(cluster, f"algorithm='kfed' k=4 k-prime=2 {QUICK} output-dir='{out}'")
    assert status == "finished:completed", cluster.run_log(run_id)
    result = json.loads((out / "result.json").read_text())
    assert result["kfed"]["devices"] == NODES
    assert result["final"]["cost"] <= 1.02 * lloyd_reference(pooled(cluster.data_files), 4)


def feddp_through_the_deployment(cluster, name: str, seed: int, options: str) -> tuple[dict, Path]:
    """A FedDP-KMeans run with 40 server-side points (read by the ServerApp on the
    SuperLink's machine) to its end; its result.json and output folder."""
    rng = np.random.default_rng(seed)
    server = cluster.workdir / f"server-{name}.npy"
    np.save(server, np.concatenate([MEANS[j] + rng.normal(size=(10, 4)) for j in range(4)]))
    out = cluster.workdir / f"out-{name}"
    run_id, status = run_to_end(
        cluster,
        f"algorithm='feddp-kmeans' k=4 epsilon=inf server-data='{server}' {QUICK} lloyd-rounds=1 {options} "
        f"output-dir='{out}'",
    )
    assert status == "finished:completed", cluster.run_log(run_id)
    return json.loads((out / "result.json").read_text()), out


def test_feddp_kmeans_through_the_deployment(cluster):
    result, _ = feddp_through_the_deployment(cluster, "feddp", 5, "init='feddp' noise-seed=1")
    assert result["final"]["cost"] <= 1.05 * lloyd_reference(pooled(cluster.data_files), 4)


def test_secure_aggregation_through_the_deployment(cluster):
    """Every message is a fresh ClientApp process here: a session's keys and shares live in
    Flower's context.state from one stage to the next (four round trips for one secure sum)."""
    result, out = feddp_through_the_deployment(
        cluster, "secure", 6, "init='server-kmeans++' secure-aggregation=true evaluate-cost=false"
    )
    assert result["privacy"]["secure_aggregation"]["sums"] == 1
    assert [p["replies"] for p in result["phases"] if p["phase"].startswith("lloyd")] == [NODES] * 4
    X = pooled(cluster.data_files)
    centers = np.load(out / "centers.npy")
    cost = ((X[:, None, :] - centers[None]) ** 2).sum(-1).min(1).mean()
    assert cost <= 1.05 * lloyd_reference(X, 4)


def test_supernodes_that_connect_and_die_mid_run(tmp_path):
    """Its own cluster: two SuperNodes start the run; a third (registered ahead) connects
    while it runs and FedKMeans admits it; then one of the first two is killed: it is
    excluded (its message came back NODE_UNAVAILABLE) or away (the SuperLink stopped listing
    it first), and the run completes over the other two's points."""
    files = node_data(tmp_path / "data")
    out = tmp_path / "out"
    with LocalCluster(tmp_path / "cluster", files, echo=lambda *_: None) as growing:
        growing.start_superlink()
        for index in range(NODES):
            growing.register(index)
        for index in range(NODES - 1):
            growing.start_supernode(index)
        run_id = growing.submit(
            ROOT,
            f"k=4 num-rounds=4 eval-every=0 tol=0.0 stop-when-fixed=false min-nodes={NODES - 1} node-settle-s=1.0 "
            f"reference=false output-dir='{out}'",
        )
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and growing.status(run_id) != "running":
            time.sleep(1)
        time.sleep(10)  # the run is under way with two nodes
        growing.start_supernode(NODES - 1)
        time.sleep(10)  # the newcomer connects; then one of the first two dies
        victim = growing.processes["supernode-1"]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        status = growing.wait(run_id, 400)
        assert status == "finished:completed", growing.run_log(run_id)
    result = json.loads((out / "result.json").read_text())
    (joined,) = result["nodes"]["joined"]
    assert joined["points"] == 80 and joined["round"] >= 1, result["nodes"]
    nodes = result["nodes"]
    gone = {e["node"] for e in nodes["exclusions"]} | set(nodes["away_at_end"])
    assert nodes["connected"] == NODES and len(gone) == 1 and joined["node"] not in gone, nodes
    assert result["final"]["num_points"] == 2 * 80  # the survivor and the newcomer


def journal_round_trips(folder: Path) -> int:
    from fedcluster.server.journal import NAME, decode, read_frames

    frames, _ = read_frames(folder / NAME)
    return sum(1 for frame in frames if decode(frame)[0]["kind"] == "round-trip")


def test_a_deployment_killed_mid_run_resumes_to_the_uninterrupted_result_spending_epsilon_once(tmp_path):
    """FedDP-KMeans without server data (a private histogram start, four noisy Lloyd rounds),
    seeded: kill the SuperLink (with the ServerApp) after two round trips; restart it (the
    SuperNodes reconnect) and submit the same run config with resume=true. The centers are
    those of the uninterrupted run (in-process over the same files and partitions: the same
    run, docs/DESIGN.md) and the privacy ledger holds the releases of one run."""
    from fedcluster.inprocess import run
    from fedcluster.server.run_folder import _held, read_marker

    files = node_data(tmp_path / "data")
    job = {
        "algorithm": "feddp-kmeans",
        "k": 4,
        "init": "histogram",
        "dimension": 4,
        "clip-norm": 30.0,
        "lloyd-rounds": 4,
        "epsilon": 4.0,
        "noise-seed": 3,
        "reference": False,
    }
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    first = run(
        {**job, "output-dir": str(whole)},
        node_configs=[{"data-path": str(path), "partition-id": i} for i, path in enumerate(files)],
    )
    text = f"{run_config_text({k: v for k, v in job.items() if k != 'reference'})} {QUICK}"
    with LocalCluster(tmp_path / "cluster", files, echo=lambda *_: None) as cluster:
        cluster.start()
        run_id = cluster.submit(ROOT, f"{text} output-dir='{stopped}'")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and journal_round_trips(stopped) < 2:
            time.sleep(0.5)
        assert journal_round_trips(stopped) >= 2, cluster.run_log(run_id)
        cluster.restart_superlink()  # SIGKILL: the ServerApp goes with it, mid-run
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _held(stopped):  # the old ServerApp let go of its folder
            time.sleep(0.5)
        assert not _held(stopped) and read_marker(stopped)["status"] == "running"
        done = journal_round_trips(stopped)
        releases = len((stopped / "privacy-ledger.jsonl").read_text().splitlines())
        run_id, status = run_to_end(cluster, f"{text} output-dir='{stopped}' resume=true")
        assert status == "finished:completed", cluster.run_log(run_id)
    result = json.loads((stopped / "result.json").read_text())
    np.testing.assert_allclose(np.load(stopped / "centers.npy"), np.load(whole / "centers.npy"), rtol=0, atol=1e-9)
    assert result["resumed"][0]["nodes_back"] == NODES and done >= 2 and releases >= 1
    assert result["privacy"]["epsilon"] == first["privacy"]["epsilon"]
    ledger = [json.loads(line) for line in (stopped / "privacy-ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == len((whole / "privacy-ledger.jsonl").read_text().splitlines()) and not any(
        e["again"] for e in ledger
    )
    assert len(result["phases"]) == len(first["phases"])  # the replayed phases are in the record, as they happened


# ------------------------------------------------------------------ graphs: their own cluster


def test_fedspectral_with_secure_aggregation_through_the_deployment(tmp_path):
    """FedSpectral+ with every product secured: each client's session outlives the
    process Flower starts per message (context.state), and the run still finds the
    planted clusters."""
    from fedcluster.graph import canonical_edges, split_edges, write_client_edge_files

    rng = np.random.default_rng(2)
    sizes, n = (30, 30, 30), 90
    edges = []
    for c, start in enumerate((0, 30, 60)):
        iu = np.triu_indices(sizes[c], 1)
        keep = rng.random(iu[0].size) < 0.3
        edges.append(np.stack([iu[0][keep] + start, iu[1][keep] + start], axis=1))
    edges.append(np.array([[0, 30], [30, 60], [60, 0]]))
    edges = canonical_edges(np.concatenate(edges))
    files = write_client_edge_files(split_edges(edges, 2, 2, 0), tmp_path / "edges")
    out = tmp_path / "out"
    with LocalCluster(tmp_path / "cluster", files, echo=lambda *_: None) as graph_cluster:
        graph_cluster.start()
        run_id, status = run_to_end(
            graph_cluster,
            f"algorithm='fedspectral-plus' k=3 num-rounds=4 num-nodes={n} edge-copies=2 min-nodes=2 "
            f"secure-aggregation=true output-dir='{out}'",
        )
        assert status == "finished:completed", graph_cluster.run_log(run_id)
    record = json.loads((out / "result.json").read_text())["final"]["secure_aggregation"]
    assert record["sessions"] == 1 and record["sums"] == 4
    labels = np.load(out / "labels.npy")
    truth = np.repeat(np.arange(3), 30)
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, labels) >= 0.95


# ------------------------------------------------------------------ the console script


def test_local_cluster_command_stops_everything_on_ctrl_c(tmp_path):
    workdir = tmp_path / "lc"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedcluster.tools.local_cluster",
            "--demo-nodes",
            "2",
            "--workdir",
            str(workdir),
            "--run-config",
            "k=4 num-rounds=50 tol=0.0 stop-when-fixed=false reference=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        # as from a terminal: a shell's background job (CI started with `&`) would pass
        # SIGINT on ignored, and Python then installs no Ctrl-C handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (workdir / "logs" / "supernode-2.log").exists():
            time.sleep(0.5)
        time.sleep(3)
        assert len(processes_of(workdir)) >= 3  # the SuperLink and two SuperNodes are up
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "interrupted; every process started here is stopped" in output
    deadline = time.monotonic() + 20  # a process group may take a moment to go
    while time.monotonic() < deadline and processes_of(workdir):
        time.sleep(0.5)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:300] for pid in processes_of(workdir)}
    assert not left, (left, output)


def test_local_cluster_command_prints_each_round_while_the_run_goes(tmp_path):
    """``fedcluster-local-cluster`` follows the run's log: the ServerApp's line per round
    (replies, seconds, cost) is printed before the run ends, not only "running"."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedcluster.tools.local_cluster",
            "--demo-nodes",
            "2",
            "--workdir",
            str(tmp_path / "lc"),
            "--run-config",
            "k=2 num-rounds=2 tol=0.0 stop-when-fixed=false reference=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    line = re.compile(r"\[fedcluster\] round (\d+): \d+/\d+ replies.*, \d+\.\d\d s")
    rounds = {int(m.group(1)): i for i, text in enumerate(lines) if (m := line.match(text))}
    ended = next(i for i, text in enumerate(lines) if text.startswith("run log (flwr log"))
    assert sorted(rounds) == [1, 2], done.stdout
    assert max(rounds.values()) < ended, done.stdout  # printed while the run went, before its end
