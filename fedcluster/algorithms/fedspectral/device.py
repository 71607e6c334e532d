"""The device kernels of this algorithm's tasks (registered as :mod:`.model` loads)."""

import fedcluster.algorithms.fedspectral.model as model  # noqa: F401
