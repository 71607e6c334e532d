"""The ClientApp and every kernel it imports must work on a device without SciPy or
scikit-learn (a phone-class SuperNode)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
    from client_app.app import app
    from fedcluster import protocol

    set_task_identity(1, 1)
    np.save(%(data)r, np.random.default_rng(0).normal(size=(50, 3)))
    context = Context(run_id=1, node_id=2, node_config={"data-path": %(data)r}, state=RecordDict(),
                      run_config={"k": 3})
    # Every point-data task of the protocol table, with a request built from its declaration.
    sizes = {"k": 3, "d": 3, "m": 2, "r": 2, "s": 5, "q": 5}
    required = {"k": 3, "k-prime": 2, "clip-norm": 10.0, "outer": 1}
    rng = np.random.default_rng(1)
    ran = []
    for spec in protocol.TASKS.values():
        if any(a.startswith("fedspectral") for a in spec.used_by) or not spec.used_by:
            continue  # graph tasks need an edge list
        arrays = {a.name: rng.normal(size=tuple(sizes[s] for s in a.shape)) for a in spec.request if not a.optional}
        arrays = {k: np.abs(v) if next(a for a in spec.request if a.name == k).nonnegative else v for k, v in arrays.items()}
        config = {p.name: required[p.name] for p in spec.config if p.name in required}
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                              "config": ConfigRecord(config)})
        message = Message(content, 2, spec.message_type)
        message.metadata.__dict__["_message_id"] = "m-" + spec.name
        reply = app(message, context)
        assert not reply.has_error(), (spec.name, reply.error)
        assert set(reply.content.array_records["arrays"]) >= {a.name for a in spec.reply if not a.optional and not a.when}
        ran.append(spec.name)
    assert len(ran) >= 9, ran
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "sklearn"))
    assert not loaded, loaded
    print("OK", len(ran), "tasks ran")
    """
)


def test_client_app_runs_without_scipy_and_sklearn(tmp_path):
    script = SCRIPT % {"root": str(ROOT), "data": str(tmp_path / "device.npy")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout
