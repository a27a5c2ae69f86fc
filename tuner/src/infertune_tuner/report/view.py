"""What both report formats show, computed once: the binding SLO bound, the Pareto front,
predicted-vs-measured errors, a one-line verdict."""

from __future__ import annotations

from dataclasses import dataclass

from infertune_tuner.metrics import latency_metric
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.result import Report, Trial


@dataclass(frozen=True)
class Point:
    trial: Trial
    latency_ms: float
    tps: float
    slo_ok: bool
    pareto: bool


@dataclass(frozen=True)
class View:
    report: Report
    request: TuningRequest
    binding: SloBound
    points: list[Point]
    verdict: str
    plan: str  # why the executed trials ran, e.g. "6 explore, 2 cover, 2 confirm"

    @property
    def axis_label(self) -> str:
        b = self.binding
        return f"{latency_metric(b.metric).label} {b.percentile} (ms)"


def binding_bound(report: Report, request: TuningRequest) -> SloBound:
    """The SLO bound closest to being violated at the best config (else the tightest miss)."""
    bounds = request.slo
    ref = None
    if report.best is not None:
        ref = report.best.metrics
    elif report.nearest_misses:
        t = next((t for t in report.trials if t.number == report.nearest_misses[0].trial), None)
        ref = t.metrics if t else None
    if ref is None:
        return bounds[0]
    return max(bounds, key=lambda b: ref.latency(b.metric, b.percentile) / b.max_ms)


def pareto(points: list[tuple[float, float]]) -> list[bool]:
    """Non-dominated points for (lower latency, higher throughput)."""
    out = []
    for i, (lat, tps) in enumerate(points):
        dominated = any(
            (l2 <= lat and t2 >= tps) and (l2 < lat or t2 > tps)
            for j, (l2, t2) in enumerate(points)
            if j != i
        )
        out.append(not dominated)
    return out


PURPOSES = {
    "probe": "probe (most likely to meet the SLO while nothing had)",
    "explore": "explore (the largest expected gain)",
    "cover": "cover (a TP size or quantization the model could be wrong about)",
    "confirm": "confirm (a finalist measured again)",
}


def plan(report: Report) -> str:
    """How many executed trials the planner spent on each purpose (in PURPOSES order)."""
    counts = {k: 0 for k in PURPOSES}
    for t in report.trials:
        if t.executed and t.purpose in counts:
            counts[t.purpose] += 1
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n)


def build_view(report: Report) -> View:
    request = report.parsed_request()
    b = binding_bound(report, request)
    measured = [t for t in report.trials if t.executed and t.metrics]
    coords = [
        (t.metrics.latency(b.metric, b.percentile), t.metrics.output_tokens_per_s_per_gpu)
        for t in measured
        if t.metrics
    ]
    front = pareto(coords)
    points = [
        Point(t, lat, tps, bool(t.slo_ok), on)
        for t, (lat, tps), on in zip(measured, coords, front, strict=True)
    ]
    if report.best is not None:
        c, m = report.best.config, report.best.metrics
        verdict = (
            f"Best: TP{c.tp}, max batch {c.max_batch_size}, {c.quantization}, KV {c.kv_cache_dtype}"
            f" -> {m.output_tokens_per_s_per_gpu:.0f} output tok/s/GPU, meeting every SLO bound"
        )
    else:
        verdict = "No configuration met the SLO."
    return View(report, request, b, points, verdict, plan(report))


def error_pct(predicted: float | None, measured: float | None) -> str:
    if not predicted or measured is None:
        return ""
    return f"{(predicted / measured - 1) * 100:+.0f}%"
