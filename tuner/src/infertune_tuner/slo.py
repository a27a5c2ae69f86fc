"""Checking measurements against the SLO, and how much room a measurement leaves."""

from __future__ import annotations

import math
from statistics import NormalDist

from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import OBJECTIVE
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Check, FloorCheck, Headroom, SloCheck

# A bound met by less than this many run-to-run standard deviations is not settled by a few runs:
# a fresh run of the same configuration misses it more than 2.3 % of the time. Two SDs is also
# where benchmarks/tuner_efficiency.py stops requiring a search to tell a configuration's side of
# a bound (its resolution zone).
SETTLED_SDS = 2.0


def check(request: TuningRequest, m: Measurement) -> list[Check]:
    """Every SLO bound checked against a measurement (none for a failed trial)."""
    tps_per_gpu = m.output_tokens_per_s_per_gpu
    if m.status != "ok" or tps_per_gpu is None:
        return []
    out: list[Check] = []
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
        out.append(FloorCheck(
            bound=f"{OBJECTIVE.label} >= {floor:g}", limit_tps=floor,
            value_tps=round(tps_per_gpu, 3), ok=tps_per_gpu >= floor,
        ))  # fmt: skip
    return out


def constraint_values(checks: list[Check]) -> list[float]:
    """Optuna constraint values: <= 0 means satisfied (relative violation of each bound)."""
    return [c.violation for c in checks]


def describe_violations(checks: list[Check]) -> list[str]:
    return [c.miss() for c in checks if not c.ok]


def room(c: Check, noise: float, repeats: int) -> Headroom:
    """How a typical run of `repeats` runs sits against one bound, given the pool's run-to-run
    noise of that quantity (log sd of one run): the chance a fresh run meets the bound counts
    both the fresh run's noise and the typical run's own (sd x sqrt(1 + 1 / repeats))."""
    sd = max(noise, 1e-9) * math.sqrt(1 + 1 / max(repeats, 1))
    if isinstance(c, FloorCheck):
        metric, percentile, value, limit = OBJECTIVE.key, "mean", c.value_tps, c.limit_tps
    else:
        metric, percentile, value, limit = c.metric, c.percentile, c.value_ms, c.limit_ms
    return Headroom(
        bound=c.bound, metric=metric, percentile=percentile, value_ms=value,
        limit_ms=limit, headroom=round(c.headroom, 4), noise=round(noise, 4),
        p_meets=round(NormalDist().cdf(c.log_room / sd), 4),
        settled=c.log_room >= SETTLED_SDS * sd,
    )  # fmt: skip
