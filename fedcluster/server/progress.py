"""The progress line a person follows while a run goes: one per round, said in the
ServerApp's log when the round ends (:meth:`fedcluster.server.results.Results.end_round`),
whatever the runner — ``fedcluster-run`` prints it, ``flwr run --stream`` and ``flwr log``
show it, ``fedcluster-local-cluster`` and the Docker demo's job follow the run's log and
print it (:data:`PREFIX` marks it). An algorithm's own round line, where it has one, says
the rest."""

from __future__ import annotations

import math
from typing import Any

PREFIX = "[fedcluster] round"


def round_line(record: dict[str, Any]) -> str:
    """``[fedcluster] round 3: 3/3 replies, 7.21 s, sampled_cost_of_received 1.25``: the
    round's number, its valid replies of the messages sent (and the failures and nodes
    away, when any), its seconds and every cost the algorithm recorded for it."""
    line = f"{PREFIX} {record['round']}: {record['replies']}/{record['sent']} replies"
    if record.get("failures"):
        line += f" ({len(record['failures'])} failed)"
    if record.get("away"):
        line += f", {record['away']} away"
    line += f", {record['seconds']:.2f} s"
    costs = {key: value for key, value in record.items() if "cost" in key and _number(value)}
    return line + "".join(f", {key} {value:.6g}" for key, value in costs.items())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
