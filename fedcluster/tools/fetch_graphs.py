"""``fedcluster-fetch-graphs``: download the SNAP graphs the graph algorithms are tested on.

The files (Leskovec & Krevl, "SNAP Datasets: Stanford Large Network Dataset Collection")
are served gzip-compressed; this command downloads each ``NAME.txt.gz`` from ``--base-url``
(SNAP's data folder by default), decompresses it and keeps it as ``NAME.txt`` in ``--out``
only when the SHA-256 of the decompressed text is the one recorded below. The checksum is of
the decompressed file because gzip headers carry a time stamp: the text is what must not
change. A file already in ``--out`` with the right checksum is not downloaded again.

Example::

    fedcluster-fetch-graphs --out graphs
    fedcluster-split-graph graphs/email-Eu-core.txt --clients 5 --overlap 0.4 --out /tmp/email5

``--base-url file:///path/to/mirror/`` reads from a local mirror holding the same ``.gz``
files (the tests do that: no network needed). Nothing here needs flwr.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from .cli import ToolParser, UsageError, number, output_folder, refuse

DEFAULT_BASE_URL = "https://snap.stanford.edu/data/"


@dataclass(frozen=True)
class Graph:
    name: str  # the file written, NAME.txt
    sha256: str  # of the decompressed text
    size: int  # bytes, decompressed
    what: str

    @property
    def remote(self) -> str:
        return f"{self.name}.gz"


GRAPHS = (
    Graph(
        "email-Eu-core.txt",
        "a26687d337488baf01394f9cf532314ac5b9fb3909a8d1c6743bcc428379ed11",
        192_699,
        "directed email network, 1005 nodes, 25,571 edges",
    ),
    Graph(
        "email-Eu-core-department-labels.txt",
        "91a089f21ee35eb224066456fa5322c8ad57c0f07b2da7a58a3220c72b5d54b5",
        6_537,
        "department of each email-Eu-core node (42 departments, ground truth)",
    ),
    Graph(
        "facebook_combined.txt",
        "f41c026ed8af3cc3359f1ca5573d0605fb09ae0eefa34544b820fd8c6e2ef296",
        854_362,
        "ego-Facebook, undirected, 4039 nodes, 88,234 edges",
    ),
)


class FetchError(RuntimeError):
    """A graph could not be fetched or did not match its checksum (the message says which)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(graph: Graph, out: Path, base_url: str = DEFAULT_BASE_URL, timeout: float = 60.0) -> Path:
    """Download ``graph`` into ``out`` and verify it; return the path of the verified file.

    Nothing is left in ``out`` unless the checksum matches (a partial or corrupt download
    is removed); the error names the file, the URL and both checksums."""
    target = out / graph.name
    url = base_url.rstrip("/") + "/" + graph.remote
    out.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{graph.name}.", suffix=".part", dir=out)
    temp = Path(temp_name)
    try:
        digest = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(handle, "wb") as sink, urllib.request.urlopen(url, timeout=timeout) as response:
                with gzip.GzipFile(fileobj=response) as source:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        digest.update(block)
                        size += len(block)
                        sink.write(block)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise FetchError(f"{graph.name}: {url} is not a complete gzip file ({exc}); nothing written") from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise FetchError(f"{graph.name}: cannot download {url}: {exc}") from exc
        actual = digest.hexdigest()
        if actual != graph.sha256:
            raise FetchError(
                f"{graph.name}: checksum mismatch for {url}: SHA-256 of the decompressed file is {actual} "
                f"({size} bytes), expected {graph.sha256} ({graph.size} bytes); the download is corrupt or "
                "the file changed upstream; nothing written"
            )
        os.replace(temp, target)
        return target
    finally:
        if temp.exists():
            temp.unlink()


def base_url(text: str) -> str:
    """An argparse type: an http(s) or file URL (where the ``NAME.txt.gz`` files are)."""
    if urllib.parse.urlsplit(text).scheme not in ("http", "https", "file"):
        raise argparse.ArgumentTypeError(f"must be an http://, https:// or file:// URL, got {text!r}")
    return text


def build_parser() -> ToolParser:
    what = (
        "Download the SNAP graphs (email-Eu-core with its department labels, ego-Facebook) and verify each against "
        "its SHA-256."
    )
    parser = ToolParser(prog="fedcluster-fetch-graphs", description=what)
    parser.add_argument("--out", default="graphs", help="folder to write NAME.txt into (default: ./graphs)")
    parser.add_argument(
        "--base-url",
        type=base_url,
        default=DEFAULT_BASE_URL,
        help=f"where the NAME.txt.gz files are (default {DEFAULT_BASE_URL}; file:///dir/ for a local mirror)",
    )
    parser.add_argument("--force", action="store_true", help="download again even when a verified copy is there")
    parser.add_argument(
        "--timeout",
        type=number(0, 10**6, low_open=True),
        default=60.0,
        help="seconds per download before giving up (default 60)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = output_folder(args.out, "--out").resolve()
    except UsageError as exc:
        parser.error(str(exc))
    failures = 0
    for graph in GRAPHS:
        target = out / graph.name
        if target.is_file() and not args.force and sha256_of(target) == graph.sha256:
            print(f"{graph.name}: already there, checksum ok ({target})")
            continue
        try:
            fetch(graph, out, args.base_url, args.timeout)
        except (FetchError, OSError, ValueError) as exc:
            refuse("fedcluster-fetch-graphs", exc)
            failures += 1
            continue
        print(f"{graph.name}: downloaded, checksum ok ({graph.what}) -> {target}")
    if failures:
        print(f"fedcluster-fetch-graphs: {failures} of {len(GRAPHS)} file(s) failed", file=sys.stderr)
        return 1
    print(f"graphs in {out}; tests find them with FEDCLUSTER_GRAPHS={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
