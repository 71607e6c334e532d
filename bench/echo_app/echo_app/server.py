"""Broadcast `broadcasts` times to every node with `grid.send_and_receive`; time each one.

Writes ``{"seconds": [...], "replies": [...], "nodes": N}`` as JSON to the run-config path
`output`.
"""

import json
import time

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
                        "config": ConfigRecord({"up-floats": up}),
                    }
                ),
                dst_node_id=node,
                message_type="query",
            )
            for node in nodes
        ]
        got = list(grid.send_and_receive(messages))
        seconds.append(time.perf_counter() - started)
        replies.append(sum(1 for message in got if not message.has_error()))
    if config["output"]:
        with open(str(config["output"]), "w") as file:
            json.dump({"seconds": seconds, "replies": replies, "nodes": len(nodes)}, file)
