"""The tuner Job and what it needs (pure).

For one tuning hash: the request ConfigMap (the TuningRequest as JSON), the Job that runs
``infertune tune-job`` on it (on the GPU pool, or on the operator image when simulated), the
tuner's ServiceAccount and RoleBinding in the namespace. With ``spec.tuning.parallelism`` > 1
the Job is an Indexed Job of that many workers on one shared study (tuner_workers.py). Reading
the Job back (its outcome, why its pods wait or failed) is tuner_outcome.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.naming import (
    ANNOTATION_DEADLINE,
    ANNOTATION_HASH,
    COMPONENT_REQUEST,
    COMPONENT_TUNER,
    JOB_UID_POD_LABEL,
    LABEL_COMPONENT,
    LABEL_HASH,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    MANAGER,
    TUNER_JOB_UID_ENV,
    Body,
    common_labels,
    job_name,
    owner_reference,
    pool_job_name,
    report_configmap_name,
    request_configmap_name,
)
from infertune_operator.objects import tuner_workers
from infertune_operator.objects.pods import (
    gpu_placement,
    model_storage,
    resources,
    security,
    shm_volume,
    token_env,
)
from infertune_operator.objects.tuner_deadline import job_deadline
from infertune_operator.objects.tuner_workers import (
    POOL_ENV,
    WORKER_GPUS_ENV,
    make_indexed,
    storage_env,
)
from infertune_operator.settings import Settings
from infertune_tuner import pools
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import Ports, TritonRuntime
from infertune_tuner.runtime.weights import cache_gib, trial_weights

REQUEST_KEY = "request.json"
TUNER_CONTAINER = "tuner"
CONFIG_MOUNT = "/config"
# The tuner's own work beside the trial server: the load generator (one busy core at high
# concurrency), the study, the report.
LOADGEN_CPU_M, LOADGEN_MEMORY_MI = 1000, 2048
SIMULATED_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


# ------------------------------------------------------------------ the Job and its inputs


def tuner_gpus(obj: InferenceDeployment, product: str | None = None) -> int:
    """The GPUs the tuner pod asks for: the largest TP in the search space that fits one node
    (<= maxGpusPerReplica, the pool's own where it sets one), so every configuration of the
    space can run in it."""
    pool = obj.spec.gpu.pool(product)
    cap = pool.max_gpus_per_replica or obj.spec.gpu.max_gpus_per_replica
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
    )


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
        The ConfigMap (``request.json``, without the storage URL: see tuner_workers), owned by
        the InferenceDeployment.
    """
    name = body["metadata"]["name"]
    request = tuning_request(obj, settings)
    # The storage URL (it may hold a password) reaches the workers through their environment.
    request = request.model_copy(
        update={"tuning": request.tuning.model_copy(update={"storage": None})}
    )
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


def job_uid_env() -> Body:
    """The pod's own Job uid, for the report to say which Job answered (downward API)."""
    field = f"metadata.labels['{JOB_UID_POD_LABEL}']"
    return {"name": TUNER_JOB_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": field}}}


def tuner_job_names(obj: InferenceDeployment, name: str, th: str, settings: Settings) -> list[str]:
    """The names of the Jobs that tune one spec: one, or one per GPU pool
    (``tuner_workers.pool_jobs``), each on its pool's nodes and a worker of the one study."""
    if not tuner_workers.pool_jobs(obj, settings):
        return [job_name(name, th)]
    return [pool_job_name(name, th, i) for i in range(len(obj.spec.gpu.products))]


def tuner_jobs(
    obj: InferenceDeployment, body: Mapping[str, Any], th: str, settings: Settings
) -> list[Body]:
    """The Jobs :func:`tuner_job_names` names, rendered."""
    if not tuner_workers.pool_jobs(obj, settings):
        return [tuner_job(obj, body, th, settings)]
    return [tuner_job(obj, body, th, settings, pool=i) for i in range(len(obj.spec.gpu.products))]


def tuner_job(
    obj: InferenceDeployment,
    body: Mapping[str, Any],
    th: str,
    settings: Settings,
    pool: int | None = None,
) -> Body:
    """The Job that tunes one spec: ``infertune tune-job`` on the request ConfigMap.

    Args:
        obj: The validated InferenceDeployment.
        body: The object as stored (name, namespace, uid).
        th: The tuning hash (names the Job, labels everything it makes).
        settings: Images, service account, backoff limit, default backend.
        pool: The index of the GPU pool (spec.gpu.pools) this Job measures on: the Job is
            named for it, lands on its nodes and holds its GPUs (None: the spec's one pool).

    Returns:
        The Job. Real trials run on the tuner image with :func:`tuner_gpus` GPUs on the GPU
        pool the winner will serve on, with the trial server's requests, /dev/shm, model
        storage and token (the serving runtime's pod shape at the largest TP, see `pods`) plus
        the load generator's CPU and memory; simulated ones on the operator image without GPUs.
        The deadline (``tuner_deadline``): the spec's timeout, or the trial budget times the
        per-trial bound, plus time to write the report. With parallelism
        N > 1: an Indexed Job of N such pods, workers of one study (see tuner_workers), each
        packing trials into its GPUs.
    """
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    product = obj.spec.gpu.products[pool] if pool is not None else None
    own_name = job_name(name, th) if pool is None else pool_job_name(name, th, pool)
    meta = _tuning_metadata(body, own_name, COMPONENT_TUNER, th)
    container: Body = {
        "name": TUNER_CONTAINER,
        "command": tune_job_command(name, namespace, body["metadata"]["uid"], th),
        "volumeMounts": [{"name": "request", "mountPath": CONFIG_MOUNT, "readOnly": True}],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, job_uid_env()],
    }
    if product is not None:
        meta["labels"][LABEL_POOL] = product
        container["env"].append({"name": POOL_ENV, "value": product})
    pod: Body = {
        "serviceAccountName": settings.tuner_service_account,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "request", "configMap": {"name": request_configmap_name(name, th)}}],
    }
    if (storage := storage_env(obj, settings)) is not None:
        container["env"].append(storage)
    if settings.simulated(obj):
        container["image"] = settings.operator_image
        container["resources"] = copy.deepcopy(SIMULATED_RESOURCES)
        pod["securityContext"], container["securityContext"] = security(runs_as_root=False)
        # A read-only root filesystem: the study journal and the report go to /tmp.
        pod["volumes"].append({"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}})
        container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    else:
        request = tuning_request(obj, settings)
        if product is not None:
            request = pools.single(request, product)
        gpus = tuner_gpus(obj, product)
        largest = TrialConfig(gpus, max(request.search.max_batch_size), "bf16", "auto")
        shape = TritonRuntime().pod(request, largest, Ports())
        uris = trial_weights(request)
        claim = obj.spec.tuning.model_cache_claim or settings.model_storage_pvc
        volumes, mounts, env, ephemeral = model_storage(
            uris, claim, cache_gib(request, request.search.quantization)
        )
        shm, shm_mount = shm_volume(shape.shm)
        overrides = obj.spec.serving.resources.model_dump() if obj.spec.serving.resources else None
        container["image"] = settings.tuner_image
        container["resources"] = resources(
            shape, overrides, extra_cpu_m=LOADGEN_CPU_M, extra_memory_mi=LOADGEN_MEMORY_MI,
            ephemeral_gib=ephemeral,
        )  # fmt: skip
        container["env"] += [
            *({"name": k, "value": v} for k, v in shape.env.items()),  # trial servers inherit it
            *env,
            *token_env(obj),
            {"name": WORKER_GPUS_ENV, "value": str(gpus)},
        ]
        container["volumeMounts"] += [*mounts, shm_mount]
        pod["volumes"] += [*volumes, shm]
        pod.update(gpu_placement(obj, product))
        pod["securityContext"], container["securityContext"] = security(shape.runs_as_root)
    spec: Body = {
        "backoffLimit": settings.job_backoff_limit,
        "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod},
    }
    make_indexed(spec, obj.spec.tuning.parallelism, settings.job_backoff_limit)
    deadline = job_deadline(obj, settings)
    spec["activeDeadlineSeconds"] = deadline.seconds
    meta["annotations"][ANNOTATION_DEADLINE] = deadline.derivation
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
