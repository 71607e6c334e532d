"""Robust aggregation for FedKMeans and DA-UFL: 10 devices, one hostile, ``aggregation``
mean vs trimmed-mean vs median; k-FED's robust options (``kfed-weighting``,
``kfed-min-devices``) against the same kind of device.

The hostile device (node 1000) lies as far as the declared-size bounds let it
(``fedcluster/bounds.py``; replies beyond them are dropped anyway):

- ``moved center``: in every training reply it puts ALL its points on one cluster and
  moves that cluster's center to a corner of its own bounding box: the corner farthest
  from its nearest received center, and that center's cluster (counts add up to its
  declared n; the center lies in its box; scatter and the reported cost are those
  of all its points sitting at that corner, so every check of the reply holds);
- ``lying evaluation``: in the final evaluation it reports the smallest cost its own
  sums and counts allow (it hides its points' scatter);
- ``wrong cluster``: the lie that stays consistent with everything it declared, its sum and
  scatter included: in every training reply it puts ALL its real points in the
  cluster of the received center farthest from their mean (true statistics of a false
  partition; the cost of the received centers under that partition);
- ``cell edge``: the strongest false partition of its real points that every per-reply
  check lets through (its partitions may still contradict each other): for the cluster and the number q where it pulls
  hardest (q × the shift of the
  mean), its q points farthest towards the box corner away from that cluster's center go
  to that cluster, as long as their mean stays in the center's Voronoi cell (every other
  point to its nearest center);
- ``cell edge, same evaluation``: ``cell edge`` that also states its false partition in
  the final evaluation (the counts, sums and cost of the cell-edge labels for the centers
  evaluated), so its evaluation never contradicts its training;
- ``other data`` (every algorithm): the device answers every message honestly, but for other
  points than it holds: two point masses with its real count, per-feature sum and sum of
  squares (μ ± s∘σ with count-balancing scales), the sign pattern s that a central k-means
  of the other devices' points and these costs most on the real points. Its replies are
  those of an honest device holding those points, so no check of replies can tell: this is
  the ceiling of what the checks can promise (data poisoning). Its last column is what the
  promise "as good as pooling the data" gives here: scikit-learn's KMeans (n_init = 10) on
  every device's data pooled, the fake points in place of the device's own, scored on the
  true points;
- DA-UFL, ``moved means``: in every inner step it sends, for every cluster, the gradient
  ``W_k (m_k − corner)`` with its honest weight W_k: it claims its points of every cluster
  sit at the corner of its box farthest from the center (a finite gradient with honest
  weights); ``wrong cluster``: all its real points in the cluster of the center farthest
  from their mean (the gradient and weight of that false partition).
- k-FED (one message per device: its first reply is its declaration), ``far center``: the
  local center with the most points is moved away from the data, to its box's farthest
  corner from the data's mean plus twice the box's width (nothing bounds it);
  ``inflated counts``: its counts × 10⁶ (and its ``num-examples`` with them) and every
  center moved halfway to that corner. k-FED runs with ``k-prime = 5`` (= k: a device here
  may hold every component, so the paper's ⌈√k⌉ would not fit honest devices either).
- FedDP-KMeans (data-point level, ``epsilon = inf`` to isolate the attack from the noise,
  2 Lloyd rounds; server data: 200 other points of the same mixture), ``claimed points``:
  it claims 1000 × its points in every reply with every statistic scaled to match, and in
  the Lloyd rounds puts all of them at Δ times the unit vector towards its box's corner
  farthest from the data's mean (inside the clipping ball). ``max-device-points`` off vs
  2 × the median device; and the same at ``epsilon = 1``, where the cap's price shows: it
  doubles every sensitivity, so the noise.

Data: a Gaussian mixture (d = 5, k = 5, 2000 points, separation 8 σ) split IID or by
Dirichlet(0.5) labels over 10 devices; FedKMeans run-config defaults otherwise
(20 rounds, every device every round); DA-UFL with ``algorithm = "da-ufl"`` and its
defaults (SOM weights) on the same split. Reported: the TRUE k-means cost per point of the
final centers on all 2000 points over the best scikit-learn KMeans (n_init = 10) cost,
median and worst over the seeds, and for the lying evaluation the reported cost over
the true one.

Usage::

    python bench/robust_aggregation.py            # 10 seeds
    python bench/robust_aggregation.py --quick    # 3 seeds
    python bench/robust_aggregation.py --quick --out DIR   # also writes DIR/robust_aggregation.md
    python bench/robust_aggregation.py --algorithms da-ufl
    python bench/robust_aggregation.py --algorithms kfed
    python bench/robust_aggregation.py --algorithms feddp-kmeans
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import add_bench_flags, markdown_table, page_output, print_header, quiet_flower

from fedcluster.data import gaussian_mixture, partition_dirichlet, partition_iid
from fedcluster.lloyd import kmeans_cost

HOSTILE = 1000
AGGREGATION = {method: {"aggregation": method} for method in ("mean", "trimmed-mean", "median")}
METHODS = {
    "fedkmeans": AGGREGATION,
    "da-ufl": AGGREGATION,
    "kfed": {
        "count": {"kfed-weighting": "count", "k-prime": 5},
        "capped-count": {"kfed-weighting": "capped-count", "k-prime": 5},
        "capped-count, min-devices 2": {"kfed-weighting": "capped-count", "kfed-min-devices": 2, "k-prime": 5},
    },
    "feddp-kmeans": {
        "no cap": {"max-device-points": 0},
        "max-device-points 2x median": {"max-device-points": "2x"},
        "no cap, ε = 1": {"max-device-points": 0, "epsilon": 1.0},
        "max-device-points 2x median, ε = 1": {"max-device-points": "2x", "epsilon": 1.0},
    },
}
FEDDP = {"epsilon": float("inf"), "lloyd-rounds": 2}
ATTACKS = {
    "fedkmeans": (
        "honest",
        "moved center",
        "lying evaluation",
        "wrong cluster",
        "cell edge",
        "cell edge, same evaluation",
        "other data",
    ),
    "da-ufl": ("honest", "moved means", "wrong cluster", "other data"),
    "kfed": ("honest", "far center", "inflated counts", "other data"),
    "feddp-kmeans": ("honest", "claimed points", "other data"),
}


def other_data(X: np.ndarray, parts: list[np.ndarray], k: int, seed: int) -> np.ndarray:
    """The points ``other data`` answers for (see the docstring): n₁ = ⌊n/2⌋ at μ + s∘σ√(n₂/n₁)
    and n₂ = n − n₁ at μ − s∘σ√(n₁/n₂), which have the device's count, sum and scatter
    per feature; s the sign pattern (first sign +) of the costliest central result."""
    import itertools

    from sklearn.cluster import KMeans

    own = X[parts[0]]
    n, d = own.shape
    if n < 2:
        return own
    n1, n2 = n // 2, n - n // 2
    mu, sigma = own.mean(0), own.std(0)
    rest = np.concatenate([X[p] for p in parts[1:]])
    worst = (-1.0, own)
    for signs in itertools.product((1.0, -1.0), repeat=d - 1):
        s = np.array((1.0,) + signs)
        fake = np.concatenate(
            [
                np.repeat((mu + s * sigma * np.sqrt(n2 / n1))[None], n1, axis=0),
                np.repeat((mu - s * sigma * np.sqrt(n1 / n2))[None], n2, axis=0),
            ]
        )
        centers = KMeans(k, n_init=3, random_state=seed).fit(np.concatenate([rest, fake])).cluster_centers_
        worst = max(worst, (kmeans_cost(X, centers), fake), key=lambda w: w[0])
    return worst[1]


def cell_edge_partition(own: np.ndarray, sent: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The labels of ``cell edge``: every point to its nearest center, except the q points
    farthest towards the far corner from center j, which go to j, for the (j, q) of the
    largest q·|mean − c_j| whose mean stays nearest c_j."""
    labels = ((own[:, None] - sent[None]) ** 2).sum(-1).argmin(1)
    best, choice = 0.0, None
    for j, c in enumerate(sent):
        corner = np.where(np.abs(low - c) > np.abs(high - c), low, high)
        order = np.argsort(-(own - c) @ (corner - c))
        q = np.arange(1, len(own) + 1)
        means = np.cumsum(own[order], axis=0) / q[:, None]
        inside = ((means[:, None] - sent[None]) ** 2).sum(-1).argmin(1) == j
        pull = np.where(inside, q * np.sqrt(((means - c) ** 2).sum(1)), 0.0)
        if pull.max() > best:
            best, choice = float(pull.max()), (j, order[: int(np.argmax(pull)) + 1])
    if choice is not None:
        labels[choice[1]] = choice[0]
    return labels


def attack_hook(attack: str, box: tuple[np.ndarray, np.ndarray], data_mean: np.ndarray, own: np.ndarray):
    from flwr.app import Array

    low, high = box
    own_mean = own.mean(axis=0)
    away = np.where(np.abs(low - data_mean) > np.abs(high - data_mean), low, high)  # box corner far from the data
    away = away + 2.0 * (high - low) * np.sign(away - data_mean)

    def hook(node, message, reply):
        if node != HOSTILE or reply.has_error():
            return reply
        kind = message.metadata.message_type
        record = reply.content.array_records["arrays"]
        if attack == "moved center" and kind == "train.fedkmeans_train":
            # every center set trained side by side (n-init) is attacked the same way
            sent_sets = message.content.array_records["arrays"]["centers"].numpy()
            all_centers, all_counts = record["centers"].numpy().copy(), record["counts"].numpy().copy()
            all_scatter, all_cost = np.zeros_like(all_centers), np.zeros(sent_sets.shape[0])
            corners = np.array(np.meshgrid(*zip(low, high))).reshape(len(low), -1).T
            for s, sent in enumerate(sent_sets):
                centers, counts = all_centers[s], all_counts[s]
                # the corner of its box farthest from ITS nearest received center, and that
                # center's cluster: all its points "sit" there, consistent with every bound
                gaps = ((corners[:, None, :] - sent[None]) ** 2).sum(-1)
                far = int(np.argmax(gaps.min(1)))
                corner, j = corners[far], int(np.argmin(gaps[far]))
                centers[j] = corner
                total = counts.sum()
                counts[:] = 0
                counts[j] = total
                all_scatter[s, j] = 0.0  # every point at the corner: no scatter
                # and the cost of the received centers its forged statistics imply (else the
                # train_cost_mismatch check drops the reply): all its points at the corner
                all_cost[s] = total * float(np.sum((corner - sent[j]) ** 2))
            record["centers"], record["counts"], record["scatter"] = (
                Array(all_centers),
                Array(all_counts),
                Array(all_scatter),
            )
            record["cost"] = Array(all_cost)
        if attack == "wrong cluster" and kind == "train.fedkmeans_train":
            sent_sets = message.content.array_records["arrays"]["centers"].numpy()
            counts, centers = np.zeros(sent_sets.shape[:2]), sent_sets.copy()
            scatter, cost = np.zeros_like(sent_sets), np.zeros(sent_sets.shape[0])
            for s, sent in enumerate(sent_sets):  # full batch, client-lr 1: the new center is the mean
                j = int(np.argmax(((sent - own_mean) ** 2).sum(1)))
                counts[s, j], centers[s, j], scatter[s, j] = len(own), own_mean, ((own - own_mean) ** 2).sum(0)
                cost[s] = float(((own - sent[j]) ** 2).sum())
            record["centers"], record["counts"], record["scatter"], record["cost"] = (
                Array(centers),
                Array(counts),
                Array(scatter),
                Array(cost),
            )
        if attack.startswith("cell edge") and kind == "train.fedkmeans_train":
            sent_sets = message.content.array_records["arrays"]["centers"].numpy()
            counts, centers = np.zeros(sent_sets.shape[:2]), sent_sets.copy()
            scatter, cost = np.zeros_like(sent_sets), np.zeros(sent_sets.shape[0])
            for s, sent in enumerate(sent_sets):  # full batch, client-lr 1: the new center is the mean
                labels = cell_edge_partition(own, sent, low, high)
                for j in np.unique(labels):
                    mine = own[labels == j]
                    counts[s, j], centers[s, j], scatter[s, j] = (
                        len(mine),
                        mine.mean(0),
                        ((mine - mine.mean(0)) ** 2).sum(0),
                    )
                cost[s] = float(((own - sent[labels]) ** 2).sum())
            record["centers"], record["counts"], record["scatter"], record["cost"] = (
                Array(centers),
                Array(counts),
                Array(scatter),
                Array(cost),
            )
        if attack == "cell edge, same evaluation" and kind == "query.lloyd_stats":
            sent = message.content.array_records["arrays"]["centers"].numpy()
            labels = cell_edge_partition(own, sent, low, high)
            counts = np.bincount(labels, minlength=len(sent)).astype(np.float64)
            sums = np.zeros_like(sent)
            np.add.at(sums, labels, own)
            record["counts"], record["sums"] = Array(counts), Array(sums)
            record["cost"] = Array(np.array([float(((own - sent[labels]) ** 2).sum())]))
        if attack == "wrong cluster" and kind == "train.daufl_step":
            sent = message.content.array_records["arrays"]["centers"].numpy()
            weight = record["weight"].numpy()
            point = weight.sum() / len(own)  # uniform weights: every point weighs the same
            j = int(np.argmax(((sent - own_mean) ** 2).sum(1)))
            new_weight = np.zeros_like(weight)
            new_weight[j] = weight.sum()
            gradient = new_weight[:, None] * sent
            gradient[j] -= point * own.sum(0)
            record["gradient"], record["weight"] = Array(gradient), Array(new_weight)
        if attack == "moved means" and kind == "train.daufl_step":
            sent = message.content.array_records["arrays"]["centers"].numpy()
            weight = record["weight"].numpy()
            corner = np.where(np.abs(low - sent) > np.abs(high - sent), low, high)  # (k, d)
            record["gradient"] = Array(weight[:, None] * (sent - corner))
        if attack == "lying evaluation" and kind == "query.lloyd_stats":
            sent = message.content.array_records["arrays"]["centers"].numpy()
            sums, counts = record["sums"].numpy(), record["counts"].numpy()
            used = counts > 0
            floor = np.sum(np.sum((sums[used] - counts[used, None] * sent[used]) ** 2, axis=1) / counts[used])
            record["cost"] = Array(np.array([floor]))
        if attack in ("far center", "inflated counts") and kind == "query.kfed_local":
            centers, counts = record["centers"].numpy().copy(), record["counts"].numpy().copy()
            if attack == "far center":
                centers[int(np.argmax(counts))] = away
            else:
                centers = 0.5 * (centers + away)
                counts = counts * 1e6
            record["centers"], record["counts"] = Array(centers), Array(counts)
            reply.content.metric_records["metrics"]["num-examples"] = int(counts.sum())
        if attack == "claimed points" and kind.startswith("query.feddp_"):
            metrics = reply.content.metric_records["metrics"]
            n = int(metrics["num-examples"])
            metrics["num-examples"] = n * 1000
            for name in list(record.keys()):
                record[name] = Array(record[name].numpy() * 1000)
            if kind == "query.feddp_lloyd":
                radius = float(message.content.config_records["config"]["clip-norm"])
                direction = (away - data_mean) / np.linalg.norm(away - data_mean)
                counts = np.zeros_like(record["counts"].numpy())
                counts[0] = n * 1000
                record["counts"], record["sums"] = Array(counts), Array(counts[:, None] * radius * direction[None])
        return reply

    return hook


def one(algorithm: str, partition: str, seed: int, method: str, attack: str) -> dict:
    """One run: true cost over central, reported over true cost, replies dropped."""
    from sklearn.cluster import KMeans

    from fedcluster.inprocess import run

    X, labels = gaussian_mixture(2000, 5, 5, seed, separation=8.0)
    parts = partition_iid(len(X), 10, seed) if partition == "IID" else partition_dirichlet(labels, 10, 0.5, seed)
    central = KMeans(5, n_init=10, random_state=seed).fit(X).inertia_ / len(X)
    hostile_points = X[parts[0]]
    box = (hostile_points.min(0), hostile_points.max(0))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        folder.mkdir()
        fake = other_data(X, parts, 5, seed) if attack == "other data" else None
        for i, index in enumerate(parts):
            np.save(folder / f"client_{i:03d}.npy", fake if fake is not None and i == 0 else X[index])
        config = {
            "algorithm": algorithm,
            "k": 5,
            "dataset": "npy-dir",
            "data-dir": str(folder),
            "seed": seed,
            "reference": False,
            **METHODS[algorithm][method],
            "output-dir": str(Path(tmp) / "out"),
        }
        if algorithm == "feddp-kmeans":
            server = gaussian_mixture(200, 5, 5, seed, separation=8.0)[0]  # same means (same seed), other points
            np.save(Path(tmp) / "server.npy", server)
            config.update(
                {
                    **FEDDP,
                    **METHODS[algorithm][method],
                    "server-data": str(Path(tmp) / "server.npy"),
                    "noise-seed": seed,
                }
            )
            if config["max-device-points"] == "2x":
                config["max-device-points"] = int(2 * np.median([len(index) for index in parts]))
        result = run(config, num_nodes=10, reply_hook=attack_hook(attack, box, X.mean(0), hostile_points))
        centers = np.load(Path(tmp) / "out" / "centers.npy")
    true = kmeans_cost(X, centers) / len(X)
    dropped = sum(len(p["failures"]) for p in result["phases"])
    pooled = None
    if fake is not None:  # what pooling every device's data (the fake points included) would have given
        poisoned = np.concatenate([fake] + [X[index] for index in parts[1:]])
        pooled = (
            kmeans_cost(X, KMeans(5, n_init=10, random_state=seed).fit(poisoned).cluster_centers_) / len(X) / central
        )
    return {"ratio": true / central, "reported": result["final"]["cost"] / true, "dropped": dropped, "pooled": pooled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 seeds")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--algorithms",
        default="fedkmeans,da-ufl,kfed,feddp-kmeans",
        help="comma-separated: fedkmeans, da-ufl, kfed, feddp-kmeans",
    )
    args = parser.parse_args()
    seeds = range(3 if args.quick else args.seeds)
    with page_output(args.out, __file__):
        quiet_flower()
        print_header("Robust aggregation: 10 devices, one hostile", __doc__)
        for algorithm in args.algorithms.split(","):
            print(f"## {algorithm}\n")
            rows = []
            for partition in ("IID", "Dirichlet(0.5)"):
                for attack in ATTACKS[algorithm]:
                    for method in METHODS[algorithm]:
                        runs = [one(algorithm, partition, s, method, attack) for s in seeds]
                        ratios = [r["ratio"] for r in runs]
                        reported = [r["reported"] for r in runs]
                        pooled = [r["pooled"] for r in runs if r["pooled"] is not None]
                        rows.append(
                            [
                                partition,
                                attack,
                                method,
                                f"{np.median(ratios):.4f}",
                                f"{np.max(ratios):.4f}",
                                f"{np.median(reported):.4f}",
                                f"{np.mean([r['dropped'] for r in runs]):.1f}",
                                f"{np.median(pooled):.4f} / {np.max(pooled):.4f}" if pooled else "–",
                            ]
                        )
            print(
                markdown_table(
                    [
                        "data",
                        "hostile device",
                        "aggregation" if algorithm in ("fedkmeans", "da-ufl") else "options",
                        "true cost / central (median)",
                        "worst",
                        "reported / true cost (median)",
                        "replies dropped / run",
                        "central k-means of the pooled data, fake points included / central (median / worst)",
                    ],
                    rows,
                )
            )
            print(f"\n{len(seeds)} seeds; true cost = k-means cost of the final centers on all 2000 points.\n")


if __name__ == "__main__":
    main()
