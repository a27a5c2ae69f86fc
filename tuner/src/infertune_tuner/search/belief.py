"""Believed results for trials in flight: how parallel workers propose jointly.

Several workers of one study each ask for the next configuration while the others' trials run.
Left alone, every proposal would rank the same candidates the same way and the workers would
cluster on one region (near twins of what is already running). The classic answer of batch
Bayesian optimisation, the *kriging believer*, treats each pending point as if it had been
observed at the posterior mean: the posterior tightens around it, and - what matters most here -
a configuration believed feasible becomes the incumbent the next proposal must beat. So a
worker asked while TP4/b128 runs looks at what could beat TP4/b128's expected result (a larger
batch, another TP), not at TP4/b128's twin.

A believed result only steers proposals: it is never recorded or reported as a measurement, and
the real measurement replaces it when the trial ends. The chances a proposal is recorded with
(result.Chances) are the ones it was made with, so their incumbent may be a believed one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES
from infertune_tuner.perfmodel.latency import Percentiles, Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.joint import Posterior

BELIEVED = "believed: a trial in flight, at its posterior mean"


def believed(
    request: TuningRequest,
    known: Known,
    flying: Sequence[TrialConfig],
    priors: dict[TrialConfig, Prediction],
    posterior: Posterior,
    p_fit: np.ndarray,
) -> Known:
    """`known` with a believed measurement for each configuration of `flying`.

    Args:
        request: The request (its SLO bounds judge the believed results).
        known: What the study measured, and what is in flight.
        flying: The in-flight configurations to believe (not measured yet).
        priors: The performance model's prediction per configuration.
        posterior: The posterior of tok/s/GPU and of each SLO bound's quantity
            ('metric/percentile'), as log-residuals against the prediction (joint.py).
        p_fit: P(fits in memory) per configuration of `flying`.

    Returns:
        A Known whose runs add, per flying configuration, its prediction corrected by the
        posterior mean (an OOM where it more likely does not fit); still in flight.
    """
    runs = dict(known.runs)
    tps_shift = posterior.mean("tps", flying)
    shifts = {key: posterior.mean(key, flying) for key in posterior.own}
    for i, cfg in enumerate(flying):
        if p_fit[i] < 0.5:
            runs[cfg] = [Measurement.failed("oom", BELIEVED)]
            continue
        p = priors[cfg]
        latency: dict[str, Percentiles | None] = {}
        for metric in LATENCY_METRICS:
            base = metric.of(p)
            latency[metric.key] = Percentiles(*(
                base.get(q) * math.exp(float(shifts[k][i]) if (k := f"{metric.key}/{q}") in shifts else 0.0)
                for q in PERCENTILES
            ))  # fmt: skip
        runs[cfg] = [
            Measurement.ok(
                latency,
                output_tokens_per_s_per_gpu=p.output_tokens_per_s_per_gpu * math.exp(tps_shift[i]),
                concurrency=cfg.max_batch_size,
                reason=BELIEVED,
            )
        ]
    return Known.build(request, runs, known.in_flight, known.covers)
