"""fedcluster: federated clustering on Flower.

``algorithms`` holds one package per algorithm (its run config, protocol tasks, device
kernels, math and strategy), read through ``registry``; the rest of the library is shared
(``lloyd``, the one k-means kernel; ``protocol``, every task a server can ask of a device;
``config``, every run-config key; ``privacy``, on dp_accounting; data and metrics) and never
imports flwr. ``server``, ``client`` and ``inprocess`` are the Flower apps and the in-process
runner; ``tools`` the command-line tools. The scikit-learn-style estimators are here, at the
top. The "Layout" section of docs/reference.md is the map.
"""

__version__ = "0.1.0"

# The scikit-learn-style estimators (fedcluster/estimators.py) run the ServerApp and ClientApp
# in this process: they load only when asked for, so ``import fedcluster`` never imports flwr.
_ESTIMATORS = (
    "FederatedKMeans",
    "DPFederatedKMeans",
    "FederatedSpectralClustering",
    "FederatedGaussianMixture",
    "FederatedRunWarning",
)


def __getattr__(name: str):
    if name in _ESTIMATORS:
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'fedcluster' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_ESTIMATORS])
