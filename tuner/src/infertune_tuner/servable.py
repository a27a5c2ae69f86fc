"""Can one configuration be served at all? The checks `predict` and `render` share.

A tensor parallel size that does not divide the attention heads, more GPUs than a replica may
take, a quantization or KV-cache dtype the GPU has no kernels for, a workload longer than the
model's context, and (given a workload) weights and KV cache that do not fit in GPU memory.
Each problem names the field it is about (``tp``, ``quantization`` ...).
"""

from __future__ import annotations

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import MAX_BATCH_SIZE_LIMIT, TrialConfig, Workload


def config_problems(
    arch: ModelArch,
    gpu: Gpu,
    cfg: TrialConfig,
    *,
    max_gpus: int | None = None,
) -> list[str]:
    """What stops ``cfg`` from running on ``gpu`` regardless of the workload."""
    problems = []
    if cfg.tp < 1 or not arch.valid_tp(cfg.tp):
        problems.append(f"tp {cfg.tp} must divide {arch.key}'s {arch.heads} attention heads")
    if max_gpus is not None and cfg.tp > max_gpus:
        problems.append(f"tp {cfg.tp} exceeds gpu.maxGpusPerReplica ({max_gpus})")
    if not 1 <= cfg.max_batch_size <= MAX_BATCH_SIZE_LIMIT:
        problems.append(
            f"max_batch_size must be between 1 and {MAX_BATCH_SIZE_LIMIT}, not {cfg.max_batch_size}"
        )
    if cfg.quantization not in gpu.quantizations:
        problems.append(
            f"quantization: {gpu.key} ({gpu.architecture}) does not support {cfg.quantization}; "
            f"it supports {', '.join(sorted(gpu.quantizations))}"
        )
    if cfg.kv_cache_dtype not in gpu.kv_dtypes:
        problems.append(f"kv_cache_dtype: {gpu.key} has no {cfg.kv_cache_dtype} KV cache")
    return problems


def fit_problem(arch: ModelArch, gpu: Gpu, cfg: TrialConfig, work: Workload) -> str | None:
    """Why ``cfg`` (valid by :func:`config_problems`) does not fit ``work`` in memory, or None."""
    from infertune_tuner.perfmodel import predict

    memory = predict(arch, gpu, cfg, work).memory
    return None if memory.fits else f"{cfg.label()} does not fit: {memory.reason}"
