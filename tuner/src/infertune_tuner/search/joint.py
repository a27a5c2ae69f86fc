"""The posterior of a configuration's outcome as a whole: tok/s/GPU, and the latencies that
Little's law ties to it.

model.py gives each quantity's log-error (log measured / predicted) a Gaussian-process
posterior. They are not independent: under the tuner's closed-loop load, the E2E and ITL errors
of a configuration are -1 x its tok/s/GPU error plus a part of their own (the metric's
`throughput_tie`; residuals.py has the evidence). So a bound's quantity is modelled as

    r_bound(x) = tie x r_tps(x) + own_bound(x),   own_bound ~ its own GP (model.Quantity)

and TTFT (tie 0) is its own part alone. A configuration the model is pessimistic about is then
*both* faster and quicker than predicted, in every draw: the probability that it beats the best
and meets an E2E bound is not the product of two unlikely events but nearly one event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.hyperprior import Hyperprior
from infertune_tuner.search.model import Observation, Quantity, learned_noise
from infertune_tuner.search.residuals import Residuals, tie

# Gauss-Legendre nodes over the tok/s/GPU error's probability scale: the integrand (a product of
# normal CDFs) is smooth there; 16 nodes integrate it to well under the Monte Carlo error of the
# joint draws (SearchSettings.draws).
_NODES, _NODE_WEIGHTS = np.polynomial.legendre.leggauss(16)


@dataclass(frozen=True)
class Posterior:
    """tok/s/GPU's posterior and, per SLO bound key, the posterior of its own part."""

    tps: Quantity
    own: Mapping[str, Quantity]

    @classmethod
    def fit(cls, r: Residuals, hyperprior: Hyperprior) -> Posterior:
        """Condition every quantity on the run's residuals (`residuals.residuals`)."""

        def quantity(
            key: str, obs: Sequence[Observation], repeats: Sequence[Sequence[float]]
        ) -> Quantity:
            return Quantity.fit(
                key, obs, prior=hyperprior.of(key), noise=learned_noise(key, repeats)
            )

        return cls(
            tps=quantity("tps", r.observations["tps"], r.repeats["tps"]),
            own={k: quantity(k, v, r.own_repeats[k]) for k, v in r.own.items()},
        )

    def mean(self, key: str, configs: Sequence[TrialConfig]) -> np.ndarray:
        """Posterior mean log-error of quantity `key` ('tps' or a bound key) at `configs`."""
        tps = self.tps.marginal(configs)[0]
        if key == "tps":
            return tps
        return tie(key) * tps + self.own[key].marginal(configs)[0]

    def sample(
        self, configs: Sequence[TrialConfig], n: int, rng: np.random.Generator,
        bounded: Sequence[TrialConfig],
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
        """Joint draws: the tok/s/GPU log-error at `configs` (n x len(configs)) and each bound
        key's at `bounded`, the first len(bounded) of `configs` (n x len(bounded))."""
        tps = self.tps.sample(configs, n, rng)
        k = len(bounded)
        lat = {
            key: tie(key) * tps[:, :k] + q.sample(bounded, n, rng) for key, q in self.own.items()
        }
        return tps, lat

    def success(
        self, configs: Sequence[TrialConfig], log_bounds: Mapping[str, np.ndarray],
        tps_above: np.ndarray | None,
    ) -> np.ndarray:  # fmt: skip
        """Per configuration, P(every bound key's log-error < its log bound, and the
        tok/s/GPU log-error > `tps_above` where given), each configuration on its own.

        Integrates over the tok/s/GPU error (each mixture component on Gauss-Legendre nodes of
        its probability scale above `tps_above`); given it, the bounds' own parts are
        independent mixtures."""
        n = len(configs)
        if n == 0:
            return np.zeros(0)
        w, mu, sd = self.tps.moments(configs)  # (C,), (C, n), (C, n)
        low = np.full(n, -np.inf) if tps_above is None else np.asarray(tps_above, dtype=float)
        u0 = ndtr((low[None, :] - mu) / sd)  # (C, n): P(below the threshold) per component
        u = u0[..., None] + (1 - u0[..., None]) * (_NODES + 1) / 2  # (C, n, J)
        r = mu[..., None] + sd[..., None] * ndtri(np.clip(u, 1e-12, 1 - 1e-12))
        given = np.ones_like(r)
        for key, bound in log_bounds.items():
            ow, om, osd = self.own[key].moments(configs)  # (E,), (E, n), (E, n)
            limit = np.asarray(bound, dtype=float)[None, :, None] - tie(key) * r  # (C, n, J)
            z = (limit[None] - om[:, None, :, None]) / osd[:, None, :, None]  # (E, C, n, J)
            given *= np.tensordot(ow, ndtr(z), axes=1)
        inner = (given * (_NODE_WEIGHTS / 2)).sum(axis=-1)  # (C, n)
        return np.clip(w @ ((1 - u0) * inner), 0.0, 1.0)


def log_bound(bound_ms: float, predicted_ms: np.ndarray) -> np.ndarray:
    """The log-error at which a prediction just meets a bound."""
    return math.log(bound_ms) - np.log(predicted_ms)
