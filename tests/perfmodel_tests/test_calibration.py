"""The model against the public Llama-2-70B A100/H100 sweep: +-25 % and the same ranking."""

from __future__ import annotations

import pytest

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.models import get_model
from infertune_tuner.perfmodel import predict
from infertune_tuner.perfmodel.reference import MODEL, POINTS, WORKLOAD


def _predict(point):  # type: ignore[no-untyped-def]
    return predict(get_model(MODEL), get_gpu(point.gpu), point.config, WORKLOAD)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.gpu}-{p.config.label()}")
def test_within_25_percent(point) -> None:  # type: ignore[no-untyped-def]
    p = _predict(point)
    assert p.fits
    assert p.output_tokens_per_s_per_gpu == pytest.approx(point.tokens_per_s_per_gpu, rel=0.25)
    assert p.e2e_ms.p50 == pytest.approx(point.e2e_ms, rel=0.25)


def test_same_ranking_as_published() -> None:
    published = sorted(POINTS, key=lambda p: -p.tokens_per_s_per_gpu)
    predicted = sorted(POINTS, key=lambda p: -_predict(p).output_tokens_per_s_per_gpu)
    assert [p.config for p in predicted] == [p.config for p in published]


def test_physical_trends() -> None:
    m, g = get_model("llama-2-70b"), get_gpu("H100-SXM-80GB")
    from infertune_tuner.config import TrialConfig

    def at(tp: int, b: int, q: str = "fp8"):  # type: ignore[no-untyped-def]
        return predict(m, g, TrialConfig(tp, b, q, "auto"), WORKLOAD)

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
