"""The serving decisions: from a tuned configuration and its Deployment to the next Transition
(pure).

``tuning`` decides what the spec asks for and where tuning stands; once a configuration is
tuned, these functions say how serving it goes: applied and rolling out (Deploying), available
(Ready), or not servable at all (CannotServe: no checkpoint for the winner; ApplyFailed: the API
server refused the rendered objects). ``engine.controller`` does the reading and writing around them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from infertune_operator.api.types import (
    BestConfig,
    BestMetrics,
    InferenceDeploymentStatus,
    TrialCounts,
)
from infertune_operator.naming import endpoint
from infertune_operator.policy.conditions import (
    APPLY_FAILED,
    CANNOT_SERVE,
    DEPLOYED,
    DEPLOYING,
    DEPLOYMENT_AVAILABLE,
    READY,
    SCALED_TO_ZERO,
    SERVING_APPLIED,
    TUNED,
    TUNING_SUCCEEDED,
    Cond,
    Transition,
    has_condition,
)
from infertune_tuner.config import TrialConfig
from infertune_tuner.report.headroom import headroom_note
from infertune_tuner.report.view import never_ran_note
from infertune_tuner.result import Report

# ------------------------------------------------------------------ tuning finished


class TunedReport(NamedTuple):
    """A report read in this sync: the report, its ConfigMap, and how many trials the complete
    report lists (None: the report itself is complete; see ``reports.store``)."""

    report: Report
    config_map: str
    trials_total: int | None = None


def trial_counts(report: Report, total: int | None = None) -> TrialCounts:
    return TrialCounts(
        executed=report.executed_trials, total=total if total is not None else len(report.trials)
    )


def tuned_status(
    report: Report, report_cm: str, total: int | None = None
) -> InferenceDeploymentStatus:
    """The status fields of a finished tuning: best config, its metrics, trial counts."""
    assert report.best is not None
    best = report.best
    trial = next((t for t in report.trials if t.number == best.trial), None)
    slo_met = bool(trial.slo_ok) if trial is not None and trial.slo_ok is not None else True
    return InferenceDeploymentStatus(
        best_config=BestConfig.of(best.config.to_config()),
        best_metrics=BestMetrics.of(
            best.metrics, slo_met=slo_met, cost=best.cost_per_million_output_tokens
        ),
        trials=trial_counts(report, total),
        report_config_map=report_cm,
    )


def tuned_fields(report: Report, report_cm: str) -> dict[str, Any]:
    """:func:`tuned_status` as the camelCase fields written into .status."""
    return tuned_status(report, report_cm).patch()


def tuned_message(report: Report) -> str:
    assert report.best is not None
    close = headroom_note(report)
    failed = never_ran_note(report)
    return (
        f"best {report.best.config.label()}: "
        f"{report.best.metrics.output_tokens_per_s_per_gpu:.0f} tok/s/GPU, SLO met "
        f"({report.executed_trials} trials executed)"
        + (f"; {close}" if close else "")
        + (f"; {failed}" if failed else "")
    )


# ------------------------------------------------------------------ serving


def _tuned(
    tuned: tuple[Report, str] | TunedReport | None, conditions: dict[str, Cond]
) -> InferenceDeploymentStatus:
    """A report read in this sync sets Tuned=True and the tuned fields; else nothing."""
    if tuned is None:
        return InferenceDeploymentStatus()
    report, report_cm, *rest = tuned
    conditions[TUNED] = Cond("True", TUNING_SUCCEEDED, tuned_message(report))
    return tuned_status(report, report_cm, rest[0] if rest else None)


def cannot_serve(
    config: TrialConfig, problem: str, tuned: tuple[Report, str] | TunedReport | None
) -> Transition:
    """Tuning found a winner that cannot be rendered for serving.

    Args:
        config: The winning configuration.
        problem: Why it cannot be served (e.g. no pre-quantized checkpoint for it).
        tuned: (report, report ConfigMap) when the report was read in this sync.

    Returns:
        Failed, Deployed=False and Ready=False with reason CannotServe (Tuned=True when the
        report was read now).
    """
    message = f"cannot serve {config.label()}: {problem}"
    conditions = {
        DEPLOYED: Cond("False", CANNOT_SERVE, message),
        READY: Cond("False", CANNOT_SERVE, message),
    }
    fields = _tuned(tuned, conditions)
    return Transition("Failed", message, conditions, fields)


def apply_failed(
    config: TrialConfig,
    problem: str,
    tuned: tuple[Report, str] | TunedReport | None,
    old_status: Mapping[str, Any] | None,
) -> Transition:
    """The API server refused a serving object (HTTP 4xx: invalid, forbidden by a policy).

    Sending the same objects again gets the same answer, so the operator does not: the user
    reads the server's reason here (and in a Warning event) and fixes the spec.

    Args:
        config: The configuration being served.
        problem: The server's message (which object, and why).
        tuned: (report, report ConfigMap) when the report was read in this sync.
        old_status: The object's status (a Deployment already serving keeps serving).

    Returns:
        Failed, Deployed=False/ApplyFailed; Ready=False/ApplyFailed unless an earlier
        configuration is still Ready (its Deployment was not changed).
    """
    message = f"cannot apply the serving objects for {config.label()}: {problem}"
    conditions = {DEPLOYED: Cond("False", APPLY_FAILED, message)}
    if has_condition(old_status, READY, "True"):
        message += "; the previous configuration keeps serving"
    else:
        conditions[READY] = Cond("False", APPLY_FAILED, message)
    fields = _tuned(tuned, conditions)
    return Transition("Failed", message, conditions, fields)


@dataclass(frozen=True)
class Availability:
    wanted: int
    available: int
    current: bool  # the Deployment controller has seen our latest spec

    @property
    def ready(self) -> bool:
        return self.current and self.wanted >= 1 and self.available >= self.wanted


def deployment_availability(deployment: Mapping[str, Any] | None, wanted: int) -> Availability:
    """How far the serving Deployment's rollout is.

    Args:
        deployment: The Deployment as applied or read (None when absent).
        wanted: spec.serving.replicas.

    Returns:
        Replicas available of those wanted, counting only updated ones, and whether the
        Deployment controller has observed the latest generation (a stale status never counts).
    """
    if not deployment:
        return Availability(wanted, 0, False)
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    current = generation is None or observed is None or int(observed) >= int(generation)
    available = int(status.get("availableReplicas") or 0)
    updated = int(status.get("updatedReplicas", available) or 0)
    return Availability(wanted, min(available, updated), current)


def serving(
    *,
    name: str,
    namespace: str,
    config: TrialConfig,
    availability: Availability,
    tuned: tuple[Report, str] | TunedReport | None,
) -> Transition:
    """After tuning: Deploying until the Deployment is available, then Ready.

    Args:
        name: The InferenceDeployment's name (and its Service's).
        namespace: Its namespace.
        config: The configuration being served.
        availability: What :func:`deployment_availability` says of the Deployment.
        tuned: (report, report ConfigMap) when the report was read in this sync.

    Returns:
        Ready with the endpoint once every wanted replica is available; Deploying while it
        rolls out or when scaled to zero (the endpoint is then cleared).
    """
    conditions: dict[str, Cond] = {}
    fields = _tuned(tuned, conditions)
    conditions[DEPLOYED] = Cond(
        "True", SERVING_APPLIED, f"Deployment, Service and ConfigMap applied for {config.label()}"
    )
    a = availability
    if a.wanted == 0:
        conditions[READY] = Cond("False", SCALED_TO_ZERO, "spec.serving.replicas is 0")
        fields = fields.model_copy(update={"endpoint": None})
        return Transition(
            "Deploying", "scaled to zero (spec.serving.replicas: 0)", conditions, fields
        )
    if a.ready:
        ep = endpoint(name, namespace)
        message = f"serving {config.label()} at {ep} ({a.available}/{a.wanted} replicas available)"
        conditions[READY] = Cond("True", DEPLOYMENT_AVAILABLE, message)
        return Transition("Ready", message, conditions, fields.model_copy(update={"endpoint": ep}))
    message = f"deploying {config.label()}: {a.available}/{a.wanted} replicas available"
    conditions[READY] = Cond("False", DEPLOYING, message)
    return Transition("Deploying", message, conditions, fields)
