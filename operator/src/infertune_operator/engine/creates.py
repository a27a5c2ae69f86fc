"""Creating what a sync owns (tuner, verification and retune Jobs, their ConfigMaps): adopt our
own, replace an earlier object's of the same name, refuse someone else's.

Every name is deterministic, so a retry or a restart finds what an earlier sync created: a
``409 AlreadyExists`` on create is adoption when this InferenceDeployment (this uid) owns the
object. An InferenceDeployment deleted and created again under the same name is another object:
what the first one left behind is deleted (only that uid) and created anew.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from infertune_operator import naming
from infertune_operator.engine.context import Context
from infertune_operator.kube.errors import ClientError, Conflict
from infertune_operator.kube.resources import JOBS, resource_of
from infertune_operator.naming import Body
from infertune_operator.objects import tuner_job

logger = logging.getLogger("infertune.operator")


class NotOurs(Exception):
    """An object we would create exists under its name, and no InferenceDeployment owns it."""


def refused(exc: NotOurs | ClientError) -> str | None:
    """Why a create failed for good (someone else's object under our name, a request the API
    server rejects), or None when it is worth retrying with backoff (the caller re-raises)."""
    if isinstance(exc, ClientError) and exc.retryable:
        return None
    return str(exc)


def ensure_tuner_rbac(ctx: Context, namespace: str) -> None:
    """The tuner's ServiceAccount and RoleBinding (tuner, verification and retune Jobs run
    as it), once per namespace and operator process."""
    if namespace in ctx._rbac_ready:
        return
    with ctx._rbac_lock:
        if namespace not in ctx._rbac_ready:
            ctx.kube.ensure(tuner_job.tuner_service_account(namespace, ctx.settings))
            ctx.kube.ensure(tuner_job.tuner_role_binding(namespace, ctx.settings))
            ctx._rbac_ready.add(namespace)


def create_owned(ctx: Context, desired: Body, owner: Body) -> tuple[Body, bool]:
    """Create; an existing object of the name is adopted only when this InferenceDeployment owns
    it. One that an earlier InferenceDeployment of the same name owns (deleted and created again
    before the garbage collector got to its objects) is deleted (only that uid) and created anew.

    Returns:
        (the object, whether it was created now). A name still held by the old object (its
        deletion not finished) is a 409 Conflict: retried with backoff.
    """
    uid = owner["metadata"].get("uid")
    live, created = ctx.kube.create(desired)
    previous = naming.owner_uid(live)
    if created or previous == uid:
        return live, created
    meta = live["metadata"]
    if previous is None:  # someone else's object under our name: do not touch it
        raise NotOurs(
            f"{desired['kind']} {meta['name']} exists and is not owned by this "
            "InferenceDeployment; delete or rename it"
        )
    logger.info("%s/%s: replacing %s %s of an earlier InferenceDeployment of this name (uid %s)",
                meta.get("namespace"), owner["metadata"]["name"], desired["kind"], meta["name"],
                previous)  # fmt: skip
    ctx.kube.delete(resource_of(desired), meta.get("namespace"), meta["name"], uid=meta["uid"])
    live, created = ctx.kube.create(desired)
    if not created and naming.owner_uid(live) != uid:
        raise Conflict(
            f"{desired['kind']} {meta['name']} of an earlier InferenceDeployment is still being "
            "deleted", status=409, reason="Conflict",
        )  # fmt: skip
    return live, created


def delete_other_jobs(
    ctx: Context, namespace: str, name: str, component: str, keep: Iterable[str]
) -> None:
    """Jobs of ``component`` (verification, retune) of this InferenceDeployment other than
    ``keep``: a new rollout or retune supersedes them (their pods go too)."""
    kept = set(keep)
    labels = {naming.LABEL_DEPLOYMENT: name, naming.LABEL_COMPONENT: component}
    for job in ctx.kube.list(JOBS, namespace, labels):
        if job["metadata"]["name"] not in kept:
            logger.info("%s/%s: deleting superseded %s Job %s", namespace, name, component,
                        job["metadata"]["name"])  # fmt: skip
            ctx.kube.delete(JOBS, namespace, job["metadata"]["name"])
