"""Whose tuning a report answers, and whether a tuner may write its report (pure).

One report ConfigMap per InferenceDeployment (``<name>-tuning-report``) holds the report of one
tuning. Several writers can race for it: after a spec change the superseded tuner pod may still
finish; an InferenceDeployment deleted and created again under the same name has its own tuner,
while the old one's may still run until the garbage collector reaches it. So:

* the tuner (``infertune tune-job``) reads the InferenceDeployment before writing and writes only
  when it still asks for this very tuning (:func:`plan_write`), with optimistic concurrency on the
  ConfigMap (``resourceVersion``): a stale tuner never replaces the report of a newer one;
* the operator accepts a report only when it answers the current spec: the tuning hash on the
  ConfigMap, the owner's uid, and the report's own request compared with the request the spec
  makes now (:func:`foreign_reason`, :func:`request_difference`), not only an annotation a stale
  writer also sets.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from infertune_operator.api.to_request import to_request
from infertune_operator.naming import Body, owner_uid
from infertune_operator.policy.tuning import validate
from infertune_operator.reports.store import configmap_hash
from infertune_tuner.request import TuningRequest

# Request fields that are not what a tuning answers. Where and how wide it ran: the storage URL
# is masked in a report and absent from the request ConfigMap; a worker pod of a parallel tuning
# runs with parallelism 1 (tuner_workers.worker_request); the tuning hash covers both. And how
# long a trial's server may take to start, which comes from spec.serving: the tuning hash leaves
# spec.serving out (an edit there re-renders, it does not tune again), so a serving-only edit
# made while the tuner runs must not make its finished report "another request's" either.
_NOT_IDENTITY = ("storage", "parallelism", "startup_timeout_minutes")


def identity(request: Mapping[str, Any] | TuningRequest) -> dict[str, Any] | None:
    """What a request asks (a canonical dict), None when it is not a valid TuningRequest."""
    try:
        req = (
            request if isinstance(request, TuningRequest) else TuningRequest.model_validate(request)
        )
    except ValidationError:
        return None
    dumped = req.dump()
    for key in _NOT_IDENTITY:
        dumped["tuning"].pop(key, None)
    return dumped


def request_difference(found: Mapping[str, Any], expected: TuningRequest) -> str | None:
    """None when a report's request asks what ``expected`` asks; else which parts differ.

    Args:
        found: The request a report holds (``Report.request``).
        expected: The request the InferenceDeployment makes now.

    Returns:
        None, or ``"slo, search.max_batch_size"`` (at most four paths), or a sentence when the
        report's request is not readable at all.
    """
    have, want = identity(found), identity(expected)
    if have is None:
        return "its request is not a valid tuning request"
    assert want is not None
    paths: list[str] = []
    for key in sorted(set(have) | set(want)):
        a, b = have.get(key), want.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            paths += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            paths.append(key)
    if not paths:
        return None
    return ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")


def foreign_reason(cm: Mapping[str, Any] | None, *, uid: str | None, th: str) -> str | None:
    """Why a report ConfigMap is not the report of tuning ``th`` of this object (None: it may be,
    by its labels and owner; the report's request is compared once it is parsed).

    A report nobody owns is accepted (one seeded ahead of the object, see docs/operator.md);
    one owned by another uid belongs to an earlier object of the same name.
    """
    if cm is None:
        return "there is no report"
    found = configmap_hash(cm)
    if found != th:
        return f"the report is for tuning {found}" if found else "the report names no tuning"
    owner = owner_uid(cm)
    if owner is not None and uid is not None and owner != uid:
        return f"the report belongs to an earlier InferenceDeployment of this name (uid {owner})"
    return None


def requested_now(owner: Mapping[str, Any], mine: TuningRequest) -> TuningRequest | None:
    """The request the InferenceDeployment makes now, under the defaults ``mine`` ran with (the
    operator's default backend and trial budget are in it); None when its spec is invalid."""
    obj, _ = validate(owner)
    if obj is None:
        return None
    return to_request(
        obj, default_backend=mine.tuning.backend, default_max_trials=mine.tuning.max_trials
    )


class WriteAction(enum.Enum):
    CREATE = "create"
    REPLACE = "replace"
    SKIP = "skip"  # the report would answer a tuning nobody asks for any more


@dataclass(frozen=True)
class WritePlan:
    action: WriteAction
    reason: str = ""
    resource_version: str | None = None  # REPLACE: the version read (the write's precondition)


def superseded_by(
    owner: Mapping[str, Any], th: str | None, existing: Mapping[str, Any] | None
) -> str | None:
    """The tuning hash that supersedes tuning ``th``, by what the cluster says (None: none does).

    The tuning hash also covers what a request does not hold (where trials run: nodeSelector,
    tolerations; the study storage; the secrets), so two tunings can ask the same request. Which
    one is current is what the operator recorded: ``status.tuningHash``, once it has seen the
    spec as it is now (``status.observedGeneration`` = ``metadata.generation``). And a report of
    the hash the status names is never replaced by a report of another one, seen or not.
    """
    if not th:
        return None
    meta, status = owner.get("metadata") or {}, owner.get("status") or {}
    current = status.get("tuningHash")
    if not current or current == th:
        return None
    seen = meta.get("generation") is not None and status.get("observedGeneration") == meta.get(
        "generation"
    )
    if seen or configmap_hash(existing) == current:
        return str(current)
    return None


def plan_write(
    *,
    owner: Body | None,
    owner_known: bool,
    uid: str | None,
    mine: TuningRequest,
    existing: Mapping[str, Any] | None,
    ignore: tuple[str, ...] = (),
    th: str | None = None,
) -> WritePlan:
    """Whether a finished tuner may write its report, and how.

    Args:
        owner: The InferenceDeployment as read now (None: it does not exist).
        owner_known: False when the tuner may not read it (an older chart's role): then only
            the operator's own check guards the report, as before.
        uid: The uid the tuning was started for (``--owner-uid``).
        mine: The request this tuner ran.
        existing: The report ConfigMap as read now (None: there is none).
        ignore: Request fields the spec need not agree on (a retune's ``workload``: it tunes
            the observed workload, not the spec's).
        th: The tuning hash this tuner ran for (``--tuning-hash``; see :func:`superseded_by`).

    Returns:
        SKIP with the reason when the InferenceDeployment is gone, was created again under the
        same name, no longer asks for this request (its spec changed since), or asks for
        another tuning (:func:`superseded_by`); else CREATE, or REPLACE guarded by the
        resourceVersion just read.
    """
    name = f"{mine.namespace or ''}/{mine.name}".lstrip("/")
    if owner_known:
        meta = (owner or {}).get("metadata") or {}
        if owner is None or meta.get("deletionTimestamp"):
            return WritePlan(WriteAction.SKIP, f"InferenceDeployment {name} no longer exists")
        if uid and meta.get("uid") and meta["uid"] != uid:
            return WritePlan(WriteAction.SKIP, (
                f"InferenceDeployment {name} was deleted and created again (uid {meta['uid']}; "
                f"this tuning was for uid {uid})"))  # fmt: skip
        now = requested_now(owner, mine)
        if now is None:
            return WritePlan(WriteAction.SKIP, f"the spec of {name} is no longer valid")
        if ignore:
            now = now.model_copy(update={k: getattr(mine, k) for k in ignore})
        if (diff := request_difference(mine.dump(), now)) is not None:
            return WritePlan(WriteAction.SKIP, (
                f"the spec of {name} changed since this tuning started ({diff}): its report "
                "would replace the report of the tuning the spec asks for now"))  # fmt: skip
        if (current := superseded_by(owner or {}, th, existing)) is not None:
            return WritePlan(WriteAction.SKIP, (
                f"{name} asks for tuning {current} now (its spec changed since tuning {th} "
                "started): this report would replace that tuning's"))  # fmt: skip
    if existing is None:
        return WritePlan(WriteAction.CREATE)
    version = ((existing.get("metadata") or {}).get("resourceVersion")) or None
    return WritePlan(WriteAction.REPLACE, resource_version=version)


def plan_owned_write(
    *,
    owner: Body | None,
    owner_known: bool,
    uid: str | None,
    existing: Mapping[str, Any] | None,
    what: str,
) -> WritePlan:
    """Whether a Job may write ``what`` for its InferenceDeployment (a verification result): not
    when the object is gone or was created again under the same name (another uid); else
    CREATE, or REPLACE guarded by the resourceVersion just read. Which result the operator
    reads is its own business (the hash on the ConfigMap)."""
    meta = (owner or {}).get("metadata") or {}
    if owner_known and (owner is None or meta.get("deletionTimestamp")):
        return WritePlan(WriteAction.SKIP, f"its InferenceDeployment no longer exists ({what})")
    if owner_known and uid and meta.get("uid") and meta["uid"] != uid:
        return WritePlan(WriteAction.SKIP, (
            f"its InferenceDeployment was deleted and created again (uid {meta['uid']}; this "
            f"{what} was for uid {uid})"))  # fmt: skip
    if existing is None:
        return WritePlan(WriteAction.CREATE)
    version = ((existing.get("metadata") or {}).get("resourceVersion")) or None
    return WritePlan(WriteAction.REPLACE, resource_version=version)
