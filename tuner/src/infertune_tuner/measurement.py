"""What one benchmark trial measured (or why it could not)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from infertune_tuner.metrics import latency_metric
from infertune_tuner.perfmodel.latency import Percentiles

# invalid: it ran, but what it measured cannot be true (search/evidence.py, judge): not evidence.
TrialStatus = Literal["ok", "oom", "error", "invalid"]
CAPPED_SHARE = 0.98  # a peak below this share of the max batch: some requests waited for KV room
MAX_TURN_REQUESTS = 1024  # several turns of a large batch: enough for a stable steady state
MAX_REQUESTS_PER_TRIAL = 2048
# A tail percentile is only as good as the requests beyond it: keep at least this many.
SAMPLES_BEYOND_PERCENTILE = 20
_QUANTILE = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def trial_requests(max_batch_size: int, percentiles: Iterable[str] = ()) -> int:
    """Requests one trial measures: several full turns of the batch (4 x max batch, at least
    64, at most MAX_TURN_REQUESTS), and enough for the highest bounded percentile to rest on
    SAMPLES_BEYOND_PERCENTILE requests beyond it (a p99 bound: 2000), at most
    MAX_REQUESTS_PER_TRIAL."""
    need = min(max(4 * max_batch_size, 64), MAX_TURN_REQUESTS)
    for p in percentiles:
        need = max(need, math.ceil(SAMPLES_BEYOND_PERCENTILE / (1 - _QUANTILE[p]) - 1e-9))
    return min(need, MAX_REQUESTS_PER_TRIAL)


# The phases of a real trial, in order (progress reports; a simulated trial has none).
TrialPhase = Literal[
    "downloading weights", "starting server", "loading model", "warm-up", "measuring"
]


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
    # The most requests seen decoding at once. Below the max batch when the KV cache could not
    # hold max-batch sequences and the server queued the rest (None: not observed).
    concurrency: float | None = None
    # Output tokens per completed request, on average (None: not observed; the simulated pools
    # always produce the requested length).
    output_tokens_mean: float | None = None
    # The phase a failed trial died in (None: not known, or it did not fail). Part of the
    # failure's signature (signatures.py): a load that timed out is not a kernel that is missing.
    phase: TrialPhase | None = None

    def capped(self, max_batch_size: int) -> bool:
        """Whether the server ran fewer sequences at once than the max batch (KV-limited)."""
        return (
            self.status == "ok"
            and self.concurrency is not None
            and self.concurrency < CAPPED_SHARE * max_batch_size
        )

    @classmethod
    def failed(
        cls, status: TrialStatus, reason: str, phase: TrialPhase | None = None
    ) -> Measurement:
        return cls(status=status, reason=reason, phase=phase)

    def invalid(self, reason: str) -> Measurement:
        """This measurement, kept as recorded but marked invalid for `reason`."""
        return replace(self, status="invalid", reason=reason)

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
        concurrency: float | None = None,
        output_tokens_mean: float | None = None,
    ) -> Measurement:
        """A successful trial from each registered latency metric's percentiles (by key)."""
        for key in latency:
            latency_metric(key)  # ValueError for a metric the registry does not know
        fields: dict[str, Any] = dict(latency)
        return cls(
            status="ok", **fields, output_tokens_per_s_per_gpu=output_tokens_per_s_per_gpu,
            requests=requests, errors=errors, reason=reason, duration_s=duration_s,
            concurrency=concurrency, output_tokens_mean=output_tokens_mean,
        )  # fmt: skip

    def percentiles(self, metric: str) -> Percentiles | None:
        """The measured distribution of a registered latency metric (by key)."""
        value = latency_metric(metric).of(self)
        return value if isinstance(value, Percentiles) else None
