"""At either privacy level, result.json holds no exact statistic of device data except the
parts listed under privacy.not_covered, each with its reason: every number in the file is
checked against an allow-list of public, configured, noisy or timing values."""

from __future__ import annotations

import re

import pytest

from fedcluster.inprocess import run
from test_feddp import NODES, small

# Numbers that are not computed from device data, or only through the noise.
ALLOWED = [
    r"config\..*",  # the run config
    r"communication\.bytes_(up|down)",
    r"wall_time_s",  # sizes of fixed-shape arrays, time
    r"communication\.round_trips",  # protocol steps
    r"(phases|rounds)\[\]\.(sent|away|replies|round|round_trip|seconds|bytes_up|bytes_down)",  # participation, time
    r"nodes\.(connected|active)",
    r"coverage\.(devices|of)",  # participation: how many devices' data the result covers
    r"rounds\[\]\.(noisy_counts\[\]|center_shift|kept_centers)",  # computed from noisy aggregates
    r"init\.(components|server_points|server_points_kept|noisy_counts\[\])",  # server data, noisy
    r"init\.(candidates|server_candidates|cube_half_width|radius_a)",  # histogram start: public sizes, Δ/√d
    r"init\.(candidates_kept|filled)",  # post-processing of the noisy histogram
    r"privacy\..*",  # the accounting itself
]


def numeric_paths(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numeric_paths(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for item in value:
            yield from numeric_paths(item, path + "[]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


@pytest.mark.parametrize(
    "init", ["feddp", "auto"]
)  # auto at data-point level: the histogram of server-point candidates
@pytest.mark.parametrize("level", ["data-point", "client"])
@pytest.mark.parametrize("margin", [1.0, 0.9])
def test_every_number_in_result_json_is_public_noisy_or_listed_as_not_covered(tmp_path, init, level, margin):
    result = run(
        small(tmp_path, **{"privacy-level": level, "lloyd-rounds": 1, "noise-seed": 0, "margin": margin, "init": init}),
        num_nodes=NODES,
    )
    histogram = init == "auto" and level == "data-point"
    assert (result["init"]["method"] == "histogram") == histogram
    margin = margin if not histogram else 1.0  # the margin filter is FedDP-Init's step 3
    listed = result["privacy"]["not_covered"]
    assert all(isinstance(reason, str) and len(reason) > 20 for reason in listed.values())
    leaks = [
        path
        for path in sorted(set(numeric_paths(result)))
        if not any(re.fullmatch(pattern, path) for pattern in ALLOWED)
        and not any(path == key or path.startswith(key + ".") for key in listed)
    ]
    assert not leaks, f"exact numbers outside the DP guarantee and not listed in privacy.not_covered: {leaks}"
    assert ("kept_by_margin" in result["init"]) == (margin < 1)  # released only with the filter on
    assert ("init.kept_by_margin" in listed) == (margin < 1)  # and then listed
    assert "final" in listed and "final" in result  # evaluate-cost defaults to true, and says so
