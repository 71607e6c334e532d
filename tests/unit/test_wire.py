"""fedcluster.wire against NumPy's own .npy writer and reader (the oracle)."""

import io

import numpy as np
import pytest
from flwr.app import Array

from fedcluster.wire import NPY_HEADER_MAX, array_fields, array_layout, array_numpy, from_npy_bytes, npy_bytes

ARRAYS = [
    np.zeros(()),
    np.arange(5.0),
    np.ones((0, 3)),
    np.arange(12, dtype=np.int32).reshape(3, 4),
    np.full((2, 2, 2), 3, dtype=np.float32),
    np.array([True, False]),
    np.arange(6, dtype=np.uint8).reshape(2, 3),
    np.random.default_rng(0).standard_normal((7, 300)),
]


def numpy_save(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_bytes_are_those_of_np_save_and_decode_back(array):
    data = npy_bytes(array)
    assert data == numpy_save(array)
    decoded = from_npy_bytes(data, str(array.dtype), array.shape)
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    assert np.array_equal(decoded, array)
    decoded[...] = 0  # a writable copy, not a view of the message's bytes
    assert np.array_equal(from_npy_bytes(data, str(array.dtype), array.shape), array)


@pytest.mark.parametrize(
    "array",
    [np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(4, dtype=">f8")],
    ids=["fortran-order", "big-endian"],
)
def test_unusual_files_fall_back_to_numpys_reader(array):
    data = numpy_save(array)
    decoded = from_npy_bytes(data, str(array.dtype), array.shape)
    assert np.array_equal(decoded, np.load(io.BytesIO(data)))


def test_declared_shape_that_disagrees_with_the_bytes_is_not_trusted():
    data = npy_bytes(np.arange(6.0))
    decoded = from_npy_bytes(data, "float64", (4,))  # what the bytes say wins
    assert decoded.shape == (6,) and np.array_equal(decoded, np.arange(6.0))


def test_flower_array_round_trip_matches_flowers_own_conversion():
    array = np.random.default_rng(1).standard_normal((3, 4))
    fast = Array(**array_fields(array))
    assert fast.data == Array(array).data
    assert np.array_equal(array_numpy(fast), Array(array).numpy())


def test_object_arrays_are_refused():
    with pytest.raises(TypeError, match="object arrays"):
        npy_bytes(np.array([{}, 1], dtype=object))


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_layout_is_read_from_the_metadata_alone(array):
    assert array_layout(Array(**array_fields(array))) == (array.dtype, array.shape)
    assert array_layout(Array(array)) == (array.dtype, array.shape)  # Flower's own conversion too


@pytest.mark.parametrize(
    "lie, words",
    [
        ({"shape": (10**9,)}, "holds"),  # more elements than the bytes carry
        ({"dtype": "(1000000,)f8"}, "holds"),  # a sub-array dtype of 8 MB items
        ({"dtype": "no such type"}, "unreadable dtype"),
        ({"shape": (-1,)}, "unreadable shape"),
        ({"shape": "5"}, "unreadable shape"),
        ({"stype": "torch.Tensor"}, "not a NumPy array"),
    ],
)
def test_metadata_that_cannot_be_what_it_says_is_refused_unread(lie, words):
    array = Array(**array_fields(np.arange(5.0)))
    for key, value in lie.items():
        object.__setattr__(array, key, value)
    with pytest.raises(ValueError, match=words):
        array_layout(array)


def test_bytes_beyond_the_largest_header_are_refused():
    array = Array(**array_fields(np.arange(5.0)))
    object.__setattr__(array, "data", array.data + b" " * (NPY_HEADER_MAX + 1))
    with pytest.raises(ValueError, match="holds"):
        array_layout(array)
