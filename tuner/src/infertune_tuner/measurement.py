"""What one benchmark trial measured (or why it could not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infertune_tuner.perfmodel.latency import Percentiles

TrialStatus = Literal["ok", "oom", "error"]


@dataclass(frozen=True)
class Measurement:
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

    def percentiles(self, metric: str) -> Percentiles | None:
        value = getattr(self, metric)
        return value if isinstance(value, Percentiles) else None
