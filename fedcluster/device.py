"""Everything a device can be asked to compute: importing this module fills the task
registry (``fedcluster.registry.TASKS``). NumPy only: a phone-class device needs neither
SciPy nor scikit-learn (tests/test_device_without_scipy.py checks it)."""

from . import feddp_kmeans, fedkmeans, fedspectral, kfed, common  # noqa: F401  (registration side effects)
from .registry import KERNELS, TASKS, DeviceData, run_task

__all__ = ["KERNELS", "TASKS", "DeviceData", "run_task"]
