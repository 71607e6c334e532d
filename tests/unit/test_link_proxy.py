"""The emulated link (fedcluster.tools.link_proxy): delays every chunk each way, keeps the
order of the bytes, and drops a connection after its drawn life. In-process, on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest

from fedcluster.tools.link_proxy import Link, serve
from fedcluster.tools.flower import free_port


async def _echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _through_proxy(link: Link, payloads: list[bytes], pause: float = 0.0):
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    target = echo.sockets[0].getsockname()[:2]
    port = free_port()
    proxy = asyncio.ensure_future(serve([("127.0.0.1", port)], target, link, 0, None))
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got, times = b"", []
    try:
        for payload in payloads:
            started = time.monotonic()
            writer.write(payload)
            await writer.drain()
            want = len(got) + len(payload)
            while len(got) < want:
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                if not chunk:
                    return got, times, True
                got += chunk
            times.append(time.monotonic() - started)
            await asyncio.sleep(pause)
        return got, times, False
    finally:
        writer.close()
        proxy.cancel()
        echo.close()


def test_every_chunk_is_delayed_each_way_and_the_bytes_stay_in_order():
    payloads = [bytes([i]) * (1000 + i) for i in range(10)]
    got, times, dropped = asyncio.run(_through_proxy(Link(0.1, 0.02), payloads))
    assert got == b"".join(payloads) and not dropped
    assert min(times) >= 2 * 0.08 - 0.005, times  # there and back, each at least delay - jitter
    assert max(times) < 1.0, times


def test_a_connection_is_dropped_after_its_life():
    payloads = [b"x" * 100] * 200
    got, times, dropped = asyncio.run(_through_proxy(Link(0.001, 0.0, drop_mean=0.2), payloads, pause=0.01))
    assert dropped and len(got) < sum(map(len, payloads))


def test_a_link_shape_is_checked():
    with pytest.raises(ValueError, match="jitter"):
        Link(0.01, 0.02)
