"""Federated GMM's run-config section (docs/ALGORITHMS.md §6)."""

from __future__ import annotations

from typing import Any, Mapping

from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import MANY, SECAGG_NEIGHBOURS, SECAGG_THRESHOLD, SECURE_AGGREGATION, ConfigError, Key, Section
from fedcluster.keys import k_range

COVARIANCE_TYPES = ("full", "diag", "spherical")
STARTS = ("auto", "kmeans", "lloyd")


def _rules(c: Mapping[str, Any]) -> None:
    if c["secure-aggregation"] and c["gmm-init"] == "kmeans":
        raise ConfigError(
            "run-config gmm-init='kmeans' sends the devices' k-means statistics in the clear: with "
            "secure-aggregation = true use gmm-init='lloyd' (or 'auto')"
        )
    if c["k-range"]:
        k_range(c["k-range"])


RUN_CONFIG = Section(
    "gmm",
    (
        Key(
            "covariance-type",
            "full",
            "the components' covariances: full, diag or spherical (scikit-learn's covariance_type)",
            allowed=StrOptions(COVARIANCE_TYPES),
        ),
        Key(
            "reg-covar",
            1e-6,
            "added to the covariances' diagonal (scikit-learn's reg_covar): every covariance positive definite",
            allowed=Interval(float, 0, 1e6),
        ),
        Key("em-rounds", 100, "most EM rounds (scikit-learn's max_iter)", allowed=Interval(int, 1, MANY)),
        Key(
            "em-tol",
            1e-3,
            "stop when the mean log-likelihood per point changes by less than this (scikit-learn's tol)",
            allowed=Interval(float, 0, 1e6),
        ),
        Key(
            "gmm-init",
            "auto",
            "the starts: kmeans (FedKMeans' start and kmeans-rounds of its rounds, its center sets side by side, "
            "then one hard E-step), lloyd (draws among the devices' means: nothing but the data summary; then "
            "kmeans-rounds hard E-steps, a secure sum each); auto: lloyd with secure-aggregation, else kmeans",
            allowed=StrOptions(STARTS),
        ),
        Key(
            "kmeans-rounds",
            10,
            "k-means rounds of the starts: FedKMeans' (kmeans; then one hard E-step) or hard E-steps (lloyd)",
            allowed=Interval(int, 0, MANY),
        ),
        Key(
            "em-starts",
            4,
            "EM starts run side by side in the same round trips (scikit-learn's n_init, federated): the mixture of "
            "highest log-likelihood is returned; a converged start stops, after half of em-rounds only the leader "
            "goes on. kmeans: the cheapest centers FedKMeans measured, then its other center sets by cost (at most "
            "its n-init sets); lloyd: k-means++ draws among the devices' means",
            allowed=Interval(int, 1, 64),
        ),
        Key(
            "k-range",
            "",
            "choose k: 'a:b' fits a mixture for every k in a..b in one run and reports their BIC (k is then unused; "
            "the mixture of lowest BIC is returned)",
        ),
        SECURE_AGGREGATION,
        SECAGG_THRESHOLD,
        SECAGG_NEIGHBOURS,
    ),
    rules=(_rules,),
    algorithms=("gmm",),
)
