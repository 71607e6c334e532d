"""The device kernels of this algorithm's tasks (registered as :mod:`.model` loads)."""

from . import model  # noqa: F401
