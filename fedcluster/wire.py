"""Fast NumPy <-> ``.npy`` bytes for message payloads.

Flower's ``Array`` carries a NumPy array as the bytes of an ``.npy`` file
(``stype="numpy.ndarray"``) and converts with ``np.save``/``np.load``, whose header
parsing (``ast.literal_eval``) dominates the cost of small messages: with 1000 devices and
several arrays per message it was most of a round's time. These two functions write and
read the same ``.npy`` format directly; anything unusual (Fortran order, big-endian,
version 2/3 headers) falls back to NumPy's own reader. :func:`array_layout` reads what an
``Array`` says it holds without decoding it (a reply is refused by its sizes first), and
:func:`record_of` takes a message's record by its name. Duck-typed: no Flower import.
"""

from __future__ import annotations

import functools
import io
import math
import struct

import numpy as np

_MAGIC = b"\x93NUMPY"


def record_of(content, name: str, kind: type):
    """The record ``name`` of a message's content when it is a ``kind`` (``ArrayRecord``,
    ``MetricRecord``, ``ConfigRecord``), else None: what ``content.array_records.get(name)``
    gives, without Flower building a filtered copy of every record at each such call."""
    record = content.get(name)
    return record if isinstance(record, kind) else None


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes of ``np.save(array)`` (format version 1.0, C order)."""
    array = np.asarray(array, order="C")
    if array.dtype.hasobject:
        raise TypeError("object arrays cannot be sent")
    return _npy_preamble(array.dtype, tuple(array.shape)) + array.tobytes()


@functools.lru_cache(maxsize=4096)
def _npy_preamble(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """Magic, version, length and header of a ``.npy`` file (the same few for every message)."""
    header = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (np.lib.format.dtype_to_descr(dtype), shape)
    # magic (6) + version (2) + length (2) + header + "\n", padded to a multiple of 64
    padding = -(10 + len(header) + 1) % 64
    header = header + " " * padding + "\n"
    return _MAGIC + b"\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1")


def from_npy_bytes(data: bytes, dtype: str, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Decode ``.npy`` bytes whose dtype and shape are known (a writable copy)."""
    view = memoryview(data)
    if bytes(view[:6]) == _MAGIC and view[6] == 1:
        (length,) = struct.unpack("<H", bytes(view[8:10]))
        header = bytes(view[10 : 10 + length])
        dt = np.dtype(dtype)
        if b"True" not in header and (dt.byteorder in "=|<" or dt.itemsize == 1):
            count = math.prod(int(s) for s in shape)  # 1 for shape ()
            offset = 10 + length
            if len(data) - offset == count * dt.itemsize:
                return np.frombuffer(data, dtype=dt, count=count, offset=offset).reshape(tuple(shape)).copy()
    return np.load(io.BytesIO(data), allow_pickle=False)


# The most bytes an .npy header may take in a message (NumPy writes 128 for the arrays sent here).
NPY_HEADER_MAX = 4096


def array_layout(array) -> tuple[np.dtype, tuple[int, ...]]:
    """What a ``flwr.app.Array`` says it holds, read from its metadata and its byte count
    alone, nothing decoded: ``(dtype, shape)``. ``ValueError`` says why it cannot be what it
    says (not a NumPy array, an unreadable dtype or shape, or data of another length than
    that shape and dtype take), so a reply can be refused by its sizes before
    :func:`array_numpy` reads any of it."""
    stype = getattr(array, "stype", None)
    if stype != "numpy.ndarray":
        raise ValueError(f"is not a NumPy array (stype {str(stype)[:40]!r})")
    try:
        dtype = np.dtype(str(array.dtype)[:40])
    except (TypeError, ValueError, SyntaxError):
        raise ValueError(f"has an unreadable dtype {str(array.dtype)[:40]!r}") from None
    shape = getattr(array, "shape", None)
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > 32
        or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise ValueError(f"has an unreadable shape {str(shape)[:60]}")
    shape = tuple(int(s) for s in shape)
    data = getattr(array, "data", None)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError("has no data bytes")
    payload = math.prod(shape) * dtype.itemsize
    if not payload <= len(data) <= payload + NPY_HEADER_MAX:
        raise ValueError(
            f"holds {len(data)} bytes, not the {payload} of its shape {shape} and dtype {dtype} "
            f"(and a header of at most {NPY_HEADER_MAX})"
        )
    return dtype, shape


def array_numpy(array) -> np.ndarray:
    """``flwr.app.Array`` -> NumPy, fast path (same result as ``array.numpy()``)."""
    if getattr(array, "stype", "numpy.ndarray") != "numpy.ndarray":
        return array.numpy()
    return from_npy_bytes(array.data, array.dtype, array.shape)


def array_fields(array: np.ndarray) -> dict:
    """Keyword arguments for ``flwr.app.Array(**fields)`` (fast path of ``Array(array)``)."""
    array = np.asarray(array, order="C")
    return {
        "dtype": str(array.dtype),
        "shape": tuple(int(s) for s in array.shape),
        "stype": "numpy.ndarray",
        "data": npy_bytes(array),
    }
