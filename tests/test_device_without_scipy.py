"""The ClientApp and every kernel it imports must work on a device without SciPy or
scikit-learn (a phone-class SuperNode)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import sys, importlib.abc

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("scipy", "sklearn"):
                raise ImportError(f"{name} is not installed on this device")
            return None

    sys.meta_path.insert(0, Block())
    sys.path.insert(0, %(root)r)
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from inprocess.grid import set_task_identity
    from client_app.app import app, TASKS

    set_task_identity(1, 1)
    np.save(%(data)r, np.random.default_rng(0).normal(size=(50, 3)))
    context = Context(run_id=1, node_id=2, node_config={"data-path": %(data)r}, state=RecordDict(),
                      run_config={"k": 3})
    centers = np.random.default_rng(1).normal(size=(3, 3))
    calls = {
        "data_summary": {},
        "lloyd_stats": {"centers": centers},
        "score_candidates": {"candidates": centers[None]},
        "local_summary": {},
        "fedkmeans_train": {"centers": centers},
    }
    for task, arrays in calls.items():
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                              "config": ConfigRecord({"k": 3, "seed": 1})})
        message = Message(content, 2, "query." + task)
        message.metadata.__dict__["_message_id"] = "m-" + task
        reply = app(message, context)
        assert not reply.has_error(), (task, reply.error)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "sklearn"))
    assert not loaded, loaded
    print("OK", len(TASKS), "tasks registered")
    """
)


def test_client_app_runs_without_scipy_and_sklearn(tmp_path):
    script = SCRIPT % {"root": str(ROOT), "data": str(tmp_path / "device.npy")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout
