"""The verification inside a sync: start the Job once the rollout is available, follow it, read
its result, and say so in status.verification and the Verified condition (verification.py
decides; this module reads and writes).

Once decided for a verification hash, nothing is read again: a resync of a Ready object whose
verification is done costs no API call. A new rollout (another hash) verifies again.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from infertune_operator import naming
from infertune_operator.api.status import status_part
from infertune_operator.api.types import BestMetrics, InferenceDeployment, VerificationStatus
from infertune_operator.engine import creates
from infertune_operator.engine.context import Context
from infertune_operator.kube.errors import ClientError
from infertune_operator.kube.resources import CONFIGMAPS, JOBS, PODS
from infertune_operator.naming import Body
from infertune_operator.policy import conditions, tuner_outcome, verification
from infertune_operator.policy.conditions import Cond, Transition
from infertune_tuner.config import TrialConfig

logger = logging.getLogger("infertune.operator")

_CONDITION: dict[str, tuple[conditions.ConditionStatus, str]] = {
    "Running": ("Unknown", conditions.VERIFICATION_RUNNING),
    "Passed": ("True", conditions.MATCHES_TUNED),
    "BelowTuned": ("False", conditions.BELOW_TUNED),
    "SloMissed": ("False", conditions.SLO_MISSED),
    "Failed": ("False", conditions.VERIFICATION_FAILED),
}


def _with(t: Transition, cond: Cond, status: VerificationStatus | None = None) -> Transition:
    fields = t.fields if status is None else t.fields.model_copy(update={"verification": status})
    return replace(t, conditions={**t.conditions, conditions.VERIFIED: cond}, fields=fields)


def verify(
    ctx: Context,
    obj: InferenceDeployment,
    body: Body,
    th: str,
    config: TrialConfig,
    transition: Transition,
) -> Transition:
    """The serving transition with the verification of what it serves folded in.

    Ready: the verification's state (starting its Job when there is no result yet). Deploying:
    a verification of an earlier rollout says it waits for this one (Verified=Unknown).
    """
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid")
    if not obj.spec.serving.verification.enabled:
        return _with(transition, Cond(
            "Unknown", conditions.VERIFICATION_DISABLED,
            "spec.serving.verification.enabled is false: the service never sees synthetic load",
        ))  # fmt: skip
    best: BestMetrics | None = transition.fields.best_metrics
    ref = verification.reference_of(obj, body.get("status"), th, config, best)
    if ref is None:
        return transition
    vhash = verification.verification_hash(obj, ref, ctx.settings)
    old = status_part(body, "verification", VerificationStatus)
    if transition.phase != "Ready":
        if old is not None and old.hash != vhash:
            cond = Cond("Unknown", conditions.VERIFICATION_PENDING,
                        f"{config.label()} is verified once its rollout is available")  # fmt: skip
            return _with(transition, cond)
        return transition
    if old is not None and old.hash == vhash and old.state != "Running":
        return transition  # decided: the condition and the status say it already
    plan = verification.load_plan(obj, ref)
    job_name = naming.verification_job_name(name, vhash)
    base = VerificationStatus(
        state="Running", hash=vhash, job=job_name, config=config.label(),
        input_tokens=ref.input_tokens, output_tokens=ref.output_tokens,
        concurrency=plan.concurrency, tuned=ref.tuned,
    )  # fmt: skip
    cm = ctx.kube.get(CONFIGMAPS, namespace, naming.verification_configmap_name(name))
    result = verification.read_result(cm, vhash, uid)
    if result is not None:
        done = verification.verdict(obj, ref, result, base)
        return _decided(transition, done)
    job = ctx.kube.get(JOBS, namespace, job_name)
    if job is not None and naming.owner_uid(job) != uid:
        job = None  # an earlier object's of this name: never adopted
    if job is None:
        job = _start(ctx, obj, body, ref, vhash, th)
        if job is None:
            failed = base.model_copy(
                update={"state": "Failed", "message": f"cannot start verification Job {job_name}"}
            )
            return _decided(transition, failed)
    outcome = tuner_outcome.job_outcome(job)
    if outcome.state in ("pending", "running"):
        running = base.model_copy(
            update={"message": f"verification Job {job_name} measures {config.label()} at "
                    f"{ref.input_tokens} in / {ref.output_tokens} out, concurrency "
                    f"{plan.concurrency}, {plan.requests} requests"})  # fmt: skip
        return _decided(transition, running)
    if outcome.state == "succeeded":
        why = f"verification Job {job_name} succeeded but left no result in {cm_name(name)}"
    else:
        pods = ctx.kube.list(PODS, namespace, {"job-name": job_name})
        why = tuner_outcome.job_failure_message(
            job_name, outcome, tuner_outcome.pod_failure(pods), ""
        ).replace("tuner Job", "verification Job")
    return _decided(transition, base.model_copy(update={"state": "Failed", "message": why}))


def cm_name(name: str) -> str:
    return naming.verification_configmap_name(name)


def _decided(transition: Transition, status: VerificationStatus) -> Transition:
    value, reason = _CONDITION[status.state]
    return _with(transition, Cond(value, reason, status.message or ""), status)


def _start(
    ctx: Context, obj: InferenceDeployment, body: Body, ref: verification.Reference, vhash: str,
    th: str,
) -> Body | None:  # fmt: skip
    """Create the verification Job (and delete those of earlier rollouts); None when refused."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    creates.ensure_tuner_rbac(ctx, namespace)
    desired = verification.verification_job(obj, body, ref, vhash, th, ctx.settings)
    try:
        job, created = creates.create_owned(ctx, desired, body)
    except (creates.NotOurs, ClientError) as exc:
        if (why := creates.refused(exc)) is None:
            raise
        logger.warning("%s/%s: verification Job refused: %s", namespace, name, why)
        return None
    if created:
        logger.info("%s/%s: verification Job %s created", namespace, name, job["metadata"]["name"])
        keep = [job["metadata"]["name"]]
        creates.delete_other_jobs(ctx, namespace, name, naming.COMPONENT_VERIFICATION, keep)
    return job
