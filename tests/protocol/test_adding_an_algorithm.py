"""docs/DESIGN.md's "Adding an algorithm", followed as a newcomer would: a package under
fedcluster/algorithms with its config, protocol, device and strategy, and one line in
PACKAGES. Nothing else changes, and the new algorithm then runs federated in-process: its
run-config key validated, its task in the protocol table and checked on replies, its kernel
on the devices, its strategy on the server, its result written; its own estimator (the
package's estimator.py) is ``fedcluster.<Class>``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = {
    "__init__.py": """
        from fedcluster.algorithm import Algorithm

        ALGORITHMS = (
            Algorithm(
                "toy-mean", __name__, "Toy mean", strategy="ToyMean", uses=("data_summary",),
                estimator="ToyMeanEstimator", estimator_keys=(("scale", "toy-scale"),),
            ),
        )
    """,
    "config.py": """
        from fedcluster.checks import Interval
        from fedcluster.keys import Key, Section

        RUN_CONFIG = Section(
            "toy-mean", (Key("toy-scale", 1.0, "multiplies the mean", allowed=Interval(float, 0, 10)),),
            algorithms=("toy-mean",),
        )
    """,
    "protocol.py": """
        from fedcluster.task import ArrayField, Param, Task

        TASKS = (
            Task("toy_sum", "query", "the sum of the device's points, scaled",
                 config=(Param("scale", float, 1.0, doc="a factor"),),
                 reply=(ArrayField("sum", ("d",), "the scaled sum"),), summable=True),
        )
    """,
    "device.py": """
        from fedcluster.kernel import device_task
        from fedcluster.task import named

        from .protocol import TASKS


        @device_task(named(TASKS, "toy_sum"))
        def toy_sum(data, arrays, config):
            return {"sum": config["scale"] * data.points.sum(axis=0)}, {"num-examples": int(data.points.shape[0])}
    """,
    "strategy.py": """
        from fedcluster.server.base import FederatedStrategy, sum_arrays, sum_metric


        class ToyMean(FederatedStrategy):
            name = "toy-mean"

            def run(self):
                self.discover_dimension()
                self.begin_round(1)
                replies = self.broadcast("toy_sum", self.active_nodes, config={"scale": self.config["toy-scale"]},
                                         phase="toy")
                points = sum_metric(replies)
                self.end_round(devices=len(replies))
                return {"centers": sum_arrays(replies, "sum")[None, :] / points, "final": {"num_points": int(points)}}
    """,
    "estimator.py": """
        import numpy as np

        from fedcluster.estimators import _client_arrays, _InProcess, _keep


        class ToyMeanEstimator(_InProcess):
            def __init__(self, scale=None, *, random_state=None, run_config=None, output_dir=None, verbose=False):
                _keep(self, locals())

            def fit(self, clients, y=None):
                arrays = _client_arrays(clients)
                writers = [lambda folder, i, a=a: np.save(folder / f"client_{i:05d}.npy", a) for a in arrays]
                config = self._run_config("toy-mean", 1, ("scale",))
                _, loaded = self._federate(config, "npy-dir", writers, ("centers",))
                self.center_ = loaded["centers"][0]
                return self
    """,
}

SCRIPT = """
import json, sys
import fedcluster.algorithms as algorithms
algorithms.__path__.append(sys.argv[1])
algorithms.PACKAGES = (*algorithms.PACKAGES, "toy_mean")
import numpy as np
from fedcluster import protocol, registry
from fedcluster.config import ConfigError, with_defaults
from fedcluster.inprocess import run
assert "toy-mean" in registry.names() and "toy_sum" in protocol.TASKS and "secure_toy_sum" in protocol.TASKS
try:
    with_defaults({"algorithm": "toy-mean", "toy-scale": 99.0})
    refused = None
except ConfigError as exc:
    refused = str(exc)
result = run({"algorithm": "toy-mean", "toy-scale": 2.0, "k": 1, "dataset": "npy-dir", "data-dir": sys.argv[2],
              "output-dir": sys.argv[3], "reference": False}, num_nodes=3)
import glob
import fedcluster
clients = [np.load(f) for f in sorted(glob.glob(sys.argv[2] + "/*.npy"))]
estimated = fedcluster.ToyMeanEstimator(scale=2.0).fit(clients).center_
print(json.dumps({"refused": refused, "centers": np.load(sys.argv[3] + "/centers.npy").tolist(),
                  "algorithm": result["algorithm"], "points": result["final"]["num_points"],
                  "listed": "ToyMeanEstimator" in dir(fedcluster), "estimated": estimated.tolist()}))
"""


def test_a_package_and_one_line_make_a_new_algorithm_that_runs(tmp_path):
    package = tmp_path / "algorithms" / "toy_mean"
    package.mkdir(parents=True)
    for name, text in PACKAGE.items():
        (package / name).write_text(textwrap.dedent(text))
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    parts = [rng.normal(loc=i, size=(20 + 5 * i, 2)) for i in range(3)]
    for i, points in enumerate(parts):
        np.save(data / f"client_{i}.npy", points)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "algorithms"), str(data), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["algorithm"] == "toy-mean" and found["points"] == sum(len(p) for p in parts)
    assert "toy-scale" in found["refused"]  # its own key, validated by its own range
    np.testing.assert_allclose(found["centers"], [2.0 * np.concatenate(parts).mean(axis=0)], rtol=1e-12)
    # its own estimator, in its package: fedcluster exports it through the registry
    assert found["listed"]
    np.testing.assert_allclose(found["estimated"], 2.0 * np.concatenate(parts).mean(axis=0), rtol=1e-12)
