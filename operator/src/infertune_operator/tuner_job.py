"""The tuner Job and what it needs, and what its Job and pods say when it ends (pure).

For one tuning hash: the request ConfigMap (the TuningRequest as JSON), the Job that runs
``infertune tune-job`` on it (on the GPU pool, or on the operator image when simulated), the
tuner's ServiceAccount and RoleBinding in the namespace. Then, reading back: the Job's outcome,
why its pod waits (unschedulable, image pull), and a failure message a person can act on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from infertune_operator.api.models import InferenceDeployment
from infertune_operator.api.to_request import to_request
from infertune_operator.naming import (
    ANNOTATION_HASH,
    COMPONENT_REQUEST,
    COMPONENT_TUNER,
    LABEL_COMPONENT,
    LABEL_HASH,
    LABEL_MANAGED_BY,
    MANAGER,
    Body,
    common_labels,
    job_name,
    owner_reference,
    report_configmap_name,
    request_configmap_name,
)
from infertune_operator.pods import (
    gpu_placement,
    model_storage,
    resources,
    security,
    shm_volume,
    token_env,
)
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import Ports, TritonRuntime
from infertune_tuner.runtime.weights import MissingCheckpoint, cache_gib, weights_uri

REQUEST_KEY = "request.json"
TUNER_CONTAINER = "tuner"
CONFIG_MOUNT = "/config"
JOB_DEADLINE_GRACE_S = 600  # the tuner stops itself at timeoutMinutes; time to write its report
# The tuner's own work beside the trial server: the load generator (one busy core at high
# concurrency), the study, the report.
LOADGEN_CPU_M, LOADGEN_MEMORY_MI = 1000, 2048
SIMULATED_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


# ------------------------------------------------------------------ the Job and its inputs


def tuner_gpus(obj: InferenceDeployment) -> int:
    """The GPUs the tuner pod asks for: the largest TP in the search space that fits one node
    (<= maxGpusPerReplica), so every configuration of the space can run in it."""
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


def tuning_request(obj: InferenceDeployment, settings: Settings) -> TuningRequest:
    """The TuningRequest of a spec under this operator's defaults."""
    return to_request(
        obj,
        default_backend=settings.default_backend,
        default_max_trials=settings.default_max_trials,
        default_storage=settings.tuner_storage,
    )


def trial_weights(request: TuningRequest) -> list[str]:
    """Every weights URI a trial of this request may load (the base model and the checkpoint of
    each searched quantization that has one)."""
    uris: list[str] = []
    for q in request.search.quantization:
        try:
            uri = weights_uri(request, TrialConfig(1, 1, q, "auto"))
        except MissingCheckpoint:
            continue
        if uri not in uris:
            uris.append(uri)
    return uris


def request_configmap(
    obj: InferenceDeployment, body: Mapping[str, Any], th: str, settings: Settings
) -> Body:
    """The TuningRequest the tuner Job reads, in a ConfigMap named for the tuning hash.

    Args:
        obj: The validated InferenceDeployment.
        body: The object as stored (name, namespace, uid).
        th: The tuning hash.
        settings: The operator's defaults for what spec.tuning leaves unset.

    Returns:
        The ConfigMap (``request.json``), owned by the InferenceDeployment.
    """
    name = body["metadata"]["name"]
    request = tuning_request(obj, settings)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _tuning_metadata(body, request_configmap_name(name, th), COMPONENT_REQUEST, th),
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
    """The Job that tunes one spec: ``infertune tune-job`` on the request ConfigMap.

    Args:
        obj: The validated InferenceDeployment.
        body: The object as stored (name, namespace, uid).
        th: The tuning hash (names the Job, labels everything it makes).
        settings: Images, service account, backoff limit, default backend.

    Returns:
        The Job. Real trials run on the tuner image with :func:`tuner_gpus` GPUs on the GPU
        pool the winner will serve on, with the trial server's requests, /dev/shm, model
        storage and token (the serving runtime's pod shape at the largest TP, see `pods`) plus
        the load generator's CPU and memory; simulated ones on the operator image without GPUs.
        The deadline is the spec's timeout plus time to write the report.
    """
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    meta = _tuning_metadata(body, job_name(name, th), COMPONENT_TUNER, th)
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
    if settings.simulated(obj):
        container["image"] = settings.operator_image
        container["resources"] = copy.deepcopy(SIMULATED_RESOURCES)
        pod["securityContext"], container["securityContext"] = security(runs_as_root=False)
        # A read-only root filesystem: the study journal and the report go to /tmp.
        pod["volumes"].append({"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}})
        container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    else:
        request = tuning_request(obj, settings)
        largest = TrialConfig(tuner_gpus(obj), max(request.search.max_batch_size), "bf16", "auto")
        shape = TritonRuntime().pod(request, largest, Ports())
        uris = trial_weights(request)
        volumes, mounts, env, ephemeral = model_storage(
            uris, settings, cache_gib(request, request.search.quantization)
        )
        shm, shm_mount = shm_volume(shape.shm)
        overrides = obj.spec.serving.resources.model_dump() if obj.spec.serving.resources else None
        container["image"] = settings.tuner_image
        container["resources"] = resources(
            shape, overrides, extra_cpu_m=LOADGEN_CPU_M, extra_memory_mi=LOADGEN_MEMORY_MI,
            ephemeral_gib=ephemeral,
        )  # fmt: skip
        container["env"] += [*env, *token_env(obj)]
        container["volumeMounts"] += [*mounts, shm_mount]
        pod["volumes"] += [*volumes, shm]
        pod.update(gpu_placement(obj))
        pod["securityContext"], container["securityContext"] = security(shape.runs_as_root)
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
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_COMPONENT: COMPONENT_TUNER},
        },
    }


def tuner_role_binding(namespace: str, settings: Settings) -> Body:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": settings.tuner_service_account,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_COMPONENT: COMPONENT_TUNER},
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
    """Where a tuner Job stands.

    Args:
        job: The Job as read.

    Returns:
        succeeded (Complete, or a succeeded pod), failed (the Failed condition with its reason,
        or more failed pods than backoffLimit), running (its pod runs) or pending (no pod runs
        yet: scheduling, GPUs, image pull).
    """
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
    """Why the tuner's pods failed, as Kubernetes recorded it.

    Args:
        pods: The pods of the tuner Job.

    Returns:
        The most recent failure: a container that terminated with a non-zero exit code (its
        reason, e.g. OOMKilled, exit code and message), or a pod the node failed (Evicted and
        the like); None when no pod failed.
    """
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
    """What a person needs to act on a failed tuner Job, in one line.

    Args:
        job: The Job's name.
        outcome: Its failed outcome (reason and message from the Job).
        pod: The pods' failure, when one was found.
        logs: The last log lines of the failed container ("" when not read).

    Returns:
        The Job's reason, the pod's (with exit code and message), the last log lines, advice
        for the known reasons (OOMKilled, DeadlineExceeded ...) and how to retry.
    """
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
