"""The performance model against published measurements, per stack.

Fitted points: TensorRT-LLM's perf-overview tables (NVIDIA/TensorRT-LLM, perf-overview of
releases 1.0.0 / 1.1.0 for H100 and release/1.2 for B200), FP8/FP16 speedups by batch size
(NVIDIA/TensorRT-LLM docs/source/blogs/quantization-in-TRT-LLM.md; Baseten) and the 2023
Llama-2-70B sweep (Perplexity). H200 rows are held out. The figures and their citations are in
infertune_tuner/perfmodel/{perf_overview,quant_speedups,reference}.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import get_model
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.perfmodel import predict
from infertune_tuner.perfmodel.factors import BORROWED, default_efficiency
from infertune_tuner.perfmodel.fit import ALL_POINTS, FITS, discordant, generation
from infertune_tuner.perfmodel.maxload import bench_max_num_tokens
from infertune_tuner.perfmodel.points import SpeedupPoint, ThroughputPoint
from infertune_tuner.perfmodel.residuals import Residual, markdown, residuals

REPO = Path(__file__).resolve().parents[2]
COMMITTED = {s: {g: default_efficiency(g, s) for g in fit.generations} for s, fit in FITS.items()}
RESIDUALS = residuals(COMMITTED)


def _by_role(role: str, kind: type) -> list[Residual]:
    return [r for r in RESIDUALS if r.point.source.role == role and isinstance(r.point, kind)]


def _id(r: Residual) -> str:
    return f"{r.point.source.key}-{r.point.gpu}-{r.point.label()}".replace(" ", "_")


@pytest.mark.parametrize("r", _by_role("fit", ThroughputPoint), ids=_id)
def test_every_fitted_throughput_within_25_percent(r: Residual) -> None:
    assert r.error is not None, "predicted not to fit in memory"
    assert abs(r.error) <= 0.25
    if r.e2e_error is not None:
        assert abs(r.e2e_error) <= 0.25


def test_the_previous_sweep_still_holds_under_its_own_stack() -> None:
    old = [r for r in _by_role("fit", ThroughputPoint) if r.point.source.stack == "trtllm-0.5"]
    assert len(old) == 7
    assert all(r.error is not None and abs(r.error) <= 0.25 for r in old)


def test_ranking_of_each_sources_points_on_a_gpu_is_preserved() -> None:
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in _by_role("fit", ThroughputPoint):
        assert r.predicted is not None
        series.setdefault((r.point.source.key, r.point.gpu), []).append((r.published, r.predicted))
    assert len(series) == 5
    for key, pairs in series.items():
        assert discordant(pairs) == [], key


@pytest.mark.parametrize("r", _by_role("fit", SpeedupPoint), ids=_id)
def test_fp8_over_fp16_speedup_by_batch_within_10_percent(r: Residual) -> None:
    assert r.error is not None and abs(r.error) <= 0.10


def _gain(model: str, tp: int, bs: int, quant: str, metric: str, isl: int, osl: int) -> float:
    """FP16 time over `quant` time (p50) on H100 under the default stack."""
    m, g, w = get_model(model), get_gpu("H100-SXM-80GB"), Workload(isl, osl)
    fp16 = predict(m, g, TrialConfig(tp, bs, "fp16", "auto"), w)
    other = predict(m, g, TrialConfig(tp, bs, quant, "auto"), w)
    return float(getattr(fp16, f"{metric}_ms").p50 / getattr(other, f"{metric}_ms").p50)


def test_fp8_gain_is_large_at_small_batch_and_fades_at_large_batch() -> None:
    # Published FP8/FP16: 1.51x (batch 1) and 1.40x (batch 8) end to end for Llama-2-7B at
    # 1024/128, 1.33x per output token at batch 32 (Mistral 7B), 1.10x at batch 128 (Llama-2-70B,
    # TP8): about 30 % less time per token below batch 8, about 10 % at large batch.
    per_token = {bs: _gain("llama-2-7b", 1, bs, "fp8", "itl", 1024, 128) for bs in (1, 8, 32, 64)}
    assert all(1.35 < per_token[bs] < 1.6 for bs in (1, 8))
    assert per_token[8] > per_token[32] > per_token[64]
    large = _gain("llama-2-70b", 8, 128, "fp8", "e2e", 1024, 512)
    assert large < 1.25
    assert large < _gain("llama-2-70b", 8, 8, "fp8", "e2e", 1024, 512) - 0.2


def test_w4a16_gain_is_high_at_small_batch_and_low_at_large_batch() -> None:
    # NVIDIA/TensorRT-LLM docs/source/blogs/quantization-in-TRT-LLM.md, "best practices" table:
    # INT4 AWQ (W4A16) improves performance "High" at batch <= 4 and "Low" at batch >= 16 (end to
    # end, the blog's 1024 in / 128 out): 4-bit weights cut decode's bytes but pay dequantisation
    # in the GEMMs, which dominate prefill and large batches.
    def gain(bs: int) -> float:
        return _gain("llama-2-70b", 4, bs, "w4a16_awq", "e2e", 1024, 128)

    assert gain(1) > 2.0 and gain(4) > 1.8
    assert gain(64) < 1.3
    assert gain(1) > gain(4) > gain(16) > gain(64)


def test_h200_holdout_error_is_reported_and_moderate() -> None:
    held = _by_role("holdout", ThroughputPoint)
    assert {r.point.gpu for r in held} == {"H200-SXM-141GB"}
    assert len([r for r in held if r.point.source.key == "trtllm-1.2-h200"]) == 4
    errors = [abs(r.error) for r in held if r.error is not None]
    assert len(errors) == len(held)
    assert sum(errors) / len(errors) < 0.2  # never fitted: a regression guard, not a target


def test_fitted_sources_never_include_h200() -> None:
    for fit in FITS.values():
        assert all(p.gpu != "H200-SXM-141GB" for p in fit.fitted_points)


@pytest.mark.parametrize("stack", sorted(FITS))
def test_committed_factors_are_where_the_fit_ends(stack: str) -> None:
    """benchmarks/calibrate.py ends its fit with `polish` repeated until it stops moving; the
    committed factors must be such an end point: polishing them again changes nothing."""
    fit = FITS[stack]
    committed = fit.committed()
    assert fit.polish(committed) == committed


def test_docs_table_is_the_calibration_scripts_output() -> None:
    docs = (REPO / "docs/performance-model.md").read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN calibrate.py output -->\n", "<!-- END calibrate.py output -->"
    assert begin in docs and end in docs
    assert docs.split(begin, 1)[1].split(end, 1)[0] == markdown(COMMITTED)


def test_every_point_has_its_citation_and_a_calibrated_generation() -> None:
    for p in ALL_POINTS:
        assert p.source.where and p.source.title
        assert BORROWED[p.source.stack][generation(p)] == generation(p)


def test_max_num_tokens_follows_trtllm_bench() -> None:
    # NVIDIA/TensorRT-LLM tensorrt_llm/bench/build/tuning.py (finetune_setting) and
    # tensorrt_llm/bench/benchmark/utils/general.py (no chunked prefill: at least ISL + batch).
    assert bench_max_num_tokens(250, 1000, 1000) == 2048  # 500 -> the 2048 floor
    assert bench_max_num_tokens(1536, 1024, 1024) == 3072  # 3072, in 256-token steps
    assert bench_max_num_tokens(463, 2048, 128) == 8192  # 7871 -> 512-token steps
    assert bench_max_num_tokens(1000, 1024, 128) == 9216  # 9000 -> 1024-token steps
    assert bench_max_num_tokens(4096, 8192, 128) == 32768  # capped
    assert bench_max_num_tokens(22, 20000, 2000) == 20022  # a whole prompt per step


def test_physical_trends() -> None:
    m, g = get_model("llama-2-70b"), get_gpu("H100-SXM-80GB")
    w = Workload(1024, 512)

    def at(tp: int, b: int, q: str = "fp8"):  # type: ignore[no-untyped-def]
        return predict(m, g, TrialConfig(tp, b, q, "auto"), w)

    # Batching raises throughput and latency; more TP lowers latency and per-GPU throughput.
    assert at(2, 128).output_tokens_per_s_per_gpu > at(2, 32).output_tokens_per_s_per_gpu
    assert at(2, 128).e2e_ms.p50 > at(2, 32).e2e_ms.p50
    assert at(8, 128).e2e_ms.p50 < at(2, 128).e2e_ms.p50
    assert at(8, 128).output_tokens_per_s_per_gpu < at(2, 128).output_tokens_per_s_per_gpu
    # fp8 beats fp16 at the same shape; tails are above medians.
    assert at(8, 64).output_tokens_per_s_per_gpu > at(8, 64, "fp16").output_tokens_per_s_per_gpu
    p = at(4, 64)
    for pct in (p.ttft_ms, p.itl_ms, p.e2e_ms):
        assert pct.p50 <= pct.p95 <= pct.p99


def test_the_modern_stack_is_faster_than_the_2023_one() -> None:
    m, g, w = get_model("llama-2-70b"), get_gpu("H100-SXM-80GB"), Workload(1024, 512)
    cfg = TrialConfig(2, 128, "fp8", "auto")
    old = predict(m, g, cfg, w, stack="trtllm-0.5").output_tokens_per_s_per_gpu
    new = predict(m, g, cfg, w).output_tokens_per_s_per_gpu
    assert new > 1.3 * old
