"""The operator's vocabulary on the cluster: label and annotation keys, object names, ports,
owner references, and the stamp every object the operator applies carries (pure).

Every other module spells these through here: the tuner Job, the report ConfigMap, the serving
Deployment/Service and the Kopf watches agree because there is one spelling.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from infertune_operator.api.types import API_VERSION, GROUP, KIND
from infertune_tuner.runtime import Ports

Body = dict[str, Any]  # a Kubernetes object as `kubectl get -o json` shows it

DOMAIN = GROUP  # "infertune.io": the prefix of our labels, annotations and finalizer
MANAGER = "infertune"

LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"  # on everything we create: the owner's name
LABEL_HASH = f"{DOMAIN}/tuning-hash"
LABEL_POOL = f"{DOMAIN}/gpu-pool"  # on a pool's tuner Job: the product it measures
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
ANNOTATION_HASH = f"{DOMAIN}/tuning-hash"
ANNOTATION_RENDER_HASH = f"{DOMAIN}/render-hash"
ANNOTATION_CONFIG = f"{DOMAIN}/config"
ANNOTATION_REPO_HASH = f"{DOMAIN}/model-repo-hash"
ANNOTATION_DEADLINE = f"{DOMAIN}/deadline"  # on tuner Jobs: how activeDeadlineSeconds was derived
ANNOTATION_REPORT_TRIALS = f"{DOMAIN}/report-trials"  # on reports: trials of the full report
ANNOTATION_REPORT_SUMMARY = f"{DOMAIN}/report-summary"  # "true": only the report's summary fits
# On verification Jobs and results: the deployed configuration verified (verification.py).
ANNOTATION_VERIFICATION_HASH = f"{DOMAIN}/verification-hash"
# On retune Jobs, requests and reports: the tuning retuned and the observed workload (retune.py).
ANNOTATION_RETUNE_HASH = f"{DOMAIN}/retune-hash"
# On reports: the uid of the tuner Job whose pod wrote it (a tuner Job deleted by hand and created
# again can leave two Jobs of one tuning; the report says which one answered).
ANNOTATION_TUNER_JOB = f"{DOMAIN}/tuner-job-uid"
# The tuner pod's own Job uid, from the label the Job controller puts on its pods (Kubernetes
# 1.27+; the downward API gives "" where it is missing, and nothing is claimed then).
TUNER_JOB_UID_ENV = "INFERTUNE_TUNER_JOB_UID"
JOB_UID_POD_LABEL = "batch.kubernetes.io/controller-uid"
FINALIZER = f"{DOMAIN}/finalizer"

# Values of LABEL_COMPONENT.
COMPONENT_TUNER = "tuner"
COMPONENT_REQUEST = "tuning-request"
COMPONENT_REPORT = "tuning-report"  # also a retune's report (<name>-retune-report)
COMPONENT_VERIFICATION = "verification"  # the verification Job
COMPONENT_VERIFICATION_RESULT = "verification-result"  # the ConfigMap it writes
COMPONENT_RETUNE = "retune"  # a retune's Job and request
SERVING_APP = "infertune-serving"  # LABEL_NAME of the serving pods

# Triton's ports (and the simulated server's, which keeps them): the serving runtime's.
_PORTS = Ports()
HTTP_PORT, GRPC_PORT, METRICS_PORT = _PORTS.http, _PORTS.grpc, _PORTS.metrics
PORTS = _PORTS.named()

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


# ------------------------------------------------------------------ names


def job_name(name: str, tuning_hash: str) -> str:
    """``<name>-tune-<hash8>``: at most 48 + 14 = 62 characters (names are capped at 48)."""
    return f"{name}-tune-{tuning_hash}"


def pool_job_name(name: str, tuning_hash: str, index: int) -> str:
    """The tuner Job of the ``index``-th pool of ``spec.gpu.pools`` (at most 8 pools):
    ``<name>-tune<i>-<hash8>``, at most 48 + 15 = 63 characters, the job-name label's limit."""
    return f"{name}-tune{index}-{tuning_hash}"


def request_configmap_name(name: str, tuning_hash: str) -> str:
    return f"{job_name(name, tuning_hash)}-request"


def report_configmap_name(name: str) -> str:
    return f"{name}-tuning-report"


# Hashes in the names of verification and retune Jobs: 7 hex digits, so that
# <name>-verify-<hash> and <name>-retune-<hash> stay within the 63 characters of the job-name
# label the Job controller puts on its pods (names are capped at 48).
SHORT_HASH = 7


def verification_job_name(name: str, verification_hash: str) -> str:
    return f"{name}-verify-{verification_hash[:SHORT_HASH]}"


def verification_configmap_name(name: str) -> str:
    """Where the verification Job writes its result (one per InferenceDeployment)."""
    return f"{name}-verification"


def retune_job_name(name: str, retune_hash: str) -> str:
    return f"{name}-retune-{retune_hash[:SHORT_HASH]}"


def retune_request_name(name: str, retune_hash: str) -> str:
    return f"{retune_job_name(name, retune_hash)}-request"


def retune_report_name(name: str) -> str:
    """Where a retune's tuner writes its report (the tuning's own report stays as it is)."""
    return f"{name}-retune-report"


def model_repo_configmap_name(name: str) -> str:
    return f"{name}-model-repo"


def endpoint(name: str, namespace: str) -> str:
    """The serving Service's gRPC address inside the cluster."""
    return f"{name}.{namespace}.svc:{GRPC_PORT}"


# ------------------------------------------------------------------ labels and ownership


def common_labels(name: str, component: str) -> dict[str, str]:
    """The labels of a tuning object (request, Job, report) of InferenceDeployment ``name``."""
    return {
        LABEL_DEPLOYMENT: name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_PART_OF: MANAGER,
    }


def serving_selector(name: str) -> dict[str, str]:
    """What the serving Deployment and Service select."""
    return {LABEL_NAME: SERVING_APP, LABEL_INSTANCE: name}


def serving_labels(name: str) -> dict[str, str]:
    return {**serving_selector(name), LABEL_MANAGED_BY: MANAGER, LABEL_DEPLOYMENT: name}


def owner_reference(body: Mapping[str, Any], *, block: bool = True) -> Body:
    """The controller reference to an InferenceDeployment (its objects go when it goes)."""
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


def owner_uid(obj: Mapping[str, Any] | None) -> str | None:
    """The uid of the InferenceDeployment that owns ``obj`` (None: no InferenceDeployment does).

    Names are reused: an InferenceDeployment deleted and created again under the same name is
    another object (another uid), and what the first one left behind until the garbage collector
    removes it is not the second one's.
    """
    for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return str(ref.get("uid") or "") or None
    return None


def render_hash(obj: Mapping[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def owned(desired: Mapping[str, Any], owner: Mapping[str, Any]) -> Body:
    """A rendered object plus namespace, our labels, the owner reference and its render hash.

    Args:
        desired: What ``render`` produced (not modified).
        owner: The InferenceDeployment (its name, namespace and uid are used).

    Returns:
        A deep copy ready to apply, annotated with the hash of everything else in it, so that
        :func:`needs_apply` can tell an unchanged object without comparing it field by field.
    """
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
    """Apply when absent or when what we rendered last time differs (by its render hash).

    Args:
        live: The object on the cluster, None when absent.
        desired: An object from :func:`owned`.

    Returns:
        False only when the live object carries the desired render hash.
    """
    if live is None:
        return True
    have = (live.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RENDER_HASH)
    want = desired["metadata"]["annotations"][ANNOTATION_RENDER_HASH]
    return bool(have != want)
