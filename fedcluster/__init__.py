"""fedcluster: federated clustering kernels, data, metrics and privacy (no Flower import).

Everything in this package is pure computation on NumPy arrays. The device-side kernels
(``fedcluster.device``) need only NumPy; server-side helpers may use SciPy/scikit-learn,
imported lazily inside the functions that need them.
"""

__version__ = "0.1.0"
