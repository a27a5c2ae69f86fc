"""When two measurements of output tokens/s/GPU differ by more than measurement noise (pure).

One place decides it for the verification after rollout (is the serving pod BelowTuned?) and for
a retune (does the new configuration beat the serving one?). The noise is the tuner's own: its
posterior assumes a run-to-run noise of tok/s/GPU of sigma = 3 % on the log scale for one benchmark
run (``infertune_tuner.defaults.RUN_NOISE["tps"]``; learned per study from repeats, never below
it). Two independent runs, averaged over n_a and n_b repeats, differ in log by a normal error of
standard deviation sigma·sqrt(1/n_a + 1/n_b); a difference beyond :data:`Z` of those is more than
noise: one-sided, a healthy verification is flagged in about 2.3 % of rollouts.

With one run on each side (a verification against the trial that found the configuration):
2 x 0.03 x sqrt2 = 0.085 in log, so a shortfall of more than 8.1 % is BelowTuned. A retune's two
configurations, each confirmed by two runs: 2 x 0.03 x 1 = 0.06, 6.2 % better to roll.
"""

from __future__ import annotations

import math

from infertune_tuner.defaults import RUN_NOISE

Z = 2.0  # standard deviations: one-sided false alarm rate 2.3 %
TPS_NOISE = RUN_NOISE["tps"]


def log_margin(runs_a: int = 1, runs_b: int = 1, sigma: float = TPS_NOISE) -> float:
    """The log difference two means (of ``runs_a`` and ``runs_b`` runs) stay within by noise."""
    return Z * sigma * math.sqrt(1 / max(runs_a, 1) + 1 / max(runs_b, 1))


def shortfall_tolerance(runs_tuned: int = 1, runs_measured: int = 1) -> float:
    """The largest relative shortfall (0.081 = 8.1 %) that is still measurement noise."""
    return 1 - math.exp(-log_margin(runs_tuned, runs_measured))


def beats(new: float, current: float, runs_new: int = 1, runs_current: int = 1) -> bool:
    """Whether ``new`` tok/s/GPU beats ``current`` by more than the noise."""
    if current <= 0:
        return new > 0
    return new > 0 and math.log(new / current) > log_margin(runs_new, runs_current)


def improvement_margin(runs_new: int = 1, runs_current: int = 1) -> float:
    """The relative improvement (0.062 = 6.2 %) that :func:`beats` requires."""
    return math.exp(log_margin(runs_new, runs_current)) - 1
