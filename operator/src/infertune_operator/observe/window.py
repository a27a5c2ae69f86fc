"""The live workload over a rolling window (pure): scrapes of each serving pod in, one
:class:`Summary` out.

Counters and histograms are cumulative; the window's share of them is the last scrape minus the
first one inside the window, per pod (a pod that restarted, whose counters went back, counts
from zero again, as Prometheus' ``rate()`` does). Pods are summed: request rate, requests in
flight; token lengths and TTFT come from the summed histograms.

* request rate = completed requests / the window's span;
* concurrency = requests in flight per replica, the mean of the ``active`` gauge over the
  window's scrapes (requests waiting for a batch slot included: what the server holds);
* E2E (mean) by Little's law: requests in flight / request rate. Triton's own request duration
  is no E2E for a decoupled model (see ``metrics_text``);
* ITL (mean) = (E2E - TTFT) / (output tokens - 1) of the means, GenAI-Perf's per-request
  definition applied to the window's means;
* TTFT percentiles from the first-response histogram as Prometheus' ``histogram_quantile``
  estimates them (linear within a bucket: only as fine as the buckets).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from infertune_operator.observe.metrics_text import (
    EMPTY,
    FIRST_RESPONSE,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REQUEST_METRICS,
    REQUEST_SUCCESS,
    Histogram,
    PodSample,
)


@dataclass(frozen=True)
class Summary:
    pods: int  # pods with two scrapes or more in the window
    span_s: float  # the longest stretch of time one pod's scrapes cover
    requests: float  # completed in the window, all pods
    requests_per_second: float | None
    in_flight: float | None  # all pods, mean over the window
    concurrency: float | None  # per replica
    input_tokens_mean: float | None
    output_tokens_mean: float | None
    ttft: Histogram | None  # the window's share of the first-response histogram
    e2e_mean_ms: float | None
    itl_mean_ms: float | None
    not_exposed: tuple[str, ...] = ()

    def first_token_ms(self, q: float) -> float | None:
        return self.ttft.quantile(q) if self.ttft is not None else None


@dataclass
class Window:
    """Scrapes per pod, kept for ``horizon_s`` seconds of the operator's clock."""

    pods: dict[str, deque[PodSample]] = field(default_factory=dict)

    def add(self, pod: str, sample: PodSample, horizon_s: float) -> None:
        kept = self.pods.setdefault(pod, deque())
        kept.append(sample)
        # Drop what left the window, but keep one scrape at or before its start (the baseline).
        while len(kept) > 2 and kept[1].at <= sample.at - horizon_s:
            kept.popleft()

    def keep_only(self, pods: set[str]) -> None:
        """Forget pods that are gone (a rollout replaced them)."""
        for gone in set(self.pods) - pods:
            del self.pods[gone]

    def summary(self, replicas: int | None = None) -> Summary:
        """The window's summary; ``replicas``: how many pods one sample stands for (a
        Prometheus source sums every pod into one)."""
        rate = 0.0
        requests = 0.0
        span = 0.0
        pods = 0
        in_flight: float | None = None
        ttft = input_hist = output_hist = EMPTY
        seen: set[str] = set()
        for samples in self.pods.values():
            if len(samples) < 2:
                continue
            first, last = samples[0], samples[-1]
            dt = last.at - first.at
            if dt <= 0:
                continue
            pods += 1
            span = max(span, dt)
            if last.success is not None:
                seen.add(REQUEST_SUCCESS)
                done = last.success - (first.success or 0.0)
                done = last.success if done < 0 else done  # restarted: counts from zero
                requests += done
                rate += done / dt
            actives = [s.active for s in samples if s.active is not None]
            if actives:
                seen.add(REQUEST_METRICS)
                in_flight = (in_flight or 0.0) + sum(actives) / len(actives)
            for name, attr in ((FIRST_RESPONSE, "first_response"), (INPUT_TOKENS, "input_tokens"),
                               (OUTPUT_TOKENS, "output_tokens")):  # fmt: skip
                now, then = getattr(last, attr), getattr(first, attr)
                if now is None:
                    continue
                seen.add(name)
                delta = now.minus(then or EMPTY)
                if name == FIRST_RESPONSE:
                    ttft = ttft.plus(delta)
                elif name == INPUT_TOKENS:
                    input_hist = input_hist.plus(delta)
                else:
                    output_hist = output_hist.plus(delta)
        per_second = rate if pods and REQUEST_SUCCESS in seen else None
        e2e = None
        if in_flight is not None and per_second:
            e2e = in_flight / per_second * 1e3
        out_mean = output_hist.mean()
        ttft_mean = ttft.mean()
        itl = None
        if e2e is not None and ttft_mean is not None and out_mean is not None and out_mean > 1:
            itl = max(e2e - ttft_mean, 0.0) / (out_mean - 1)
        families = (REQUEST_SUCCESS, REQUEST_METRICS, FIRST_RESPONSE, INPUT_TOKENS, OUTPUT_TOKENS)
        missing = tuple(f for f in families if f not in seen)
        return Summary(
            pods=pods,
            span_s=span,
            requests=requests,
            requests_per_second=per_second,
            in_flight=in_flight,
            concurrency=in_flight / (replicas or pods) if in_flight is not None and pods else None,
            input_tokens_mean=input_hist.mean(),
            output_tokens_mean=out_mean,
            ttft=ttft if ttft.count > 0 else None,
            e2e_mean_ms=e2e,
            itl_mean_ms=itl,
            not_exposed=missing if pods else (),
        )
