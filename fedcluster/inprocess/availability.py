"""Devices that come and go, for the in-process runner: which nodes are connected in each
round trip (the grid's ``push_messages`` calls, counted from 0).

A phone is asleep, a sensor out of range: such a node is missing from the grid's
``get_node_ids()`` (as Flower's SuperLink lists only online SuperNodes) and a message sent
to it comes back NODE_UNAVAILABLE. The server is expected to ask only nodes that are there.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Availability:
    """Which nodes are online in round trip ``trip``.

    Parameters
    ----------
    offline : probability that a node is offline in a round trip, independently for every
        (node, round trip), drawn from ``seed``: the same model gives the same schedule.
    leave : node id -> first round trip from which the node is gone for good.
    join : node id -> first round trip in which the node is connected (before it, the
        federation does not know it exists).
    away : node id -> round trips in which the node is offline, whatever the draws (any
        container of round trip numbers: ``range(1, 10**6, 2)`` is every other one).
    seed : seed of the offline draws.
    """

    offline: float = 0.0
    leave: Mapping[int, int] = field(default_factory=dict)
    join: Mapping[int, int] = field(default_factory=dict)
    away: Mapping[int, Container[int]] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.offline, (int, float)) and 0.0 <= self.offline < 1.0):
            raise ValueError(f"offline must be a probability in [0, 1), got {self.offline!r}")
        for name in ("leave", "join"):
            for node, trip in dict(getattr(self, name)).items():
                if not (isinstance(trip, (int, np.integer)) and not isinstance(trip, bool) and trip >= 0):
                    raise ValueError(f"{name}[{node!r}] must be a round trip number >= 0, got {trip!r}")
        for node, trips in dict(self.away).items():
            if not isinstance(trips, Container) or isinstance(trips, (str, bytes)):
                raise ValueError(f"away[{node!r}] must be a container of round trip numbers, got {trips!r}")
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")

    def online(self, node: int, trip: int) -> bool:
        """Whether ``node`` is connected in round trip ``trip``."""
        if trip < self.join.get(node, 0) or trip >= self.leave.get(node, math.inf) or trip in self.away.get(node, ()):
            return False
        if self.offline == 0.0:
            return True
        return bool(np.random.default_rng([self.seed, int(node), int(trip)]).random() >= self.offline)
