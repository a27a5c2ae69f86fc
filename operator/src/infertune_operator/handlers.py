"""Kopf handlers: the thin I/O shell around the pure decisions in ``reconcile``.

One level-triggered function, :func:`sync`, converges one InferenceDeployment: it reads what is
(the object, its report ConfigMap, its tuner Job, its serving Deployment), asks ``reconcile``
what should be, writes the difference and posts an event per condition transition. (A brand-new
object skips the reads of what cannot exist yet; see :func:`sync`.) Every trigger calls it:

* spec changes of the InferenceDeployment (create / update of ``spec`` / resume on restart);
* events of the objects we labelled (``infertune.io/deployment``): a tuner Job starting or
  finishing, a report ConfigMap written by the tuner, a Deployment becoming available, someone
  deleting one of them;
* a periodic resync of the objects that are Pending, Tuning or Deploying, in case an event was
  missed, a pod waits for a reason worth showing (unschedulable, image pull), or
  a sync failed on a transient API error. (One operator-wide loop, not a Kopf timer: Kopf puts
  a finalizer on every object with a timer, and this operator needs none.)

Handlers are synchronous: Kopf runs them in its thread pool, and calls for one object are
serialised with a per-object lock (Kopf serialises per resource kind, not across kinds).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from infertune_operator import k8s, reconcile
from infertune_operator.api.models import GROUP, PLURAL, VERSION, InferenceDeployment
from infertune_operator.render import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError

logger = logging.getLogger("infertune.operator")

Body = dict[str, Any]
EventPoster = Callable[[Body, reconcile.Event], None]

RESYNC_INTERVAL_S = 60.0
HANDLER_THREADS = 32  # Kopf's pool for the synchronous handlers (k8s.py's connection pool > it)
FULL_RESYNC_EVERY = 10  # every 10th resync also covers Ready and Failed objects
IN_FLIGHT = frozenset({"Pending", "Tuning", "Deploying"})
REPORT_SELECTOR = f"{reconcile.LABEL_DEPLOYMENT},{reconcile.LABEL_COMPONENT}=tuning-report"
DOMAIN_PREFIX = reconcile.DOMAIN
FINALIZER = f"{DOMAIN_PREFIX}/finalizer"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kopf_event(body: Body, event: reconcile.Event) -> None:
    # Kopf accepts plain dicts here (it only reads apiVersion, kind and metadata).
    try:
        kopf.event(
            cast(Any, body), type=event.type, reason=event.reason, message=event.message[:1000]
        )
    except LookupError:  # outside Kopf's handler context: the status already says it
        logger.debug("event %s for %s not posted (no Kopf context)", event.reason, body)


@dataclass
class Context:
    """What every handler needs; lives in Kopf's memo (shared by all objects)."""

    kube: k8s.Kube
    settings: Settings
    post_event: EventPoster = kopf_event
    clock: Callable[[], str] = _now
    resync_interval: float = RESYNC_INTERVAL_S
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _phases: dict[tuple[str, str], str | None] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _rbac_lock: threading.Lock = field(default_factory=threading.Lock)
    _rbac_ready: set[str] = field(default_factory=set)
    _synced: set[tuple[str, str]] = field(default_factory=set)
    _kopf_context: contextvars.Context | None = None

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
            else:
                self._phases[(namespace, name)] = phase

    def in_flight(self, *, everything: bool = False) -> list[tuple[str, str]]:
        """The objects whose next step waits on someone else (a Job, a Deployment rollout)."""
        with self._guard:
            return [k for k, phase in self._phases.items() if everything or phase in IN_FLIGHT]


# ------------------------------------------------------------------ the reconcile loop


class _NotNew(Exception):
    """The create shortcut found something that already exists: converge the long way."""


def sync(
    ctx: Context, namespace: str, name: str, *, created_body: Body | None = None
) -> str | None:
    """Converge one InferenceDeployment; returns its phase (None when it is gone).

    ``created_body``: the body Kopf handed to the create handler. For a brand-new object (no
    status; see ``reconcile.is_brand_new``) whose first sync in this process this is, the
    create path is cut short: that body stands in for re-reading the object (nothing of ours
    can have written to it since), and the tuner Job is created without looking it up first
    (it cannot exist yet, unless an operator died between creating it and writing the status:
    then the create answers 409 AlreadyExists). The report ConfigMap is still read: a report can
    be seeded before the object is created, and only the API server can say it is not there.
    Anything that exists after all (a report, the Job, the request) falls back to the full sync
    (which reads everything, as for any other trigger).
    """
    with ctx.lock(namespace, name):
        first = ctx.first_sync(namespace, name)
        if created_body is not None and first and reconcile.is_brand_new(created_body):
            with contextlib.suppress(_NotNew):
                return _converge(ctx, created_body, new=True)
        body = ctx.kube.get(k8s.INFERENCEDEPLOYMENTS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            ctx.remember(namespace, name, None)
            return None
        return _converge(ctx, body)


def _converge(ctx: Context, body: Body, *, new: bool = False) -> str:
    meta = body["metadata"]
    transition, th = _decide(ctx, body, new=new)
    _write_status(ctx, body, transition, th)
    ctx.remember(meta["namespace"], meta["name"], transition.phase)
    return transition.phase


def _decide(
    ctx: Context, body: Body, *, new: bool = False
) -> tuple[reconcile.Transition, str | None]:
    obj, problems = reconcile.validate(body)
    if obj is None:
        return reconcile.invalid_spec(problems), None
    th = reconcile.tuning_hash(body["spec"], ctx.settings)
    config = reconcile.config_from_status(body.get("status"), th)
    tuned: tuple[Any, str] | None = None
    if config is None:
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        cm_name = reconcile.report_configmap_name(name)
        cm = ctx.kube.get(k8s.CONFIGMAPS, namespace, cm_name)
        if reconcile.configmap_hash(cm) != th:
            return _tuning(ctx, obj, body, th, new=new), th
        if new:  # tuned before this object existed: serving reads the rest
            raise _NotNew
        assert cm is not None
        try:
            report = reconcile.parse_report(cm)
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
        return reconcile.cannot_serve(config, problem, tuned), th
    availability = reconcile.deployment_availability(deployment, obj.spec.serving.replicas)
    meta = body["metadata"]
    transition = reconcile.serving(
        name=meta["name"],
        namespace=meta["namespace"],
        config=config,
        availability=availability,
        tuned=tuned,
    )
    return transition, th


def _tuning(
    ctx: Context, obj: InferenceDeployment, body: Body, th: str, *, new: bool = False
) -> reconcile.Transition:
    """No report for this hash yet: start the tuner Job, adopt it, or explain its failure.

    ``new``: a brand-new object (see ``sync``): create the Job without looking it up first.
    """
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    job_name = reconcile.job_name(name, th)
    job = None if new else ctx.kube.get(k8s.JOBS, namespace, job_name)
    created = job is None
    if job is None:
        job, fresh = _start_tuning(ctx, obj, body, th)
        if new and not fresh:  # 409: it existed after all (an earlier operator made it)
            raise _NotNew
    outcome = reconcile.job_outcome(job)
    if outcome.state == "pending":
        detail = None
        if not created:  # a Job just created has no pods to ask about yet
            pods = ctx.kube.list(k8s.PODS, namespace, {"job-name": job_name})
            detail = reconcile.pod_waiting_reason(pods)
        return reconcile.tuning_pending(job_name, detail, body.get("status"))
    if outcome.state == "running":
        return reconcile.tuning_started(job_name, body.get("status"))
    if outcome.state == "succeeded":
        cm = reconcile.report_configmap_name(name)
        return reconcile.tuning_job_failed(
            f"tuner Job {job_name} succeeded but left no report for tuning {th} in ConfigMap "
            f"{cm}. See `kubectl logs job/{job_name}`; delete the Job to retry."
        )
    pods = ctx.kube.list(k8s.PODS, namespace, {"job-name": job_name})
    failure = reconcile.pod_failure(pods)
    logs = ""
    if failure is not None and failure.container and not failure.message:
        try:
            logs = ctx.kube.pod_log_tail(namespace, failure.pod, failure.container)
        except k8s.KubeError as exc:
            logger.debug("no logs for %s: %s", failure.pod, exc)
    return reconcile.tuning_job_failed(
        reconcile.job_failure_message(job_name, outcome, failure, logs)
    )


def _start_tuning(ctx: Context, obj: InferenceDeployment, body: Body, th: str) -> tuple[Body, bool]:
    """Create the request ConfigMap and the tuner Job: (the Job, whether it is new)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    if namespace not in ctx._rbac_ready:  # once per namespace and operator process
        with ctx._rbac_lock:
            if namespace not in ctx._rbac_ready:
                ctx.kube.ensure(reconcile.tuner_service_account(namespace, ctx.settings))
                ctx.kube.ensure(reconcile.tuner_role_binding(namespace, ctx.settings))
                ctx._rbac_ready.add(namespace)
    ctx.kube.create(reconcile.request_configmap(obj, body, th, ctx.settings))
    job, created = ctx.kube.create(reconcile.tuner_job(obj, body, th, ctx.settings))
    logger.info("%s/%s: tuner Job %s %s", namespace, name, job["metadata"]["name"],
                "created" if created else "adopted")  # fmt: skip
    previous = (body.get("status") or {}).get("tuningHash")
    if previous and previous != th:  # a first tuning has nothing to supersede
        _delete_superseded(ctx, namespace, name, th)
    return job, created


def _delete_superseded(ctx: Context, namespace: str, name: str, th: str) -> None:
    """Tuner Jobs (and their request ConfigMaps) of an earlier spec: stop them, free the GPUs."""
    jobs = ctx.kube.list(k8s.JOBS, namespace, {reconcile.LABEL_DEPLOYMENT: name})
    for old in reconcile.superseded(jobs, th):
        logger.info("%s/%s: deleting superseded tuner Job %s", namespace, name, old)
        ctx.kube.delete(k8s.JOBS, namespace, old)
    requests = ctx.kube.list(
        k8s.CONFIGMAPS,
        namespace,
        {reconcile.LABEL_DEPLOYMENT: name, reconcile.LABEL_COMPONENT: "tuning-request"},
    )
    for old in reconcile.superseded(requests, th):
        ctx.kube.delete(k8s.CONFIGMAPS, namespace, old)


def _apply_serving(
    ctx: Context, obj: InferenceDeployment, body: Body, config: TrialConfig
) -> Body | None:
    """Render Triton (or simserver) for the best config; create or patch what changed."""
    simulated = reconcile.is_simulated(obj, ctx.settings)
    deployment: Body | None = None
    for rendered in render_serving(obj, config, ctx.settings, simulated=simulated):
        desired = reconcile.owned(rendered, body)
        live = ctx.kube.apply(desired, changed=reconcile.needs_apply)
        if desired.get("kind") == "Deployment":
            deployment = live
    return deployment


def _write_status(
    ctx: Context, body: Body, transition: reconcile.Transition, th: str | None
) -> None:
    meta = body["metadata"]
    old = body.get("status") or {}
    generation = meta.get("generation")
    new = reconcile.next_status(
        old, transition, generation=generation, now=ctx.clock(), tuning_hash=th
    )
    patch = reconcile.status_patch(old, new)
    if patch:
        try:
            ctx.kube.patch(
                k8s.INFERENCEDEPLOYMENTS, meta["namespace"], meta["name"], {"status": patch},
                subresource="status",
            )  # fmt: skip
        except k8s.NotFound:
            return
    for event in reconcile.transition_events(old, new):
        ctx.post_event(body, event)


# ------------------------------------------------------------------ Kopf handlers


def _ctx(memo: Any) -> Context:
    ctx: Context = memo.ctx
    return ctx


def _run_sync(ctx: Context, namespace: str, name: str, created_body: Body | None = None) -> None:
    try:
        sync(ctx, namespace, name, created_body=created_body)
    except k8s.KubeError as exc:
        # Transient API trouble: Kopf retries change handlers (the resync covers the others).
        raise kopf.TemporaryError(str(exc), delay=10) from exc


def on_spec(meta: Any, memo: Any, **_: Any) -> None:
    """Spec update and operator restart (resume): converge the object."""
    ctx = _ctx(memo)
    ctx.capture_kopf_context()
    _run_sync(ctx, meta["namespace"], meta["name"])


def on_create(body: Any, meta: Any, memo: Any, retry: int = 0, **_: Any) -> None:
    """Create: converge the object; a brand-new one from the body of Kopf's event (see sync)."""
    ctx = _ctx(memo)
    ctx.capture_kopf_context()
    created_body = None if retry else copy.deepcopy(dict(body))  # a retry reads everything
    _run_sync(ctx, meta["namespace"], meta["name"], created_body)


async def _resync_forever(ctx: Context) -> None:
    """Level-triggered safety net: in-flight objects every interval, all of them now and then
    (a deleted Service or model-repo ConfigMap of a Ready deployment is recreated)."""
    loop = asyncio.get_running_loop()
    for tick in itertools.count(1):
        await asyncio.sleep(ctx.resync_interval)
        for namespace, name in ctx.in_flight(everything=tick % FULL_RESYNC_EVERY == 0):
            try:
                run = ctx.in_kopf_context()
                await loop.run_in_executor(None, functools.partial(run, sync, ctx, namespace, name))
            except Exception as exc:  # keep resyncing the others
                logger.warning("%s/%s: resync failed: %s", namespace, name, exc)


async def start_resync(memo: Any, **_: Any) -> None:
    memo.resync_task = asyncio.create_task(_resync_forever(_ctx(memo)), name="infertune resync")


async def stop_resync(memo: Any, **_: Any) -> None:
    task = getattr(memo, "resync_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def job_has_news(body: Any, type: str | None, **_: Any) -> bool:
    """Kopf's filter for :func:`on_job_event`: a Job that only waits has nothing to report yet
    (the resync picks up why a pod waits). Kopf calls filters in its event loop, so the event of
    every Job just created (one per new InferenceDeployment) costs no trip through the pool of
    handler threads, where it would queue behind the creates of a burst."""
    return type == "DELETED" or reconcile.job_outcome(body).state != "pending"


def on_job_event(body: Any, memo: Any, **_: Any) -> None:
    """A tuner Job started running, finished or vanished: fold that into the owner's status."""
    _owner_sync(body, memo)


def on_report_event(body: Any, memo: Any, **_: Any) -> None:
    """The tuner wrote its report (it exits right after): no need to wait for the Job status."""
    _owner_sync(body, memo)


def on_deployment_event(body: Any, memo: Any, **_: Any) -> None:
    """The serving Deployment changed (availability) or vanished: re-check readiness."""
    _owner_sync(body, memo)


def _owner_sync(body: Any, memo: Any) -> None:
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(reconcile.LABEL_DEPLOYMENT)
    if not owner or not meta.get("namespace"):
        return
    ctx = _ctx(memo)
    ctx.capture_kopf_context()
    try:
        sync(ctx, meta["namespace"], owner)
    except k8s.KubeError as exc:
        logger.warning("%s/%s: sync failed (the resync retries): %s", meta["namespace"], owner, exc)


def build_registry(*, login: Callable[..., Any] | None = None) -> kopf.OperatorRegistry:
    """All handlers on a fresh registry (tests pass their own login, e.g. to a mock server)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    ours = {reconcile.LABEL_DEPLOYMENT: kopf.PRESENT}
    kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)(on_spec)
    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(on_create)
    kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)(on_spec)
    kopf.on.startup(registry=registry)(start_resync)
    kopf.on.cleanup(registry=registry)(stop_resync)
    kopf.on.event("batch", "v1", "jobs", labels=ours, when=job_has_news, registry=registry)(
        on_job_event
    )
    kopf.on.event("apps", "v1", "deployments", labels=ours, registry=registry)(on_deployment_event)
    reports: dict[str, Any] = {
        reconcile.LABEL_DEPLOYMENT: kopf.PRESENT,
        reconcile.LABEL_COMPONENT: "tuning-report",
    }
    kopf.on.event("v1", "configmaps", labels=reports, registry=registry)(on_report_event)
    return registry


def operator_settings() -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.persistence.finalizer = FINALIZER
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN_PREFIX, key="last-handled-configuration"
    )
    s.posting.level = logging.INFO  # our transition events are Normal/Warning
    # Watches: let the server end them every ~10 min and reconnect (no silently stale streams);
    # watch only the Jobs and Deployments we labelled (server-side), not every one in the cluster.
    s.watching.server_timeout = 600
    s.watching.client_timeout = 660
    s.watching.connect_timeout = 30
    s.watching.reconnect_backoff = 1.0
    s.watching.label_selectors["batch", "jobs"] = reconcile.LABEL_DEPLOYMENT
    s.watching.label_selectors["apps", "deployments"] = reconcile.LABEL_DEPLOYMENT
    s.watching.label_selectors["v1", "configmaps"] = REPORT_SELECTOR
    # Queueing: per-object workers exit when idle; a burst of events for one object coalesces.
    s.queueing.idle_timeout = 30.0
    s.queueing.exit_timeout = 2.0
    # Handlers are synchronous (blocking API calls): size the thread pool for them. A burst of
    # creates queues here: 16 threads kept new objects waiting for one (p95 +150 ms at 200).
    s.execution.max_workers = HANDLER_THREADS
    return s


def _quiet_shutdown(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Kopf's watch streams, cut at shutdown, fail to close their generators: not news."""
    if "asynchronous generator" in str(context.get("message", "")):
        logger.debug("at shutdown: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


async def run_operator(
    *,
    kube: k8s.Kube,
    settings: Settings,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    liveness: str | None = None,
    login: Callable[..., Any] | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
    post_event: EventPoster | None = None,
    resync_interval: float = RESYNC_INTERVAL_S,
) -> None:
    """Run the operator in the current event loop until stop_flag (or a signal)."""
    ctx = Context(kube=kube, settings=settings, resync_interval=resync_interval)
    if post_event is not None:
        ctx.post_event = post_event
    asyncio.get_running_loop().set_exception_handler(_quiet_shutdown)
    await kopf.operator(
        registry=build_registry(login=login),
        settings=operator_settings(),
        standalone=True,
        clusterwide=clusterwide,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        memo=kopf.Memo(ctx=ctx),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
