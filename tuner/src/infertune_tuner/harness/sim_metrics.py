"""The simulated server's metrics endpoint: what a Triton + TensorRT-LLM serving pod exposes on
its metrics port (``GET /metrics``, Prometheus text format), under the upstream names, so the
operator reads a simulated pod exactly as it reads a real one.

Families, and where upstream defines each:

* ``nv_inference_request_success`` / ``nv_inference_request_failure{reason}`` /
  ``nv_inference_count`` (counters, labels ``model``, ``version``): Triton core
  (triton-inference-server/core ``src/metrics.cc``; server ``docs/user_guide/metrics.md``,
  "Counts"). Counted here when a request completes or is refused.
* ``nv_inference_first_response_histogram_ms`` (histogram): Triton core, request to first
  response (core ``src/infer_response.cc`` ``UpdateResponseMetrics``; metrics.md "Histograms";
  tritonserver exports it with ``--metrics-config histogram_latencies=true``). Upstream's
  default buckets are 100, 500, 2000, 5000 ms (core ``src/metric_model_reporter.h``); a model
  may set its own (metrics.md, ``model_metrics`` in config.pbtxt): this server uses a 1-2-5
  series up to a minute, as a deployment that wants percentiles would.
* ``nv_llm_input_token_len`` / ``nv_llm_output_token_len`` (histograms, label
  ``response_metric_type`` = ``total_input_tokens`` / ``total_output_tokens``, buckets 1-2-5 up
  to 1000): TensorRT-LLM's Triton models (NVIDIA/TensorRT-LLM ``triton_backend/all_models/
  inflight_batcher_llm/tensorrt_llm/1/model.py`` ``create_metrics``; the C++ backend's
  ``custom_metrics_reporter.cc``).
* ``nv_trt_llm_request_metrics{request_type}`` (gauge: ``active``, ``scheduled``,
  ``waiting``, ``context``, ``max``): the same model's request metrics (tensorrtllm_backend
  README, "Triton Metrics"). Here ``active`` = requests in the engine (scheduled + waiting),
  ``scheduled`` = in the running batch, ``waiting`` = queued for admission, ``max`` = the max
  batch size.

TensorRT-LLM's LLM-API Triton model (what infertune deploys on GPUs) registers none of the
``nv_llm_*`` / ``nv_trt_llm_*`` families (its model.py has no ``pb_utils.MetricFamily``): a real
pod serving it shows Triton core's families only (docs/operator.md, *The observed workload*).

The text is written here, not with ``prometheus_client``'s registry: that client renames every
counter ``<name>_total``, and Triton's counters (prometheus-cpp) carry no suffix.
"""

from __future__ import annotations

from typing import Any

from infertune_tuner.harness.engine import Emitted
from infertune_tuner.harness.sim_service import SimTritonService

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
INPUT_TOKENS = "nv_llm_input_token_len"
OUTPUT_TOKENS = "nv_llm_output_token_len"
REQUEST_METRICS = "nv_trt_llm_request_metrics"


def one_two_five(limit: float) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50 ... up to ``limit`` (upstream's ``build_1_2_5_buckets``)."""
    out: list[float] = []
    scale = 1.0
    while True:
        for step in (1.0, 2.0, 5.0):
            if step * scale > limit:
                return tuple(out)
            out.append(step * scale)
        scale *= 10


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        pairs = zip(self.buckets, self.counts, strict=True)
        out = [f'{name}_bucket{{{labels},le="{b:g}"}} {c}' for b, c in pairs]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_count{{{labels}}} {self.count}")
        out.append(f"{name}_sum{{{labels}}} {self.sum:g}")
        return out


class MeteredSimService(SimTritonService):
    """The simulated service, counting what its metrics endpoint shows."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.success = 0
        self.failure = 0
        self.first_response = _Histogram(one_two_five(60_000))
        self.input_tokens = _Histogram(one_two_five(1000))
        self.output_tokens = _Histogram(one_two_five(1000))

    def _error(self, request: Any, message: str) -> Any:
        self.failure += 1
        return super()._error(request, message)

    def _emit(self, emitted: list[Emitted], now_ns: int) -> None:
        for em in emitted:
            seq = em.seq
            if seq.generated == 1 and seq.first_token_s is not None:
                self.first_response.observe((seq.first_token_s - seq.received_s) * 1e3)
                self.input_tokens.observe(seq.input_tokens)
            if em.final:
                self.success += 1
                self.output_tokens.observe(seq.generated)
        super()._emit(emitted, now_ns)

    def metrics_text(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of the counters and gauges."""
        model = f'model="{self.cfg.served_model}",version="1"'
        engine = self.engine
        lines = [
            "# HELP nv_inference_request_success Number of successful inference requests, "
            "all batch sizes",
            "# TYPE nv_inference_request_success counter",
            f"nv_inference_request_success{{{model}}} {self.success}",
            "# HELP nv_inference_request_failure Number of failed inference requests, all "
            "batch sizes",
            "# TYPE nv_inference_request_failure counter",
            f'nv_inference_request_failure{{{model},reason="BACKEND"}} {self.failure}',
            "# HELP nv_inference_count Number of inferences performed (does not include "
            "cached requests)",
            "# TYPE nv_inference_count counter",
            f"nv_inference_count{{{model}}} {self.success}",
            f"# HELP {FIRST_RESPONSE} Duration from request to first response in milliseconds",
            f"# TYPE {FIRST_RESPONSE} histogram",
            *self.first_response.lines(FIRST_RESPONSE, model),
            f"# HELP {INPUT_TOKENS} TRT LLM response metrics",
            f"# TYPE {INPUT_TOKENS} histogram",
            *self.input_tokens.lines(
                INPUT_TOKENS, f'{model},response_metric_type="total_input_tokens"'
            ),
            f"# HELP {OUTPUT_TOKENS} TRT LLM response metrics",
            f"# TYPE {OUTPUT_TOKENS} histogram",
            *self.output_tokens.lines(
                OUTPUT_TOKENS, f'{model},response_metric_type="total_output_tokens"'
            ),
            f"# HELP {REQUEST_METRICS} TRT LLM request metrics",
            f"# TYPE {REQUEST_METRICS} gauge",
        ]
        waiting = sum(1 for s in engine.waiting if not s.cancelled)
        gauges = {
            "active": len(engine.active) + waiting,
            "scheduled": len(engine.active),
            "waiting": waiting,
            "context": sum(1 for s in engine.active if s.generated == 0),
            "max": engine.max_batch_size,
        }
        lines += [
            f'{REQUEST_METRICS}{{{model},request_type="{kind}"}} {value}'
            for kind, value in gauges.items()
        ]
        return "\n".join(lines) + "\n"
