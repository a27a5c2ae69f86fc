"""The reconcile decisions: from what the operator observed to the next Transition (pure).

Given the InferenceDeployment (as a dict), its report ConfigMap, its tuner Job and its serving
Deployment, these functions say what comes next: whether the spec is valid, which tuning it
needs (the tuning hash), and the :class:`~infertune_operator.conditions.Transition` to record.
``engine.controller`` does the reading and writing around them; the objects themselves are built by
``objects.tuner_job`` and ``objects.serving``, the report is decoded by ``reports.store``. Once a configuration is
tuned, ``serving`` takes over (Deploying, Ready, CannotServe, ApplyFailed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from infertune_operator.api.manifest import validate_document
from infertune_operator.api.types import (
    RETUNE_FIELDS,
    BestConfig,
    InferenceDeployment,
    InferenceDeploymentStatus,
    Phase,
)
from infertune_operator.policy.conditions import (
    APPLY_FAILED,
    AWAITING_TUNING,
    DEPLOYED,
    INVALID_SPEC,
    NO_FEASIBLE_CONFIG,
    READY,
    TUNED,
    TUNING_JOB_FAILED,
    TUNING_PENDING,
    TUNING_STARTED,
    Cond,
    Transition,
    has_condition,
)
from infertune_operator.policy.serving import trial_counts
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE
from infertune_tuner.report.view import never_ran_note
from infertune_tuner.result import Check, FloorCheck, Report, SloCheck

# The spec sections whose change means "tune again"; spec.serving only re-renders.
TUNING_SECTIONS = ("model", "gpu", "workload", "slo", "search", "tuning")


# ------------------------------------------------------------------ what the spec asks for


def validate(body: Mapping[str, Any]) -> tuple[InferenceDeployment | None, list[str]]:
    """The InferenceDeployment model, or None and every problem (``path: message``).

    Args:
        body: The object as the API server returned it (server-side metadata is ignored).

    Returns:
        (the model, []) when valid; (None, every schema and catalog problem) otherwise.
    """
    doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    meta = dict(doc.get("metadata") or {})
    # Server-side bookkeeping is no concern of the API models; keep what identifies the object.
    doc["metadata"] = {k: meta[k] for k in ("name", "namespace") if k in meta}
    obj, problems = validate_document(doc)  # schema + catalog (known GPU and model)
    return obj, [str(p) for p in problems]


def _effective_tuning(spec: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The operator defaults that fill unset spec.tuning fields (they change the request)."""
    tuning = spec.get("tuning") or {}
    effective = {
        "backend": tuning.get("backend") or settings.default_backend,
        "maxTrials": tuning.get("maxTrials") or settings.default_max_trials,
        "storage": tuning.get("storage") or settings.tuner_storage,
    }
    if settings.tuner_storage_secret and not tuning.get("storageSecretRef"):
        effective["storageSecret"] = settings.tuner_storage_secret  # (absent: hashes unchanged)
    return effective


def tuning_hash(spec: Mapping[str, Any], settings: Settings) -> str:
    """hash8 of the tuning-relevant spec: model/gpu/workload/slo/search/tuning + defaults.

    Args:
        spec: The spec as stored (camelCase).
        settings: The operator's defaults for what the spec leaves unset.

    Returns:
        8 hex digits that name the tuner Job and label its objects. Hashes the spec as stored
        (canonical JSON, sorted keys), so an operator upgrade that adds a model default does not
        re-tune every deployment. spec.serving is deliberately left out: it only re-renders;
        so are spec.tuning.retune and retuneIntervalMinutes (when to tune again, not what).
    """
    relevant = {key: spec.get(key) for key in TUNING_SECTIONS}
    tuning = relevant["tuning"]
    if isinstance(tuning, Mapping) and any(k in tuning for k in RETUNE_FIELDS):
        # When to retune is not what a tuning asks: hashed as if the fields were not there.
        relevant["tuning"] = {k: v for k, v in tuning.items() if k not in RETUNE_FIELDS} or None
    relevant["effective"] = _effective_tuning(spec, settings)
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


def is_brand_new(body: Mapping[str, Any]) -> bool:
    """An object no sync has written to yet (no status at all) and that is not being deleted."""
    meta = body.get("metadata") or {}
    return not body.get("status") and not meta.get("deletionTimestamp") and bool(meta.get("uid"))


def config_from_status(status: Mapping[str, Any] | None, th: str) -> TrialConfig | None:
    """The best configuration already recorded for this tuning hash.

    Args:
        status: The object's status.
        th: The tuning hash of its current spec.

    Returns:
        The recorded best configuration when the status is Tuned=True for this same hash (so
        serving can be converged without reading the report again), else None.
    """
    status = status or {}
    if status.get("tuningHash") != th or not has_condition(status, TUNED, "True"):
        return None
    try:
        return BestConfig.model_validate(status.get("bestConfig") or {}).to_config()
    except ValueError:
        return None


def tuning_underway(status: Mapping[str, Any] | None, th: str) -> bool:
    """Whether a tuning of this hash was started and has not ended (Pending or Tuning): it was
    admitted then, and a check that a newer operator adds does not stop it halfway."""
    status = status or {}
    return status.get("tuningHash") == th and any(
        c.get("type") == TUNED and c.get("reason") in (TUNING_PENDING, TUNING_STARTED)
        for c in status.get("conditions") or []
    )


def best_config(report: Report) -> TrialConfig:
    assert report.best is not None
    return report.best.config.to_config()


# ------------------------------------------------------------------ tuning


def invalid_spec(problems: list[str]) -> Transition:
    """The spec fails validation: Failed, with every problem in the message."""
    listing = "; ".join(problems)
    return Transition(
        phase="Failed",
        message=f"invalid spec ({len(problems)} problem{'s' * (len(problems) != 1)}): {listing}",
        conditions={TUNED: Cond("False", INVALID_SPEC, f"invalid spec: {listing}")},
    )


def _tuning_transition(
    phase: Phase, reason: str, message: str, old_status: Mapping[str, Any] | None
) -> Transition:
    conditions = {TUNED: Cond("False", reason, message)}
    if has_condition(old_status, DEPLOYED, "True"):
        message += "; the previous configuration keeps serving until it finishes"
    for ctype in (DEPLOYED, READY):
        if not has_condition(old_status, ctype):
            conditions[ctype] = Cond("False", AWAITING_TUNING, "waiting for tuning to finish")
    return Transition(phase=phase, message=message, conditions=conditions)


def tuning_pending(
    job: str | list[str], detail: str | None, old_status: Mapping[str, Any] | None
) -> Transition:
    """The tuner Job exists; its pod does not run yet.

    Args:
        job: The tuner Job's name (the names of those waiting: a Job per GPU pool).
        detail: Why the pod waits, when Kubernetes says (unschedulable, image pull).
        old_status: The object's status (a configuration already serving keeps serving).

    Returns:
        Pending, Tuned=False/TuningPending.
    """
    jobs = [job] if isinstance(job, str) else job
    if len(jobs) == 1:
        message = f"tuning: tuner Job {jobs[0]} is waiting for its pod"
    else:
        message = f"tuning: tuner Jobs {', '.join(jobs)} are waiting for their pods"
    message += f" ({detail})" if detail else ""
    return _tuning_transition("Pending", TUNING_PENDING, message, old_status)


def tuning_started(job: str | list[str], old_status: Mapping[str, Any] | None) -> Transition:
    """The tuner pod runs (of a Job per GPU pool: one or more): Tuning, Tuned=False/
    TuningStarted."""
    jobs = [job] if isinstance(job, str) else job
    running = "is running" if len(jobs) == 1 else "are running"
    message = f"tuning: tuner Job{'s' * (len(jobs) > 1)} {', '.join(jobs)} {running}"
    return _tuning_transition("Tuning", TUNING_STARTED, message, old_status)


def tuning_job_failed(message: str, reason: str = TUNING_JOB_FAILED) -> Transition:
    """The tuner Job failed, or left no usable report: Failed, Tuned=False/TuningJobFailed (or
    TuningDeadlineExceeded: the Job ran past its activeDeadlineSeconds)."""
    return Transition(
        phase="Failed",
        message=message,
        conditions={TUNED: Cond("False", reason, message)},
    )


def tuning_rejected(problem: str) -> Transition:
    """The API server refused the tuner Job or its objects (HTTP 4xx: invalid, forbidden).

    Returns:
        Failed, Tuned=False/ApplyFailed with the server's message (no retry: the same request
        gets the same answer until the spec, or the cluster's policy, changes).
    """
    message = f"cannot start tuning: {problem}"
    return Transition(
        phase="Failed", message=message, conditions={TUNED: Cond("False", APPLY_FAILED, message)}
    )


def _missed(report: Report) -> list[Check]:
    """The bounds the nearest misses missed (a report of an earlier version, which did not
    record them, names them through the misses' trials)."""
    trials = {t.number: t for t in report.trials}
    out: list[Check] = []
    for m in report.nearest_misses:
        trial = trials.get(m.trial)
        out += m.missed or [c for c in (trial.slo_checks if trial else []) if not c.ok]
    return out


def _relax_hints(report: Report) -> list[str]:
    hints: list[str] = []
    missed = _missed(report)
    metrics = {c.metric for c in missed if isinstance(c, SloCheck)}
    for metric in LATENCY_METRICS:
        if metric.key in metrics:
            hints.append(f"raise spec.slo.{metric.wire}")
    if any(isinstance(c, FloorCheck) for c in missed):
        hints.append(f"lower spec.slo.{OBJECTIVE.wire}")
    if any(e.field == "quantization" for e in report.excluded):
        hints.append("allow more quantizations (spec.search.maxAccuracyLossPercent)")
    hints.append("widen spec.search (more tensorParallel / smaller maxBatchSize values)")
    hints.append("or use a larger GPU")
    return hints


def no_feasible_message(report: Report) -> str:
    executed = report.executed_trials
    lines = [f"no configuration met the SLO ({executed} trial{'s' * (executed != 1)} executed, "
             f"{len(report.trials)} considered, stopped: {report.stopped_reason})"]  # fmt: skip
    if report.nearest_misses:
        misses = "; ".join(
            f"{m.config.label()} ({m.output_tokens_per_s_per_gpu:.0f} tok/s/GPU): "
            + ", ".join(m.violations)
            for m in report.nearest_misses[:3]
        )
        lines.append(f"nearest misses: {misses}")
    else:
        lines.append("no configuration could be measured (all predicted not to fit in memory)")
    lines.append("to relax: " + ", ".join(_relax_hints(report)))
    if (failed := never_ran_note(report)) is not None:
        lines.append(failed)
    return ". ".join(lines)


def no_feasible_config(report: Report, report_cm: str, total: int | None = None) -> Transition:
    """Tuning finished and nothing met the SLO.

    Args:
        report: The tuner's report (no best configuration).
        report_cm: The report ConfigMap's name (recorded in the status).
        total: Trials of the complete report, when only its summary was read.

    Returns:
        Failed, Tuned=False/NoFeasibleConfig, with the nearest misses and what to relax.
    """
    message = no_feasible_message(report)
    return Transition(
        phase="Failed",
        message=message,
        conditions={TUNED: Cond("False", NO_FEASIBLE_CONFIG, message)},
        fields=InferenceDeploymentStatus(
            trials=trial_counts(report, total), report_config_map=report_cm
        ),
    )
