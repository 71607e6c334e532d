"""Reply to every query with `up-floats` float64 values (the size the server asks for), in
`up-arrays` arrays (1 unless the server asks for more: a fedcluster reply carries several; each
different, as Flower sends equal objects once)."""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def echo(message: Message, context: Context) -> Message:
    config = message.content.config_records["config"]
    up, parts = int(config["up-floats"]), int(config.get("up-arrays", 1))
    reply = RecordDict(
        {
            "arrays": ArrayRecord({f"y{i}": Array(np.full(up // parts, float(i))) for i in range(parts)}),
            "metrics": MetricRecord({"num-examples": 1}),
        }
    )
    return Message(reply, reply_to=message)
