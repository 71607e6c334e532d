"""Broadcast `broadcasts` times to every node with `grid.send_and_receive`; time each one.

`up-arrays`: how many arrays each reply carries `up-floats` in (Flower moves every array
as an object of its own). `pull-pause` > 0: push the messages, then pull the replies every `pull-pause` seconds
instead (Flower's deployment grid sleeps 3 s between two pulls in `send_and_receive`; the
fedcluster ServerApp pulls as often as this), for the floor of the transport itself.

Writes ``{"seconds": [...], "replies": [...], "nodes": N}`` as JSON to the run-config path
`output`.
"""

import json
import time
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    broadcasts, down, up = int(config["broadcasts"]), int(config["down-floats"]), int(config["up-floats"])
    min_nodes = int(config["min-nodes"])
    deadline = time.monotonic() + 600
    while len(list(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {min_nodes} nodes after 600 s")
        time.sleep(0.2)
    nodes = sorted(grid.get_node_ids())
    seconds, replies = [], []
    for _ in range(broadcasts):
        started = time.perf_counter()
        messages = [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord({"x": Array(np.zeros(down))}),
                        "config": ConfigRecord({"up-floats": up, "up-arrays": int(config.get("up-arrays", 1))}),
                    }
                ),
                dst_node_id=node,
                message_type="query",
            )
            for node in nodes
        ]
        got = list(exchange(grid, messages, float(config.get("pull-pause", 0.0))))
        seconds.append(time.perf_counter() - started)
        replies.append(sum(1 for message in got if not message.has_error()))
    if config["output"]:
        with open(str(config["output"]), "w") as file:
            json.dump({"seconds": seconds, "replies": replies, "nodes": len(nodes)}, file)


def exchange(grid: Grid, messages: list[Message], pause: float) -> Iterable[Message]:
    if pause <= 0:
        return grid.send_and_receive(messages)
    waiting, got = set(grid.push_messages(messages)), []
    while waiting:
        replies = list(grid.pull_messages(waiting))
        got += replies
        waiting -= {reply.metadata.reply_to_message_id for reply in replies}
        if waiting:
            time.sleep(pause)
    return got
