"""InferenceDeployment spec -> the tuner's TuningRequest (the only bridge between the two)."""

from __future__ import annotations

from infertune_operator.api.types import InferenceDeployment
from infertune_tuner import defaults
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.request import (
    GpuPool,
    GpuRef,
    ModelRef,
    ModelShape,
    SearchValues,
    SloBound,
    TuningOptions,
    TuningRequest,
    WorkloadShape,
)


def to_request(
    obj: InferenceDeployment,
    *,
    default_backend: str = defaults.CLUSTER_BACKEND,
    default_max_trials: int = defaults.MAX_TRIALS,
    default_storage: str | None = None,
) -> TuningRequest:
    """The request for a validated InferenceDeployment; the defaults fill unset spec.tuning
    fields (the operator passes its settings, `infertune tune` its local backend)."""
    s = obj.spec
    arch = s.model.architecture
    slo = [
        SloBound(metric=metric.key, percentile=p, max_ms=v)
        for metric in LATENCY_METRICS
        if (bound := s.slo.bound(metric)) is not None
        for p, v in bound.bounds().items()
    ]
    return TuningRequest(
        name=obj.metadata.name,
        namespace=obj.metadata.namespace,
        model=ModelRef(
            name=s.model.name,
            uri=s.model.source.uri if s.model.source else None,
            checkpoints=dict(s.model.checkpoints),
            architecture=ModelShape(**arch.model_dump(exclude_none=True)) if arch else None,
        ),
        gpu=GpuRef(
            product=s.gpu.products[0],
            max_gpus_per_replica=s.gpu.max_gpus_per_replica,
            # One pool in gpu.pools is gpu.product: same request, same study.
            pools=[
                GpuPool(
                    product=p.product,
                    price_per_gpu_hour=p.price_per_gpu_hour,
                    max_gpus_per_replica=p.max_gpus_per_replica,
                )
                for p in s.gpu.pools or []
            ]
            if len(s.gpu.products) > 1
            else [],
        ),
        workload=WorkloadShape(**s.workload.model_dump()),
        slo=slo,
        min_output_tokens_per_s_per_gpu=s.slo.min_output_tokens_per_second_per_gpu,
        search=SearchValues(
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
            confidence=s.tuning.confidence,
            backend=s.tuning.effective_backend(default_backend),
            parallelism=s.tuning.parallelism,
            timeout_minutes=s.tuning.timeout_minutes,
            storage=s.tuning.storage or default_storage,
            startup_timeout_minutes=s.serving.startup_timeout_minutes,
        ),
    )
