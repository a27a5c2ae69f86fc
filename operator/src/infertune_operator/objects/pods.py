"""Pod pieces the serving Deployment and the tuner Job share (pure: plain dicts).

Both run the same server (the serving runtime's `PodShape`), so they get the same placement on
the GPU pool, the same model storage and token, the same security context and the same
resource requests; only the tuner adds its load generator and study on top.

Decisions, in one place:

- **Placement**: required node affinity `nvidia.com/gpu.product In [every label of the GPU]`
  (GPU feature discovery labels one product several ways: GH200 480GB and 96GB HBM3, T4 as
  Tesla-T4 and NVIDIA-T4), the user's `gpu.nodeSelector` as a node selector, their tolerations
  plus the usual `nvidia.com/gpu` taint's. A user who selects the product label themselves
  gets no affinity (their selector decides).
- **Model storage**: `pvc://` weights mount their claim read-only at /models (every pvc:// URI
  of one InferenceDeployment names the same claim, validated by the API); downloaded weights
  (hf://, Hugging Face ids) go into a cache at /model-cache with `HF_HOME` on it: the
  operator's model-storage PVC when configured (`modelStorage.pvc`; ReadWriteMany when a
  deployment has several replicas or a tuner Job runs beside the serving pods), else an
  emptyDir with a `sizeLimit` and a matching `ephemeral-storage` request, sized for the weights.
- **Token**: `spec.model.source.tokenSecretRef` becomes `HF_TOKEN` from a `secretKeyRef`; the
  value never passes through the operator.
- **Security**: `seccompProfile: RuntimeDefault` on every pod and `allowPrivilegeEscalation:
  false` on every container. The simulated server (operator image) runs as the numeric non-root
  user 10001 with every capability dropped and a read-only root filesystem. Triton (and the
  tuner image built on it) runs as root: the NGC image is built and tested that way (its launcher
  passes mpirun `--allow-run-as-root`; TensorRT-LLM writes kernel caches under the home
  directory), so `runAsNonRoot` is not set there and capabilities are the runtime's defaults.
- **Resources**: CPU and memory requests always (a GPU pod is never BestEffort); the user's
  `spec.serving.resources` on top; `nvidia.com/gpu` forced to the GPUs the configuration uses.
  Every quantity is written as a string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.naming import GPU_PRODUCT_LABEL, GPU_RESOURCE, Body
from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.runtime import PodShape
from infertune_tuner.runtime.weights import (
    CACHE_ROOT,
    HF_HOME,
    MODELS_ROOT,
    pvc_claims,
    uses_model_cache,
)

HF_TOKEN_ENV = "HF_TOKEN"
NON_ROOT_UID = 10001  # the operator image's user (Dockerfile)


def gpu_placement(obj: InferenceDeployment, product: str | None = None) -> Body:
    """nodeSelector (the user's), affinity (the GPU product) and tolerations of a GPU pod on
    the pool of `product` (None: the spec's one pool, or its first)."""
    pool = obj.spec.gpu.pool(product)
    gpu = get_gpu(pool.product)
    selector = dict(pool.node_selector or {})
    tolerations: list[Body] = [t.wire() for t in pool.tolerations or []]
    gpu_taint: Body = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    if gpu_taint not in tolerations:
        tolerations.append(gpu_taint)
    out: Body = {}
    if selector:
        out["nodeSelector"] = selector
    if GPU_PRODUCT_LABEL not in selector:
        term = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(gpu.product_labels)}
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    out["tolerations"] = tolerations
    return out


def token_env(obj: InferenceDeployment) -> list[Body]:
    """HF_TOKEN from the Secret the spec names (nothing when it names none)."""
    source = obj.spec.model.source
    ref = source.token_secret_ref if source is not None else None
    if ref is None:
        return []
    return [{
        "name": HF_TOKEN_ENV,
        "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
    }]  # fmt: skip


def model_storage(
    uris: Iterable[str], cache_claim: str | None, cache_gib: int
) -> tuple[list[Body], list[Body], list[Body], int]:
    """(volumes, mounts, env, ephemeral GiB) for weights at these URIs (see the module docstring):
    downloads go to `cache_claim` (a PVC) when given, else to an emptyDir of `cache_gib`. The
    ephemeral GiB is what an emptyDir cache may hold (0 without one)."""
    uris = list(uris)
    volumes: list[Body] = []
    mounts: list[Body] = []
    env: list[Body] = []
    ephemeral = 0
    for claim in pvc_claims(uris)[:1]:
        volumes.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": MODELS_ROOT, "readOnly": True})
    if uses_model_cache(uris):
        if cache_claim:
            cache: Body = {"persistentVolumeClaim": {"claimName": cache_claim}}
        else:
            cache = {"emptyDir": {"sizeLimit": f"{cache_gib}Gi"}}
            ephemeral = cache_gib
        volumes.append({"name": "model-cache", **cache})
        mounts.append({"name": "model-cache", "mountPath": CACHE_ROOT})
        env.append({"name": "HF_HOME", "value": HF_HOME})
    return volumes, mounts, env, ephemeral


def shm_volume(size: str) -> tuple[Body, Body]:
    """A memory-backed /dev/shm of `size` (the container default, 64 MiB, is far too small for
    Triton's Python backend and NCCL)."""
    return (
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}},
        {"name": "dshm", "mountPath": "/dev/shm"},
    )


def security(runs_as_root: bool) -> tuple[Body, Body]:
    """(pod securityContext, container securityContext) for an image that runs as root (Triton,
    the tuner image) or as the operator image's non-root user."""
    pod: Body = {"seccompProfile": {"type": "RuntimeDefault"}}
    container: Body = {"allowPrivilegeEscalation": False}
    if not runs_as_root:
        pod.update(runAsNonRoot=True, runAsUser=NON_ROOT_UID, runAsGroup=NON_ROOT_UID)
        container.update(capabilities={"drop": ["ALL"]}, readOnlyRootFilesystem=True)
    return pod, container


def cpu_quantity(millis: int) -> str:
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def resources(
    shape: PodShape,
    overrides: Mapping[str, Mapping[str, Any] | None] | None = None,
    *,
    extra_cpu_m: int = 0,
    extra_memory_mi: int = 0,
    ephemeral_gib: int = 0,
) -> Body:
    """Requests (CPU, memory, ephemeral storage for an emptyDir cache) and limits of a
    container: the shape's, plus `extra_*`, the user's overrides on top, the GPUs forced."""
    requests: Body = {
        "cpu": cpu_quantity(shape.cpu_m + extra_cpu_m),
        "memory": memory_quantity(shape.memory_mi + extra_memory_mi),
    }
    limits: Body = {}
    if shape.memory_limit_mi:
        limits["memory"] = memory_quantity(shape.memory_limit_mi + extra_memory_mi)
    if ephemeral_gib:
        requests["ephemeral-storage"] = f"{ephemeral_gib + 1}Gi"  # + logs and scratch
    for kind, part in (("requests", requests), ("limits", limits)):
        # Quantities as strings: the API takes 2 or "2", the client's models only strings.
        part.update({k: str(v) for k, v in ((overrides or {}).get(kind) or {}).items()})
        part.pop(GPU_RESOURCE, None)
        if shape.gpus:
            part[GPU_RESOURCE] = str(shape.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
