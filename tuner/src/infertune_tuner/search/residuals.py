"""The run's measurements as the posterior's observations: log(measured / predicted).

One quantity per thing the search must predict: `tps` (tok/s/GPU) and one per SLO bound
(`bound_key`: 'e2e_ms/p95'). Each valid measurement of a configuration gives one observation per
quantity, the mean over its repeats (their spread is the learned run-to-run noise). A run that
was KV-capped (fewer sequences decoding than its batch) says how much memory there was, not how
fast the shapes are: it is memory evidence (memory_fit.py), not an observation here. Invalid
measurements (plausibility.py) are no observations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.model import Observation


def bound_key(b: SloBound) -> str:
    """The posterior quantity of one SLO bound, e.g. 'e2e_ms/p95'."""
    return f"{b.metric}/{b.percentile}"


def predicted(p: Prediction, b: SloBound) -> float:
    """What the performance model predicts for the quantity bound `b` limits."""
    return max(float(latency_metric(b.metric).of(p).get(b.percentile)), 1e-6)


@dataclass(frozen=True)
class Residuals:
    """Per quantity, the observations and each one's repeats (log scale)."""

    observations: dict[str, list[Observation]]
    repeats: dict[str, list[list[float]]]

    def by_config(self) -> dict[str, dict[TrialConfig, float]]:
        return {k: {o.config: o.log_ratio for o in v} for k, v in self.observations.items()}


def residuals(
    request: TuningRequest, priors: dict[TrialConfig, Prediction], known: Known
) -> Residuals:
    """The observations of every quantity (see the module doc)."""
    keys = [bound_key(b) for b in request.slo]
    obs: dict[str, list[Observation]] = {"tps": []}
    obs.update({k: [] for k in keys})
    reps: dict[str, list[list[float]]] = {k: [] for k in obs}
    for cfg, runs in known.runs.items():
        ok = [m for m in runs if m.status == "ok" and m.output_tokens_per_s_per_gpu]
        p = priors.get(cfg)
        if not ok or p is None or known.measured[cfg].status != "ok":
            continue
        if any(m.capped(cfg.max_batch_size) for m in ok):
            continue  # queueing behind a full KV cache, not the model's shape: memory evidence
        logs = [
            math.log((m.output_tokens_per_s_per_gpu or 0.0) / p.output_tokens_per_s_per_gpu)
            for m in ok
        ]
        reps["tps"].append(logs)
        obs["tps"].append(Observation(cfg, sum(logs) / len(logs), len(logs)))
        for b, key in zip(request.slo, keys, strict=True):
            vals = [pm.get(b.percentile) for m in ok if (pm := m.percentiles(b.metric))]
            if vals:
                logs = [math.log(max(v, 1e-6) / predicted(p, b)) for v in vals]
                reps[key].append(logs)
                obs[key].append(Observation(cfg, sum(logs) / len(logs), len(logs)))
    return Residuals(obs, reps)
