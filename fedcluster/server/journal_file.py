"""The journal's file format (:mod:`fedcluster.server.journal`): frames of
``length (8 bytes) | crc32 (4 bytes) | payload``; a payload is a JSON header (its own length
first) followed by the replies as Flower's protobuf messages. Nothing in it is unpickled."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any, Iterable

from flwr.app import Message
from flwr.common import serde
from flwr.proto.message_pb2 import Message as ProtoMessage

FRAME = struct.Struct("<QI")
_HEADER = struct.Struct("<I")


def encode(header: dict[str, Any], blobs: Iterable[bytes] = ()) -> bytes:
    blobs = list(blobs)
    text = json.dumps({**header, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    return _HEADER.pack(len(text)) + text + b"".join(blobs)


def decode(payload: bytes) -> tuple[dict[str, Any], list[bytes]]:
    (size,) = _HEADER.unpack_from(payload)
    header = json.loads(payload[_HEADER.size : _HEADER.size + size])
    blobs, at = [], _HEADER.size + size
    for length in header.pop("blobs"):
        blobs.append(payload[at : at + length])
        at += length
    if at != len(payload):
        raise ValueError("a journal frame's blobs do not fill it")
    return header, blobs


def read_frames(path: Path) -> tuple[list[bytes], int]:
    """The complete frames of a journal file and the offset where they end (a frame cut
    short by a crash, or damaged, ends the journal: what follows it is not trusted)."""
    data = path.read_bytes() if path.exists() else b""
    frames, at = [], 0
    while at + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, at)
        payload = data[at + FRAME.size : at + FRAME.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            break
        frames.append(payload)
        at += FRAME.size + length
    return frames, at


def message_bytes(message: Message) -> bytes:
    return serde.message_to_proto(message).SerializeToString()


def message_from(blob: bytes) -> Message:
    return serde.message_from_proto(ProtoMessage.FromString(blob))
