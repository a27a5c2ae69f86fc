"""What `infertune report NAME` shows after deploy (pure): the InferenceDeployment's status, the
verification and the observed workload beside the tuned numbers (the tuner's ``Deployed``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from infertune_operator.api.types import BestMetrics, ObservedWorkload, VerificationStatus
from infertune_operator.policy import conditions
from infertune_tuner.metrics import E2E, ITL, LATENCY_METRICS, OBJECTIVE, PERCENTILES, TTFT
from infertune_tuner.report.deployed import Deployed, DeployedRow


def _model(cls: Any, raw: Any) -> Any:
    try:
        return cls.model_validate(raw) if raw else None
    except ValidationError:
        return None


def deployed_view(body: Mapping[str, Any]) -> Deployed | None:
    """None while nothing is deployed (no bestConfig)."""
    status = body.get("status") or {}
    best = status.get("bestConfig")
    if not best:
        return None
    tuned: BestMetrics | None = _model(BestMetrics, status.get("bestMetrics"))
    v: VerificationStatus | None = _model(VerificationStatus, status.get("verification"))
    o: ObservedWorkload | None = _model(ObservedWorkload, status.get("observedWorkload"))
    measured = v.measured if v is not None else None
    spec_workload = (body.get("spec") or {}).get("workload") or {}
    inp = (v.input_tokens if v else None) or (o.tuned_input_tokens if o else None)
    out = (v.output_tokens if v else None) or (o.tuned_output_tokens if o else None)
    inp = inp or spec_workload.get("inputTokens")
    out = out or spec_workload.get("outputTokens")
    batch = best.get("maxBatchSize")
    config = (
        f"tp{best.get('tp')}/bs{batch}/{best.get('quantization')}/kv-{best.get('kvCacheDtype')}"
    )
    tps = OBJECTIVE.status_field

    def get(m: BestMetrics | None, field: str) -> float | None:
        value = getattr(m, field, None) if m is not None else None
        return float(value) if value is not None else None

    rows = [
        DeployedRow(
            quantity=f"{OBJECTIVE.label}", tuned=get(tuned, tps), verified=get(measured, tps)
        ),
        DeployedRow(
            quantity="input tokens (mean)",
            tuned=inp,
            verified=v.input_tokens if v else None,
            observed=o.input_tokens_mean if o else None,
        ),
        DeployedRow(
            quantity="output tokens (mean)",
            tuned=out,
            verified=v.output_tokens if v else None,
            observed=o.output_tokens_mean if o else None,
        ),
        DeployedRow(
            quantity="requests in flight per replica",
            tuned=batch,
            verified=v.concurrency if v else None,
            observed=o.concurrency if o else None,
        ),
        DeployedRow(quantity="requests/s", observed=o.requests_per_second if o else None),
    ]
    live: dict[tuple[str, str], float | None] = {
        (TTFT.key, p): getattr(o, TTFT.column(p), None) for p in PERCENTILES
    }
    live[(E2E.key, "p50")] = o.e2e_mean_ms if o else None
    live[(ITL.key, "p50")] = o.itl_mean_ms if o else None
    for metric in LATENCY_METRICS:
        for p in PERCENTILES:
            field = metric.column(p)
            mean = metric is not TTFT and p == "p50"
            rows.append(DeployedRow(
                quantity=f"{metric.label} {p} (ms)" + (" (observed: mean)" if mean else ""),
                tuned=get(tuned, field), verified=get(measured, field),
                observed=live.get((metric.key, p)),
            ))  # fmt: skip
    notes = []
    for c in status.get("conditions") or []:
        if c.get("type") in (conditions.VERIFIED, conditions.WORKLOAD_DRIFTED,
                             conditions.SLO_AT_RISK):  # fmt: skip
            notes.append(f"{c['type']}={c.get('status')} ({c.get('reason')}): {c.get('message')}")
    retune = status.get("retune") or {}
    if retune:
        notes.append(f"retune {retune.get('hash')}: {retune.get('state')}: {retune.get('message')}")
    if o is not None and o.not_exposed:
        notes.append("not exposed by the serving pods' metrics: " + ", ".join(o.not_exposed))
    source = v.config if v else config
    tuned_for = f"{inp} in / {out} out, concurrency {batch}"
    return Deployed(config=source, tuned_for=tuned_for, rows=rows, notes=notes)
