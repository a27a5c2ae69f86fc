"""The covariance of the performance model's errors: the kernel's form and one setting of it.

The posterior (model.py) models log(measured / predicted) of a quantity as a Gaussian process
over configuration features (model.FEATURES: batch, TP, weight width, compute path, KV width;
one unit of each means "quite different"). Its kernel has three parts:

    k(x, x') = sigma_global^2                              an error every configuration shares
             + sigma_local^2 * E(x, x')                     an error in the curves' shape
             + sum_j trend_j^2 * u_j(x) u_j(x')             a slope along batch (j=0) and TP (j=1)

    E(x, x') = exp(-sum_d (x_d - x'_d)^2 / (2 l_d^2))       alike within a length l_d per feature

- the shape error is learned only near what was measured and fades away from it: away from the
  measurements the posterior returns to the shared error;
- a *slope* is what a roofline most often has wrong: a batching efficiency, an all-reduce cost
  or a dequantisation cost that scales otherwise than modelled makes the error grow with log
  batch or log TP (the development world synthetic-04: +0.04 to +0.12 per batch doubling). The
  trend term lets a slope seen where the run measured carry on, with doubt growing with the
  distance (its variance grows as u^2). u_j is the feature's distance from TREND_CENTRE (batch
  16, TP 2: the middle of the usual spaces), so a slope adds doubt towards both ends.

Measured with benchmarks/tuner_efficiency.py (leave one family out, 585 runs): the trend term
took the share of runs reaching the optimum from 97 % to 98 %, the confident claims that were
right from 98 % to 99 %, and p90 trials from 14 to 13. A slope that varies with the other
features (the trend times E without its own feature) did no better (97 %, p90 16): not kept.

`Hyper` is one setting; hyperprior.py says which settings are likely and fits that across worlds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_FEATURES = 5  # model.FEATURES
TREND_FEATURES = (0, 1)  # batch, TP
TREND_CENTRE = np.array([2.0, 1.0])  # the features of batch 16 and TP 2


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter setting of the kernel: the shared error, the shape error and its
    length per feature, and the size of the slope along each trend feature (empty: none)."""

    sigma_global: float
    sigma_local: float
    lengths: tuple[float, ...]
    trends: tuple[float, ...] = ()

    def as_log(self) -> np.ndarray:
        return np.log([self.sigma_global, self.sigma_local, *self.lengths, *self.trends])

    @classmethod
    def from_log(cls, v: Sequence[float]) -> Hyper:
        e = [float(math.exp(x)) for x in v]
        return cls(e[0], e[1], tuple(e[2 : 2 + N_FEATURES]), tuple(e[2 + N_FEATURES :]))


def trend_coordinates(x: np.ndarray) -> np.ndarray:
    """Feature rows' distances from TREND_CENTRE along the trend features."""
    return np.asarray(x)[:, list(TREND_FEATURES)] - TREND_CENTRE


@dataclass(frozen=True)
class Terms:
    """The kernel's parts between rows a and b, kept apart for the hyperprior fit's gradient."""

    diff2: np.ndarray  # (A, B, features): (a_d - b_d)^2
    shape: np.ndarray  # (A, B): E
    trend: tuple[np.ndarray, ...]  # per trend feature j: u_j(a) u_j(b), without trend_j^2


def terms(a: np.ndarray, b: np.ndarray, lengths: Sequence[float], n_trends: int) -> Terms:
    diff2 = (a[:, None, :] - b[None, :, :]) ** 2
    shape = np.exp(-0.5 * (diff2 / np.asarray(lengths) ** 2).sum(axis=2))
    ua, ub = trend_coordinates(a), trend_coordinates(b)
    trend = tuple(np.outer(ua[:, j], ub[:, j]) for j in range(n_trends))
    return Terms(diff2, shape, trend)


def kernel(a: np.ndarray, b: np.ndarray, h: Hyper) -> np.ndarray:
    """k(a_i, b_j) for feature rows `a` and `b` under setting `h`."""
    t = terms(a, b, h.lengths, len(h.trends))
    k = h.sigma_global**2 + h.sigma_local**2 * t.shape
    for s, part in zip(h.trends, t.trend, strict=True):
        k = k + s**2 * part
    return k


def prior_variance(x: np.ndarray, h: Hyper) -> np.ndarray:
    """k(x_i, x_i): the kernel's diagonal at feature rows `x`."""
    var = np.full(len(x), h.sigma_global**2 + h.sigma_local**2)
    if h.trends:
        st = np.asarray(h.trends)
        var = var + ((trend_coordinates(x)[:, : len(st)] * st) ** 2).sum(axis=1)
    return var
