"""Maximum-load throughput as TensorRT-LLM's `trtllm-bench throughput` measures it.

TensorRT-LLM's perf-overview tables are offline runs: every request is queued at once and the
engine runs as many as it admits. To compare the model with them, the model reproduces that
set-up (with `trtllm-bench`'s defaults, the ones the tables were taken with):

- KV reservation: the default capacity-scheduler policy GUARANTEED_NO_EVICT admits a request only
  when KV blocks for its whole input + output are free; the cache gets
  `--kv_cache_free_gpu_mem_fraction` of the memory left after weights and activations: 0.95, which
  the perf overview says it uses "in many cases" (falling back to the option's default, 0.90, on
  out-of-memory). So the batch that runs is what the KV cache holds at input + output tokens.
- max_num_tokens: trtllm-bench's heuristic from the batch it estimates, B x (1 + ISL/OSL), capped
  at 32768 and rounded up (at least 2048); chunked prefill is off by default, so it is raised to
  at least ISL + B so that a whole prompt fits one step.
- max-load throughput = the best output tok/s/GPU over the batch sizes that fit (powers of two
  and the KV cache's own limit): the engine's in-flight batch settles where the cache is full.

Sources (TensorRT-LLM repository): `tensorrt_llm/bench/build/tuning.py` (max batch size and
max_num_tokens heuristic), `tensorrt_llm/bench/benchmark/utils/general.py` (ISL + batch when
chunking is off), `tensorrt_llm/bench/benchmark/throughput.py` (free-memory fraction 0.90),
`tensorrt_llm/llmapi/llm_args.py` (`SchedulerConfig.capacity_scheduler_policy`).
"""

from __future__ import annotations

import math

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.perfmodel.factors import DEFAULT_STACK, Efficiency
from infertune_tuner.perfmodel.latency import Prediction, predict
from infertune_tuner.perfmodel.memory import estimate_memory

MAX_BENCH_BATCH = 4096  # trtllm-bench caps its estimated batch here
MAX_BENCH_TOKENS = 32768
BENCH_FREE_GPU_MEMORY_FRACTION = 0.95


def bench_max_num_tokens(batch: int, input_tokens: int, output_tokens: int) -> int:
    """The max_num_tokens trtllm-bench runs with for this batch and request shape."""
    raw = min(batch * (1 + input_tokens / output_tokens), MAX_BENCH_TOKENS)
    if raw < 4096:
        tokens = max(2048, 256 * math.ceil(raw / 256))
    elif raw < 8192:
        tokens = 512 * math.ceil(raw / 512)
    else:
        tokens = 1024 * math.ceil(raw / 1024)
    return max(tokens, input_tokens + batch)  # no chunked prefill: a whole prompt per step


def max_load(
    model: ModelArch,
    gpu: Gpu,
    tp: int,
    quantization: str,
    kv_cache_dtype: str,
    workload: Workload,
    eff: Efficiency | None = None,
    stack: str = DEFAULT_STACK,
) -> Prediction | None:
    """The best-throughput prediction over the batch sizes that fit, None when none does."""
    probe = TrialConfig(tp, 1, quantization, kv_cache_dtype)
    isl, osl = workload.input_tokens, workload.output_tokens
    # The KV cache's limit depends on the activation buffer, which depends on the batch: settle it.
    frac = BENCH_FREE_GPU_MEMORY_FRACTION
    cap = 1
    for _ in range(3):
        tokens = bench_max_num_tokens(max(cap, 1), isl, osl)
        est = estimate_memory(model, gpu, probe, workload, tokens, free_gpu_memory_fraction=frac)
        cap = est.max_concurrent_sequences
    cap = min(cap, MAX_BENCH_BATCH)
    if cap < 1:
        return None
    batches = sorted({2**i for i in range(cap.bit_length()) if 2**i < cap} | {cap})
    best: Prediction | None = None
    for b in batches:
        cfg = TrialConfig(tp, b, quantization, kv_cache_dtype)
        p = predict(
            model, gpu, cfg, workload, eff, max_num_tokens=bench_max_num_tokens(b, isl, osl),
            stack=stack, free_gpu_memory_fraction=frac,
        )  # fmt: skip
        if p.fits and (
            best is None or p.output_tokens_per_s_per_gpu > best.output_tokens_per_s_per_gpu
        ):
            best = p
    return best
