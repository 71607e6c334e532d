"""Submit one fedcluster run to the demo cluster's SuperLink and wait for its end.

Runs inside the compose network (the ``job`` service; image path /opt/fedcluster):

    python /opt/fedcluster/run_job.py "k=4 num-rounds=10 min-nodes=3"

1. waits until the SuperLink answers on its address (``--superlink``, default
   ``superlink:8000``; the connection ``demo`` in $FLWR_HOME/config.toml is written to match:
   TLS verified against ``--root-certificates`` (or $ROOT_CERTIFICATES) when given, else
   insecure),
2. ``flwr run /app demo --run-config ...`` (a few attempts, for a SuperLink still starting),
3. streams the run's log (``flwr log``) while polling ``flwr ls`` until the run is finished,
4. writes the final ``flwr ls`` entry, with the run's ``output-dir``, to ``flwr-run.json`` in
   ``--status-dir`` (default /out) and, when the run wrote a ``result.json``, prints its
   summary. Without an ``output-dir`` in the run config the run gets a folder of its own,
   ``/out/run-<UTC time>``: the server never writes into another run's folder.

``flwr-run.json`` is written whatever happens: when no run could be submitted its status is
``not-submitted`` (``superlink-unreachable`` when nothing answered) with the error, so a
caller always reads what the job did. Exit status 0 only when Flower reports
``finished:completed`` (``flwr run`` alone exits 0 even when the run failed).

With ``--list-runs`` it prints Flower's record of every run on the SuperLink (``flwr ls
--format json``) and exits: what a caller asks when the job itself left nothing.

With ``--register KEY.pub ...`` it instead registers those SuperNode public keys with the
SuperLink (``flwr supernode register``; the ``register`` service of
docker-compose.tls.yml): a key the SuperLink already holds counts as registered. With
``--then-wait`` it then writes ``/tmp/registered`` (the service's health check) and waits
until stopped: a one-shot that exited would stop the whole cluster under
``up --exit-code-from job``. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

CONNECTION = "demo"


class JobError(Exception):
    """The job could not do its part; ``status`` is what flwr-run.json records."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def flwr(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``flwr ARGS``; one that does not return within ``timeout`` is a failure (rc 124)."""
    try:
        return subprocess.run(["flwr", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["flwr", *args], 124, "", f"flwr {args[0]}: no answer within {timeout:.0f} s")


def json_payload(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{") :]) if "{" in stdout else {}


def write_connection(address: str, root_certificates: Path | None = None) -> None:
    home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    home.mkdir(parents=True, exist_ok=True)
    if root_certificates is None:
        security = "insecure = true\n"
    elif not root_certificates.is_file():
        sys.exit(f"[job] --root-certificates {root_certificates}: no such file (make the certificates first: fedcluster-make-certs)")
    else:
        security = f'root-certificates = "{root_certificates}"\n'
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{address}"\n{security}'
    )


def register(public_keys: list[Path], attempts: int = 10) -> None:
    """``flwr supernode register`` every key; a few attempts, for a SuperLink still starting."""
    for key in public_keys:
        if not key.is_file():
            sys.exit(f"[register] {key}: no such file (make the keys first: fedcluster-make-certs --supernodes N)")
        for attempt in range(attempts):
            done = flwr("supernode", "register", str(key), CONNECTION)
            text = done.stdout + done.stderr
            if done.returncode == 0 or "already" in text.lower():
                print(f"[register] {key.name}: registered", flush=True)
                break
            if attempt == attempts - 1:
                sys.exit(f"[register] flwr supernode register {key} failed (rc {done.returncode}):\n{text[-2000:]}")
            time.sleep(2)


def wait_for(address: str, timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise JobError("superlink-unreachable", f"the SuperLink at {address} does not answer after {timeout:.0f} s: {exc}") from None
            time.sleep(1)


def submit(app: str, run_config: str, attempts: int = 4) -> str:
    """``flwr run``; a few attempts, for a SuperLink that accepts connections but is not ready."""
    for attempt in range(attempts):
        done = flwr("run", app, CONNECTION, "--run-config", run_config, "--format", "json")
        try:
            payload = json_payload(done.stdout)
        except ValueError:
            payload = {}
        if done.returncode == 0 and payload.get("success"):
            return str(payload["run-id"])
        if attempt < attempts - 1:
            time.sleep(3)
    raise JobError("not-submitted", f"flwr run failed {attempts} times (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")


def wait_for_run(run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    entry: dict = {}
    while time.monotonic() < deadline:
        done = flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json")
        if done.returncode == 0:
            try:
                runs = json_payload(done.stdout).get("runs", [])
            except ValueError:
                runs = []
            entry = next((run for run in runs if str(run.get("run-id")) == run_id), entry)
            if str(entry.get("status", "")).startswith("finished"):
                return entry
        time.sleep(2)
    return {**entry, "status": entry.get("status", "unknown"), "job-timeout": f"not finished after {timeout:.0f} s"}


def list_runs() -> int:
    """Print Flower's record of every run (``flwr ls --format json``); 0 when it answered."""
    done = flwr("ls", CONNECTION, "--format", "json")
    try:
        payload = json_payload(done.stdout)
    except ValueError:
        payload = {}
    if done.returncode != 0 or "runs" not in payload:
        print(json.dumps({"error": f"flwr ls failed (rc {done.returncode}): {(done.stdout + done.stderr)[-2000:]}"}))
        return 1
    print(json.dumps({"runs": payload["runs"]}))
    return 0


def write_status(status_dir: Path, entry: dict) -> None:
    status_dir.mkdir(parents=True, exist_ok=True)
    (status_dir / "flwr-run.json").write_text(json.dumps(entry, indent=2) + "\n")


def output_dir(run_config: str) -> Path | None:
    match = re.search(r"""output-dir\s*=\s*["']([^"']+)["']""", run_config)
    return Path(match.group(1)) if match else None


def summary(result: dict) -> str:
    final = result.get("final", {})
    nodes = result.get("nodes", {})
    lines = [
        f"  algorithm         : {result.get('algorithm')}",
        f"  nodes connected   : {nodes.get('connected')}",
        f"  rounds            : {len(result.get('rounds', []))}",
        f"  points            : {final.get('num_points')}",
        f"  federated cost/pt : {final.get('cost')}",
        f"  wall time (s)     : {result.get('wall_time_s')}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="Submit a fedcluster run to the demo SuperLink and wait for it.")
    parser.add_argument("run_config", nargs="?", default="k=4 min-nodes=3", help="--run-config string (TOML values)")
    parser.add_argument("--superlink", default=os.environ.get("SUPERLINK", "superlink:8000"))
    parser.add_argument("--app", default="/app")
    parser.add_argument("--status-dir", type=Path, default=None, help="where flwr-run.json is written (default: /out)")
    parser.add_argument("--connect-timeout", type=float, default=180.0, help="seconds to wait for the SuperLink to answer")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("RUN_TIMEOUT", "900")), help="seconds to wait for the run")
    parser.add_argument("--root-certificates", type=Path, default=os.environ.get("ROOT_CERTIFICATES") or None,
                        help="CA certificate of a TLS SuperLink (default: $ROOT_CERTIFICATES; none: insecure)")
    parser.add_argument("--register", type=Path, nargs="+", metavar="KEY.pub", help="register these SuperNode public keys and exit")
    parser.add_argument("--then-wait", action="store_true", help="after --register: write /tmp/registered and wait until stopped")
    parser.add_argument("--list-runs", action="store_true", help="print every run the SuperLink knows (flwr ls, JSON) and exit")
    args = parser.parse_args()

    started = time.monotonic()
    write_connection(args.superlink, args.root_certificates)
    if args.list_runs:
        try:
            wait_for(args.superlink, timeout=min(30.0, args.connect_timeout))
        except JobError as exc:
            print(json.dumps({"error": str(exc)}))
            return 1
        return list_runs()
    if args.register:
        try:
            wait_for(args.superlink, timeout=args.connect_timeout)
        except JobError as exc:
            sys.exit(f"[register] {exc}")
        register(args.register)
        if args.then_wait:
            Path("/tmp/registered").write_text("ok\n")
            while True:  # stopped by SIGTERM from docker compose (init: true forwards it)
                time.sleep(3600)
        return 0
    out = output_dir(args.run_config)
    if out is None:  # each job its own results folder (a run never writes into another's)
        out = Path("/out") / time.strftime("run-%Y%m%d-%H%M%S", time.gmtime())
        args.run_config = f"{args.run_config} output-dir='{out}'"
    status_dir = args.status_dir or Path("/out")
    stale = status_dir / "flwr-run.json"
    if stale.exists():
        stale.unlink()  # a flwr-run.json seen later is this job's
    try:
        wait_for(args.superlink, timeout=args.connect_timeout)
        print(f"[job] submitting {args.app} to {args.superlink} with --run-config \"{args.run_config}\"", flush=True)
        run_id = submit(args.app, args.run_config)
    except JobError as exc:
        entry = {"status": exc.status, "error": str(exc), "job-seconds": round(time.monotonic() - started, 1),
                 "output-dir": str(out)}
        write_status(status_dir, entry)
        print(f"[job] {exc.status}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"[job] run {run_id} submitted; streaming its log", flush=True)
    log = subprocess.Popen(["flwr", "log", run_id, CONNECTION, "--stream"])
    try:
        entry = wait_for_run(run_id, args.timeout)
    finally:
        try:
            log.wait(timeout=10)  # the stream ends by itself once the run is over
        except subprocess.TimeoutExpired:
            log.terminate()
            log.wait(timeout=10)
    entry["job-seconds"] = round(time.monotonic() - started, 1)
    entry["output-dir"] = str(out)
    write_status(status_dir, entry)
    status = entry.get("status")
    details = f" ({entry['status-details']})" if entry.get("status-details") not in (None, "", "N/A") else ""
    print(f"[job] run {run_id}: {status}{details} after {entry['job-seconds']} s", flush=True)
    if (out / "result.json").exists():
        print(f"[job] {out / 'result.json'}:\n" + summary(json.loads((out / "result.json").read_text())), flush=True)
    return 0 if status == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
