"""preset = "deployment": the measurement phases that are not part of any algorithm are not
sent; the training is the same. k-FED keeps its scoring round: the devices' choice among
the merge's groupings is its guard against a device that lies about its counts."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.config import ConfigError, with_defaults
from fedcluster.inprocess import run
from test_feddp import NODES, small

BASE = {"dataset": "gaussian-mixture", "num-points": 400, "dim": 3, "k": 3, "num-rounds": 3, "reference": False}


def test_fedkmeans_defaults_already_leave_unsampled_devices_alone(tmp_path):
    """FedKMeans' per-round measurement under partial participation is off by default
    (eval-every = 0): the deployment preset runs the same phases to the same centers."""
    config = {**BASE, "fraction": 0.5, "n-init": 1}
    plain = run({**config, "output-dir": str(tmp_path / "plain")}, num_nodes=8)
    deployed = run({**config, "preset": "deployment", "output-dir": str(tmp_path / "deployed")}, num_nodes=8)
    assert "evaluation" not in phases(plain) and phases(plain) == phases(deployed)
    np.testing.assert_array_equal(
        np.load(tmp_path / "plain" / "centers.npy"), np.load(tmp_path / "deployed" / "centers.npy")
    )
    measured = run({**config, "eval-every": 1, "output-dir": str(tmp_path / "measured")}, num_nodes=8)
    assert "evaluation" in phases(measured)


def phases(result):
    return {p["phase"] for p in result["phases"]}


def test_deployment_preset_keeps_kfeds_devices_choosing_among_its_groupings(tmp_path):
    config = {**BASE, "algorithm": "kfed"}
    plain = run({**config, "output-dir": str(tmp_path / "plain")}, num_nodes=8)
    deployed = run({**config, "preset": "deployment", "output-dir": str(tmp_path / "deployed")}, num_nodes=8)
    assert "evaluation" in phases(deployed) and phases(deployed) == phases(plain)
    assert deployed["kfed"]["candidates"]["scored"] >= 2
    np.testing.assert_array_equal(
        np.load(tmp_path / "plain" / "centers.npy"), np.load(tmp_path / "deployed" / "centers.npy")
    )
    # the same merge: without the evaluation round its cheapest candidate on the device
    # centers is the result; with it the devices' own points chose, never a costlier one
    from fedcluster.node_data import pooled_points
    from fedcluster.lloyd import kmeans_cost

    X, _ = pooled_points(plain["config"], 8)
    chosen, own = (kmeans_cost(X, np.load(tmp_path / name / "centers.npy")) for name in ("plain", "deployed"))
    assert chosen == pytest.approx(plain["final"]["total_cost"]) and chosen <= own
    np.testing.assert_array_equal(
        np.load(tmp_path / "plain" / "device_centers.npy"), np.load(tmp_path / "deployed" / "device_centers.npy")
    )


def test_deployment_preset_drops_feddp_exact_cost_report(tmp_path):
    plain = run(small(tmp_path / "plain"), num_nodes=NODES)
    deployed = run(small(tmp_path / "deployed", preset="deployment"), num_nodes=NODES)
    assert "final" in plain and "final" in plain["privacy"]["not_covered"]
    assert "final" not in deployed and "final" not in deployed["privacy"]["not_covered"]
    assert "final-evaluation" in phases(plain) and "final-evaluation" not in phases(deployed)


def test_preset_values_and_conflicts():
    config = with_defaults({"preset": "deployment"})
    assert (config["eval-every"], config["evaluate-cost"]) == (0, False)
    kfed = {"algorithm": "kfed", "preset": "deployment"}
    assert with_defaults(kfed)["kfed-evaluate"] is True  # k-FED's guard stays
    assert with_defaults({**kfed, "kfed-evaluate": False})["kfed-evaluate"] is False  # off only when asked
    with pytest.raises(ConfigError, match="eval-every = 5 conflicts with preset 'deployment'"):
        with_defaults({"preset": "deployment", "eval-every": 5})
    with pytest.raises(ConfigError, match="preset must be one of none, deployment"):
        with_defaults({"preset": "production"})
    assert with_defaults(config) == config  # a full config validates again unchanged
