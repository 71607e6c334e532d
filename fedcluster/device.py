"""Everything a device can be asked to compute: importing this module fills the kernel
registry (``fedcluster.registry.KERNELS``). NumPy only: a phone-class device needs neither
SciPy nor scikit-learn (tests/unit/test_device_without_scipy.py checks it)."""

from . import common, da_ufl, feddp_kmeans, fedkmeans, fedspectral, kfed  # noqa: F401  (registration side effects)
from .registry import KERNELS, DeviceData, run_task

__all__ = ["KERNELS", "DeviceData", "run_task"]
