"""What one benchmark trial measured (or why it could not)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from infertune_tuner.metrics import latency_metric
from infertune_tuner.perfmodel.latency import Percentiles

TrialStatus = Literal["ok", "oom", "error"]
# The phases of a real trial, in order (progress reports; a simulated trial has none).
TrialPhase = Literal["starting server", "loading model", "warm-up", "measuring"]


@dataclass(frozen=True)
class Measurement:
    """One trial's outcome; an ``ok`` one has every metric of ``metrics.LATENCY_METRICS``."""

    status: TrialStatus
    ttft_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    e2e_ms: Percentiles | None = None
    output_tokens_per_s_per_gpu: float | None = None
    requests: int = 0
    errors: int = 0
    reason: str | None = None  # why it failed: OOM message, log tail, "not in table"
    duration_s: float = 0.0

    @classmethod
    def failed(cls, status: TrialStatus, reason: str) -> Measurement:
        return cls(status=status, reason=reason)

    @classmethod
    def ok(
        cls,
        latency: Mapping[str, Percentiles | None],
        *,
        output_tokens_per_s_per_gpu: float,
        requests: int = 0,
        errors: int = 0,
        reason: str | None = None,
        duration_s: float = 0.0,
    ) -> Measurement:
        """A successful trial from each registered latency metric's percentiles (by key)."""
        for key in latency:
            latency_metric(key)  # ValueError for a metric the registry does not know
        fields: dict[str, Any] = dict(latency)
        return cls(
            status="ok", **fields, output_tokens_per_s_per_gpu=output_tokens_per_s_per_gpu,
            requests=requests, errors=errors, reason=reason, duration_s=duration_s,
        )  # fmt: skip

    def percentiles(self, metric: str) -> Percentiles | None:
        """The measured distribution of a registered latency metric (by key)."""
        value = latency_metric(metric).of(self)
        return value if isinstance(value, Percentiles) else None
