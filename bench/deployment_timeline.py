"""A message's way through a SuperNode, stage by stage: Flower's echo app against ours.

The deployment of ``bench/deployment_vs_echo.py`` (one SuperLink with TLS and SuperNode
authentication, 3 SuperNodes on loopback, ``LocalCluster``): Flower's echo app with its
reply in one array, then in 4 arrays (as a FedKMeans training reply: centers, counts,
scatter, cost), then FedKMeans. SuperNode 1's log is read as it is written and each line
of a message's way is stamped when it appears (Flower's own lines carry no time):

- **pulled → ClientApp up**: ``Received successfully`` to ``Start `flwr-clientapp`
  process``: the SuperExec's task poll (every 1 s), a new process, Flower's imports;
- **ClientApp at work**: to ``Sending``: the ClientApp pulls the message and the FAB,
  unpacks and verifies the FAB, imports the app, answers, pushes the reply to the
  SuperNode, which looks for it every 0.5 s;
- **reply pushed**: ``Sending`` to ``Sent successfully``: the SuperNode pushes the reply's
  objects to the SuperLink one by one, waiting in steps of 0.5 s for each object the
  ClientApp has not yet handed over (every array is an object of its own);
- **idle until the next message**: ``Sent`` to the next ``Receiving``: the SuperNode's
  3 s sleep when it pulled nothing, the other nodes and the ServerApp's work.

Medians over the messages of each kind (FedKMeans: its training messages only).

``--quick``: 3 echo round trips each, FedKMeans 2 rounds.

Usage::

    python bench/deployment_timeline.py
    python bench/deployment_timeline.py --quick --out DIR   # also writes DIR/deployment_timeline.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header
from deployment_vs_echo import NODES, device_files, echo, run_app

TRIPS, ROUNDS, QUICK_TRIPS, QUICK_ROUNDS = 8, 6, 3, 2
MARKS = {  # a line's start (after Flower's level prefix) -> the mark it sets
    "Receiving:": "pulled",
    "Received successfully": "received",
    "Start `flwr-clientapp` process": "up",
    "Sending:": "sending",
    "Sent successfully": "sent",
}
STAGES = [
    ("pulled → ClientApp up", "received", "up"),
    ("ClientApp at work", "up", "sending"),
    ("reply pushed", "sending", "sent"),
]


class Stamped(threading.Thread):
    """Follows a log file as it grows; keeps ``(seconds, line)`` of each line that marks a
    message's way (read every 20 ms: the stamp is that late at most)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.done = path, [], threading.Event()

    def run(self) -> None:
        with open(self.path, errors="replace") as file:
            file.seek(0, 2)
            while not self.done.is_set():
                line = file.readline()
                if not line:
                    time.sleep(0.02)
                    continue
                text = line.split(":", 1)[-1].strip()
                if any(text.startswith(start) for start in MARKS):
                    self.lines.append((time.monotonic(), text))


def messages(lines: list[tuple[float, str]]) -> list[dict]:
    """Each message's marks (``type`` from its ``Receiving`` line) and the idle time before it."""
    out: list[dict] = []
    for stamp, text in lines:
        mark = next(MARKS[start] for start in MARKS if text.startswith(start))
        if mark == "pulled":
            out.append({"type": text.split()[1], "pulled": stamp})
        elif out:
            out[-1].setdefault(mark, stamp)
    for before, message in zip(out, out[1:]):
        if "sent" in before:
            message["idle"] = message["pulled"] - before["sent"]
    return out


def stage_row(name: str, found: list[dict]) -> list[str]:
    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "–"

    cells = [median([m[b] - m[a] for m in found if a in m and b in m]) for _, a, b in STAGES]
    return [name, str(len(found)), *cells, median([m["idle"] for m in found if "idle" in m])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick=f"{QUICK_TRIPS} echo round trips each, FedKMeans {QUICK_ROUNDS} rounds")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        measure(*((QUICK_TRIPS, QUICK_ROUNDS) if args.quick else (TRIPS, ROUNDS)))


def follow(cluster, stamped: Stamped, run) -> list[dict]:
    first = len(stamped.lines)
    run()
    return messages(stamped.lines[first:])


def measure(trips: int, rounds: int) -> None:
    from fedcluster.tools.local_cluster import LocalCluster

    print_header(
        f"A message's way through a SuperNode: echo against FedKMeans, {NODES} SuperNodes (TLS + auth, loopback)",
        __doc__,
    )
    with tempfile.TemporaryDirectory(prefix="fedcluster-timeline-") as tmp:
        tmp = Path(tmp)
        files = device_files(tmp / "data")
        with LocalCluster(tmp / "cluster", files, echo=lambda *_: None) as cluster:
            cluster.start()
            stamped = Stamped(cluster.logs / "supernode-1.log")
            stamped.start()
            one = follow(cluster, stamped, lambda: echo(cluster, tmp, trips, 0.1))
            four = follow(cluster, stamped, lambda: echo(cluster, tmp, trips, 0.1, arrays=4))
            config = f"num-rounds={rounds} reference=false min-nodes={NODES} output-dir='{tmp / 'out'}'"
            ended: list[tuple] = []
            ours = follow(cluster, stamped, lambda: ended.append(run_app(cluster, ROOT, config)))
            stamped.done.set()
    if ended[0][0] != "finished:completed":
        raise SystemExit(f"FedKMeans ended {ended[0][0]}:\n{ended[0][2]}")
    train = [m for m in ours if m["type"].endswith("fedkmeans_train")]
    rows = [
        stage_row("echo, 1 array per reply", one),
        stage_row("echo, 4 arrays per reply", four),
        stage_row("FedKMeans training (4 arrays per reply)", train),
    ]
    headers = ["messages", "n", *[name for name, _, _ in STAGES], "idle until the next message"]
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
