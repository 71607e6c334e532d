"""docker/run_job.py, the demo cluster's one-shot job: whatever happens, it leaves
flwr-run.json saying what the job did.

A stand-in ``flwr`` on PATH plays Flower's CLI (``run``, ``ls``, ``log``) as the test says;
the SuperLink's address is a socket the test listens on (or one nothing listens on)."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_job(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("run_job", ROOT / "docker" / "run_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)  # no waits between attempts
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    return module


def stand_in_flwr(monkeypatch, tmp_path: Path, run: str, ls: str = '{"success": true, "runs": []}') -> None:
    """``flwr run`` prints ``run`` (exit 1 when it is not JSON); ``flwr ls`` prints ``ls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "flwr"
    script.write_text(f"""#!{sys.executable}
import sys
command = sys.argv[1]
if command == "run":
    print({run!r})
    sys.exit(0 if {run!r}.startswith("{{") else 1)
if command == "ls":
    print({ls!r})
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def job(run_job, monkeypatch, *argv: str) -> int:
    """run_job.py's main with these command-line arguments; its exit status."""
    monkeypatch.setattr(sys, "argv", ["run_job.py", *argv])
    try:
        return run_job.main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


@pytest.fixture
def superlink():
    listener = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_run_flower_refuses_leaves_its_status_and_flowers_words(run_job, monkeypatch, tmp_path, superlink):
    stand_in_flwr(monkeypatch, tmp_path, run="Error: runtime task-token authentication failed")
    out = tmp_path / "out"
    code = job(run_job, monkeypatch, f"k=4 output-dir='{out}'", "--superlink", superlink, "--status-dir", str(out))
    assert code == 1
    status = json.loads((out / "flwr-run.json").read_text())
    assert status["status"] == "not-submitted"
    assert "task-token authentication failed" in status["error"]


def test_a_superlink_that_never_answers_leaves_its_status(run_job, monkeypatch, tmp_path):
    stand_in_flwr(monkeypatch, tmp_path, run="never called")
    closed = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there any more
    code = job(
        run_job,
        monkeypatch,
        "k=4",
        "--superlink",
        address,
        "--status-dir",
        str(tmp_path / "status"),
        "--connect-timeout",
        "0",
    )
    assert code == 1
    status = json.loads((tmp_path / "status" / "flwr-run.json").read_text())
    assert status["status"] == "superlink-unreachable" and address in status["error"]


def test_a_failed_run_is_its_status_with_flowers_details_and_exit_1(run_job, monkeypatch, tmp_path, superlink):
    # flwr run succeeds (it exits 0 even for a run that will fail); flwr ls says how it ended
    ls = {
        "success": True,
        "runs": [{"run-id": 42, "status": "finished:failed", "status-details": "No heartbeat received from the task"}],
    }
    stand_in_flwr(monkeypatch, tmp_path, run='{"success": true, "run-id": 42}', ls=json.dumps(ls))
    out = tmp_path / "out"
    out.mkdir()
    (out / "flwr-run.json").write_text('{"status": "finished:completed"}')  # an earlier job's
    assert job(run_job, monkeypatch, f"output-dir='{out}'", "--superlink", superlink, "--status-dir", str(out)) == 1
    status = json.loads((out / "flwr-run.json").read_text())
    assert status["status"] == "finished:failed" and status["status-details"] == ls["runs"][0]["status-details"]


def test_list_runs_prints_flowers_record(run_job, monkeypatch, tmp_path, superlink, capsys):
    runs = [{"run-id": 1, "status": "running"}]
    stand_in_flwr(monkeypatch, tmp_path, run="never called", ls=json.dumps({"success": True, "runs": runs}))
    assert job(run_job, monkeypatch, "--list-runs", "--superlink", superlink) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"runs": runs}
