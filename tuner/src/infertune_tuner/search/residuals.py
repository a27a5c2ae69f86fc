"""The run's measurements as the posterior's observations: log(measured / predicted).

One quantity per thing the search must predict: `tps` (tok/s/GPU) and one per SLO bound
(`bound_key`: 'e2e_ms/p95'). Each valid measurement of a configuration gives one observation per
quantity, the mean over its repeats (their spread is the learned run-to-run noise). A run that
was KV-capped (fewer sequences decoding than its batch) says how much memory there was, not how
fast the shapes are: it is memory evidence (memory_fit.py), not an observation here. Invalid
measurements (plausibility.py) are no observations.

**Little's law ties latency to throughput.** Every trial runs a closed loop of max-batch-size
concurrent requests, so requests complete at concurrency / mean E2E and the output tok/s/GPU is
concurrency x output tokens / (mean E2E x GPUs); the per-request ITL is (E2E - TTFT) / (output
tokens - 1). A pool faster than the model at a configuration is faster in tok/s/GPU, E2E and ITL
alike: the log-error of an E2E or ITL percentile is -1 x that of tok/s/GPU plus a part of its
own (the shape of the latency distribution, the share of prefill). The factor is the metric's
`throughput_tie` (metrics.py); `own` observations are log(latency error) - tie x log(tok/s/GPU error), which is what the
posterior models for a tied bound (joint.py). Evidence, from the residual fields of the
benchmark's worlds (typical runs of every configuration, 10 families, 3 seeds; printed by
benchmarks/fit_hyperprior.py): per family, the median corr(E2E error, tok/s/GPU error) is -0.94
to -1.00 and the fitted slope -0.90 to -1.43; ITL -0.98 to -0.99 and -1.02 to -1.12; adding the
tok/s/GPU error shrinks the spread 2-90x (dev-synthetic E2E 0.37 -> 0.03, the real vLLM tables
0.18 -> 0.002; the held-out real-GPU world's ITL 0.53 -> 0.06). TTFT is not tied (corr -0.46 to
+0.18: admission, not throughput, decides it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import OBJECTIVE, latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.result import SloCheck
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.model import Observation


def tie(key: str) -> float:
    """The factor tying quantity `key` ('metric/percentile') to the tok/s/GPU error (0: none):
    its metric's `throughput_tie`."""
    return latency_metric(key.split("/", 1)[0]).throughput_tie


def bound_key(b: SloBound) -> str:
    """The posterior quantity of one SLO bound, e.g. 'e2e_ms/p95'."""
    return _quantity(b.metric, b.percentile)


def check_key(c: SloCheck) -> str:
    """The posterior quantity one SLO check measures: 'tps' for the tok/s/GPU floor, else its
    bound's (bound_key)."""
    return "tps" if c.metric == OBJECTIVE.key else _quantity(c.metric, c.percentile)


def _quantity(metric: str, percentile: str) -> str:
    return f"{metric}/{percentile}"


def predicted(p: Prediction, b: SloBound) -> float:
    """What the performance model predicts for the quantity bound `b` limits."""
    return max(float(latency_metric(b.metric).of(p).get(b.percentile)), 1e-6)


@dataclass(frozen=True)
class Residuals:
    """Per quantity, the observations and each one's repeats (log scale); `own` and
    `own_repeats` hold, per bound key, the part not tied to tok/s/GPU (all of it when untied)."""

    observations: dict[str, list[Observation]]
    repeats: dict[str, list[list[float]]]
    own: dict[str, list[Observation]]
    own_repeats: dict[str, list[list[float]]]

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
    own: dict[str, list[Observation]] = {k: [] for k in keys}
    own_reps: dict[str, list[list[float]]] = {k: [] for k in keys}

    def add(into: dict[str, list[Observation]], runs_into: dict[str, list[list[float]]],
            key: str, cfg: TrialConfig, logs: list[float]) -> None:  # fmt: skip
        runs_into[key].append(logs)
        into[key].append(Observation(cfg, sum(logs) / len(logs), len(logs)))

    for cfg, runs in known.runs.items():
        ok = [m for m in runs if m.status == "ok" and m.output_tokens_per_s_per_gpu]
        p = priors.get(cfg)
        if not ok or p is None or known.measured[cfg].status != "ok":
            continue
        if any(m.capped(cfg.max_batch_size) for m in ok):
            continue  # queueing behind a full KV cache, not the model's shape: memory evidence
        tps_logs = [
            math.log((m.output_tokens_per_s_per_gpu or 0.0) / p.output_tokens_per_s_per_gpu)
            for m in ok
        ]
        add(obs, reps, "tps", cfg, tps_logs)
        for b, key in zip(request.slo, keys, strict=True):
            pairs = [
                (math.log(max(pm.get(b.percentile), 1e-6) / predicted(p, b)), t)
                for m, t in zip(ok, tps_logs, strict=True)
                if (pm := m.percentiles(b.metric))
            ]
            if pairs:
                add(obs, reps, key, cfg, [v for v, _ in pairs])
                add(own, own_reps, key, cfg, [v - tie(key) * t for v, t in pairs])
    return Residuals(obs, reps, own, own_reps)
