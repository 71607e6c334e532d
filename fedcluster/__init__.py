"""fedcluster: the library half of federated clustering — everything that never touches a
Flower Grid or Message, and never imports flwr.

``protocol`` (every task a server can ask of a device), ``config`` (every run-config key),
``lloyd`` (the one k-means kernel), ``linalg`` (shared dense linear algebra), one module per
algorithm holding its device kernels and its server-side math (``fedkmeans``, ``kfed``,
``feddp_kmeans``, ``fedspectral``), ``privacy`` (on dp_accounting), data and metrics; the
command-line tools apart in ``tools``.
Device code needs only NumPy; server code may import SciPy and scikit-learn inside the
functions that use them. The "Layout" section of docs/reference.md is the map.
"""

__version__ = "0.1.0"

# The scikit-learn-style estimators (fedcluster/estimators.py) run the ServerApp and ClientApp
# in this process: they load only when asked for, so ``import fedcluster`` never imports flwr.
_ESTIMATORS = ("FederatedKMeans", "DPFederatedKMeans", "FederatedSpectralClustering", "FederatedRunWarning")


def __getattr__(name: str):
    if name in _ESTIMATORS:
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'fedcluster' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_ESTIMATORS])
