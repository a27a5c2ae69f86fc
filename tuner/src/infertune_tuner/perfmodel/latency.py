"""Latency/throughput model for continuous (in-flight) batching at a fixed concurrency.

Per engine step with B active sequences at average context c (per GPU, TP ranks in parallel):

    t_mem     = W_active / (BW * weight_bw) + B * c * kv_bytes_tok / (BW * kv_bw)
    t_compute = 2 * P_active/TP * B / (peak_q * gemm) + 4 * B * c * L * H*d/TP / (peak_a * gemm)
    t_comm    = 2 L * (ar_latency + 2 (TP-1)/TP * B * hidden * 2 bytes / (link_bw * link))
    t_decode  = max(t_mem, t_compute) + 0.3 * min(t_mem, t_compute) + t_comm
                + step_overhead + B * per_seq_overhead
    t_prefill = (2 * P_active/TP * ISL / peak_q + 2 L * ISL^2 * H*d/TP / peak_a) / prefill
                + t_comm(ISL tokens)

peak_q is the tensor-core peak of the quantization's GEMM path (bf16, fp8 or fp4) times its
dequantisation efficiency, and for the 8/4-bit paths times `low_precision` (the share of their
peak they reach relative to the 16-bit path's share); attention runs at peak_a: FP8 with an FP8
KV cache on a GPU with FP8 tensor cores (TensorRT-LLM's FP8 FMHA), else 16-bit.

Closed loop at concurrency B (each finished request is replaced at once). A step admits new
requests until their prompts fill the token budget (max_num_tokens = 8192), so k =
min(B, max_num_tokens // ISL) prefills share a step; with fixed lengths the loop settles into
B/k cohorts that finish, return and are admitted together, one after another (a train):

    cohort    = t_decode(B) + k * t_prefill          (the step that carries a cohort's prefills)
    step      = t_decode(B) + (B-k)/OSL * t_prefill  (other cohorts' prefills, averaged)
    E2E       = cohort + (OSL-1) * step
    tok/s/GPU = B * OSL / E2E / TP

TTFT: a returning request misses the step that begins as its predecessor's last token comes out
(the client needs a round trip; the engine starts its next step at once), so it waits through
that step, then through its own admission step. In the train, the step it waits through is the
admission step of the cohort ahead of it (the first cohort waits through a plain decode step;
with a single cohort nobody is decoding and nothing is waited for). Cohort sizes follow the
engine's budget rule exactly: a cohort is admitted while its prompts fit max_num_tokens minus one
token per sequence still decoding. The simulated server's engine (harness/engine.py) schedules the
same way step by step, and behind a real client (any turnaround > 0) its TTFT agrees with this.

ITL is GenAI-Perf's, per request: (E2E - TTFT) / (OSL - 1), percentiles over requests, which are
narrow (every request sees about the same mix of steps). The pooled gaps between tokens
(`token_gap_ms`) land in the long (cohort) steps once their share of a request's gaps passes
1 - percentile; they are reported, not bounded.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.perfmodel.factors import DEFAULT_STACK, Efficiency, default_efficiency
from infertune_tuner.perfmodel.memory import (
    DEFAULT_MAX_NUM_TOKENS,
    FREE_GPU_MEMORY_FRACTION,
    RESERVE_GIB,
    MemoryEstimate,
    estimate_memory,
    kv_bytes_per_token,
    weight_bytes_per_gpu,
)

OVERLAP = 0.3  # how much of the shorter of memory and compute time fails to hide under the longer


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float
    p95: float
    p99: float

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99}

    def get(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(frozen=True, slots=True)
class Prediction:
    config: TrialConfig
    memory: MemoryEstimate
    prefill_ms: float
    decode_step_ms: float
    ttft_ms: Percentiles
    itl_ms: Percentiles  # per request (GenAI-Perf)
    e2e_ms: Percentiles
    token_gap_ms: Percentiles  # pooled gaps between tokens
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    prefill_share: float  # fraction of step time spent in other requests' prefills

    @property
    def fits(self) -> bool:
        return self.memory.fits


def _ramp(x: float, center: float, width: float) -> float:
    """0 below center - width/2, 1 above center + width/2, linear between."""
    return min(1.0, max(0.0, (x - center) / width + 0.5))


def _blend(lo: float, hi: float, w: float) -> float:
    return lo + (hi - lo) * w


def admitted_per_step(batch: int, input_tokens: int, max_num_tokens: int) -> int:
    """How many returning requests one step admits: while their prompts fit the token budget,
    max_num_tokens minus one token per sequence still decoding (at least one, at most the batch)."""
    k = max(1, min(batch, max_num_tokens // max(input_tokens, 1)))
    while k > 1 and k * input_tokens > max_num_tokens - (batch - k):
        k -= 1
    return k


def _weighted_quantile(values: list[tuple[float, int]], q: float) -> float:
    """The q-quantile of values given with their counts (the lower value at a tie)."""
    ordered = sorted(values)
    total = sum(n for _, n in ordered)
    seen = 0
    for v, n in ordered:
        seen += n
        if seen >= q * total - 1e-9:
            return v
    return ordered[-1][0]


def ttft_train(
    batch: int, input_tokens: int, max_num_tokens: int, t_decode: float, t_prefill: float,
    context_overhead: float,
) -> list[tuple[float, int]]:  # fmt: skip
    """(TTFT, requests) of each cohort of the closed loop's train (see the module docstring)."""
    k = admitted_per_step(batch, input_tokens, max_num_tokens)
    sizes = [k] * (batch // k) + ([batch % k] if batch % k else [])

    def admission(n: int) -> float:
        return t_decode + n * t_prefill + context_overhead

    if len(sizes) == 1:
        return [(admission(sizes[0]), sizes[0])]
    out = [(t_decode + admission(sizes[0]), sizes[0])]
    out += [(admission(a) + admission(b), b) for a, b in itertools.pairwise(sizes)]
    return out


class StepModel:
    """Step timings of one configuration; the simulated Triton server drives it step by step."""

    __slots__ = (
        "_act_params_gpu", "_all_expert_bytes", "_attn_bytes", "_attn_flops_tok", "_bw",
        "_comm_bytes_per_token", "_eff", "_kv_tok", "_link_bw", "_model", "_peak", "_peak_attn",
        "_tp", "_weights",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelArch,
        gpu: Gpu,
        cfg: TrialConfig,
        eff: Efficiency | None = None,
        stack: str = DEFAULT_STACK,
    ) -> None:
        q = QUANTIZATIONS[cfg.quantization]
        self._model = model
        self._tp = cfg.tp
        e = self._eff = eff or default_efficiency(gpu.architecture, stack)
        self._bw = gpu.hbm_bandwidth_gbs * 1e9
        low = e.low_precision if q.compute != "bf16" else 1.0
        self._peak = gpu.tflops(q.compute) * 1e12 * q.compute_efficiency * low
        fp8_attention = cfg.kv_cache_dtype == "fp8" and gpu.fp8_tflops
        self._peak_attn = (
            gpu.tflops("fp8" if fp8_attention else "bf16")
            * 1e12
            * (e.low_precision if fp8_attention else 1.0)
        )
        # Attention FLOPs per (token, context token, layer): QK^T and PV, 2 each, over H*d / TP.
        self._attn_flops_tok = 4 * model.layers * model.q_size / cfg.tp
        self._link_bw = gpu.link_bandwidth_gbs * 1e9
        # A decode step streams every weight but the input embedding, which is only gathered.
        self._weights = weight_bytes_per_gpu(model, cfg.tp, cfg.quantization) - (
            model.embedding_params / cfg.tp * 2
        )
        self._kv_tok = kv_bytes_per_token(model, cfg.tp, cfg.kv_cache_dtype)
        self._act_params_gpu = model.active_params / cfg.tp
        self._comm_bytes_per_token = model.hidden_size * 2
        if model.experts > 1:
            expert_bytes = model.expert_params_per_layer * q.weight_bytes / cfg.tp * model.layers
            self._all_expert_bytes = expert_bytes * model.experts
            self._attn_bytes = self._weights - self._all_expert_bytes
        else:
            self._all_expert_bytes = 0.0
            self._attn_bytes = self._weights

    def _weight_bytes_read(self, batch: float) -> float:
        m = self._model
        if m.experts <= 1:
            return self._weights
        # Expected distinct experts a batch touches per layer (uniform routing).
        touched = m.experts * (1 - (1 - m.experts_active / m.experts) ** max(batch, 1.0))
        return self._attn_bytes + self._all_expert_bytes * touched / m.experts

    def comm_ms(self, tokens: float) -> float:
        """Two all-reduces per layer of `tokens` hidden states: latency + bandwidth terms."""
        lat, bw = self._comm_parts(tokens)
        return lat + bw

    def _comm_parts(self, tokens: float) -> tuple[float, float]:
        tp = self._tp
        if tp <= 1:
            return 0.0, 0.0
        e = self._eff
        n = 2 * self._model.layers
        lat = n * e.allreduce_latency_us * 1e-3
        ring = 2 * (tp - 1) / tp * tokens * self._comm_bytes_per_token
        return lat, n * ring / (self._link_bw * e.link) * 1e3

    @property
    def context_step_overhead_ms(self) -> float:
        """Extra fixed cost of a step that carries prefills (no CUDA graph for it)."""
        return self._eff.context_step_overhead_ms

    def decode_ms(self, batch: float, avg_context: float) -> float:
        """One decode step for `batch` sequences at average context `avg_context`."""
        e = self._eff
        t_mem = self._weight_bytes_read(batch) / (self._bw * e.weight_bw) + (
            batch * avg_context * self._kv_tok / (self._bw * e.kv_bw)
        )
        attn_flops = batch * avg_context * self._attn_flops_tok
        t_cmp = (2 * self._act_params_gpu * batch / self._peak + attn_flops / self._peak_attn) / (
            e.gemm
        )
        hi, lo = (t_mem, t_cmp) if t_mem >= t_cmp else (t_cmp, t_mem)
        gpu = (hi + OVERLAP * lo) * 1e3 + self.comm_ms(batch)
        host = e.step_overhead_ms + batch * e.per_seq_overhead_us * 1e-3
        # The host's work for the next step (scheduling, sampling bookkeeping) overlaps this
        # step's kernels to the degree host_overlap (0: strictly one after the other).
        return gpu + host - e.host_overlap * min(gpu, host)

    def prefill_ms(self, tokens: float) -> float:
        """Prefill of `tokens` prompt tokens (one request, or a chunk of several)."""
        # Causal attention over the prompt: half of the tokens x tokens score matrix.
        attn = self._attn_flops_tok * tokens**2 / 2
        t = (
            (2 * self._act_params_gpu * tokens / self._peak + attn / self._peak_attn)
            / (self._eff.prefill)
            * 1e3
        )
        # Large all-reduces overlap the GEMMs of neighbouring chunks; their latency does not.
        lat, bw = self._comm_parts(tokens)
        hi, lo = (t, bw) if t >= bw else (bw, t)
        return hi + OVERLAP * lo + lat


def predict(
    model: ModelArch,
    gpu: Gpu,
    cfg: TrialConfig,
    workload: Workload,
    eff: Efficiency | None = None,
    reserve_gib: float | None = None,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    stack: str = DEFAULT_STACK,
    free_gpu_memory_fraction: float = FREE_GPU_MEMORY_FRACTION,
) -> Prediction:
    """Typical (p50) and tail latencies and throughput of `cfg` under a closed-loop load, with the
    efficiency factors of `stack` (or `eff`, when given)."""
    mem = estimate_memory(
        model, gpu, cfg, workload, max_num_tokens,
        RESERVE_GIB if reserve_gib is None else reserve_gib, free_gpu_memory_fraction,
    )  # fmt: skip
    steps = StepModel(model, gpu, cfg, eff, stack)
    b = cfg.max_batch_size
    isl, osl = workload.input_tokens, workload.output_tokens
    t_pre = steps.prefill_ms(isl)
    t_dec = steps.decode_ms(b, isl + osl / 2)
    # Admission: one engine step takes new requests until their prompts fill the token budget
    # (max_num_tokens, minus one token per decoding sequence), so up to k prefills share a step.
    # With fixed lengths a closed loop settles into cohorts of k requests that finish, return
    # and are admitted together (TTFT: `ttft_train`, which sizes cohorts by the exact rule).
    k = max(1, min(b, max_num_tokens // isl))
    cohorts = math.ceil(b / k)
    # A step that carries prefills runs without CUDA graphs: it pays the context-step overhead.
    o_ctx = steps.context_step_overhead_ms
    cohort_step = t_dec + k * t_pre + o_ctx
    interference = (b - k) / osl * t_pre + min(1.0, (cohorts - 1) / osl) * o_ctx
    step = t_dec + interference
    share = interference / step
    train = ttft_train(b, isl, max_num_tokens, t_dec, t_pre, o_ctx)
    ttft = Percentiles(
        _weighted_quantile(train, 0.50),
        _weighted_quantile(train, 0.95) * 1.05,
        _weighted_quantile(train, 0.99) * 1.10,
    )
    ttft50 = ttft.p50
    # Pooled token gaps: a request's gaps are short decode steps, except where another cohort's
    # prefills ride along; a percentile lands in those long gaps once their share passes
    # 1 - percentile (ramped, since real step times blur).
    frac = min(1.0, (cohorts - 1) / osl)
    long_step = cohort_step
    gaps = Percentiles(
        _blend(t_dec, long_step, _ramp(frac, 0.5, 0.1)),
        _blend(t_dec * 1.06, long_step, _ramp(frac, 0.05, 0.04)),
        _blend(t_dec * 1.12, long_step * 1.08, _ramp(frac, 0.01, 0.01)),
    )
    # E2E does not depend on where the wait is counted: what TTFT waits through, the decode
    # phase does not (and at least every token takes a decode step).
    e2e50 = max(cohort_step + (osl - 1) * step, ttft50 + (osl - 1) * t_dec)
    spread95, spread99 = 0.02 + 0.06 * share, 0.04 + 0.10 * share
    e2e = Percentiles(
        e2e50,
        e2e50 + (ttft.p95 - ttft50) + e2e50 * spread95,
        e2e50 + (ttft.p99 - ttft50) + e2e50 * spread99,
    )
    itl50 = (e2e50 - ttft50) / (osl - 1) if osl > 1 else t_dec
    itl = Percentiles(itl50, itl50 * (1 + spread95), itl50 * (1 + spread99))
    tps = b * osl / (e2e50 / 1e3)
    return Prediction(
        config=cfg,
        memory=mem,
        prefill_ms=t_pre,
        decode_step_ms=t_dec,
        ttft_ms=ttft,
        itl_ms=itl,
        e2e_ms=e2e,
        token_gap_ms=gaps,
        output_tokens_per_s=tps,
        output_tokens_per_s_per_gpu=tps / cfg.tp,
        prefill_share=share,
    )
