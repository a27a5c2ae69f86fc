"""The observed workload from a Prometheus server the user names (``spec.serving.observe.source:
prometheus``) instead of the pods themselves: the same families (``metrics_text``), summed over
the deployment's serving pods by PromQL instant queries of Prometheus' HTTP API
(``GET /api/v1/query``, https://prometheus.io/docs/prometheus/latest/querying/api/).

The pods are selected by ``namespace`` and ``pod`` (the target labels a PodMonitor, a
ServiceMonitor or the usual ``kubernetes_sd`` relabelling give): ``pod`` matches the serving
Deployment's pod names, ``<name>-<pod-template-hash>-<5 characters>``. Each read becomes one
sample of cumulative sums, as if the deployment were one pod; a rollout that replaces pods makes
the sums go back, which the window counts as a restart.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

from infertune_operator.observe.metrics_text import (
    FIRST_RESPONSE,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REQUEST_METRICS,
    REQUEST_SUCCESS,
    Histogram,
    PodSample,
)

TIMEOUT_S = 5.0


def selector(namespace: str, name: str, model: str) -> str:
    pods = f"{name}-[a-z0-9]{{6,10}}-[a-z0-9]{{5}}"
    return f'namespace="{namespace}",pod=~"{pods}",model="{model}"'


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(full, timeout=TIMEOUT_S) as response:  # the CRD allows http(s) only
        answer = json.loads(response.read().decode("utf-8"))
    if answer.get("status") != "success":
        raise ValueError(f"Prometheus refused {promql!r}: {answer.get('error')}")
    result: list[dict[str, Any]] = (answer.get("data") or {}).get("result") or []
    return result


def _scalar(url: str, promql: str) -> float | None:
    result = _query(url, promql)
    return float(result[0]["value"][1]) if result else None


def _histogram(url: str, family: str, sel: str) -> Histogram | None:
    buckets = _query(url, f"sum by (le) ({family}_bucket{{{sel}}})")
    if not buckets:
        return None
    ordered = sorted((float(b["metric"]["le"]), float(b["value"][1])) for b in buckets)
    count = _scalar(url, f"sum({family}_count{{{sel}}})") or 0.0
    total = _scalar(url, f"sum({family}_sum{{{sel}}})") or 0.0
    return Histogram(tuple(ordered), count, total)


def sample(url: str, namespace: str, name: str, model: str, *, at: float) -> PodSample:
    """One read of the deployment's families, summed over its pods. OSError when Prometheus
    does not answer, ValueError when it refuses a query."""
    sel = selector(namespace, name, model)
    return PodSample(
        at=at,
        success=_scalar(url, f"sum({REQUEST_SUCCESS}{{{sel}}})"),
        first_response=_histogram(url, FIRST_RESPONSE, sel),
        input_tokens=_histogram(url, INPUT_TOKENS, sel),
        output_tokens=_histogram(url, OUTPUT_TOKENS, sel),
        active=_scalar(url, f'sum({REQUEST_METRICS}{{{sel},request_type="active"}})'),
    )
