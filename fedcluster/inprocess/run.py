"""Run a whole federation in this process: ``run(...)`` from Python, ``fedcluster-run`` from
the shell. Same ServerApp, same ClientApp, same results folder as ``flwr run``."""

from __future__ import annotations

import itertools
import time
import json
import sys
from pathlib import Path
from typing import Any

import fedcluster.registry as registry

from .availability import Availability
from .grid import InProcessGrid, ReplyHook, set_task_identity

_RUN_IDS = itertools.count(int(time.time() * 1000) % 10**9)


def run(
    run_config: dict[str, Any] | None = None,
    num_nodes: int = 10,
    *,
    node_configs: list[dict[str, Any]] | None = None,
    reply_hook: ReplyHook | None = None,
    labels: bool = False,
    node_ids: list[int] | None = None,
    availability: Availability | None = None,
    journal: bool = True,
) -> dict[str, Any]:
    """Run the configured algorithm over ``num_nodes`` in-process nodes; return result.json.

    ``node_configs`` overrides the default simulation node configs
    (``partition-id``/``num-partitions``), e.g. with ``data-path`` per node. ``labels``:
    also return ``result["labels"]``, one array per node of its points' nearest final
    centers, computed here from each node's own data as its device would (never part of
    ``result.json``). ``node_ids``: the nodes' ids (default 1000, 1001, ...; Flower's are
    random per run, and the result does not depend on them). ``availability``: which nodes
    are connected in each round trip (:class:`fedcluster.inprocess.availability.Availability`: offline
    at random, leaving for good, joining late); by default every node, always.
    ``journal``: keep the run's journal in its folder, so that ``resume = true`` can
    continue it (False: a run nobody will resume, as an estimator's).
    """
    from fedcluster.client.app import app as client_app
    from fedcluster.server.algorithms import validated_config
    from fedcluster.server.app import run_algorithm

    config = validated_config(run_config or {})
    if node_configs is None:
        _check_data_dir(config, num_nodes)  # every node reads it here, in this process: checked before any is made
        node_configs = [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
    _check_here(config, len(node_configs))
    run_id = next(_RUN_IDS)
    set_task_identity(run_id=run_id, node_id=InProcessGrid.SERVER_NODE_ID)
    grid = InProcessGrid(
        client_app,
        config,
        node_configs,
        run_id=run_id,
        reply_hook=reply_hook,
        node_ids=node_ids,
        availability=availability,
    )
    # the server starts with the nodes connected at the start; the others join when they come
    config = config.replace(min_nodes=config.min_nodes or len(list(grid.get_node_ids())))
    result = run_algorithm(grid, config, journal=journal)
    if labels:
        result["labels"] = node_labels(result, node_configs)
    return result


def _check_data_dir(config, num_nodes: int) -> None:
    """The folder of per-node files a folder dataset reads, one node per file, or
    ConfigError naming data-dir (and both numbers)."""
    from fedcluster.config import ConfigError
    from fedcluster.data import FOLDER_DATASETS, DataError, folder_files

    if config["dataset"] in FOLDER_DATASETS:
        try:
            files = folder_files(config["dataset"], config["data-dir"])
        except DataError as exc:
            raise ConfigError(f"run-config data-dir: {exc}") from None
        if len(files) != num_nodes:
            raise ConfigError(
                f"run-config data-dir: {len(files)} client files in {config['data-dir']} but {num_nodes} nodes: "
                f"run with --num-nodes {len(files)} (one node per file)"
            )


def _check_here(config, nodes: int) -> None:
    """What only this process can check before the run: the nodes there will be, the server's file."""
    from fedcluster.config import ConfigError
    from fedcluster.data import DataError, load_points

    if config["min-nodes"] > nodes:
        raise ConfigError(f"run-config min-nodes = {config['min-nodes']} can never be met: this run has {nodes} nodes")
    if config["server-data"]:
        try:
            load_points(config["server-data"])
        except DataError as exc:
            raise ConfigError(f"run-config server-data: {exc}") from None


def _data_paths_problem(config, paths: list[str]) -> str | None:
    """Why the files a run's nodes would read (one node each) cannot all take part: a file
    none of them could load, data of another kind than the algorithm takes (points or an edge
    list), or point files of different dimensions. Each is named. The run itself would drop
    such a node and go on with the others: here the user gave the files, so it never starts."""
    from fedcluster.data import DataError
    from fedcluster.graph import GraphError
    from fedcluster.node_data import device_data

    graph = registry.algorithm(config["algorithm"]).data == "graph"
    dimensions: dict[int, str] = {}
    for path in paths:
        if not Path(path).is_file():
            return f"{path} is not a file"
        try:
            data = device_data(dict(config), {"data-path": str(Path(path).resolve())})
        except (DataError, GraphError, ValueError, OSError) as exc:
            text = " ".join(str(exc).split())
            return text if str(Path(path).resolve()) in text else f"{path}: {text}"
        if graph != (data.edges is not None):
            wanted = "an edge list (.txt)" if graph else "points (.npy, .csv or .parquet)"
            return f"{path} holds {data.describe()}; {config['algorithm']} takes {wanted}"
        if data.points is not None:
            dimensions.setdefault(int(data.points.shape[1]), path)
            if len(dimensions) > 1:
                (d1, first), (d2, other) = list(dimensions.items())[:2]
                return f"{other} has points of dimension {d2}, {first} of dimension {d1}: every node's must agree"
    return None


def node_labels(result: dict[str, Any], node_configs: list[dict[str, Any]]) -> list:
    """Every node's nearest-center labels of its own points (center-based runs)."""
    import numpy as np

    from fedcluster.node_data import device_data
    from fedcluster.lloyd import nearest
    from fedcluster.scaling import Scaling

    centers_file = Path(result["output_dir"]) / "centers.npy"
    if not centers_file.is_file():
        raise ValueError(f"labels=True needs a center-based run; {result['algorithm']} wrote no centers.npy")
    centers = np.load(centers_file)
    scaling = Scaling.of_run(result)  # a standardized run: nearest in the standardized space
    assign = scaling.nearest if scaling is not None else nearest
    return [assign(device_data(result["config"], dict(node)).require_points(), centers) for node in node_configs]


# The most nodes the command runs: every node is a Flower Context in this one process (the
# largest in-process populations the benchmarks run are 10^5).
NUM_NODES_MAX = 100_000


def main(argv: list[str] | None = None) -> int:
    from fedcluster.config import ConfigError, parse_run_config
    from fedcluster.tools.cli import ToolParser, integer, refuse
    from fedcluster.server.algorithms import validated_config

    parser = ToolParser(
        prog="fedcluster-run",
        description="Run a fedcluster federation in one process (no Ray, no network).",
    )
    parser.add_argument(
        "--num-nodes",
        type=integer(1, NUM_NODES_MAX),
        default=10,
        help=f"number of simulated nodes, 1 to {NUM_NODES_MAX} (default 10)",
    )
    parser.add_argument("--run-config", default="", help="overrides, Flower syntax: \"k=8 dataset='npy-dir'\"")
    parser.add_argument(
        "--data-path",
        action="append",
        default=[],
        help="one node per file (repeatable): the node's data-path, as in a deployment",
    )
    args = parser.parse_args(argv)
    try:
        overrides = parse_run_config(args.run_config)
        validated_config(overrides)  # every key checked before any node is made
    except ConfigError as exc:
        parser.error(f"argument --run-config: {' '.join(str(exc).split())}")
    node_configs = [{"data-path": str(Path(p).resolve())} for p in args.data_path] or None
    if node_configs:
        reason = _data_paths_problem(validated_config(overrides), args.data_path)
        if reason:
            parser.error(f"argument --data-path: {reason}")
    try:
        result = run(overrides, args.num_nodes, node_configs=node_configs)
    except ConfigError as exc:  # what only the run can check before any node (its data-dir, min-nodes, ...)
        parser.error(f"argument --run-config: {' '.join(str(exc).split())}")
    except Exception as exc:
        return refuse("fedcluster-run", f"{type(exc).__name__}: {exc}")
    print(json.dumps({"output_dir": result["output_dir"], "final": result.get("final")}, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
