"""The simulated engine's continuous batching, step by step (pure, virtual time)."""

from __future__ import annotations

import pytest

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import get_model
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.engine import (
    Engine,
    Sequence,
    kv_capacity_tokens,
    modelled_steady_state,
    oom_message,
)
from infertune_tuner.perfmodel.latency import StepModel, predict

MODEL = get_model("llama-3-8b")
GPU = get_gpu("H100-SXM-80GB")
CFG = TrialConfig(1, 4, "fp8", "auto")


def engine(max_batch: int = 4, kv_capacity: int = 10**9, scale: float = 1.0) -> Engine:
    return Engine(StepModel(MODEL, GPU, CFG), max_batch, kv_capacity, scale)


def test_step_admits_up_to_max_batch_and_charges_their_prefill() -> None:
    e = engine(max_batch=2)
    seqs = [Sequence(100, 3, handle=i) for i in range(3)]
    for s in seqs:
        assert e.submit(s) is None
    dur, admitted = e.begin_step()
    assert admitted == seqs[:2]
    steps = StepModel(MODEL, GPU, CFG)
    # Prefills run inside the step, which then runs without CUDA graphs (its extra overhead).
    ctx = steps.context_step_overhead_ms
    expected = steps.decode_ms(2, 100) + 2 * steps.prefill_ms(100) + ctx
    assert dur == pytest.approx(expected / 1e3)
    out = e.end_step(0.0)
    assert [o.seq.handle for o in out] == [0, 1] and not any(o.final for o in out)
    assert [s.generated for s in seqs] == [1, 1, 0]  # the third waits beyond max batch
    # next step: pure decode at context 101, the queued request still waits
    dur, admitted = e.begin_step()
    assert admitted == []
    assert dur == pytest.approx(steps.decode_ms(2, 101) / 1e3)


def test_finished_sequences_leave_and_queued_ones_take_their_place() -> None:
    e = engine(max_batch=1)
    a, b = Sequence(10, 2, handle="a"), Sequence(10, 1, handle="b")
    e.submit(a)
    e.submit(b)
    finals = []
    for _ in range(3):
        e.begin_step()
        finals += [o.seq.handle for o in e.end_step(0.0) if o.final]
    assert finals == ["a", "b"]
    assert not e.has_work()


def test_time_scale_multiplies_step_time() -> None:
    fast, slow = engine(scale=0.1), engine(scale=1.0)
    for e in (fast, slow):
        e.submit(Sequence(50, 2))
    assert fast.begin_step()[0] == pytest.approx(slow.begin_step()[0] * 0.1)


def test_kv_cache_capacity_queues_and_rejects() -> None:
    e = engine(max_batch=8, kv_capacity=128)
    assert e.submit(Sequence(60, 4)) is None  # 64 tokens = 2 pages
    assert e.submit(Sequence(60, 4)) is None
    assert e.submit(Sequence(60, 4)) is None  # would be 192 > 128: waits for pages
    _, admitted = e.begin_step()
    assert len(admitted) == 2
    err = e.submit(Sequence(200, 10))
    assert err is not None and "KV-cache" in err


def test_cancelled_sequences_are_dropped() -> None:
    e = engine()
    s = Sequence(10, 5)
    e.submit(s)
    e.begin_step()
    s.cancelled = True
    assert e.end_step(0.0) == []
    assert not e.has_work()


def test_modelled_steady_state_matches_the_step_arithmetic() -> None:
    """Closed loop, concurrency = max batch = 4, 8 output tokens: a prefill step, then 7 decode
    steps at contexts isl+1 .. isl+7."""
    isl, osl = 200, 8
    r = modelled_steady_state(MODEL, GPU, CFG, Workload(isl, osl), concurrency=4, requests=8)
    steps = StepModel(MODEL, GPU, CFG)
    first = steps.decode_ms(4, isl) + 4 * steps.prefill_ms(isl) + steps.context_step_overhead_ms
    gaps = [steps.decode_ms(4, isl + k) for k in range(1, osl)]
    assert r.requests == 8 and r.errors == 0
    assert r.ttft_ms is not None and r.itl_ms is not None and r.e2e_ms is not None
    assert r.ttft_ms.p50 == pytest.approx(first)
    assert r.token_gap_ms is not None and r.token_gap_ms.p50 == pytest.approx(gaps[3])
    assert r.itl_ms.p50 == pytest.approx(sum(gaps) / (osl - 1))  # per request: the mean gap
    assert r.e2e_ms.p50 == pytest.approx(first + sum(gaps))
    assert r.output_tokens == 8 * osl


@pytest.mark.parametrize(
    ("model", "cfg", "isl", "osl"),
    [
        ("llama-3-8b", TrialConfig(1, 8, "bf16", "auto"), 512, 128),  # one cohort
        ("llama-3-8b", TrialConfig(1, 64, "fp8", "auto"), 512, 128),  # a train of 5 cohorts
        ("llama-3-8b", TrialConfig(1, 256, "fp8", "auto"), 512, 128),
        ("llama-2-70b", TrialConfig(4, 64, "fp8", "auto"), 1024, 512),
        ("llama-3-8b", TrialConfig(2, 128, "bf16", "auto"), 128, 1024),
    ],
)
def test_the_performance_model_agrees_with_the_engine(
    model: str, cfg: TrialConfig, isl: int, osl: int
) -> None:
    """`predict` (closed form) and the engine stepped in virtual time behind a client with a
    turnaround, warm-up left out as the load generator leaves it out: TTFT, per-request ITL and
    E2E p50 agree within 2 % wherever the KV cache holds the batch."""
    m, w = get_model(model), Workload(isl, osl)
    p = predict(m, GPU, cfg, w)
    b = cfg.max_batch_size
    r = modelled_steady_state(m, GPU, cfg, w, concurrency=b, requests=4 * b, warmup=b)
    assert r.ttft_ms is not None and r.itl_ms is not None and r.e2e_ms is not None
    assert p.ttft_ms.p50 == pytest.approx(r.ttft_ms.p50, rel=0.02)
    assert p.itl_ms.p50 == pytest.approx(r.itl_ms.p50, rel=0.02)
    assert p.e2e_ms.p50 == pytest.approx(r.e2e_ms.p50, rel=0.02)


def test_a_returning_request_waits_through_the_step_it_missed() -> None:
    """With an ideal client (zero turnaround) a cohort rejoins the very step its predecessor's
    last token ends; any real turnaround misses it and waits through the cohort ahead's
    admission step, which doubles TTFT in a train of cohorts (and is what real engines do)."""
    cfg, w = TrialConfig(1, 64, "fp8", "auto"), Workload(512, 128)
    real = modelled_steady_state(MODEL, GPU, cfg, w, concurrency=64, requests=256, warmup=64)
    ideal = modelled_steady_state(
        MODEL, GPU, cfg, w, concurrency=64, requests=256, warmup=64, client_turnaround_s=0.0
    )
    assert real.ttft_ms is not None and ideal.ttft_ms is not None
    assert real.ttft_ms.p50 == pytest.approx(2 * ideal.ttft_ms.p50, rel=0.05)
    assert real.e2e_ms is not None and ideal.e2e_ms is not None
    assert real.e2e_ms.p50 == pytest.approx(ideal.e2e_ms.p50, rel=0.02)  # only where it waits


def test_capacity_and_oom_follow_the_memory_model() -> None:
    assert kv_capacity_tokens(MODEL, GPU, CFG) > 100_000
    assert oom_message(MODEL, GPU, CFG) is None
    big = get_model("llama-2-70b")
    msg = oom_message(big, GPU, TrialConfig(1, 8, "bf16", "auto"))
    assert msg is not None and "CUDA out of memory" in msg
    assert kv_capacity_tokens(big, GPU, TrialConfig(1, 8, "bf16", "auto")) == 0
