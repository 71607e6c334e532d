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
            "the starts: kmeans (FedKMeans' start sets and kmeans-rounds of its rounds, side by side, then one hard "
            "E-step), lloyd (draws among the devices' means: nothing but the data summary; then kmeans-rounds + 1 "
            "hard E-steps, a secure sum each); auto: lloyd with secure-aggregation, else kmeans",
            allowed=StrOptions(STARTS),
        ),
        Key(
            "kmeans-rounds",
            -1,
            "k-means rounds of the starts before their last hard E-step: FedKMeans' (kmeans) or hard E-steps "
            "(lloyd). -1 (auto): 0 with kmeans (EM from FedKMeans' unrefined start sets, whose rough partitions "
            "reach likelihood optima that starts refined by k-means miss: docs/results/gmm.md), 9 with lloyd "
            "(its draws among the devices' means are coarser)",
            allowed=Interval(int, -1, MANY),
        ),
        Key(
            "em-starts",
            0,
            "EM starts run side by side in the same round trips (scikit-learn's n_init, federated; 0: 16 while one "
            "device's statistics of all of them fit in 2**17 floats, fewer for large k·d²): the mixture of "
            "highest log-likelihood is returned; a converged start stops, after half of em-rounds only the leader "
            "goes on. kmeans: FedKMeans' start sets (after kmeans-rounds of its rounds: the cheapest centers it "
            "measured, then the others by cost), topped up with draws of k of the devices' summary centers; lloyd: "
            "k-means++ draws among the devices' means",
            allowed=Interval(int, 0, 64),
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
