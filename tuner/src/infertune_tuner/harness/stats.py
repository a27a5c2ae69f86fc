"""From per-request timestamps to benchmark statistics (pure; no I/O, no numpy).

Definitions follow NVIDIA GenAI-Perf (triton-inference-server/perf_analyzer,
genai-perf/genai_perf/profile_data_parser/llm_profile_data_parser.py, `_parse_requests`):

- TTFT (time to first token) = send -> first response carrying output tokens.
- ITL (inter-token latency) = per request, (E2E - TTFT) / (output tokens - 1), for requests with
  more than one response and more than one token; percentiles over requests. This is what the
  SLO's `itlMs` bounds.
- Token gaps (`token_gap_ms`) = the gaps between successive output tokens of every request,
  pooled (a response carrying k tokens contributes k gaps of gap/k): p99 shows the stalls a
  decode step suffers when other requests' prefills run in it. Reported, never bounded.
- E2E (request latency) = send -> last response.
- Output throughput = output tokens of completed requests / benchmark duration, where the
  duration runs from the first send of a completed request to the last response of a completed
  request: AIPerf's definition (ai-dynamo/aiperf, aiperf/metrics/types/
  output_token_throughput_metrics.py `OutputTokenThroughputMetric`: total output sequence
  length / `BenchmarkDurationMetric`, benchmark_duration_metric.py: maximum response timestamp
  minus minimum request timestamp, max_response_metric.py / min_request_metric.py; records with
  an error feed only the error metrics: post_processors/metric_record_processor.py
  `process_record`). Failed and stalled requests are counted apart (`errors`, `stalled`) and
  widen no window.
- Output length: a request's output tokens are what its responses say they carry (tokens.py:
  `num_output_tokens`, `output_ids`, else one per response carrying output). A run whose mean output
  length falls more than 5 % short of the requested length ended early (EOS): its E2E flatters
  the workload, so `e2e_at_requested_ms` gives each request's E2E at the requested length,
  TTFT + (requested - 1) x its ITL, and `short_output` says by how much it fell short.

Percentiles interpolate linearly between closest ranks (numpy's default, which GenAI-Perf uses).
Times are seconds on one monotonic clock; reported latencies are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infertune_tuner.harness.tokens import TokenSource
from infertune_tuner.harness.trace import RequestTrace
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles

MAX_ERROR_SAMPLES = 5
SHORT_OUTPUT = 0.05  # a mean output length more than this share below the requested: early EOS


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one metric, milliseconds."""

    count: int
    mean: float
    min: float
    max: float
    p50: float
    p95: float
    p99: float

    def percentiles(self) -> Percentiles:
        return Percentiles(self.p50, self.p95, self.p99)

    def as_dict(self) -> dict[str, float | int]:
        return {
            **self.percentiles().as_dict(),
            "mean": self.mean, "min": self.min, "max": self.max, "count": self.count,
        }  # fmt: skip


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default `linear` method)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values_ms: Iterable[float]) -> Summary | None:
    vals = sorted(values_ms)
    if not vals:
        return None
    return Summary(
        count=len(vals),
        mean=math.fsum(vals) / len(vals),
        min=vals[0],
        max=vals[-1],
        p50=percentile(vals, 50),
        p95=percentile(vals, 95),
        p99=percentile(vals, 99),
    )


@dataclass(frozen=True)
class StreamFacts:
    """What the client learnt from the streams beyond per-request timings."""

    token_source: TokenSource = TokenSource.RESPONSES
    tokens_assumed: int = 0  # responses counted as one token although a count was declared
    streams_cancelled: int = 0  # streams that did not end by themselves after their requests
    stall_bound_s: float | None = None  # the stall bound at the end of the run

    @property
    def one_per_response(self) -> bool:
        """Whether some output was counted as one token per response, for lack of a count."""
        return self.token_source is TokenSource.RESPONSES or self.tokens_assumed > 0


@dataclass(frozen=True)
class BenchResult:
    """The outcome of one load-generator run over the measured (non-warm-up) requests: a
    Summary per latency metric of ``metrics.LATENCY_METRICS`` (None when nothing completed)."""

    requests: int  # completed without error
    errors: int
    error_samples: list[str]
    ttft_ms: Summary | None
    itl_ms: Summary | None  # per request, GenAI-Perf's definition (what the SLO bounds)
    e2e_ms: Summary | None
    token_gap_ms: Summary | None  # pooled gaps between tokens (reported, not bounded)
    output_tokens: int
    output_tokens_per_s: float
    duration_s: float
    requested_output_tokens: int | None = None
    # E2E of each request at the requested output length (None when nothing completed).
    e2e_at_requested_ms: Summary | None = None
    server_ttft_ms: Summary | None = None  # from server-reported timestamps, when present
    server_e2e_ms: Summary | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    # The most requests that were decoding (first token seen, last not yet) at one moment.
    peak_decoding: int | None = None
    stalled: int = 0  # short requests whose stream went silent (not completed, not errors)
    stalled_tokens: tuple[int, int] | None = None  # fewest and most tokens a stalled one had
    stream: StreamFacts = field(default_factory=StreamFacts)

    @property
    def sent(self) -> int:
        return self.requests + self.errors + self.stalled

    def stall_note(self) -> str | None:
        """What a report says about a run whose streams stalled (None when none did)."""
        if not self.stalled or self.stalled_tokens is None:
            return None
        lo, hi = self.stalled_tokens
        got = f"{lo}" if lo == hi else f"{lo}-{hi}"
        bound = self.stream.stall_bound_s
        after = f" for over {bound * 1e3:.0f} ms" if bound is not None else ""
        return (
            f"{self.stalled} of {self.sent} requests stalled: their streams went silent{after} "
            f"after {got} of {self.requested_output_tokens or '?'} tokens without a final "
            "response (the model stopped without flagging its last output); the run measured "
            "short requests and is not a valid measurement"
        )

    def token_note(self) -> str | None:
        """Says so when output tokens were counted one per response for lack of a count."""
        s = self.stream
        if s.token_source is TokenSource.RESPONSES:
            return (
                "output tokens counted as one per response: the model returns no token count "
                "(num_output_tokens) or ids (output_ids); a response carrying several tokens "
                "(stream_interval > 1, speculative decoding) is undercounted"
            )
        if s.tokens_assumed:
            return (
                f"{s.tokens_assumed} responses lacked the declared {s.token_source.value} and "
                "were counted as one token each"
            )
        return None

    @property
    def output_tokens_mean(self) -> float | None:
        return self.output_tokens / self.requests if self.requests else None

    @property
    def short_output(self) -> float | None:
        """How far the mean output length fell short of the requested (0.31 = 31 % short), when
        by more than SHORT_OUTPUT; None otherwise."""
        mean, want = self.output_tokens_mean, self.requested_output_tokens
        if mean is None or not want:
            return None
        if mean >= want * (1 - SHORT_OUTPUT) - 1e-9:
            return None
        return 1 - mean / want

    def workload_latency(self) -> dict[str, Summary | None]:
        """Each registered latency metric's summary for the workload as requested: when the run
        fell short (`short_output`), E2E at the requested length, the others as measured."""
        out = {m.key: m.of(self) for m in LATENCY_METRICS}
        if self.short_output is not None and self.e2e_at_requested_ms is not None:
            out["e2e_ms"] = self.e2e_at_requested_ms
        return out

    def short_output_note(self) -> str | None:
        """What a report says about a run that fell short (None when it did not)."""
        short, mean = self.short_output, self.output_tokens_mean
        if short is None or mean is None:
            return None
        return (
            f"outputs averaged {mean:.0f} tokens, {short:.0%} short of the "
            f"{self.requested_output_tokens} requested (the model stopped early, EOS): E2E is "
            "each request's at the requested length (TTFT + (tokens - 1) x its ITL)"
        )

    def to_json(self) -> dict[str, Any]:
        def d(s: Summary | None) -> dict[str, float | int] | None:
            return s.as_dict() if s is not None else None

        out: dict[str, Any] = {
            "requests": self.requests,
            "errors": self.errors,
            "error_samples": list(self.error_samples),
            **{m.key: d(m.of(self)) for m in LATENCY_METRICS},
            "token_gap_ms": d(self.token_gap_ms),
            "output_tokens": self.output_tokens,
            "output_tokens_mean": self.output_tokens_mean,
            "requested_output_tokens": self.requested_output_tokens,
            "short_output": self.short_output,
            "e2e_at_requested_ms": d(self.e2e_at_requested_ms),
            "output_tokens_per_s": self.output_tokens_per_s,
            "duration_s": self.duration_s,
        }
        out["stalled"] = self.stalled
        out["token_source"] = self.stream.token_source.value
        out["one_token_per_response_assumed"] = self.stream.one_per_response
        out["tokens_assumed"] = self.stream.tokens_assumed
        out["streams_cancelled"] = self.stream.streams_cancelled
        if self.stream.stall_bound_s is not None:
            out["stall_bound_ms"] = self.stream.stall_bound_s * 1e3
        if self.peak_decoding is not None:
            out["peak_decoding"] = self.peak_decoding
        if self.server_e2e_ms is not None:
            out["server_ttft_ms"] = d(self.server_ttft_ms)
            out["server_e2e_ms"] = d(self.server_e2e_ms)
        if self.settings:
            out["settings"] = dict(self.settings)
        return out


def error_samples(traces: Iterable[RequestTrace], limit: int = MAX_ERROR_SAMPLES) -> list[str]:
    """The first `limit` distinct error messages, in order of appearance."""
    seen: list[str] = []
    for t in traces:
        if t.error is not None and t.error not in seen:
            seen.append(t.error)
            if len(seen) >= limit:
                break
    return seen


def _e2e_at(t: RequestTrace, requested: int) -> float:
    """The request's E2E had it produced `requested` tokens at its own pace (its measured E2E
    when it did, or when it has no pace: a single token)."""
    itl = t.itl_s()
    if t.output_tokens >= requested or itl is None:
        return t.e2e_s()
    return t.ttft_s() + (requested - 1) * itl


def compute(
    traces: Sequence[RequestTrace],
    settings: dict[str, Any] | None = None,
    stream: StreamFacts | None = None,
) -> BenchResult:
    """Statistics over measured requests. A request that errored, or that ended without a single
    output token, counts as an error, and one that stalled as stalled: neither contributes a
    latency sample, output tokens or time to the benchmark duration."""
    normalized = [
        t
        if t.ok or t.error is not None or t.stalled
        else _with_error(t, "stream ended without output")
        for t in traces
    ]
    done = [t for t in normalized if t.ok]
    stalled = [t for t in normalized if t.stalled and t.error is None]
    failed = [t for t in normalized if t.error is not None]
    ttft = [t.ttft_s() * 1e3 for t in done]
    e2e = [t.e2e_s() * 1e3 for t in done]
    gaps = [g * 1e3 for t in done for g in t.gaps_s()]
    itl = [x * 1e3 for t in done if (x := t.itl_s()) is not None]
    want = (settings or {}).get("output_tokens")
    requested = int(want) if isinstance(want, int) and want > 0 else None
    tokens = sum(t.output_tokens for t in done)
    # AIPerf's benchmark duration: first send to last response of completed requests only.
    duration = max(t.last_s for t in done) - min(t.send_s for t in done) if done else 0.0
    stalled_tokens = [t.output_tokens for t in stalled]
    with_server = [t for t in done if t.server is not None]
    server_ttft = [(s[1] - s[0]) * 1e3 for t in with_server if (s := t.server) is not None]
    server_e2e = [(s[2] - s[0]) * 1e3 for t in with_server if (s := t.server) is not None]
    return BenchResult(
        requests=len(done),
        errors=len(failed),
        error_samples=error_samples(failed),
        ttft_ms=summarize(ttft),
        itl_ms=summarize(itl),
        e2e_ms=summarize(e2e),
        token_gap_ms=summarize(gaps),
        output_tokens=tokens,
        output_tokens_per_s=tokens / duration if duration > 0 else 0.0,
        duration_s=duration,
        requested_output_tokens=requested,
        e2e_at_requested_ms=summarize(_e2e_at(t, requested) * 1e3 for t in done)
        if requested
        else None,
        server_ttft_ms=summarize(server_ttft),
        server_e2e_ms=summarize(server_e2e),
        settings=dict(settings or {}),
        peak_decoding=peak_decoding(done),
        stalled=len(stalled),
        stalled_tokens=(min(stalled_tokens), max(stalled_tokens)) if stalled_tokens else None,
        stream=stream or StreamFacts(),
    )


def peak_decoding(done: Sequence[RequestTrace]) -> int | None:
    """The most requests decoding at once: between their first and last response. A server
    whose KV cache holds fewer sequences than the client keeps in flight queues the rest, and
    this stays below the client's concurrency."""
    events = sorted(
        [(t.responses[0], 1) for t in done] + [(t.responses[-1], -1) for t in done],
        key=lambda e: (e[0], e[1]),  # at a tie, one finishing frees its slot first
    )
    if not events:
        return None
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _with_error(t: RequestTrace, message: str) -> RequestTrace:
    return replace(t, error=message)
