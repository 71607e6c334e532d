"""Engine tier: SuperNodes served by one long-lived ``fedcluster-device`` process each.

A TLS + SuperNode-authenticated deployment (``LocalCluster(device_worker=True)``: every
SuperNode ``--isolation process``, its Runtime API on TLS with a SuperExec auth secret)
runs FedKMeans through ``flwr run`` to the in-process runner's centers, while no
``flwr-clientapp`` or ``flower-superexec`` process of this cluster ever exists and each
SuperNode's one worker (the same PID from start to end) answers every message; a run of
another app gets error replies naming why. Under a 256 MB memory cap per device (SuperNode
and worker in one cgroup, a quarter core, behind the link proxy) FedKMeans completes with
no OOM kill. Every process, cgroup and namespace is started here and removed by PID/name."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from fedcluster.tools.flower import flower_installed

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,  # real processes, TLS, a few rounds of ~4 s
    pytest.mark.skipif(not flower_installed(), reason="flwr / flower-superlink / flower-supernode not installed"),
]
pytest.importorskip("cryptography")

from fedcluster.tools.local_cluster import LocalCluster  # noqa: E402

MEANS = np.array([[0, 0, 0, 0], [12, 0, 0, 0], [0, 12, 0, 0], [0, 0, 12, 0]], dtype=float)
NODES = 2
MB = 2**20


def node_data(directory: Path, points: int = 40) -> list[Path]:
    rng = np.random.default_rng(5)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(NODES):
        X = np.concatenate([MEANS[(2 * i + j) % 4] + rng.normal(size=(points, 4)) for j in range(2)])
        paths.append(directory / f"node_{i + 1}.npy")
        np.save(paths[-1], X)
    return paths


class FlowerChildren(threading.Thread):
    """Every process whose environment names this cluster's Flower home: its parent and
    every command it ran, seen while the run goes (polled every 0.1 s: a flwr-clientapp
    lives ~2 s at least). A process is read again at every poll: one seen right after a
    fork still has its parent's command line until it executes another."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        self.marker = f"FLWR_HOME={home}".encode()
        self.seen: dict[int, tuple[int, set[str]]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        if self.marker in (entry / "environ").read_bytes().split(b"\0"):
                            argv = (entry / "cmdline").read_bytes().split(b"\0")
                            status = (entry / "status").read_text().splitlines()
                            parent = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
                            command = " ".join(Path(a.decode()).name for a in argv[:2])
                            self.seen.setdefault(int(entry.name), (parent, set()))[1].add(command)
                    except OSError:
                        pass
            self.halt.wait(0.1)

    def named(self, word: str) -> list[str]:
        return [command for _, commands in self.seen.values() for command in commands if word in command]

    def descendants(self, roots: set[int]) -> set[str]:
        """Every command run by a process seen whose parent chain reaches ``roots``."""
        found, grown = set(roots), True
        while grown:
            more = {pid for pid, (parent, _) in self.seen.items() if parent in found} - found
            found |= more
            grown = bool(more)
        return {command for pid in found - roots if pid in self.seen for command in self.seen[pid][1]}


def served(cluster: LocalCluster, name: str) -> list[str]:
    """The worker's lines about its tasks (each begins with the time: HH:MM:SS)."""
    task = re.compile(r"\d\d:\d\d:\d\d fedcluster-device: task ")
    return [line for line in cluster.tail(f"{name}-device", 10**6).splitlines() if task.match(line)]


def test_device_workers_serve_every_message_of_a_tls_authenticated_deployment(tmp_path):
    from fedcluster.inprocess import run

    files = node_data(tmp_path / "data")
    out, again, echo_out = tmp_path / "out", tmp_path / "inprocess", tmp_path / "echo.json"
    watcher = None
    with LocalCluster(tmp_path / "cluster", files, echo=lambda *_: None, device_worker=True) as cluster:
        cluster.start()
        watcher = FlowerChildren(cluster.home)
        watcher.start()
        workers = {name: process.pid for name, process in cluster.workers.items()}
        supernodes = {cluster.processes[name].pid for name in workers}
        run_id = cluster.submit(
            ROOT,
            f"k=4 num-rounds=3 eval-every=0 min-nodes={NODES} node-settle-s=1.0 reference=false output-dir='{out}'",
        )
        status = cluster.wait(run_id, 400)
        assert status == "finished:completed", cluster.run_log(run_id) + cluster.all_logs()
        answered = {name: served(cluster, name) for name in workers}
        # Another app's run: the workers answer it with errors naming why, and go on.
        other = cluster.submit(ROOT / "bench" / "echo_app", f"broadcasts=1 min-nodes={NODES} output='{echo_out}'")
        assert cluster.wait(other, 300).startswith("finished"), cluster.all_logs()
        refused = {name: served(cluster, name)[len(answered[name]) :] for name in workers}
        alive = {name: (process.poll() is None, process.pid) for name, process in cluster.workers.items()}
        watcher.halt.set()
    watcher.join()
    # One worker per SuperNode, alive from start to end, answered every message
    assert set(workers) == {"supernode-1", "supernode-2"}
    assert alive == {name: (True, pid) for name, pid in workers.items()}, alive
    # init, rounds, final cost: each served by the worker (a task Flower gave up under load and
    # handed out again shows as failed, then done: the run's completion above is the test of that)
    assert all(sum(" done in " in line for line in lines) >= 4 for lines in answered.values()), answered
    # ... and nothing else ran a message: no SuperExec, no ClientApp process per message
    assert watcher.named("fedcluster-device") and watcher.named("supernode"), watcher.seen
    # (the SuperLink's own SuperExec, running the ServerApp, is not a device's)
    # (a SuperNode's own fork that runs no other command, seen in CI, is not a ClientApp)
    spawned = watcher.descendants(supernodes) - {"python3 flower-supernode"}
    assert not watcher.named("flwr-clientapp") and not spawned, watcher.seen
    # The same centers as the in-process runner over the same files and partition-ids
    result = json.loads((out / "result.json").read_text())
    assert result["final"]["num_points"] == 80 * NODES
    run(
        {"k": 4, "num-rounds": 3, "eval-every": 0, "reference": False, "output-dir": str(again)},
        node_configs=[{"data-path": str(path), "partition-id": i} for i, path in enumerate(files)],
    )
    np.testing.assert_allclose(np.load(out / "centers.npy"), np.load(again / "centers.npy"), rtol=0, atol=1e-9)
    # The other app's messages were refused by name, not run
    assert all(
        lines and all("runs only the 'fedcluster/fedcluster' app" in x for x in lines)
        for x in [None]
        for lines in refused.values()
    ), refused
    assert json.loads(echo_out.read_text())["replies"] == [0], echo_out.read_text()


@pytest.mark.nightly  # capped processes at a quarter core: minutes on a shared machine
def test_device_workers_fit_fedkmeans_in_256_mb_per_device(tmp_path):
    from fedcluster.tools.constrained import ConstrainedCluster, Limits, Sampler, unavailable

    why = unavailable()
    if why:
        pytest.skip(f"constrained devices: {why}")
    files = node_data(tmp_path / "data", points=1000)
    out = tmp_path / "out"
    limits = Limits(memory=256 * MB, drop_mean_s=0.0)  # the memory cap is the question here, not the link
    cluster = ConstrainedCluster(tmp_path / "cluster", files, limits, echo=lambda *_: None, device_worker=True)
    try:
        cluster.start()
        sampler = Sampler(cluster.cgroups)
        sampler.start()
        run_id = cluster.submit(
            ROOT,
            f"k=4 num-rounds=3 eval-every=0 min-nodes={NODES} node-settle-s=1.0 reference=false output-dir='{out}'",
        )
        status = cluster.wait(run_id, 900)
        sampler.halt.set()
        snapshots = [group.snapshot() for group in cluster.cgroups]
        failcnt = [int(group.read("memory", "memory.failcnt")) for group in cluster.cgroups]
        alive = [process.poll() is None for process in cluster.workers.values()]
        assert status == "finished:completed", cluster.run_log(run_id) + cluster.all_logs()
    finally:
        cluster.stop()
    assert all(s["oom_kills"] == 0 for s in snapshots), snapshots
    assert all(s["peak_usage"] < limits.memory for s in snapshots) and failcnt == [0] * NODES, (snapshots, failcnt)
    assert alive == [True] * NODES
    assert "flwr-clientapp" not in sampler.most_at_once and sampler.most_at_once.get("fedcluster-device") == 1, (
        sampler.most_at_once
    )
    assert json.loads((out / "result.json").read_text())["final"]["num_points"] == 2000 * NODES
