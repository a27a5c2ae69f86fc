"""Status conditions, transitions and the events they post (pure).

A reconcile decision is a :class:`Transition`: the phase, the conditions it sets (metav1.Condition
semantics: ``Tuned``, ``Deployed``, ``Ready``, each with a reason) and the status fields it sets,
typed as a partial :class:`InferenceDeploymentStatus`. :func:`next_status` folds it into the
status the object has; :func:`status_patch` is the merge patch to write; :func:`transition_events`
the Kubernetes events to post (one per condition whose status or reason changed). Modelled on
k8s-nim-operator's ``internal/conditions``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from infertune_operator.api.types import Condition, InferenceDeploymentStatus, Phase
from infertune_operator.naming import Body

ConditionStatus = Literal["True", "False", "Unknown"]
TUNED, DEPLOYED, READY = "Tuned", "Deployed", "Ready"
# After rollout: the served configuration's load test, and the live workload against the tuned
# one (verification.py, drift.py).
VERIFIED, WORKLOAD_DRIFTED, SLO_AT_RISK = "Verified", "WorkloadDrifted", "SloAtRisk"
# Whether the operator reaches the API server for this object; only set once it did not (an
# object that never met an outage has no Synced condition).
SYNCED = "Synced"
CONDITION_TYPES = (TUNED, DEPLOYED, READY, VERIFIED, WORKLOAD_DRIFTED, SLO_AT_RISK, SYNCED)

# Condition reasons.
INVALID_SPEC = "InvalidSpec"
TUNING_PENDING = "TuningPending"
TUNING_STARTED = "TuningStarted"
TUNING_SUCCEEDED = "TuningSucceeded"
NO_FEASIBLE_CONFIG = "NoFeasibleConfig"
TUNING_JOB_FAILED = "TuningJobFailed"
TUNING_DEADLINE_EXCEEDED = "TuningDeadlineExceeded"  # the tuner Job ran past its deadline
AWAITING_TUNING = "AwaitingTuning"
SERVING_APPLIED = "ServingApplied"
DEPLOYING = "Deploying"
DEPLOYMENT_AVAILABLE = "DeploymentAvailable"
SCALED_TO_ZERO = "ScaledToZero"
CANNOT_SERVE = "CannotServe"
APPLY_FAILED = "ApplyFailed"  # the API server refused an object (4xx): the message says why
API_UNAVAILABLE = "ApiUnavailable"  # Synced=False: the API server keeps failing (5xx, 429, ...)
API_RECOVERED = "ApiRecovered"  # Synced=True: it answers again after an outage
# Verified (verification.py): True when the serving pod measured what the tuning did.
VERIFICATION_PENDING = "VerificationPending"  # Unknown: waiting for the rollout to verify
VERIFICATION_RUNNING = "VerificationRunning"  # Unknown: the verification Job runs
VERIFICATION_DISABLED = "VerificationDisabled"  # Unknown: spec.serving.verification.enabled false
MATCHES_TUNED = "MatchesTuned"  # True
BELOW_TUNED = "BelowTuned"  # False: tok/s/GPU more than the noise below the tuned number
SLO_MISSED = "SloMissed"  # False: an SLO bound missed under the tuned workload
VERIFICATION_FAILED = "VerificationFailed"  # False: no valid measurement (the message says why)
# WorkloadDrifted and SloAtRisk (drift.py).
WORKLOAD_AS_TUNED = "WorkloadAsTuned"  # WorkloadDrifted=False
WORKLOAD_CHANGED = "WorkloadChanged"  # WorkloadDrifted=True, with the numbers
SLO_HELD = "SloHeld"  # SloAtRisk=False
LIVE_SLO_MISSED = "LiveSloMissed"  # SloAtRisk=True, with the numbers
NOT_OBSERVED = "NotObserved"  # Unknown: no metrics (observation off, no pod, not exposed)
WARNING_REASONS = frozenset({
    INVALID_SPEC, NO_FEASIBLE_CONFIG, TUNING_JOB_FAILED, TUNING_DEADLINE_EXCEEDED, CANNOT_SERVE,
    APPLY_FAILED, API_UNAVAILABLE, BELOW_TUNED, SLO_MISSED, VERIFICATION_FAILED,
    WORKLOAD_CHANGED, LIVE_SLO_MISSED,
})  # fmt: skip
# Bookkeeping transitions that post no event (the outcome that follows does).
QUIET_REASONS = frozenset({AWAITING_TUNING, VERIFICATION_PENDING, VERIFICATION_RUNNING})


@dataclass(frozen=True)
class Cond:
    status: ConditionStatus
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Transition:
    """The next state: phase, the conditions to set, and the status fields to set (a partial
    status: only the fields given are written; one given as None is removed)."""

    phase: Phase
    message: str
    conditions: dict[str, Cond]
    fields: InferenceDeploymentStatus = field(default_factory=InferenceDeploymentStatus)
    # Events that are no condition's transition (a retune rolled out), posted once the status
    # that records them is written.
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def set_conditions(
    old: Iterable[Mapping[str, Any]] | None,
    updates: Mapping[str, Cond],
    *,
    generation: int | None,
    now: str,
) -> list[Body]:
    """The conditions after ``updates``, in :data:`CONDITION_TYPES` order.

    Args:
        old: The object's conditions (as stored).
        updates: The condition of each type to set.
        generation: The spec generation the conditions describe (observedGeneration).
        now: The time to record for a condition whose status changes.

    Returns:
        The conditions as stored: lastTransitionTime only moves when a condition's status does
        (metav1.Condition semantics); conditions of other types are kept as they were.
    """
    by_type = {str(c.get("type")): dict(c) for c in old or [] if c.get("type")}
    for ctype, cond in updates.items():
        prev = by_type.get(ctype)
        moved = prev is None or prev.get("status") != cond.status
        since = now if prev is None or moved else str(prev.get("lastTransitionTime") or now)
        entry = Condition(
            type=ctype, status=cond.status, reason=cond.reason, message=cond.message,
            last_transition_time=since,
            **({"observed_generation": generation} if generation is not None else {}),
        )  # fmt: skip
        by_type[ctype] = entry.model_dump(by_alias=True, exclude_unset=True)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 99), c["type"]))


def next_status(
    old: Mapping[str, Any] | None,
    t: Transition,
    *,
    generation: int | None,
    now: str,
    tuning_hash: str | None,
) -> Body:
    """The status fields we own after the transition (Kopf's own status keys are left alone).

    Args:
        old: The object's status.
        t: The decision.
        generation: metadata.generation of the object the decision was made for.
        now: The time (RFC 3339) for conditions that change.
        tuning_hash: The tuning hash of the spec (None for an invalid spec).

    Returns:
        The status as a camelCase dict: phase, message, conditions, observedGeneration,
        tuningHash and the transition's fields (a field set to None is present as None).
    """
    old = old or {}
    conditions = set_conditions(old.get("conditions"), t.conditions, generation=generation, now=now)
    own: dict[str, Any] = {"phase": t.phase, "message": t.message}
    if generation is not None:
        own["observed_generation"] = generation
    if tuning_hash is not None:
        own["tuning_hash"] = tuning_hash
    status = t.fields.model_copy(update=own).patch()
    # Conditions go in as stored: an old one keeps whatever form it has.
    return {"phase": t.phase, "message": t.message, "conditions": conditions, **status}


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Body | None:
    """The merge patch from old to new status (None when nothing changed)."""
    old = old or {}
    patch = {k: v for k, v in new.items() if old.get(k) != v and not (v is None and k not in old)}
    return patch or None


def transition_events(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Event]:
    """One event per condition whose status or reason changed (a Warning for the failures)."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    events: list[Event] = []
    for c in new.get("conditions") or []:
        prev = before.get(c["type"])
        if prev and prev.get("status") == c["status"] and prev.get("reason") == c["reason"]:
            continue
        if c["reason"] in QUIET_REASONS:
            continue  # bookkeeping, not news
        kind: Literal["Normal", "Warning"] = (
            "Warning" if c["reason"] in WARNING_REASONS else "Normal"
        )
        events.append(Event(kind, c["reason"], c["message"] or c["reason"]))
    return events


def has_condition(status: Mapping[str, Any] | None, ctype: str, value: str | None = None) -> bool:
    """Whether the status has a condition of this type (with this status, when given)."""
    return any(
        c.get("type") == ctype and (value is None or c.get("status") == value)
        for c in (status or {}).get("conditions") or []
    )
