"""How large and how smooth the performance model's errors are: the posterior's hyperprior.

The posterior (posterior.py) models log(measured / predicted) of each quantity as a Gaussian process
whose hyperparameters - an error every configuration shares (`sigma_global`), the size of the
error in the *shape* of the curves (`sigma_local`) and how far along each feature that shape
error stays alike (one length scale per feature, `posterior.FEATURES`) - are not fixed: a run weighs
a set of hyperparameter settings by how well each explains its own measurements. This
module holds where those settings come from: one log-normal distribution per hyperparameter and
per kind of quantity (`tps`, and each latency metric), fitted across worlds of many forms by
`fit_hyperprior`:

1. one setting for all training worlds at once (type-II maximum likelihood of their pooled
   residual fields, each family weighing the same): the medians;
2. each world's own maximum a posteriori setting, regularised towards the pooled one: their
   spread around it (family-weighted), widened by `INFLATE` and never below `MIN_SD_LOG`, is
   the log-normal's width. A world unlike every training world must still find its setting
   inside the hyperprior, so its tails are wider than the worlds it was fitted on.

The shipped fit (`hyperprior.json`, written by `benchmarks/fit_hyperprior.py`) names the worlds it
came from; benchmarks/tuner_efficiency.py refits it without the family it scores (leave one family
out), so no family is scored with constants chosen on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm, qmc

from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.search.posterior import FEATURES, TREND_FEATURES, Hyper, terms

N_FEATURES = len(FEATURES)
N_TRENDS = len(TREND_FEATURES)
# Quantities pooled into one kind: tok/s/GPU, and each latency metric over its percentiles.
KINDS = ("tps", *(m.key for m in LATENCY_METRICS))
# A world's own setting may lie outside the spread of the worlds the hyperprior was fitted on:
# the fitted log-normal widths are multiplied by this and kept at least MIN_SD_LOG (a factor
# e^0.35 = 1.4 on each hyperparameter at one standard deviation).
INFLATE = 1.5
MIN_SD_LOG = 0.35
# Residual fields are typical runs (population-sized samples), so little noise. What is left
# beyond the smooth kernel, per configuration, is the world's own roughness: 1 % in the
# benchmark's own families, 2-4 % in the development set and the real-GPU world
# (roughness_likelihood; benchmarks/fit_hyperprior.py prints it). The fit absorbs it into the
# shape error.
FIT_NOISE = 0.02
FIT_POINTS = 48  # configurations per world in a fit (a deterministic subsample)
MAP_SD_LOG = 1.0  # a world's own fit is regularised towards the pooled one by this much
BOUNDS_LOG = ((-5.0, 1.5), (-5.0, 1.5)) + ((-2.5, 3.5),) * N_FEATURES + ((-6.0, 0.5),) * N_TRENDS


@dataclass(frozen=True)
class LogNormal:
    median: float
    sd_log: float


@dataclass(frozen=True)
class KindPrior:
    """The hyperprior of one kind of quantity: a log-normal per hyperparameter."""

    sigma_global: LogNormal
    sigma_local: LogNormal
    lengths: tuple[LogNormal, ...]
    trends: tuple[LogNormal, ...] = ()

    def parts(self) -> tuple[LogNormal, ...]:
        return (self.sigma_global, self.sigma_local, *self.lengths, *self.trends)

    def median(self) -> Hyper:
        return Hyper.from_log([math.log(p.median) for p in self.parts()])

    def particles(self, n: int, seed: int = 0) -> tuple[Hyper, ...]:
        """`n` settings spread over the hyperprior (scrambled Sobol points through the
        log-normals' quantiles), the first being the medians; deterministic per seed."""
        return _particles(self, n, seed)


@lru_cache(maxsize=64)
def _particles(prior: KindPrior, n: int, seed: int) -> tuple[Hyper, ...]:
    parts = prior.parts()
    u = qmc.Sobol(d=len(parts), scramble=True, seed=seed).random_base2(
        max(math.ceil(math.log2(max(n - 1, 1))), 0)
    )
    z = norm.ppf(np.clip(u, 1e-6, 1 - 1e-6))
    mu = np.log([p.median for p in parts])
    sd = np.array([p.sd_log for p in parts])
    out = [prior.median()] + [Hyper.from_log(mu + sd * row) for row in z[: n - 1]]
    return tuple(out)


@dataclass(frozen=True)
class Hyperprior:
    """A KindPrior per kind of quantity, and where the fit came from."""

    kinds: tuple[tuple[str, KindPrior], ...]
    source: str = ""
    worlds: tuple[tuple[str, int], ...] = field(default=())  # family, worlds fitted

    def of(self, kind: str) -> KindPrior:
        """The prior of a kind of quantity ('tps', or a latency metric's key); a kind the fit
        had no fields for borrows tok/s/GPU's."""
        table = dict(self.kinds)
        return table.get(kind, table["tps"])

    def to_json(self) -> dict[str, Any]:
        def ln(p: LogNormal) -> dict[str, float]:
            return {"median": round(p.median, 5), "sd_log": round(p.sd_log, 4)}

        return {
            "source": self.source,
            "worlds": dict(self.worlds),
            "kinds": {
                k: {
                    "sigma_global": ln(p.sigma_global),
                    "sigma_local": ln(p.sigma_local),
                    "lengths": [ln(x) for x in p.lengths],
                    "trends": [ln(x) for x in p.trends],
                }
                for k, p in self.kinds
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hyperprior:
        def ln(d: dict[str, float]) -> LogNormal:
            return LogNormal(float(d["median"]), float(d["sd_log"]))

        kinds = tuple(
            (
                k,
                KindPrior(
                    ln(v["sigma_global"]),
                    ln(v["sigma_local"]),
                    tuple(ln(x) for x in v["lengths"]),
                    tuple(ln(x) for x in v.get("trends", [])),
                ),
            )
            for k, v in data["kinds"].items()
        )
        worlds = tuple((str(f), int(n)) for f, n in data.get("worlds", {}).items())
        return cls(kinds, str(data.get("source", "")), worlds)


@lru_cache(maxsize=1)
def default_hyperprior() -> Hyperprior:
    """The shipped fit (`hyperprior.json`; see benchmarks/fit_hyperprior.py)."""
    text = resources.files(__package__).joinpath("hyperprior.json").read_text(encoding="utf-8")
    return Hyperprior.from_json(json.loads(text))


# ------------------------------------------------------------------ fitting across worlds


@dataclass(frozen=True)
class Field:
    """One world's residual field of one quantity: log(truth / prediction) at configurations
    (features as posterior.features gives them)."""

    family: str
    kind: str
    x: np.ndarray
    y: np.ndarray


def _nll_grad(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, noise: float = FIT_NOISE
) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood of one field and its gradient in log hyperparameters,
    each configuration `noise` (log sd) off the smooth field."""
    sg, sl = math.exp(theta[0]), math.exp(theta[1])
    ls = np.exp(theta[2 : 2 + N_FEATURES])
    st = np.exp(theta[2 + N_FEATURES :])
    t = terms(x, x, ls, len(st))
    trend = [s**2 * part for s, part in zip(st, t.trend, strict=True)]
    k = sg**2 + sl**2 * t.shape + sum(trend, np.zeros_like(t.shape))
    k = k + noise**2 * np.eye(len(y))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return 1e9, np.zeros_like(theta)
    k_inv = np.linalg.inv(k)
    alpha = k_inv @ y
    nll = 0.5 * float(y @ alpha) + float(np.log(np.diag(chol)).sum())
    w = 0.5 * (np.outer(alpha, alpha) - k_inv)
    grad = np.empty_like(theta)
    grad[0] = -2 * sg**2 * w.sum()
    grad[1] = -2 * sl**2 * float((w * t.shape).sum())
    for d in range(len(ls)):
        grad[2 + d] = -float((w * sl**2 * t.shape * t.diff2[:, :, d] / ls[d] ** 2).sum())
    for j, part in enumerate(trend):
        grad[2 + N_FEATURES + j] = -2 * float((w * part).sum())
    return nll, grad


def _subsample(f: Field, n: int) -> Field:
    if len(f.y) <= n:
        return f
    idx = np.random.default_rng(len(f.y)).permutation(len(f.y))[:n]
    return Field(f.family, f.kind, f.x[idx], f.y[idx])


# Where a fit starts (log sigma_global, sigma_local, lengths, trends), and the shifts of the
# lengths it also starts from: the likelihood can have more than one optimum along the lengths.
_START = np.log([0.2, 0.2, *([1.5] * N_FEATURES), *([0.05] * N_TRENDS)])
_SHIFTS = (0.0, 0.7, -0.7)


def _fit(
    fields: Sequence[Field], weights: Sequence[float], start: np.ndarray,
    center: np.ndarray | None = None, shifts: Sequence[float] = (0.0,), noise: float = FIT_NOISE,
) -> np.ndarray:  # fmt: skip
    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        total, grad = 0.0, np.zeros_like(theta)
        for f, w in zip(fields, weights, strict=True):
            v, g = _nll_grad(theta, f.x, f.y, noise)
            total, grad = total + w * v, grad + w * g
        if center is not None:
            total += float(((theta - center) ** 2).sum()) / (2 * MAP_SD_LOG**2)
            grad = grad + (theta - center) / MAP_SD_LOG**2
        return total, grad

    best = None
    for shift in shifts:
        init = start.copy()
        init[2 : 2 + N_FEATURES] += shift
        r = minimize(objective, init, jac=True, method="L-BFGS-B", bounds=BOUNDS_LOG)
        if best is None or r.fun < best.fun:
            best = r
    assert best is not None
    return np.asarray(best.x)


def roughness_likelihood(field: Field, noises: Sequence[float]) -> list[float]:
    """The field's log marginal likelihood, the kernel's hyperparameters fitted anew, if every
    configuration were each `noise` (log sd) off the smooth field: one value per noise.

    The fit assumes FIT_NOISE; the noise with the highest likelihood says how rough the world
    really is, configuration by configuration, beyond what the kernel's smooth shape can
    follow (benchmarks/fit_hyperprior.py prints it per family)."""
    f = _subsample(field, FIT_POINTS)
    out = []
    for noise in noises:
        theta = _fit([f], [1.0], _START, shifts=_SHIFTS, noise=noise)
        out.append(-_nll_grad(theta, f.x, f.y, noise)[0])
    return out


def fit_kind(fields: Sequence[Field]) -> KindPrior:
    """The hyperprior of one kind from residual fields of many worlds (see the module doc)."""
    fields = [_subsample(f, FIT_POINTS) for f in fields if len(f.y) >= 5]
    families = sorted({f.family for f in fields})
    per_family = {fam: sum(1 for f in fields if f.family == fam) for fam in families}
    weights = [1.0 / (per_family[f.family] * len(families)) for f in fields]
    pooled = _fit(fields, weights, _START, shifts=_SHIFTS)
    own = np.array([_fit([f], [1.0], pooled, center=pooled) for f in fields])
    spread = np.sqrt(np.average((own - pooled) ** 2, axis=0, weights=weights))
    sd = np.maximum(spread * INFLATE, MIN_SD_LOG)
    parts = [LogNormal(float(math.exp(m)), float(s)) for m, s in zip(pooled, sd, strict=True)]
    return KindPrior(
        parts[0], parts[1], tuple(parts[2 : 2 + N_FEATURES]), tuple(parts[2 + N_FEATURES :])
    )


def fit_hyperprior(fields: Sequence[Field], source: str = "") -> Hyperprior:
    """Fit every kind that has fields (a kind without any borrows tok/s/GPU's prior)."""
    kinds = [k for k in KINDS if any(f.kind == k for f in fields)]
    fitted = tuple((k, fit_kind([f for f in fields if f.kind == k])) for k in kinds)
    families = sorted({f.family for f in fields})
    worlds = tuple(
        (fam, sum(1 for f in fields if f.family == fam and f.kind == "tps")) for fam in families
    )
    return Hyperprior(fitted, source, worlds)
