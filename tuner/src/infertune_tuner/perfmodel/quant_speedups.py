"""Published FP8-over-FP16 speedups by batch size on H100 (quantization x batch).

FP8 halves the weight bytes (the whole story of small-batch decode) and doubles tensor-core peak;
its gain fades once decode is bound by the KV cache, by compute or by fixed per-step costs. These
points pin that shape:

- NVIDIA/TensorRT-LLM `docs/source/blogs/quantization-in-TRT-LLM.md` ("Speed up inference with
  SOTA quantization techniques in TRT-LLM"), table "Performance": LLaMA-v2-7B on H100 80GB, TP1,
  input 1024 / output 128, FP8 vs FP16 speedup 1.51x at batch 1 and 1.40x at batch 8 (end to
  end). FP8 engines of that era ran an FP8 KV cache (`--fp8_kv_cache` in the perf docs).
- Baseten, "33% faster LLM inference with FP8 quantization" (Mistral 7B on H100, TensorRT-LLM,
  32 concurrent requests, 80 input / 100 output tokens): +33 % output tokens/s per request
  (time per output token), -8.5 % time to first token. KV dtype not stated: 16-bit assumed.
  The TTFT point is only shown: with 80-token prompts a client-measured TTFT is mostly serving
  and network time that FP8 does not touch, while the model's TTFT is the prefill of a cohort of
  32 prompts, which FP8 halves (see docs/performance-model.md).
- The Llama-2-70B sweep (`reference.py`, stack `trtllm-0.5`): FP8 251 % vs FP16 228 % of the
  baseline at TP8, batch 128, 1024 / 512 -> 1.10x (about 10 % at large batch).

The 7B points were measured on TensorRT-LLM 0.7-0.9 engine builds, but TensorRT-LLM 1.x
publishes no 16-bit runs at all: they are fitted with the `trtllm-1.2` stack, whose FP8-vs-16-bit
relative compute efficiency (`low_precision`) nothing else pins down. The 70B point belongs to
its own sweep's stack, `trtllm-0.5`.
"""

from __future__ import annotations

from infertune_tuner.perfmodel.points import Source, SpeedupPoint
from infertune_tuner.perfmodel.reference import BASELINE_TPS, SWEEP

NVIDIA_BLOG = Source(
    "trtllm-quant-blog", "trtllm-1.2", "fit",
    "TensorRT-LLM blog: Speed up inference with SOTA quantization techniques in TRT-LLM",
    "NVIDIA/TensorRT-LLM docs/source/blogs/quantization-in-TRT-LLM.md",
)  # fmt: skip
_BASETEN_TITLE = "Baseten: 33% faster LLM inference with FP8 quantization (Mistral 7B, H100)"
_BASETEN_URL = "https://www.baseten.co/blog/33-faster-llm-inference-with-fp8-quantization/"
BASETEN = Source("baseten-fp8", "trtllm-1.2", "fit", _BASETEN_TITLE, _BASETEN_URL)
BASETEN_TTFT = Source("baseten-fp8-ttft", "trtllm-1.2", "shown", _BASETEN_TITLE, _BASETEN_URL)

H100 = "H100-SXM-80GB"

POINTS: tuple[SpeedupPoint, ...] = (
    SpeedupPoint(NVIDIA_BLOG, "llama-2-7b", H100, 1, 1, 1024, 128, "e2e", 1.51),
    SpeedupPoint(NVIDIA_BLOG, "llama-2-7b", H100, 1, 8, 1024, 128, "e2e", 1.40),
    SpeedupPoint(BASETEN, "mistral-7b", H100, 1, 32, 80, 100, "itl", 1.33, "auto",
                 "+33 % output tokens/s per request"),
    SpeedupPoint(BASETEN_TTFT, "mistral-7b", H100, 1, 32, 80, 100, "ttft", 1 / (1 - 0.085), "auto",
                 "-8.5 % time to first token"),
    SpeedupPoint(SWEEP, "llama-2-70b", H100, 8, 128, 1024, 512, "e2e", 2.51 / 2.28, "auto",
                 f"251 % vs 228 % of {BASELINE_TPS:.0f} tok/s/GPU"),
)  # fmt: skip
