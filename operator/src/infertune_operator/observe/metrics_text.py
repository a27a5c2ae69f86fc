"""What a serving pod's metrics endpoint says about its workload (pure): Prometheus text in, one
:class:`PodSample` of the families the observed workload is computed from.

The families, and the upstream text that defines each (checked, not assumed):

| quantity | family | upstream |
|---|---|---|
| completed requests | ``nv_inference_request_success`` (counter) | triton-inference-server/server ``docs/user_guide/metrics.md`` L97 (Counts table); core ``src/metrics.cc`` L54 |
| failed requests | ``nv_inference_request_failure`` (counter, label ``reason``) | metrics.md L98, "Failure Count Categories" |
| time to first token | ``nv_inference_first_response_histogram_ms`` (histogram) | metrics.md L215-239 (with ``--metrics-config histogram_latencies=true``); core ``src/infer_response.cc`` L310-323 ``UpdateResponseMetrics``; default buckets 100/500/2000/5000 ms, ``src/metric_model_reporter.h`` L66 |
| input / output tokens | ``nv_llm_input_token_len`` / ``nv_llm_output_token_len`` (histograms, ``response_metric_type`` ``total_input_tokens`` / ``total_output_tokens``) | NVIDIA/TensorRT-LLM ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py`` ``create_metrics``; ``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`` |
| requests in flight | ``nv_trt_llm_request_metrics{request_type="active"}`` (gauge) | triton-inference-server/tensorrtllm_backend ``README.md`` L411-434 "Triton Metrics" |

Not used, and why: ``nv_inference_request_duration_us`` (and its summary) would be the E2E, but
a decoupled Python-backend model (the LLM-API model is one) reports a request's statistics when
``execute`` returns, before its responses are sent (triton-inference-server/python_backend
``src/pb_metric_reporter.cc`` L49-53: "there could still be responses that have not yet been
sent but those cannot be captured in the statistics"); ``nv_inference_pending_request_count``
counts requests before ``execute`` (metrics.md L101), which that model leaves at once. E2E is
estimated by Little's law instead (``window``).

Which of them a real pod exposes depends on its Triton model: the LLM-API model infertune deploys
(``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``) registers no metric family of its
own, so only Triton core's (requests, and TTFT with histograms on) are there; TensorRT-LLM's
inflight-batcher model adds the token lengths and the request gauges. What is missing is listed
in ``status.observedWorkload.notExposed``, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

REQUEST_SUCCESS = "nv_inference_request_success"
REQUEST_FAILURE = "nv_inference_request_failure"
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
INPUT_TOKENS = "nv_llm_input_token_len"
OUTPUT_TOKENS = "nv_llm_output_token_len"
REQUEST_METRICS = "nv_trt_llm_request_metrics"
FAMILIES = (REQUEST_SUCCESS, REQUEST_FAILURE, FIRST_RESPONSE, INPUT_TOKENS, OUTPUT_TOKENS,
            REQUEST_METRICS)  # fmt: skip


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: upper bounds with cumulative counts (+Inf last), count, sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since ``earlier`` (the same buckets; a reset: everything now)."""
        if self.count < earlier.count or [b for b, _ in self.buckets] != [
            b for b, _ in earlier.buckets
        ]:
            return self
        counts = [
            (b, c - c0) for (b, c), (_, c0) in zip(self.buckets, earlier.buckets, strict=True)
        ]
        return Histogram(tuple(counts), self.count - earlier.count, self.sum - earlier.sum)

    def plus(self, other: Histogram) -> Histogram:
        if not self.buckets or [b for b, _ in self.buckets] != [b for b, _ in other.buckets]:
            return other if not self.buckets else self
        counts = [(b, c + c2) for (b, c), (_, c2) in zip(self.buckets, other.buckets, strict=True)]
        return Histogram(tuple(counts), self.count + other.count, self.sum + other.sum)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """As Prometheus' ``histogram_quantile``: linear within the bucket that holds the rank
        (from 0 in the first); a rank in the +Inf bucket is the largest finite bound."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return lower


EMPTY = Histogram((), 0.0, 0.0)


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod: cumulative counters and histograms, and the in-flight gauge."""

    at: float  # when it was read (seconds, the operator's monotonic clock)
    success: float | None = None
    failure: float | None = None
    first_response: Histogram | None = None
    input_tokens: Histogram | None = None
    output_tokens: Histogram | None = None
    active: float | None = None


def parse(text: str, *, at: float, model: str) -> PodSample:
    """The families of the module docstring for the served ``model``, from Prometheus text.

    ValueError when the text is not the Prometheus exposition format."""
    values: dict[str, float] = {}
    hists: dict[str, dict[str, object]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in FAMILIES:
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model", model) != model:
                continue
            name = family.name
            if family.type == "histogram":
                h = hists.setdefault(name, {"buckets": {}, "count": 0.0, "sum": 0.0})
                if sample.name.endswith("_bucket"):
                    le = float(labels["le"])
                    buckets = h["buckets"]
                    assert isinstance(buckets, dict)
                    buckets[le] = buckets.get(le, 0.0) + sample.value
                elif sample.name.endswith("_count"):
                    h["count"] = float(h["count"]) + sample.value  # type: ignore[arg-type]
                elif sample.name.endswith("_sum"):
                    h["sum"] = float(h["sum"]) + sample.value  # type: ignore[arg-type]
            elif name == REQUEST_METRICS:
                if labels.get("request_type") == "active":
                    values[name] = values.get(name, 0.0) + sample.value
            elif not sample.name.endswith("_created"):
                values[name] = values.get(name, 0.0) + sample.value

    def hist(name: str) -> Histogram | None:
        h = hists.get(name)
        if h is None:
            return None
        buckets = h["buckets"]
        assert isinstance(buckets, dict)
        ordered = tuple(sorted(buckets.items()))
        return Histogram(ordered, float(h["count"]), float(h["sum"]))  # type: ignore[arg-type]

    return PodSample(
        at=at,
        success=values.get(REQUEST_SUCCESS),
        failure=values.get(REQUEST_FAILURE),
        first_response=hist(FIRST_RESPONSE),
        input_tokens=hist(INPUT_TOKENS),
        output_tokens=hist(OUTPUT_TOKENS),
        active=values.get(REQUEST_METRICS),
    )
