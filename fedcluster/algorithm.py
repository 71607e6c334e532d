"""What an algorithm declares about itself: :class:`Algorithm`. Each algorithm's package
(``fedcluster/algorithms/<package>/__init__.py``) declares its algorithms with it, and
:mod:`fedcluster.registry` reads the declarations; nothing else lists an algorithm."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as run-config ``algorithm = name`` selects it.

    Parameters
    ----------
    name : the run-config value (``"fedkmeans"``).
    package : the module path of the package that holds it (``__name__`` of its
        ``__init__``); its modules are found by the names below, each loaded only when asked
        for: ``config`` (the run-config sections), ``protocol`` (its tasks), ``device`` (their
        kernels), ``strategy`` (the server's phases).
    title : how docs and logs name it.
    strategy : the class in ``<package>.strategy`` that runs it.
    section : the attribute of ``<package>.config`` holding its run-config section.
    uses : the shared tasks it asks devices for (:mod:`fedcluster.shared_tasks`), for the
        protocol table.
    data : what its devices hold: ``"points"`` or ``"graph"``.
    secure : whether ``secure-aggregation = true`` secures its sums.
    estimator : the scikit-learn-style class that runs it, ``fedcluster.<estimator>``: in
        the package's ``estimator`` module when the package has one, else in
        :mod:`fedcluster.estimators` (one several algorithms share: ``"FederatedKMeans"``);
        None: none does.
    estimator_keys : the estimator's own parameters this algorithm takes, each with the
        run-config key it sets (``(("max_iter", "num-rounds"), ...)``); any other is refused
        by name.
    """

    name: str
    package: str
    title: str
    strategy: str
    section: str = "RUN_CONFIG"
    uses: tuple[str, ...] = ()
    data: str = "points"
    secure: bool = False
    estimator: str | None = None
    estimator_keys: tuple[tuple[str, str], ...] = ()
