"""The InferenceDeployment's .status: what the operator writes (phase, conditions, the best
configuration and its metrics; after rollout its verification, the observed live workload and a
retune)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from infertune_operator.api.base import ApiModel
from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, PERCENTILES
from infertune_tuner.result import Metrics
from infertune_tuner.schema import with_fields

Phase = Literal["Pending", "Tuning", "Deploying", "Ready", "Failed"]


class Condition(ApiModel):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class BestConfig(ApiModel):
    tp: int
    max_batch_size: int
    quantization: str
    kv_cache_dtype: str
    # The GPU pool it serves on, where spec.gpu.pools lists several (None: the one product).
    gpu: str | None = None

    @classmethod
    def of(cls, config: TrialConfig) -> BestConfig:
        return cls(**config.as_dict())

    def to_config(self) -> TrialConfig:
        return TrialConfig(
            self.tp, self.max_batch_size, self.quantization, self.kv_cache_dtype, self.gpu or ""
        )


# One field per percentile of each latency metric of the registry (ttftP50Ms ... e2eP99Ms).
@with_fields({
    m.column(p): (float | None, None) for m in LATENCY_METRICS for p in PERCENTILES
})  # fmt: skip
class BestMetrics(ApiModel):
    """The best configuration's measured latencies and tok/s/GPU; whether it met the SLO."""

    output_tokens_per_second_per_gpu: float | None = None
    slo_met: bool | None = None
    # Where spec.gpu.pools lists several: what a million output tokens cost on the chosen pool
    # (its price per GPU-hour / its tok/s/GPU).
    cost_per_million_output_tokens: float | None = None

    @classmethod
    def of(cls, measured: Metrics, *, slo_met: bool, cost: float | None = None) -> BestMetrics:
        """The status view of a report's metrics (and the chosen pool's cost per token)."""
        fields: dict[str, Any] = {
            m.column(p): measured.latency(m.key, p) for m in LATENCY_METRICS for p in PERCENTILES
        }
        fields[OBJECTIVE.status_field] = OBJECTIVE.of(measured)
        if cost is not None:  # one pool: the status writes what it always did
            fields["cost_per_million_output_tokens"] = cost
        return cls(**fields, slo_met=slo_met)


class TrialCounts(ApiModel):
    """Trials executed on GPUs, of all the configurations the report lists."""

    executed: int = 0
    total: int = 0


VerificationState = Literal["Running", "Passed", "BelowTuned", "SloMissed", "Failed"]
RetuneState = Literal["Running", "RolledOut", "KeptCurrent", "Failed"]


class VerificationStatus(ApiModel):
    """The load test of the rolled-out configuration, beside what its tuning trial measured."""

    state: VerificationState
    hash: str  # of the deployed configuration and what it was verified against (names the Job)
    job: str
    config: str  # the configuration verified (tp1/bs8/fp8/kv-auto)
    input_tokens: int
    output_tokens: int
    concurrency: int
    requests: int | None = None  # completed
    errors: int | None = None
    measured: BestMetrics | None = None
    tuned: BestMetrics | None = None
    shortfall_percent: float | None = None  # how far measured tok/s/GPU is below the tuned
    tolerance_percent: float | None = None  # the shortfall that is still measurement noise
    slo_missed: list[str] = Field(default_factory=list)  # "E2E p95 25812 ms > 20000 ms"
    finished_at: str | None = None
    message: str | None = None


class ObservedWorkload(ApiModel):
    """A rolling summary of what the serving pods see (None: the source does not expose it)."""

    source: str  # "pods 2/2", "prometheus http://..."
    window_seconds: float
    requests_per_second: float | None = None
    concurrency: float | None = None  # requests in flight per replica, mean over the window
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_mean_ms: float | None = None  # Little's law: in flight / request rate
    itl_mean_ms: float | None = None  # (E2E - TTFT) / (output tokens - 1), of the means
    not_exposed: list[str] = Field(default_factory=list)  # what the source did not show
    # What the serving configuration was tuned for (the spec's workload, or a retune's).
    tuned_input_tokens: int | None = None
    tuned_output_tokens: int | None = None
    tuned_concurrency: int | None = None  # the configuration's max batch size
    drifting_since: str | None = None  # first seen outside the thresholds (this drift)
    updated_at: str | None = None


class RetuneWorkload(ApiModel):
    input_tokens: int
    output_tokens: int


class RetuneStatus(ApiModel):
    """The latest retune: tuning again with the observed workload (spec.tuning.retune)."""

    state: RetuneState
    hash: str  # of the tuning it retunes and the observed workload (names its Job)
    tuning_hash: str
    job: str
    workload: RetuneWorkload
    started_at: str
    finished_at: str | None = None
    config: str | None = None  # the configuration the retune found best
    best_config: BestConfig | None = None  # that configuration, once rolled out
    best_metrics: BestMetrics | None = None  # what the retune measured of it
    output_tokens_per_second_per_gpu: float | None = None  # of that configuration
    current_output_tokens_per_second_per_gpu: float | None = None  # the serving one, same study
    margin_percent: float | None = None  # what "beats it by more than the noise" required
    message: str | None = None


class InferenceDeploymentStatus(ApiModel):
    """What the operator writes into .status. Built partially: only the fields a transition sets
    are part of its patch (see :meth:`patch`); a field set to None is removed from the object."""

    model_config = ConfigDict(extra="allow")  # others may keep bookkeeping in status (Kopf did)

    phase: Phase | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
    best_config: BestConfig | None = None
    best_metrics: BestMetrics | None = None
    trials: TrialCounts | None = None
    report_config_map: str | None = None
    endpoint: str | None = None
    message: str | None = None
    tuning_hash: str | None = None
    verification: VerificationStatus | None = None
    observed_workload: ObservedWorkload | None = None
    retune: RetuneStatus | None = None

    def patch(self) -> dict[str, Any]:
        """The JSON merge patch of the fields that were set (None: delete the field)."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


Part = TypeVar("Part", bound=ApiModel)


def status_part(body: Mapping[str, Any], key: str, model: type[Part]) -> Part | None:
    """`status.<key>` of an object as `model`, or None when it is absent or not valid (written
    by an older operator, or edited by hand: the operator then decides afresh)."""
    raw = (body.get("status") or {}).get(key)
    try:
        return model.model_validate(raw) if raw else None
    except ValidationError:
        return None
