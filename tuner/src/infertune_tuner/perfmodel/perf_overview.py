"""TensorRT-LLM perf-overview figures (stack `trtllm-1.2`): output tokens/s per GPU at maximum
load, `trtllm-bench throughput` on the PyTorch backend, synthetic requests of fixed input/output
length, NVIDIA's ModelOpt FP8/NVFP4 checkpoints.

Transcribed from the published documents (NVIDIA/TensorRT-LLM, the perf overview of each release
as built on the project's documentation site, nvidia.github.io/TensorRT-LLM/<version>/):

- 1.0.0: `performance/perf-overview.html` (source `docs/source/performance/perf-overview.md`),
  metric "Total Output Throughput (tokens/sec)", here divided by the GPU count (TP).
- 1.1.0: `developer-guide/perf-overview.html` (source
  `docs/source/developer-guide/perf-overview.md`), metric "Output Throughput per GPU".
- release/1.2: `1.2.0/developer-guide/perf-overview.html` (same source path), per GPU; the
  Blackwell rows are also in reference/trtllm-1.2-perf-overview.csv.

The H100 rows come from 1.0.0 and 1.1.0 because release/1.2 no longer publishes H100; where
both have a shape the newer one is used. H200 rows (1.0.0 and release/1.2) are held out: the fit
never sees them, calibrate.py reports its error on them.

KV cache: FP8 for every row. The FP8/NVFP4 ModelOpt checkpoints declare an FP8 KV cache and
trtllm-bench maps FP8/NVFP4 checkpoints to an FP8 KV cache when none is given
(`tensorrt_llm/bench/benchmark/utils/general.py`).

Rows the model cannot express faithfully are left out (see docs/performance-model.md):
attention data parallelism + expert parallelism (DEP*: DeepSeek R1, Qwen3 235B, GPT-OSS 120B,
Llama 4), pipeline parallelism (RTX 6000 Pro rows), GPT-OSS (sliding-window attention on half
the layers, attention sinks, MXFP4 experts), DeepSeek (MLA), Llama 4 (chunked attention,
interleaved MoE), and the RTX 6000 Pro Blackwell Server Edition (not in the GPU catalog).
"""

from __future__ import annotations

from infertune_tuner.perfmodel.points import Role, Source, ThroughputPoint

_PAGES = {  # release -> its published perf-overview page
    "1.0.0": "1.0.0/performance/perf-overview.html",
    "1.1.0": "1.1.0/developer-guide/perf-overview.html",
    "release/1.2": "1.2.0/developer-guide/perf-overview.html",
}


def _source(key: str, role: Role, release: str, gpu: str) -> Source:
    return Source(
        key, "trtllm-1.2", role, f"TensorRT-LLM {release} perf overview ({gpu})",
        "NVIDIA/TensorRT-LLM docs, nvidia.github.io/TensorRT-LLM/" + _PAGES[release],
    )  # fmt: skip


V100 = _source("trtllm-1.0.0", "fit", "1.0.0", "H100")
V110 = _source("trtllm-1.1.0", "fit", "1.1.0", "H100")
V120 = _source("trtllm-1.2", "fit", "release/1.2", "B200")
HOLDOUT_120 = _source("trtllm-1.2-h200", "holdout", "release/1.2", "H200")
HOLDOUT_100 = _source("trtllm-1.0.0-h200", "holdout", "1.0.0", "H200")

_SHAPES_100 = ("128/2048", "128/4096", "500/2000", "1000/1000", "1000/2000", "2048/128",
               "2048/2048", "5000/500", "20000/2000")  # fmt: skip

# (source, model, GPU, quantization, TP, published total over all GPUs?, {ISL/OSL: figure})
# fmt: off
_TABLES: tuple[tuple[Source, str, str, str, int, bool, dict[str, float]], ...] = (
    # 1.0.0, "Llama 3.1 8B": H100 TP1 (FP8), total tokens/s
    (V100, "llama-3.1-8b", "H100-SXM-80GB", "fp8", 1, True, dict(zip(_SHAPES_100, (
        22714, 14325, 17660, 15220, 13899, 3450, 9305, 3459, 1351), strict=True))),
    # 1.0.0, "Llama 3.3 70B": H100 TP2 (FP8), total; 1000/1000 superseded by 1.1.0 below
    (V100, "llama-3.1-70b", "H100-SXM-80GB", "fp8", 2, True, {
        "128/2048": 6651, "128/4096": 4199, "500/2000": 5222, "1000/2000": 4146,
        "2048/128": 762, "2048/2048": 3082, "5000/500": 898, "20000/2000": 437}),
    # 1.1.0, "LLaMA v3.3 70B": H100 TP2 (FP8), per GPU
    (V110, "llama-3.1-70b", "H100-SXM-80GB", "fp8", 2, False, {
        "1000/1000": 2209, "8192/1024": 398}),
    # 1.0.0, "Llama 3.1 405B": H100 TP8 (FP8), total
    (V100, "llama-3.1-405b", "H100-SXM-80GB", "fp8", 8, True, dict(zip(_SHAPES_100, (
        4340, 3116, 3994, 2919, 2895, 453, 2296, 610, 345), strict=True))),
    # release/1.2, "LLaMA v3.3 70B": B200 TP1 (FP4), per GPU
    (V120, "llama-3.1-70b", "B200-SXM-192GB", "nvfp4", 1, False, {
        "1024/1024": 6943, "1024/8192": 3270, "8192/1024": 1347, "32768/1024": 279}),
    # release/1.2, "Qwen3 30B A3B": B200 TP1 (FP4), per GPU
    (V120, "qwen3-30b-a3b", "B200-SXM-192GB", "nvfp4", 1, False, {
        "1024/1024": 26431, "1024/8192": 13940, "1024/32768": 4570, "8192/1024": 5945,
        "32768/1024": 1284}),
    # Held out. release/1.2, "LLaMA v3.3 70B": H200 TP2 (FP8), per GPU
    (HOLDOUT_120, "llama-3.1-70b", "H200-SXM-141GB", "fp8", 2, False, {
        "1024/1024": 2637, "1024/8192": 1995, "8192/1024": 544, "32768/1024": 120}),
    # Held out. 1.0.0: H200 TP1 (8B), TP1 (70B), TP8 (405B), FP8, total
    (HOLDOUT_100, "llama-3.1-8b", "H200-SXM-141GB", "fp8", 1, True, dict(zip(_SHAPES_100, (
        26221, 18027, 20770, 17744, 16828, 3538, 12194, 3902, 1804), strict=True))),
    (HOLDOUT_100, "llama-3.1-70b", "H200-SXM-141GB", "fp8", 1, True, dict(zip(_SHAPES_100, (
        4336, 2872, 3666, 2909, 2994, 442, 2003, 566, 283), strict=True))),
    (HOLDOUT_100, "llama-3.1-405b", "H200-SXM-141GB", "fp8", 8, True, dict(zip(_SHAPES_100, (
        5348, 4741, 4724, 3330, 3722, 456, 2948, 650, 505), strict=True))),
)
# fmt: on


def _points() -> tuple[ThroughputPoint, ...]:
    out = []
    for source, model, gpu, quant, tp, total, table in _TABLES:
        for shape, figure in table.items():
            isl, osl = (int(x) for x in shape.split("/"))
            per_gpu = figure / tp if total else figure
            note = f"{figure:,.0f} tok/s over {tp} GPUs" if total and tp > 1 else ""
            out.append(ThroughputPoint(
                source, model, gpu, quant, "fp8", tp, isl, osl, per_gpu, note=note,
            ))  # fmt: skip
    return tuple(out)


POINTS: tuple[ThroughputPoint, ...] = _points()
