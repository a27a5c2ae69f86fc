"""The Kubernetes objects that serve one configuration (pure: plain dicts, no Kubernetes client).

`render_serving` returns, in apply order:

- ConfigMap `<name>-model-repo`: the rendered Triton model repository files (`model.yaml`,
  `config.pbtxt`) for TensorRT-LLM's LLM-API model;
- Deployment `<name>`: Triton (the TRT-LLM image) started by `launch_triton_server.py
  --world_size TP`, TP GPUs, pinned to the GPU product's nodes; or, when simulated, the operator
  image running `infertune simserver` with the same ports and probes and no GPU;
- Service `<name>`: ClusterIP with http 8000, grpc 8001, metrics 8002.

Owner references are the operator's business (it adds them when applying).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from infertune_operator.api.models import InferenceDeployment
from infertune_operator.naming import (
    ANNOTATION_CONFIG,
    ANNOTATION_REPO_HASH,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    PORTS,
    model_repo_configmap_name,
    serving_labels,
    serving_selector,
)
from infertune_operator.settings import Settings
from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.models import MODELS, get_model
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.harness.triton_repo import (
    LLMAPI_MODEL_DIR,
    MODELS_ROOT,
    SERVED_MODEL,
    MissingCheckpoint,
    checkpoint_uri,
    config_pbtxt,
    default_model_id,
    launcher_command,
    max_num_tokens_for,
    model_path_for,
    model_yaml_text,
    split_pvc,
)

REPO_CONFIG_DIR = "/etc/infertune/model-repo"  # the ConfigMap
REPO_DIR = "/model-repo"  # the assembled model repository (emptyDir)
SHM_LIMIT_GPU = "16Gi"
SHM_LIMIT_SIMULATED = "64Mi"
STARTUP_FAILURES = 180  # x 10 s: loading (and downloading) a large model takes many minutes
SIM_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def _metadata(obj: InferenceDeployment, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": serving_labels(obj.metadata.name)}
    if obj.metadata.namespace:
        meta["namespace"] = obj.metadata.namespace
    return meta


def weights_uri(obj: InferenceDeployment, config: TrialConfig) -> str:
    """The URI of the weights this config loads (raises MissingCheckpoint)."""
    m = obj.spec.model
    hf_ids = MODELS[m.name].hf_ids if m.name in MODELS else ()
    base = m.source.uri if m.source is not None else None
    return checkpoint_uri(
        config.quantization,
        {str(k): v for k, v in m.checkpoints.items()},
        base,
        default_model_id(m.name, hf_ids),
    )


def model_repo_files(obj: InferenceDeployment, config: TrialConfig, uri: str) -> dict[str, str]:
    return {
        "model.yaml": model_yaml_text(
            config,
            model_path_for(uri, MODELS_ROOT),
            max_num_tokens=max_num_tokens_for(obj.spec.workload.input_tokens),
        ),
        "config.pbtxt": config_pbtxt(SERVED_MODEL),
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _ports() -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": port, "protocol": "TCP"} for n, port in PORTS.items()]


def _resources(
    obj: InferenceDeployment, base: dict[str, dict[str, Any]], gpus: int
) -> dict[str, Any]:
    """Base requests/limits, the user's overrides on top, and the GPU count forced to TP (or
    removed, when simulated)."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in base.items()}
    overrides = obj.spec.serving.resources
    if overrides is not None:
        for kind in ("requests", "limits"):
            extra = getattr(overrides, kind)
            if extra:
                out.setdefault(kind, {}).update(extra)
    for kind in ("requests", "limits"):
        part = out.setdefault(kind, {})
        part.pop(GPU_RESOURCE, None)
        if gpus:
            part[GPU_RESOURCE] = gpus
    return {k: v for k, v in out.items() if v}


def _start_script(tp: int) -> str:
    launch = shlex.join(
        launcher_command(
            tp,
            REPO_DIR,
            served_model=SERVED_MODEL,
            grpc_port=GRPC_PORT,
            http_port=HTTP_PORT,
            metrics_port=METRICS_PORT,
        )
    )
    version_dir = f"{REPO_DIR}/{SERVED_MODEL}/1"
    return "\n".join([
        "set -euo pipefail",
        f"mkdir -p {version_dir}",
        f"cp {LLMAPI_MODEL_DIR}/*.py {version_dir}/",
        f"cp {REPO_CONFIG_DIR}/model.yaml {version_dir}/model.yaml",
        f"cp {REPO_CONFIG_DIR}/config.pbtxt {REPO_DIR}/{SERVED_MODEL}/config.pbtxt",
        "trap 'pkill -TERM -x mpirun || true; pkill -TERM -x tritonserver || true' TERM INT",
        launch,
        "# the launcher starts mpirun in the background and returns: stay while Triton runs",
        "sleep 10",
        "while pgrep -x tritonserver > /dev/null; do sleep 5; done",
        'echo "tritonserver exited" >&2',
        "exit 1",
    ])  # fmt: skip


def _simserver_command(obj: InferenceDeployment, config: TrialConfig) -> list[str]:
    s = obj.spec
    cmd = [
        "infertune", "simserver", "--port", str(GRPC_PORT), "--http-port", str(HTTP_PORT),
        "--model", s.model.name, "--gpu", s.gpu.product, "--tp", str(config.tp),
        "--max-batch", str(config.max_batch_size), "--quant", config.quantization,
        "--kv-dtype", config.kv_cache_dtype, "--served-model", SERVED_MODEL,
    ]  # fmt: skip
    if s.model.architecture is not None:
        arch = s.model.architecture.model_dump(exclude_none=True)
        cmd += ["--architecture", json.dumps(arch, sort_keys=True)]
    return cmd


def _model_storage(
    uri: str, settings: Settings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts, env) for the weights: the PVC of a pvc:// URI read-only at /models, else
    a cache at /models (the operator's model-storage PVC, or an emptyDir) with HF_HOME in it."""
    pvc = split_pvc(uri)
    if pvc is not None:
        volume = {
            "name": "models",
            "persistentVolumeClaim": {"claimName": pvc[0], "readOnly": True},
        }
        mount = {"name": "models", "mountPath": MODELS_ROOT, "readOnly": True}
        return [volume], [mount], []
    if settings.model_storage_pvc:
        volume = {
            "name": "models",
            "persistentVolumeClaim": {"claimName": settings.model_storage_pvc},
        }
    else:
        volume = {"name": "models", "emptyDir": {}}
    mount = {"name": "models", "mountPath": MODELS_ROOT}
    env = [{"name": "HF_HOME", "value": f"{MODELS_ROOT}/hf-cache"}]
    return [volume], [mount], env


def gpu_placement(obj: InferenceDeployment) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(nodeSelector, tolerations) of a pod on the spec's GPU pool: the GPU product's nodes plus
    the user's selector; the user's tolerations plus the usual nvidia.com/gpu taint's. The
    serving Deployment and the operator's tuner Job both use it."""
    gpu = get_gpu(obj.spec.gpu.product)
    selector = {GPU_PRODUCT_LABEL: gpu.product_labels[0], **(obj.spec.gpu.node_selector or {})}
    tolerations: list[dict[str, Any]] = [t.wire() for t in obj.spec.gpu.tolerations or []]
    gpu_taint: dict[str, Any] = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    if gpu_taint not in tolerations:
        tolerations.append(gpu_taint)
    return selector, tolerations


def render_serving(
    obj: InferenceDeployment,
    config: TrialConfig,
    settings: Settings,
    *,
    simulated: bool | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, Deployment and Service serving ``config``.

    Args:
        obj: The InferenceDeployment.
        config: The configuration to serve.
        settings: Images, model storage, and the default backend.
        simulated: Whether the resolved backend is ``simulated`` (the simulated server on the
            operator image, no GPU). None resolves it as the operator does:
            ``settings.backend_for(obj)`` (spec.tuning.backend, else the operator's default).

    Returns:
        The objects in apply order. Raises InputError when the configuration cannot be served
        (unknown GPU; a quantization without a pre-quantized checkpoint on real GPUs).
    """
    name = obj.metadata.name
    spec = obj.spec
    if simulated is None:
        simulated = settings.simulated(obj)
    get_gpu(spec.gpu.product)  # an unknown GPU is an InputError, simulated or not
    if simulated and spec.model.architecture is None:
        get_model(spec.model.name)  # the simulated server must know the model's shape
    try:
        uri = weights_uri(obj, config)
    except MissingCheckpoint as exc:
        if not simulated:
            raise InputError(f"cannot serve {config.label()}: {exc}") from None
        base = spec.model.source.uri if spec.model.source is not None else None
        uri = base or default_model_id(spec.model.name)

    files = model_repo_files(obj, config, uri)
    repo_hash = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(obj, model_repo_configmap_name(name)),
        "data": files,
    }

    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {
            "medium": "Memory", "sizeLimit": SHM_LIMIT_SIMULATED if simulated else SHM_LIMIT_GPU,
        }},
        {"name": "model-repo-config", "configMap": {"name": model_repo_configmap_name(name)}},
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-repo-config", "mountPath": REPO_CONFIG_DIR, "readOnly": True},
    ]
    env: list[dict[str, Any]] = []
    container: dict[str, Any]
    pod: dict[str, Any] = {}
    if simulated:
        container = {
            "name": "simserver",
            "image": settings.operator_image,
            "command": _simserver_command(obj, config),
            "ports": _ports(),
            "resources": _resources(obj, SIM_RESOURCES, 0),
        }
    else:
        v, m, e = _model_storage(uri, settings)
        volumes += [*v, {"name": "model-repo", "emptyDir": {}}]
        mounts += [*m, {"name": "model-repo", "mountPath": REPO_DIR}]
        env += e
        container = {
            "name": "triton",
            "image": spec.serving.image or settings.triton_image,
            "command": ["/bin/bash", "-c", _start_script(config.tp)],
            "ports": _ports(),
            "resources": _resources(obj, {}, config.tp),
        }
        pod["nodeSelector"], pod["tolerations"] = gpu_placement(obj)
    if env:
        container["env"] = env
    container["volumeMounts"] = mounts
    container["startupProbe"] = _probe("/v2/health/ready", 10, STARTUP_FAILURES)
    container["readinessProbe"] = _probe("/v2/health/ready", 10, 3)
    container["livenessProbe"] = _probe("/v2/health/live", 15, 4)

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
