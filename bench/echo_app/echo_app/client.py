"""Reply to every query with `up-floats` float64 values (the size the server asks for)."""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def echo(message: Message, context: Context) -> Message:
    up = int(message.content.config_records["config"]["up-floats"])
    reply = RecordDict(
        {
            "arrays": ArrayRecord({"y": Array(np.zeros(up))}),
            "metrics": MetricRecord({"num-examples": 1}),
        }
    )
    return Message(reply, reply_to=message)
