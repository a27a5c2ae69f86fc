"""The search space: spec.search x what the GPU supports x the accuracy allowance x the model.

Values that can never run are *excluded* up front with a reason (no GPU time, no prediction):
a quantization the GPU lacks or whose documented accuracy cost exceeds the allowance, a KV dtype
the GPU lacks, a TP that does not divide the attention heads or exceeds maxGpusPerReplica, and a
workload whose input + output exceed the model's maximum context (max_position_embeddings),
which rules out every configuration.
What remains is the space; the memory model then prunes configurations that cannot fit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.models import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.request import TuningRequest


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

    def __len__(self) -> int:
        return len(self.configs)


def build_space(request: TuningRequest, model: ModelArch, gpu: Gpu) -> SearchSpace:
    s = request.search
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

    kvs: list[str] = []
    for kv in s.kv_cache_dtype:
        if kv not in gpu.kv_dtypes:
            excluded.append(Exclusion("kv_cache_dtype", kv, f"{gpu.key} has no FP8 KV cache"))
        else:
            kvs.append(kv)

    batches = sorted(set(s.max_batch_size))
    configs = tuple(
        TrialConfig(tp, b, q, kv)
        for tp, b, q, kv in itertools.product(sorted(set(tps)), batches, quants, kvs)
        if too_long is None
    )
    if not configs:
        reasons = "; ".join(f"{e.field}={e.value}: {e.reason}" for e in excluded)
        raise InputError(f"the search space is empty on {gpu.key}: {reasons or 'no values'}")
    return SearchSpace(
        configs, tuple(excluded), tuple(sorted(set(tps))), tuple(batches), tuple(quants), tuple(kvs)
    )
