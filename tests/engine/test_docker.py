"""The docker compose demo cluster (docker-compose.yml, docker/).

* Always: the compose file and the demo data agree with each other and with the run-config
  keys (no Docker needed).
* Engine: the cluster brought up for real (SuperLink, SuperExecs, 3 SuperNodes and the
  one-shot job) on demo data in a temporary folder, plain and with the TLS + SuperNode
  authentication override (docker-compose.tls.yml, certificates made here); the run must
  finish completed and its result land in the mounted folder. FEDCLUSTER_DOCKER_TESTS=1
  (what .ci/run sets after starting an engine and building the images) makes a missing
  engine, Compose or image a failure; FEDCLUSTER_DOCKER_TESTS=0 skips on request; unset,
  they skip with the reason (a developer machine without Docker).

Each test owns what it runs, so that two test runs on one machine (two clones, two pytest
sessions, two CI runs) never meet: a compose project of its own (``fedclustertest-<run>-<id>``,
hence its own containers and internal network; <run> is $FEDCLUSTER_DOCKER_RUN, set by
.ci/docker.sh so that its teardown removes only its own run's projects), the image of this
clone's last build (the per-build tag docker/build.sh writes to docker/build/image-tag, never
the shared ``fedcluster`` another clone's build may retag), and its data, results and
certificates in its own temporary folder. The compose files publish no port on the host. A
job that did not complete is reported by what it did: its flwr-run.json, else Flower's own
record of the runs (``run_job.py --list-runs`` on the still-running SuperLink), and the
containers' logs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fedcluster.config import parse_run_config, with_defaults

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
TLS_FILE = ROOT / "docker-compose.tls.yml"
IMAGE_TAG_FILE = ROOT / "docker" / "build" / "image-tag"
DOCKER_TESTS = os.environ.get("FEDCLUSTER_DOCKER_TESTS", "").strip()
if DOCKER_TESTS not in ("", "0", "1"):
    raise ValueError(f"FEDCLUSTER_DOCKER_TESTS={DOCKER_TESTS!r}: use 1 (the Docker demo must run) or 0 (skip it)")
REQUIRED = DOCKER_TESTS == "1"
SUPERNODES = ("supernode-1", "supernode-2", "supernode-3")
PROJECT_PREFIX = "fedclustertest"


def docker_run_id(environ=os.environ) -> str:
    """$FEDCLUSTER_DOCKER_RUN (what .ci/docker.sh sets per CI run), else ``local``."""
    run = environ.get("FEDCLUSTER_DOCKER_RUN", "").strip() or "local"
    if not re.fullmatch(r"[a-z0-9]{1,32}", run):
        raise ValueError(f"FEDCLUSTER_DOCKER_RUN={run!r}: use 1 to 32 lowercase letters and digits")
    return run


def project_name(environ=os.environ) -> str:
    """A compose project of this test alone: its containers, network and volumes are named by it."""
    return f"{PROJECT_PREFIX}-{docker_run_id(environ)}-{uuid.uuid4().hex[:12]}"


def image_name(environ=os.environ, tag_file: Path = IMAGE_TAG_FILE) -> str:
    """$FEDCLUSTER_IMAGE, else the image of this clone's last build (docker/build/image-tag,
    a tag of that build alone), else ``fedcluster``."""
    if environ.get("FEDCLUSTER_IMAGE", "").strip():
        return environ["FEDCLUSTER_IMAGE"].strip()
    if tag_file.is_file() and tag_file.read_text().strip():
        return tag_file.read_text().strip()
    return "fedcluster"


def job_status(out: Path, exit_code: int | str, list_runs) -> dict:
    """What the job did: its flwr-run.json, else Flower's own record of its run (``list_runs()``
    gives the output of ``run_job.py --list-runs``), with the job's exit code (or why there is
    none: its container gone, still running)."""
    path = out / "flwr-run.json"
    if path.is_file():
        try:
            return {**json.loads(path.read_text()), "job-exit-code": exit_code}
        except ValueError as exc:
            return {"status": "unknown", "job-exit-code": exit_code, "note": f"{path} is not JSON: {exc}"}
    missing = f"no {path.name} from the job"
    try:
        flower = json.loads(list_runs())
    except ValueError as exc:
        flower = {"error": f"flwr ls gave no JSON: {exc}"}
    runs = flower.get("runs") or []
    if runs:  # the demo cluster's SuperLink sees one run: the job's
        last = max(runs, key=lambda run: int(run.get("run-id", 0)))
        return {**last, "job-exit-code": exit_code, "note": f"{missing}; the status is flwr ls's"}
    return {
        "status": "unknown",
        "job-exit-code": exit_code,
        "note": f"{missing}; flwr ls: {flower.get('error', 'no run on the SuperLink')}",
    }


def job_failure(status: dict, logs) -> str | None:
    """None when the job exited 0 with Flower's finished:completed; else what the job did
    (the status, its details, the exit code, notes) and the containers' logs (``logs()``)."""
    if status.get("status") == "finished:completed" and status.get("job-exit-code") == 0:
        return None
    keys = ("run-id", "status", "status-details", "error", "job-exit-code", "job-timeout", "note")
    said = "; ".join(f"{key}: {status[key]}" for key in keys if key in status)
    return f"the job did not complete: {said}\n--- container logs ---\n{logs()}"


def make_demo_data_module():
    spec = importlib.util.spec_from_file_location("make_demo_data", ROOT / "docker" / "make_demo_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_services(path: Path = COMPOSE_FILE) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())["services"]


def mounts(service: dict) -> dict[str, str]:
    """container path -> host path (unexpanded) of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        for mode in (":ro", ":rw"):
            volume = volume.removesuffix(mode)
        host, container = volume.rsplit(":", 1)  # the host side may hold ${VAR:-default}
        out[container] = host
    return out


# --- always ------------------------------------------------------------------------------------


def test_demo_data_is_three_non_iid_files(tmp_path):
    manifest = make_demo_data_module().make(tmp_path)
    files = [tmp_path / f"node-{i}" / "client.npy" for i in (1, 2, 3)]
    arrays = [np.load(f) for f in files]
    assert [a.shape[0] for a in arrays] == [c["num_points"] for c in manifest["clients"]]
    assert sum(a.shape[0] for a in arrays) == manifest["num_points"] == 1250
    assert all(a.shape[1] == 2 and np.isfinite(a).all() for a in arrays)
    cluster_sets = [frozenset(c["clusters"]) for c in manifest["clients"]]
    assert len(set(cluster_sets)) == 3 and all(len(s) < 4 for s in cluster_sets)  # label skew
    assert frozenset().union(*cluster_sets) == {"A", "B", "C", "D"}


def test_compose_file_gives_each_supernode_its_own_file_and_a_valid_job():
    services = compose_services()
    data_dirs = set()
    for name in SUPERNODES:
        node, superexec = services[name], services[f"superexec-clientapp-{name[-1]}"]
        command = node["command"]
        # its own file, and a partition-id of its own: a run repeats with its seed (docs/DESIGN.md)
        assert (
            command[command.index("--node-config") + 1]
            == f'data-path="/data/client.npy" partition-id={int(name[-1]) - 1}'
        )
        assert command[command.index("--superlink") + 1] == "superlink:8000"
        assert "process" == command[command.index("--isolation") + 1]
        runtime = f"{name}:{command[command.index('--port') + 1]}"
        assert superexec["command"][superexec["command"].index("--runtime-api-address") + 1] == runtime
        # the ClientApp runs in the SuperExec: it must see the same (and only this) folder
        assert mounts(node)["/data"] == mounts(superexec)["/data"]
        data_dirs.add(mounts(node)["/data"])
    assert len(data_dirs) == len(SUPERNODES)
    job = services["job"]
    (run_config,) = job["command"]
    config = with_defaults(parse_run_config(run_config))
    assert config["min-nodes"] == len(SUPERNODES)
    assert config["output-dir"] == ""  # the job gives each run a folder of its own under /out (run_job.py)
    assert mounts(job)["/out"] == mounts(services["superexec-serverapp"])["/out"]
    assert services["superlink"]["command"][:1] == ["flower-superlink"]


def test_tls_override_secures_every_link_to_the_superlink_and_registers_every_supernode():
    base, tls = compose_services(), compose_services(TLS_FILE)
    assert set(tls) <= set(base) | {"register"}
    superlink = tls["superlink"]["command"]
    assert "--insecure" not in superlink and "--enable-supernode-auth" in superlink
    served = {
        flag: superlink[superlink.index(flag) + 1] for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile")
    }
    assert set(served.values()) <= set(mounts(tls["superlink"]))
    registered = tls["register"]["command"][tls["register"]["command"].index("--register") + 1 :]
    every_mount = {}
    for name, service in tls.items():
        every_mount.update({host: name for host in mounts(service).values()})
        # what talks to the SuperLink verifies it against the CA
        command = service.get("command", [])
        assert "--insecure" not in command, name
        if name.startswith("supernode-"):
            key = command[command.index("--auth-supernode-private-key") + 1]
            host_key = mounts(service)[key]
            assert host_key.endswith(f"/{name}.key"), (name, host_key)  # its own key, no other
            assert f"/certs/{name}.key.pub" in registered
            assert service["depends_on"]["register"]["condition"] == "service_healthy"
            assert command[command.index("--root-certificates") + 1] in mounts(service)
    assert not [host for host in every_mount if host.endswith("/ca.key")]  # the CA key never leaves the host
    assert len(registered) == len(SUPERNODES)
    assert (
        tls["superexec-serverapp"]["command"][tls["superexec-serverapp"]["command"].index("--root-certificates") + 1]
        == "/certs/ca.crt"
    )
    assert tls["job"]["environment"]["ROOT_CERTIFICATES"] in mounts(tls["job"])
    # the services that talk only to their own SuperNode are left as they are
    assert not {f"superexec-clientapp-{i}" for i in (1, 2, 3)} & set(tls)


def test_each_test_cluster_is_a_compose_project_of_its_own_run():
    names = {project_name({"FEDCLUSTER_DOCKER_RUN": "ci7f3a"}) for _ in range(20)}
    assert len(names) == 20  # never the same project twice, so never the same containers
    # the prefix .ci/docker.sh's teardown removes (its own run's projects, no other run's)
    assert all(re.fullmatch(r"fedclustertest-ci7f3a-[0-9a-f]{12}", name) for name in names)
    assert project_name({}).startswith("fedclustertest-local-")
    for bad in ("CI", "a-b", "x" * 33, "a b"):
        with pytest.raises(ValueError, match="FEDCLUSTER_DOCKER_RUN"):
            project_name({"FEDCLUSTER_DOCKER_RUN": bad})
    # nothing in the compose files is named outside the project or bound on the host
    for path in (COMPOSE_FILE, TLS_FILE):
        yaml = pytest.importorskip("yaml")
        document = yaml.safe_load(path.read_text())
        for name, service in document["services"].items():
            assert not {"container_name", "ports", "network_mode"} & set(service), (path.name, name)
        assert not [n for n in (document.get("networks") or {}).values() if n and ("name" in n or n.get("external"))]
        assert not document.get("volumes")


def test_the_image_is_this_clones_build_unless_named(tmp_path):
    tag_file = tmp_path / "image-tag"
    assert image_name({}, tag_file) == "fedcluster"  # never built here: the compose files' default
    tag_file.write_text("fedcluster:b-0123456789ab\n")  # what docker/build.sh writes
    assert image_name({}, tag_file) == "fedcluster:b-0123456789ab"
    assert image_name({"FEDCLUSTER_IMAGE": "mine:1"}, tag_file) == "mine:1"


def test_a_job_that_left_no_status_file_is_reported_by_flowers_status(tmp_path):
    asked = []

    def list_runs():
        asked.append(True)
        return json.dumps(
            {
                "runs": [
                    {"run-id": 3, "status": "finished:completed"},
                    {"run-id": 7, "status": "finished:failed", "status-details": "No heartbeat received from the task"},
                ]
            }
        )

    status = job_status(tmp_path, 1, list_runs)  # no flwr-run.json in tmp_path
    assert asked and status["run-id"] == 7 and status["status"] == "finished:failed"
    message = job_failure(status, lambda: "superlink-1 | LOG LINE")
    assert "finished:failed" in message and "No heartbeat received" in message
    assert "job-exit-code: 1" in message and "flwr-run.json" in message and "LOG LINE" in message
    # nothing from Flower either (SuperLink gone): still a status, with why
    status = job_status(
        tmp_path,
        "none, container gone",
        lambda: json.dumps({"error": "the SuperLink at superlink:8000 does not answer"}),
    )
    assert status["status"] == "unknown" and "does not answer" in job_failure(status, lambda: "")
    assert job_status(tmp_path, 1, lambda: "not json")["status"] == "unknown"
    # the job's own file is what counts when it is there; a completed run with exit 0 passes
    (tmp_path / "flwr-run.json").write_text(json.dumps({"run-id": 1, "status": "finished:completed"}))
    assert job_failure(job_status(tmp_path, 0, list_runs), lambda: "") is None
    assert "job-exit-code: 137" in job_failure(job_status(tmp_path, 137, list_runs), lambda: "")
    assert len(asked) == 1


# --- engine: the cluster for real ---------------------------------------------------------------


def _unavailable(reason: str):
    if DOCKER_TESTS == "0":
        pytest.skip("FEDCLUSTER_DOCKER_TESTS=0: the Docker demo is skipped on request")
    if REQUIRED:
        pytest.fail(f"{reason} (FEDCLUSTER_DOCKER_TESTS is set)")
    pytest.skip(reason)


def compose_command() -> list[str]:
    """`docker compose` (v2) or `docker-compose` (v1), or skip."""
    if not shutil.which("docker"):
        _unavailable("no docker CLI")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        _unavailable("no Docker engine answers ('docker info' fails); start dockerd to run the docker demo test")
    image = image_name()
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60).returncode != 0:
        _unavailable(f"image {image!r} not built: run bash docker/build.sh")
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    _unavailable("neither 'docker compose' nor 'docker-compose' is installed")


class Cluster:
    def __init__(self, tmp_path: Path, tls: bool = False) -> None:
        self.compose = compose_command()
        self.data = tmp_path / "data"
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.project = project_name()
        self.image = image_name()
        self.env = {
            **os.environ,
            "FEDCLUSTER_DATA": str(self.data),
            "FEDCLUSTER_OUT": str(self.out),
            "FEDCLUSTER_IMAGE": self.image,
        }
        self.files = ["-f", str(COMPOSE_FILE)]
        if tls:
            from fedcluster.tools.certs import make_certs

            certs = make_certs(tmp_path / "certs", hosts=("superlink",), supernodes=len(SUPERNODES))
            self.env["FEDCLUSTER_CERTS"] = str(certs.out)
            self.files += ["-f", str(TLS_FILE)]

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        command = [*self.compose, *self.files, "-p", self.project, *args]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=ROOT)

    def logs(self, *services: str, tail: int = 40) -> str:
        done = self("logs", "--no-color", "--tail", str(tail), *services, timeout=120)
        return done.stdout[-12000:] + done.stderr[-2000:]

    def list_runs(self) -> str:
        """Flower's record of every run on this cluster's SuperLink (run_job.py --list-runs)."""
        done = self("run", "--rm", "--no-deps", "-T", "job", "--list-runs", timeout=180)
        return (
            done.stdout.strip().splitlines()[-1]
            if done.stdout.strip()
            else json.dumps({"error": f"rc {done.returncode}: {done.stderr[-1500:]}"})
        )


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_docker_compose_cluster_runs_a_job_to_completion(tmp_path, variant):
    cluster = Cluster(tmp_path, tls=variant == "tls")
    manifest = make_demo_data_module().make(cluster.data)
    timings = {}
    passed = False
    try:
        started = time.monotonic()
        up = cluster("up", "-d", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        timings["up"] = time.monotonic() - started
        job_id = cluster("ps", "-a", "-q", "job").stdout.strip()
        assert job_id, cluster.logs()
        # the one-shot job submits the run, waits for it and exits 0 only on finished:completed
        try:
            waited = subprocess.run(["docker", "wait", job_id], capture_output=True, text=True, timeout=900)
            exit_code = (
                int(waited.stdout)
                if waited.stdout.strip().isdigit()
                else f"none, docker wait: {waited.stderr.strip()[-300:]}"
            )
        except subprocess.TimeoutExpired:
            exit_code = "none, still running after 900 s"
        timings["job"] = time.monotonic() - started - timings["up"]
        status = job_status(cluster.out, exit_code, cluster.list_runs)
        failure = job_failure(status, cluster.logs)
        assert failure is None, failure
        run_dir = cluster.out / Path(status["output-dir"]).name  # /out/run-<time> in the job's container
        result = json.loads((run_dir / "result.json").read_text())
        assert result["nodes"]["connected"] == 3
        assert result["final"]["num_points"] == manifest["num_points"] == 1250
        assert math.isfinite(result["final"]["cost"])
        centers = np.load(run_dir / "centers.npy")
        assert centers.shape == (4, 2) and np.isfinite(centers).all()
        # the federated centers are as good as central k-means on the pooled files
        from sklearn.cluster import KMeans

        X = np.concatenate([np.load(cluster.data / f"node-{i}" / "client.npy") for i in (1, 2, 3)])
        central = KMeans(4, n_init=10, random_state=0).fit(X).inertia_ / X.shape[0]
        federated = ((X[:, None, :] - centers[None]) ** 2).sum(-1).min(1).mean()
        assert abs(federated - result["final"]["cost"]) <= 1e-6 * max(1.0, federated)
        assert federated <= 1.02 * central, (federated, central)
        if variant == "tls":  # the SuperNodes connected with their registered keys, over TLS
            registered = cluster("logs", "--no-color", "register", timeout=120).stdout
            assert all(f"supernode-{i}.key.pub: registered" in registered for i in (1, 2, 3)), registered
        print(
            f"docker demo ({variant}): up {timings['up']:.1f} s, job {timings['job']:.1f} s, status "
            f"{status['status']}, cost {federated:.4f} (central {central:.4f})"
        )
        passed = True
    finally:
        down = cluster("down", "-v", "--remove-orphans", timeout=300)
    assert not passed or down.returncode == 0, down.stdout + down.stderr
