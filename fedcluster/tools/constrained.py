"""Phone-class devices on this machine: a secure deployment whose SuperNodes run capped.

:class:`ConstrainedCluster` is a :class:`~fedcluster.tools.local_cluster.LocalCluster` (TLS +
SuperNode authentication) whose every SuperNode, with the ClientApp processes it starts,
runs in cgroups (v1: a memory limit, a CPU quota, CPU accounting) of its own and in a network
namespace of its own, joined to this host by a veth pair whose device side sends at most
``uplink`` (``tc tbf``); it reaches the SuperLink's Fleet API only through
:mod:`fedcluster.tools.link_proxy` (delay, jitter, dropped connections), which listens on
the host side of every pair. Everything is created by :meth:`start` and removed by
:meth:`stop` (processes by PID, then the namespaces, links and cgroups), failed or not.

Needs root, the cgroup v1 ``memory``, ``cpu`` and ``cpuacct`` hierarchies, ``ip`` and
``tc``: :func:`unavailable` says what is missing (None when all is there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .local_cluster import LocalCluster

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "cpuacct")
FLEET_PORT = 9092  # the proxy's port on every host-side address


@dataclass(frozen=True)
class Limits:
    """What one device gets: memory (bytes), CPU (a fraction of a core), the link."""

    memory: int = 256 * 2**20
    cpu: float = 0.25
    uplink: str = "1mbit"  # tc rate of the device's sending side
    delay_ms: float = 100.0
    jitter_ms: float = 20.0
    drop_mean_s: float = 60.0  # mean life of a connection before the link drops it (0: never)
    min_life_s: float = 0.0  # no drop in a connection's first seconds


def unavailable() -> str | None:
    """Why a constrained cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "needs root (cgroups and network namespaces)"
    missing = [c for c in CONTROLLERS if not (CGROUP_ROOT / c / "cgroup.procs").is_file()]
    if missing:
        return f"cgroup v1 controller(s) not mounted under {CGROUP_ROOT}: {', '.join(missing)}"
    for command in ("ip", "tc"):
        if shutil.which(command) is None:
            return f"'{command}' not found (iproute2)"
    probe = f"fcprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    return None


class Cgroup:
    """One device's cgroups (the same name under each controller)."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.paths = {c: CGROUP_ROOT / c / name for c in CONTROLLERS}
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)
        self.write("memory", "memory.limit_in_bytes", limits.memory)
        period = 100_000
        self.write("cpu", "cpu.cfs_period_us", period)
        self.write("cpu", "cpu.cfs_quota_us", int(limits.cpu * period))

    def write(self, controller: str, file: str, value) -> None:
        (self.paths[controller] / file).write_text(str(value))

    def read(self, controller: str, file: str) -> str:
        return (self.paths[controller] / file).read_text()

    def prefix(self) -> tuple[str, ...]:
        """A command prefix that joins these cgroups, then execs the rest (its children inherit)."""
        procs = " ".join(f"{p / 'cgroup.procs'}" for p in self.paths.values())
        return ("sh", "-c", f'for f in {procs}; do echo $$ > "$f"; done; exec "$@"', "cgroup")

    def reset_peak(self) -> None:
        self.write("memory", "memory.max_usage_in_bytes", 0)

    def snapshot(self) -> dict:
        """Memory now (resident, charged with page cache), its peak, OOM kills, CPU seconds."""
        stat = dict(line.split() for line in self.read("memory", "memory.stat").splitlines())
        oom = dict(line.split() for line in self.read("memory", "memory.oom_control").splitlines())
        throttled = dict(line.split() for line in self.read("cpu", "cpu.stat").splitlines())
        return {
            "rss": int(stat.get("total_rss", 0)),
            "usage": int(self.read("memory", "memory.usage_in_bytes")),
            "peak_usage": int(self.read("memory", "memory.max_usage_in_bytes")),
            "oom_kills": int(oom.get("oom_kill", 0)),
            "cpu_s": int(self.read("cpuacct", "cpuacct.usage")) / 1e9,
            "throttled_s": int(throttled.get("throttled_time", 0)) / 1e9,
        }

    def kill_all(self) -> None:
        """SIGKILL whatever is left inside (a ClientApp orphaned by an OOM-killed SuperNode is
        in no process group of ours), the CPU quota lifted first: a throttled process dies slowly."""
        try:
            self.write("cpu", "cpu.cfs_quota_us", -1)
            pids = self.read("memory", "cgroup.procs").split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        self.kill_all()
        for path in self.paths.values():
            for _ in range(300):  # a process killed a moment ago may still be listed
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    for pid in (path / "cgroup.procs").read_text().split():
                        try:
                            os.kill(int(pid), 9)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.1)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Namespace:
    """A network namespace joined to the host by a veth pair (/30 subnet 10.<b>.<i>.0):
    the host side listens for the device, the device side sends at most ``uplink``."""

    def __init__(self, tag: str, index: int, octet: int, uplink: str) -> None:
        self.name, self.host_if, self.device_if = f"fc{tag}n{index}", f"fc{tag}h{index}", f"fc{tag}d{index}"
        self.host_ip, self.device_ip = f"10.{octet}.{index}.1", f"10.{octet}.{index}.2"
        try:
            self._create(uplink)
        except OSError:
            self.remove()
            raise

    def _create(self, uplink: str) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.device_if)
        _ip("link", "set", self.device_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.device_ip}/30", "dev", self.device_if)
        _ip("-n", self.name, "link", "set", self.device_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")  # the SuperNode's ClientAppIo API is on its loopback
        if uplink:
            done = subprocess.run(
                ["ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev", self.device_if, "root", "tbf"]
                + ["rate", uplink, "burst", "32kbit", "latency", "500ms"],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise OSError(f"tc tbf on {self.name}: {done.stderr.strip()}")

    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class Sampler(threading.Thread):
    """Reads every cgroup's resident memory every ``interval`` seconds; keeps each peak."""

    def __init__(self, cgroups: list[Cgroup], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.cgroups, self.interval = cgroups, interval
        self.peak_rss = [0] * len(cgroups)
        self.peak_by_process: dict[str, int] = {}  # process name -> largest resident set (bytes) seen
        self.most_at_once: dict[str, int] = {}  # process name -> most running at once in one device
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for i, group in enumerate(self.cgroups):
                try:
                    self.peak_rss[i] = max(self.peak_rss[i], group.snapshot()["rss"])
                    names = [self._process(pid) for pid in group.read("memory", "cgroup.procs").split()]
                    for name in set(names) - {None}:
                        self.most_at_once[name] = max(self.most_at_once.get(name, 0), names.count(name))
                except (OSError, ValueError):
                    pass
            self.halt.wait(self.interval)

    def _process(self, pid: str) -> str | None:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] or [b"?"]
        except OSError:
            return None
        rss = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
        key = Path(name[0].decode(errors="replace")).name
        self.peak_by_process[key] = max(self.peak_by_process.get(key, 0), rss)
        return key


class ConstrainedCluster(LocalCluster):
    """A :class:`LocalCluster` whose SuperNodes are phone-class devices (:class:`Limits`)."""

    def __init__(
        self,
        workdir: Path,
        data_files: list[Path],
        limits: Limits = Limits(),
        echo=print,
        seed=0,
        device_worker: bool = False,
    ) -> None:
        super().__init__(workdir, data_files, echo, device_worker)
        self.limits, self.seed = limits, seed
        self.tag = f"{os.getpid() % 10000}"
        self.octet = 200 + os.getpid() % 50
        self.cgroups: list[Cgroup] = []
        self.namespaces: list[Namespace] = []
        self.proxy: subprocess.Popen | None = None
        self.proxy_stats = self.workdir / "link-proxy.json"

    def start(self) -> None:
        for index in range(len(self.data_files)):
            self.namespaces.append(Namespace(self.tag, index, self.octet, self.limits.uplink))
            self.cgroups.append(Cgroup(f"fedcluster-{self.tag}/device-{index + 1}", self.limits))
        self.start_superlink(extra_hosts=tuple(n.host_ip for n in self.namespaces))
        self.start_proxy()
        for index in range(len(self.data_files)):
            self.register(index)
            self.start_supernode(index)
        self.echo(f"{len(self.data_files)} constrained SuperNode(s) started: {self.limits}")

    def start_proxy(self) -> None:
        args = [sys.executable, "-m", "fedcluster.tools.link_proxy", "--target", f"127.0.0.1:{self.port}"]
        for namespace in self.namespaces:
            args += ["--listen", f"{namespace.host_ip}:{FLEET_PORT}"]
        args += ["--delay-ms", str(self.limits.delay_ms), "--jitter-ms", str(self.limits.jitter_ms)]
        args += [
            "--drop-mean-s",
            str(self.limits.drop_mean_s),
            "--min-life-s",
            str(self.limits.min_life_s),
            "--seed",
            str(self.seed),
            "--stats",
            str(self.proxy_stats),
        ]
        self.proxy = self._start("link-proxy", args)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "link proxy:" not in self.tail("link-proxy"):
            if self.proxy.poll() is not None:
                raise OSError(f"the link proxy exited: {self.tail('link-proxy')}")
            time.sleep(0.2)

    def start_supernode(self, index: int, key: Path | None = None) -> subprocess.Popen:
        namespace = self.namespaces[index]
        return super(LocalCluster, self).start_supernode(
            f"supernode-{index + 1}",
            f'data-path="{self.data_files[index]}" partition-id={index}',
            certs=self.certs,
            key=key or self.certs.supernode_keys[index],
            superlink=f"{namespace.host_ip}:{FLEET_PORT}",
            prefix=(*self.cgroups[index].prefix(), *namespace.prefix()),
            device_worker=self.device_worker,
        )

    def link_stats(self) -> dict:
        try:
            return json.loads(self.proxy_stats.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for group in self.cgroups:
                group.remove()
            for controller in CONTROLLERS:
                parent = CGROUP_ROOT / controller / f"fedcluster-{self.tag}"
                for _ in range(100):
                    try:
                        parent.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
            for namespace in self.namespaces:
                namespace.remove()
