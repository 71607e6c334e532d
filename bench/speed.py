"""Speed: the Lloyd-statistics kernel against scikit-learn, and seconds per round.

(a) Kernel. ``fedcluster.lloyd.lloyd_statistics`` (assignment + per-cluster sums, counts
    and cost) against ONE scikit-learn Lloyd iteration on the same float64 data
    (n = 200 000, d = 32, k = 16 by default), median (and best) of 15 each, same process,
    the four taking turns. scikit-learn
    is timed three ways:

    * ``lloyd_iter_chunked_dense`` -- exactly one Lloyd iteration (assignment, new
      centers, cluster weights; no cost), called as ``KMeans.fit`` calls it (OpenMP
      threads = ``_openmp_effective_n_threads()``, BLAS limited to 1 thread). This is
      the strictest comparison and the one the target (ours / sklearn <= 1.5, on the
      medians) uses;
    * ``_kmeans_single_lloyd(max_iter=1)`` -- one iteration plus the E-step re-run and
      inertia it always adds (about two passes over X);
    * ``KMeans(init=C, n_init=1, max_iter=1, algorithm="lloyd", tol=0).fit(X)`` -- the
      public API, with its input validation.

    Each library runs with its own default threading (ours: NumPy's BLAS threads;
    scikit-learn: OpenMP threads). A second table repeats everything with ONE thread for
    both (threadpoolctl + ``n_threads=1``), which is less sensitive to other load.

(b) In-process runner. FedKMeans on an IID Gaussian mixture with 100 points per client,
    d = 8, k = 8, 5 rounds, no central reference, at 10, 100 and 1000 clients: median
    seconds per round (``result["rounds"][i]["seconds"]``), plus the whole run's wall time;
    beside it the in-process floor: ``bench/echo_app``'s minimal ClientApp driven through the
    same ``InProcessGrid`` with the same bytes per client (one Flower message each way and
    nothing else), timed in the same run. ``--clients 1000 10000`` for other counts. The
    start-up phases (data summary, initialization) are timed on the server alone: each
    round trip's seconds less the seconds the grid spent inside the devices' ClientApps
    (target: at most 1 s per 1000 devices). A second table splits a training round's
    time per client: inside the ClientApps (Flower's records and messages; the task run
    through the protocol and the kernel), the server's checks of each untrusted reply and
    the rest of the server and grid, beside the echo app's split.

(d) ``--population N`` (default 100 000 with ``--fraction 0.01``): FedKMeans with N
    in-process clients of which a ``fraction`` is sampled per round (100 points each,
    as (b)); median seconds of the rounds after the first (round 1 also gathers every
    unsampled device's statistics once, for ``server-memory``: shown apart) against a
    1000-client full-participation round of (b) measured in the same run (target: at
    most 1.5 x: a round's cost follows the sample, not the population), the start-up's
    server seconds per 1000 devices, and the devices contacted per round.

(e) ``--battery DIR`` (the public clustering suite, gagolews/clustering-data-v1): sipu/birch1
    (100 000 points, k = 100) split at random over ``--many-clients`` (1000) in-process
    clients, ``FederatedKMeans(k, random_state=0, fraction=0.1)`` as a notebook user calls it,
    against central ``KMeans(k, n_init=10)`` on the pooled points: CPU seconds of this
    process, one thread (target: at most 3x), and where the federated run's seconds go.

(c) ``--flwr``: the same runs through ``flwr run`` on a SuperLink started here
    (``flower-superlink --insecure --simulation``, private FLWR_HOME, free ports, stopped
    by PID afterwards) with 10 and 100 simulated SuperNodes (Ray); seconds per round from
    the run's result.json.

Usage::

    python bench/speed.py            # (a) and (b)
    python bench/speed.py --flwr     # plus (c)
    python bench/speed.py --quick    # n = 50 000, 10 and 100 clients
    python bench/speed.py --quick --out DIR   # also writes DIR/speed.md
    python bench/speed.py --skip-kernel --clients 1000 --population 100000   # plus (d)
    python bench/speed.py --skip-kernel --clients 1000 10000 --battery DIR   # plus (e)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    ROOT,
    SimulationSuperLink,
    add_bench_flags,
    interleaved_times,
    markdown_table,
    page_output,  # noqa: E402
    print_header,
    run_inprocess,
)

import numpy as np  # noqa: E402

TARGET = 1.5


# --------------------------------------------------------------------------- (a) kernel
def kernel_timings(n: int, d: int, k: int, repeats: int, single_thread: bool) -> dict[str, float]:
    from sklearn.cluster import KMeans
    from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense
    from sklearn.cluster._kmeans import _kmeans_single_lloyd
    from sklearn.utils._openmp_helpers import _openmp_effective_n_threads
    from threadpoolctl import threadpool_limits

    from fedcluster.lloyd import lloyd_statistics

    rng = np.random.default_rng(0)
    X = np.ascontiguousarray(rng.normal(size=(n, d)))
    centers = np.ascontiguousarray(X[rng.choice(n, size=k, replace=False)])
    weights = np.ones(n)
    n_threads = 1 if single_thread else _openmp_effective_n_threads()

    def ours():
        return lloyd_statistics(X, centers)

    def sk_iteration():
        centers_new = np.zeros_like(centers)
        weight_in_clusters = np.zeros(k)
        labels = np.full(n, -1, dtype=np.int32)
        center_shift = np.zeros(k)
        with threadpool_limits(limits=1, user_api="blas"):
            lloyd_iter_chunked_dense(
                X, weights, centers, centers_new, weight_in_clusters, labels, center_shift, n_threads
            )
        return centers_new, weight_in_clusters

    def sk_single():
        return _kmeans_single_lloyd(X, weights, centers.copy(), max_iter=1, tol=0.0, n_threads=n_threads)

    def sk_fit():
        return KMeans(n_clusters=k, init=centers, n_init=1, max_iter=1, algorithm="lloyd", tol=0).fit(X)

    # Same answer? (one Lloyd step: our sums / counts == scikit-learn's new centers)
    stats = ours()
    new_centers, sk_counts = sk_iteration()
    ours_centers = stats.centers(centers)
    agree = bool(np.allclose(ours_centers, new_centers, atol=1e-9) and np.allclose(stats.counts, sk_counts))

    timings = {}
    context = threadpool_limits(limits=1) if single_thread else None
    try:
        if context is not None:
            context.__enter__()
        functions = {"ours": ours, "sk_iteration": sk_iteration, "sk_single": sk_single, "sk_fit": sk_fit}
        for name, values in interleaved_times(functions, repeats).items():
            timings[name] = statistics.median(values)
            timings[name + "_best"] = min(values)
    finally:
        if context is not None:
            context.__exit__(None, None, None)
    timings["agree"] = agree
    timings["n_threads"] = n_threads
    return timings


def kernel_section(n: int, d: int, k: int, repeats: int) -> None:
    print(
        f"## (a) Lloyd statistics kernel vs one scikit-learn Lloyd iteration (n={n}, d={d}, k={k}, float64, median of "
        f"{repeats}, taking turns)\n"
    )
    rows = []
    for single in (False, True):
        t = kernel_timings(n, d, k, repeats, single)
        label = "1 thread" if single else "default threads"
        ratio = t["ours"] / t["sk_iteration"]
        rows.append(
            [
                label,
                f"{t['ours'] * 1e3:.1f}",
                f"{t['sk_iteration'] * 1e3:.1f}",
                f"{t['sk_single'] * 1e3:.1f}",
                f"{t['sk_fit'] * 1e3:.1f}",
                f"**{ratio:.2f}**" + ("" if ratio <= TARGET else " (target missed)"),
                f"{t['ours_best'] / t['sk_iteration_best']:.2f}",
                f"{t['ours'] / t['sk_single']:.2f}",
                f"{t['ours'] / t['sk_fit']:.2f}",
                "yes" if t["agree"] else "NO",
            ]
        )
    print(
        markdown_table(
            [
                "threads",
                "ours ms",
                "sk 1 iteration ms",
                "sk _kmeans_single_lloyd(1) ms",
                "sk KMeans.fit(1) ms",
                f"ours / sk iteration, medians (target ≤ {TARGET})",
                "the same, best times",
                "ours / sk single",
                "ours / sk fit",
                "same centers",
            ],
            rows,
        )
    )
    print()


# --------------------------------------------------------------------------- (b) in-process
def inprocess_config(clients: int, points_per_client: int, rounds: int) -> dict:
    return {
        "algorithm": "fedkmeans",
        "dataset": "gaussian-mixture",
        "partition": "iid",
        "num-points": clients * points_per_client,
        "dim": 8,
        "k": 8,
        "num-rounds": rounds,
        "n-init": 1,  # one center set per round: the echo floor's payload (the default trains up to 16 side by side)
        "reference": False,
    }


def echo_floor(clients: int, k: int, d: int, rounds: int) -> tuple[float, float]:
    """Median seconds per broadcast, and of them inside the ClientApps, of the minimal Flower app
    (``bench/echo_app``'s ClientApp,
    written as Flower's docs write one: ``Array(ndarray)`` in, ``Array(ndarray)`` out) driven
    through the same ``InProcessGrid`` with a FedKMeans round's payload: k x d floats down,
    k x d + k up. One Flower message per client and nothing else: the in-process floor."""
    sys.path.insert(0, str(ROOT / "bench" / "echo_app"))
    from echo_app.client import app as echo_app
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    from fedcluster.inprocess.grid import InProcessGrid, set_task_identity

    set_task_identity(run_id=1, node_id=InProcessGrid.SERVER_NODE_ID)
    grid = InProcessGrid(echo_app, {}, [{"partition-id": i} for i in range(clients)])
    down = np.random.default_rng(0).standard_normal((k, d))
    seconds, inside = [], []
    for _ in range(rounds):
        started, before = time.perf_counter(), grid.client_seconds
        messages = [
            Message(
                RecordDict(
                    {"arrays": ArrayRecord({"x": Array(down)}), "config": ConfigRecord({"up-floats": k * d + k})}
                ),
                dst_node_id=node,
                message_type="query",
            )
            for node in grid.get_node_ids()
        ]
        replies = list(grid.send_and_receive(messages))
        received = [reply.content.array_records["arrays"]["y0"].numpy() for reply in replies]
        seconds.append(time.perf_counter() - started)
        inside.append(grid.client_seconds - before)
        if len(received) != clients:
            raise RuntimeError(f"echo floor: {len(received)} replies from {clients} clients")
    return statistics.median(seconds), statistics.median(inside)


class DeviceSeconds:
    """Seconds the in-process grid spends inside the devices' ClientApps, per round trip
    (``InProcessGrid.client_seconds`` before and after each push), for every grid made
    while it is active: what is left of a round trip's seconds is the server's. Within
    them, per round trip: ``task_per_trip``, the seconds in ``fedcluster.device.run_task``
    (the request parsed through the protocol, the kernel, the reply checked; the rest of a
    ClientApp's seconds is Flower's records and messages), and ``checks_per_trip``, the
    server's seconds in ``fedcluster.server.reply_check`` (every reply checked as untrusted
    input, as the transport calls it: ``validate`` one reply, or ``read`` each reply and
    ``check_together`` a pull's replies for a strategy's batch check)."""

    def __enter__(self) -> "DeviceSeconds":
        import fedcluster.client.app as client
        from fedcluster.inprocess import grid
        import fedcluster.server.transport as transport

        self.per_trip: dict[int, float] = {}
        self.task_per_trip: dict[int, float] = {}
        self.checks_per_trip: dict[int, float] = {}
        checks = ("validate", "read", "check_together")
        self._saved = [
            (owner, name, getattr(owner, name))
            for owner, name in [(grid.InProcessGrid, "push_messages"), (client, "run_task")]
            + [(transport, check) for check in checks]
        ]
        (_, _, push), (_, _, run_task) = self._saved[:2]
        per_trip, task_per_trip, checks_per_trip, current = self.per_trip, self.task_per_trip, self.checks_per_trip, [0]

        def timed_push(grid_self, messages):
            before, trip = grid_self.client_seconds, grid_self.round_trips
            current[0] = trip + 1
            ids = push(grid_self, messages)
            per_trip[trip + 1] = per_trip.get(trip + 1, 0.0) + grid_self.client_seconds - before
            return ids

        def timed_task(*args, **kwargs):
            started = time.perf_counter()
            try:
                return run_task(*args, **kwargs)
            finally:
                task_per_trip[current[0]] = task_per_trip.get(current[0], 0.0) + time.perf_counter() - started

        def timed_check(check):
            def timed(members, *args, **kwargs):
                started = time.perf_counter()
                try:
                    return check(members, *args, **kwargs)
                finally:
                    trip = members.results.round_trips
                    checks_per_trip[trip] = checks_per_trip.get(trip, 0.0) + time.perf_counter() - started

            return timed

        timed_checks = [timed_check(original) for _, _, original in self._saved[2:]]
        for (owner, name, _), timed in zip(self._saved, [timed_push, timed_task] + timed_checks):
            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)

    def round_split(self, result: dict) -> dict[str, float]:
        """Median seconds per training round inside the ClientApps, in ``run_task``, and in
        the server's reply checks (each round's round trip, from its phases)."""
        trips: dict[int, set[int]] = {}
        for phase in result["phases"]:
            if phase["round"] is not None and phase.get("round_trip"):
                trips.setdefault(phase["round"], set()).add(phase["round_trip"])
        rounds = [trips.get(r["round"], set()) for r in result["rounds"]]
        return {
            name: statistics.median(sum(table.get(trip, 0.0) for trip in r) for r in rounds)
            for name, table in (
                ("clientapps", self.per_trip),
                ("tasks", self.task_per_trip),
                ("checks", self.checks_per_trip),
            )
        }

    def server_seconds(self, phases: list[dict], which) -> float:
        """Server seconds of the round trips of the phases ``which(phase)`` selects (phases
        sent together share one round trip: counted once)."""
        trips = {}
        for phase in phases:
            if which(phase) and phase.get("round_trip"):
                trips[phase["round_trip"]] = max(trips.get(phase["round_trip"], 0.0), phase["seconds"])
        return sum(seconds - self.per_trip.get(trip, 0.0) for trip, seconds in trips.items())


def many_clients_section(battery: Path, name: str, clients: int, fraction: float) -> None:
    """(e) A real dataset over many clients, as a notebook user runs it: ``FederatedKMeans(k,
    random_state=0, fraction=...)`` on a random split against central ``KMeans(k, n_init=10)``
    on the pooled points, CPU seconds of this process (one thread), and the phases' seconds."""
    import gzip

    from sklearn.cluster import KMeans

    import fedcluster

    with gzip.open(battery / f"{name}.data.gz", "rt") as f:
        X = np.loadtxt(f, ndmin=2)
    with gzip.open(battery / f"{name}.labels0.gz", "rt") as f:
        labels = np.loadtxt(f).astype(int)
    k = int(np.unique(labels[labels > 0]).size)
    parts = np.array_split(X[np.random.default_rng(0).permutation(X.shape[0])], clients)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):  # one thread for both (BLAS and OpenMP): CPU seconds without idle spinning
        started = time.process_time()
        central = KMeans(k, n_init=10, random_state=0).fit(X)
        central_s = time.process_time() - started
        started = time.process_time()
        model = fedcluster.FederatedKMeans(k, random_state=0, fraction=fraction).fit(parts)
        federated_s = time.process_time() - started
    cost = float(((X[:, None, :] - model.cluster_centers_[None]) ** 2).sum(-1).min(1).sum())
    trips: dict[int, tuple[str, float]] = {}  # a round trip's phases share its seconds: counted once
    for phase in model.result_["phases"]:
        where = "rounds" if phase["round"] is not None else phase["phase"]
        trips.setdefault(phase.get("round_trip") or -len(trips) - 1, (where, phase["seconds"]))
    phases: dict[str, float] = {}
    for where, seconds in trips.values():
        phases[where] = phases.get(where, 0.0) + seconds
    print(f"\n## (e) {name} over {clients} in-process clients, estimator defaults, fraction {fraction}\n")
    print(
        markdown_table(
            [
                "points",
                "k",
                "clients",
                "central KMeans(n_init=10) CPU s",
                "federated fit CPU s",
                "federated / central (target ≤ 3)",
                "rounds",
                "cost / central cost",
            ],
            [
                [
                    X.shape[0],
                    k,
                    clients,
                    f"{central_s:.1f}",
                    f"{federated_s:.1f}",
                    f"**{federated_s / central_s:.1f}**",
                    model.n_iter_,
                    f"{cost / central.inertia_:.4f}",
                ]
            ],
        )
    )
    print("\nWall seconds by round trip, named by its first phase (devices included):\n")
    print(markdown_table(["phase", "s"], [[p, f"{v:.1f}"] for p, v in phases.items()]))


def start_phase(phase: dict) -> bool:
    """A phase before the first round: the data summary and the initialization."""
    return phase["round"] is None and not phase["phase"].startswith("final")


def inprocess_section(client_counts: list[int], points_per_client: int, rounds: int) -> dict[int, dict]:
    print(
        f"## (b) In-process runner: FedKMeans, IID Gaussian mixture, {points_per_client} points/client, "
        f"d=8, k=8, {rounds} rounds\n",
        flush=True,
    )
    print(
        "Floor: a minimal Flower echo app (`bench/echo_app`'s ClientApp) through the same in-process grid, "
        "same bytes per client (64 floats down, 72 up), timed in the same run.\n",
        flush=True,
    )
    out = {}
    rows, split_rows = [], []
    for clients in client_counts:
        started = time.perf_counter()
        with DeviceSeconds() as devices:
            result = run_inprocess(inprocess_config(clients, points_per_client, rounds), clients)
        wall = time.perf_counter() - started
        per_round = statistics.median(r["seconds"] for r in result["rounds"])
        setup = sum(p["seconds"] for p in result["phases"] if p["round"] is None)
        start_server = devices.server_seconds(result["phases"], start_phase) / clients * 1000
        split = devices.round_split(result)
        floor, floor_inside = echo_floor(clients, 8, 8, rounds)
        out[clients] = {"per_round": per_round, "wall": wall, "floor": floor}
        rows.append(
            [
                clients,
                f"{per_round:.3f}",
                f"{per_round / clients * 1e3:.2f}",
                f"{floor / clients * 1e3:.2f}",
                f"{per_round / floor:.2f}",
                f"{setup:.2f}",
                f"**{start_server:.2f}**" + ("" if start_server <= 1.0 else " (target missed)"),
                f"{wall:.1f}",
            ]
        )
        ms = lambda seconds: f"{seconds / clients * 1e3:.3f}"  # noqa: E731
        split_rows.append(
            [
                clients,
                ms(per_round),
                ms(split["clientapps"] - split["tasks"]),
                ms(split["tasks"]),
                ms(split["checks"]),
                ms(per_round - split["clientapps"] - split["checks"]),
                ms(floor),
                ms(floor_inside),
                ms(floor - floor_inside),
            ]
        )
    print(
        markdown_table(
            [
                "clients",
                "s / round (median)",
                "ms / client / round",
                "echo floor ms / client",
                "ours / floor",
                "start + final phases s (devices included)",
                "start-up server s / 1000 devices (target ≤ 1)",
                "run wall s",
            ],
            rows,
        )
    )
    print()
    print(
        "Where a training round's time goes, ms per client (medians over the rounds): ours inside the "
        "ClientApps in Flower's records and messages and in `fedcluster.device.run_task` (the request parsed "
        "through the protocol, the Lloyd kernel on the device's points, its reply checked), the server's checks "
        "of each untrusted reply (`reply_check`: shapes, bounds, the node's declared partition, "
        "the statement checks) and the rest of the server and grid (messages built, sent, pulled, the "
        "update); the echo app's round split the same way.\n"
    )
    print(
        markdown_table(
            [
                "clients",
                "ours: round",
                "ours: ClientApps, Flower records",
                "ours: ClientApps, run_task",
                "ours: server reply checks",
                "ours: rest of server and grid",
                "echo: round",
                "echo: ClientApps",
                "echo: server and grid",
            ],
            split_rows,
        )
    )
    print()
    return out


# --------------------------------------------------------------------------- (d) population
def population_section(population: int, fraction: float, points_per_client: int, rounds: int, full: dict) -> None:
    sampled = max(1, round(population * fraction))
    print(
        f"## (d) {population} in-process clients, fraction {fraction:g} ({sampled} sampled per round), "
        f"{rounds} rounds, against the {full['clients']}-client full-participation run of (b)\n",
        flush=True,
    )
    config = inprocess_config(population, points_per_client, rounds)
    config["fraction"] = fraction
    started = time.perf_counter()
    with DeviceSeconds() as devices:
        result = run_inprocess(config, population)
    wall = time.perf_counter() - started
    later = [r for r in result["rounds"] if r["round"] > 1]
    per_round = statistics.median(r["seconds"] for r in later)
    contacted = sorted({r["sent"] for r in later})
    first = next(r for r in result["rounds"] if r["round"] == 1)
    start_server = devices.server_seconds(result["phases"], start_phase) / population * 1000
    ratio = per_round / full["per_round"]
    print(
        markdown_table(
            [
                "clients",
                "sampled / round",
                "devices contacted per round (rounds 2+)",
                "s / round, rounds 2+ (median)",
                f"{full['clients']} clients, full participation: s / round",
                "ratio (target ≤ 1.5)",
                "round 1 s (memory of every device)",
                "start-up server s / 1000 devices (target ≤ 1)",
                "run wall s",
            ],
            [
                [
                    population,
                    sampled,
                    ", ".join(map(str, contacted)),
                    f"{per_round:.3f}",
                    f"{full['per_round']:.3f}",
                    f"**{ratio:.2f}**" + ("" if ratio <= 1.5 else " (target missed)"),
                    f"{first['seconds']:.1f}",
                    f"**{start_server:.2f}**" + ("" if start_server <= 1.0 else " (target missed)"),
                    f"{wall:.0f}",
                ]
            ],
        )
    )
    print()


# --------------------------------------------------------------------------- (c) flwr run
def flwr_section(
    client_counts: list[int],
    points_per_client: int,
    rounds: int,
    inprocess: dict[int, dict],
    args_keep_home: bool = False,
) -> None:
    print("## (c) `flwr run` simulation (Ray) vs in-process, same runs\n", flush=True)
    rows = []
    with SimulationSuperLink(keep=args_keep_home) as link:
        print(f"SuperLink: `{' '.join(link.command)}` (FLWR_HOME={link.home})\n", flush=True)
        for clients in client_counts:
            output_dir = tempfile.mkdtemp(prefix=f"fedcluster-bench-flwr-{clients}-")
            cfg = inprocess_config(clients, points_per_client, rounds)
            cfg.update({"output-dir": output_dir, "min-nodes": clients})
            completed, wall = link.run(ROOT, cfg, clients)
            result_file = Path(output_dir) / "result.json"
            if completed.returncode != 0 or not result_file.exists():
                link.failed = True
                tail = (completed.stdout + completed.stderr)[-3000:]
                print(
                    f"\nflwr run failed (exit {completed.returncode}, result.json "
                    f"{'present' if result_file.exists() else 'missing'}):\n```\n{tail}\n```\n"
                )
                rows.append([clients, f"{inprocess[clients]['per_round']:.3f}", "failed", "–", "–", f"{wall:.0f}"])
                continue
            result = json.loads(result_file.read_text())
            shutil.rmtree(output_dir, ignore_errors=True)
            per_round = statistics.median(r["seconds"] for r in result["rounds"])
            rows.append(
                [
                    clients,
                    f"{inprocess[clients]['per_round']:.3f}",
                    f"{per_round:.3f}",
                    f"{per_round / inprocess[clients]['per_round']:.1f}x",
                    f"{result['wall_time_s']:.1f}",
                    f"{wall:.1f}",
                ]
            )
    print()
    print(
        markdown_table(
            [
                "supernodes",
                "in-process s / round",
                "flwr run s / round",
                "flwr / in-process",
                "ServerApp wall s (result.json)",
                "`flwr run` command wall s",
            ],
            rows,
        )
    )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="n=50 000 for (a), 10 and 100 clients for (b)")
    parser.add_argument("--flwr", action="store_true", help="also time `flwr run` simulation at 10 and 100 supernodes")
    parser.add_argument("--repeats", type=int, default=15, help="timings per function in (a)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per run in (b) and (c)")
    parser.add_argument("--points-per-client", type=int, default=100)
    parser.add_argument("--clients", type=int, nargs="+", help="client counts for (b) (default 10 100 1000)")
    parser.add_argument("--skip-kernel", action="store_true", help="skip (a)")
    parser.add_argument("--kernel-only", action="store_true", help="only (a)")
    parser.add_argument(
        "--keep-flwr-home", action="store_true", help="keep the temporary FLWR_HOME (SuperLink log) of (c)"
    )
    parser.add_argument(
        "--population",
        type=int,
        default=0,
        help="(d): this many in-process clients at --fraction (e.g. 100000); off by default",
    )
    parser.add_argument("--fraction", type=float, default=0.01, help="sampled fraction per round in (d)")
    parser.add_argument(
        "--battery",
        help="(e): the clustering suite's folder (gagolews/clustering-data-v1): sipu/birch1 over "
        "--many-clients clients with the estimator's defaults and fraction 0.1, against central k-means",
    )
    parser.add_argument("--many-clients", type=int, default=1000, help="clients of (e)")
    args = parser.parse_args(argv)

    with page_output(args.out, __file__):
        print_header("Speed", __doc__)
        if not args.skip_kernel:
            kernel_section(50_000 if args.quick else 200_000, 32, 16, args.repeats)
        if args.kernel_only:
            return 0
        client_counts = args.clients or ([10, 100] if args.quick else [10, 100, 1000])
        sampled = max(1, round(args.population * args.fraction))
        if args.population and sampled not in client_counts:
            client_counts = sorted(set(client_counts) | {sampled})
        inprocess = inprocess_section(client_counts, args.points_per_client, args.rounds)
        if args.population:
            population_section(
                args.population,
                args.fraction,
                args.points_per_client,
                args.rounds,
                dict(inprocess[sampled], clients=sampled),
            )
        if args.battery:
            many_clients_section(Path(args.battery), "sipu/birch1", args.many_clients, 0.1)
        if args.flwr:
            flwr_section(
                [c for c in client_counts if c <= 100],
                args.points_per_client,
                args.rounds,
                inprocess,
                args.keep_flwr_home,
            )
        return 0


if __name__ == "__main__":
    sys.exit(main())
