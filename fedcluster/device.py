"""Everything a device can be asked to compute: importing this module fills the task
registry (``fedcluster.registry.TASKS``). NumPy only: a phone-class device needs neither
SciPy nor scikit-learn."""

from . import fedkmeans, tasks  # noqa: F401  (registration side effects)
from .registry import TASKS, DeviceData

for _optional in ("kfed", "graph", "feddp"):
    # Algorithm modules register their device kernels when present.
    try:
        __import__(f"{__package__}.{_optional}")
    except ModuleNotFoundError as exc:  # pragma: no cover - only while a module is absent
        if exc.name != f"{__package__}.{_optional}":
            raise

__all__ = ["TASKS", "DeviceData"]
