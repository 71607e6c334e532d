"""An emulated mobile link in user space: a TCP proxy that delays and drops.

The kernels these benchmarks run on have no ``netem``, so the delay, its jitter and dropped
connections are made here (a rate limit is the kernel's ``tc tbf``, see
:mod:`fedcluster.tools.constrained`). Every accepted connection is forwarded to ``--target``;
each chunk read, in either direction, is held for a delay drawn uniformly from ``delay +-
jitter`` and delivered in order (a chunk never overtakes the one before it, as on TCP). Each
connection lives for an exponentially distributed time of mean ``--drop-mean-s`` seconds
and is then cut (both sockets aborted): the device sees its link drop and reconnects.

    python -m fedcluster.tools.link_proxy --listen 10.246.0.1:9092 --listen 10.246.0.5:9092 \\
        --target 127.0.0.1:9092 --delay-ms 100 --jitter-ms 20 --drop-mean-s 60 --stats stats.json

``--stats FILE`` is rewritten every second: connections accepted, dropped by the proxy and
bytes forwarded each way, per listening address. It stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 65536


@dataclass(frozen=True)
class Link:
    """The link's shape: one-way delay and jitter per chunk (seconds), mean connection life."""

    delay: float = 0.1
    jitter: float = 0.02
    drop_mean: float = 0.0  # 0: never drop
    min_life: float = 0.0  # no drop in a connection's first seconds (its TLS handshake)

    def __post_init__(self) -> None:
        if not (0 <= self.jitter <= self.delay) or self.drop_mean < 0 or self.min_life < 0:
            raise ValueError(f"link: need 0 <= jitter <= delay and drop-mean >= 0, got {self}")


@dataclass
class Stats:
    accepted: int = 0
    dropped: int = 0
    bytes_up: int = 0  # towards the target (device -> server)
    bytes_down: int = 0
    by_address: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, address: str, key: str, amount: int = 1) -> None:
        setattr(self, key, getattr(self, key) + amount)
        entry = self.by_address.setdefault(address, {"accepted": 0, "dropped": 0, "bytes_up": 0, "bytes_down": 0})
        entry[key] += amount


async def _pump(reader, writer, link: Link, rng: random.Random, tally) -> None:
    """Forward ``reader`` to ``writer``, each chunk after its drawn delay, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(chunk)
            await writer.drain()
            tally(len(chunk))

    sender = asyncio.ensure_future(deliver())
    last_due = 0.0
    try:
        while chunk := await reader.read(CHUNK):
            last_due = max(last_due, time.monotonic() + rng.uniform(link.delay - link.jitter, link.delay + link.jitter))
            queue.put_nowait((last_due, chunk))
        queue.put_nowait((0.0, None))
        await sender
        if writer.can_write_eof():
            writer.write_eof()
    finally:
        sender.cancel()


async def _connection(reader, writer, target, link: Link, rng: random.Random, stats: Stats, address: str) -> None:
    stats.count(address, "accepted")
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.transport.abort()
        return
    pumps = asyncio.gather(
        _pump(reader, up_writer, link, rng, lambda n: stats.count(address, "bytes_up", n)),
        _pump(up_reader, writer, link, rng, lambda n: stats.count(address, "bytes_down", n)),
    )
    life = link.min_life + rng.expovariate(1.0 / link.drop_mean) if link.drop_mean > 0 else None
    try:
        await asyncio.wait_for(pumps, life)
    except asyncio.TimeoutError:
        stats.count(address, "dropped")  # the link drops: both ends see a reset
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        pumps.cancel()
        writer.transport.abort()
        up_writer.transport.abort()


def _write_stats(path, stats: Stats) -> None:
    """Replace the file whole: a reader never sees it half written."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(stats.__dict__))
    tmp.replace(path)


async def serve(listen: list[tuple[str, int]], target: tuple[str, int], link: Link, seed: int, stats_file) -> None:
    rng, stats = random.Random(seed), Stats()
    servers = []
    for host, port in listen:
        address = f"{host}:{port}"
        servers.append(
            await asyncio.start_server(
                lambda r, w, a=address: _connection(r, w, target, link, rng, stats, a), host, port, reuse_address=True
            )
        )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"link proxy: {', '.join(f'{h}:{p}' for h, p in listen)} -> {target[0]}:{target[1]}", flush=True)
    while not stop.is_set():
        if stats_file:
            _write_stats(stats_file, stats)
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
    for server in servers:
        server.close()
    if stats_file:
        _write_stats(stats_file, stats)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedcluster.tools.link_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, action="append", required=True, metavar="HOST:PORT")
    parser.add_argument("--target", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=100.0)
    parser.add_argument("--jitter-ms", type=float, default=20.0)
    parser.add_argument("--drop-mean-s", type=float, default=0.0, help="mean seconds a connection lives (0: forever)")
    parser.add_argument("--min-life-s", type=float, default=0.0, help="no drop in a connection's first seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    try:
        link = Link(args.delay_ms / 1000, args.jitter_ms / 1000, args.drop_mean_s, args.min_life_s)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(args.listen, args.target, link, args.seed, args.stats))
    except OSError as exc:
        print(f"link proxy: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
