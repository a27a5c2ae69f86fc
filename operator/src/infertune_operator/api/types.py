"""The InferenceDeployment API (infertune.io/v1alpha1): the single source of truth.

Everything else derives from these models: the CRD in ``crds/`` is generated from them
(``infertune crd``), ``infertune validate`` checks manifests with them, the operator reads custom
resources through them and the tuner request is built from them.

YAML uses camelCase (``inputTokens``); Python uses snake_case (``input_tokens``). The SLO
fields and the status metrics come from the tuner's metric registry (``infertune_tuner.metrics``),
the enums and defaults from the tuner's ``config`` and ``defaults``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from infertune_operator.api.base import ApiModel
from infertune_operator.api.formats import (
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    NAME_RULE,
    NAMESPACE_PATTERN,
    NAMESPACE_RULE,
    label,
)

# spec.serving lives in api/serving.py; re-exported here, the API's one import point.
from infertune_operator.api.serving import ObserveSpec as ObserveSpec
from infertune_operator.api.serving import ResourceOverrides as ResourceOverrides
from infertune_operator.api.serving import ServingSpec
from infertune_operator.api.serving import VerificationSpec as VerificationSpec

# The status models live in api/status.py; re-exported here, the API's one import point.
from infertune_operator.api.status import BestConfig as BestConfig
from infertune_operator.api.status import BestMetrics as BestMetrics
from infertune_operator.api.status import Condition as Condition
from infertune_operator.api.status import InferenceDeploymentStatus
from infertune_operator.api.status import ObservedWorkload as ObservedWorkload
from infertune_operator.api.status import Phase as Phase
from infertune_operator.api.status import RetuneStatus as RetuneStatus
from infertune_operator.api.status import TrialCounts as TrialCounts
from infertune_operator.api.status import VerificationStatus as VerificationStatus
from infertune_tuner import defaults
from infertune_tuner.config import MAX_BATCH_SIZE_LIMIT, KvCacheDtype, Quantization
from infertune_tuner.metrics import LATENCY_METRICS, LatencyMetric, listing
from infertune_tuner.request import SEED_MAX, Confidence, Sampler
from infertune_tuner.runtime.weights import URI_PATTERN, pvc_claims, uri_problem
from infertune_tuner.schema import to_camel, with_fields

GROUP = "infertune.io"
VERSION = "v1alpha1"
KIND = "InferenceDeployment"
PLURAL = "inferencedeployments"
SINGULAR = "inferencedeployment"
SHORT_NAMES = ["infd"]
API_VERSION = f"{GROUP}/{VERSION}"


def _not_bool(value: object) -> object:
    # Literal[1, ...] alone takes True (True == 1); the API server's integer type does not.
    if isinstance(value, bool):
        raise ValueError("Input should be a valid integer, not a boolean")
    return value


TensorParallel = Annotated[Literal[1, 2, 4, 8, 16, 32, 64], BeforeValidator(_not_bool)]
Backend = Literal["triton", "simulated"]  # where an InferenceDeployment's trials run

PositiveInt = Annotated[int, Field(ge=1)]
Retune = Literal["Never", "OnDrift"]
# A retune costs a tuning's GPU hours: at most one per 6 h, whatever the workload does.
DEFAULT_RETUNE_INTERVAL_MINUTES = 360
# spec.tuning fields that decide when to tune again, not what a tuning asks: outside the hash.
RETUNE_FIELDS = ("retune", "retuneIntervalMinutes")


# ---------------------------------------------------------------- spec.model


class SecretKeyRef(ApiModel):
    """A key of a Secret in the InferenceDeployment's namespace."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The Secret's name.",
    )  # fmt: skip
    key: str = Field(
        default="HF_TOKEN", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key holding the token (default HF_TOKEN).",
    )  # fmt: skip


class StorageSecretRef(SecretKeyRef):
    key: str = Field(
        default="url", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key holding the storage URL (default url).",
    )  # fmt: skip


def _loadable(uri: str) -> str:
    """A weights URI the serving runtime can open (runtime/weights.py decides)."""
    if (problem := uri_problem(uri)) is not None:
        raise ValueError(problem)
    return uri


WeightsUri = Annotated[
    str,
    Field(
        min_length=1,
        pattern=URI_PATTERN,
        description="Where the weights live: pvc://claim/path (mounted read-only), "
        "hf://org/name or org/name (downloaded into the model cache), file:///path. Object "
        "stores (s3://, gs://) are not loadable by the runtime: copy the weights to a volume.",
    ),
    BeforeValidator(
        _loadable
    ),  # after Field: runs first (its message), the pattern stays in the CRD
]


class ModelSource(ApiModel):
    uri: WeightsUri
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="A Hugging Face token for gated models: passed as HF_TOKEN to the tuner and "
        "serving pods from this Secret; never copied into the request, the report or the status.",
    )


class ArchitectureOverride(ApiModel):
    """Transformer shape for a model that is not in the catalog (or to correct it)."""

    layers: PositiveInt
    hidden_size: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    ffn_size: PositiveInt
    vocab_size: PositiveInt
    experts: PositiveInt | None = Field(default=None, description="MoE experts per layer.")
    experts_active: PositiveInt | None = Field(
        default=None, description="MoE experts active per token."
    )
    head_dim: PositiveInt | None = Field(
        default=None,
        description="Width of one attention head, config.json's head_dim (default hiddenSize / "
        "heads; Qwen3-32B: 128 with hiddenSize 5120 and 64 heads).",
    )

    @model_validator(mode="after")
    def _heads_group(self) -> ArchitectureOverride:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kvHeads ({self.kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.heads:
            raise ValueError(
                f"hiddenSize ({self.hidden_size}) must be a multiple of heads ({self.heads}), "
                "or give headDim"
            )
        if (self.experts_active or 1) > (self.experts or 1):
            raise ValueError(
                f"expertsActive ({self.experts_active}) must not exceed experts ({self.experts or 1})"
            )
        return self


class ModelSpec(ApiModel):
    name: str = Field(
        min_length=1,
        description="Catalog key (llama-2-70b, see `infertune models`) or a Hugging Face id mapping to one.",
    )
    source: ModelSource | None = None
    checkpoints: dict[Quantization, WeightsUri] = Field(
        default_factory=dict,
        max_length=6,
        description="Quantization -> URI of a pre-quantized (ModelOpt) checkpoint.",
    )
    architecture: ArchitectureOverride | None = None

    @model_validator(mode="after")
    def _one_claim(self) -> ModelSpec:
        # A pod mounts one PVC for the weights (read-only at /models): pvc:// URIs must share it.
        uris = [self.source.uri] if self.source is not None else []
        uris += list(self.checkpoints.values())
        claims = pvc_claims(uris)
        if len(claims) > 1:
            raise ValueError(
                f"every pvc:// URI (source.uri, checkpoints) must name the same claim, not "
                f"{', '.join(claims)}: a pod mounts one claim for the weights"
            )
        return self


# ---------------------------------------------------------------- spec.gpu


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


# A tuner Job per pool, named <name>-tune<i>-<hash>: one digit keeps it within the job-name
# label's 63 characters (naming.pool_job_name).
MAX_POOLS = 8


class GpuPoolSpec(ApiModel):
    """One GPU pool the tuning may choose: its product, what its GPU-hour costs, and how its
    nodes are selected (its tuner Job and, if it wins, the serving pods land there)."""

    product: str = Field(
        min_length=1, description="GPU catalog key such as H100-SXM-80GB (see `infertune gpus`)."
    )
    price_per_gpu_hour: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="What one GPU of this pool costs per hour, in any currency (the same for "
        "every pool): the tuning deploys on the pool that serves a million output tokens for "
        "the least. Required with two or more pools.",
    )
    max_gpus_per_replica: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None,
        description="The most GPUs one replica may use on this pool (its nodes' size; a GH200 "
        "node has one). Default: gpu.maxGpusPerReplica.",
    )
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None


class GpuSpec(ApiModel):
    product: str | None = Field(
        default=None, min_length=1,
        description="GPU catalog key such as H100-SXM-80GB (see `infertune gpus`); or give "
        "`pools` to let the tuning choose the cheapest per output token.",
    )  # fmt: skip
    pools: list[GpuPoolSpec] | None = Field(
        default=None, min_length=1, max_length=MAX_POOLS,
        description="GPU pools to tune across, each with its price per GPU-hour: the tuning "
        "deploys on the one that serves a million output tokens for the least within the SLO.",
    )  # fmt: skip
    max_gpus_per_replica: Annotated[int, Field(ge=1, le=64)] = defaults.MAX_GPUS_PER_REPLICA
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None

    @model_validator(mode="after")
    def _one_way(self) -> GpuSpec:
        if (self.product is None) == (self.pools is None):
            raise ValueError("give gpu.product (one pool) or gpu.pools (several), not both")
        if self.pools is None:
            return self
        if self.node_selector or self.tolerations:
            raise ValueError(
                "with gpu.pools, give nodeSelector and tolerations per pool (gpu.pools[].nodeSelector)"
            )
        _unique([p.product for p in self.pools], "gpu.pools[].product")
        unpriced = [p.product for p in self.pools if p.price_per_gpu_hour is None]
        if len(self.pools) > 1 and unpriced:
            raise ValueError(
                "gpu.pools: every pool needs pricePerGpuHour to compare cost per token "
                f"(missing for {', '.join(unpriced)})"
            )
        return self

    @property
    def products(self) -> list[str]:
        """The product of every pool (one for gpu.product)."""
        return [p.product for p in self.pools] if self.pools else [self.product or ""]

    def pool(self, product: str | None = None) -> GpuPoolSpec:
        """The pool of `product` (None: the first), gpu.product's as a pool of its own."""
        if not self.pools:
            return GpuPoolSpec(
                product=self.product or "", node_selector=self.node_selector,
                tolerations=self.tolerations,
            )  # fmt: skip
        return next((p for p in self.pools if p.product == product), self.pools[0])


# ---------------------------------------------------------------- spec.workload


class WorkloadSpec(ApiModel):
    input_tokens: PositiveInt = Field(description="Prompt length in tokens (ISL).")
    output_tokens: PositiveInt = Field(description="Generated tokens per request (OSL).")
    input_tokens_stddev: Annotated[int, Field(ge=0)] | None = None
    output_tokens_stddev: Annotated[int, Field(ge=0)] | None = None


# ---------------------------------------------------------------- spec.slo

PositiveMs = Annotated[float, Field(gt=0)]


class PercentileBound(ApiModel):
    """Upper bounds in milliseconds; at least one percentile."""

    p50: PositiveMs | None = None
    p95: PositiveMs | None = None
    p99: PositiveMs | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> PercentileBound:
        if self.p50 is None and self.p95 is None and self.p99 is None:
            raise ValueError("give at least one of p50, p95, p99")
        return self

    def bounds(self) -> dict[str, float]:
        return {p: v for p, v in (("p50", self.p50), ("p95", self.p95), ("p99", self.p99)) if v}


ONE_LATENCY_BOUND = "give at least one latency bound: " + listing([m.wire for m in LATENCY_METRICS])


# One field per latency metric of the registry (ttftMs, itlMs, e2eLatencyMs).
@with_fields({
    m.slo_field: (PercentileBound | None, Field(default=None, description=m.description))
    for m in LATENCY_METRICS
})  # fmt: skip
class SloSpec(ApiModel):
    """Upper bounds on latency percentiles, and an optional floor under output tokens/s/GPU."""

    min_output_tokens_per_second_per_gpu: Annotated[float, Field(gt=0)] | None = None

    def bound(self, metric: LatencyMetric) -> PercentileBound | None:
        """The bound on one registered latency metric, None when the spec sets none."""
        value: PercentileBound | None = getattr(self, metric.slo_field)
        return value

    @model_validator(mode="after")
    def _one_latency_bound(self) -> SloSpec:
        if all(self.bound(m) is None for m in LATENCY_METRICS):
            raise ValueError(ONE_LATENCY_BOUND)
        return self


# ---------------------------------------------------------------- spec.search


def _unique(values: list[object], field: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{field}: {v!r} listed twice")
        seen.add(v)


class SearchSpec(ApiModel):
    tensor_parallel: list[TensorParallel] = Field(
        default=list(defaults.TENSOR_PARALLEL), min_length=1, max_length=7
    )
    max_batch_size: list[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE_LIMIT)]] = Field(
        default=list(defaults.MAX_BATCH_SIZE), min_length=1, max_length=64
    )
    quantization: list[Quantization] = Field(
        default=list(defaults.QUANTIZATION), min_length=1, max_length=6
    )
    kv_cache_dtype: list[KvCacheDtype] = Field(
        default=list(defaults.KV_CACHE_DTYPE), min_length=1, max_length=2
    )
    max_accuracy_loss_percent: Annotated[float, Field(ge=0, le=100)] = (
        defaults.MAX_ACCURACY_LOSS_PERCENT
    )


# ---------------------------------------------------------------- spec.tuning


class TuningSpec(ApiModel):
    # maxTrials and backend stay unset in the stored object so an operator-wide default (Helm
    # values, operator settings) can apply; see `effective_*` and infertune_tuner.defaults.
    max_trials: Annotated[int, Field(ge=1, le=defaults.MAX_TRIALS_LIMIT)] | None = Field(
        default=None,
        description=f"Cap on executed trials (default {defaults.MAX_TRIALS}). A cap, not a target.",
    )
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    backend: Backend | None = Field(
        default=None,
        description=f"triton (real GPUs) or simulated (no GPU needed); default "
        f"{defaults.CLUSTER_BACKEND} unless the operator is configured otherwise.",
    )
    sampler: Sampler = defaults.SAMPLER
    confidence: Confidence | None = Field(
        default=None,
        description=f"sampler auto: stop once this sure that no untried configuration beats the "
        f"best by more than 2 % (default {defaults.CONFIDENCE}). Lower: fewer trials and a weaker "
        "claim; raising it later resumes the same study with the trials it has.",
    )
    parallelism: Annotated[int, Field(ge=1, le=64)] = defaults.PARALLELISM
    timeout_minutes: Annotated[int, Field(ge=1)] | None = None
    storage: str | None = Field(
        default=None,
        description="Optuna RDB storage URL (postgresql://...) shared by parallel tuner workers.",
    )
    storage_secret_ref: StorageSecretRef | None = Field(
        default=None,
        description="The storage URL from a Secret (preferred: the URL holds a password); "
        "exclusive with storage. Parallel workers (parallelism > 1) need one of the two, or "
        "the operator's default storage.",
    )
    model_cache_claim: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="A PersistentVolumeClaim for the weights the tuner downloads (mounted at "
        "/model-cache) instead of node-local ephemeral storage: every checkpoint the search "
        "loads must fit (`infertune validate` says how much). Default: the operator's "
        "modelStorage.pvc, else an emptyDir.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_storage(self) -> TuningSpec:
        if self.storage and self.storage_secret_ref is not None:
            raise ValueError("give storage or storageSecretRef, not both")
        return self

    retune: Retune = Field(
        default="Never",
        description="OnDrift: when the observed workload drifts from the tuned one, tune again "
        "with the observed workload and roll the result only if it measurably beats the "
        "serving configuration. Never (default): report the drift only.",
    )
    retune_interval_minutes: Annotated[int, Field(ge=1, le=30 * 24 * 60)] = Field(
        default=DEFAULT_RETUNE_INTERVAL_MINUTES,
        description="At most one retune per this many minutes (default 360).",
    )

    def effective_max_trials(self, default: int = defaults.MAX_TRIALS) -> int:
        return self.max_trials if self.max_trials is not None else default

    def effective_backend(self, default: str = defaults.CLUSTER_BACKEND) -> str:
        return self.backend if self.backend is not None else default


# ---------------------------------------------------------------- spec


class InferenceDeploymentSpec(ApiModel):
    model: ModelSpec
    gpu: GpuSpec
    workload: WorkloadSpec
    slo: SloSpec
    search: SearchSpec = SearchSpec()
    tuning: TuningSpec = TuningSpec()
    serving: ServingSpec = ServingSpec()

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceDeploymentSpec:
        for field in ("tensor_parallel", "max_batch_size", "quantization", "kv_cache_dtype"):
            _unique(list(getattr(self.search, field)), f"search.{to_camel(field)}")
        if min(self.search.tensor_parallel) > self.gpu.max_gpus_per_replica:
            raise ValueError(
                f"every search.tensorParallel value exceeds gpu.maxGpusPerReplica "
                f"({self.gpu.max_gpus_per_replica})"
            )
        return self


class ObjectMeta(ApiModel):
    model_config = ConfigDict(extra="allow")

    name: Annotated[str, label(NAME_PATTERN, NAME_MAX_LENGTH, NAME_RULE)]
    namespace: Annotated[str, label(NAMESPACE_PATTERN, 63, NAMESPACE_RULE)] | None = None


class InferenceDeployment(ApiModel):
    api_version: Literal["infertune.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["InferenceDeployment"]
    metadata: ObjectMeta
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus | None = None
