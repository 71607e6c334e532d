"""fedcluster-plot: pictures from a result.json written by hand here."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from fedcluster.tools.plot import main, plot_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(folder, **extra):
    folder.mkdir(parents=True)
    rounds = [
        {
            "round": t,
            "cost": 2.0 / t,
            "replies": 5 - (t == 2),
            "bytes_up": 100 * t,
            "bytes_down": 50,
            "failures": [{"node": 1, "kind": "invalid", "reason": "NaN"}] if t == 2 else [],
        }
        for t in range(1, 6)
    ]
    result = {
        "algorithm": "fedkmeans",
        "config": {"k": 2},
        "rounds": rounds,
        "reference": {"central_cost": 0.35},
        **extra,
    }
    (folder / "result.json").write_text(json.dumps(result))
    np.save(folder / "centers.npy", np.array([[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]]))
    return folder


def test_a_kmeans_run_gets_its_pictures_and_the_rest_say_why_not(tmp_path):
    run = write_run(tmp_path / "run")
    np.save(tmp_path / "mine.npy", np.random.default_rng(0).normal(size=(30, 3)))
    report = plot_run(run, str(tmp_path / "mine.npy"))
    assert sorted(p.rsplit("/", 1)[1] for p in report["written"]) == [
        "communication.png",
        "cost.png",
        "points.png",
        "replies.png",
    ]
    assert set(report["skipped"]) == {"privacy.png", "spectral.png", "k_range.png", "bic.png"}
    for name in ("cost.png", "communication.png", "replies.png", "points.png"):
        assert (run / name).read_bytes()[:8] == PNG


def test_privacy_and_spectral_pictures_when_the_run_has_them(tmp_path):
    steps = [{"name": "step1", "epsilon": 0.3}, {"name": "step2", "epsilon": 0.5}]
    rounds = [{"round": t, "subspace_change": 10.0**-t, "residual": 10.0 ** (1 - t)} for t in range(1, 4)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(
        json.dumps({"algorithm": "x", "rounds": rounds, "privacy": {"epsilon": 0.7, "steps": steps}})
    )
    report = plot_run(run, out=tmp_path / "pics")
    names = sorted(p.rsplit("/", 1)[1] for p in report["written"])
    assert names == ["privacy.png", "replies.png", "spectral.png"]
    assert set(report["skipped"]) == {"cost.png", "communication.png", "points.png", "k_range.png", "bic.png"}
    assert (tmp_path / "pics" / "privacy.png").read_bytes()[:8] == PNG


def test_errors_name_the_problem(tmp_path, capsys):
    assert main([str(tmp_path / "nothing")]) == 1
    assert "result.json does not exist" in capsys.readouterr().err
    run = write_run(tmp_path / "run")
    np.save(tmp_path / "flat.npy", np.zeros((4, 2)))
    assert main([str(run), "--points", str(tmp_path / "flat.npy")]) == 1
    assert "2 features" in capsys.readouterr().err
    (run / "result.json").write_text("{truncated")
    assert main([str(run)]) == 1
    assert "not valid JSON" in capsys.readouterr().err


def test_without_matplotlib_the_command_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    run = write_run(tmp_path / "run")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main([str(run)]) == 1
    assert "pip install 'fedcluster[plot]'" in capsys.readouterr().err
    assert not (run / "cost.png").exists()


def test_k_range_best_seen_and_one_dimensional_points_are_drawn(tmp_path):
    run = write_run(
        tmp_path / "run",
        best_seen={"round": 4, "cost": 0.5},
        k_range={
            "k": [2, 3, 4],
            "cost": [3.0, 1.0, 0.9],
            "calinski_harabasz": [10.0, 30.0, 20.0],
            "elbow_k": 3,
            "calinski_harabasz_k": 3,
        },
    )
    np.save(run / "centers.npy", np.array([[0.0], [5.0]]))
    np.save(tmp_path / "line.npy", np.array([[0.1], [0.2], [4.9], [5.3]]))
    report = plot_run(run, str(tmp_path / "line.npy"))
    for name in ("k_range.png", "points.png", "cost.png"):
        assert (run / name).read_bytes()[:8] == PNG, name
    assert "k_range.png" not in report["skipped"] and "points.png" not in report["skipped"]


def edited(folder, change):
    """A run whose result.json a person edited by hand: ``change`` edits the parsed JSON."""
    run = write_run(folder)
    result = json.loads((run / "result.json").read_text())
    result = change(result) or result
    (run / "result.json").write_text(json.dumps(result))
    return run


ROUND_PICTURES = {"cost.png", "communication.png", "replies.png"}


@pytest.mark.parametrize(
    "change,pictures,named",
    [
        (lambda r: r["rounds"][2].update(cost="x"), {"cost.png"}, "rounds[2].cost = 'x' is not a number"),
        (lambda r: r["rounds"][1].update(cost=1e308), {"cost.png"}, "rounds[1].cost = 1e+308 is too large to draw"),
        (lambda r: r["reference"].update(central_cost="low"), {"cost.png"}, "reference.central_cost = 'low'"),
        (
            lambda r: r["rounds"][3].update(bytes_up=[1]),
            {"communication.png"},
            "rounds[3].bytes_up = [1] is not a number",
        ),
        (lambda r: r["rounds"][4].update(failures="none"), {"replies.png"}, "rounds[4].failures is not a list"),
        # a round without its number: no picture over the rounds can place it
        (lambda r: r["rounds"][0].update(round=None), ROUND_PICTURES, "rounds[0].round = None is not a number"),
        (lambda r: r["rounds"][1].update(cost=10**400), {"cost.png"}, "rounds[1].cost is an integer too large to draw"),
    ],
)
def test_a_field_it_cannot_read_is_named_and_the_rest_is_drawn(tmp_path, capsys, change, pictures, named):
    run = edited(tmp_path / "run", change)
    np.save(tmp_path / "p.npy", np.ones((6, 3)))
    assert main([str(run), "--points", str(tmp_path / "p.npy")]) == 0
    out = capsys.readouterr().out
    for picture in pictures:
        assert f"skipped {picture}: cannot draw it: result.json {named}" in out, out
    drawn = ROUND_PICTURES - pictures | {"points.png"}
    assert all(f"wrote   {run / name}" in out for name in drawn), out
    assert all((run / name).read_bytes().startswith(PNG) for name in drawn)


def test_a_result_json_that_is_not_a_record_is_refused_by_name(tmp_path, capsys):
    run = edited(tmp_path / "run", lambda r: [r])
    assert main([str(run)]) == 1
    assert "holds a JSON list, not a run's record" in capsys.readouterr().err
    deep = edited(tmp_path / "deep", lambda r: None)
    (deep / "result.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main([str(deep)]) == 1
    assert "nests its JSON too deeply" in capsys.readouterr().err
    listed = edited(tmp_path / "listed", lambda r: r.update(config=[1, 2]))  # the title reads config
    assert main([str(listed)]) == 0
    assert "wrote" in capsys.readouterr().out
    run = edited(tmp_path / "other", lambda r: r.update(rounds={"1": {}}))
    assert main([str(run)]) == 0
    assert "result.json rounds is a dict, not a list of rounds" in capsys.readouterr().out
