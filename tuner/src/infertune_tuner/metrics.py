"""The metrics infertune bounds and maximises: each one entry, everything else iterates them.

A latency metric (TTFT, ITL, E2E) is one :class:`LatencyMetric`: its key (the field name on
``Measurement``, ``Prediction``, the load generator's ``BenchResult``, the report's metrics and a
``SloBound.metric``), its label, its ``spec.slo`` field of the InferenceDeployment (camelCase on
the wire), the prefix of its status fields and replay columns (``ttftP95Ms``, ``ttft_p95_ms``),
its unit. The request and API models, replay tables, study attributes, report columns, status
fields and relax hints are built from :data:`LATENCY_METRICS`; values are read with
:meth:`LatencyMetric.of`, never by spelling a metric's name.

Adding a latency metric (say TPOT) = an entry here + its measurement (a ``Measurement`` field and
where the harness computes it) + its prediction (a ``Prediction`` field and its formula); the
CRD is regenerated with ``infertune crd``. See docs/architecture.md.

The objective, output tokens/s per GPU, is :data:`OBJECTIVE`: maximised, and optionally floored
by ``spec.slo.minOutputTokensPerSecondPerGpu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from infertune_tuner.schema import to_camel

Percentile = Literal["p50", "p95", "p99"]
PERCENTILES: tuple[Percentile, ...] = ("p50", "p95", "p99")


@dataclass(frozen=True)
class LatencyMetric:
    """A latency distribution the SLO can bound at p50/p95/p99 (upper bounds)."""

    key: str  # "ttft_ms": field name on measurements, predictions, reports; SloBound.metric
    label: str  # "TTFT": tables, SLO labels, violations
    slo_field: str  # spec.slo field of the InferenceDeployment, snake_case ("e2e_latency_ms")
    prefix: str  # status fields (ttftP95Ms) and replay columns (ttft_p95_ms)
    description: str  # the CRD's description of the spec.slo field
    decimals: int = 0  # how many decimals tables show
    unit: str = "ms"
    # How this metric's log-error moves with the tok/s/GPU log-error under the tuner's
    # closed-loop load (Little's law; docs/tuning.md has the evidence): -1 for E2E and ITL,
    # 0 for TTFT (admission, not throughput, decides it).
    throughput_tie: float = 0.0

    @property
    def wire(self) -> str:
        """The spec.slo field as users write it: ``ttftMs``."""
        return to_camel(self.slo_field)

    def column(self, percentile: str) -> str:
        """Replay column and status field (snake_case) of one percentile: ``ttft_p95_ms``."""
        return f"{self.prefix}_{percentile}_{self.unit}"

    def of(self, holder: object) -> Any:
        """This metric's value on a measurement, prediction, benchmark result or report row."""
        return getattr(holder, self.key)

    def format(self, value: float) -> str:
        return f"{value:.{self.decimals}f}"


@dataclass(frozen=True)
class ThroughputMetric:
    """The objective: maximised; ``spec.slo`` may also put a floor under it."""

    key: str
    label: str
    slo_field: str  # the floor in spec.slo
    status_field: str  # status.bestMetrics field (snake_case)
    unit: str

    @property
    def wire(self) -> str:
        return to_camel(self.slo_field)

    def of(self, holder: object) -> Any:
        return getattr(holder, self.key)


TTFT = LatencyMetric("ttft_ms", "TTFT", "ttft_ms", "ttft", "Time to first token.")
# GenAI-Perf's inter-token latency, per request: percentiles over requests, not over pooled
# token gaps (the harness reports those separately as `token_gap_ms`).
ITL = LatencyMetric(
    "itl_ms", "ITL", "itl_ms", "itl",
    "Inter-token latency per request, (E2E - TTFT) / (output tokens - 1), as GenAI-Perf "
    "defines it; percentiles over requests.",
    decimals=1, throughput_tie=-1.0,
)  # fmt: skip
E2E = LatencyMetric(
    "e2e_ms", "E2E", "e2e_latency_ms", "e2e", "Request latency, send to last token.",
    throughput_tie=-1.0,
)  # fmt: skip
LATENCY_METRICS: tuple[LatencyMetric, ...] = (TTFT, ITL, E2E)

OBJECTIVE = ThroughputMetric(
    key="output_tokens_per_s_per_gpu",
    label="tok/s/GPU",
    slo_field="min_output_tokens_per_second_per_gpu",
    status_field="output_tokens_per_second_per_gpu",
    unit="tok/s/GPU",
)

_BY_KEY = {m.key: m for m in LATENCY_METRICS}


def latency_metric(key: str) -> LatencyMetric:
    """The registered latency metric with this key (ValueError names the known ones)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown metric {key!r}; known: {', '.join(_BY_KEY)}") from None


def listing(words: list[str]) -> str:
    """``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
