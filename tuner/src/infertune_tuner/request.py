"""TuningRequest: everything the tuner needs, with no trace of Kubernetes.

The operator builds it from an InferenceDeployment and hands it to the tuner Job as JSON; the CLI
builds it from a manifest file. snake_case JSON, schema `infertune.request/v1`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.catalog.models import ModelArch, get_model
from infertune_tuner.config import Workload

Metric = Literal["ttft_ms", "itl_ms", "e2e_ms"]
PercentileName = Literal["p50", "p95", "p99"]
METRIC_LABELS = {"ttft_ms": "TTFT", "itl_ms": "ITL", "e2e_ms": "E2E"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloBound(_Model):
    metric: Metric
    percentile: PercentileName
    max_ms: Annotated[float, Field(gt=0)]

    def label(self) -> str:
        return f"{METRIC_LABELS[self.metric]} {self.percentile} <= {self.max_ms:g} ms"


class Architecture(_Model):
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    ffn_size: int
    vocab_size: int
    experts: int = 1
    experts_active: int = 1


class ModelRef(_Model):
    name: str
    uri: str | None = None
    checkpoints: dict[str, str] = Field(default_factory=dict)
    architecture: Architecture | None = None


class GpuRef(_Model):
    product: str
    max_gpus_per_replica: int = 8


class WorkloadSpec(_Model):
    input_tokens: Annotated[int, Field(ge=1)]
    output_tokens: Annotated[int, Field(ge=1)]
    input_tokens_stddev: int | None = None
    output_tokens_stddev: int | None = None


class SearchSpace(_Model):
    tensor_parallel: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    max_batch_size: list[int] = Field(default_factory=lambda: [1, 4, 8, 16, 32, 64, 128, 256])
    quantization: list[str] = Field(
        default_factory=lambda: ["bf16", "fp8", "w4a16_awq", "w4a8_awq", "nvfp4"]
    )
    kv_cache_dtype: list[str] = Field(default_factory=lambda: ["auto", "fp8"])
    max_accuracy_loss_percent: float = 1.0


Sampler = Literal["auto", "tpe", "random", "grid"]


class TuningOptions(_Model):
    max_trials: Annotated[int, Field(ge=1)] = 40
    seed: int | None = None
    sampler: Sampler = "auto"
    backend: str = "simulated"
    parallelism: Annotated[int, Field(ge=1)] = 1
    timeout_minutes: int | None = None
    storage: str | None = None


class TuningRequest(_Model):
    schema_: Literal["infertune.request/v1"] = Field(default="infertune.request/v1", alias="schema")
    name: str
    namespace: str | None = None
    model: ModelRef
    gpu: GpuRef
    workload: WorkloadSpec
    slo: list[SloBound] = Field(min_length=1)
    min_output_tokens_per_s_per_gpu: float | None = None
    search: SearchSpace = Field(default_factory=SearchSpace)
    tuning: TuningOptions = Field(default_factory=TuningOptions)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def resolve_model(self) -> ModelArch:
        if self.model.architecture is not None:
            a = self.model.architecture
            return ModelArch(
                key=self.model.name, layers=a.layers, hidden_size=a.hidden_size, heads=a.heads,
                kv_heads=a.kv_heads, ffn_size=a.ffn_size, vocab_size=a.vocab_size,
                experts=a.experts, experts_active=a.experts_active,
            )  # fmt: skip
        return get_model(self.model.name)

    def resolve_gpu(self) -> Gpu:
        return get_gpu(self.gpu.product)

    @property
    def work(self) -> Workload:
        return Workload(self.workload.input_tokens, self.workload.output_tokens)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")
