"""The privacy ledger: every private step of a run as a ``dp_accounting`` event, composed
with the privacy-loss-distribution (PLD) accountant, and written out as plain data.

Neighbouring relation: add-or-remove-one (one data point, or one client, added or removed
-- the ledger's ``level``, "data-point" or "client"). Events are written as
``{"type": class name, field: value, ...}`` from dp_accounting's own ``to_named_tuple``
(the named tuple itself is not JSON, and reading one back imports the module it names, so
nothing is ever rebuilt from a file: the per-step numbers suffice to recompute ε).

PLD discretization: the estimate is pessimistic (it can only over-state ε) and shrinks
with the interval. Reports use ``REPORT_DISCRETIZATION = 1e-4``; searches, which compose
dozens of times, use ``SEARCH_DISCRETIZATION = 1e-3``. On the FedDP-KMeans steps the finer
grid's estimate was always the smaller, so a calibration that meets ε at 1e-3 still meets
it when the ledger re-accounts it at 1e-4 (tests/unit/test_privacy.py checks this).

:func:`event_plds` builds the very PLDs the accountant composes for an event, so a search can
keep a step's PLDs and compose them again without rebuilding them (:func:`composed_pld_epsilon`
gives the accountant's ε, bit for bit; the tests check that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

from ._checks import check_compositions, check_delta, check_sampling_rate, check_sensitivity
from .clipping import LEVELS

__all__ = [
    "REPORT_DISCRETIZATION",
    "SEARCH_DISCRETIZATION",
    "wrap_event",
    "pld_epsilon",
    "event_plds",
    "composed_pld_epsilon",
    "event_to_dict",
    "LedgerStep",
    "PrivacyLedger",
]

REPORT_DISCRETIZATION = 1e-4
SEARCH_DISCRETIZATION = 1e-3


def wrap_event(
    event: dp_accounting.DpEvent, compositions: int = 1, sampling_rate: float | None = None
) -> dp_accounting.DpEvent:
    """Poisson-sample ``event`` at rate q (if q < 1), then repeat it ``compositions`` times."""
    compositions = check_compositions(compositions)
    sampling_rate = check_sampling_rate(sampling_rate)
    if sampling_rate is not None:
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
    if compositions > 1:
        event = dp_accounting.SelfComposedDpEvent(event, compositions)
    return event


def pld_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    value_discretization_interval: float = REPORT_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of one (possibly composed) ``DpEvent`` with the PLD accountant
    (add-or-remove-one neighbours). Events with zero noise give ``inf``."""
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=value_discretization_interval)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def event_plds(
    event: dp_accounting.DpEvent, value_discretization_interval: float = REPORT_DISCRETIZATION, count: int = 1
) -> list[privacy_loss_distribution.PrivacyLossDistribution]:
    """The PLDs that dp_accounting's ``PLDAccountant`` composes, in order, for ``event``
    repeated ``count`` times, built the way it builds them (add-or-remove-one,
    pessimistic), for the events a ledger records: Gaussian, Laplace, their
    Poisson-sampled forms, self- and plain compositions (an event without privacy loss,
    sampling rate 0, adds none; zero noise raises: it has no PLD, ε = ∞).

    Building the PLD of a Poisson-sampled Gaussian is the cost of accounting (point by
    point in Python): a search that keeps its steps' PLDs composes them again for the
    price of a convolution. :func:`composed_pld_epsilon` of the list is :func:`pld_epsilon`
    of the event, exactly (the tests check it).
    """
    interval = value_discretization_interval
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event_plds(event.event, interval, event.count * count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return [pld for e in event.events for pld in event_plds(e, interval, count)]
    sampling_rate = 1.0
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        sampling_rate, event = event.sampling_probability, event.event
        if sampling_rate == 0:
            return []
    multiplier = getattr(event, "noise_multiplier", None)
    if not isinstance(event, (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent)) or not multiplier:
        raise ValueError(f"no PLD for {event!r}")
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return [
            privacy_loss_distribution.from_laplace_mechanism(
                parameter=multiplier, value_discretization_interval=interval, sampling_prob=sampling_rate
            ).self_compose(count)
        ]
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if sampling_rate == 1.0:  # T Gaussians are one Gaussian with σ/√T; the accountant uses that
        return [
            privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=multiplier / math.sqrt(count),
                value_discretization_interval=interval,
                neighboring_relation=relation,
            )
        ]
    return [
        privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=multiplier,
            value_discretization_interval=interval,
            sampling_prob=sampling_rate,
            neighboring_relation=relation,
        ).self_compose(count)
    ]


def composed_pld_epsilon(
    plds: Sequence[privacy_loss_distribution.PrivacyLossDistribution],
    delta: float,
    value_discretization_interval: float,
) -> float:
    """ε at ``delta`` of ``plds`` (from :func:`event_plds`) composed in order onto the
    identity, as the accountant does: :func:`pld_epsilon` of the events they came from."""
    total = privacy_loss_distribution.identity(value_discretization_interval=value_discretization_interval)
    for pld in plds:
        total = total.compose(pld)
    return float(total.get_epsilon_for_delta(delta))


def composed_epsilon(
    events: Sequence[dp_accounting.DpEvent],
    delta: float,
    value_discretization_interval: float = REPORT_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of ``events`` run one after the other (PLD composition)."""
    return pld_epsilon(dp_accounting.ComposedDpEvent(list(events)), delta, value_discretization_interval)


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A JSON-friendly description of a ``DpEvent``, from dp_accounting's own
    ``to_named_tuple``: ``{"type": class name, field: value, ...}``, nested events alike."""
    return _plain(event.to_named_tuple())


def _plain(value: Any) -> Any:
    if isinstance(value, dp_event.DpEventNamedTuple):
        fields = value._asdict()
        fields.pop("module_name")
        return {"type": fields.pop("class_name"), **{k: _plain(v) for k, v in fields.items()}}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


@dataclass(frozen=True)
class LedgerStep:
    """One recorded private step. ``event`` is the full accounted event (sampling and
    repetition included); ``base_event`` is one unsampled use of the mechanism."""

    name: str
    mechanism: str
    sensitivity: float
    noise_std: float
    base_event: dp_accounting.DpEvent
    event: dp_accounting.DpEvent
    compositions: int = 1
    sampling_rate: float | None = None
    delta: float | None = None

    @property
    def noise_multiplier(self) -> float | None:
        return getattr(self.base_event, "noise_multiplier", None)


class PrivacyLedger:
    """Every private step of a run, as ``dp_accounting`` events, and their composition.

    ``level`` ("data-point" or "client") is what "neighbouring" means for the whole
    ledger; ``value_discretization_interval`` is the PLD grid of its reports.

    >>> from fedcluster.privacy.mechanisms import GaussianMechanism
    >>> ledger = PrivacyLedger("data-point")
    >>> _ = ledger.record("step1", GaussianMechanism(4.2247, sensitivity=1.0))
    >>> round(ledger.epsilon(1e-6), 2)
    1.0
    """

    def __init__(self, level: str, value_discretization_interval: float = REPORT_DISCRETIZATION):
        if level not in LEVELS:
            raise ValueError(f"unknown privacy level {level!r}; expected one of {LEVELS}")
        if not value_discretization_interval > 0:
            raise ValueError("value_discretization_interval must be > 0")
        self.level = level
        self.value_discretization_interval = float(value_discretization_interval)
        self.steps: list[LedgerStep] = []

    def record(
        self,
        name: str,
        mechanism,
        compositions: int = 1,
        sampling_rate: float | None = None,
        delta: float | None = None,
    ) -> dp_accounting.DpEvent:
        """Record ``compositions`` (Poisson-sampled at ``sampling_rate`` < 1) uses of
        ``mechanism`` (a :class:`~fedcluster.privacy.mechanisms.NoiseMechanism`) under
        ``name``, and return the accounted event. ``delta`` (optional) is the δ the step
        was calibrated for; its own ε is reported at it."""
        base = mechanism.event()
        self.steps.append(
            LedgerStep(
                name=str(name),
                mechanism=mechanism.name,
                sensitivity=check_sensitivity(mechanism.sensitivity),
                noise_std=float(mechanism.noise_std),
                base_event=base,
                event=wrap_event(base, compositions, sampling_rate),
                compositions=check_compositions(compositions),
                sampling_rate=check_sampling_rate(sampling_rate),
                delta=None if delta is None else check_delta(delta),
            )
        )
        return self.steps[-1].event

    def event(self) -> dp_accounting.DpEvent:
        """All recorded steps as one ``ComposedDpEvent``."""
        return dp_accounting.ComposedDpEvent([step.event for step in self.steps])

    def epsilon(self, delta: float) -> float:
        """Total ε at ``delta`` of all recorded steps (PLD composition; 0 if empty)."""
        delta = check_delta(delta)
        if not self.steps:
            return 0.0
        return pld_epsilon(self.event(), delta, self.value_discretization_interval)

    def step_epsilons(self, deltas: float | Sequence[float]) -> list[float]:
        """ε of every step on its own (PLD) at its δ: one float for all, or one per step."""
        if np.ndim(deltas) == 0:
            deltas = [float(deltas)] * len(self.steps)
        if len(deltas) != len(self.steps):
            raise ValueError(f"got {len(deltas)} deltas for {len(self.steps)} steps")
        return [
            pld_epsilon(step.event, check_delta(d), self.value_discretization_interval)
            for step, d in zip(self.steps, deltas)
        ]

    def to_dict(self, delta: float) -> dict[str, Any]:
        """Everything needed to recompute the accounting, JSON-friendly.

        Steps recorded with their calibration δ report ε at that δ; others at ``delta``.
        ``epsilon`` is the PLD total at ``delta`` (``inf`` if a step adds no noise).
        """
        delta = check_delta(delta)
        deltas = [step.delta if step.delta is not None else delta for step in self.steps]
        epsilons = self.step_epsilons(deltas)
        steps = [
            {
                "name": step.name,
                "mechanism": step.mechanism,
                "sensitivity": step.sensitivity,
                "noise_std": step.noise_std,
                "noise_multiplier": step.noise_multiplier,
                "epsilon": step_epsilon,
                "delta": step_delta,
                "compositions": step.compositions,
                "sampling_rate": step.sampling_rate,
                "event": event_to_dict(step.event),
            }
            for step, step_delta, step_epsilon in zip(self.steps, deltas, epsilons)
        ]
        return {
            "level": self.level,
            "delta": delta,
            "epsilon": self.epsilon(delta),
            "accountant": "dp_accounting PLDAccountant (add-or-remove-one, pessimistic)",
            "value_discretization_interval": self.value_discretization_interval,
            "steps": steps,
        }
