"""Differential privacy for fedcluster, along dp_accounting's lines (docs/ALGORITHMS.md §3):

- :mod:`.clipping` -- device side, NumPy only: norm clipping and the privacy levels;
- :mod:`.mechanisms` -- Gaussian, symmetric Gaussian and Laplace noise, one base class;
- :mod:`.calibration` -- noise for a target ε (one step, or all steps of a run);
- :mod:`.ledger` -- recorded steps as dp_accounting events, PLD composition, reports;
- :mod:`.skellam` -- the devices' own noise under secure aggregation: Skellam releases,
  their RDP accounting and calibration, and their ledger.

Every public name is re-exported here. The server-side modules (SciPy, dp_accounting) are
imported on first use, so a device importing :mod:`fedcluster.privacy.clipping` loads
NumPy only.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "clipping": ("DATA_POINT", "CLIENT", "LEVELS", "clip_rows_l2", "clip_l2", "clip_l1", "scale_l2"),
    "mechanisms": (
        "NoiseMechanism",
        "GaussianMechanism",
        "SymmetricGaussianMechanism",
        "LaplaceMechanism",
        "MECHANISMS",
        "independent_generators",
    ),
    "calibration": (
        "analytic_gaussian_sigma",
        "gaussian_sigma_for",
        "laplace_scale_for",
        "StepSpec",
        "CalibratedStep",
        "Calibration",
        "calibrate_step",
        "calibrate_to_total",
    ),
    "ledger": (
        "REPORT_DISCRETIZATION",
        "SEARCH_DISCRETIZATION",
        "wrap_event",
        "pld_epsilon",
        "composed_epsilon",
        "event_to_dict",
        "LedgerStep",
        "PrivacyLedger",
    ),
    "skellam": ("SkellamRelease", "SkellamLedger"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
