"""Going live again after a resume: the nodes connected now matched to the run's own.

A resumed run replays its journal with the node ids of its first attempt (the strategy's
own); Flower gives every node a new id in every run. When the journal ends, the nodes
connected now are asked who they are (task ``identify``: the partition every reply states,
nothing of the data) and each is matched to the node of the run that stated the same
partition. A node of the run that does not come back is away, as any node can be; a node
that states a partition nobody in the run had joins as a newcomer, checked as every
newcomer is; so do all the nodes that state one partition (which of them is the run's node
cannot be told). A run whose nodes stated no partition cannot be resumed:
nothing else tells the nodes apart without asking for their data.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log

import fedcluster.protocol as protocol

from .messages import incoming, to_array_record


def match_nodes(members: Any, results: Any) -> None:
    """Map the grid's nodes now to the run's own (``results.journal.map_nodes``; ``members``:
    the run's :class:`~fedcluster.server.membership.Membership`)."""
    journal, grid, config = results.journal, members.grid, members.config
    own = [node for node in members.nodes if node not in members.excluded]
    unnamed = [node for node in own if members.partitions.get(node) is None]
    if unnamed:
        results.warn(
            f"resume: {len(unnamed)} node(s) of the run never stated a partition-id, so no node connected "
            f"now can be told to be one of them: they count as away (give every SuperNode a distinct "
            f"partition-id in its node config)"
        )
    live = _wait(grid, len(own), config)
    by_partition = {members.partitions[node]: node for node in own if node not in unnamed}
    stated = _identify(grid, live, config)
    claimants: dict[int, list[int]] = {}
    for node, partition in stated.items():
        if partition is not None:
            claimants.setdefault(partition, []).append(node)
    for partition, nodes in claimants.items():
        if len(nodes) > 1 and partition in by_partition:  # which is the run's cannot be told: neither takes its place
            results.warn(
                f"resume: nodes {', '.join(map(str, sorted(nodes)))} all state partition-id {partition}: none "
                f"is taken for the run's node {by_partition[partition]}, each joins as a newcomer"
            )
    live_of: dict[int, int] = {}
    newcomers: list[int] = []
    for node, partition in stated.items():
        match = by_partition.get(partition) if partition is not None and len(claimants[partition]) == 1 else None
        if match is not None:
            live_of[match] = node
        else:
            newcomers.append(node)
    journal.map_nodes(live_of, newcomers)
    missing = len(own) - len(live_of)
    log(
        INFO,
        "[fedcluster] resume: %d of the run's %d node(s) are back%s%s",
        len(live_of),
        len(own),
        f", {missing} away" if missing else "",
        f", {len(newcomers)} new" if newcomers else "",
    )
    results.resumes.append(
        {
            "exchange": journal.position,
            "nodes_back": len(live_of),
            "nodes_of_run": len(own),
            "newcomers": len(newcomers),
        }
    )


def _wait(grid: Any, expected: int, config: Any) -> list[int]:
    """The grid's nodes once ``expected`` are connected, or once their count has been
    stable for ``node-settle-s`` (at most ``node-wait-s``)."""
    deadline = time.monotonic() + config.node_wait_s
    last, since = -1, time.monotonic()
    while True:
        ids = sorted(int(node) for node in grid.get_node_ids())
        now = time.monotonic()
        if len(ids) != last:
            last, since = len(ids), now
        if len(ids) >= expected or (ids and now - since >= config.node_settle_s) or now > deadline:
            return ids
        time.sleep(0.2)


def _identify(grid: Any, nodes: list[int], config: Any) -> dict[int, int | None]:
    """Each node's stated partition (None: no valid answer)."""
    spec = protocol.task("identify")
    messages = [
        Message(
            RecordDict({protocol.ARRAYS: to_array_record({}), protocol.CONFIG: ConfigRecord({})}),
            node,
            spec.message_type,
            group_id="resume",
        )
        for node in nodes
    ]
    ids = list(grid.push_messages(messages)) if messages else []
    pending = {mid: node for mid, node in zip(ids, nodes) if mid}
    stated: dict[int, int | None] = {node: None for node in nodes}
    deadline = time.monotonic() + config.round_timeout
    while pending and time.monotonic() < deadline:
        for message in grid.pull_messages(list(pending)):
            node = pending.pop(message.metadata.reply_to_message_id, None)
            if node is None:
                continue
            for reply in incoming(message, node, 1):
                if (
                    reply.error is None and reply.arrays is not None and len(reply.arrays) == 0
                ):  # identify sends no array
                    stated[node] = protocol.partition_of(reply.metrics or {})
                else:
                    log(
                        WARNING,
                        "[fedcluster] resume: node %s did not say who it is: %s",
                        node,
                        reply.error or "invalid",
                    )
        if pending:
            time.sleep(0.1)
    return stated
