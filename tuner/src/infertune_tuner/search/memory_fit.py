"""The memory frontier as a probability, learned from what ran and what ran out of memory.

The memory model is good but not exact: a serving stack's workspace, reserve and usable fraction
move the frontier by several percent. So instead of a wall at "predicted to fit":

- margin = log(GPU memory / memory the configuration needs) by the memory model (weights,
  activations, reserve, and the KV cache for max batch sequences at full context, grossed up by
  the share of free memory the KV cache may take). margin >= 0 means predicted to fit.
- a configuration that needs more than `WIDE_MARGIN` more memory than the GPU has is ruled out:
  it stays `infeasible_predicted` and never runs.
- the rest are candidates that fit when margin + delta > 0, where delta is the memory model's
  error on this pool: a priori N(0, `DELTA_PRIOR`^2), updated on a grid from every measured
  outcome (a configuration that ran says delta > -margin, an OOM says delta < -margin).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.perfmodel.memory import FREE_GPU_MEMORY_FRACTION

# Needing 15 % more memory than the GPU has is beyond any workspace/reserve/fraction error seen.
WIDE_MARGIN = math.log(1.15)
DELTA_PRIOR = 0.05
SOFTNESS = 0.01  # allocator rounding: outcomes this close to the frontier say little
_GRID = np.linspace(-0.3, 0.3, 241)


def _phi(x: np.ndarray) -> np.ndarray:
    return np.asarray(ndtr(x))


def memory_margin(prediction: Prediction, gpu_memory_gib: float) -> float:
    """log(GPU memory / needed memory) as the memory model sees it (>= 0: predicted to fit)."""
    m = prediction.memory
    need = (
        m.weights_gib_per_gpu
        + m.activations_gib_per_gpu
        + m.reserve_gib_per_gpu
        + m.kv_cache_gib_per_gpu / FREE_GPU_MEMORY_FRACTION
    )
    return math.log(gpu_memory_gib / max(need, 1e-9))


def ruled_out(margin: float) -> bool:
    """Whether the memory model rules the configuration out by a wide margin."""
    return margin < -WIDE_MARGIN


@dataclass
class FitModel:
    """The posterior of delta (the memory model's error) on a grid."""

    weights: np.ndarray

    @classmethod
    def learn(cls, outcomes: Iterable[tuple[float, bool]]) -> FitModel:
        """The posterior of delta given measured outcomes.

        Args:
            outcomes: (memory margin, fitted) for every measured configuration; fitted is False
                for an out-of-memory and for a run whose KV cache capped its batch.

        Returns:
            The grid posterior (prior N(0, DELTA_PRIOR^2), a soft step likelihood per outcome).
        """
        logp = -0.5 * (_GRID / DELTA_PRIOR) ** 2
        for margin, ran in outcomes:
            z = (margin + _GRID) / SOFTNESS
            like = _phi(z) if ran else _phi(-z)
            logp = logp + np.log(np.clip(like, 1e-300, None))
        w = np.exp(logp - logp.max())
        return cls(w / w.sum())

    def probability(self, margins: np.ndarray) -> np.ndarray:
        """P(fits) for each margin."""
        z = (margins[:, None] + _GRID[None, :]) / SOFTNESS
        return np.asarray(_phi(z) @ self.weights)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` draws of delta (fit of a configuration in draw s: margin + delta_s > 0)."""
        return np.asarray(rng.choice(_GRID, size=n, p=self.weights))
