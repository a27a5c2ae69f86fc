"""What the measurements say about configurations not yet measured: a Gaussian-process posterior.

For each quantity the search needs (tok/s/GPU and every bounded latency percentile) the
performance model's prediction is the prior mean, and the log of measured / predicted is modelled
as a Gaussian process over configuration features:

    log(measured / predicted)(x) ~ GP(0, k),
    k(x, x') = sigma_global^2 + sigma_local^2 * exp(-|x - x'|^2 / 2)
    y = f(x) + measurement noise (its variance divided by the number of repeats)

- `sigma_global` is an error the whole pool shares (a faster or slower serving stack than the
  model's calibration): one measurement anywhere mostly resolves it.
- `sigma_local` is error in the *shape* of the curves (a term the roofline lacks: prefill stalls,
  CUDA-graph gaps, dequantisation cost). It is only learned near what was measured: a
  configuration far from every measurement keeps close to the full `sigma_local`, so it is never
  written off merely because *other* configurations were measured. It differs by quantity:
  throughput and E2E follow the roofline closely; ITL less; TTFT least, since it is decided by
  the server's admission policy (chunked prefill, prefill-first, batching of arrivals), which the
  model only sketches; tails are less certain than medians.
- features are scaled so that one unit means "quite different": a 4x batch change, a TP
  doubling, a weight width halving, a change of tensor-core path, a KV-cache width halving.
- noise is the run-to-run spread of the quantity (tails are noisier than medians); repeats of a
  configuration average it down.

The same posterior gives the probability of meeting each SLO bound and, sampled jointly over all
candidates, the probability that any of them beats the best measured configuration (the stop
rule in planner.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import E2E, ITL, TTFT

SIGMA_GLOBAL = 0.35
SIGMA_LOCAL = 0.2  # throughput's shape error; see local_sigma for the other quantities
_SHAPE = {"tps": 1.0, E2E.key: 1.1, ITL.key: 1.25, TTFT.key: 2.0}
_TAIL = {"p50": 1.0, "p95": 1.1, "p99": 1.25}
# Run-to-run noise (log scale) of one measurement of each kind of quantity.
NOISE = {"tps": 0.03, "p50": 0.04, "p95": 0.06, "p99": 0.09}
_COMPUTE_LEVEL = {"bf16": 0.0, "fp8": -1.0, "fp4": -2.0}
_JITTER = 1e-9


def features(cfg: TrialConfig) -> np.ndarray:
    """The coordinates a configuration has in the posterior's kernel (see the module doc)."""
    q = QUANTIZATIONS[cfg.quantization]
    return np.array(
        [
            math.log2(cfg.max_batch_size) / 2.0,
            math.log2(cfg.tp),
            math.log2(q.weight_bytes),
            _COMPUTE_LEVEL[q.compute],
            math.log2(KV_DTYPE_BYTES[cfg.kv_cache_dtype]),
        ]
    )


def local_sigma(key: str) -> float:
    """Prior shape error of quantity `key` ('tps' or 'metric/percentile')."""
    metric, _, pct = key.partition("/")
    return SIGMA_LOCAL * _SHAPE.get(metric, 1.25) * _TAIL.get(pct, 1.0)


def noise_of(key: str) -> float:
    """Prior measurement noise of quantity `key` ('tps' or 'metric/percentile')."""
    return NOISE.get(key.rsplit("/", 1)[-1], NOISE["p95"])


NOISE_PRIOR_WEIGHT = 3.0  # the prior noise counts as this many degrees of freedom


def learned_noise(key: str, repeats: Sequence[Sequence[float]]) -> float:
    """Noise of `key` learned from repeated measurements (log values per configuration): the
    pooled within-configuration variance, shrunk towards the prior (a scaled inverse-chi-square
    posterior mean), never below the prior: a pool may be noisier than assumed, and a few
    lucky repeats must not make the search over-confident."""
    prior = noise_of(key)
    ss = sum(float(np.sum((np.asarray(r) - np.mean(r)) ** 2)) for r in repeats if len(r) > 1)
    dof = sum(len(r) - 1 for r in repeats if len(r) > 1)
    pooled = math.sqrt((NOISE_PRIOR_WEIGHT * prior**2 + ss) / (NOISE_PRIOR_WEIGHT + dof))
    return max(prior, pooled)


@dataclass(frozen=True)
class Observation:
    """One measured configuration: log(measured / predicted) and how many runs it averages."""

    config: TrialConfig
    log_ratio: float
    repeats: int = 1


def _kernel(a: np.ndarray, b: np.ndarray, sg: float, sl: float) -> np.ndarray:
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
    return sg**2 + sl**2 * np.exp(-0.5 * d2)


@dataclass
class Quantity:
    """The fitted posterior of one quantity's log-residual."""

    key: str
    train_x: np.ndarray
    alpha: np.ndarray  # (K + N)^-1 y
    chol: np.ndarray | None  # Cholesky factor of K + N
    sigma_global: float
    sigma_local: float
    noise: float

    @classmethod
    def fit(
        cls,
        key: str,
        observations: Sequence[Observation],
        *,
        noise: float | None = None,
        sigma_global: float = SIGMA_GLOBAL,
        sigma_local: float | None = None,
    ) -> Quantity:
        """Condition the quantity's GP on its observations.

        Args:
            key: 'tps' or 'metric/percentile' (sets the prior shape error and noise).
            observations: log(measured / predicted) per measured configuration, with repeats.
            noise: Run-to-run noise (log scale); default the quantity's prior noise.
            sigma_global: Prior spread of an error every configuration shares.
            sigma_local: Prior spread of the shape error; default `local_sigma(key)`.

        Returns:
            The posterior, ready for `predict`, `marginal` and `sample`.
        """
        sd = noise if noise is not None else noise_of(key)
        if sigma_local is None:
            sigma_local = local_sigma(key)
        if not observations:
            empty = np.zeros((0, 5))
            return cls(key, empty, np.zeros(0), None, sigma_global, sigma_local, sd)
        x = np.array([features(o.config) for o in observations])
        y = np.array([o.log_ratio for o in observations])
        noise_var = np.array([sd**2 / max(o.repeats, 1) for o in observations])
        k = _kernel(x, x, sigma_global, sigma_local) + np.diag(noise_var + _JITTER)
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
        return cls(key, x, alpha, chol, sigma_global, sigma_local, sd)

    def predict(self, configs: Sequence[TrialConfig]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and covariance of the log-residual at `configs`."""
        if not configs:
            return np.zeros(0), np.zeros((0, 0))
        x = np.array([features(c) for c in configs])
        prior = _kernel(x, x, self.sigma_global, self.sigma_local)
        if self.chol is None:
            return np.zeros(len(configs)), prior
        cross = _kernel(self.train_x, x, self.sigma_global, self.sigma_local)
        mean = cross.T @ self.alpha
        v = np.linalg.solve(self.chol, cross)
        return mean, prior - v.T @ v

    def marginal(self, configs: Sequence[TrialConfig]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (no joint structure)."""
        mean, cov = self.predict(configs)
        return mean, np.sqrt(np.clip(np.diag(cov), 0.0, None))

    def sample(
        self, configs: Sequence[TrialConfig], n: int, rng: np.random.Generator
    ) -> np.ndarray:
        """`n` joint draws of the log-residual at `configs` (shape n x len(configs)).

        Configurations with the same features (twins) share their draws."""
        if not configs:
            return np.zeros((n, 0))
        keys = [tuple(features(c)) for c in configs]
        unique = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(unique)}
        pts = [configs[keys.index(k)] for k in unique]
        mean, cov = self.predict(pts)
        scale = self.sigma_global**2 + self.sigma_local**2
        try:
            root = np.linalg.cholesky(cov + np.eye(len(pts)) * 1e-9 * scale)
        except np.linalg.LinAlgError:  # numerically not positive definite: fall back
            vals, vecs = np.linalg.eigh(cov)
            root = vecs * np.sqrt(np.clip(vals, 0.0, None))
        draws = mean + rng.standard_normal((n, len(pts))) @ root.T
        return draws[:, [where[k] for k in keys]]
