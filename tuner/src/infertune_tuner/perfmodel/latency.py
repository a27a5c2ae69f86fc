"""Latency/throughput model for continuous (in-flight) batching at a fixed concurrency.

Per engine step with B active sequences at average context c (per GPU, TP ranks in parallel):

    t_mem     = W_active / (BW * weight_bw) + B * c * kv_bytes_tok / (BW * kv_bw)
    t_compute = 2 * P_active/TP * B / (peak_q * gemm) + 4 * B * c * L * H/TP * d / (peak * gemm)
    t_comm    = 2 L * (ar_latency + 2 (TP-1)/TP * B * hidden * 2 bytes / (link_bw * link))
    t_decode  = max(t_mem, t_compute) + 0.3 * min(t_mem, t_compute) + t_comm
                + step_overhead + B * per_seq_overhead
    t_prefill = (2 * P_active/TP * ISL + 2 L * ISL^2 * hidden/TP) / (peak_q * prefill)
                + t_comm(ISL tokens)

Closed loop at concurrency B (each finished request is replaced at once). A step admits new
requests until their prompts fill the token budget (max_num_tokens = 8192), so k =
min(B, max_num_tokens // ISL) prefills share a step; with fixed lengths the loop settles into
B/k cohorts that finish, return and are admitted together:

    cohort    = t_decode(B) + k * t_prefill          (the step that carries a cohort's prefills)
    step      = t_decode(B) + (B-k)/OSL * t_prefill  (other cohorts' prefills, averaged)
    TTFT      = cohort
    E2E       = TTFT + (OSL-1) * step
    tok/s/GPU = B * OSL / E2E / TP

ITL percentiles land in the long (cohort) steps once their share of a request's gaps passes
1 - percentile. The simulated Triton server's engine (harness/engine.py) schedules the same way
step by step, so the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.models import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.perfmodel.factors import Efficiency, default_efficiency
from infertune_tuner.perfmodel.memory import (
    DEFAULT_MAX_NUM_TOKENS,
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
    itl_ms: Percentiles
    e2e_ms: Percentiles
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


class StepModel:
    """Step timings of one configuration; the simulated Triton server drives it step by step."""

    __slots__ = (
        "_act_params_gpu", "_all_expert_bytes", "_attn_bytes", "_bw", "_comm_bytes_per_token",
        "_eff", "_kv_tok", "_link_bw", "_model", "_peak", "_peak16", "_tp", "_weights",
    )  # fmt: skip

    def __init__(
        self, model: ModelArch, gpu: Gpu, cfg: TrialConfig, eff: Efficiency | None = None
    ) -> None:
        q = QUANTIZATIONS[cfg.quantization]
        self._model = model
        self._tp = cfg.tp
        self._eff = eff or default_efficiency(gpu.architecture)
        self._bw = gpu.hbm_bandwidth_gbs * 1e9
        self._peak = gpu.tflops(q.compute) * 1e12 * q.compute_efficiency
        self._peak16 = gpu.bf16_tflops * 1e12
        self._link_bw = gpu.link_bandwidth_gbs * 1e9
        self._weights = weight_bytes_per_gpu(model, cfg.tp, cfg.quantization)
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
        tp = self._tp
        if tp <= 1:
            return 0.0
        e = self._eff
        per = e.allreduce_latency_us * 1e-6 + 2 * (tp - 1) / tp * tokens * (
            self._comm_bytes_per_token
        ) / (self._link_bw * e.link)
        return 2 * self._model.layers * per * 1e3

    def decode_ms(self, batch: float, avg_context: float) -> float:
        """One decode step for `batch` sequences at average context `avg_context`."""
        e, m = self._eff, self._model
        t_mem = self._weight_bytes_read(batch) / (self._bw * e.weight_bw) + (
            batch * avg_context * self._kv_tok / (self._bw * e.kv_bw)
        )
        attn_flops = 4 * batch * avg_context * m.layers * m.hidden_size / self._tp
        t_cmp = 2 * self._act_params_gpu * batch / (self._peak * e.gemm) + attn_flops / (
            self._peak16 * e.gemm
        )
        hi, lo = (t_mem, t_cmp) if t_mem >= t_cmp else (t_cmp, t_mem)
        return (
            (hi + OVERLAP * lo) * 1e3
            + self.comm_ms(batch)
            + e.step_overhead_ms
            + batch * e.per_seq_overhead_us * 1e-3
        )

    def prefill_ms(self, tokens: float) -> float:
        """Prefill of `tokens` prompt tokens (one request, or a chunk of several)."""
        m = self._model
        flops = 2 * self._act_params_gpu * tokens + 2 * m.layers * tokens**2 * m.hidden_size / (
            self._tp
        )
        return flops / (self._peak * self._eff.prefill) * 1e3 + self.comm_ms(tokens)


def predict(
    model: ModelArch,
    gpu: Gpu,
    cfg: TrialConfig,
    workload: Workload,
    eff: Efficiency | None = None,
    reserve_gib: float | None = None,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
) -> Prediction:
    """Typical (p50) and tail latencies and throughput of `cfg` under a closed-loop load."""
    mem = estimate_memory(
        model, gpu, cfg, workload, max_num_tokens,
        RESERVE_GIB if reserve_gib is None else reserve_gib,
    )  # fmt: skip
    steps = StepModel(model, gpu, cfg, eff)
    b = cfg.max_batch_size
    isl, osl = workload.input_tokens, workload.output_tokens
    t_pre = steps.prefill_ms(isl)
    t_dec = steps.decode_ms(b, isl + osl / 2)
    # Admission: one engine step takes new requests until their prompts fill the token budget
    # (max_num_tokens, minus one token per decoding sequence), so up to k prefills share a step.
    # With fixed lengths a closed loop settles into cohorts of k requests that finish, return
    # and are admitted together: each cohort's TTFT is the step that carries its k prefills.
    k = max(1, min(b, max_num_tokens // isl))
    cohorts = math.ceil(b / k)
    cohort_step = t_dec + k * t_pre
    interference = (b - k) / osl * t_pre  # other cohorts' prefills, averaged over the steps
    step = t_dec + interference
    share = interference / step
    ttft50 = cohort_step
    ttft = Percentiles(
        ttft50,
        ttft50 * 1.05 + k * t_pre * min(1.0, 2 * cohorts / osl),
        ttft50 * 1.10 + k * t_pre * min(1.0, 4 * cohorts / osl),
    )
    # ITL: a request's gaps are short decode steps, except where another cohort's prefills
    # ride along; a percentile lands in those long gaps once their share passes
    # 1 - percentile (ramped, since real step times blur).
    frac = min(1.0, (cohorts - 1) / osl)
    long_step = cohort_step
    itl = Percentiles(
        _blend(t_dec, long_step, _ramp(frac, 0.5, 0.1)),
        _blend(t_dec * 1.06, long_step, _ramp(frac, 0.05, 0.04)),
        _blend(t_dec * 1.12, long_step * 1.08, _ramp(frac, 0.01, 0.01)),
    )
    e2e50 = ttft50 + (osl - 1) * step
    e2e = Percentiles(
        e2e50,
        e2e50 + (ttft.p95 - ttft50) + e2e50 * (0.02 + 0.06 * share),
        e2e50 + (ttft.p99 - ttft50) + e2e50 * (0.04 + 0.10 * share),
    )
    tps = b * osl / (e2e50 / 1e3)
    return Prediction(
        config=cfg,
        memory=mem,
        prefill_ms=t_pre,
        decode_step_ms=t_dec,
        ttft_ms=ttft,
        itl_ms=itl,
        e2e_ms=e2e,
        output_tokens_per_s=tps,
        output_tokens_per_s_per_gpu=tps / cfg.tp,
        prefill_share=share,
    )
