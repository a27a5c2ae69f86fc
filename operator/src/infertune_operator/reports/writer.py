"""The tuner Job's last step: store its report, unless a newer tuning owns the report by now.

``infertune tune-job`` calls :func:`write_report` once the study is done. Before every write it
reads the InferenceDeployment and the report ConfigMap and asks ``owner.plan_write``
whether this tuning is still the one the spec asks for; the write itself is guarded by the
resourceVersion just read (create, or replace with that precondition), so a writer that lost a
race (409 Conflict) reads again and decides again. A tuning result costs GPU hours: transient API
errors (5xx, no answer, 429) are retried with ``backoff`` (:data:`WRITE_ATTEMPTS` tries over
about four minutes) before the pod gives up and fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from infertune_operator import naming
from infertune_operator.kube.client import Kube
from infertune_operator.kube.errors import Conflict, Forbidden, KubeError
from infertune_operator.kube.resources import CONFIGMAPS, INFERENCEDEPLOYMENTS
from infertune_operator.naming import Body
from infertune_operator.policy.backoff import Backoff
from infertune_operator.reports.owner import WriteAction, WritePlan, plan_write
from infertune_operator.reports.store import is_complete, report_configmap
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Report

WRITE_ATTEMPTS = 10  # transient failures in a row; waits 1 + 2 + 4 + ... (60 s cap): ~4 min
RACES = 5  # lost races (409) in a row: someone else keeps writing; give up rather than spin


@dataclass(frozen=True)
class WriteOutcome:
    action: WriteAction  # CREATE / REPLACE: written so; SKIP: not written (``reason`` says why)
    reason: str = ""
    complete: bool = True  # False: only the report's summary fits in the ConfigMap


def write_report(
    kube: Kube,
    *,
    request: TuningRequest,
    report: Report,
    namespace: str,
    th: str | None,
    uid: str | None,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    retune_hash: str | None = None,
    job_uid: str | None = None,
) -> WriteOutcome:
    """Store ``report`` in ``<name>-tuning-report`` when this tuning is still wanted.

    Args:
        kube: The client (the pod's service account).
        request: The request this tuner ran (from the request ConfigMap).
        report: Its report.
        namespace: The InferenceDeployment's namespace.
        th: The tuning hash (``--tuning-hash``).
        uid: The InferenceDeployment's uid the Job was made for (``--owner-uid``).
        backoff: Delays between attempts after transient API errors.
        sleep: How to wait (tests pass a fake).
        retune_hash: A retune's (``--retune-hash``): the report goes to
            ``<name>-retune-report``, and the spec is compared with the request but for the
            workload (the retune's is the observed one).
        job_uid: The uid of this pod's tuner Job (the report records who answered).

    Returns:
        What was done. Raises the last :class:`~infertune_operator.kube.errors.KubeError` when the API keeps failing or
        refuses the write (403, 422).
    """
    body = report_configmap(
        name=request.name, namespace=namespace, report=report, th=th, owner_uid=uid,
        job_uid=job_uid,
    )  # fmt: skip
    if retune_hash is not None:
        body["metadata"]["name"] = naming.retune_report_name(request.name)
        body["metadata"]["annotations"][naming.ANNOTATION_RETUNE_HASH] = retune_hash
    complete = is_complete(body)
    ignore = ("workload",) if retune_hash is not None else ()

    def plan(owner: Body | None, known: bool, existing: Body | None) -> WritePlan:
        return plan_write(
            owner=owner, owner_known=known, uid=uid, mine=request, existing=existing,
            ignore=ignore, th=th,
        )  # fmt: skip

    outcome = write_guarded(
        kube, body=body, owner_name=request.name, namespace=namespace, plan=plan,
        backoff=backoff, sleep=sleep,
    )  # fmt: skip
    return WriteOutcome(outcome.action, outcome.reason, complete)


Planner = Callable[[Body | None, bool, Body | None], WritePlan]


def write_guarded(
    kube: Kube,
    *,
    body: Body,
    owner_name: str,
    namespace: str,
    plan: Planner,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WriteOutcome:
    """Create or replace the ConfigMap ``body`` as ``plan(owner, owner_known, existing)`` says,
    after reading its InferenceDeployment and the ConfigMap: a replace is guarded by the
    resourceVersion read (a lost race reads and decides again); transient API errors are
    retried with ``backoff``."""
    backoff = backoff or Backoff()
    cm_name = body["metadata"]["name"]
    failures = races = 0
    while True:
        try:
            try:
                owner, known = kube.get(INFERENCEDEPLOYMENTS, namespace, owner_name), True
            except Forbidden:  # an earlier chart's role: the operator's own check guards it
                owner, known = None, False
            existing = kube.get(CONFIGMAPS, namespace, cm_name)
            decided = plan(owner, known, existing)
            if decided.action is WriteAction.SKIP:
                return WriteOutcome(decided.action, decided.reason)
            if decided.action is WriteAction.CREATE:
                body["metadata"].pop("resourceVersion", None)
                if kube.create(body)[1]:
                    return WriteOutcome(decided.action)
                raise Conflict(f"ConfigMap {cm_name} was created meanwhile", status=409)
            body["metadata"]["resourceVersion"] = decided.resource_version
            kube.replace(body)
            return WriteOutcome(decided.action)
        except Conflict:
            races += 1  # someone wrote in between: read again and decide again
            if races >= RACES:
                raise
        except KubeError as exc:
            failures += 1
            if not exc.retryable or failures >= WRITE_ATTEMPTS:
                raise
            sleep(backoff.delay(failures, exc.retry_after))
