"""The reconcile loop: converge one InferenceDeployment (reads, decisions, writes).

:func:`sync` reads what is (the object, its report ConfigMap, its tuner Job, its serving
Deployment), asks ``policy`` what should be, writes the difference through ``kube`` and posts
an event per condition transition. It is level-triggered: every trigger in ``handlers`` (a spec
change, an event of an object we own, the periodic resync) calls it, and calling it twice does
no harm. Calls for one object are serialised with a per-object lock.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from infertune_operator import naming
from infertune_operator.api.advisories import advisories
from infertune_operator.api.feasibility import feasibility_problems, weights_problem
from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.engine import creates, retune_sync, status_writes, verify_sync
from infertune_operator.engine.context import Context, RetryLater
from infertune_operator.kube.errors import ClientError, KubeError
from infertune_operator.kube.resources import CONFIGMAPS, INFERENCEDEPLOYMENTS, JOBS, PODS
from infertune_operator.naming import Body
from infertune_operator.objects import tuner_deadline, tuner_job, tuner_workers
from infertune_operator.objects.serving import render_serving
from infertune_operator.policy import conditions, tuner_outcome
from infertune_operator.policy.serving import (
    TunedReport,
    apply_failed,
    cannot_serve,
    deployment_availability,
    serving,
)
from infertune_operator.policy.tuning import (
    best_config,
    config_from_status,
    invalid_spec,
    is_brand_new,
    no_feasible_config,
    tuning_hash,
    tuning_job_failed,
    tuning_pending,
    tuning_rejected,
    tuning_started,
    tuning_underway,
    validate,
)
from infertune_operator.reports.owner import foreign_reason, request_difference
from infertune_operator.reports.store import parse_report, trials_total, writer_job_uid
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError

logger = logging.getLogger("infertune.operator")


class _NotNew(Exception):
    """The create shortcut found something that already exists: converge the long way."""


def sync(
    ctx: Context, namespace: str, name: str, *, created_body: Body | None = None
) -> str | None:
    """Converge one InferenceDeployment; returns its phase (None when it is gone).

    ``created_body``: the body of the event that called for this sync. For a brand-new object (no
    status; see ``policy.tuning.is_brand_new``) whose first sync in this process this is, the
    create path is cut short: that body stands in for re-reading the object (nothing of ours
    can have written to it since), and the tuner Job is created without looking it up first
    (it cannot exist yet, unless an operator died between creating it and writing the status:
    then the create answers 409 AlreadyExists). The report ConfigMap is still read: a report can
    be seeded before the object is created, and only the API server can say it is not there.
    Anything that exists after all (a report, the Job, the request) falls back to the full sync
    (which reads everything, as for any other trigger). The create path's status write goes to
    the status writer (``Context.defer``): in a burst, the next objects' Jobs come first.

    A sync that fails on a transient API error (5xx, no answer, 408/409/429) raises
    :class:`RetryLater` with the delay ``ctx.backoff`` gives it (the caller schedules the retry);
    once such failures last (``status_writes.OUTAGE_ATTEMPTS``), the status says so where it can still be
    written (``Synced=False ApiUnavailable``), and the first sync that goes through again says
    that it recovered.
    """
    lock = ctx.lock(namespace, name)
    lock.acquire()
    held = True
    body: Body | None = created_body
    try:
        first = ctx.first_sync(namespace, name)
        if created_body is not None and first and is_brand_new(created_body):
            try:
                transition, th = _decide(ctx, created_body, new=True)
            except _NotNew:
                pass
            else:
                ctx.remember(namespace, name, transition.phase)
                write = functools.partial(
                    status_writes.write_new_status, ctx, created_body, transition, th
                )
                ctx.defer(write, lock, on_retry=functools.partial(_schedule, ctx, namespace, name))
                held = False  # the status writer releases it
                return transition.phase
        body = ctx.kube.get(INFERENCEDEPLOYMENTS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.remember(namespace, name, None)
            return None
        return _converge(ctx, body)
    except KubeError as exc:
        if not exc.retryable:
            raise
        raise status_writes.retry_later(ctx, namespace, name, body, exc) from exc
    finally:
        if held:
            lock.release()


def _schedule(ctx: Context, namespace: str, name: str, retry: RetryLater) -> None:
    ctx.schedule_retry(namespace, name, retry.delay)


def _converge(ctx: Context, body: Body) -> str:
    meta = body["metadata"]
    transition, th = _decide(ctx, body)
    status_writes.write_status(ctx, body, transition, th)
    ctx.remember(meta["namespace"], meta["name"], transition.phase)
    return transition.phase


def _decide(
    ctx: Context, body: Body, *, new: bool = False
) -> tuple[conditions.Transition, str | None]:
    obj, problems = validate(body)
    if obj is None:
        return invalid_spec(problems), None
    th = tuning_hash(body["spec"], ctx.settings)
    config = config_from_status(body.get("status"), th)
    # Started or tuned: a check a newer operator adds never stops it (only a new tuning).
    admitted = config is not None or tuning_underway(body.get("status"), th)
    if problems := _spec_problems(ctx, obj):
        if not admitted:  # refused anyway: with everything else `infertune validate` says
            problems = _spec_problems(ctx, obj, feasibility=True)
        return invalid_spec(problems), None
    tuned: TunedReport | None = None
    if config is None:
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        cm_name = naming.report_configmap_name(name)
        cm = ctx.kube.get(CONFIGMAPS, namespace, cm_name)
        if (why := foreign_reason(cm, uid=meta.get("uid"), th=th)) is not None:
            if not admitted and (problems := _spec_problems(ctx, obj, feasibility=True)):
                return invalid_spec(problems), None  # no Job for an impossible spec
            return _tuning(ctx, obj, body, th, new=new, no_report=why), th
        if new:  # tuned before this object existed: serving reads the rest
            raise _NotNew
        assert cm is not None
        try:
            report = parse_report(cm)
        except ValueError as exc:
            msg = f"report ConfigMap {cm_name} for tuning {th} is unreadable: {exc}"
            return tuning_job_failed(msg), th
        expected = tuner_job.tuning_request(obj, ctx.settings)
        if (diff := request_difference(report.request, expected)) is not None:
            # Labelled for this tuning, but it answers another request (a stale writer).
            why = f"the report answers another request ({diff})"
            logger.warning("%s/%s: ignoring ConfigMap %s: %s", namespace, name, cm_name, why)
            if not admitted and (problems := _spec_problems(ctx, obj, feasibility=True)):
                return invalid_spec(problems), None
            return _tuning(ctx, obj, body, th, no_report=why), th
        total = trials_total(cm, report)
        if report.best is None:
            return no_feasible_config(report, cm_name, total), th
        config = best_config(report)
        tuned = TunedReport(report, cm_name, total)
        _stop_duplicate_tuner(ctx, body, th, cm)
    retuned, retune_fields, events = retune_sync.follow(ctx, obj, body, th, config)
    config = retuned or config  # a rolled-out retune serves its best
    try:
        deployment = _apply_serving(ctx, obj, body, config)
    except InputError as exc:  # deterministic (e.g. no checkpoint for the winner): no retry
        problem = str(exc).removeprefix(f"cannot serve {config.label()}: ")
        return cannot_serve(config, problem, tuned), th
    except ClientError as exc:
        if exc.retryable:  # 408/409/429: about timing, not content (the resync retries)
            raise
        # The server refused what we rendered (400 BadRequest, 422 Invalid, 403 by a policy):
        # the same request gets the same answer, so say why instead of retrying it.
        status = body.get("status")
        return apply_failed(config, str(exc), tuned, status), th
    availability = deployment_availability(deployment, obj.spec.serving.replicas)
    meta = body["metadata"]
    transition = serving(
        name=meta["name"],
        namespace=meta["namespace"],
        config=config,
        availability=availability,
        tuned=tuned,
    )
    if retune_fields or events:
        fields = transition.fields.model_copy(update=retune_fields)
        transition = replace(transition, fields=fields, events=events)
    return verify_sync.verify(ctx, obj, body, th, config, transition), th


def _spec_problems(
    ctx: Context, obj: InferenceDeployment, *, feasibility: bool = False
) -> list[str]:
    """Why this valid spec cannot be tuned here (an empty list: nothing).

    Always: parallel workers with no study database, weights the backend cannot load. With
    ``feasibility`` (before a tuning starts), also every reason ``infertune validate`` gives,
    asked for the backend the tuner Job would run: an empty search space, no configuration that
    fits in GPU memory, a storage URL that cannot work.
    """
    problems: list[str] = []
    if (parallel := tuner_workers.parallel_problem(obj, ctx.settings)) is not None:
        problems.append(parallel)
    backend = ctx.settings.backend_for(obj)
    if feasibility:  # the weights included
        problems += [str(p) for p in feasibility_problems(obj, backend=backend)]
    else:
        request = to_request(obj, default_backend=ctx.settings.default_backend)
        if (weights := weights_problem(request, backend)) is not None:
            problems.append(str(weights))
    return problems


def _tuning(
    ctx: Context,
    obj: InferenceDeployment,
    body: Body,
    th: str,
    *,
    new: bool = False,
    no_report: str = "there is no report",
) -> conditions.Transition:
    """No report for this hash yet: start the tuner Job, adopt it, or explain its failure.

    ``new``: a brand-new object (see ``sync``): create the Job without looking it up first.
    ``no_report``: why the report ConfigMap is not this tuning's (for a Job that succeeded).
    A Job of this name that an earlier object of the same name owns is not adopted: it is
    replaced (see :func:`_create_owned`).
    """
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    names = tuner_job.tuner_job_names(obj, name, th, ctx.settings)  # one, or one per GPU pool
    found: dict[str, Body] = {}
    for job_name in [] if new else names:
        job = ctx.kube.get(JOBS, namespace, job_name)
        if job is not None and naming.owner_uid(job) == body["metadata"].get("uid"):
            found[job_name] = job  # an earlier object's is never adopted
    created = set(names) - set(found)
    if created:
        try:
            wanted = tuner_job.tuner_jobs(obj, body, th, ctx.settings)
            missing = [j for j in wanted if j["metadata"]["name"] in created]
            started = _start_tuning(ctx, obj, body, th, missing)
        except (creates.NotOurs, ClientError) as exc:
            if (why := creates.refused(exc)) is None:
                raise
            return tuning_rejected(why)  # refused: say why, do not retry
        if new and not all(fresh for _, fresh in started):  # 409: an earlier operator made it
            raise _NotNew
        found.update((job["metadata"]["name"], job) for job, _ in started)
        if any(fresh for _, fresh in started) and not found.keys() - created:
            # once per tuning: what will probably fail, before GPU time is spent on it
            for advisory in advisories(
                obj, default_backend=ctx.settings.default_backend,
                model_storage_pvc=ctx.settings.model_storage_pvc,
            ):  # fmt: skip
                ctx.post_event(body, conditions.Event("Warning", advisory.reason, advisory.message))
    outcomes = {n: tuner_outcome.job_outcome(found[n]) for n in names}
    failed = [n for n in names if outcomes[n].state == "failed"]
    if failed:  # one pool's Job failed: its trials cannot run, the study cannot finish
        return _job_failed(ctx, namespace, found[failed[0]], outcomes[failed[0]])
    if all(o.state == "succeeded" for o in outcomes.values()):
        cm = naming.report_configmap_name(name)
        jobs = f"Job {names[0]}" if len(names) == 1 else f"Jobs {', '.join(names)}"
        return tuning_job_failed(
            f"tuner {jobs} succeeded but left no report for tuning {th} in ConfigMap "
            f"{cm} ({no_report}). See `kubectl logs job/{names[0]}`; delete the Job to retry."
        )
    waiting = [n for n in names if outcomes[n].state == "pending"]
    if waiting and not any(o.state == "running" for o in outcomes.values()):
        detail = None
        if waiting[0] not in created:  # a Job just created has no pods to ask about yet
            pods = ctx.kube.list(PODS, namespace, {"job-name": waiting[0]})
            detail = tuner_outcome.pod_waiting_reason(pods)
        return tuning_pending(waiting, detail, body.get("status"))
    running = [n for n in names if outcomes[n].state == "running"]
    return tuning_started(running, body.get("status"))


def _job_failed(
    ctx: Context, namespace: str, job: Body, outcome: tuner_outcome.JobOutcome
) -> conditions.Transition:
    """A failed tuner Job, said with what its pod left: the reason, the log's tail."""
    job_name = job["metadata"]["name"]
    pods = ctx.kube.list(PODS, namespace, {"job-name": job_name})
    failure = tuner_outcome.pod_failure(pods)
    logs = ""
    if failure is not None and failure.container and not failure.message:
        try:
            logs = ctx.kube.pod_log_tail(namespace, failure.pod, failure.container)
        except KubeError as exc:
            logger.debug("no logs for %s: %s", failure.pod, exc)
    deadline = tuner_deadline.deadline_text(job)
    message = tuner_outcome.job_failure_message(job_name, outcome, failure, logs, deadline)
    if tuner_outcome.ended_on_deadline(outcome):
        return tuning_job_failed(message, conditions.TUNING_DEADLINE_EXCEEDED)
    return tuning_job_failed(message)


def _start_tuning(
    ctx: Context, obj: InferenceDeployment, body: Body, th: str, jobs: list[Body]
) -> list[tuple[Body, bool]]:
    """Create the request ConfigMap and the tuner Jobs `jobs`: each (the Job, whether new)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    creates.ensure_tuner_rbac(ctx, namespace)
    creates.create_owned(ctx, tuner_job.request_configmap(obj, body, th, ctx.settings), body)
    out = []
    for wanted in jobs:
        job, created = creates.create_owned(ctx, wanted, body)
        logger.info("%s/%s: tuner Job %s %s", namespace, name, job["metadata"]["name"],
                    "created" if created else "adopted")  # fmt: skip
        out.append((job, created))
    previous = (body.get("status") or {}).get("tuningHash")
    if previous and previous != th:  # a first tuning has nothing to supersede
        _delete_superseded(ctx, namespace, name, th)
    return out


def _delete_superseded(ctx: Context, namespace: str, name: str, th: str) -> None:
    """Tuner Jobs (and their request ConfigMaps) of an earlier spec: stop them, free the GPUs."""
    jobs = ctx.kube.list(JOBS, namespace, {naming.LABEL_DEPLOYMENT: name})
    for old in tuner_job.superseded(jobs, th):
        logger.info("%s/%s: deleting superseded tuner Job %s", namespace, name, old)
        ctx.kube.delete(JOBS, namespace, old)
    requests = ctx.kube.list(
        CONFIGMAPS,
        namespace,
        {naming.LABEL_DEPLOYMENT: name, naming.LABEL_COMPONENT: naming.COMPONENT_REQUEST},
    )
    for old in tuner_job.superseded(requests, th):
        ctx.kube.delete(CONFIGMAPS, namespace, old)


def _stop_duplicate_tuner(ctx: Context, body: Body, th: str, report_cm: Body) -> None:
    """The report of tuning ``th`` came from another tuner Job than the one of that name now:
    a Job deleted by hand was created again while its pod still ran, and that pod answered.
    Stop the second Job: its GPUs would tune the same question again (and it would write
    the same report again)."""
    writer = writer_job_uid(report_cm)
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    job_name = naming.job_name(name, th)
    if writer is None:
        return  # an earlier tuner did not say who it was: nothing to compare
    job = ctx.kube.get(JOBS, namespace, job_name)
    if job is None or job["metadata"].get("uid") in (None, writer):
        return
    if naming.owner_uid(job) != meta.get("uid"):
        return  # an earlier object's: the garbage collector's
    if tuner_outcome.job_outcome(job).state not in ("pending", "running"):
        return
    uid = job["metadata"]["uid"]
    if ctx.kube.delete(JOBS, namespace, job_name, uid=uid):
        logger.info("%s/%s: deleted tuner Job %s (uid %s): tuning %s was answered by Job uid %s",
                    namespace, name, job_name, uid, th, writer)  # fmt: skip
        message = (
            f"tuning {th} was answered by an earlier tuner Job of this name (uid {writer}, "
            f"deleted while its pod ran): stopped the tuner Job {job_name} created after it"
        )
        ctx.post_event(body, conditions.Event("Normal", "DuplicateTunerStopped", message))


def _apply_serving(
    ctx: Context, obj: InferenceDeployment, body: Body, config: TrialConfig
) -> Body | None:
    """Render Triton (or simserver) for the best config; server-side apply what changed.

    Server-side apply (see ``kube.client``): a field an earlier render set and this one leaves out (a
    nodeSelector key, the tolerations of another GPU pool) is removed from the live object.
    An object whose render hash is unchanged is not written at all.
    """
    deployment: Body | None = None
    for rendered in render_serving(obj, config, ctx.settings):
        desired = naming.owned(rendered, body)
        live = ctx.kube.apply(desired, changed=naming.needs_apply)
        if desired.get("kind") == "Deployment":
            deployment = live
    return deployment
