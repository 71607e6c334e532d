"""fedcluster-plot on the real result.json of every algorithm (in-process runs); the arrays
each run wrote are the ones docs/reference.md's outputs table names."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from fedcluster.tools.plot import plot_run  # noqa: E402
from fedcluster.inprocess import run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
DOCUMENTED = set(
    re.findall(r"^\| `(\w+\.npy)` \|", REFERENCE.read_text().split("\n## Outputs\n", 1)[1].split("\n## ", 1)[0], re.M)
)


def graph(tmp_path):
    rng = np.random.default_rng(0)
    edges = np.array(
        [(a, b) for a in range(30) for b in range(a + 1, 30) if rng.random() < (0.4 if (a < 15) == (b < 15) else 0.02)]
    )
    folder = tmp_path / "graph"
    folder.mkdir()
    for i, part in enumerate(np.array_split(rng.permutation(len(edges)), 3)):
        np.savetxt(folder / f"client_{i}.txt", edges[part], fmt="%d")
    return {"dataset": "edge-dir", "data-dir": str(folder), "num-nodes": 30, "k": 2}


@pytest.mark.parametrize(
    "config,nodes,expected",
    [
        (
            {"algorithm": "fedkmeans", "k": 3, "num-rounds": 4, "fraction": 0.5},
            6,
            {"cost.png", "communication.png", "replies.png"},
        ),
        ({"algorithm": "fedkmeans", "k-range": "2:5"}, 6, {"k_range.png", "replies.png"}),
        ({"algorithm": "kfed", "k": 3}, 6, {"communication.png", "replies.png"}),
        ({"algorithm": "da-ufl", "k": 3, "outer-iterations": 3}, 6, {"communication.png", "replies.png"}),
        (
            {"algorithm": "feddp-kmeans", "dataset": "feddp-mixture", "k": 3, "lloyd-rounds": 1},
            40,
            {"privacy.png", "replies.png"},
        ),
        ({"algorithm": "fedspectral-plus", "num-rounds": 4}, 3, {"spectral.png", "replies.png"}),
        ({"algorithm": "fedspectral"}, 3, {"replies.png"}),
    ],
)
def test_plot_writes_the_pictures_of_every_algorithm(config, nodes, expected, tmp_path):
    if config["algorithm"].startswith("fedspectral"):
        config = {**config, **graph(tmp_path)}
    out = tmp_path / "run"
    result = run({**config, "reference": False, "output-dir": str(out)}, num_nodes=nodes)
    assert result["files"] and set(result["files"]) <= DOCUMENTED, (result["files"], sorted(DOCUMENTED))
    report = plot_run(out, out=tmp_path / "pics")
    written = {p.rsplit("/", 1)[1] for p in report["written"]}
    assert expected <= written, (written, report["skipped"])
    for name in written:
        assert (tmp_path / "pics" / name).read_bytes()[:8] == PNG
    assert set(report["skipped"]) | written == {
        "cost.png",
        "communication.png",
        "replies.png",
        "privacy.png",
        "spectral.png",
        "k_range.png",
        "points.png",
        "bic.png",
    }
