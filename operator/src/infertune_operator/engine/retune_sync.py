"""A retune's I/O: its start (the observer calls :func:`start` when drift lasts) and, inside a
sync, following its Job and report to the verdict (retune.py decides).

``status.retune`` records the latest retune (its hash, the observed workload, when it started):
a restarted operator follows the same Job (hash-named, adopted), and the observer starts no
second one within ``spec.tuning.retuneIntervalMinutes``. Once rolled out, the retune's best is
the status's bestConfig and bestMetrics, and its workload is what the configuration was tuned
for (verification and drift compare with it).
"""

from __future__ import annotations

import logging
from typing import Any

from infertune_operator import naming
from infertune_operator.api.status import RetuneWorkload, status_part
from infertune_operator.api.types import BestConfig, BestMetrics, InferenceDeployment, RetuneStatus
from infertune_operator.engine import creates
from infertune_operator.engine.context import Context
from infertune_operator.kube.errors import ClientError
from infertune_operator.kube.resources import CONFIGMAPS, JOBS, PODS
from infertune_operator.naming import Body
from infertune_operator.policy import conditions, retune, tuner_outcome
from infertune_operator.reports.store import parse_report
from infertune_tuner.config import TrialConfig

logger = logging.getLogger("infertune.operator")

Followed = tuple[TrialConfig | None, dict[str, Any], tuple[conditions.Event, ...]]


def current(body: Body) -> RetuneStatus | None:
    """The retune the status records (None: none, or not readable)."""
    return status_part(body, "retune", RetuneStatus)


def start(
    ctx: Context,
    obj: InferenceDeployment,
    body: Body,
    th: str,
    w: retune.Workload,
    now: str,
) -> RetuneStatus | None:
    """Create the retune's request and Job (adopting them after a restart); None when the API
    server refuses them (logged: the next drift window tries again)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    rhash = retune.retune_hash(th, w)
    cm, job = retune.retune_objects(obj, body, th, w, ctx.settings)
    creates.ensure_tuner_rbac(ctx, namespace)
    try:
        creates.create_owned(ctx, cm, body)
        live, created = creates.create_owned(ctx, job, body)
    except (creates.NotOurs, ClientError) as exc:
        if (why := creates.refused(exc)) is None:
            raise
        logger.warning("%s/%s: retune not started: %s", namespace, name, why)
        return None
    job_name = live["metadata"]["name"]
    if created:  # an earlier retune's Job and request are history now
        creates.delete_other_jobs(ctx, namespace, name, naming.COMPONENT_RETUNE, [job_name])
        labels = {naming.LABEL_DEPLOYMENT: name, naming.LABEL_COMPONENT: naming.COMPONENT_RETUNE}
        for old in ctx.kube.list(CONFIGMAPS, namespace, labels):
            if old["metadata"]["name"] != cm["metadata"]["name"]:
                ctx.kube.delete(CONFIGMAPS, namespace, old["metadata"]["name"])
    logger.info("%s/%s: retune Job %s %s", namespace, name, job_name,
                "created" if created else "adopted")  # fmt: skip
    return RetuneStatus(
        state="Running", hash=rhash, tuning_hash=th, job=job_name,
        workload=RetuneWorkload(input_tokens=w.input_tokens, output_tokens=w.output_tokens),
        started_at=now,
        message=f"retune Job {job_name} tunes for {w.input_tokens} in / {w.output_tokens} out; "
        "the current configuration keeps serving",
    )  # fmt: skip


def follow(
    ctx: Context, obj: InferenceDeployment, body: Body, th: str, serving: TrialConfig
) -> Followed:
    """(the configuration to serve instead of the tuning's best, status fields to set, events).

    A retune of another tuning (the spec changed since) is history: nothing. A rolled-out one
    keeps its configuration served. A running one is followed to its report and verdict.
    """
    rs = current(body)
    if rs is not None and rs.tuning_hash != th and rs.state == "Running":
        # The spec changed: the new tuning deleted its Job with the other superseded Jobs.
        why = f"superseded: the spec changed since (tuning {th}); its Job was deleted"
        done = rs.model_copy(update={"state": "Failed", "finished_at": ctx.clock(), "message": why})
        return None, {"retune": done}, ()
    if rs is None or rs.tuning_hash != th:
        return None, {}, ()
    if rs.state == "RolledOut" and rs.best_config is not None:
        return rs.best_config.to_config(), {
            "best_config": rs.best_config, "best_metrics": rs.best_metrics,
        }, ()  # fmt: skip
    if rs.state != "Running":
        return None, {}, ()
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid")
    w = retune.Workload(rs.workload.input_tokens, rs.workload.output_tokens)
    cm = ctx.kube.get(CONFIGMAPS, namespace, naming.retune_report_name(name))
    annotations = ((cm or {}).get("metadata") or {}).get("annotations") or {}
    owner = naming.owner_uid(cm)
    if cm and annotations.get(naming.ANNOTATION_RETUNE_HASH) == rs.hash and owner in (None, uid):
        try:
            report = parse_report(cm)
        except ValueError as exc:
            return _failed(rs, f"retune report {cm['metadata']['name']} is unreadable: {exc}", ctx)
        return _decided(rs, retune.verdict(report, serving, w), report, ctx)
    job = ctx.kube.get(JOBS, namespace, rs.job)
    if job is None or naming.owner_uid(job) != uid:
        return _failed(rs, f"retune Job {rs.job} is gone (deleted before it reported)", ctx)
    outcome = tuner_outcome.job_outcome(job)
    if outcome.state in ("pending", "running"):
        return None, {}, ()
    if outcome.state == "succeeded":
        return _failed(rs, f"retune Job {rs.job} succeeded but left no report in "
                       f"{naming.retune_report_name(name)}", ctx)  # fmt: skip
    pods = ctx.kube.list(PODS, namespace, {"job-name": rs.job})
    why = tuner_outcome.job_failure_message(rs.job, outcome, tuner_outcome.pod_failure(pods), "")
    return _failed(rs, why.replace("tuner Job", "retune Job"), ctx)


def _failed(rs: RetuneStatus, why: str, ctx: Context) -> Followed:
    done = rs.model_copy(update={"state": "Failed", "finished_at": ctx.clock(), "message": why})
    event = conditions.Event("Warning", "RetuneFailed", f"{why}; the current configuration "
                             "keeps serving")  # fmt: skip
    return None, {"retune": done}, (event,)


def _decided(rs: RetuneStatus, v: retune.Verdict, report: Any, ctx: Context) -> Followed:
    update: dict[str, Any] = {
        "state": v.decision, "finished_at": ctx.clock(), "message": v.message,
        "config": v.best.label() if v.best else None,
        "output_tokens_per_second_per_gpu": v.best_tps,
        "current_output_tokens_per_second_per_gpu": v.current_tps,
        "margin_percent": round(v.margin * 100, 1) if v.margin is not None else None,
    }  # fmt: skip
    if v.decision == "RolledOut" and v.best is not None and report.best is not None:
        best_config = BestConfig.of(v.best)
        best_metrics = BestMetrics.of(
            report.best.metrics, slo_met=True, cost=report.best.cost_per_million_output_tokens
        )
        update.update(best_config=best_config, best_metrics=best_metrics)
        done = rs.model_copy(update=update)
        event = conditions.Event("Normal", "RetuneRolledOut", f"rolling out {v.message}")
        fields = {"retune": done, "best_config": best_config, "best_metrics": best_metrics}
        return v.best, fields, (event,)
    done = rs.model_copy(update=update)
    return None, {"retune": done}, (conditions.Event("Normal", "RetuneKeptCurrent", v.message),)
