"""What the measurements say about configurations not yet measured: a Gaussian-process posterior
whose doubt is learned from the run's own evidence.

For each quantity the search needs (tok/s/GPU and every bounded latency percentile) the
performance model's prediction is the prior mean, and the log of measured / predicted is modelled
as a Gaussian process over configuration features (`FEATURES`):

    log(measured / predicted)(x) ~ GP(0, k),   k: kernel.py
    k(x, x') = sigma_global^2 + sigma_local^2 * exp(-sum_d (x_d - x'_d)^2 / (2 l_d^2))
               + a slope along batch and TP per trend_j (kernel.py)
    y = f(x) + measurement noise (its variance divided by the number of repeats)

- `sigma_global`: an error the whole pool shares (a faster or slower serving stack);
- `sigma_local`: error in the *shape* of the curves (a term the roofline lacks: prefill stalls,
  CUDA-graph gaps, dequantisation cost, a scheduler that saturates early), learned only near what
  was measured, so a configuration unlike anything measured is never written off merely because
  other configurations were measured;
- `l_d`: how far along feature d a shape error stays alike (a short batch length: the error
  changes from one batch size to the next; a long TP length: TP sizes share it);
- `trend_j`: how steeply the error may grow along log batch and log TP (a batching efficiency
  or an all-reduce cost the roofline scales wrongly), a slope that may differ between TP sizes
  and precisions.

The latency quantities that Little's law ties to tok/s/GPU are modelled through it (joint.py):
what this module fits for them is the part of their error of their own.

None of these is fixed. A run weighs a set of settings spread over the hyperprior
(hyperprior.py: fitted across worlds of many forms) by the marginal likelihood of its own
measurements, and the posterior is the mixture: residuals that are large or uneven where the run
measured give weight to large `sigma_local` and short lengths, which widens the posterior at
every configuration it has not measured instead of being absorbed as an offset and carried to
TP sizes and quantizations it never saw. With few measurements the hyperprior dominates; the
mixture never becomes more certain than the settings its evidence allows.

The same posterior gives the probability of meeting each SLO bound and, sampled jointly over all
candidates, the probability that any of them beats the best measured configuration (the stop
rule in planner.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.defaults import RUN_NOISE
from infertune_tuner.search.hyperprior import KindPrior
from infertune_tuner.search.kernel import Hyper, kernel, prior_variance

# Features are scaled so that one unit means "quite different": a 4x batch change, a TP
# doubling, a weight width halving, a change of tensor-core path, a KV-cache width halving.
FEATURES = ("batch", "tp", "weight width", "compute path", "kv width")
_COMPUTE_LEVEL = {"bf16": 0.0, "fp8": -1.0, "fp4": -2.0}
_JITTER = 1e-9
# Run-to-run noise (log scale) of one measurement of each kind of quantity.
NOISE = RUN_NOISE
NOISE_PRIOR_WEIGHT = 3.0  # the prior noise counts as this many degrees of freedom
PARTICLES = 64  # hyperparameter settings weighed per quantity
KEEP_MASS = 0.999  # the mixture keeps the heaviest settings holding this much weight ...
MAX_COMPONENTS = 24  # ... and at most this many


def features(cfg: TrialConfig) -> np.ndarray:
    """The coordinates a configuration has in the posterior's kernel (see FEATURES)."""
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


def noise_of(key: str) -> float:
    """Prior measurement noise of quantity `key` ('tps' or 'metric/percentile')."""
    return NOISE.get(key.rsplit("/", 1)[-1], NOISE["p95"])


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


@dataclass(frozen=True)
class _Component:
    """The GP under one hyperparameter setting, conditioned on the observations."""

    hyper: Hyper
    weight: float
    chol: np.ndarray | None
    alpha: np.ndarray


def _condition(x: np.ndarray, y: np.ndarray, noise_var: np.ndarray, h: Hyper) -> tuple[
    float, np.ndarray, np.ndarray
]:  # fmt: skip
    """(log marginal likelihood, Cholesky factor, alpha) of the observations under `h`."""
    k = kernel(x, x, h) + np.diag(noise_var + _JITTER)
    chol = np.linalg.cholesky(k)
    z = np.linalg.solve(chol, y)
    alpha = np.linalg.solve(chol.T, z)
    ll = (
        -0.5 * float(z @ z)
        - float(np.log(np.diag(chol)).sum())
        - 0.5 * len(y) * math.log(2 * math.pi)
    )
    return ll, chol, alpha


@dataclass
class Quantity:
    """The posterior of one quantity's log-residual: a mixture over hyperparameter settings."""

    key: str
    train_x: np.ndarray
    components: tuple[_Component, ...]
    noise: float

    @classmethod
    def fit(
        cls,
        key: str,
        observations: Sequence[Observation],
        *,
        prior: KindPrior,
        noise: float | None = None,
        particles: int = PARTICLES,
    ) -> Quantity:
        """Condition the quantity's GP on its observations, weighing `particles` settings
        spread over `prior` by their marginal likelihood.

        Args:
            key: 'tps' or 'metric/percentile' (sets the prior measurement noise).
            observations: log(measured / predicted) per measured configuration, with repeats.
            prior: The hyperprior of this kind of quantity (hyperprior.Hyperprior.of(key)).
            noise: Run-to-run noise (log scale); default the quantity's prior noise.
            particles: How many settings to weigh.

        Returns:
            The posterior, ready for `marginal`, `probability` and `sample`.
        """
        sd = noise if noise is not None else noise_of(key)
        settings = prior.particles(particles)
        if not observations:
            comps = tuple(_Component(h, 1.0 / len(settings), None, np.zeros(0)) for h in settings)
            return cls(key, np.zeros((0, len(FEATURES))), _prune(comps), sd)
        x = np.array([features(o.config) for o in observations])
        y = np.array([o.log_ratio for o in observations])
        noise_var = np.array([sd**2 / max(o.repeats, 1) for o in observations])
        fitted, lls = [], []
        for h in settings:
            try:
                ll, chol, alpha = _condition(x, y, noise_var, h)
            except np.linalg.LinAlgError:
                continue
            if not math.isfinite(ll):
                continue
            fitted.append((h, chol, alpha))
            lls.append(ll)
        if not fitted:  # the noise on the diagonal keeps every setting positive definite
            raise ValueError(f"{key}: no hyperparameter setting gives a finite likelihood")
        w = np.exp(np.array(lls) - max(lls))
        w /= w.sum()
        comps = tuple(
            _Component(h, float(wi), c, a) for (h, c, a), wi in zip(fitted, w, strict=True)
        )
        return cls(key, x, _prune(comps), sd)

    def _moments(self, x: np.ndarray, c: _Component) -> tuple[np.ndarray, np.ndarray]:
        prior_var = prior_variance(x, c.hyper)
        if c.chol is None:
            return np.zeros(len(x)), prior_var
        cross = kernel(self.train_x, x, c.hyper)
        v = np.linalg.solve(c.chol, cross)
        return cross.T @ c.alpha, np.clip(prior_var - (v * v).sum(axis=0), 1e-12, None)

    def moments(self, configs: Sequence[TrialConfig]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per mixture component: its weight (C), and its mean and standard deviation at each
        configuration (C x len(configs))."""
        x = np.array([features(c) for c in configs]).reshape(len(configs), len(FEATURES))
        weights = np.array([c.weight for c in self.components])
        pairs = [self._moments(x, c) for c in self.components]
        mean = np.array([mu for mu, _ in pairs]).reshape(len(pairs), len(configs))
        sd = np.sqrt(np.array([var for _, var in pairs])).reshape(len(pairs), len(configs))
        return weights, mean, sd

    def marginal(self, configs: Sequence[TrialConfig]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the mixture (no joint structure)."""
        if not configs:
            return np.zeros(0), np.zeros(0)
        x = np.array([features(c) for c in configs])
        mean, second = np.zeros(len(x)), np.zeros(len(x))
        for c in self.components:
            mu, var = self._moments(x, c)
            mean += c.weight * mu
            second += c.weight * (var + mu**2)
        return mean, np.sqrt(np.clip(second - mean**2, 0.0, None))

    def probability(
        self, configs: Sequence[TrialConfig], bound: np.ndarray | float, *, below: bool
    ) -> np.ndarray:
        """P(log-residual < bound) (`below`) or > bound at each configuration, under the mixture."""
        if not configs:
            return np.zeros(0)
        x = np.array([features(c) for c in configs])
        out = np.zeros(len(x))
        for c in self.components:
            mu, var = self._moments(x, c)
            z = (np.asarray(bound) - mu) / np.sqrt(var)
            out += c.weight * ndtr(z if below else -z)
        return out

    def sample(
        self, configs: Sequence[TrialConfig], n: int, rng: np.random.Generator
    ) -> np.ndarray:
        """`n` joint draws of the log-residual at `configs` (shape n x len(configs)): each draw
        picks a setting by its weight, then draws from that setting's posterior.

        Configurations with the same features (twins) share their draws."""
        if not configs:
            return np.zeros((n, 0))
        keys = [tuple(features(c)) for c in configs]
        unique = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(unique)}
        x = np.array(unique)
        weights = np.array([c.weight for c in self.components])
        which = rng.choice(len(self.components), size=n, p=weights / weights.sum())
        draws = np.zeros((n, len(unique)))
        for i, c in enumerate(self.components):
            rows = np.flatnonzero(which == i)
            if not len(rows):
                continue
            mean, cov = self._joint(x, c)
            scale = float(prior_variance(x, c.hyper).max())
            try:
                root = np.linalg.cholesky(cov + np.eye(len(x)) * 1e-9 * scale)
            except np.linalg.LinAlgError:  # numerically not positive definite: fall back
                vals, vecs = np.linalg.eigh(cov)
                root = vecs * np.sqrt(np.clip(vals, 0.0, None))
            draws[rows] = mean + rng.standard_normal((len(rows), len(x))) @ root.T
        return draws[:, [where[k] for k in keys]]

    def _joint(self, x: np.ndarray, c: _Component) -> tuple[np.ndarray, np.ndarray]:
        prior = kernel(x, x, c.hyper)
        if c.chol is None:
            return np.zeros(len(x)), prior
        cross = kernel(self.train_x, x, c.hyper)
        v = np.linalg.solve(c.chol, cross)
        return cross.T @ c.alpha, prior - v.T @ v

    def shape_error(self) -> float:
        """The posterior's shape-error scale: the weighted mean of sigma_local."""
        return float(sum(c.weight * c.hyper.sigma_local for c in self.components))


def _prune(comps: tuple[_Component, ...]) -> tuple[_Component, ...]:
    """The heaviest settings holding KEEP_MASS of the weight (at most MAX_COMPONENTS), renormalised."""
    ordered = sorted(comps, key=lambda c: -c.weight)
    kept, mass = [], 0.0
    for c in ordered:
        kept.append(c)
        mass += c.weight
        if mass >= KEEP_MASS or len(kept) >= MAX_COMPONENTS:
            break
    total = sum(c.weight for c in kept)
    return tuple(_Component(c.hyper, c.weight / total, c.chol, c.alpha) for c in kept)
