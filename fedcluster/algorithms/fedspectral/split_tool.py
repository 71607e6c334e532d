"""``fedcluster-split-graph``: split an edge list over clients, one file per client.

Reads a SNAP-style ``u v`` edge list (directed or not; it is made undirected and simple),
deals every edge to ``r`` distinct random clients (the paper's "overlap": ``--overlap 0.4``
of ``--clients 5`` is ``r = 2``; or give ``--copies r`` directly) and writes
``client_000.txt``, ``client_001.txt``, ... into ``--out``. The same files serve

* a simulation: ``dataset='edge-dir' data-dir='OUT'`` (node i reads the i-th file), and
* a deployment: one SuperNode per file with ``--node-config 'data-path="OUT/client_000.txt"'``
  (pointed at the SuperLink's HTTP port, 8000 by default).

It prints the run config to use (``num-nodes``, ``edge-copies``, and ``k`` when ``--k`` gives
the number of clusters; without it the commands say ``k=K``: the edge list does not say how
many clusters you want) and both commands.

Example::

    fedcluster-fetch-graphs --out graphs   # once: the SNAP graphs, checksums verified
    fedcluster-split-graph graphs/email-Eu-core.txt --clients 5 --overlap 0.4 --k 10 --out /tmp/email5
    flwr run . --run-config "algorithm='fedspectral-plus' k=10 num-nodes=1005 edge-copies=2 \\
        dataset='edge-dir' data-dir='/tmp/email5'" --federation-config "num-supernodes=5"
"""

from __future__ import annotations

import sys

import numpy as np

from fedcluster.algorithms.fedspectral.config import NUM_NODES_MAX as MAX_NODES
from fedcluster.data import RUN_MARKER
from fedcluster.graph import (
    GraphError,
    canonical_edges,
    infer_num_nodes,
    load_edge_list,
    overlap_to_clients,
    split_edges,
    write_client_edge_files,
)
from fedcluster.tools.cli import ToolParser, UsageError, integer, number, output_folder, refuse


# flower-superlink (flwr 1.41, 1.42) serves the Fleet API (SuperNodes), the Control API (flwr run /
# ls / log) and the Runtime API (SuperExecs) on ONE HTTP port, 8000 unless --port says
# otherwise; the old gRPC ports 9091-9093 are gone. A SuperNode's own Runtime API (ClientAppIo)
# listens on 9094 by default, so SuperNodes sharing a host need one --port each.
SUPERLINK_PORT = 8000
SUPERNODE_PORT = 9094


# The most clients a split makes: one file and one SuperNode (or simulated node) each.
MAX_CLIENTS = 10_000


def build_parser() -> ToolParser:
    parser = ToolParser(
        prog="fedcluster-split-graph",
        description=(
            "Split a 'u v' edge list over clients (each edge on r random clients) and write "
            "client_XXX.txt files for a simulation (dataset='edge-dir') or a deployment (data-path)."
        ),
    )
    parser.add_argument("input", help="edge list: one 'u v' pair of non-negative integer node ids per line")
    parser.add_argument(
        "--clients", type=integer(1, MAX_CLIENTS), required=True, help=f"number of clients J, 1 to {MAX_CLIENTS}"
    )
    share = parser.add_mutually_exclusive_group()
    share.add_argument(
        "--overlap",
        type=number(0, 1),
        default=None,
        help=(
            "fraction of the clients holding each edge (the paper's overlap; r = max(1, round(overlap*J))); default 0.4"
        ),
    )
    share.add_argument(
        "--copies", type=integer(1), default=None, help="number of clients r holding each edge (instead of --overlap)"
    )
    parser.add_argument(
        "--out", required=True, help="output directory (created; existing client_*.txt files are refused)"
    )
    parser.add_argument(
        "--seed", type=integer(0, 2**32 - 1), default=0, help="seed of the random assignment (default 0)"
    )
    parser.add_argument(
        "--num-nodes",
        type=integer(0, MAX_NODES),
        default=0,
        help=f"global number of nodes, at most {MAX_NODES} (default: largest id + 1); ids must be below it",
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing client_*.txt files in --out")
    parser.add_argument(
        "--k",
        type=integer(1),
        default=None,
        help="number of clusters for the printed run commands (default: they say k=K, for you to choose)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.copies is not None and args.copies > args.clients:
        parser.error(f"argument --copies: must be between 1 and --clients={args.clients}, got {args.copies}")
    try:
        out = output_folder(args.out, "--out").resolve()
        ran = [name for name in (RUN_MARKER, "result.json") if (out / name).is_file()]
        if ran:  # a run's results folder never holds client data (nor would a run read it as such)
            raise UsageError(
                f"argument --out: {out} holds the results of a fedcluster run ({ran[0]}): give another folder"
            )
        copies = args.copies or overlap_to_clients(0.4 if args.overlap is None else args.overlap, args.clients)
        raw, edges, num_nodes = _graph(args)
        existing = sorted(out.glob("client_*.txt")) if out.is_dir() else []
        if existing and not args.force:
            raise UsageError(
                f"argument --out: {out} already holds {len(existing)} client_*.txt file(s); choose an empty directory "
                "or pass --force"
            )
        for path in existing:
            path.unlink()
        parts = split_edges(edges, args.clients, copies, args.seed)
        paths = write_client_edge_files(parts, out)
    except (GraphError, ValueError, OSError) as exc:
        return refuse("fedcluster-split-graph", exc)

    _say_what_to_run(args, out, raw, edges, num_nodes, copies, parts, paths)
    return 0


def _graph(args) -> tuple[np.ndarray, np.ndarray, int]:
    """The edge list as read, its undirected edges and the number of nodes, each checked."""
    raw = load_edge_list(args.input, args.num_nodes or None)
    num_nodes = args.num_nodes or infer_num_nodes(raw)
    if raw.shape[0] == 0:
        raise GraphError(f"{args.input} holds no edge ('u v' lines): nothing to split")
    if num_nodes > MAX_NODES:
        raise GraphError(
            f"{args.input} has node ids up to {num_nodes - 1}: a run takes at most {MAX_NODES} nodes "
            f"(run-config num-nodes); number the nodes 0 .. n-1"
        )
    if args.k is not None and not 1 <= args.k <= num_nodes:
        raise UsageError(f"argument --k: must be between 1 and the graph's {num_nodes} nodes, got {args.k}")
    edges = canonical_edges(raw)
    if edges.shape[0] == 0:
        raise GraphError(
            f"{args.input} holds no edge between two different nodes ({raw.shape[0]} lines, all "
            "self-loops): nothing to split"
        )
    return raw, edges, num_nodes


def _say_what_to_run(args, out, raw, edges, num_nodes, copies, parts, paths) -> None:
    """What was written, and the commands that run it (simulation and deployment)."""
    degrees = [len(set(part.ravel().tolist())) for part in parts]
    print(
        f"{args.input}: {num_nodes} nodes, {edges.shape[0]} undirected edges "
        f"({raw.shape[0]} lines; self-loops and duplicates removed)"
    )
    print(f"every edge on {copies} of {args.clients} clients (seed {args.seed}); wrote {len(paths)} files to {out}:")
    for path, part, nodes in zip(paths, parts, degrees):
        print(f"  {path.name}: {part.shape[0]} edges, {nodes} nodes with an edge")
    k = "K" if args.k is None else str(args.k)
    config = f"num-nodes={num_nodes} edge-copies={copies}"
    print("\nsimulation:")
    print(
        f"  flwr run . --run-config \"algorithm='fedspectral-plus' k={k} {config} dataset='edge-dir' "
        f'data-dir=\'{out}\'" --federation-config "num-supernodes={args.clients}"'
    )
    print(
        f"deployment (one SuperNode per file; SERVER:{SUPERLINK_PORT} is the SuperLink's one HTTP port, "
        "serving the Fleet, Control and Runtime APIs: flower-superlink --port):"
    )
    for index, path in enumerate(paths):
        print(
            f"  flower-supernode --superlink SERVER:{SUPERLINK_PORT} --root-certificates ca.crt "
            f"--auth-supernode-private-key supernode-{index + 1}.key --port {SUPERNODE_PORT + index} "
            f"--node-config 'data-path=\"{path}\"'"
        )
    print(
        f"  flwr run . my-superlink --run-config \"algorithm='fedspectral-plus' k={k} {config} "
        f'min-nodes={args.clients}"'
    )
    print(
        "  (certificates and keys: fedcluster-make-certs; one machine, all of it: fedcluster-local-cluster; "
        "each SuperNode on one host needs its own --port)"
    )
    if args.k is None:
        print(
            f"\nK: the number of clusters, 1 to {num_nodes}; the edge list does not say it: choose it "
            "(--k K fills it in; with --force to redo this split)"
        )


if __name__ == "__main__":
    sys.exit(main())
