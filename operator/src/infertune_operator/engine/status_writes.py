"""Writing an InferenceDeployment's status: a transition, an outage, a recovery.

:func:`write_status` folds a transition into the status (a merge patch of what changed) and
posts its events. A sync that fails on a transient API error goes through :func:`retry_later`:
the failure is counted (``Context.failed``), the backoff gives the delay of the object's next
attempt, and once the outage lasts (:func:`lasting`: :data:`OUTAGE_ATTEMPTS` failures in a row,
or at once when the server asks to wait as long as they would take) the status says so where it
can still be written (``Synced=False ApiUnavailable since ...``, a Warning event; a throttle's
message says how long the server asked to wait). The first status written after a lasting
outage says it is over (``Synced=True ApiRecovered``), also when the outage could never be
written while it lasted.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from infertune_operator.api.types import InferenceDeploymentStatus
from infertune_operator.engine.context import Context, Outage, RetryLater
from infertune_operator.kube.errors import KubeError, NotFound
from infertune_operator.kube.resources import INFERENCEDEPLOYMENTS
from infertune_operator.naming import Body
from infertune_operator.policy import conditions

logger = logging.getLogger("infertune.operator")

# Consecutive failed syncs of one object before the outage is a lasting one, shown in its status
# (Synced=False ApiUnavailable) with a Warning event: with the default backoff (1 s, 2 s, ...)
# about 3 s of failures. A single 409 from a concurrent write, or a blip, shows nothing.
OUTAGE_ATTEMPTS = 3


def lasting(ctx: Context, outage: Outage) -> bool:
    """Whether an outage is shown in the status: :data:`OUTAGE_ATTEMPTS` failed syncs in a row,
    or a single one whose answer asked to wait (Retry-After) at least as long as the attempts
    before that one take with the backoff's nominal delays (1 s + 2 s = 3 s by default).

    Such a server keeps the object waiting at least as long as the failures that are shown as
    an outage, so it is said at once: counted in attempts, a 60 s throttle would show nothing
    (its second attempt goes through) while the object waited a minute without a word.
    """
    waits = sum(ctx.backoff.nominal(n) for n in range(1, OUTAGE_ATTEMPTS))
    return outage.attempts >= OUTAGE_ATTEMPTS or (outage.retry_after or 0) >= waits


def write_new_status(
    ctx: Context, body: Body, transition: conditions.Transition, th: str | None
) -> None:
    """The create path's status write, on the status writer: a transient failure of it is an
    outage of the object like any other (retried with backoff)."""
    meta = body["metadata"]
    try:
        write_status(ctx, body, transition, th)
    except KubeError as exc:
        if not exc.retryable:
            raise
        raise retry_later(ctx, meta["namespace"], meta["name"], body, exc) from exc


def retry_later(
    ctx: Context, namespace: str, name: str, body: Body | None, exc: KubeError
) -> RetryLater:
    """Count the failure, say so in the status once it lasts (if the status is writable), and
    the retry to schedule."""
    outage = ctx.failed(namespace, name, exc)
    delay = ctx.backoff.delay(outage.attempts, exc.retry_after)
    logger.warning("%s/%s: sync failed (attempt %d, retrying in %.1f s): %s",
                   namespace, name, outage.attempts, delay, exc)  # fmt: skip
    if body is not None and lasting(ctx, outage):
        try:
            write_outage(ctx, body, outage)
        except KubeError as again:  # not writable either: the next attempt tries again
            logger.debug("%s/%s: outage not written: %s", namespace, name, again)
    return RetryLater(delay, outage)


def write_outage(ctx: Context, body: Body, outage: Outage) -> None:
    """Synced=False ApiUnavailable (and phase Pending for an object that has none yet); when
    the server asked to wait (a throttle's 429, or a 503, with a Retry-After), the message says
    how long: ``ApiUnavailable since <time>: the API server asked to wait 60 s (<error>)``."""
    old = body.get("status") or {}
    error = outage.error
    if outage.retry_after:
        error = f"the API server asked to wait {outage.retry_after:.0f} s ({error})"
    message = (
        f"ApiUnavailable since {outage.since}: {error}. Retrying with backoff; until then the "
        "rest of this status may be out of date"
    )
    transition = conditions.Transition(
        phase=old.get("phase") or "Pending",
        message=message,
        conditions={
            conditions.SYNCED: conditions.Cond("False", conditions.API_UNAVAILABLE, message)
        },
    )
    new, _ = _apply(ctx, body, transition, generation=None, th=None)
    for event in conditions.transition_events(old, new):
        ctx.post_event(body, event)


def _apply(
    ctx: Context,
    body: Body,
    transition: conditions.Transition,
    *,
    generation: int | None,
    th: str | None,
) -> tuple[Body, Body | None]:
    """Patch the status `transition` leads to from the object's own (only what changed);
    returns the new status and the patch (None or empty: nothing was written). Raises
    NotFound when the object is gone."""
    meta = body["metadata"]
    old = body.get("status") or {}
    new = conditions.next_status(old, transition, generation=generation, now=ctx.clock(),
                                 tuning_hash=th)  # fmt: skip
    patch = conditions.status_patch(old, new)
    if patch:
        ctx.kube.patch(INFERENCEDEPLOYMENTS, meta["namespace"], meta["name"],
                       {"status": patch}, subresource="status")  # fmt: skip
    return new, patch


def write_status(
    ctx: Context, body: Body, transition: conditions.Transition, th: str | None
) -> None:
    """Write the transition's status (what changed) and post its events. A sync that gets
    this far reached the API server: a lasting outage (shown as Synced=False, or never written
    while every write failed) is over, and the status says so (Synced=True ApiRecovered)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    old = body.get("status") or {}
    outage = ctx.outage(namespace, name)
    shown = outage is not None and lasting(ctx, outage)
    if shown or conditions.has_condition(old, conditions.SYNCED, "False"):
        # Said now even when the outage could never be written while it lasted.
        transition = replace(transition, conditions={
            **transition.conditions, conditions.SYNCED: _recovery(ctx, namespace, name, old),
        })  # fmt: skip
    try:
        new, _ = _apply(ctx, body, transition, generation=meta.get("generation"), th=th)
    except NotFound:
        return
    ctx.recovered(namespace, name)
    for event in (*conditions.transition_events(old, new), *transition.events):
        ctx.post_event(body, event)


def _recovery(ctx: Context, namespace: str, name: str, old: Body) -> conditions.Cond:
    """Synced=True ApiRecovered: since when the API failed (this process's record, else the
    condition's own transition time: an operator restarted during the outage)."""
    outage = ctx.outage(namespace, name)
    since = outage.since if outage is not None else next(
        (str(c.get("lastTransitionTime")) for c in old.get("conditions") or []
         if c.get("type") == conditions.SYNCED), "?",
    )  # fmt: skip
    attempts = ""
    if outage is not None:
        attempts = f"; {outage.attempts} attempt{'s' if outage.attempts != 1 else ''} failed"
    return conditions.Cond(
        "True", conditions.API_RECOVERED,
        f"the Kubernetes API answers again (ApiUnavailable since {since} until {ctx.clock()}"
        f"{attempts})",
    )  # fmt: skip


def write_aside(
    ctx: Context,
    body: Body,
    updates: dict[str, conditions.Cond],
    fields: InferenceDeploymentStatus,
    events: tuple[conditions.Event, ...] = (),
) -> bool:
    """A write beside the sync's (the observer's): conditions and fields, the phase, message,
    observedGeneration and tuning hash left as they are. True when something was written."""
    old = body.get("status") or {}
    transition = conditions.Transition(
        phase=old.get("phase") or "Pending", message=old.get("message") or "",
        conditions=updates, fields=fields,
    )  # fmt: skip
    try:
        new, patch = _apply(ctx, body, transition, generation=None, th=None)
    except NotFound:
        return False
    for event in (*conditions.transition_events(old, new), *events):
        ctx.post_event(body, event)
    return bool(patch)
