"""Verification after rollout (pure): prove the tuned numbers on the serving pods.

Once the serving Deployment is available, a short, bounded Job runs the tuner's load generator
(``infertune verify-job``) against the Service: the workload the configuration was tuned for, at
the tuned concurrency (its max batch size), with as many requests and as long a warm-up as a
tuning trial of it measured, so the tuner's measurement noise applies to the comparison
(``noise.py``). The load generator's streams share one gRPC connection, which a ClusterIP Service
routes to one pod: the verification measures one replica as a trial measured one server.

The Job writes its result into the ConfigMap ``<name>-verification`` (the tuning report's
pattern: guarded by the owner's uid, read back by the operator, so the result survives operator
restarts). The Job and the result are named by the verification hash: the deployed configuration
and what it is verified against (config, image, resources, the workload, the SLO, the tuned
numbers, the verification settings). A restart or a resync finds, never repeats, them; a new
rollout (another hash) verifies again. The verdict (:func:`verdict`):

* ``Passed`` (Verified=True): tok/s/GPU at most the noise tolerance below the tuned number and
  every SLO bound met;
* ``SloMissed`` (Verified=False): an SLO bound missed (strictly, as the tuner checks it);
* ``BelowTuned`` (Verified=False): tok/s/GPU more than the tolerance short (8.1 %, noise.py);
* ``Failed`` (Verified=False): no valid measurement (server unreachable, requests failing, the
  Job failed); the message says why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from infertune_operator.api.types import BestMetrics, InferenceDeployment, VerificationStatus
from infertune_operator.naming import (
    ANNOTATION_HASH,
    ANNOTATION_VERIFICATION_HASH,
    COMPONENT_VERIFICATION,
    COMPONENT_VERIFICATION_RESULT,
    GRPC_PORT,
    LABEL_HASH,
    Body,
    common_labels,
    owner_reference,
    owner_uid,
    verification_configmap_name,
    verification_job_name,
)
from infertune_operator.objects.pods import security
from infertune_operator.policy import noise
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import trial_requests
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE
from infertune_tuner.result import Metrics
from infertune_tuner.runtime.base import SERVED_MODEL
from infertune_tuner.schema import Record

RESULT_KEY = "result.json"
JOB_GRACE_S = 120  # beyond the load's own deadline: pod start, connecting, writing the result
LOADGEN_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
MAX_ERROR_SHARE = 0.05  # more failed requests than this: no measurement (harness/runner.py)
# A trial's warm-up: one full batch, at most this many (infertune_tuner/backends/triton.py,
# default_warmup; not imported: it would load gRPC into the operator; a test keeps them equal).
MAX_WARMUP = 256

State = Literal["Running", "Passed", "BelowTuned", "SloMissed", "Failed"]


@dataclass(frozen=True)
class Reference:
    """What the served configuration was tuned for, and what its tuning measured."""

    config: TrialConfig
    input_tokens: int
    output_tokens: int
    tuned: BestMetrics
    source: str  # "the tuning <hash8>", "retune <hash7>"


@dataclass(frozen=True)
class LoadPlan:
    concurrency: int
    requests: int
    warmup: int
    deadline_s: int


class VerificationResult(Record):
    """What ``infertune verify-job`` stores (``result.json`` in ``<name>-verification``)."""

    schema_: Literal["infertune.verification/v1"] = Field(
        default="infertune.verification/v1", alias="schema"
    )
    hash: str
    config: str
    metrics: Metrics | None = None  # None: nothing completed
    requests: int = 0  # completed
    errors: int = 0
    stalled: int = 0
    duration_s: float = 0.0
    problem: str | None = None  # why this is no valid measurement (None: it is one)
    finished_at: str | None = None

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


# ------------------------------------------------------------------ what to verify, and how


def load_plan(obj: InferenceDeployment, ref: Reference) -> LoadPlan:
    """A trial's benchmark of the configuration (backends/triton.py): concurrency = max batch,
    the trial's request count (more for a bounded tail), one batch of warm-up."""
    batch = ref.config.max_batch_size
    spec = obj.spec.serving.verification
    percentiles = [p for m in LATENCY_METRICS if (b := obj.spec.slo.bound(m)) for p in b.bounds()]
    return LoadPlan(
        concurrency=batch,
        requests=spec.requests or trial_requests(batch, percentiles),
        warmup=min(batch, MAX_WARMUP),
        deadline_s=spec.duration_seconds,
    )


def verification_hash(obj: InferenceDeployment, ref: Reference, settings: Settings) -> str:
    """The deployed configuration and what it is verified against (SHORT hash in names)."""
    s = obj.spec
    relevant = {
        "config": ref.config.label(),
        "backend": settings.backend_for(obj),
        "image": settings.operator_image
        if settings.simulated(obj)
        else s.serving.image or settings.triton_image,
        "resources": s.serving.resources.wire() if s.serving.resources else None,
        "workload": [ref.input_tokens, ref.output_tokens],
        "slo": s.slo.wire(),
        "tuned": ref.tuned.wire(),
        "verification": s.serving.verification.wire(),
    }
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:7]


def verify_command(
    body: Mapping[str, Any], ref: Reference, vhash: str, plan: LoadPlan
) -> list[str]:
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    return [
        "infertune", "verify-job",
        "--deployment", name, "--namespace", namespace, "--owner-uid", meta["uid"],
        "--verification-hash", vhash,
        "--url", f"{name}.{namespace}.svc:{GRPC_PORT}", "--model", SERVED_MODEL,
        "--config", ref.config.label(), "--tp", str(ref.config.tp),
        "--concurrency", str(plan.concurrency), "--requests", str(plan.requests),
        "--warmup", str(plan.warmup),
        "--input-tokens", str(ref.input_tokens), "--output-tokens", str(ref.output_tokens),
        "--deadline", str(plan.deadline_s),
    ]  # fmt: skip


def verification_job(
    obj: InferenceDeployment,
    body: Mapping[str, Any],
    ref: Reference,
    vhash: str,
    th: str,
    settings: Settings,
) -> Body:
    """The Job that runs the load generator once against the Service.

    On the operator image for the simulated backend, the tuner image otherwise (both hold the
    load generator); no GPU; the tuner's service account (it writes the result ConfigMap, as the
    tuner writes its report). Labelled with the tuning hash, so a new tuning deletes it with the
    superseded tuner Jobs.
    """
    meta = body["metadata"]
    name = meta["name"]
    plan = load_plan(obj, ref)
    simulated = settings.simulated(obj)
    pod_security, container_security = security(runs_as_root=not simulated)
    labels = {**common_labels(name, COMPONENT_VERIFICATION), LABEL_HASH: th}
    container: Body = {
        "name": "verify",
        "image": settings.operator_image if simulated else settings.tuner_image,
        "command": verify_command(body, ref, vhash, plan),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": json.loads(json.dumps(LOADGEN_RESOURCES)),
        "securityContext": container_security,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": verification_job_name(name, vhash),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {ANNOTATION_VERIFICATION_HASH: vhash, ANNOTATION_HASH: th},
            "ownerReferences": [owner_reference(body)],
        },
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": plan.deadline_s + JOB_GRACE_S,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": settings.tuner_service_account,
                    "restartPolicy": "Never",
                    "securityContext": pod_security,
                    "containers": [container],
                },
            },
        },
    }


# ------------------------------------------------------------------ the result ConfigMap


def result_configmap(
    *, name: str, namespace: str, uid: str | None, result: VerificationResult
) -> Body:
    """What the verification Job writes (owned by the InferenceDeployment, no
    blockOwnerDeletion: the tuner's service account writes it, as the report)."""
    meta: Body = {
        "name": verification_configmap_name(name),
        "namespace": namespace,
        "labels": common_labels(name, COMPONENT_VERIFICATION_RESULT),
        "annotations": {ANNOTATION_VERIFICATION_HASH: result.hash},
    }
    if uid:
        owner = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
                 "metadata": {"name": name, "uid": uid}}  # fmt: skip
        meta["ownerReferences"] = [owner_reference(owner, block=False)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {RESULT_KEY: result.to_json()}}  # fmt: skip


def read_result(
    cm: Mapping[str, Any] | None, vhash: str, uid: str | None
) -> VerificationResult | None:
    """The stored result of verification ``vhash`` of this object (None: none, another
    verification's, an earlier object's of this name, or unreadable)."""
    if not cm:
        return None
    meta = cm.get("metadata") or {}
    if (meta.get("annotations") or {}).get(ANNOTATION_VERIFICATION_HASH) != vhash:
        return None
    owner = owner_uid(cm)
    if owner is not None and uid is not None and owner != uid:
        return None
    try:
        result = VerificationResult.model_validate_json((cm.get("data") or {}).get(RESULT_KEY, ""))
    except ValidationError:
        return None
    return result if result.hash == vhash else None


# ------------------------------------------------------------------ the verdict


def slo_misses(obj: InferenceDeployment, measured: Metrics) -> list[str]:
    """Every SLO bound the measurement misses: ``"E2E p95 25812 ms > 20000 ms (+29%)"``."""
    out: list[str] = []
    for metric in LATENCY_METRICS:
        bound = obj.spec.slo.bound(metric)
        for p, limit in (bound.bounds() if bound else {}).items():
            value = measured.latency(metric.key, p)
            if value > limit:
                out.append(f"{metric.label} {p} {value:.0f} ms > {limit:g} ms "
                           f"(+{(value / limit - 1) * 100:.0f}%)")  # fmt: skip
    floor = obj.spec.slo.min_output_tokens_per_second_per_gpu
    if floor is not None and measured.output_tokens_per_s_per_gpu < floor:
        out.append(f"{OBJECTIVE.label} {measured.output_tokens_per_s_per_gpu:.0f} < {floor:g}")
    return out


def problem_of(result: VerificationResult) -> str | None:
    """Why a result is no valid measurement (None: it is one)."""
    if result.problem:
        return result.problem
    if result.metrics is None or result.requests == 0:
        return "no request completed"
    sent = result.requests + result.errors + result.stalled
    if result.stalled:
        return f"{result.stalled} of {sent} requests stalled"
    if result.errors > MAX_ERROR_SHARE * sent:
        return f"{result.errors} of {sent} requests failed"
    return None


def verdict(
    obj: InferenceDeployment,
    ref: Reference,
    result: VerificationResult,
    base: VerificationStatus,
) -> VerificationStatus:
    """The verification's status: measured beside tuned, the shortfall, the SLO misses, the state
    and a one-line message (see the module docstring)."""
    tolerance = noise.shortfall_tolerance()
    fields: dict[str, Any] = {
        "requests": result.requests, "errors": result.errors, "finished_at": result.finished_at,
        "tolerance_percent": round(tolerance * 100, 1),
    }  # fmt: skip
    problem = problem_of(result)
    if problem is not None or result.metrics is None:
        message = f"verification of {ref.config.label()} measured nothing usable: {problem}"
        return base.model_copy(update={**fields, "state": "Failed", "message": message})
    measured = result.metrics
    missed = slo_misses(obj, measured)
    have = measured.output_tokens_per_s_per_gpu
    want = ref.tuned.output_tokens_per_second_per_gpu or 0.0
    shortfall = (want - have) / want if want > 0 else 0.0
    fields.update(
        measured=BestMetrics.of(measured, slo_met=not missed),
        shortfall_percent=round(shortfall * 100, 1),
        slo_missed=missed,
    )
    said = (
        f"{ref.config.label()} served {have:.0f} tok/s/GPU against {want:.0f} tuned "
        f"({-shortfall * 100:+.1f}%; noise tolerance {tolerance * 100:.1f}%) at "
        f"{ref.input_tokens} in / {ref.output_tokens} out, concurrency {base.concurrency}"
    )
    state: State
    if missed:
        state, message = "SloMissed", f"{said}; SLO missed: {'; '.join(missed)}"
    elif shortfall > tolerance:
        state = "BelowTuned"
        message = (f"{said}: more than the noise below the tuning's measurement (a slower node, "
                   "image or neighbour than the tuning trial had)")  # fmt: skip
    else:
        state, message = "Passed", f"{said}; every SLO bound met"
    return base.model_copy(update={**fields, "state": state, "message": message})


def reference_of(
    obj: InferenceDeployment,
    status: Mapping[str, Any] | None,
    th: str,
    config: TrialConfig,
    best_metrics: BestMetrics | None,
) -> Reference | None:
    """What ``config`` was tuned for: the spec's workload, or the observed workload of the retune
    that rolled it out (status.retune RolledOut for this tuning); the tuned numbers are the
    status's bestMetrics (those of the report read now, when given). None without them."""
    status = status or {}
    retune = status.get("retune") or {}
    if retune.get("state") == "RolledOut" and retune.get("tuningHash") == th:
        workload = retune.get("workload") or {}
        inp, out = int(workload["inputTokens"]), int(workload["outputTokens"])
        source = f"retune {retune.get('hash')}"
    else:
        inp, out = obj.spec.workload.input_tokens, obj.spec.workload.output_tokens
        source = f"tuning {th}"
    tuned = best_metrics
    if tuned is None and status.get("bestMetrics"):
        try:
            tuned = BestMetrics.model_validate(status["bestMetrics"])
        except ValidationError:
            tuned = None
    if tuned is None or not tuned.output_tokens_per_second_per_gpu:
        return None
    return Reference(config, inp, out, tuned, source)
