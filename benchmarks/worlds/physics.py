"""A GPU pool's behaviour from first principles, written independently of `perfmodel`.

The tuner's prior (`infertune_tuner.perfmodel`) is one picture of how a serving stack behaves. To
test the search honestly, the simulated pools here use their *own* formulas and their *own*
memory accounting, so that the prior can be wrong in form, not only in its constants:

- memory: weights per rank, a workspace that grows with the max batch and the token budget, a
  runtime reserve, a usable fraction of what is left, KV blocks of 64 or 128 tokens. Loading
  fails (OOM) when weights + workspace + reserve exceed the GPU; the KV cache caps concurrency
  when it holds fewer sequences than the max batch (the rest queue), as the TensorRT-LLM
  scheduler does with its default no-eviction policy.
- a decode step combines memory time and compute time with a soft maximum (p-norm), adds the
  tensor-parallel all-reduce per layer (per-call latency + bytes / link bandwidth), a per-step
  cost, a per-sequence cost, and kernel-launch time when the batch has no captured CUDA graph.
- a closed loop at concurrency B turns step times into per-request samples (TTFT, ITL as
  GenAI-Perf defines it per request, E2E), whose percentiles are taken like a benchmark client
  takes them; see `closed_loop.py`.

Only datasheet facts (bandwidth, tensor-core peaks, memory, link) and the model's shape come from
the catalog. Nothing here imports `perfmodel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig

GIB = 1024**3
MAX_NUM_TOKENS = 8192  # the token budget per engine step (TensorRT-LLM's default max_num_tokens)

# Bytes per stored weight, scales included (own accounting: group-64 INT4 scales, FP8 per-channel).
WEIGHT_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0 + 2 / 1024,
    "w4a16_awq": 0.5 + 4 / 64,
    "w4a8_awq": 0.5 + 4 / 64,
    "nvfp4": 0.5 + 1 / 16,
}
KV_BYTES = {"auto": 2.0, "fp8": 1.0}
# Which tensor-core rate the GEMMs of a format run at.
COMPUTE = {
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "w4a16_awq": "bf16",
    "w4a8_awq": "fp8",
    "nvfp4": "fp4",
}
FOUR_BIT = frozenset({"w4a16_awq", "w4a8_awq"})


@dataclass(frozen=True, slots=True)
class Knobs:
    """The hidden constants of one simulated pool (drawn per world, see families.py)."""

    bw_eff: float  # fraction of HBM bandwidth reached streaming weights
    attn_eff: float  # fraction of HBM bandwidth reached reading the KV cache
    mma_eff: float  # fraction of tensor-core peak in decode GEMMs
    prefill_eff: float  # fraction of tensor-core peak in prefill
    soft_p: float  # p of the p-norm that combines memory and compute time (large = max)
    ar_latency_us: float  # per all-reduce call (launch + synchronisation)
    ar_bw_eff: float  # fraction of link bandwidth an all-reduce reaches
    step_ms: float  # scheduler, sampling, host work per engine step
    per_seq_us: float  # per active sequence per step
    launch_us_per_layer: float  # kernel launches per layer when a step runs without a CUDA graph
    graph_batches: frozenset[int] | None  # captured decode batch sizes; None = all (padding on)
    fp8_ratio_small: float | None  # FP8 / 16-bit decode-step ratio at batch 1; None = roofline
    fp8_ratio_large: float  # ... at large batch
    fp8_knee: float  # batch around which the FP8 gain fades
    w4_compute_mult: float  # 4-bit weight GEMM cost vs 16-bit (dequantisation in the mainloop)
    stall_prefill: bool  # prompts run as separate steps that stall every decode
    chunk_overlap: float  # share of piggybacked prefill time hidden under a mixed step
    sync: float  # how strongly closed-loop arrivals cluster (0 = evenly spread)
    usable_fraction: float  # share of free memory given to the KV cache
    reserve_gib: float  # CUDA context, NCCL, allocator slack per GPU
    workspace_gib: float  # fixed workspace per GPU
    workspace_mib_per_seq: float  # workspace per max-batch slot (logits, sampling buffers)
    block_tokens: int  # KV cache block size
    noise: float  # relative standard deviation of a run's timings
    outlier_rate: float  # probability that a run has a straggler tail or a slow phase


@dataclass(frozen=True, slots=True)
class Capacity:
    """What fits: `load_error` when the engine cannot start, else the KV-limited concurrency."""

    weights_gib: float
    workspace_gib: float
    kv_sequences: int
    load_error: str | None


@dataclass(frozen=True, slots=True)
class Steps:
    """Step timings (milliseconds) of one configuration at its effective concurrency."""

    concurrency: int
    decode_ms: float  # one decode step of `concurrency` sequences at mid context
    prefill_ms: float  # one prompt's prefill
    prefill_step_ms: float  # the fixed cost of a separate prefill step (stall mode)


def _peak(gpu: Gpu, path: str) -> float:
    if path == "fp4" and gpu.fp4_tflops:
        return gpu.fp4_tflops * 1e12
    if path in ("fp8", "fp4") and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


def _kv_heads_per_rank(model: ModelArch, tp: int) -> float:
    return max(model.kv_heads / tp, 1.0)


def weight_bytes(model: ModelArch, cfg: TrialConfig) -> float:
    """Stored weights per rank: layers split over TP (KV projections replicated past the KV
    heads), embedding and LM head vocab-parallel and kept in 16 bit."""
    hd = model.head_dim
    attn = model.hidden_size * (2 * model.q_size / cfg.tp)  # q and o: heads x head_dim wide
    attn += model.hidden_size * 2 * hd * _kv_heads_per_rank(model, cfg.tp)
    mlp = model.experts * 3 * model.hidden_size * model.ffn_size / cfg.tp
    layer = (attn + mlp) * WEIGHT_BYTES[cfg.quantization]
    return model.layers * layer + 2 * model.vocab_size * model.hidden_size * 2 / cfg.tp


def kv_bytes_per_token(model: ModelArch, cfg: TrialConfig) -> float:
    heads = _kv_heads_per_rank(model, cfg.tp)
    return 2 * model.layers * heads * model.head_dim * KV_BYTES[cfg.kv_cache_dtype]


def capacity(model: ModelArch, gpu: Gpu, cfg: TrialConfig, context: int, k: Knobs) -> Capacity:
    weights = weight_bytes(model, cfg)
    act = MAX_NUM_TOKENS * (3 * model.hidden_size + 2 * model.ffn_size / cfg.tp) * 2
    workspace = k.workspace_gib * GIB + act + cfg.max_batch_size * k.workspace_mib_per_seq * 2**20
    fixed = weights + workspace + k.reserve_gib * GIB
    total = gpu.memory_gib * GIB
    if fixed > total:
        return Capacity(
            weights / GIB,
            workspace / GIB,
            0,
            f"CUDA out of memory while loading: weights {weights / GIB:.1f} GiB + workspace "
            f"{workspace / GIB:.1f} GiB exceed {gpu.memory_gib:.0f} GiB",
        )
    blocks = math.ceil(context / k.block_tokens) * k.block_tokens
    seqs = int(k.usable_fraction * (total - fixed) // (kv_bytes_per_token(model, cfg) * blocks))
    error = None
    if seqs < 1:
        error = "CUDA out of memory: no room for the KV cache of one sequence"
    return Capacity(weights / GIB, workspace / GIB, seqs, error)


def _touched_weight_bytes(model: ModelArch, cfg: TrialConfig, batch: float) -> float:
    total = weight_bytes(model, cfg)
    if model.experts <= 1:
        return total
    per_expert = model.layers * 3 * model.hidden_size * model.ffn_size / cfg.tp
    experts_bytes = per_expert * model.experts * WEIGHT_BYTES[cfg.quantization]
    share = 1 - (1 - model.experts_active / model.experts) ** max(batch, 1.0)
    return total - experts_bytes + experts_bytes * share


def allreduce_ms(model: ModelArch, gpu: Gpu, tp: int, tokens: float, k: Knobs) -> float:
    """Two all-reduces per layer (after attention and after the MLP), ring algorithm."""
    if tp <= 1:
        return 0.0
    payload = 2 * (tp - 1) / tp * tokens * model.hidden_size * 2
    per_call = k.ar_latency_us * 1e-6 + payload / (gpu.link_bandwidth_gbs * 1e9 * k.ar_bw_eff)
    return 2 * model.layers * per_call * 1e3


def _core_ms(
    model: ModelArch, gpu: Gpu, cfg: TrialConfig, batch: float, ctx: float, k: Knobs
) -> float:
    bw = gpu.hbm_bandwidth_gbs * 1e9
    t_mem = _touched_weight_bytes(model, cfg, batch) / (bw * k.bw_eff)
    t_mem += batch * ctx * kv_bytes_per_token(model, cfg) / (bw * k.attn_eff)
    gemm = (
        2
        * model.active_params
        / cfg.tp
        * batch
        / (_peak(gpu, COMPUTE[cfg.quantization]) * k.mma_eff)
    )
    if cfg.quantization in FOUR_BIT:
        gemm *= k.w4_compute_mult
    attn = (
        4
        * batch
        * ctx
        * model.layers
        * model.hidden_size
        / cfg.tp
        / (gpu.bf16_tflops * 1e12 * k.mma_eff)
    )
    t_cmp = gemm + attn
    p = k.soft_p
    return (t_mem**p + t_cmp**p) ** (1 / p) * 1e3


def decode_ms(
    model: ModelArch, gpu: Gpu, cfg: TrialConfig, batch: int, ctx: float, k: Knobs
) -> float:
    """One decode step of `batch` sequences at average context `ctx`."""
    core = _core_ms(model, gpu, cfg, batch, ctx, k)
    if cfg.quantization == "fp8" and k.fp8_ratio_small is not None:
        # Measured FP8 gains are large while decode is bound by streaming weights and fade as
        # the step becomes bound by attention and compute: scale the 16-bit step instead.
        twin = TrialConfig(cfg.tp, cfg.max_batch_size, "bf16", cfg.kv_cache_dtype)
        fade = math.exp(-(batch - 1) / k.fp8_knee)
        ratio = k.fp8_ratio_large + (k.fp8_ratio_small - k.fp8_ratio_large) * fade
        core = _core_ms(model, gpu, twin, batch, ctx, k) * ratio
    launch = 0.0
    if k.graph_batches is not None and batch not in k.graph_batches:
        launch = model.layers * k.launch_us_per_layer * 1e-3
    return (
        core
        + allreduce_ms(model, gpu, cfg.tp, batch, k)
        + k.step_ms
        + batch * k.per_seq_us * 1e-3
        + launch
    )


def prefill_ms(model: ModelArch, gpu: Gpu, cfg: TrialConfig, tokens: float, k: Knobs) -> float:
    """Prefill of `tokens` prompt tokens: GEMMs and causal attention, compute-bound."""
    peak = _peak(gpu, COMPUTE[cfg.quantization]) * k.prefill_eff
    if cfg.quantization in FOUR_BIT:
        peak /= 1 + (k.w4_compute_mult - 1) / 3  # large GEMMs amortise dequantisation better
    flops = 2 * model.active_params / cfg.tp * tokens
    attn = 2 * model.layers * tokens**2 * model.hidden_size / cfg.tp
    return (flops / peak + attn / (gpu.bf16_tflops * 1e12 * k.prefill_eff)) * 1e3 + allreduce_ms(
        model, gpu, cfg.tp, tokens, k
    )


def steps(
    model: ModelArch, gpu: Gpu, cfg: TrialConfig, concurrency: int, isl: int, osl: int, k: Knobs
) -> Steps:
    return Steps(
        concurrency=concurrency,
        decode_ms=decode_ms(model, gpu, cfg, concurrency, isl + osl / 2, k),
        prefill_ms=prefill_ms(model, gpu, cfg, isl, k),
        prefill_step_ms=k.step_ms + model.layers * 0.01,
    )
