"""TuningRequest: everything the tuner needs, with no trace of Kubernetes.

The operator builds it from an InferenceDeployment and hands it to the tuner Job as JSON; the CLI
builds it from a manifest file. snake_case JSON, schema `infertune.request/v1`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from infertune_tuner import defaults
from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.catalog.llms import ModelArch, get_model
from infertune_tuner.config import Workload
from infertune_tuner.metrics import Percentile, latency_metric
from infertune_tuner.schema import Record

Sampler = Literal["auto", "tpe", "random", "grid"]
SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit
# How sure `auto` must be before it stops (defaults.CONFIDENCE says why the range).
Confidence = Annotated[
    float, Field(ge=defaults.CONFIDENCE_RANGE[0], le=defaults.CONFIDENCE_RANGE[1])
]


def _registered(key: str) -> str:
    latency_metric(key)  # ValueError for a metric the registry does not know
    return key


class SloBound(Record):
    """An upper bound on one percentile of one latency metric (``metrics.LATENCY_METRICS``)."""

    metric: Annotated[str, AfterValidator(_registered)]
    percentile: Percentile
    max_ms: Annotated[float, Field(gt=0)]

    def label(self) -> str:
        return f"{latency_metric(self.metric).label} {self.percentile} <= {self.max_ms:g} ms"


class ModelShape(Record):
    """The transformer shape of a model the catalog does not know (or corrects)."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    ffn_size: int
    vocab_size: int
    experts: int = 1
    experts_active: int = 1
    # None: hidden_size / heads. Left out of the JSON when None, so that a request written
    # before the field existed keeps its study name (search.driver.study_name hashes the dump).
    head_dim: Annotated[int, Field(ge=1)] | None = Field(
        default=None, exclude_if=lambda v: v is None
    )


class ModelRef(Record):
    name: str
    uri: str | None = None
    checkpoints: dict[str, str] = Field(default_factory=dict)
    architecture: ModelShape | None = None


class GpuPool(Record):
    """One GPU pool a study may run on (a catalog product) and what its GPU-hour costs."""

    product: str
    price_per_gpu_hour: Annotated[float, Field(gt=0)] | None = None
    # The most GPUs one replica may use on this pool (its nodes' size: a GH200 node has one);
    # None: the request's gpu.max_gpus_per_replica. Left out of the JSON when None.
    max_gpus_per_replica: Annotated[int, Field(ge=1)] | None = Field(
        default=None, exclude_if=lambda v: v is None
    )


class GpuRef(Record):
    """The GPUs to tune on: one product, or several pools (`pools`) the search chooses among by
    cost per output token; `product` is then the first pool's."""

    product: str
    max_gpus_per_replica: int = defaults.MAX_GPUS_PER_REPLICA
    # Left out of the JSON when empty, so that a one-pool request keeps its study name.
    pools: list[GpuPool] = Field(default_factory=list, exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _priced_pools(self) -> GpuRef:
        if not self.pools:
            return self
        products = [p.product for p in self.pools]
        if len(self.pools) < 2:
            raise ValueError("gpu.pools: list two or more pools (one pool is gpu.product)")
        if len(set(products)) != len(products):
            raise ValueError(f"gpu.pools: a product is listed twice ({', '.join(products)})")
        unpriced = [p.product for p in self.pools if p.price_per_gpu_hour is None]
        if unpriced:
            raise ValueError(
                f"gpu.pools: every pool needs its price per GPU-hour to compare them "
                f"(missing for {', '.join(unpriced)})"
            )
        if self.product != products[0]:
            raise ValueError(f"gpu.product must be the first pool's ({products[0]})")
        return self


class WorkloadShape(Record):
    """Request lengths in tokens (the model and the simulated pool use the means)."""

    input_tokens: Annotated[int, Field(ge=1)]
    output_tokens: Annotated[int, Field(ge=1)]
    input_tokens_stddev: int | None = None
    output_tokens_stddev: int | None = None


class SearchValues(Record):
    """The values each dimension may take, as the user listed them (``space.SearchSpace`` is
    what remains once the GPU, the accuracy allowance and the model have had their say)."""

    tensor_parallel: list[int] = Field(default_factory=lambda: list(defaults.TENSOR_PARALLEL))
    max_batch_size: list[int] = Field(default_factory=lambda: list(defaults.MAX_BATCH_SIZE))
    quantization: list[str] = Field(default_factory=lambda: list(defaults.QUANTIZATION))
    kv_cache_dtype: list[str] = Field(default_factory=lambda: list(defaults.KV_CACHE_DTYPE))
    max_accuracy_loss_percent: float = defaults.MAX_ACCURACY_LOSS_PERCENT


class TuningOptions(Record):
    max_trials: Annotated[int, Field(ge=1, le=defaults.MAX_TRIALS_LIMIT)] = defaults.MAX_TRIALS
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    sampler: Sampler = defaults.SAMPLER
    backend: str = defaults.LOCAL_BACKEND
    parallelism: Annotated[int, Field(ge=1)] = defaults.PARALLELISM
    timeout_minutes: int | None = None
    storage: str | None = None
    startup_timeout_minutes: Annotated[int, Field(ge=1)] = defaults.STARTUP_TIMEOUT_MINUTES
    # How sure `auto` must be that no untried configuration beats the best by more than 2 % before
    # it stops (None: defaults.CONFIDENCE). Like max_trials, a stopping rule: not part of the
    # study's identity, so a study tuned to 0.9 resumes towards 0.95 with the trials it has.
    confidence: Confidence | None = None

    @property
    def confidence_target(self) -> float:
        """The confidence `auto` stops at: the request's, else defaults.CONFIDENCE."""
        return self.confidence if self.confidence is not None else defaults.CONFIDENCE


class TuningRequest(Record):
    schema_: Literal["infertune.request/v1"] = Field(default="infertune.request/v1", alias="schema")
    name: str
    namespace: str | None = None
    model: ModelRef
    gpu: GpuRef
    workload: WorkloadShape
    slo: list[SloBound] = Field(min_length=1)
    min_output_tokens_per_s_per_gpu: float | None = None
    search: SearchValues = Field(default_factory=SearchValues)
    tuning: TuningOptions = Field(default_factory=TuningOptions)

    model_config = ConfigDict(populate_by_name=True)

    def resolve_model(self) -> ModelArch:
        if self.model.architecture is not None:
            a = self.model.architecture
            return ModelArch(
                key=self.model.name, layers=a.layers, hidden_size=a.hidden_size, heads=a.heads,
                kv_heads=a.kv_heads, ffn_size=a.ffn_size, vocab_size=a.vocab_size,
                experts=a.experts, experts_active=a.experts_active, head_dim=a.head_dim or 0,
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
