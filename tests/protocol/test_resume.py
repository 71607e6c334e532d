"""A run whose server stops mid-way continues with ``resume = true``: the round trips it
completed are replayed from its journal (no device is asked for them again), the nodes
connected now — with other node ids, as Flower gives them — are matched to the run's own by
their partition, and the result is the one an uninterrupted run gives. A private run's
releases are in its folder's ledger before they leave the server, and a resumed run spends
none of them again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_npy_dir
from test_fedspectral import planted, write_split
from fedcluster.inprocess import run
from fedcluster.inprocess.grid import InProcessGrid
from fedcluster.server.base import FederationError


class Crash(BaseException):
    """The server process dies (not an error the strategy could catch)."""


@pytest.fixture
def count_pushes(monkeypatch):
    """Counts the messages every push sends, by task, and can make the N-th push (or the
    pull after it) crash the server."""
    state = {"pushes": 0, "sent": [], "crash_at": None, "crash_in_pull": False, "pending_crash": False}
    push, pull = InProcessGrid.push_messages, InProcessGrid.pull_messages

    def counting_push(self, messages):
        messages = list(messages)
        state["pushes"] += 1
        if state["crash_at"] == state["pushes"]:
            if not state["crash_in_pull"]:
                raise Crash()
            state["pending_crash"] = True
        state["sent"].append([m.metadata.message_type for m in messages])
        return push(self, messages)

    def crashing_pull(self, ids):
        if state["pending_crash"]:
            state["pending_crash"] = False
            list(pull(self, ids))  # the devices answered; the server dies before it reads them
            raise Crash()
        return pull(self, ids)

    monkeypatch.setattr(InProcessGrid, "push_messages", counting_push)
    monkeypatch.setattr(InProcessGrid, "pull_messages", crashing_pull)

    def reset(crash_at=None, in_pull=False):
        state.update(pushes=0, sent=[], crash_at=crash_at, crash_in_pull=in_pull, pending_crash=False)
        return state

    return reset


def blobs(tmp_path, clients=6):
    rng = np.random.default_rng(3)
    return write_npy_dir(tmp_path / "data", [rng.normal(size=(40, 2)) + 6 * (i % 3) for i in range(clients)])


def config(data, out, **extra):
    return {
        "k": 3,
        "num-rounds": 4,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "output-dir": str(out),
        "reference": False,
        **extra,
    }


CASES = {
    "fedkmeans": {"algorithm": "fedkmeans", "fraction": 0.5},
    "kfed": {"algorithm": "kfed"},
    "da-ufl": {"algorithm": "da-ufl", "outer-iterations": 3, "inner-iterations": 3},
    "gmm": {"algorithm": "gmm", "em-rounds": 4, "kmeans-rounds": 2},
    "feddp-kmeans": {
        "algorithm": "feddp-kmeans",
        "init": "histogram",
        "lloyd-rounds": 3,
        "epsilon": 2.0,
        "clip-norm": 20.0,
        "noise-seed": 5,
        "dimension": 2,
    },
}


GRAPH_CASES = {
    "fedspectral": {"algorithm": "fedspectral"},
    "fedspectral-plus": {"algorithm": "fedspectral-plus", "num-rounds": 4},
    "fedspectral-plus-secure": {"algorithm": "fedspectral-plus", "num-rounds": 4, "secure-aggregation": True},
}
SECURE_CASES = {  # no noise, so that the sums are the plain ones: what is checked is the secure path itself
    "feddp-kmeans-secure": {
        **CASES["feddp-kmeans"],
        "secure-aggregation": True,
        "epsilon": float("inf"),
        "evaluate-cost": False,
    },
    "gmm-secure": {"algorithm": "gmm", "em-rounds": 3, "kmeans-rounds": 1, "secure-aggregation": True},
}


def graph(tmp_path):
    edges, n = planted([40, 30, 30], 0.3, 10, 2)
    return write_split(tmp_path / "graph", edges, 6, 1), {"dataset": "edge-dir", "num-nodes": n}


@pytest.mark.parametrize("name", sorted(CASES) + sorted(GRAPH_CASES) + sorted(SECURE_CASES))
def test_a_run_that_stopped_resumes_to_the_uninterrupted_result_without_asking_again(tmp_path, count_pushes, name):
    data, extra = blobs(tmp_path), {**CASES, **SECURE_CASES}.get(name)
    if name in GRAPH_CASES:
        data, extra = graph(tmp_path)
        extra = {**extra, **GRAPH_CASES[name]}
    state = count_pushes()
    whole = run(config(data, tmp_path / "whole", **extra), num_nodes=6)
    total = state["pushes"]
    asked = list(state["sent"])  # per push, the tasks sent
    for crash_at, in_pull in {(total // 2 + 1, False), (max(total - 1, 1), True)}:
        out = tmp_path / f"stopped-{crash_at}-{in_pull}"
        state = count_pushes(crash_at, in_pull)
        with pytest.raises(Crash):
            run(config(data, out, **extra), num_nodes=6)
        marker = json.loads((out / "fedcluster-run.json").read_text())
        assert marker["status"] == "running" and not (out / "result.json").exists()
        with pytest.raises(FederationError, match="resume=true"):  # the unfinished run is never silently replaced
            run(config(data, out, **extra), num_nodes=6)
        state = count_pushes()
        resumed = run(
            config(data, out, resume=True, **extra), num_nodes=6, node_ids=[70 + 13 * i for i in range(6)][::-1]
        )
        for name in set(whole["files"]) - {"device_nodes.npy"}:  # (node ids: Flower's differ in every run)
            np.testing.assert_array_equal(np.load(out / name), np.load(tmp_path / "whole" / name))
        for key in ("cost", "log_likelihood"):
            assert [r.get(key) for r in resumed["rounds"]] == [r.get(key) for r in whole["rounds"]]
        completed = crash_at - 1  # the round trips before the one that stopped are not sent again
        again = [types for types in state["sent"] if types != ["query.identify"] * len(types) or not types]
        if "secure-aggregation" not in extra:
            assert again == asked[completed:]
        else:  # the devices lost the session's keys with the run that stopped: one new session, two round trips,
            # and a sum masked but not unmasked before the stop is masked again in it
            rest, keys = [t for t in again if not _session(t)], [t for t in again if _session(t)]
            expected = [t for t in asked[completed:] if not _session(t)]
            assert rest[len(rest) - len(expected) :] == expected and len(rest) - len(expected) <= 1
            assert len(keys) <= sum(map(_session, asked[completed:])) + 2
        if completed:  # (a journal without a single reply has nothing to replay: the run starts over)
            assert resumed["resumed"][0]["nodes_back"] == 6
        assert not (out / "journal.bin").exists() and not (out / "server-secret").exists()
        assert json.loads((out / "fedcluster-run.json").read_text())["status"] == "finished"


def test_a_node_that_states_anothers_partition_at_identify_takes_no_ones_place(tmp_path, count_pushes):
    from flwr.app import MetricRecord

    data, out = blobs(tmp_path), tmp_path / "stopped"
    count_pushes(4)
    with pytest.raises(Crash):
        run(config(data, out, **CASES["fedkmeans"]), num_nodes=6)
    live = [300 + i for i in range(6)]  # the node of partition i is 300 + i

    def claims_five(node, message, reply):  # the node of partition 1 says it is partition 5's (first, by its id)
        if message.metadata.message_type == "query.identify" and node == 301 and not reply.has_error():
            reply.content.metric_records["metrics"] = MetricRecord({"partition": 5})
        return reply

    count_pushes()
    resumed = run(
        config(data, out, resume=True, **CASES["fedkmeans"]), num_nodes=6, node_ids=live, reply_hook=claims_five
    )
    assert resumed["resumed"][0]["nodes_back"] == 4 and resumed["resumed"][0]["newcomers"] == 2
    assert any("301, 305 all state partition-id 5" in text for text in resumed["warnings"])


def _session(types):
    return bool(types) and types[0] in ("query.secagg_setup", "query.secagg_share_keys")


PRIVATE = {
    "algorithm": "feddp-kmeans",
    "init": "histogram",
    "lloyd-rounds": 3,
    "epsilon": 2.0,
    "clip-norm": 20.0,
    "dimension": 2,
}  # noise-seed = -1: the noise comes from the run folder's secret


def ledger(folder):
    return [
        json.loads(line) for line in (folder / "privacy-ledger.jsonl").read_text().splitlines() if line.endswith("}")
    ]


def test_a_private_run_writes_each_release_before_it_leaves_and_a_resume_spends_none_again(tmp_path, count_pushes):
    data = blobs(tmp_path)
    count_pushes()
    whole = run(config(data, tmp_path / "whole", **PRIVATE), num_nodes=6)
    releases = ledger(tmp_path / "whole")
    assert [e["step"] for e in releases] == ["step2"] + ["lloyd_gaussian", "lloyd_laplace"] * 3
    out = tmp_path / "stopped"
    count_pushes(3)  # the histogram and one Lloyd round went out; the server dies as it sends the second
    with pytest.raises(Crash):
        run(config(data, out, **PRIVATE), num_nodes=6)
    assert [e["step"] for e in ledger(out)] == ["step2", "lloyd_gaussian", "lloyd_laplace"]  # on disk before they left
    with pytest.raises(FederationError, match=f"unfinished run of this same job is in {out}.*resume=true"):
        run(config(data, tmp_path / "again", **PRIVATE), num_nodes=6)  # the job started afresh beside it: refused
    assert not (tmp_path / "again" / "result.json").exists()
    count_pushes()
    resumed = run(config(data, out, resume=True, **PRIVATE), num_nodes=6, node_ids=[500 + i for i in range(6)])
    assert ledger(out) == [*ledger(out)[:3], *ledger(out)[3:]] and len(ledger(out)) == len(releases)
    assert not any(e["again"] for e in ledger(out))
    assert resumed["privacy"]["epsilon"] == whole["privacy"]["epsilon"]
    assert "releases_beyond_this_run" not in resumed["privacy"]


def test_keys_that_change_neither_result_nor_privacy_may_differ_on_resume_and_make_no_other_job(tmp_path, count_pushes):
    data, out = blobs(tmp_path), tmp_path / "stopped"
    count_pushes()
    whole = run(config(data, tmp_path / "whole", **PRIVATE, **{"noise-seed": 5}), num_nodes=6)
    count_pushes(3)
    with pytest.raises(Crash):
        run(config(data, out, **PRIVATE, **{"noise-seed": 5}), num_nodes=6)
    slower = {"round-timeout": 900.0, "node-wait-s": 120.0, "reference": True}
    for key, value in slower.items():  # started beside it, this is still the same job: its releases are named
        with pytest.raises(FederationError, match=f"unfinished run of this same job is in {out}"):
            run(config(data, tmp_path / f"beside-{key}", **PRIVATE, **{"noise-seed": 5, key: value}), num_nodes=6)
    with pytest.raises(FederationError, match="differs in: epsilon"):  # what the run computes must match
        run(config(data, out, resume=True, **{**PRIVATE, "noise-seed": 5, "epsilon": 3.0}), num_nodes=6)
    count_pushes()
    resumed = run(config(data, out, resume=True, **PRIVATE, **{"noise-seed": 5}, **slower), num_nodes=6)
    np.testing.assert_array_equal(np.load(out / "centers.npy"), np.load(tmp_path / "whole" / "centers.npy"))
    assert resumed["privacy"]["epsilon"] == whole["privacy"]["epsilon"] and not any(e["again"] for e in ledger(out))


def test_a_ledger_record_the_crash_cut_short_is_skipped_with_a_warning_and_the_resume_counts_right(
    tmp_path, count_pushes
):
    data, out = blobs(tmp_path), tmp_path / "stopped"
    count_pushes()
    run(config(data, tmp_path / "whole", **PRIVATE), num_nodes=6)
    count_pushes(3)
    with pytest.raises(Crash):
        run(config(data, out, **PRIVATE), num_nodes=6)
    with open(out / "privacy-ledger.jsonl", "a") as handle:
        handle.write('{"chain": 0, "attempt": 1, "index": 3, "st')  # the next record, cut short
    count_pushes()
    resumed = run(config(data, out, resume=True, **PRIVATE), num_nodes=6)
    lines = (out / "privacy-ledger.jsonl").read_text().splitlines()
    assert len(lines) == len(ledger(tmp_path / "whole")) + 1 and lines[3].endswith('"st')
    assert any("line(s) 4 do not parse" in text for text in resumed["warnings"])
    assert "releases_beyond_this_run" not in resumed["privacy"]


def test_a_private_run_started_over_reports_the_releases_of_the_attempt_it_discarded(tmp_path, count_pushes):
    data, out = blobs(tmp_path), tmp_path / "stopped"
    count_pushes(3)
    with pytest.raises(Crash):
        run(config(data, out, **PRIVATE), num_nodes=6)
    count_pushes()
    again = run(config(data, out, overwrite=True, **PRIVATE), num_nodes=6)
    beyond = again["privacy"]["releases_beyond_this_run"]
    assert beyond["count"] == 3 and beyond["epsilon_with_them"] > again["privacy"]["epsilon"]
    assert any("beyond this run" in text for text in again["warnings"])
    assert len(ledger(out)) == 3 + 7


SECURE_PRIVATE = {**PRIVATE, "secure-aggregation": True, "evaluate-cost": False}  # the devices add the noise


@pytest.mark.parametrize("stop, spent_twice", [("query.secure_feddp_lloyd", False), ("query.secagg_unmask", True)])
def test_the_devices_noise_is_spent_when_its_unmasking_is_asked_for(tmp_path, count_pushes, stop, spent_twice):
    """A masked sum is no release until the server asks for the shares that unmask it: a
    resume that masks it again spends nothing twice; once the shares were asked for (the
    server may hold them), the sum masked again is a second release, counted."""
    data = blobs(tmp_path)
    state = count_pushes()
    run(config(data, tmp_path / "whole", **SECURE_PRIVATE), num_nodes=6)
    whole = ledger(tmp_path / "whole")
    lloyd = next(i for i, types in enumerate(state["sent"], 1) if "query.secure_feddp_lloyd" in types)
    crash_at = next(i for i, types in enumerate(state["sent"], 1) if i >= lloyd and stop in types)
    out = tmp_path / "stopped"
    count_pushes(crash_at, in_pull=True)  # the devices answered; the server died before reading them
    with pytest.raises(Crash):
        run(config(data, out, **SECURE_PRIVATE), num_nodes=6)
    count_pushes()
    resumed = run(config(data, out, resume=True, **SECURE_PRIVATE), num_nodes=6)
    again = [e["step"] for e in ledger(out) if e["again"]]
    assert again == (["lloyd_gaussian", "lloyd_laplace"] if spent_twice else [])
    assert len(ledger(out)) == len(whole) + len(again)
    assert resumed["privacy"].get("releases_beyond_this_run", {}).get("count", 0) == len(again)


SECURE_SWEEP = {  # (fewer rounds: every sum after the session's first is alike)
    "feddp-kmeans-secure": {**SECURE_CASES["feddp-kmeans-secure"], "lloyd-rounds": 2},
    "fedspectral-plus-secure": {**GRAPH_CASES["fedspectral-plus-secure"], "num-rounds": 2},
    "fedspectral-plus-secure-sparse": {
        "algorithm": "fedspectral-plus",
        "num-rounds": 2,
        "secure-aggregation": True,
        "secagg-neighbours": 3,
    },
}


@pytest.mark.parametrize("name", sorted(SECURE_SWEEP))
def test_a_secure_run_resumes_from_every_point_it_can_stop_at(tmp_path, count_pushes, name):
    """Every push, before it leaves and after its replies came: the devices of a resumed run
    hold no session of the first attempt, whatever point of a session's setup or of a sum
    the stop came at, and the result is the uninterrupted run's."""
    data, extra = blobs(tmp_path), dict(SECURE_SWEEP[name])
    if "fedspectral" in name:
        data, graph_extra = graph(tmp_path)
        extra.update(graph_extra)
    state = count_pushes()
    whole = run(config(data, tmp_path / "whole", **extra), num_nodes=6)
    for crash_at in range(1, state["pushes"] + 1):
        for in_pull in (False, True):
            out = tmp_path / f"stopped-{crash_at}-{in_pull}"
            count_pushes(crash_at, in_pull)
            with pytest.raises(Crash):
                run(config(data, out, **extra), num_nodes=6)
            count_pushes()
            run(config(data, out, resume=True, **extra), num_nodes=6, node_ids=[90 + 7 * i for i in range(6)])
            for array in set(whole["files"]) - {"device_nodes.npy"}:
                np.testing.assert_array_equal(
                    np.load(out / array),
                    np.load(tmp_path / "whole" / array),
                    err_msg=f"{array}, stopped at push {crash_at} ({in_pull=})",
                )


@pytest.mark.parametrize("name", ["feddp-kmeans-secure", "fedspectral-plus-secure"])
def test_a_secure_run_stopped_again_after_its_resume_went_live_resumes_again(tmp_path, count_pushes, name):
    """The first stop falls inside a session's setup (set up again live by the resume); the
    second at every push of the resumed attempt: the second resume decides at each point as
    the first did (the journal marks where an attempt went live) and ends as uninterrupted."""
    data, extra = blobs(tmp_path), dict(SECURE_SWEEP[name])
    if "fedspectral" in name:
        data, graph_extra = graph(tmp_path)
        extra.update(graph_extra)
    count_pushes()
    whole = run(config(data, tmp_path / "whole", **extra), num_nodes=6)
    second_attempt = None
    for crash_at in range(1, 64):
        for in_pull in (False, True):
            out = tmp_path / f"stopped-{crash_at}-{in_pull}"
            count_pushes(2)  # as the session's keys are shared
            with pytest.raises(Crash):
                run(config(data, out, **extra), num_nodes=6)
            state = count_pushes(crash_at, in_pull)
            try:
                run(config(data, out, resume=True, **extra), num_nodes=6, node_ids=[50 + i for i in range(6)])
            except Crash:
                pass
            else:
                second_attempt = state["pushes"]
                break
            count_pushes()
            run(config(data, out, resume=True, **extra), num_nodes=6, node_ids=[90 + 7 * i for i in range(6)])
            for array in set(whole["files"]) - {"device_nodes.npy"}:
                np.testing.assert_array_equal(
                    np.load(out / array),
                    np.load(tmp_path / "whole" / array),
                    err_msg=f"{array}, stopped again at push {crash_at} ({in_pull=})",
                )
        if second_attempt is not None:
            break
    assert second_attempt is not None and second_attempt > 4
