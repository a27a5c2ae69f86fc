"""The reconcile loop: converge one InferenceDeployment (reads, decisions, writes).

:func:`sync` reads what is (the object, its report ConfigMap, its tuner Job, its serving
Deployment), asks ``reconcile`` what should be, writes the difference through ``k8s`` and posts
an event per condition transition. It is level-triggered: every trigger in ``handlers`` (a spec
change, an event of an object we own, the periodic resync) calls it, and calling it twice does
no harm. Calls for one object are serialised with a per-object lock.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infertune_operator import (
    conditions,
    k8s,
    naming,
    reconcile,
    reconcile_serving,
    report_store,
    tuner_job,
    tuner_outcome,
    tuner_workers,
)
from infertune_operator.api.advisories import advisories
from infertune_operator.api.models import InferenceDeployment
from infertune_operator.naming import Body
from infertune_operator.render import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError

logger = logging.getLogger("infertune.operator")

EventPoster = Callable[[Body, conditions.Event], None]

RESYNC_INTERVAL_S = 60.0
IN_FLIGHT = frozenset({"Pending", "Tuning", "Deploying"})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log_event(body: Body, event: conditions.Event) -> None:
    """Where events go when no Kopf handler context can post them (tests, scripts)."""
    logger.debug("event %s %s for %s: %s", event.type, event.reason,
                 body.get("metadata", {}).get("name"), event.message)  # fmt: skip


@dataclass
class Context:
    """What every sync needs; lives in Kopf's memo (shared by all objects)."""

    kube: k8s.Kube
    settings: Settings
    post_event: EventPoster = log_event
    clock: Callable[[], str] = _now
    resync_interval: float = RESYNC_INTERVAL_S
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _phases: dict[tuple[str, str], str | None] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _rbac_lock: threading.Lock = field(default_factory=threading.Lock)
    _rbac_ready: set[str] = field(default_factory=set)
    _synced: set[tuple[str, str]] = field(default_factory=set)
    _claimed: dict[tuple[str, str], int | None] = field(default_factory=dict)
    _kopf_context: contextvars.Context | None = None
    _writer: ThreadPoolExecutor | None = None

    def capture_kopf_context(self) -> None:
        """Remember a handler's context: Kopf's event posting lives in context variables."""
        if self._kopf_context is None:
            self._kopf_context = contextvars.copy_context()

    def in_kopf_context(self) -> Callable[..., Any]:
        """A `run` for code outside Kopf's handlers (the resync) that posts events."""
        base = self._kopf_context or contextvars.copy_context()
        return base.copy().run

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def claim(self, namespace: str, name: str, generation: int | None) -> bool:
        """True once per object and spec generation: the first event of an object in this
        process, then each spec change (the API server bumps metadata.generation on spec changes
        only, so our own status writes and repeated events of one generation claim nothing)."""
        key = (namespace, name)
        with self._guard:
            if key in self._claimed and self._claimed[key] == generation:
                return False
            self._claimed[key] = generation
            return True

    def first_sync(self, namespace: str, name: str) -> bool:
        """True once per object and process: no sync of it has started before this one."""
        with self._guard:
            if (namespace, name) in self._synced:
                return False
            self._synced.add((namespace, name))
            return True

    def remember(self, namespace: str, name: str, phase: str | None) -> None:
        with self._guard:
            if phase is None:
                self._locks.pop((namespace, name), None)
                self._phases.pop((namespace, name), None)
                self._synced.discard((namespace, name))
                self._claimed.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = phase

    def in_flight(self, *, everything: bool = False) -> list[tuple[str, str]]:
        """The objects whose next step waits on someone else (a Job, a Deployment rollout)."""
        with self._guard:
            return [k for k, phase in self._phases.items() if everything or phase in IN_FLIGHT]

    def defer(self, write: Callable[[], None], lock: threading.Lock) -> None:
        """Run ``write`` on the status writer, one at a time, then release ``lock``.

        The caller holds ``lock`` (the object's) and hands it over: the next sync of the object
        waits until the write is done, so statuses never go back in time. One writer thread,
        so in a burst of creates the status writes queue behind the tuner Jobs instead of
        competing with them for the API server.
        """
        with self._guard:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="infertune-status")
            writer = self._writer
        run = self.in_kopf_context()  # the writes post events

        def task() -> None:
            try:
                run(write)
            except k8s.KubeError as exc:  # the object stays in flight: the resync writes it
                logger.warning("status write failed (the resync retries): %s", exc)
            finally:
                lock.release()

        writer.submit(task)

    def close(self) -> None:
        """Stop the status writer (writes not started yet are dropped; a restart redoes them)."""
        if self._writer is not None:
            self._writer.shutdown(wait=False, cancel_futures=True)


class _NotNew(Exception):
    """The create shortcut found something that already exists: converge the long way."""


def sync(
    ctx: Context, namespace: str, name: str, *, created_body: Body | None = None
) -> str | None:
    """Converge one InferenceDeployment; returns its phase (None when it is gone).

    ``created_body``: the body of the event that called for this sync. For a brand-new object (no
    status; see ``reconcile.is_brand_new``) whose first sync in this process this is, the
    create path is cut short: that body stands in for re-reading the object (nothing of ours
    can have written to it since), and the tuner Job is created without looking it up first
    (it cannot exist yet, unless an operator died between creating it and writing the status:
    then the create answers 409 AlreadyExists). The report ConfigMap is still read: a report can
    be seeded before the object is created, and only the API server can say it is not there.
    Anything that exists after all (a report, the Job, the request) falls back to the full sync
    (which reads everything, as for any other trigger). The create path's status write goes to
    the status writer (``Context.defer``): in a burst, the next objects' Jobs come first.
    """
    lock = ctx.lock(namespace, name)
    lock.acquire()
    held = True
    try:
        first = ctx.first_sync(namespace, name)
        if created_body is not None and first and reconcile.is_brand_new(created_body):
            try:
                transition, th = _decide(ctx, created_body, new=True)
            except _NotNew:
                pass
            else:
                ctx.remember(namespace, name, transition.phase)
                write = functools.partial(_write_status, ctx, created_body, transition, th)
                ctx.defer(write, lock)
                held = False  # the status writer releases it
                return transition.phase
        body = ctx.kube.get(k8s.INFERENCEDEPLOYMENTS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.remember(namespace, name, None)
            return None
        return _converge(ctx, body)
    finally:
        if held:
            lock.release()


def _converge(ctx: Context, body: Body) -> str:
    meta = body["metadata"]
    transition, th = _decide(ctx, body)
    _write_status(ctx, body, transition, th)
    ctx.remember(meta["namespace"], meta["name"], transition.phase)
    return transition.phase


def _decide(
    ctx: Context, body: Body, *, new: bool = False
) -> tuple[conditions.Transition, str | None]:
    obj, problems = reconcile.validate(body)
    if obj is None:
        return reconcile.invalid_spec(problems), None
    if (problem := tuner_workers.parallel_problem(obj, ctx.settings)) is not None:
        return reconcile.invalid_spec([problem]), None
    th = reconcile.tuning_hash(body["spec"], ctx.settings)
    config = reconcile.config_from_status(body.get("status"), th)
    tuned: tuple[Any, str] | None = None
    if config is None:
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        cm_name = naming.report_configmap_name(name)
        cm = ctx.kube.get(k8s.CONFIGMAPS, namespace, cm_name)
        if report_store.configmap_hash(cm) != th:
            return _tuning(ctx, obj, body, th, new=new), th
        if new:  # tuned before this object existed: serving reads the rest
            raise _NotNew
        assert cm is not None
        try:
            report = report_store.parse_report(cm)
        except ValueError as exc:
            msg = f"report ConfigMap {cm_name} for tuning {th} is unreadable: {exc}"
            return reconcile.tuning_job_failed(msg), th
        if report.best is None:
            return reconcile.no_feasible_config(report, cm_name), th
        config, tuned = reconcile.best_config(report), (report, cm_name)
    try:
        deployment = _apply_serving(ctx, obj, body, config)
    except InputError as exc:  # deterministic (e.g. no checkpoint for the winner): no retry
        problem = str(exc).removeprefix(f"cannot serve {config.label()}: ")
        return reconcile_serving.cannot_serve(config, problem, tuned), th
    except k8s.ClientError as exc:
        if exc.retryable:  # 408/409/429: about timing, not content (the resync retries)
            raise
        # The server refused what we rendered (400 BadRequest, 422 Invalid, 403 by a policy):
        # the same request gets the same answer, so say why instead of retrying it.
        status = body.get("status")
        return reconcile_serving.apply_failed(config, str(exc), tuned, status), th
    availability = reconcile_serving.deployment_availability(deployment, obj.spec.serving.replicas)
    meta = body["metadata"]
    transition = reconcile_serving.serving(
        name=meta["name"],
        namespace=meta["namespace"],
        config=config,
        availability=availability,
        tuned=tuned,
    )
    return transition, th


def _tuning(
    ctx: Context, obj: InferenceDeployment, body: Body, th: str, *, new: bool = False
) -> conditions.Transition:
    """No report for this hash yet: start the tuner Job, adopt it, or explain its failure.

    ``new``: a brand-new object (see ``sync``): create the Job without looking it up first.
    """
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    job_name = naming.job_name(name, th)
    job = None if new else ctx.kube.get(k8s.JOBS, namespace, job_name)
    created = job is None
    if job is None:
        try:
            job, fresh = _start_tuning(ctx, obj, body, th)
        except k8s.ClientError as exc:
            if exc.retryable:
                raise
            return reconcile.tuning_rejected(str(exc))  # refused: say why, do not retry
        if new and not fresh:  # 409: it existed after all (an earlier operator made it)
            raise _NotNew
        if fresh:  # once per tuning: what will probably fail, before GPU time is spent on it
            for advisory in advisories(
                obj, default_backend=ctx.settings.default_backend,
                model_storage_pvc=ctx.settings.model_storage_pvc,
            ):  # fmt: skip
                ctx.post_event(body, conditions.Event("Warning", advisory.reason, advisory.message))
    outcome = tuner_outcome.job_outcome(job)
    if outcome.state == "pending":
        detail = None
        if not created:  # a Job just created has no pods to ask about yet
            pods = ctx.kube.list(k8s.PODS, namespace, {"job-name": job_name})
            detail = tuner_outcome.pod_waiting_reason(pods)
        return reconcile.tuning_pending(job_name, detail, body.get("status"))
    if outcome.state == "running":
        return reconcile.tuning_started(job_name, body.get("status"))
    if outcome.state == "succeeded":
        cm = naming.report_configmap_name(name)
        return reconcile.tuning_job_failed(
            f"tuner Job {job_name} succeeded but left no report for tuning {th} in ConfigMap "
            f"{cm}. See `kubectl logs job/{job_name}`; delete the Job to retry."
        )
    pods = ctx.kube.list(k8s.PODS, namespace, {"job-name": job_name})
    failure = tuner_outcome.pod_failure(pods)
    logs = ""
    if failure is not None and failure.container and not failure.message:
        try:
            logs = ctx.kube.pod_log_tail(namespace, failure.pod, failure.container)
        except k8s.KubeError as exc:
            logger.debug("no logs for %s: %s", failure.pod, exc)
    return reconcile.tuning_job_failed(
        tuner_outcome.job_failure_message(job_name, outcome, failure, logs)
    )


def _start_tuning(ctx: Context, obj: InferenceDeployment, body: Body, th: str) -> tuple[Body, bool]:
    """Create the request ConfigMap and the tuner Job: (the Job, whether it is new)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    if namespace not in ctx._rbac_ready:  # once per namespace and operator process
        with ctx._rbac_lock:
            if namespace not in ctx._rbac_ready:
                ctx.kube.ensure(tuner_job.tuner_service_account(namespace, ctx.settings))
                ctx.kube.ensure(tuner_job.tuner_role_binding(namespace, ctx.settings))
                ctx._rbac_ready.add(namespace)
    ctx.kube.create(tuner_job.request_configmap(obj, body, th, ctx.settings))
    job, created = ctx.kube.create(tuner_job.tuner_job(obj, body, th, ctx.settings))
    logger.info("%s/%s: tuner Job %s %s", namespace, name, job["metadata"]["name"],
                "created" if created else "adopted")  # fmt: skip
    previous = (body.get("status") or {}).get("tuningHash")
    if previous and previous != th:  # a first tuning has nothing to supersede
        _delete_superseded(ctx, namespace, name, th)
    return job, created


def _delete_superseded(ctx: Context, namespace: str, name: str, th: str) -> None:
    """Tuner Jobs (and their request ConfigMaps) of an earlier spec: stop them, free the GPUs."""
    jobs = ctx.kube.list(k8s.JOBS, namespace, {naming.LABEL_DEPLOYMENT: name})
    for old in tuner_job.superseded(jobs, th):
        logger.info("%s/%s: deleting superseded tuner Job %s", namespace, name, old)
        ctx.kube.delete(k8s.JOBS, namespace, old)
    requests = ctx.kube.list(
        k8s.CONFIGMAPS,
        namespace,
        {naming.LABEL_DEPLOYMENT: name, naming.LABEL_COMPONENT: naming.COMPONENT_REQUEST},
    )
    for old in tuner_job.superseded(requests, th):
        ctx.kube.delete(k8s.CONFIGMAPS, namespace, old)


def _apply_serving(
    ctx: Context, obj: InferenceDeployment, body: Body, config: TrialConfig
) -> Body | None:
    """Render Triton (or simserver) for the best config; server-side apply what changed.

    Server-side apply (see ``k8s``): a field an earlier render set and this one leaves out (a
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


def _write_status(
    ctx: Context, body: Body, transition: conditions.Transition, th: str | None
) -> None:
    meta = body["metadata"]
    old = body.get("status") or {}
    generation = meta.get("generation")
    new = conditions.next_status(
        old, transition, generation=generation, now=ctx.clock(), tuning_hash=th
    )
    patch = conditions.status_patch(old, new)
    if patch:
        try:
            ctx.kube.patch(
                k8s.INFERENCEDEPLOYMENTS, meta["namespace"], meta["name"], {"status": patch},
                subresource="status",
            )  # fmt: skip
        except k8s.NotFound:
            return
    for event in conditions.transition_events(old, new):
        ctx.post_event(body, event)
