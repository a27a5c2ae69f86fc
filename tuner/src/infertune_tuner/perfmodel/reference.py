"""The public Llama-2-70B A100/H100 sweep (stack `trtllm-0.5`).

Perplexity, "Turbocharging Llama 2 70B with NVIDIA H100" (Nov 2023): pplx-api on TensorRT-LLM
v0.5, 1024 in / 512 out, closed loop at concurrency = max batch. Direct figures are quoted;
derived ones follow from the write-up's ratios, all against A100/fp16/TP8/BS64 = 767 / 4.60
tok/s/GPU:

- H100 fp8  TP8 BS128: 251 % of the baseline             -> 418 tok/s/GPU
- H100 fp16 TP8 BS128: 228 % of the baseline             -> 380 tok/s/GPU
- A100 fp16 TP8 BS128: 767 / 3.73 (TP2 fp8 is 373 % of it) -> 206 tok/s/GPU
- latency of a derived point: closed loop, so E2E = BS x 512 / (tok/s/GPU x TP); this matches
  the write-up's "H100 reaches 54 % (fp16) / 49 % (fp8) of A100's latency at BS128 TP8".

The fp8 KV dtype of the sweep is not stated; the points use a 16-bit KV cache ("auto").
"""

from __future__ import annotations

from infertune_tuner.perfmodel.points import Source, ThroughputPoint

SWEEP = Source(
    key="pplx-2023",
    stack="trtllm-0.5",
    role="fit",
    title="Perplexity, Turbocharging Llama 2 70B with NVIDIA H100 (TensorRT-LLM v0.5, Nov 2023)",
    where="https://blog.perplexity.ai/blog/turbocharging-llama-2-70b-with-nvidia-h100",
)
MODEL = "llama-2-70b"
ISL, OSL = 1024, 512
BASELINE_TPS = 767 / 4.60


def _derived_latency(tps: float, tp: int, batch: int) -> float:
    return batch * OSL / (tps * tp) * 1e3


def _pt(
    gpu: str, q: str, tp: int, bs: int, tps: float, e2e: float | None, note: str
) -> ThroughputPoint:
    return ThroughputPoint(
        SWEEP, MODEL, gpu, q, "auto", tp, ISL, OSL, tps, batch=bs,
        published_latency_ms=e2e if e2e else _derived_latency(tps, tp, bs), note=note,
    )  # fmt: skip


POINTS: tuple[ThroughputPoint, ...] = (
    _pt("H100-SXM-80GB", "fp8", 2, 128, 767, 42000, "quoted: 767 tok/s/GPU, ~42000 ms"),
    _pt("H100-SXM-80GB", "fp8", 4, 128, 626, 26188, "quoted: 626 tok/s/GPU at 26188 ms"),
    _pt("H100-SXM-80GB", "fp8", 2, 32, 435, 18821, "quoted: 435 tok/s/GPU at 18821 ms"),
    _pt("H100-SXM-80GB", "fp8", 8, 128, 2.51 * BASELINE_TPS, None, "derived: 251 % of baseline"),
    _pt("H100-SXM-80GB", "fp16", 8, 128, 2.28 * BASELINE_TPS, None, "derived: 228 % of baseline"),
    _pt("A100-SXM-80GB", "fp16", 8, 64, BASELINE_TPS, None, "derived: baseline = 767 / 4.60"),
    _pt("A100-SXM-80GB", "fp16", 8, 128, 767 / 3.73, None, "derived: TP2 fp8 is 373 % of it"),
)
