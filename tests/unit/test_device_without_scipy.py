"""The ClientApp and every kernel it imports must work on a device without SciPy or
scikit-learn (a phone-class SuperNode)."""

import subprocess
import sys

import numpy as np
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A device without SciPy or scikit-learn: importing either raises ImportError.
BLOCK = textwrap.dedent(
    """
    import sys, importlib.abc

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("scipy", "sklearn"):
                raise ImportError(f"{name} is not installed on this device")
            return None
    """
)

SCRIPT = BLOCK + textwrap.dedent(
    """
    sys.meta_path.insert(0, Block())
    sys.path.insert(0, %(root)r)
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from fedcluster.inprocess.grid import set_task_identity
    from fedcluster.client.app import app
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
        if spec.name.startswith(("secagg_", "secure_")):
            continue  # a secure-aggregation stage needs the earlier stages' state (tests/protocol/test_secagg.py)
        arrays = {a.name: rng.normal(size=tuple(sizes[s] for s in a.shape)) for a in spec.request if not a.optional}
        arrays = {k: np.abs(v) if next(a for a in spec.request if a.name == k).nonnegative else v for k, v in
        arrays.items()}
        config = {p.name: required[p.name] for p in spec.config if p.name in required}
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                              "config": ConfigRecord(config)})
        message = Message(content, 2, spec.message_type)
        message.metadata.__dict__["_message_id"] = "m-" + spec.name
        reply = app(message, context)
        assert not reply.has_error(), (spec.name, reply.error)
        assert set(reply.content.array_records["arrays"]) >= {a.name for a in spec.reply if not a.optional and not
        a.when}
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


GRAPH_SCRIPT = BLOCK + textwrap.dedent(
    """
    import json

    if %(block)r:
        sys.meta_path.insert(0, Block())
    sys.path.insert(0, %(root)r)
    import numpy as np
    from fedcluster.device import DeviceData
    from fedcluster.algorithms.fedspectral.device import local_spectral_labels, power_step
    from fedcluster.graph import AdjacencyOperator

    rng = np.random.default_rng(0)
    n = 60
    edges = np.unique(np.sort(rng.integers(0, n, size=(300, 2)), axis=1), axis=0)
    edges = edges[edges[:, 0] != edges[:, 1]]
    data = DeviceData(edges=edges, source="t")
    Q = rng.standard_normal((n, 5))
    degrees = np.bincount(edges.ravel(), minlength=n).astype(float) * 2
    out = {
        "sparse": AdjacencyOperator(edges, n).sparse,
        "global": power_step(data, {"Q": Q, "degrees": degrees},
                             {"num-nodes": n, "iters": 1, "normalization": "global", "edge-weight":
                             0.5})[0]["Q"].tolist(),
        "local": power_step(data, {"Q": Q}, {"num-nodes": n, "iters": 3, "normalization": "local",
                                              "edge-weight": 1.0})[0]["Q"].tolist(),
        "labels": local_spectral_labels(data, {}, {"num-nodes": n, "k": 3, "seed": 1, "block": 0,
                                                    "max-iters": 500, "tol": 1e-8})[0]["labels"].tolist(),
    }
    try:
        AdjacencyOperator(edges, n, sparse=True)
        out["forced"] = "built"
    except ImportError as error:
        out["forced"] = str(error)
    print(json.dumps(out))
    """
)


def test_graph_kernels_without_scipy_give_the_scipy_path_products():
    """FedSpectral's device products go through scipy.sparse where it is installed; a device
    without SciPy takes the NumPy path and must send the same products (to rounding) and the
    same local labels."""
    import json

    runs = {}
    for block in (True, False):
        script = GRAPH_SCRIPT % {"root": str(ROOT), "block": block}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[block] = json.loads(done.stdout.strip().splitlines()[-1])
    without, with_scipy = runs[True], runs[False]
    assert without["sparse"] is False and with_scipy["sparse"] is True
    assert "not installed" in without["forced"] and with_scipy["forced"] == "built"
    for key in ("global", "local"):
        np.testing.assert_allclose(np.array(without[key]), np.array(with_scipy[key]), rtol=0, atol=1e-12)
    assert without["labels"] == with_scipy["labels"]
