"""Which devices' data a run covers: at the start, a simulation's nodes against its client
files (one node per file, or the run stops naming both numbers); at the end, how many
devices' data the result covers out of how many, and which files no node read or a node
refused (the summary's first line, ``coverage`` in result.json)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fedcluster.data import FOLDER_DATASETS, DataError, folder_files
from fedcluster.node_data import count_mismatch

from .membership import Membership
from .messages import FederationError


def visible_files(config: Any) -> list[Path] | None:
    """The client files of a folder dataset when this process can read its folder (a
    simulation on one machine), else None."""
    if config.dataset not in FOLDER_DATASETS or not config.data_dir or not Path(config.data_dir).is_dir():
        return None
    return folder_files(config.dataset, config.data_dir)


def check_data_coverage(members: Membership) -> None:
    """One node per client file. Nodes counted when their number settled (``min-nodes = 0``,
    a simulation) must be as many as the files; more nodes than files never fit; a graph
    needs every client's edges. With ``min-nodes`` set, nodes may still join: the result's
    coverage names any file no node read."""
    config = members.config
    try:
        files = visible_files(config)
    except DataError as exc:
        raise FederationError(f"run-config data-dir: {exc}") from None
    nodes = len(members.nodes)
    if files is None or nodes == len(files):
        return
    if config.min_nodes == 0 or nodes > len(files) or config.dataset == "edge-dir":
        raise FederationError(count_mismatch(len(files), f"client files in {config.data_dir}", nodes))


def coverage(members: Membership) -> dict[str, Any]:
    """How many devices' data the result covers, out of how many, and why the others not:
    the nodes refused (their exclusion reasons) and, for a folder dataset the server can
    read, the files no node stated it read (by the partitions the nodes' replies stated)."""
    record = members.record()
    covered = record["active"] - len(record["away_at_end"])
    refused = [f"{node}: {reason}" for node, reason in record["excluded"].items()]
    refused += [f"{node}: its data summary never arrived ({reason})" for node, reason in record["deferred"].items()]
    total = record["connected"] + len(record["deferred"])
    unread: list[str] = []
    try:
        files = visible_files(members.config)
    except DataError:
        files = None
    if files is not None:
        total = max(total, len(files))
        stated = [members.partitions.get(node) for node in members.active_nodes]
        if None not in stated:
            named = " ".join(refused)
            unread = [f.name for i, f in enumerate(files) if i not in set(stated) and str(f) not in named]
    return {"devices": covered, "of": total, "refused": refused, "unread_files": unread}


def coverage_line(cover: dict[str, Any]) -> str:
    """``result covers 7 of 8 devices' data (1 refused: <reason>)``: a node whose data could
    not be read is refused, any other left the run; then the files no node read."""
    line = f"result covers {cover['devices']} of {cover['of']} devices' data"
    refused = [reason for reason in cover["refused"] if _DATA_ERRORS.search(reason)]
    left = [reason for reason in cover["refused"] if not _DATA_ERRORS.search(reason)]
    notes = [f"{len(group)} {what}: {_shown(group)}" for group, what in ((refused, "refused"), (left, "left the run"))]
    notes = [note for note, group in zip(notes, (refused, left)) if group]
    if cover["unread_files"]:
        names = ", ".join(cover["unread_files"][:5]) + (" …" if len(cover["unread_files"]) > 5 else "")
        notes.append(f"{len(cover['unread_files'])} file(s) read by no node: {names}")
    return line + (f" ({'; '.join(notes)})" if notes else "")


_DATA_ERRORS = re.compile(r"\b(DataError|GraphError)\b")


def _shown(reasons: list[str]) -> str:
    return "; ".join(_short(reason) for reason in reasons[:3]) + (" …" if len(reasons) > 3 else "")


def _short(reason: str, limit: int = 200) -> str:
    """One line of an exclusion reason, without the task wrapper the device put around it."""
    text = " ".join(reason.split())
    for marker in ("DataError: ", "GraphError: "):
        if marker in text:
            node = text.split(":", 1)[0]
            text = f"{node}: {text.split(marker, 1)[1]}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
