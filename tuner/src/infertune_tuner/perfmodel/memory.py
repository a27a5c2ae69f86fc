"""Memory model: what a configuration needs per GPU and how many sequences its KV cache holds.

    weights/GPU   = (layer weights / TP, KV projections replicated when TP > kvHeads)
                    x bytes per weight (scales included) + embedding and LM head in 16 bit / TP
    KV/token/GPU  = 2 (K and V) x layers x max(kvHeads / TP, 1) x headDim x bytes(KV dtype)
    activations   = maxNumTokens x (4 hidden + 2 ffn / TP) x 2 bytes     (peak of one forward)
    reserve       = CUDA context, NCCL buffers, CUDA graphs, allocator slack (fixed per GPU)
    usable KV     = freeGpuMemoryFraction x (memory - weights - activations - reserve)
    max sequences = usable KV / (KV/token x context rounded up to whole 32-token pages)

A configuration *fits* when the request fits the model's maximum context, the weights load and the
KV cache holds `max_batch_size` sequences at the workload's full context: a larger max batch could
never be reached, only queued.

The KV reservation is TensorRT-LLM's default capacity-scheduler policy, GUARANTEED_NO_EVICT: a
request is admitted only once blocks for its whole input + output are free (tokens_per_block 32,
`KvCacheConfig.free_gpu_memory_fraction` 0.9 of the memory left after weights and activations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig, Workload

GIB = 1024**3
RESERVE_GIB = 2.0
FREE_GPU_MEMORY_FRACTION = 0.9
KV_PAGE_TOKENS = 32
DEFAULT_MAX_NUM_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_gib_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    activations_gib_per_gpu: float
    reserve_gib_per_gpu: float
    usable_kv_gib_per_gpu: float
    kv_cache_gib_per_gpu: float  # what max_batch_size sequences at full context need
    max_concurrent_sequences: int
    fits: bool
    reason: str | None


def kv_heads_per_gpu(model: ModelArch, tp: int) -> float:
    """KV heads each rank holds: split across ranks, replicated once TP exceeds them."""
    return max(model.kv_heads / tp, 1.0)


def kv_bytes_per_token(model: ModelArch, tp: int, kv_dtype: str) -> float:
    return (
        2 * model.layers * kv_heads_per_gpu(model, tp) * model.head_dim * KV_DTYPE_BYTES[kv_dtype]
    )


def weight_bytes_per_gpu(model: ModelArch, tp: int, quantization: str) -> float:
    q = QUANTIZATIONS[quantization]
    head_dim = model.head_dim
    kv_params = 2 * model.hidden_size * head_dim * kv_heads_per_gpu(model, tp)
    qo_params = 2 * model.hidden_size * model.q_size / tp
    mlp_params = model.experts * model.expert_params_per_layer / tp
    router = model.hidden_size * model.experts if model.experts > 1 else 0
    layer = (kv_params + qo_params + mlp_params) * q.weight_bytes + router * 2
    embeddings = 2 * model.embedding_params / tp * 2  # vocab-parallel, kept in 16 bit
    return model.layers * layer + embeddings


def activation_bytes(model: ModelArch, tp: int, max_num_tokens: int) -> float:
    return max_num_tokens * (4 * model.hidden_size + 2 * model.ffn_size / tp) * 2


def estimate_memory(
    model: ModelArch,
    gpu: Gpu,
    cfg: TrialConfig,
    workload: Workload,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    reserve_gib: float = RESERVE_GIB,
    free_gpu_memory_fraction: float = FREE_GPU_MEMORY_FRACTION,
) -> MemoryEstimate:
    weights = weight_bytes_per_gpu(model, cfg.tp, cfg.quantization)
    kv_tok = kv_bytes_per_token(model, cfg.tp, cfg.kv_cache_dtype)
    act = activation_bytes(model, cfg.tp, max_num_tokens)
    reserve = reserve_gib * GIB
    free = gpu.memory_gib * GIB - weights - act - reserve
    usable = max(free, 0.0) * free_gpu_memory_fraction
    pages = math.ceil(workload.context / KV_PAGE_TOKENS) * KV_PAGE_TOKENS
    per_seq = kv_tok * pages
    max_seqs = int(usable // per_seq) if per_seq > 0 else 0
    need = cfg.max_batch_size * per_seq
    reason = model.context_problem(workload.input_tokens, workload.output_tokens)
    if reason is None and free <= 0:
        reason = (
            f"weights {weights / GIB:.1f} GiB + activations {act / GIB:.1f} GiB + reserve "
            f"{reserve_gib:.1f} GiB exceed {gpu.memory_gib:.0f} GiB per GPU"
        )
    elif reason is None and max_seqs < cfg.max_batch_size:
        reason = (
            f"KV cache holds {max_seqs} sequences of {workload.context} tokens "
            f"({usable / GIB:.1f} GiB usable), fewer than max batch {cfg.max_batch_size} "
            f"({need / GIB:.1f} GiB)"
        )
    return MemoryEstimate(
        weights_gib_per_gpu=weights / GIB,
        kv_bytes_per_token_per_gpu=kv_tok,
        activations_gib_per_gpu=act / GIB,
        reserve_gib_per_gpu=reserve_gib,
        usable_kv_gib_per_gpu=usable / GIB,
        kv_cache_gib_per_gpu=need / GIB,
        max_concurrent_sequences=max_seqs,
        fits=reason is None,
        reason=reason,
    )
