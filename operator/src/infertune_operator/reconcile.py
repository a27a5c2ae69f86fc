"""Pure reconcile decisions: no I/O, no Kubernetes client, no Kopf.

Given what the operator observed (the InferenceDeployment as a dict, its tuner Job, the report
ConfigMap, the serving Deployment, the tuner pods), these functions say what the world should look
like: object names, the tuning hash, the tuner Job and request ConfigMap, the owner references and
labels on served objects, and the next ``status`` (phase, metav1 conditions, events to post).
``handlers`` does the reading and writing around them.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from infertune_operator.api.manifest import validate_document
from infertune_operator.api.models import API_VERSION, KIND, InferenceDeployment
from infertune_operator.api.to_request import to_request
from infertune_operator.render import GPU_RESOURCE, gpu_placement
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.result import Report

Body = dict[str, Any]

# ------------------------------------------------------------------ vocabulary

DOMAIN = "infertune.io"
LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"
LABEL_HASH = f"{DOMAIN}/tuning-hash"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
MANAGER = "infertune"
ANNOTATION_HASH = f"{DOMAIN}/tuning-hash"
ANNOTATION_RENDER_HASH = f"{DOMAIN}/render-hash"

REQUEST_KEY = "request.json"
REPORT_KEY = "report.json"
REPORT_GZ_KEY = "report.json.gz"
REPORT_GZIP_THRESHOLD = 900 * 1024  # ConfigMaps hold at most 1 MiB in total
REPORT_MAX_BYTES = 1000 * 1024

TUNER_CONTAINER = "tuner"
CONFIG_MOUNT = "/config"
TRITON_GRPC_PORT = 8001
JOB_DEADLINE_GRACE_S = 600  # the tuner stops itself at timeoutMinutes; time to write its report

# The spec sections whose change means "tune again"; spec.serving only re-renders.
TUNING_SECTIONS = ("model", "gpu", "workload", "slo", "search", "tuning")

Phase = Literal["Pending", "Tuning", "Deploying", "Ready", "Failed"]
TUNED, DEPLOYED, READY = "Tuned", "Deployed", "Ready"
CONDITION_TYPES = (TUNED, DEPLOYED, READY)

# Condition reasons.
INVALID_SPEC = "InvalidSpec"
TUNING_PENDING = "TuningPending"
TUNING_STARTED = "TuningStarted"
TUNING_SUCCEEDED = "TuningSucceeded"
NO_FEASIBLE_CONFIG = "NoFeasibleConfig"
TUNING_JOB_FAILED = "TuningJobFailed"
AWAITING_TUNING = "AwaitingTuning"
SERVING_APPLIED = "ServingApplied"
DEPLOYING = "Deploying"
DEPLOYMENT_AVAILABLE = "DeploymentAvailable"
SCALED_TO_ZERO = "ScaledToZero"
CANNOT_SERVE = "CannotServe"
WARNING_REASONS = frozenset({INVALID_SPEC, NO_FEASIBLE_CONFIG, TUNING_JOB_FAILED, CANNOT_SERVE})


# ------------------------------------------------------------------ names


def job_name(name: str, tuning_hash: str) -> str:
    """``<name>-tune-<hash8>``: at most 48 + 14 = 62 characters (names are capped at 48)."""
    return f"{name}-tune-{tuning_hash}"


def request_configmap_name(name: str, tuning_hash: str) -> str:
    return f"{job_name(name, tuning_hash)}-request"


def report_configmap_name(name: str) -> str:
    return f"{name}-tuning-report"


def endpoint(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc:{TRITON_GRPC_PORT}"


# ------------------------------------------------------------------ validation


def validate(body: Mapping[str, Any]) -> tuple[InferenceDeployment | None, list[str]]:
    """The InferenceDeployment model, or None and every problem (``path: message``)."""
    doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    meta = dict(doc.get("metadata") or {})
    # Server-side bookkeeping is no concern of the API models; keep what identifies the object.
    doc["metadata"] = {k: meta[k] for k in ("name", "namespace") if k in meta}
    obj, problems = validate_document(doc)  # schema + catalog (known GPU and model)
    return obj, [str(p) for p in problems]


# ------------------------------------------------------------------ the tuning hash


def _effective_tuning(spec: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The operator defaults that fill unset spec.tuning fields (they change the request)."""
    tuning = spec.get("tuning") or {}
    return {
        "backend": tuning.get("backend") or settings.default_backend,
        "maxTrials": tuning.get("maxTrials") or settings.default_max_trials,
        "storage": tuning.get("storage") or settings.tuner_storage,
    }


def tuning_hash(spec: Mapping[str, Any], settings: Settings) -> str:
    """hash8 of the tuning-relevant spec: model/gpu/workload/slo/search/tuning + defaults.

    Hashes the spec as stored (canonical JSON, sorted keys), so an operator upgrade that adds a
    model default does not re-tune every deployment. spec.serving is deliberately left out.
    """
    relevant = {key: spec.get(key) for key in TUNING_SECTIONS}
    relevant["effective"] = _effective_tuning(spec, settings)
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


def is_simulated(obj: InferenceDeployment, settings: Settings) -> bool:
    return obj.spec.tuning.effective_backend(settings.default_backend) == "simulated"


# ------------------------------------------------------------------ ownership


def owner_reference(body: Mapping[str, Any], *, block: bool = True) -> Body:
    meta = body["metadata"]
    ref: Body = {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    if block:
        ref["blockOwnerDeletion"] = True
    return ref


def common_labels(name: str, component: str) -> dict[str, str]:
    return {
        LABEL_DEPLOYMENT: name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_PART_OF: MANAGER,
    }


def render_hash(obj: Mapping[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def owned(desired: Mapping[str, Any], owner: Mapping[str, Any]) -> Body:
    """A rendered object plus namespace, our labels, the owner reference and its render hash."""
    out: Body = json.loads(json.dumps(desired))  # deep copy, JSON-clean
    meta = out.setdefault("metadata", {})
    name = owner["metadata"]["name"]
    meta["namespace"] = owner["metadata"]["namespace"]
    labels = meta.setdefault("labels", {})
    labels.setdefault(LABEL_DEPLOYMENT, name)
    labels.setdefault(LABEL_MANAGED_BY, MANAGER)
    meta["ownerReferences"] = [owner_reference(owner)]
    annotations = meta.setdefault("annotations", {})
    annotations.pop(ANNOTATION_RENDER_HASH, None)
    annotations[ANNOTATION_RENDER_HASH] = render_hash(out)
    return out


def needs_apply(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Apply when absent or when what we rendered last time differs (by its render hash)."""
    if live is None:
        return True
    have = (live.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RENDER_HASH)
    want = desired["metadata"]["annotations"][ANNOTATION_RENDER_HASH]
    return bool(have != want)


# ------------------------------------------------------------------ the tuner Job


def tuner_gpus(obj: InferenceDeployment) -> int:
    """The largest TP in the search space that fits one node (<= maxGpusPerReplica)."""
    cap = obj.spec.gpu.max_gpus_per_replica
    fitting = [int(tp) for tp in obj.spec.search.tensor_parallel if tp <= cap]
    return max(fitting) if fitting else 1


def _tuning_metadata(body: Mapping[str, Any], object_name: str, component: str, th: str) -> Body:
    """Metadata of an object of one tuning run (request ConfigMap, tuner Job): our labels and
    the tuning hash, owned by (and deleted with) the InferenceDeployment."""
    meta = body["metadata"]
    return {
        "name": object_name,
        "namespace": meta["namespace"],
        "labels": {**common_labels(meta["name"], component), LABEL_HASH: th},
        "annotations": {ANNOTATION_HASH: th},
        "ownerReferences": [owner_reference(body)],
    }


def request_configmap(
    obj: InferenceDeployment, body: Mapping[str, Any], th: str, settings: Settings
) -> Body:
    name = body["metadata"]["name"]
    request = to_request(
        obj,
        default_backend=settings.default_backend,
        default_max_trials=settings.default_max_trials,
        default_storage=settings.tuner_storage,
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _tuning_metadata(body, request_configmap_name(name, th), "tuning-request", th),
        "data": {REQUEST_KEY: request.to_json()},
    }


def tune_job_command(name: str, namespace: str, uid: str, th: str) -> list[str]:
    return [
        "infertune", "tune-job",
        "--request", f"{CONFIG_MOUNT}/{REQUEST_KEY}",
        "--report-configmap", report_configmap_name(name),
        "--namespace", namespace,
        "--owner-uid", uid,
        "--tuning-hash", th,
    ]  # fmt: skip


def tuner_job(
    obj: InferenceDeployment, body: Mapping[str, Any], th: str, settings: Settings
) -> Body:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    meta = _tuning_metadata(body, job_name(name, th), "tuner", th)
    container: Body = {
        "name": TUNER_CONTAINER,
        "command": tune_job_command(name, namespace, body["metadata"]["uid"], th),
        "volumeMounts": [{"name": "request", "mountPath": CONFIG_MOUNT, "readOnly": True}],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
    }
    pod: Body = {
        "serviceAccountName": settings.tuner_service_account,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "request", "configMap": {"name": request_configmap_name(name, th)}}],
    }
    if is_simulated(obj, settings):
        container["image"] = settings.operator_image
        container["resources"] = {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"memory": "2Gi"},
        }
    else:
        gpus = tuner_gpus(obj)
        container["image"] = settings.tuner_image
        container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
        pod["nodeSelector"], pod["tolerations"] = gpu_placement(obj)
        # TP ranks talk over shared memory; the default 64 MiB /dev/shm is far too small.
        pod["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    spec: Body = {
        "backoffLimit": settings.job_backoff_limit,
        "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod},
    }
    if obj.spec.tuning.timeout_minutes:
        spec["activeDeadlineSeconds"] = obj.spec.tuning.timeout_minutes * 60 + JOB_DEADLINE_GRACE_S
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def tuner_service_account(namespace: str, settings: Settings) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": settings.tuner_service_account,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_COMPONENT: "tuner"},
        },
    }


def tuner_role_binding(namespace: str, settings: Settings) -> Body:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": settings.tuner_service_account,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_COMPONENT: "tuner"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": settings.tuner_clusterrole,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": settings.tuner_service_account,
                "namespace": namespace,
            }
        ],
    }


def superseded(objs: Iterable[Mapping[str, Any]], th: str) -> list[str]:
    """Names of tuner Jobs / request ConfigMaps that belong to another tuning hash."""
    return [
        o["metadata"]["name"]
        for o in objs
        if (o["metadata"].get("labels") or {}).get(LABEL_HASH) not in (None, th)
    ]


# ------------------------------------------------------------------ Job and pod outcome


@dataclass(frozen=True)
class JobOutcome:
    state: Literal["pending", "running", "succeeded", "failed"]
    reason: str = ""
    message: str = ""


def _true_condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def job_outcome(job: Mapping[str, Any]) -> JobOutcome:
    status = job.get("status") or {}
    if _true_condition(job, "Complete") or int(status.get("succeeded") or 0) >= 1:
        return JobOutcome("succeeded")
    failed = _true_condition(job, "Failed")
    if failed:
        return JobOutcome("failed", str(failed.get("reason") or "Failed"),
                          str(failed.get("message") or ""))  # fmt: skip
    backoff = int((job.get("spec") or {}).get("backoffLimit", 6))
    if int(status.get("failed") or 0) > backoff:
        return JobOutcome("failed", "BackoffLimitExceeded",
                          f"{status.get('failed')} failed pods (backoffLimit {backoff})")  # fmt: skip
    # A tuner pod without readiness probe is ready once its container runs. Clusters without
    # Job .status.ready (before 1.24) fall back to "a pod exists".
    ready = status.get("ready")
    running = int(ready) >= 1 if ready is not None else int(status.get("active") or 0) >= 1
    return JobOutcome("running" if running else "pending")


_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})  # fmt: skip


def pod_waiting_reason(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the tuner pod does not run yet, when Kubernetes says (unschedulable, image pull...)."""
    newest = sorted(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp", "")))
    for pod in reversed(newest):
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                why = cond.get("message") or cond.get("reason") or "unschedulable"
                return f"pod {name} cannot be scheduled: {_clip(str(why), 300)}"
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_REASONS:
                detail = (
                    f": {_clip(str(waiting['message']), 300)}" if waiting.get("message") else ""
                )
                return f"pod {name}: {waiting['reason']}{detail}"
    return None


@dataclass(frozen=True)
class PodFailure:
    pod: str
    container: str
    reason: str
    exit_code: int | None
    message: str


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> PodFailure | None:
    """The most recent terminated-with-failure container among the tuner's pods."""
    found: list[tuple[str, PodFailure]] = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            for key in ("state", "lastState"):
                term = (cs.get(key) or {}).get("terminated")
                if not term or term.get("exitCode") == 0:
                    continue
                when = str(term.get("finishedAt") or "")
                found.append((when, PodFailure(
                    pod=name, container=str(cs.get("name") or ""),
                    reason=str(term.get("reason") or "Error"),
                    exit_code=term.get("exitCode"), message=str(term.get("message") or "").strip(),
                )))  # fmt: skip
        if status.get("phase") == "Failed" and status.get("reason"):  # Evicted and the like
            found.append((str(status.get("startTime") or ""), PodFailure(
                pod=name, container="", reason=str(status["reason"]), exit_code=None,
                message=str(status.get("message") or ""),
            )))  # fmt: skip
    if not found:
        return None
    return max(found, key=lambda pair: pair[0])[1]


_ADVICE = {
    "OOMKilled": "the tuner ran out of memory: give the tuner more memory or narrow "
    "spec.search (fewer large maxBatchSize values)",
    "DeadlineExceeded": "the Job hit its deadline: raise spec.tuning.timeoutMinutes or lower "
    "spec.tuning.maxTrials",
    "BackoffLimitExceeded": "the tuner crashed on every attempt",
    "Evicted": "the node evicted the tuner pod (resource pressure)",
}


def job_failure_message(job: str, outcome: JobOutcome, pod: PodFailure | None, logs: str) -> str:
    parts = [f"tuner Job {job} failed ({outcome.reason}"
             + (f": {outcome.message}" if outcome.message else "") + ")"]  # fmt: skip
    if pod is not None:
        exit_code = f", exit code {pod.exit_code}" if pod.exit_code is not None else ""
        where = f"container {pod.container} of pod {pod.pod}" if pod.container else f"pod {pod.pod}"
        detail = f"; {where}: {pod.reason}{exit_code}"
        if pod.message:
            detail += f": {_clip(pod.message, 300)}"
        parts.append(detail)
    if logs.strip():
        parts.append(f"; last log lines: {_clip(' | '.join(logs.strip().splitlines()[-3:]), 400)}")
    reason = pod.reason if pod is not None and pod.reason in _ADVICE else outcome.reason
    advice = _ADVICE.get(reason, "")
    parts.append(f". {advice[:1].upper() + advice[1:]}." if advice else ".")
    parts.append(f" See `kubectl logs job/{job}`; delete the Job to retry, or change the spec.")
    return "".join(parts)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------ the report ConfigMap


def report_configmap(
    *,
    name: str,
    namespace: str,
    report_json: str,
    th: str | None,
    owner_uid: str | None,
) -> Body:
    """What the tuner Job writes: report.json, gzipped into binaryData when it is large."""
    raw = report_json.encode("utf-8")
    labels = {**common_labels(name, "tuning-report")}
    annotations: dict[str, str] = {}
    if th:
        labels[LABEL_HASH] = th
        annotations[ANNOTATION_HASH] = th
    body: Body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": report_configmap_name(name),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
    }
    if owner_uid:
        owner = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "uid": owner_uid},
        }
        # No blockOwnerDeletion: that would need inferencedeployments/finalizers rights.
        body["metadata"]["ownerReferences"] = [owner_reference(owner, block=False)]
    if len(raw) <= REPORT_GZIP_THRESHOLD:
        body["data"], body["binaryData"] = {REPORT_KEY: report_json}, None
        return body
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    if len(packed) * 4 / 3 > REPORT_MAX_BYTES:
        raise ValueError(
            f"the report is {len(raw)} bytes ({len(packed)} gzipped): too large for a ConfigMap"
        )
    body["data"] = None
    body["binaryData"] = {REPORT_GZ_KEY: base64.b64encode(packed).decode("ascii")}
    return body


def configmap_hash(cm: Mapping[str, Any] | None) -> str | None:
    if not cm:
        return None
    meta = cm.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_HASH) or (meta.get("labels") or {}).get(
        LABEL_HASH
    )
    return str(value) if value else None


def report_text(cm: Mapping[str, Any]) -> str:
    """The report JSON from a report ConfigMap, plain or gzipped. ValueError if neither."""
    data = cm.get("data") or {}
    if REPORT_KEY in data:
        return str(data[REPORT_KEY])
    packed = (cm.get("binaryData") or {}).get(REPORT_GZ_KEY)
    if packed:
        try:
            return gzip.decompress(base64.b64decode(packed)).decode("utf-8")
        except (ValueError, OSError) as exc:
            raise ValueError(f"{REPORT_GZ_KEY} is not valid base64 gzip: {exc}") from None
    name = cm.get("metadata", {}).get("name", "?")
    raise ValueError(f"ConfigMap {name} holds neither {REPORT_KEY} nor {REPORT_GZ_KEY}")


def parse_report(cm: Mapping[str, Any]) -> Report:
    """ValueError (with the first problems) when the ConfigMap does not hold a valid report."""
    text = report_text(cm)
    try:
        return Report.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise ValueError(f"not a valid infertune report: {problems}") from None


# ------------------------------------------------------------------ status


@dataclass(frozen=True)
class Cond:
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Transition:
    """The next state: phase, the conditions to set, and status fields (camelCase; None clears)."""

    phase: Phase
    message: str
    conditions: dict[str, Cond]
    fields: dict[str, Any] = field(default_factory=dict)


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
    """metav1.Condition semantics: lastTransitionTime only moves when the status changes."""
    by_type = {str(c.get("type")): dict(c) for c in old or [] if c.get("type")}
    for ctype, cond in updates.items():
        prev = by_type.get(ctype)
        moved = prev is None or prev.get("status") != cond.status
        entry: Body = {
            "type": ctype,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": now if moved else prev.get("lastTransitionTime", now),  # type: ignore[union-attr]
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        by_type[ctype] = entry
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
    """Our status fields after the transition (Kopf's own status keys are left alone)."""
    old = old or {}
    new: Body = {
        "phase": t.phase,
        "message": t.message,
        "conditions": set_conditions(
            old.get("conditions"), t.conditions, generation=generation, now=now
        ),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    if tuning_hash is not None:
        new["tuningHash"] = tuning_hash
    new.update(t.fields)
    return new


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Body | None:
    """The merge patch from old to new status (None when nothing changed)."""
    old = old or {}
    patch = {k: v for k, v in new.items() if old.get(k) != v and not (v is None and k not in old)}
    return patch or None


def transition_events(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Event]:
    """One event per condition whose status or reason changed."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    events: list[Event] = []
    for c in new.get("conditions") or []:
        prev = before.get(c["type"])
        if prev and prev.get("status") == c["status"] and prev.get("reason") == c["reason"]:
            continue
        if c["reason"] == AWAITING_TUNING:
            continue  # bookkeeping, not news
        kind: Literal["Normal", "Warning"] = (
            "Warning" if c["reason"] in WARNING_REASONS else "Normal"
        )
        events.append(Event(kind, c["reason"], c["message"] or c["reason"]))
    return events


def _has_condition(old: Mapping[str, Any] | None, ctype: str) -> bool:
    return any(c.get("type") == ctype for c in (old or {}).get("conditions") or [])


def invalid_spec(problems: list[str]) -> Transition:
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
    serving = any(
        c.get("type") == DEPLOYED and c.get("status") == "True"
        for c in (old_status or {}).get("conditions") or []
    )
    if serving:
        message += "; the previous configuration keeps serving until it finishes"
    for ctype in (DEPLOYED, READY):
        if not _has_condition(old_status, ctype):
            conditions[ctype] = Cond("False", AWAITING_TUNING, "waiting for tuning to finish")
    return Transition(phase=phase, message=message, conditions=conditions)


def tuning_pending(
    job: str, detail: str | None, old_status: Mapping[str, Any] | None
) -> Transition:
    """The tuner Job exists; its pod does not run yet (scheduling, GPUs, image pull)."""
    message = f"tuning: tuner Job {job} is waiting for its pod" + (f" ({detail})" if detail else "")
    return _tuning_transition("Pending", TUNING_PENDING, message, old_status)


def tuning_started(job: str, old_status: Mapping[str, Any] | None) -> Transition:
    """The tuner pod runs."""
    message = f"tuning: tuner Job {job} is running"
    return _tuning_transition("Tuning", TUNING_STARTED, message, old_status)


def tuning_job_failed(message: str) -> Transition:
    return Transition(
        phase="Failed",
        message=message,
        conditions={TUNED: Cond("False", TUNING_JOB_FAILED, message)},
    )


def _relax_hints(report: Report) -> list[str]:
    hints: list[str] = []
    text = " ".join(v for m in report.nearest_misses for v in m.violations)
    for label, hint in (
        ("TTFT", "raise spec.slo.ttftMs"),
        ("ITL", "raise spec.slo.itlMs"),
        ("E2E", "raise spec.slo.e2eLatencyMs"),
        ("tok/s/GPU", "lower spec.slo.minOutputTokensPerSecondPerGpu"),
    ):
        if label in text:
            hints.append(hint)
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
    return ". ".join(lines)


def no_feasible_config(report: Report, report_cm: str) -> Transition:
    message = no_feasible_message(report)
    return Transition(
        phase="Failed",
        message=message,
        conditions={TUNED: Cond("False", NO_FEASIBLE_CONFIG, message)},
        fields={
            "trials": {"executed": report.executed_trials, "total": len(report.trials)},
            "reportConfigMap": report_cm,
        },
    )


def best_config(report: Report) -> TrialConfig:
    assert report.best is not None
    return report.best.config.to_config()


def tuned_fields(report: Report, report_cm: str) -> dict[str, Any]:
    assert report.best is not None
    best = report.best
    m = best.metrics
    trial = next((t for t in report.trials if t.number == best.trial), None)
    metrics: dict[str, Any] = {}
    for metric, prefix in (("ttft_ms", "ttft"), ("itl_ms", "itl"), ("e2e_ms", "e2e")):
        for p in ("p50", "p95", "p99"):
            metrics[f"{prefix}{p.upper()}Ms"] = getattr(m, metric).get(p)
    metrics["outputTokensPerSecondPerGpu"] = m.output_tokens_per_s_per_gpu
    metrics["sloMet"] = (
        bool(trial.slo_ok) if trial is not None and trial.slo_ok is not None else True
    )
    c = best.config
    return {
        "bestConfig": {
            "tp": c.tp,
            "maxBatchSize": c.max_batch_size,
            "quantization": c.quantization,
            "kvCacheDtype": c.kv_cache_dtype,
        },
        "bestMetrics": metrics,
        "trials": {"executed": report.executed_trials, "total": len(report.trials)},
        "reportConfigMap": report_cm,
    }


def tuned_message(report: Report) -> str:
    assert report.best is not None
    return (
        f"best {report.best.config.label()}: "
        f"{report.best.metrics.output_tokens_per_s_per_gpu:.0f} tok/s/GPU, SLO met "
        f"({report.executed_trials} trials executed)"
    )


def is_brand_new(body: Mapping[str, Any]) -> bool:
    """An object no sync has written to yet (no status at all) and that is not being deleted."""
    meta = body.get("metadata") or {}
    return not body.get("status") and not meta.get("deletionTimestamp") and bool(meta.get("uid"))


def config_from_status(status: Mapping[str, Any] | None, th: str) -> TrialConfig | None:
    """The best config already recorded for this tuning hash (Tuned=True), else None."""
    status = status or {}
    if status.get("tuningHash") != th:
        return None
    tuned = any(
        c.get("type") == TUNED and c.get("status") == "True" for c in status.get("conditions") or []
    )
    best = status.get("bestConfig") or {}
    if not tuned or not best:
        return None
    try:
        return TrialConfig(
            int(best["tp"]), int(best["maxBatchSize"]),
            str(best["quantization"]), str(best["kvCacheDtype"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None


def cannot_serve(config: TrialConfig, problem: str, tuned: tuple[Report, str] | None) -> Transition:
    """Tuning found a winner that cannot be rendered for serving (e.g. no checkpoint for it)."""
    message = f"cannot serve {config.label()}: {problem}"
    conditions = {
        DEPLOYED: Cond("False", CANNOT_SERVE, message),
        READY: Cond("False", CANNOT_SERVE, message),
    }
    fields: dict[str, Any] = {}
    if tuned is not None:
        report, report_cm = tuned
        conditions[TUNED] = Cond("True", TUNING_SUCCEEDED, tuned_message(report))
        fields.update(tuned_fields(report, report_cm))
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
    tuned: tuple[Report, str] | None,
) -> Transition:
    """After tuning: Deploying until the Deployment is available, then Ready."""
    conditions: dict[str, Cond] = {}
    fields: dict[str, Any] = {}
    if tuned is not None:
        report, report_cm = tuned
        conditions[TUNED] = Cond("True", TUNING_SUCCEEDED, tuned_message(report))
        fields.update(tuned_fields(report, report_cm))
    conditions[DEPLOYED] = Cond(
        "True", SERVING_APPLIED, f"Deployment, Service and ConfigMap applied for {config.label()}"
    )
    a = availability
    if a.wanted == 0:
        conditions[READY] = Cond("False", SCALED_TO_ZERO, "spec.serving.replicas is 0")
        fields["endpoint"] = None
        return Transition(
            "Deploying", "scaled to zero (spec.serving.replicas: 0)", conditions, fields
        )
    if a.ready:
        ep = endpoint(name, namespace)
        message = f"serving {config.label()} at {ep} ({a.available}/{a.wanted} replicas available)"
        conditions[READY] = Cond("True", DEPLOYMENT_AVAILABLE, message)
        fields["endpoint"] = ep
        return Transition("Ready", message, conditions, fields)
    message = f"deploying {config.label()}: {a.available}/{a.wanted} replicas available"
    conditions[READY] = Cond("False", DEPLOYING, message)
    return Transition("Deploying", message, conditions, fields)
