"""The start of a run: waiting for its nodes (or, resumed, the nodes its first attempt
started with). Into the run's :class:`~fedcluster.server.membership.Membership`; whether
they cover the data files: :mod:`fedcluster.server.coverage`."""

from __future__ import annotations

import time
from logging import INFO

from flwr.common.logger import log

from .membership import Membership
from .messages import FederationError


def wait_for_nodes(members: Membership, name: str) -> list[int]:
    """Wait until ``min-nodes`` nodes are connected (or, when 0, until the count has
    been stable for ``node-settle-s`` seconds), at most ``node-wait-s`` seconds."""
    journal = members.results.journal
    if journal.replaying:  # a resumed run: the nodes its first attempt started with
        members.nodes = journal.node_ids(lambda: ())
        log(INFO, "[fedcluster] resuming %s: %d node(s) at the start, replayed", name, len(members.nodes))
        return members.nodes
    expected = members.config.min_nodes
    deadline = time.monotonic() + members.config.node_wait_s
    settle = members.config.node_settle_s
    last_count, stable_since = -1, time.monotonic()
    while True:
        ids = sorted(int(i) for i in members.grid.get_node_ids())
        now = time.monotonic()
        if len(ids) != last_count:
            last_count, stable_since = len(ids), now
            if ids:
                log(INFO, "[fedcluster] %d node(s) connected", len(ids))
        if expected > 0 and len(ids) >= expected:
            break
        if expected <= 0 and ids and now - stable_since >= settle:
            break
        if now > deadline:
            if expected > 0:
                raise FederationError(
                    f"only {len(ids)} of the {expected} expected nodes (run-config "
                    f"min-nodes) connected within node-wait-s={members.config['node-wait-s']} s"
                )
            if not ids:
                raise FederationError(f"no node connected within node-wait-s={members.config['node-wait-s']} s")
            break
        time.sleep(0.2 if expected > 0 else min(0.2, settle / 4 + 1e-3))
    members.nodes = journal.node_ids(lambda: ids)
    log(INFO, "[fedcluster] starting %s with %d node(s)", name, len(ids))
    return ids
