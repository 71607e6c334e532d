"""In-process runner: the same ServerApp and ClientApp, no Ray, no network.

``InProcessGrid`` implements Flower's public ``Grid`` interface by calling the ClientApp
directly; :func:`run` wires a whole federation in one process. It lives outside
``fedcluster.server`` and ``fedcluster.client`` because it is the one place that imports both.
"""

from .availability import Availability
from .grid import InProcessGrid
from .run import run

__all__ = ["Availability", "InProcessGrid", "run"]
