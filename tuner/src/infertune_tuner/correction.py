"""Measured results correct the performance model.

For each quantity the SLO and the objective need (tok/s/GPU, each bounded latency percentile) we
fit log(measured / predicted) as a ridge regression on a few configuration features. With no
data the correction is zero (pure prior); one measurement mostly moves the intercept (a global
efficiency error); more measurements learn how the error grows with batch, TP and precision.
The spread of what the model still gets wrong gives the uncertainty the search uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig

PRIOR_SIGMA = 0.22  # log-error of the uncorrected prior on an unseen GPU pool
FLOOR_SIGMA = 0.03  # measurement noise: never more certain than this
# Ridge penalty per feature: the intercept is cheap to move, shape terms need evidence.
PENALTY = np.array([0.05, 2.0, 2.0, 2.0, 2.0])


def features(cfg: TrialConfig) -> np.ndarray:
    return np.array(
        [
            1.0,
            math.log2(cfg.max_batch_size) / 4.0,
            math.log2(cfg.tp) / 2.0,
            math.log2(QUANTIZATIONS[cfg.quantization].weight_bytes),
            math.log2(KV_DTYPE_BYTES[cfg.kv_cache_dtype]),
        ]
    )


@dataclass
class Correction:
    """One fitted log-ratio model per quantity key ('tps', 'e2e_ms/p95', ...)."""

    coef: dict[str, np.ndarray] = field(default_factory=dict)
    resid: dict[str, float] = field(default_factory=dict)
    n: int = 0

    @classmethod
    def fit(cls, rows: list[tuple[TrialConfig, dict[str, float]]]) -> Correction:
        """rows: (config, {quantity: log(measured/predicted)})."""
        out = cls(n=len(rows))
        if not rows:
            return out
        keys = {k for _, d in rows for k in d}
        for key in keys:
            pts = [(features(c), d[key]) for c, d in rows if key in d]
            x = np.array([p[0] for p in pts])
            y = np.array([p[1] for p in pts])
            a = x.T @ x + np.diag(PENALTY)
            coef = np.linalg.solve(a, x.T @ y)
            out.coef[key] = coef
            res = y - x @ coef
            out.resid[key] = float(np.sqrt(np.mean(res**2))) if len(pts) > 1 else 0.0
        return out

    def log_ratio(self, key: str, cfg: TrialConfig) -> float:
        coef = self.coef.get(key)
        return float(features(cfg) @ coef) if coef is not None else 0.0

    def sigma(self, key: str) -> float:
        n = self.n
        shrink = PRIOR_SIGMA / math.sqrt(1 + n)
        return max(FLOOR_SIGMA, math.sqrt(shrink**2 + self.resid.get(key, 0.0) ** 2))

    def apply(self, key: str, cfg: TrialConfig, predicted: float) -> float:
        return predicted * math.exp(self.log_ratio(key, cfg))
