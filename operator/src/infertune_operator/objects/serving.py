"""The Kubernetes objects that serve one configuration (pure: plain dicts, no Kubernetes client).

`render_serving` returns, in apply order:

- ConfigMap `<name>-model-repo`: the serving runtime's rendered model files (`model.yaml`,
  `config.pbtxt` of TensorRT-LLM's LLM-API model);
- Deployment `<name>`: the runtime's container (`infertune_tuner.runtime`): Triton on the Triton
  TRT-LLM image with the launch a tuning trial used, the configuration's GPUs, pinned to the GPU
  product's nodes; or the simulated server on the operator image, same ports and probes, no GPU;
- Service `<name>`: ClusterIP with http 8000, grpc 8001, metrics 8002.

Placement, model storage, token, security context and resource requests are the pieces the
tuner Job shares (`pods`). Owner references are the operator's business (added when applying).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import PurePosixPath
from typing import Any

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.naming import (
    ANNOTATION_CONFIG,
    ANNOTATION_REPO_HASH,
    HTTP_PORT,
    PORTS,
    model_repo_configmap_name,
    serving_labels,
    serving_selector,
)
from infertune_operator.objects.pods import (
    gpu_placement,
    model_storage,
    resources,
    security,
    shm_volume,
    token_env,
)
from infertune_operator.settings import Settings
from infertune_tuner import pools
from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import Ports, ServingRuntime, runtime_for
from infertune_tuner.runtime.base import FILES_DIR, LIVE_PATH, READY_PATH, REPO_DIR
from infertune_tuner.runtime.weights import MissingCheckpoint, cache_gib, weights_uri

PROBE_PERIOD_S = 10


def _metadata(obj: InferenceDeployment, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": serving_labels(obj.metadata.name)}
    if obj.metadata.namespace:
        meta["namespace"] = obj.metadata.namespace
    return meta


def serving_request(obj: InferenceDeployment, settings: Settings) -> TuningRequest:
    """The deployment in the runtime's terms (the same bridge the tuner Job's request uses)."""
    return to_request(obj, default_backend=settings.default_backend)


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _ports() -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": port, "protocol": "TCP"} for n, port in PORTS.items()]


def startup_failure_threshold(minutes: int) -> int:
    """Probe failures (one per PROBE_PERIOD_S) that fill the startup window."""
    return math.ceil(minutes * 60 / PROBE_PERIOD_S)


def render_serving(
    obj: InferenceDeployment,
    config: TrialConfig,
    settings: Settings,
    *,
    runtime: ServingRuntime | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, Deployment and Service serving ``config``.

    Args:
        obj: The InferenceDeployment.
        config: The configuration to serve.
        settings: Images, model storage, and the default backend.
        runtime: The serving runtime. None resolves it as the operator does: the simulated
            server when ``settings.backend_for(obj)`` is ``simulated``, Triton otherwise.

    Returns:
        The objects in apply order. Raises InputError when the configuration cannot be served
        (unknown GPU or model; a quantization without a pre-quantized checkpoint on Triton).
    """
    name = obj.metadata.name
    spec = obj.spec
    if runtime is None:
        runtime = runtime_for(settings.backend_for(obj))
    for product in spec.gpu.products:
        get_gpu(product)  # an unknown GPU is an InputError, simulated or not
    request = serving_request(obj, settings)
    if config.gpu:  # the pool the tuning chose among spec.gpu.pools: served there
        request = pools.single(request, config.gpu)
    if runtime.name == "simulated":
        request.resolve_model()  # the simulated server must know the model's shape
    try:
        rendered = runtime.model_files(request, config)
    except MissingCheckpoint as exc:
        raise InputError(f"cannot serve {config.label()}: {exc}") from None
    files = {PurePosixPath(rel).name: text for rel, text in rendered.items()}
    shape = runtime.pod(request, config, Ports())
    repo_hash = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(obj, model_repo_configmap_name(name)),
        "data": files,
    }

    shm, shm_mount = shm_volume(shape.shm)
    volumes: list[dict[str, Any]] = [
        shm, {"name": "model-repo-config", "configMap": {"name": model_repo_configmap_name(name)}},
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [
        shm_mount, {"name": "model-repo-config", "mountPath": FILES_DIR, "readOnly": True},
    ]  # fmt: skip
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in shape.env.items()]
    ephemeral = 0
    pod: dict[str, Any] = {}
    if shape.loads_weights:
        uri = weights_uri(request, config)
        v, m, e, ephemeral = model_storage(
            [uri], settings.model_storage_pvc, cache_gib(request, [config.quantization])
        )
        volumes += [*v, {"name": "model-repo", "emptyDir": {"sizeLimit": "1Gi"}}]
        mounts += [*m, {"name": "model-repo", "mountPath": REPO_DIR}]
        env += [*e, *token_env(obj)]
    if shape.gpus:
        pod.update(gpu_placement(obj, config.gpu or None))
    pod_security, container_security = security(shape.runs_as_root)
    overrides = spec.serving.resources.model_dump() if spec.serving.resources else None
    container: dict[str, Any] = {
        "name": "triton" if shape.image == "triton" else "simserver",
        "image": (spec.serving.image or settings.triton_image)
        if shape.image == "triton"
        else settings.operator_image,
        "command": shape.command,
        "ports": _ports(),
        "resources": resources(shape, overrides, ephemeral_gib=ephemeral),
        "securityContext": container_security,
    }
    if env:
        container["env"] = env
    container["volumeMounts"] = mounts
    if shape.fetch_command is not None:
        # The weights the server loads, and nothing else of the repository, into the model
        # cache before Triton starts: the same command the tuner ran before its trial.
        pod["initContainers"] = [{
            "name": "fetch-weights",
            "image": container["image"],
            "command": shape.fetch_command,
            "env": env,
            "volumeMounts": [m for m in mounts if m["name"] == "model-cache"],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            "securityContext": container_security,
        }]  # fmt: skip
    failures = startup_failure_threshold(spec.serving.startup_timeout_minutes)
    container["startupProbe"] = _probe(READY_PATH, PROBE_PERIOD_S, failures)
    container["readinessProbe"] = _probe(READY_PATH, PROBE_PERIOD_S, 3)
    if shape.liveness_command is not None:  # the server must still generate (runtime's probe)
        container["livenessProbe"] = {
            "exec": {"command": shape.liveness_command},
            "periodSeconds": 60,
            "timeoutSeconds": shape.liveness_timeout_s + 5,
            "failureThreshold": 3,
        }
    else:
        container["livenessProbe"] = _probe(LIVE_PATH, 15, 4)
    annotations = {ANNOTATION_CONFIG: config.label(), ANNOTATION_REPO_HASH: repo_hash}
    deployment_meta = _metadata(obj, name)
    deployment_meta["annotations"] = {ANNOTATION_CONFIG: config.label()}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": deployment_meta,
        "spec": {
            "replicas": spec.serving.replicas,
            "selector": {"matchLabels": serving_selector(name)},
            # GPUs are scarce: replace pods in place rather than wait for a surge pod's GPUs.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {"labels": serving_labels(name), "annotations": annotations},
                "spec": {
                    **pod,
                    "securityContext": pod_security,
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(obj, name),
        "spec": {
            "type": "ClusterIP",
            "selector": serving_selector(name),
            "ports": [
                {
                    "name": p["name"],
                    "port": p["containerPort"],
                    "targetPort": p["name"],
                    "protocol": "TCP",
                }
                for p in _ports()
            ],
        },
    }
    return [config_map, deployment, service]
