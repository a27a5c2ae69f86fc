"""report.md: the tuning report as Markdown (for PRs, tickets, terminals)."""

from __future__ import annotations

from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.report.view import (
    build_view,
    chances_cell,
    error_pct,
    measured_times,
    products_label,
)
from infertune_tuner.result import Metrics, Report, Trial


def _cfg(t: Trial) -> str:
    c = t.config
    return f"TP{c.tp} / bs{c.max_batch_size} / {c.quantization} / KV {c.kv_cache_dtype}"


def _row(t: Trial) -> str:
    m, p = t.metrics, t.predicted
    tps = f"{m.output_tokens_per_s_per_gpu:.0f}" if m else ""
    ptps = f"{p.output_tokens_per_s_per_gpu:.0f}" if p else ""
    err = error_pct(
        p.output_tokens_per_s_per_gpu if p else None, m.output_tokens_per_s_per_gpu if m else None
    )
    p95s = " | ".join(x.format(m.latency(x.key, "p95")) if m else "" for x in LATENCY_METRICS)
    slo = {True: "yes", False: "no", None: ""}[t.slo_ok]
    reason = (t.reason or "").replace("|", "/")
    if t.slo_checks and not t.slo_ok:
        reason = "; ".join(c.bound for c in t.slo_checks if not c.ok) + " missed"
    if t.purpose == "confirm":
        reason = ("re-measured; " + reason).rstrip("; ")
    elif t.purpose == "cover":
        reason = ("covers its TP size / quantization; " + reason).rstrip("; ")
    return (
        f"| {t.number} | {_cfg(t)} | {t.state} | {slo} | {tps} | {ptps} | {err} "
        f"| {chances_cell(t)} | {p95s} | {reason} |"
    )


def _spread(m: Metrics) -> str:
    """`p50 / p95 / p99` of every latency metric, one table cell each."""
    return " | ".join(
        " / ".join(x.format(v) for v in m.percentiles(x.key).model_dump().values())
        for x in LATENCY_METRICS
    )


def render_markdown(report: Report) -> str:
    v = build_view(report)
    r = v.request
    lines = [
        f"# Tuning report: {r.name}",
        "",
        f"**{v.headline.text}**",
        "",
        *([f"Next: {v.headline.next_step}", ""] if v.headline.next_step else []),
        *([v.pool, ""] if v.pool else []),
        f"- Model `{r.model.name}` on `{products_label(r)}` (at most {r.gpu.max_gpus_per_replica} GPUs "
        f"per replica), {r.workload.input_tokens} input / {r.workload.output_tokens} output tokens",
        "- SLO: "
        + ", ".join(b.label() for b in r.slo)
        + (
            f", tok/s/GPU >= {r.min_output_tokens_per_s_per_gpu:g}"
            if r.min_output_tokens_per_s_per_gpu
            else ""
        ),
        f"- Backend `{report.backend}`, sampler `{report.sampler}`: {report.executed_trials} trials "
        f"executed of a {report.space_size}-configuration space (budget {r.tuning.max_trials}"
        + (
            f", confidence target {r.tuning.confidence_target:g})"
            if report.sampler == "auto"
            else ")"
        ),
        f"- Prior: performance model with the `{report.prior_stack}` stack factors",
        *([f"- Trials by purpose: {v.plan}"] if v.plan else []),
        *([f"- Chances as the search saw them: {v.track}"] if v.track else []),
        f"- Stopped: {report.stopped_reason}",
        *([f"- {v.confidence}"] if v.confidence else []),
        *([f"- {v.headroom}"] if v.headroom else []),
        *(
            [
                f"- Confidence: not claimed: {', '.join(report.uncovered)} could still hold the "
                "optimum and were never measured near their predicted best (raise maxTrials and "
                "re-run: the study resumes)"
            ]
            if report.uncovered
            else []
        ),
        f"- Generated {report.generated_at} by infertune {report.infertune_version} in "
        f"{report.duration_s:.1f} s",
        "",
    ]
    if report.resumed_trials:
        lines.insert(
            -1,
            f"- Resumed an earlier study: {report.resumed_trials} of the executed trials come "
            "from earlier runs",
        )
    if report.best:
        m = report.best.metrics
        spreads = " | ".join(f"{x.label} p50/p95/p99 {x.unit}" for x in LATENCY_METRICS)
        lines += [
            "## Chosen configuration",
            "",
            f"| TP | max batch | quantization | KV cache | tok/s/GPU | {spreads} |",
            "|---|---|---|---|---|" + "---|" * len(LATENCY_METRICS),
            f"| {report.best.config.tp} | {report.best.config.max_batch_size} | "
            f"{report.best.config.quantization} | {report.best.config.kv_cache_dtype} | "
            f"{m.output_tokens_per_s_per_gpu:.0f} | {_spread(m)} |",
            "",
            measured_times(report)
            + (
                ": tok/s/GPU is the mean, each latency percentile the geometric mean of the "
                "repeats (the typical run, what the SLO was checked against); spread between "
                "repeats " + ", ".join(f"{k} {v:.1%}" for k, v in report.best.noise.items())
                if report.best.repeats > 1 and report.best.noise
                else "."
            ),
            "",
        ]
    if report.nearest_misses:
        lines += ["## Nearest misses", ""]
        for nm in report.nearest_misses:
            lines.append(
                f"- {nm.config.label()} ({nm.output_tokens_per_s_per_gpu:.0f} tok/s/GPU): "
                + "; ".join(nm.violations)
            )
        lines += [
            "",
            "Relax the bound that is missed by the least, allow more GPUs per replica, a "
            "lower-precision quantization (raise maxAccuracyLossPercent), or a faster GPU.",
            "",
        ]
    if v.pools:
        lines += ["## Which GPU", "", *[f"- {line}" for line in v.pools], ""]
    if v.failures:
        lines += ["## What could not run", "", *[f"- {line}" for line in v.failures], ""]
    executed, skipped = v.rows, v.ruled_out
    lines += [
        "## Executed trials",
        "",
        "Latencies are p95 of the measured run; 'pred' is the performance model's prior; "
        "'chances' is what the search gave the configuration when it chose it, given the "
        "trials before: P(meets the SLO) / P(beats the best by more than 2 %). "
        f"SLO: {', '.join(b.label() for b in r.slo)}.",
        "",
        "| # | config | state | SLO | tok/s/GPU | pred | pred err | chances | "
        + "".join(f"{x.label} p95 | " for x in LATENCY_METRICS)
        + "note |",
        "|---|---|---|---|---|---|---|---|" + "---|" * (len(LATENCY_METRICS) + 1),
        *[_row(t) for t in executed],
        "",
    ]
    if report.untried:
        lines += [
            "## Not measured, and why",
            "",
            f"Every configuration of the {report.space_size}-configuration space that was not "
            "measured, grouped by why. P(beats) is the posterior probability that it fits, "
            "meets the SLO and beats the best by more than 2 %.",
            "",
            "| why | configurations | by TP | max P(beats) |",
            "|---|---|---|---|",
            *[
                f"| {g.reason} | {g.count} | "
                + ", ".join(f"{tp}: {n}" for tp, n in g.by_tp.items())
                + f" | {'' if g.max_p_beat is None else f'{g.max_p_beat:.1%}'} |"
                for g in report.untried
            ],
            "",
        ]
        for g in report.untried:
            shown = ", ".join(c.config for c in g.configs[:12])
            more = f" and {g.count - 12} more" if g.count > 12 else ""
            lines.append(f"- {g.kind}: {shown}{more}")
        lines.append("")
    if skipped:
        lines += [
            f"## Ruled out without GPU time ({len(skipped)})",
            "",
            "| config | reason |",
            "|---|---|",
            *[f"| {_cfg(t)} | {(t.reason or '').replace('|', '/')} |" for t in skipped],
            "",
        ]
    if report.excluded:
        lines += [
            "## Excluded from the space",
            "",
            *[f"- `{e.field}={e.value}`: {e.reason}" for e in report.excluded],
            "",
        ]
    return "\n".join(lines)
