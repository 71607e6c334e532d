"""fedcluster-device: which runs it answers, how it refuses bad input and missing internals.
(tests/engine/test_device_worker_deployment.py runs it against real SuperNodes.)"""

from __future__ import annotations

import io
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from fedcluster.client import device_worker as worker
from fedcluster.tools.flower import device_worker_args

ROOT = Path(__file__).resolve().parents[2]


def fab(pyproject: str | None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        if pyproject is not None:
            bundle.writestr("pyproject.toml", pyproject)
        bundle.writestr("x/client.py", "import os; os.system('rm -rf /')\n")
    return buffer.getvalue()


OURS = '[tool.flwr.app.components]\nserverapp = "fedcluster.server.app:app"\nclientapp = "fedcluster.client.app:app"\n'


def test_the_worker_names_this_projects_app_as_its_pyproject_does():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    app = config["tool"]["flwr"]["app"]
    assert worker.APP_ID == f"{app['publisher']}/{config['project']['name']}"
    assert worker.CLIENTAPP_REF == app["components"]["clientapp"]
    assert worker.fab_refusal(worker.APP_ID, fab((ROOT / "pyproject.toml").read_text())) is None


def test_a_run_of_another_app_is_refused_by_name():
    why = worker.fab_refusal("someone/echo-app", fab(OURS))
    assert why and "'someone/echo-app'" in why and "fedcluster/fedcluster" in why


def test_a_fab_that_names_another_clientapp_is_refused_even_under_our_id():
    other = OURS.replace("fedcluster.client.app:app", "x.client:app")
    why = worker.fab_refusal(worker.APP_ID, fab(other))
    assert why and "'x.client:app'" in why


@pytest.mark.parametrize("content", [b"not a zip", fab(None), fab("[tool.flwr.app")])
def test_a_fab_without_a_readable_pyproject_is_refused(content):
    why = worker.fab_refusal(worker.APP_ID, content)
    assert why and "pyproject.toml" in why


@pytest.mark.parametrize(
    "address, expected", [("127.0.0.1:9094", ("127.0.0.1", 9094)), ("[::1]:80", ("::1", 80)), ("node:1", ("node", 1))]
)
def test_runtime_api_addresses(address, expected):
    assert worker.split_address(address) == expected


@pytest.mark.parametrize("address", ["9094", ":9094", "host:", "host:0", "host:65536", "host:x"])
def test_a_bad_runtime_api_address_is_named(address):
    with pytest.raises(ValueError, match="HOST:PORT"):
        worker.split_address(address)


def test_verified_flower_versions():
    assert worker.verified("1.42.0") and worker.verified("1.42")
    assert not worker.verified("1.41.2") and not worker.verified("1.420.0") and not worker.verified("2.42.0")


def test_missing_flower_internals_refuse_naming_the_version(monkeypatch):
    import flwr

    monkeypatch.setitem(sys.modules, "flwr.supercore.runtime", None)  # as if this flwr had no such module
    with pytest.raises(worker.WorkerError, match=f"flwr {flwr.__version__} lacks .*verified with flwr 1.42"):
        worker.flower_runtime()


def test_the_installed_flower_has_what_the_worker_uses():
    assert worker.flower_runtime() is not None


@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["--runtime-api-address", "nowhere", "--insecure"], 2, "HOST:PORT"),
        (["--runtime-api-address", "127.0.0.1:9"], 2, "--insecure --root-certificates"),
        (["--runtime-api-address", "127.0.0.1:9", "--insecure", "--root-certificates", "ca"], 2, "not allowed"),
        (["--runtime-api-address", "127.0.0.1:9", "--root-certificates", "/no/such/ca.crt"], 1, "/no/such/ca.crt"),
        (["--runtime-api-address", "127.0.0.1:1", "--insecure", "--wait-s", "0"], 1, "--isolation process"),
    ],
)
def test_bad_input_is_one_line_naming_it(argv, code, says, capsys):
    try:
        got = worker.main(argv)
    except SystemExit as exit:
        got = exit.code
    err = capsys.readouterr().err
    assert got == code and says in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("fedcluster-device: error:"), err


def test_an_empty_auth_secret_is_refused(tmp_path, capsys):
    empty = tmp_path / "secret"
    empty.write_bytes(b"")
    argv = ["--runtime-api-address", "127.0.0.1:9", "--insecure", "--superexec-auth-secret-file", str(empty)]
    assert worker.main(argv) == 1
    assert f"{empty} is empty" in capsys.readouterr().err


class Certs:
    ca_cert, superlink_cert, superlink_key = Path("ca.crt"), Path("sl.crt"), Path("sl.key")


def test_a_supernode_and_its_worker_share_port_secret_and_trust():
    supernode, device = device_worker_args(4567, Certs(), Path("s.secret"))
    assert supernode[:2] == ["--isolation", "process"]
    flag = lambda args, name: args[args.index(name) + 1]  # noqa: E731
    assert flag(device, "--runtime-api-address") == "127.0.0.1:4567"
    assert flag(device, "--superexec-auth-secret-file") == flag(supernode, "--superexec-auth-secret-file")
    assert flag(device, "--root-certificates") == flag(supernode, "--ssl-ca-certfile") == "ca.crt"
    assert "--insecure" not in device
    supernode, device = device_worker_args(4567, None, Path("s.secret"))
    assert "--insecure" in device and "--ssl-certfile" not in supernode and "--root-certificates" not in device


def test_a_refused_task_token_is_an_error_for_that_task_not_the_end_of_the_worker():
    # Flower's invoker answers a 401 with SIGINT to its own process: behind a lossy link a
    # task given up mid-transfer ended the worker and every later message with it.
    import httpx
    from flwr.supercore.retry import make_simple_http_retry_invoker

    invoker = worker.without_self_interrupt(make_simple_http_retry_invoker())
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/runtime/push-task-output")
    refused = httpx.HTTPStatusError("401", request=request, response=httpx.Response(401, request=request))
    calls = []

    def push():
        calls.append(1)
        raise refused

    with pytest.raises(httpx.HTTPStatusError):
        invoker.invoke(push)
    assert calls == [1]


def test_a_second_ctrl_c_while_stopping_still_stops_every_process(tmp_path, monkeypatch):
    """Ctrl-C ends a bench or a local cluster; a second one arriving while its processes
    are stopped (GNU timeout forwards the first again) used to abandon the rest: the
    SuperLink, started first and stopped last, was left running."""
    import signal
    import subprocess

    from fedcluster.tools.flower import FlowerProcesses

    processes = FlowerProcesses(tmp_path)
    started = [processes._start(name, ["sleep", "60"]) for name in ("superlink", "supernode-1", "supernode-2")]
    stop_one, calls = processes.stop_process, []

    def interrupted_once(name, sig=signal.SIGTERM):
        stop_one(name, sig)
        calls.append(name)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(processes, "stop_process", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        processes.stop()
    assert calls == ["supernode-2", "supernode-1", "superlink"]
    assert all(process.poll() is not None for process in started)
    for process in started:
        try:
            process.wait(timeout=1)
        except subprocess.TimeoutExpired:  # pragma: no cover - the assertion above failed
            process.kill()
