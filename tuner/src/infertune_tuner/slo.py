"""Checking measurements against the SLO, and how much room a measurement leaves."""

from __future__ import annotations

import math
from statistics import NormalDist

from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import OBJECTIVE, latency_metric
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Headroom, SloCheck

# A bound met by less than this many run-to-run standard deviations is not settled by a few runs:
# a fresh run of the same configuration misses it more than 2.3 % of the time. Two SDs is also
# where benchmarks/tuner_efficiency.py stops requiring a search to tell a configuration's side of
# a bound (its resolution zone).
SETTLED_SDS = 2.0


def check(request: TuningRequest, m: Measurement) -> list[SloCheck]:
    """Every SLO bound checked against a measurement (none for a failed trial)."""
    tps_per_gpu = m.output_tokens_per_s_per_gpu
    if m.status != "ok" or tps_per_gpu is None:
        return []
    out = []
    for b in request.slo:
        measured = m.percentiles(b.metric)
        value = measured.get(b.percentile) if measured else float("inf")
        out.append(
            SloCheck(
                bound=b.label(), metric=b.metric, percentile=b.percentile, limit_ms=b.max_ms,
                value_ms=round(value, 3), ok=value <= b.max_ms,
            )
        )  # fmt: skip
    if request.min_output_tokens_per_s_per_gpu is not None:
        floor = request.min_output_tokens_per_s_per_gpu
        out.append(SloCheck(
            bound=f"{OBJECTIVE.label} >= {floor:g}", metric=OBJECTIVE.key,
            percentile="mean", limit_ms=floor, value_ms=round(tps_per_gpu, 3),
            ok=tps_per_gpu >= floor,
        ))  # fmt: skip
    return out


def constraint_values(checks: list[SloCheck]) -> list[float]:
    """Optuna constraint values: <= 0 means satisfied (relative violation of each bound)."""
    vals = []
    for c in checks:
        if c.metric == OBJECTIVE.key:
            vals.append(c.limit_ms / max(c.value_ms, 1e-9) - 1.0)
        else:
            vals.append(c.value_ms / c.limit_ms - 1.0)
    return vals


def describe_violations(checks: list[SloCheck]) -> list[str]:
    out = []
    for c in checks:
        if c.ok:
            continue
        if c.metric == OBJECTIVE.key:
            out.append(f"{OBJECTIVE.label} {c.value_ms:.0f} < {c.limit_ms:g}")
        else:
            label = latency_metric(c.metric).label
            over = -headroom(c)
            out.append(
                f"{label} {c.percentile} {c.value_ms:.0f} ms > {c.limit_ms:g} ms (+{over:.0%})"
            )
    return out


def headroom(c: SloCheck) -> float:
    """The room a check leaves, relative to its bound: (limit - value) / limit for a latency,
    (value - limit) / limit for the tok/s/GPU floor; negative when the bound was missed."""
    if c.metric == OBJECTIVE.key:
        return (c.value_ms - c.limit_ms) / c.limit_ms
    return (c.limit_ms - c.value_ms) / c.limit_ms


def room(c: SloCheck, noise: float, repeats: int) -> Headroom:
    """How a typical run of `repeats` runs sits against one bound, given the pool's run-to-run
    noise of that quantity (log sd of one run): the chance a fresh run meets the bound counts
    both the fresh run's noise and the typical run's own (sd x sqrt(1 + 1 / repeats))."""
    value, limit = max(c.value_ms, 1e-9), c.limit_ms
    log_room = math.log(value / limit) if c.metric == OBJECTIVE.key else math.log(limit / value)
    sd = max(noise, 1e-9) * math.sqrt(1 + 1 / max(repeats, 1))
    return Headroom(
        bound=c.bound, metric=c.metric, percentile=c.percentile, value_ms=c.value_ms,
        limit_ms=limit, headroom=round(headroom(c), 4), noise=round(noise, 4),
        p_meets=round(NormalDist().cdf(log_room / sd), 4), settled=log_room >= SETTLED_SDS * sd,
    )  # fmt: skip
