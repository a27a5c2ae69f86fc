"""Trace -> statistics on hand-computed traces (the pure metrics module)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from infertune_tuner.harness.stats import StreamFacts, compute, percentile, summarize
from infertune_tuner.harness.stream import RunState
from infertune_tuner.harness.tokens import TokenSource
from infertune_tuner.harness.trace import RequestTrace


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def test_percentile_interpolates_linearly_between_ranks() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 0) == 1.0
    assert percentile(v, 50) == 2.5
    assert percentile(v, 100) == 4.0
    assert percentile(v, 95) == approx(3.85)
    assert percentile([7.0], 99) == 7.0


def test_percentile_matches_numpy_default_method() -> None:
    rng = random.Random(3)
    for n in (1, 2, 5, 17, 100):
        vals = sorted(rng.uniform(0, 100) for _ in range(n))
        for q in (50, 95, 99):
            assert percentile(vals, q) == approx(float(np.percentile(vals, q)))


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_none_for_no_values() -> None:
    assert summarize([]) is None
    s = summarize([3.0, 1.0, 2.0])
    assert s is not None
    assert (s.count, s.min, s.max, s.mean, s.p50) == (3, 1.0, 3.0, 2.0, 2.0)


def test_compute_on_hand_computed_traces() -> None:
    traces = [
        # TTFT 100 ms, E2E 300 ms, gaps 50, 100, 50 ms, 4 tokens
        RequestTrace(send_s=0.0, responses=(0.10, 0.15, 0.25, 0.30)),
        # TTFT 200 ms, E2E 300 ms, gap 100 ms, 2 tokens
        RequestTrace(send_s=1.0, responses=(1.2, 1.3)),
        # an error: counted, not completed, no latency samples
        RequestTrace(send_s=0.5, error="boom", end_s=0.9),
    ]
    r = compute(traces)
    assert r.requests == 2
    assert r.errors == 1
    assert r.error_samples == ["boom"]
    assert r.sent == 3
    assert r.output_tokens == 6
    assert r.ttft_ms is not None and r.itl_ms is not None and r.e2e_ms is not None
    # TTFT [100, 200]
    assert r.ttft_ms.p50 == approx(150.0)
    assert r.ttft_ms.p95 == approx(195.0)
    assert r.ttft_ms.p99 == approx(199.0)
    # ITL per request, GenAI-Perf's: (300-100)/3 and (300-200)/1
    assert r.itl_ms.count == 2
    assert (r.itl_ms.min, r.itl_ms.max) == (approx(200 / 3), approx(100.0))
    # pooled token gaps [50, 50, 100, 100]: reported beside it
    assert r.token_gap_ms is not None and r.token_gap_ms.count == 4
    assert r.token_gap_ms.p50 == approx(75.0)
    assert r.token_gap_ms.p95 == approx(100.0)
    # E2E [300, 300]
    assert r.e2e_ms.p50 == approx(300.0)
    assert r.e2e_ms.p99 == approx(300.0)
    # window: first send (0.0) -> last response/end (1.3)
    assert r.duration_s == approx(1.3)
    assert r.output_tokens_per_s == approx(6 / 1.3)


def test_the_definitions_are_genai_perfs() -> None:
    """GenAI-Perf's own worked example: triton-inference-server/perf_analyzer,
    genai-perf/tests/test_data_parser/test_llm_profile_data_parser.py (Triton, concurrency 10;
    timestamps in ns, output lengths 3 and 6 tokens), computed as
    genai-perf/genai_perf/profile_data_parser/llm_profile_data_parser.py does: ITL =
    (request latency - TTFT) / (output tokens - 1) per request with more than one response and
    more than one token; throughput = output tokens / (last response - first request)."""
    ns = 1e-9
    traces = [
        RequestTrace(send_s=1 * ns, responses=(3 * ns, 5 * ns, 8 * ns), tokens=(1, 1, 1)),
        RequestTrace(send_s=2 * ns, responses=(4 * ns, 7 * ns, 11 * ns), tokens=(1, 2, 3)),
    ]
    r = compute(traces)
    ms = 1e-6  # one ns in ms
    assert r.e2e_ms is not None and r.ttft_ms is not None and r.itl_ms is not None
    assert sorted([r.e2e_ms.min, r.e2e_ms.max]) == [approx(7 * ms), approx(9 * ms)]
    assert (r.ttft_ms.min, r.ttft_ms.max) == (approx(2 * ms), approx(2 * ms))
    # upstream: [((8 - 1) - 2) / (3 - 1), ((11 - 2) - 2) / (6 - 1)] = [2.5, 1.4] (it rounds to
    # whole ns: [2, 1])
    assert sorted([r.itl_ms.min, r.itl_ms.max]) == [approx(1.4 * ms), approx(2.5 * ms)]
    assert r.output_tokens == 9
    assert r.output_tokens_per_s == pytest.approx(9 / (10 * ns))  # 9 tokens over 11 - 1 ns


def test_a_short_output_is_flagged_and_e2e_is_taken_at_the_requested_length() -> None:
    # Asked for 10 tokens: one request stopped after 4 (TTFT 100 ms, then 50 ms per token).
    full = RequestTrace(send_s=0.0, responses=tuple(0.1 + 0.05 * i for i in range(10)))
    short = RequestTrace(send_s=0.0, responses=tuple(0.1 + 0.05 * i for i in range(4)))
    ok = compute([full, full], {"output_tokens": 10})
    assert ok.short_output is None and ok.short_output_note() is None
    assert ok.workload_latency()["e2e_ms"] == ok.e2e_ms
    r = compute([full, short], {"output_tokens": 10})
    assert r.output_tokens_mean == 7.0
    assert r.short_output == approx(0.3)
    assert r.e2e_ms is not None and r.e2e_ms.min == approx(250.0)  # what was measured
    # at the requested length both take 100 + 9 x 50 ms
    assert r.e2e_at_requested_ms is not None
    assert (r.e2e_at_requested_ms.min, r.e2e_at_requested_ms.max) == (approx(550.0), approx(550.0))
    assert r.workload_latency()["e2e_ms"] == r.e2e_at_requested_ms
    note = r.short_output_note()
    assert note is not None and "30% short of the 10 requested" in note
    # 5 % short is within tolerance
    nearly = RequestTrace(send_s=0.0, responses=tuple(0.1 + 0.05 * i for i in range(19)))
    assert compute([nearly], {"output_tokens": 20}).short_output is None


def test_responses_carrying_several_tokens_split_their_gap() -> None:
    t = RequestTrace(send_s=0.0, responses=(0.1, 0.2, 0.5), tokens=(2, 1, 3))
    assert t.output_tokens == 6
    assert t.gaps_s() == pytest.approx([0.0, 0.1, 0.1, 0.1, 0.1])


def test_a_stream_without_output_is_an_error() -> None:
    r = compute([RequestTrace(send_s=0.0), RequestTrace(send_s=0.0, responses=(0.2,))])
    assert (r.requests, r.errors) == (1, 1)
    assert r.error_samples == ["stream ended without output"]
    assert r.itl_ms is None and r.token_gap_ms is None  # one token: no gap
    assert r.ttft_ms is not None and r.ttft_ms.p50 == approx(200.0)


def test_error_samples_are_distinct_and_bounded() -> None:
    traces = [RequestTrace(send_s=0.0, error=f"e{i % 7}", end_s=0.1) for i in range(30)]
    r = compute(traces)
    assert r.errors == 30 and r.requests == 0
    assert r.error_samples == ["e0", "e1", "e2", "e3", "e4"]
    assert r.ttft_ms is None and r.output_tokens_per_s == 0.0


def test_server_reported_times_are_summarised_when_present() -> None:
    t = RequestTrace(send_s=0.0, responses=(0.1, 0.2), server=(0.01, 0.09, 0.19))
    r = compute([t])
    assert r.server_ttft_ms is not None and r.server_e2e_ms is not None
    assert r.server_ttft_ms.p50 == approx(80.0)
    assert r.server_e2e_ms.p50 == approx(180.0)


def test_json_shape() -> None:
    r = compute([RequestTrace(send_s=0.0, responses=(0.1, 0.2))], {"concurrency": 1})
    j = r.to_json()
    for key in ("requests", "errors", "error_samples", "output_tokens_per_s", "duration_s"):
        assert key in j
    for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(j[metric]) >= {"p50", "p95", "p99"}
    assert j["settings"] == {"concurrency": 1}


def test_throughput_divides_by_the_duration_of_completed_requests_only() -> None:
    """AIPerf's benchmark duration (aiperf/metrics/types/benchmark_duration_metric.py): first
    request to last response of the records without an error; failed requests are counted
    apart and widen nothing."""
    done = [
        RequestTrace(send_s=1.0, responses=(1.1, 1.2, 1.3)),
        RequestTrace(send_s=1.5, responses=(1.6, 1.7, 2.0)),
    ]
    early_failure = RequestTrace(send_s=0.0, error="boom", end_s=0.5)
    late_timeout = RequestTrace(send_s=1.9, responses=(2.2,), error="timeout", end_s=9.0)
    r = compute([early_failure, *done, late_timeout])
    assert (r.requests, r.errors) == (2, 2)
    assert r.duration_s == approx(1.0)  # 1.0 -> 2.0, not 0.0 -> 9.0
    assert r.output_tokens == 6 and r.output_tokens_per_s == approx(6.0)


def test_a_stalled_request_is_short_invalid_and_counted_apart() -> None:
    ok = RequestTrace(send_s=0.0, responses=(0.1, 0.2, 0.3, 0.4))
    stalled = RequestTrace(send_s=0.0, responses=(0.1, 0.2), stalled=True, end_s=5.0)
    r = compute([ok, stalled], {"output_tokens": 4}, StreamFacts(stall_bound_s=1.25))
    assert (r.requests, r.errors, r.stalled, r.sent) == (1, 0, 1, 2)
    assert r.stalled_tokens == (2, 2)
    assert r.output_tokens == 4 and r.duration_s == approx(0.4)  # no sample, no window
    note = r.stall_note()
    assert note is not None
    assert "1 of 2 requests stalled" in note and "over 1250 ms after 2 of 4 tokens" in note
    j = r.to_json()
    assert (j["stalled"], j["stall_bound_ms"]) == (1, approx(1250.0))
    assert compute([ok]).stall_note() is None


def test_the_run_says_when_it_counted_one_token_per_response() -> None:
    t = [RequestTrace(send_s=0.0, responses=(0.1, 0.2))]
    assumed = compute(t, None, StreamFacts(token_source=TokenSource.RESPONSES))
    assert assumed.to_json()["one_token_per_response_assumed"] is True
    assert "counted as one per response" in (assumed.token_note() or "")
    counted = compute(t, None, StreamFacts(token_source=TokenSource.NUM_OUTPUT_TOKENS))
    assert counted.token_note() is None
    assert counted.to_json()["token_source"] == "num_output_tokens"
    missing = StreamFacts(token_source=TokenSource.OUTPUT_IDS, tokens_assumed=3)
    note = compute(t, None, missing).token_note()
    assert note is not None and "3 responses lacked the declared output_ids" in note


def test_the_stall_bound_follows_the_runs_pace_above_a_floor() -> None:
    run = RunState(stall_gaps=4, stall_ttfts=2, stall_floor_s=1.0)
    assert run.stall_bound() == 1.0  # nothing seen yet: the floor
    run.first_token(0.3)
    run.gap(0.2)
    assert run.stall_bound() == approx(1.0)  # 4 x 0.2 and 2 x 0.3 are under the floor
    run.gap(0.5)
    assert run.stall_bound() == approx(2.0)  # 4 x the longest gap
    for ttft in (1.5, 1.6):
        run.first_token(ttft)
    assert run.stall_bound() == approx(3.0)  # 2 x the median TTFT (1.5)
