"""Checking measurements against the SLO."""

from __future__ import annotations

from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import OBJECTIVE, latency_metric
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck


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
            over = c.value_ms / c.limit_ms - 1
            out.append(
                f"{label} {c.percentile} {c.value_ms:.0f} ms > {c.limit_ms:g} ms (+{over:.0%})"
            )
    return out
