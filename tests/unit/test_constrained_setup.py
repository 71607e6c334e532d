"""fedcluster.tools.constrained says why a constrained cluster cannot start here (the engine
test and the bench skip or stop with that reason) before it creates anything."""

from __future__ import annotations

from fedcluster.tools import constrained


def test_not_root_is_named(monkeypatch):
    monkeypatch.setattr(constrained.os, "geteuid", lambda: 1000)
    assert constrained.unavailable() == "needs root (cgroups and network namespaces)"


def test_a_missing_cgroup_controller_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(constrained.os, "geteuid", lambda: 0)
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "cgroup.procs").write_text("")
    monkeypatch.setattr(constrained, "CGROUP_ROOT", tmp_path)
    why = constrained.unavailable()
    assert why is not None and "cpu, cpuacct" in why and "memory" not in why.split(":")[-1]
