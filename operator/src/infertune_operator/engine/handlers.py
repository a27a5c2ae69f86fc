"""Kopf handlers: the triggers that call the reconcile loop, and the operator's Kopf set-up.

Every trigger calls one level-triggered function, :func:`controller.sync`, which converges one
InferenceDeployment (see ``controller``):

* events of the InferenceDeployment that need a sync (see :func:`needs_sync`): its first in
  this process (a create, or the listing that resumes every object after a restart), then the
  first of each new spec generation;
* events of the objects we labelled (``infertune.io/deployment``): a tuner Job starting or
  finishing, a report ConfigMap written by the tuner, a Deployment becoming available, someone
  deleting one of them;
* a periodic resync of the objects that are Pending, Tuning or Deploying, in case an event was
  missed or a pod waits for a reason worth showing (unschedulable, image pull). (One
  operator-wide loop, not a Kopf timer: Kopf puts a finalizer on every object with a timer, and
  this operator needs none.)
* a retry of one object whose sync failed on a transient API error (5xx, no answer, 408/409/429),
  after the delay ``backoff`` gives (exponential with jitter, never sooner than the server's
  Retry-After). Kopf's own idiom, ``TemporaryError(delay=...)``, exists for change handlers,
  timers and daemons only; event handlers' errors are logged and dropped. So the sync raises
  ``RetryLater(delay)`` and ``Context.schedule_retry`` plays Kopf's part.

Handlers are synchronous: Kopf runs them in its thread pool, and calls for one object are
serialised with a per-object lock (Kopf serialises per resource kind, not across kinds).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import itertools
import logging
import random
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, cast

import kopf

from infertune_operator import naming
from infertune_operator.api.types import GROUP, PLURAL, VERSION
from infertune_operator.engine import observer
from infertune_operator.engine.context import RESYNC_INTERVAL_S, Context, EventPoster, RetryLater
from infertune_operator.engine.controller import sync
from infertune_operator.kube.client import Kube
from infertune_operator.kube.errors import KubeError
from infertune_operator.naming import Body
from infertune_operator.policy import conditions, tuner_outcome
from infertune_operator.policy.backoff import Backoff
from infertune_operator.settings import Settings

logger = logging.getLogger("infertune.operator")

HANDLER_THREADS = 32  # Kopf's pool for the synchronous handlers (the client's pool > it)
FULL_RESYNC_EVERY = 10  # every 10th resync also covers Ready and Failed objects
REPORT_SELECTOR = f"{naming.LABEL_DEPLOYMENT},{naming.LABEL_COMPONENT}={naming.COMPONENT_REPORT}"


def kopf_event(body: Body, event: conditions.Event) -> None:
    # Kopf accepts plain dicts here (it only reads apiVersion, kind and metadata).
    try:
        kopf.event(
            cast(Any, body), type=event.type, reason=event.reason, message=event.message[:1000]
        )
    except LookupError:  # outside Kopf's handler context: the status already says it
        logger.debug("event %s for %s not posted (no Kopf context)", event.reason, body)


# ------------------------------------------------------------------ Kopf handlers


def _ctx(memo: Any) -> Context:
    ctx: Context = memo.ctx
    return ctx


def needs_sync(body: Any, type: str | None, memo: Any, **_: Any) -> bool:
    """Kopf's filter for :func:`on_inference_deployment`. It runs in the event loop, so events
    with nothing to do cost no trip through the handler threads. An event needs a sync when it is

    * the first of an object in this process: a create, or the initial listing after an
      operator (re)start, which resumes every object;
    * the first of a new spec generation (see ``Context.claim``);
    * a deletion (the operator forgets the object).

    Our own status writes, label edits and repeated events of one generation need none.
    """
    if type == "DELETED":
        return True
    meta = body.get("metadata") or {}
    return _ctx(memo).claim(
        meta.get("namespace", ""), meta.get("name", ""), meta.get("generation"), meta.get("uid")
    )


def on_inference_deployment(body: Any, type: str | None, memo: Any, **_: Any) -> None:
    """Converge the object; a brand-new one from the body of the event itself (see sync)."""
    ctx = _ctx(memo)
    ctx.capture_kopf_context()
    meta = body.get("metadata") or {}
    namespace, name = meta["namespace"], meta["name"]
    if type == "DELETED":
        ctx.remember(namespace, name, None)
        return
    sync_or_retry(ctx, namespace, name, created_body=copy.deepcopy(dict(body)))


def sync_or_retry(ctx: Context, namespace: str, name: str, *, created_body: Any = None) -> None:
    """Sync one object; when a transient API error stops it, schedule its retry (with the
    sync's backoff delay). Refusals (4xx) of what the operator applies or creates are conditions
    (ApplyFailed), not retries; other API trouble leaves the object to the periodic resync."""
    try:
        sync(ctx, namespace, name, created_body=created_body)
    except RetryLater as exc:
        if not ctx.schedule_retry(namespace, name, exc.delay):
            ctx.remember(namespace, name, "Pending")  # no loop to retry on: the resync will
    except KubeError as exc:
        ctx.remember(namespace, name, "Pending")
        logger.warning("%s/%s: sync failed (the resync retries): %s", namespace, name, exc)


async def _resync_forever(ctx: Context) -> None:
    """Level-triggered safety net: in-flight objects every interval, all of them now and then
    (a deleted Service or model-repo ConfigMap of a Ready deployment is recreated)."""
    loop = asyncio.get_running_loop()
    for tick in itertools.count(1):
        await asyncio.sleep(ctx.resync_interval)
        for namespace, name in ctx.in_flight(everything=tick % FULL_RESYNC_EVERY == 0):
            try:
                run = ctx.in_kopf_context()
                call = functools.partial(run, sync_or_retry, ctx, namespace, name)
                await loop.run_in_executor(None, call)
            except Exception as exc:  # keep resyncing the others
                logger.warning("%s/%s: resync failed: %s", namespace, name, exc)


async def _observe_forever(ctx: Context) -> None:
    """The observer (observer.py): every interval, each Ready object's live workload, one at a
    time in the executor (a slow pod or Prometheus delays the next read, never a sync)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(ctx.settings.observe_interval_s * ctx.time_scale)
        for namespace, name in ctx.serving():
            try:
                run = ctx.in_kopf_context()
                call = functools.partial(run, observer.observe, ctx, namespace, name)
                await loop.run_in_executor(None, call)
            except Exception as exc:  # keep observing the others
                logger.warning("%s/%s: observing failed: %s", namespace, name, exc)


async def start_resync(memo: Any, **_: Any) -> None:
    ctx = _ctx(memo)
    ctx.loop = asyncio.get_running_loop()  # where retries are scheduled
    ctx.retry_sync = functools.partial(sync_or_retry, ctx)
    memo.resync_task = asyncio.create_task(_resync_forever(ctx), name="infertune resync")
    memo.observe_task = asyncio.create_task(_observe_forever(ctx), name="infertune observer")


async def stop_resync(memo: Any, **_: Any) -> None:
    for attr in ("resync_task", "observe_task"):
        task = getattr(memo, attr, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    _ctx(memo).close()


def job_has_news(body: Any, type: str | None, **_: Any) -> bool:
    """Kopf's filter for :func:`on_job_event`: a Job that only waits has nothing to report yet
    (the resync picks up why a pod waits). Kopf calls filters in its event loop, so the event of
    every Job just created (one per new InferenceDeployment) costs no trip through the pool of
    handler threads, where it would queue behind the creates of a burst."""
    return type == "DELETED" or tuner_outcome.job_outcome(body).state != "pending"


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
    owner = (meta.get("labels") or {}).get(naming.LABEL_DEPLOYMENT)
    if not owner or not meta.get("namespace"):
        return
    ctx = _ctx(memo)
    ctx.capture_kopf_context()
    sync_or_retry(ctx, meta["namespace"], owner)


def build_registry(*, login: Callable[..., Any] | None = None) -> kopf.OperatorRegistry:
    """All handlers on a fresh registry (tests pass their own login, e.g. to a mock server)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    ours = {naming.LABEL_DEPLOYMENT: kopf.PRESENT}
    kopf.on.event(GROUP, VERSION, PLURAL, when=needs_sync, registry=registry)(
        on_inference_deployment
    )
    kopf.on.startup(registry=registry)(start_resync)
    kopf.on.cleanup(registry=registry)(stop_resync)
    kopf.on.event("batch", "v1", "jobs", labels=ours, when=job_has_news, registry=registry)(
        on_job_event
    )
    kopf.on.event("apps", "v1", "deployments", labels=ours, registry=registry)(on_deployment_event)
    reports: dict[str, Any] = {
        naming.LABEL_DEPLOYMENT: kopf.PRESENT,
        naming.LABEL_COMPONENT: naming.COMPONENT_REPORT,
    }
    kopf.on.event("v1", "configmaps", labels=reports, registry=registry)(on_report_event)
    return registry


class _NoEssence(kopf.DiffBaseStorage):
    """Kopf builds an "essence" of every event's object (a deep copy) to diff it against what
    change handlers last saw. This operator has none (only watching handlers; the status's
    observedGeneration records what it handled), so it stores nothing and builds nothing."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return kopf.BodyEssence()

    def fetch(self, *, body: Any) -> None:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


class _NoProgress(kopf.ProgressStorage):
    """Kopf records the progress of change handlers (retries) in the objects; with none, it
    records nothing (and does not deep-copy every event's object to clear the record)."""

    def fetch(self, *, key: Any, body: Any) -> None:
        return None

    def store(self, *, key: Any, record: Any, body: Any, patch: Any) -> None:
        return None

    def purge(self, *, key: Any, body: Any, patch: Any) -> None:
        return None

    def touch(self, *, body: Any, patch: Any, value: str | None) -> None:
        return None

    def clear(self, *, essence: Any) -> Any:
        return essence


# Kopf's default delays for its own API calls (seconds): they add up to 54 s, and then Kopf gives
# up: a watch that fails that long ends the operator.
KOPF_ERROR_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21)
# After them, one attempt every 30 s for as long as it takes: client-go's reflector (the list and
# watch of every Go controller) backs off the same way, 800 ms doubling up to 30 s
# (k8s.io/client-go/tools/cache/reflector.go). An object created after an outage waits at most
# that (plus the jitter) for its watch to come back: under the 60 s resync interval.
KOPF_RETRY_CAP_S = 30.0
# Each delay times a random factor in [1 - jitter, 1 + jitter]: the watches of one operator
# (five kinds), and of every operator the outage hit, do not come back in the same instant.
KOPF_RETRY_JITTER = 0.2


@dataclass(frozen=True)
class EndlessRetries:
    """Kopf's retry delays for its own API calls (watches, listings, discovery), never used
    up: ``KOPF_ERROR_BACKOFFS``, then ``KOPF_RETRY_CAP_S`` forever, each jittered and scaled by
    ``time_scale``.

    Kopf takes any iterable of delays and retries until it runs out; an iterable without a
    length it never runs out of (kopf/_cogs/clients/api.py ``request``). It iterates once per
    request, so this is an iterable (each request starts from the first delay), not an iterator.
    On a 429 Kopf waits at least the server's Retry-After.
    """

    time_scale: float = 1.0
    jitter: float = KOPF_RETRY_JITTER

    def __iter__(self) -> Iterator[float]:
        for delay in itertools.chain(KOPF_ERROR_BACKOFFS, itertools.repeat(KOPF_RETRY_CAP_S)):
            yield delay * random.uniform(1 - self.jitter, 1 + self.jitter) * self.time_scale


def operator_settings(time_scale: float = 1.0) -> kopf.OperatorSettings:
    """Kopf's settings; ``time_scale`` shortens its delays for tests (1.0 in production)."""
    s = kopf.OperatorSettings()
    # Only watching handlers: Kopf keeps no state in our objects (no annotations, no finalizer;
    # the status's observedGeneration says what was handled), and builds none per event.
    s.persistence.finalizer = naming.FINALIZER
    s.persistence.diffbase_storage = _NoEssence()
    s.persistence.progress_storage = _NoProgress()
    s.posting.level = logging.INFO  # our transition events are Normal/Warning
    # Watches: let the server end them every ~10 min and reconnect (no silently stale streams);
    # watch only the Jobs and Deployments we labelled (server-side), not every one in the cluster.
    s.watching.server_timeout = 600
    s.watching.client_timeout = 660
    s.watching.connect_timeout = 30
    s.watching.reconnect_backoff = 1.0 * time_scale
    # Kopf's own calls (watches, listings) retry 5xx, 429, 403 and no answer with these delays,
    # for as long as the API server fails: with a finite sequence (Kopf's default) a watch that
    # fails for 54 s ends the operator, and only a restart (of a crash-looping pod) resumes work.
    # The cost of never giving up: a watch refused for good (403 after an RBAC change) is
    # retried every 30 s with an error logged each time, instead of ending the operator.
    s.networking.error_backoffs = EndlessRetries(time_scale)
    s.watching.label_selectors["batch", "jobs"] = naming.LABEL_DEPLOYMENT
    s.watching.label_selectors["apps", "deployments"] = naming.LABEL_DEPLOYMENT
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
    kube: Kube,
    settings: Settings,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    liveness: str | None = None,
    login: Callable[..., Any] | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
    post_event: EventPoster | None = None,
    resync_interval: float = RESYNC_INTERVAL_S,
    backoff: Backoff | None = None,
) -> None:
    """Run the operator in the current event loop until stop_flag (or a signal).

    ``backoff``: the retry delays after transient API errors; its ``time_scale`` also scales
    Kopf's own delays (tests run a minute-long outage in seconds).
    """
    backoff = backoff or Backoff()
    ctx = Context(
        kube=kube,
        settings=settings,
        post_event=post_event or kopf_event,
        resync_interval=resync_interval,
        backoff=backoff,
    )
    asyncio.get_running_loop().set_exception_handler(_quiet_shutdown)
    await kopf.operator(
        registry=build_registry(login=login),
        settings=operator_settings(backoff.time_scale),
        standalone=True,
        clusterwide=clusterwide,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        memo=kopf.Memo(ctx=ctx),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def serve(
    *,
    kube: Kube,
    settings: Settings,
    namespaces: Collection[str],
    clusterwide: bool,
    liveness: str | None,
    verbose: bool,
) -> None:
    """What `infertune operator` runs: Kopf's logging, then the operator until a signal stops
    it (the command line never imports Kopf itself)."""
    kopf.configure(verbose=verbose)
    asyncio.run(
        run_operator(
            kube=kube,
            settings=settings,
            namespaces=namespaces,
            clusterwide=clusterwide,
            liveness=liveness,
        )
    )
