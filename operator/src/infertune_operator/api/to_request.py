"""InferenceDeployment spec -> the tuner's TuningRequest (the only bridge between the two)."""

from __future__ import annotations

from infertune_operator.api.models import InferenceDeployment, PercentileBound
from infertune_tuner.request import (
    Architecture,
    GpuRef,
    ModelRef,
    SearchSpace,
    SloBound,
    TuningOptions,
    TuningRequest,
    WorkloadSpec,
)


def _bounds(metric: str, bound: PercentileBound | None) -> list[SloBound]:
    if bound is None:
        return []
    return [SloBound(metric=metric, percentile=p, max_ms=v) for p, v in bound.bounds().items()]


def to_request(
    obj: InferenceDeployment,
    *,
    default_backend: str = "triton",
    default_max_trials: int = 40,
    default_storage: str | None = None,
) -> TuningRequest:
    s = obj.spec
    arch = s.model.architecture
    return TuningRequest(
        name=obj.metadata.name,
        namespace=obj.metadata.namespace,
        model=ModelRef(
            name=s.model.name,
            uri=s.model.source.uri if s.model.source else None,
            checkpoints=dict(s.model.checkpoints),
            architecture=Architecture(**arch.model_dump(exclude_none=True)) if arch else None,
        ),
        gpu=GpuRef(product=s.gpu.product, max_gpus_per_replica=s.gpu.max_gpus_per_replica),
        workload=WorkloadSpec(**s.workload.model_dump()),
        slo=[
            *_bounds("ttft_ms", s.slo.ttft_ms),
            *_bounds("itl_ms", s.slo.itl_ms),
            *_bounds("e2e_ms", s.slo.e2e_latency_ms),
        ],
        min_output_tokens_per_s_per_gpu=s.slo.min_output_tokens_per_second_per_gpu,
        search=SearchSpace(
            tensor_parallel=list(s.search.tensor_parallel),
            max_batch_size=list(s.search.max_batch_size),
            quantization=list(s.search.quantization),
            kv_cache_dtype=list(s.search.kv_cache_dtype),
            max_accuracy_loss_percent=s.search.max_accuracy_loss_percent,
        ),
        tuning=TuningOptions(
            max_trials=s.tuning.effective_max_trials(default_max_trials),
            seed=s.tuning.seed,
            sampler=s.tuning.sampler,
            backend=s.tuning.effective_backend(default_backend),
            parallelism=s.tuning.parallelism,
            timeout_minutes=s.tuning.timeout_minutes,
            storage=s.tuning.storage or default_storage,
        ),
    )
