"""The InferenceDeployment's .status: what the operator writes (phase, conditions, the best
configuration and its metrics)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict

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

    @classmethod
    def of(cls, config: TrialConfig) -> BestConfig:
        return cls(**config.as_dict())

    def to_config(self) -> TrialConfig:
        return TrialConfig(self.tp, self.max_batch_size, self.quantization, self.kv_cache_dtype)


# One field per percentile of each latency metric of the registry (ttftP50Ms ... e2eP99Ms).
@with_fields({
    m.column(p): (float | None, None) for m in LATENCY_METRICS for p in PERCENTILES
})  # fmt: skip
class BestMetrics(ApiModel):
    """The best configuration's measured latencies and tok/s/GPU; whether it met the SLO."""

    output_tokens_per_second_per_gpu: float | None = None
    slo_met: bool | None = None

    @classmethod
    def of(cls, measured: Metrics, *, slo_met: bool) -> BestMetrics:
        """The status view of a report's metrics."""
        fields: dict[str, Any] = {
            m.column(p): measured.latency(m.key, p) for m in LATENCY_METRICS for p in PERCENTILES
        }
        fields[OBJECTIVE.status_field] = OBJECTIVE.of(measured)
        return cls(**fields, slo_met=slo_met)


class TrialCounts(ApiModel):
    """Trials executed on GPUs, of all the configurations the report lists."""

    executed: int = 0
    total: int = 0


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

    def patch(self) -> dict[str, Any]:
        """The JSON merge patch of the fields that were set (None: delete the field)."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")
