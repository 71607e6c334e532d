"""fedcluster: federated clustering on Flower.

``algorithms`` holds one package per algorithm (its run config, protocol tasks, device
kernels, math and strategy), read through ``registry``; the rest of the library is shared
(``lloyd``, the one k-means kernel; ``protocol``, every task a server can ask of a device;
``config``, every run-config key; ``privacy``, on dp_accounting; data and metrics) and never
imports flwr. ``server``, ``client`` and ``inprocess`` are the Flower apps and the in-process
runner; ``tools`` the command-line tools. The scikit-learn-style estimators are here, at the
top (those of one algorithm from its package). The "Layout" section of docs/reference.md is the map.
"""

__version__ = "0.1.0"

# The scikit-learn-style estimators run the ServerApp and ClientApp in this process: they load
# only when asked for, so ``import fedcluster`` never imports flwr. Those several algorithms
# share live in fedcluster/estimators.py; an algorithm's own lives in its package
# (``fedcluster/algorithms/<package>/estimator.py``), found through the registry.
_SHARED = ("FederatedKMeans", "DPFederatedKMeans", "FederatedSpectralClustering", "FederatedRunWarning")


def _own_estimators() -> dict[str, str]:
    """Estimator name -> the package module holding it, for every algorithm whose package
    has an ``estimator`` module (as the registry declares them)."""
    import importlib
    from importlib.util import find_spec

    registry = importlib.import_module("fedcluster.registry")
    return {
        a.estimator: f"{a.package}.estimator"
        for a in registry.algorithms().values()
        if a.estimator and a.estimator not in _SHARED and find_spec(f"{a.package}.estimator") is not None
    }


def __getattr__(name: str):
    import importlib

    if name in _SHARED:
        return getattr(importlib.import_module("fedcluster.estimators"), name)
    if name[:1].isupper():  # a class: never a submodule, which "from fedcluster import x" asks for first
        own = _own_estimators()
        if name in own:
            return getattr(importlib.import_module(own[name]), name)
    raise AttributeError(f"module 'fedcluster' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_SHARED, *_own_estimators()])
