"""Start and stop real Flower processes (SuperLink, SuperNodes) for engine tests.

Everything listens on 127.0.0.1 only; every process is stopped by PID at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def flower_available() -> bool:
    return all((BIN / name).exists() or shutil.which(name) for name in ("flwr", "flower-superlink", "flower-supernode"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    return str(BIN / name) if (BIN / name).exists() else name


class Flower:
    """A private Flower home with a SuperLink connection named ``test``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.home = workdir / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.processes: list[tuple[subprocess.Popen, object]] = []
        self.port = free_port()

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True)
        self.processes.append((process, log))
        return process

    def start_superlink(self, simulation: bool) -> None:
        args = [tool("flower-superlink"), "--insecure", "--port", str(self.port), "--database", str(self.workdir / "state.db")]
        if simulation:
            args.append("--simulation")
        self.start("superlink", *args)
        self._wait_for_port(self.port)
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "test"\n\n[superlink.test]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def start_supernode(self, index: int, node_config: str) -> subprocess.Popen:
        return self.start(
            f"supernode{index}",
            tool("flower-supernode"),
            "--insecure",
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(free_port()),
            "--node-config",
            node_config,
        )

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([tool("flwr"), *args], capture_output=True, text=True, env=self.env, timeout=timeout, cwd=self.workdir)

    def submit(self, app_dir: Path, run_config: str, federation_config: str | None = None) -> str:
        args = ["run", str(app_dir), "test", "--run-config", run_config, "--format", "json"]
        if federation_config:
            args += ["--federation-config", federation_config]
        done = self.flwr(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        payload = json.loads(done.stdout[done.stdout.index("{") :])
        assert payload.get("success"), payload
        return str(payload["run-id"])

    def wait_for_run(self, run_id: str, timeout: float) -> dict:
        """Poll ``flwr ls`` until the run finishes; return its entry (status included)."""
        deadline = time.monotonic() + timeout
        entry: dict = {}
        while time.monotonic() < deadline:
            done = self.flwr("ls", "test", "--format", "json")
            if done.returncode == 0 and "{" in done.stdout:
                runs = json.loads(done.stdout[done.stdout.index("{") :]).get("runs", [])
                entry = next((r for r in runs if str(r.get("run-id")) == run_id), {})
                if str(entry.get("status", "")).startswith("finished"):
                    return entry
            time.sleep(2)
        raise TimeoutError(f"run {run_id} did not finish within {timeout} s: {entry}\n{self.logs()}")

    def run_log(self, run_id: str) -> str:
        """The run's own log (ServerApp output), as ``flwr log RUN_ID --show`` prints it."""
        done = self.flwr("log", run_id, "test", "--show", timeout=60)
        return (done.stdout + done.stderr)[-6000:]

    def logs(self) -> str:
        out = []
        for path in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {path.name}\n" + path.read_text()[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        for process, log in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=5)
            log.close()

    def _wait_for_port(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s\n{self.logs()}")
