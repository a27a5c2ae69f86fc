"""The observer: read what each serving deployment's pods see, publish it, watch it for drift,
and start a retune when it lasts (``spec.tuning.retune: OnDrift``).

Every ``INFERTUNE_OBSERVE_INTERVAL_SECONDS`` (30 s), for every InferenceDeployment whose last
sync left it Ready and whose ``spec.serving.observe.enabled`` is true:

1. read each running serving pod's metrics endpoint (port 8002, ``GET /metrics``) through the
   API server's pod proxy, or the Prometheus server the spec names (``observe.prometheus``);
2. fold the scrapes into the rolling window (``observe.window``) and summarise it into
   ``status.observedWorkload``;
3. judge it against the workload the serving configuration was tuned for (``drift``):
   ``WorkloadDrifted`` and ``SloAtRisk`` turn True once a finding has held for the whole window,
   with the numbers, and False as soon as it does not;
4. with ``retune: OnDrift``, a lasting drift of the token lengths starts a retune with the
   observed workload (``retune_sync.start``), at most one per ``retuneIntervalMinutes`` and
   never twice for the same observed workload; with ``Never`` (the default) the
   WorkloadDrifted event says that no retune starts and how to turn it on.

It holds the object's lock while it works, so it never writes beside a sync. What it remembers
(the window, since when drift holds) lives in memory: a restarted operator rebuilds the window
and waits a whole window again before a drift counts (it never acts twice; status.retune and the
hash-named retune Job carry what must survive).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from infertune_operator import naming
from infertune_operator.api.types import (
    InferenceDeployment,
    InferenceDeploymentStatus,
    ObservedWorkload,
)
from infertune_operator.engine import retune_sync, status_writes
from infertune_operator.engine.context import Context, Observation
from infertune_operator.kube.errors import KubeError
from infertune_operator.kube.resources import INFERENCEDEPLOYMENTS, PODS
from infertune_operator.naming import Body
from infertune_operator.observe import metrics_text, prometheus
from infertune_operator.policy import conditions, drift, retune, verification
from infertune_operator.policy.conditions import Cond
from infertune_operator.policy.tuning import config_from_status, tuning_hash, validate
from infertune_tuner.runtime.base import SERVED_MODEL

logger = logging.getLogger("infertune.operator")

LOCK_WAIT_S = 5.0  # a sync holding the object: skip this read rather than queue behind it
WRITE_CHANGE = 0.1  # republish the summary when a figure moved by this much (or once a window)


def wall() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds_since(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (datetime.now(UTC) - then).total_seconds()


def observe(ctx: Context, namespace: str, name: str) -> None:
    """One read of one InferenceDeployment (see the module docstring)."""
    lock = ctx.lock(namespace, name)
    if not lock.acquire(timeout=LOCK_WAIT_S):
        return
    try:
        body = ctx.kube.get(INFERENCEDEPLOYMENTS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.forget_observation(namespace, name)
            return
        _observe(ctx, body)
    finally:
        lock.release()


def _observe(ctx: Context, body: Body) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = body.get("status") or {}
    obj, _ = validate(body)
    if obj is None or status.get("phase") != "Ready":
        ctx.forget_observation(namespace, name)
        return
    th = tuning_hash(body["spec"], ctx.settings)
    config = config_from_status(status, th)
    if config is None:
        return
    spec = obj.spec.serving.observe
    if not spec.enabled:
        ctx.forget_observation(namespace, name)
        off = "spec.serving.observe.enabled is false"
        status_writes.write_aside(ctx, body, {
            conditions.WORKLOAD_DRIFTED: Cond("Unknown", conditions.NOT_OBSERVED, off),
            conditions.SLO_AT_RISK: Cond("Unknown", conditions.NOT_OBSERVED, off),
        }, InferenceDeploymentStatus())  # fmt: skip
        return
    ref = verification.reference_of(obj, status, th, config, None)
    inp = ref.input_tokens if ref else obj.spec.workload.input_tokens
    out = ref.output_tokens if ref else obj.spec.workload.output_tokens
    tuned = drift.Tuned(inp, out, config.max_batch_size)
    memory = ctx.observation(namespace, name, (th, config.label()))
    horizon = spec.window_minutes * 60 * ctx.time_scale
    now = time.monotonic()
    source = _read(ctx, obj, body, memory, horizon, now)
    by_prometheus = spec.source == "prometheus"
    summary = memory.window.summary(obj.spec.serving.replicas if by_prometheus else None)
    a = drift.assess(summary, tuned, obj)
    stamp = wall()
    if a.judged:
        memory.drift.update(bool(a.drift), now, stamp)
        memory.risk.update(bool(a.at_risk), now, stamp)
    drifted = a.judged and bool(a.drift) and memory.drift.sustained(now, horizon)
    at_risk = a.judged and bool(a.at_risk) and memory.risk.sustained(now, horizon)
    updates: dict[str, Cond] = {}
    fields: dict[str, Any] = {}
    events: tuple[conditions.Event, ...] = ()
    if a.judged:
        said = "; ".join(a.drift)
        if drifted:
            retuning, fields, events = _retune(ctx, obj, body, th, summary, tuned, a)
            updates[conditions.WORKLOAD_DRIFTED] = Cond(
                "True", conditions.WORKLOAD_CHANGED,
                f"for the last {spec.window_minutes} min: {said}; {retuning}",
            )  # fmt: skip
        elif not a.drift:
            updates[conditions.WORKLOAD_DRIFTED] = Cond(
                "False", conditions.WORKLOAD_AS_TUNED,
                f"within x{drift.LENGTH_RATIO:g} of {inp} in / {out} out and x"
                f"{drift.CONCURRENCY_RATIO:g} of max batch {tuned.max_batch} per replica",
            )  # fmt: skip
        if at_risk:
            updates[conditions.SLO_AT_RISK] = Cond(
                "True", conditions.LIVE_SLO_MISSED,
                f"for the last {spec.window_minutes} min: {'; '.join(a.at_risk)}",
            )  # fmt: skip
        elif not a.at_risk:
            unjudged = f" (not observable: {', '.join(a.unjudged)})" if a.unjudged else ""
            updates[conditions.SLO_AT_RISK] = Cond(
                "False", conditions.SLO_HELD, f"every observable SLO bound met{unjudged}"
            )
    elif summary.pods and summary.span_s >= horizon:
        # A whole window with too few requests to judge: say so rather than keep a verdict.
        memory.drift.update(False, now, stamp)
        memory.risk.update(False, now, stamp)
        quiet = (f"fewer than {drift.MIN_REQUESTS} requests in the last "
                 f"{spec.window_minutes} min ({summary.requests:.0f})")  # fmt: skip
        updates[conditions.WORKLOAD_DRIFTED] = Cond("Unknown", conditions.NOT_OBSERVED, quiet)
        updates[conditions.SLO_AT_RISK] = Cond("Unknown", conditions.NOT_OBSERVED, quiet)
    elif summary.pods == 0 and memory.window.pods == {}:
        updates[conditions.WORKLOAD_DRIFTED] = Cond(
            "Unknown", conditions.NOT_OBSERVED, f"no metrics from {source} yet"
        )
    observed = _observed(summary, source, horizon / ctx.time_scale, tuned, memory, stamp)
    if _worth_writing(status.get("observedWorkload"), observed, horizon, ctx.time_scale):
        fields["observed_workload"] = observed
    if not updates and not fields:
        return
    status_writes.write_aside(
        ctx, body, updates, InferenceDeploymentStatus(**fields), events
    )  # fmt: skip


def _read(
    ctx: Context, obj: InferenceDeployment, body: Body, memory: Observation, horizon: float,
    now: float,
) -> str:  # fmt: skip
    """Scrape into the window; the source's description."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = obj.spec.serving.observe
    if spec.source == "prometheus" and spec.prometheus is not None:
        url = spec.prometheus.url
        try:
            sample = prometheus.sample(url, namespace, name, SERVED_MODEL, at=now)
        except (OSError, ValueError) as exc:
            logger.info("%s/%s: Prometheus %s not read: %s", namespace, name, url, exc)
        else:
            memory.window.add("prometheus", sample, horizon)
        return f"prometheus {url}"
    pods = ctx.kube.list(PODS, namespace, naming.serving_selector(name))
    running = [p["metadata"]["name"] for p in pods
               if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
    read = 0
    for pod in running:
        try:
            text = ctx.kube.proxy_get(namespace, pod, naming.METRICS_PORT, "metrics")
            sample = metrics_text.parse(text, at=now, model=SERVED_MODEL)
        except (KubeError, ValueError) as exc:
            logger.info("%s/%s: metrics of pod %s not read: %s", namespace, name, pod, exc)
            continue
        memory.window.add(pod, sample, horizon)
        read += 1
    memory.window.keep_only(set(running))
    return f"pods {read}/{len(running)}"


def _retune(
    ctx: Context,
    obj: InferenceDeployment,
    body: Body,
    th: str,
    summary: Any,
    tuned: drift.Tuned,
    a: drift.Assessment,
) -> tuple[str, dict[str, Any], tuple[conditions.Event, ...]]:
    """Start a retune when the spec asks and nothing holds it back; (what the WorkloadDrifted
    message says of it, status fields, events)."""
    if obj.spec.tuning.retune != "OnDrift":
        return ("spec.tuning.retune is Never: not retuning (set spec.tuning.retune: OnDrift to "
                "tune again with the observed workload)", {}, ())  # fmt: skip
    if not a.lengths_drifted:
        return "a retune cannot act on concurrency alone: not retuning", {}, ()
    w = retune.Workload(
        drift.significant(summary.input_tokens_mean or tuned.input_tokens),
        drift.significant(summary.output_tokens_mean or tuned.output_tokens),
    )
    last = retune_sync.current(body)
    if last is not None and last.state == "Running" and last.tuning_hash == th:
        return f"retune Job {last.job} is running", {}, ()
    if last is not None and last.hash == retune.retune_hash(th, w):
        return (f"a retune for {w.input_tokens} in / {w.output_tokens} out already ran "
                f"({last.state}): not again", {}, ())  # fmt: skip
    interval = obj.spec.tuning.retune_interval_minutes
    since = _seconds_since(last.started_at) if last is not None else None
    if since is not None and since / ctx.time_scale < interval * 60:
        return (f"the last retune started at {last.started_at if last else '?'}; at most one "
                f"per {interval} min (spec.tuning.retuneIntervalMinutes)", {}, ())  # fmt: skip
    started = retune_sync.start(ctx, obj, body, th, w, wall())
    if started is None:
        return "the retune Job could not be created (see the operator's log)", {}, ()
    event = conditions.Event(
        "Normal", "RetuneStarted",
        f"retune Job {started.job} tunes for the observed {w.input_tokens} in / "
        f"{w.output_tokens} out; the current configuration keeps serving",
    )  # fmt: skip
    return f"retune Job {started.job} started", {"retune": started}, (event,)


def _observed(
    s: Any, source: str, window_s: float, tuned: drift.Tuned, memory: Observation, stamp: str
) -> ObservedWorkload:
    def r(x: float | None, digits: int = 1) -> float | None:
        return round(x, digits) if x is not None else None

    return ObservedWorkload(
        source=source, window_seconds=round(window_s, 1),
        requests_per_second=r(s.requests_per_second, 3), concurrency=r(s.concurrency, 2),
        input_tokens_mean=r(s.input_tokens_mean), output_tokens_mean=r(s.output_tokens_mean),
        ttft_p50_ms=r(s.first_token_ms(0.5)), ttft_p95_ms=r(s.first_token_ms(0.95)),
        ttft_p99_ms=r(s.first_token_ms(0.99)), e2e_mean_ms=r(s.e2e_mean_ms),
        itl_mean_ms=r(s.itl_mean_ms, 2), not_exposed=list(s.not_exposed),
        tuned_input_tokens=tuned.input_tokens, tuned_output_tokens=tuned.output_tokens,
        tuned_concurrency=tuned.max_batch, drifting_since=memory.drift.since_wall,
        updated_at=stamp,
    )  # fmt: skip


_COMPARED = ("requestsPerSecond", "concurrency", "inputTokensMean", "outputTokensMean",
             "ttftP95Ms", "e2eMeanMs")  # fmt: skip


def _worth_writing(old: Any, new: ObservedWorkload, horizon: float, time_scale: float) -> bool:
    """Publish when something moved by more than :data:`WRITE_CHANGE`, a figure appeared or
    went, the drift started or ended, or the last publication is a window old."""
    if not isinstance(old, dict):
        return True
    try:
        before = ObservedWorkload.model_validate(old)
    except ValidationError:
        return True
    was: dict[str, Any] = before.wire()
    now: dict[str, Any] = new.wire()
    if was.get("driftingSince") != now.get("driftingSince") or was.get("source") != now.get(
        "source"
    ):
        return True
    for key in _COMPARED:
        a, b = was.get(key), now.get(key)
        if (a is None) != (b is None):
            return True
        if _moved(a, b):
            return True
    age = _seconds_since(before.updated_at)
    return age is None or age >= horizon


def _moved(a: Any, b: Any) -> bool:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return False
    return abs(b - a) > WRITE_CHANGE * max(abs(a), 1e-9)
