"""The search space: spec.search x what the GPU supports x the accuracy allowance x the model.

Values that can never run are *excluded* up front with a reason (no GPU time, no prediction):
a quantization the GPU lacks or whose documented accuracy cost exceeds the allowance, a KV dtype
the GPU lacks, a TP that does not divide the attention heads or exceeds maxGpusPerReplica, and a
workload whose input + output exceed the model's maximum context (max_position_embeddings),
which rules out every configuration.
On the triton backend, which loads real weights, a quantization without a pre-quantized
checkpoint (`spec.model.checkpoints.<q>`) is excluded too: it could only fail. A checkpoint
whose `hf_quant_config.json` declares an FP8 KV cache runs `kv_cache_dtype: auto` as FP8: the
space records it (`SearchSpace.effective` is what the performance model predicts), and drops the
explicit `fp8` KV configuration of that quantization as the same server twice.
What remains is the space; the memory model then prunes configurations that cannot fit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from infertune_tuner import pools
from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.weights import (
    SIXTEEN_BIT,
    checkpoint_kv_dtype,
    model_path_for,
    weights_uri,
)

LOADS_WEIGHTS = frozenset({"triton"})  # backends whose trials load the model's weights


@dataclass(frozen=True)
class Exclusion:
    field: str
    value: str
    reason: str


@dataclass(frozen=True)
class SearchSpace:
    configs: tuple[TrialConfig, ...]
    excluded: tuple[Exclusion, ...]
    tensor_parallel: tuple[int, ...]
    max_batch_size: tuple[int, ...]
    quantization: tuple[str, ...]
    kv_cache_dtype: tuple[str, ...]
    # Quantizations whose checkpoint declares an FP8 KV cache (kv "auto" runs FP8 with them).
    fp8_kv_checkpoints: frozenset[str] = field(default_factory=frozenset)
    # The pools whose configurations the space holds (`TrialConfig.gpu`); () on one pool.
    gpus: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.configs)

    def effective(self, config: TrialConfig) -> TrialConfig:
        """The configuration the server actually runs: kv "auto" is FP8 with a checkpoint that
        declares an FP8 KV cache."""
        if config.kv_cache_dtype == "auto" and config.quantization in self.fp8_kv_checkpoints:
            return replace(config, kv_cache_dtype="fp8")
        return config


def checkpoint_problems(
    request: TuningRequest, quantizations: list[str], backend: str
) -> list[Exclusion]:
    """Quantizations with no weights to load on a backend that loads weights."""
    if backend not in LOADS_WEIGHTS:
        return []
    out: list[Exclusion] = []
    for q in quantizations:
        if q in SIXTEEN_BIT or q in request.model.checkpoints:
            continue
        out.append(Exclusion("quantization", q, (
            f"no pre-quantized checkpoint: set spec.model.checkpoints.{q} (the triton backend "
            "loads ModelOpt checkpoints; TensorRT-LLM does not quantize at load time)")))  # fmt: skip
    return out


def fp8_kv_checkpoints(
    request: TuningRequest, quantizations: list[str], backend: str
) -> frozenset[str]:
    """The quantizations whose checkpoint's hf_quant_config.json declares an FP8 KV cache
    (read where the tuner can: a mounted path, or the Hugging Face Hub in the tuner image)."""
    if backend not in LOADS_WEIGHTS:
        return frozenset()
    out = set()
    for q in quantizations:
        if q in SIXTEEN_BIT or q not in request.model.checkpoints:
            continue
        path = model_path_for(weights_uri(request, TrialConfig(1, 1, q, "auto")))
        if checkpoint_kv_dtype(path) == "fp8":
            out.add(q)
    return frozenset(out)


def build_space(
    request: TuningRequest, model: ModelArch, gpu: Gpu, backend: str | None = None
) -> SearchSpace:
    """The space of `request` on `gpu`; `backend` (default: the request's) is the backend that
    runs the trials: one that loads weights excludes quantizations without a checkpoint."""
    s = request.search
    backend = backend if backend is not None else request.tuning.backend
    excluded: list[Exclusion] = []
    w = request.workload
    too_long = model.context_problem(w.input_tokens, w.output_tokens)
    if too_long is not None:
        excluded.append(Exclusion("workload", f"{w.input_tokens}+{w.output_tokens}", too_long))

    tps: list[int] = []
    for tp in s.tensor_parallel:
        if tp > request.gpu.max_gpus_per_replica:
            excluded.append(Exclusion("tensor_parallel", str(tp), (
                f"exceeds maxGpusPerReplica ({request.gpu.max_gpus_per_replica})")))  # fmt: skip
        elif not model.valid_tp(tp):
            excluded.append(Exclusion("tensor_parallel", str(tp), (
                f"does not divide the model's {model.heads} attention heads")))  # fmt: skip
        else:
            tps.append(tp)

    quants: list[str] = []
    for q in s.quantization:
        spec = QUANTIZATIONS.get(q)
        if spec is None:
            excluded.append(Exclusion("quantization", q, "unknown quantization"))
        elif q not in gpu.quantizations:
            excluded.append(Exclusion("quantization", q, (
                f"{gpu.key} ({gpu.architecture}) has no kernels for it")))  # fmt: skip
        elif spec.accuracy_loss_percent > s.max_accuracy_loss_percent:
            excluded.append(Exclusion("quantization", q, (
                f"documented accuracy cost ~{spec.accuracy_loss_percent:g}% exceeds "
                f"maxAccuracyLossPercent {s.max_accuracy_loss_percent:g}%")))  # fmt: skip
        else:
            quants.append(q)
    missing = checkpoint_problems(request, quants, backend)
    excluded += missing
    quants = [q for q in quants if q not in {e.value for e in missing}]
    fp8_kv = fp8_kv_checkpoints(request, quants, backend)

    kvs: list[str] = []
    for kv in s.kv_cache_dtype:
        if kv not in gpu.kv_dtypes:
            excluded.append(Exclusion("kv_cache_dtype", kv, f"{gpu.key} has no FP8 KV cache"))
        else:
            kvs.append(kv)

    twins = {q for q in fp8_kv if "auto" in kvs and "fp8" in kvs}
    for q in sorted(twins):
        excluded.append(Exclusion("kv_cache_dtype", f"fp8 with {q}", (
            f"the same server as kv_cache_dtype auto: the {q} checkpoint's "
            "hf_quant_config.json declares an FP8 KV cache, which auto runs")))  # fmt: skip
    batches = sorted(set(s.max_batch_size))
    configs = tuple(
        TrialConfig(tp, b, q, kv)
        for tp, b, q, kv in itertools.product(sorted(set(tps)), batches, quants, kvs)
        if too_long is None and not (kv == "fp8" and q in twins)
    )
    if not configs:
        reasons = "; ".join(f"{e.field}={e.value}: {e.reason}" for e in excluded)
        raise InputError(f"the search space is empty on {gpu.key}: {reasons or 'no values'}")
    return SearchSpace(
        configs, tuple(excluded), tuple(sorted(set(tps))), tuple(batches), tuple(quants),
        tuple(kvs), fp8_kv,
    )  # fmt: skip


def search_space(
    request: TuningRequest, model: ModelArch, backend: str | None = None
) -> SearchSpace:
    """The space the study searches: `build_space` on the request's GPU, or, where it lists
    several pools, the union of each pool's space, every configuration naming its pool.

    A pool where nothing can run (its GPU lacks every quantization asked for, say) is excluded
    with the reason, as a value of any dimension is; only a space empty on every pool is an
    error. An exclusion every pool shares is listed once; one that holds on some pools only
    names them."""
    if not request.gpu.pools:
        return build_space(request, model, request.resolve_gpu(), backend)
    per_pool: dict[str, SearchSpace] = {}
    excluded: list[Exclusion] = []
    for pool in request.gpu.pools:
        try:
            per_pool[pool.product] = build_space(
                pools.single(request, pool.product), model, get_gpu(pool.product), backend
            )
        except InputError as exc:
            excluded.append(Exclusion("gpu", pool.product, str(exc)))
    if not per_pool:
        raise InputError("the search space is empty on every pool: " + "; ".join(
            e.reason for e in excluded))  # fmt: skip
    seen: dict[Exclusion, list[str]] = {}
    for product, sp in per_pool.items():
        for e in sp.excluded:
            seen.setdefault(e, []).append(product)
    for e, where in seen.items():
        if len(where) == len(per_pool):
            excluded.append(e)
        else:
            excluded.append(replace(e, value=f"{e.value} on {', '.join(where)}"))
    spaces = per_pool.values()
    return SearchSpace(
        configs=tuple(replace(c, gpu=p) for p, sp in per_pool.items() for c in sp.configs),
        excluded=tuple(excluded),
        tensor_parallel=tuple(sorted({v for sp in spaces for v in sp.tensor_parallel})),
        max_batch_size=tuple(sorted({v for sp in spaces for v in sp.max_batch_size})),
        quantization=tuple(dict.fromkeys(v for sp in spaces for v in sp.quantization)),
        kv_cache_dtype=tuple(dict.fromkeys(v for sp in spaces for v in sp.kv_cache_dtype)),
        fp8_kv_checkpoints=frozenset().union(*(sp.fp8_kv_checkpoints for sp in spaces)),
        gpus=tuple(per_pool),
    )
