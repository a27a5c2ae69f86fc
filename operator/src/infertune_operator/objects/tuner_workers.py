"""Parallel tuning on Kubernetes (pure): one Indexed Job whose pods are workers of one study.

With ``spec.tuning.parallelism: N`` the tuner Job runs N pods (``completionMode: Indexed``,
``parallelism`` = ``completions`` = N). Every pod runs ``infertune tune-job`` on the same
request and joins the same Optuna study on the shared RDB storage: they claim configurations
one at a time under the study's lock, a dead pod's trial is re-run by another after the
heartbeat's grace period, and the last worker to finish writes the report ConfigMap (the others
exit without one). The Job succeeds when every worker has.

Each pod holds the GPUs of the largest TP the space may run (``tuner_gpus``) and packs smaller
trials into them (``INFERTUNE_WORKER_GPUS``, see ``infertune_tuner.packing``).

The storage URL reaches the pods through the environment only (``INFERTUNE_TUNER_STORAGE``):
from the Secret ``spec.tuning.storageSecretRef`` names, from ``spec.tuning.storage``, or from
the operator's default (a Secret of the name the chart's ``tuner.storage.existingSecret`` gives,
in the InferenceDeployment's namespace; or the chart's plain ``tuner.storage.url``). It is never
written into the request ConfigMap, the status, the report or a log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.settings import Settings
from infertune_tuner.env import positive_int
from infertune_tuner.request import TuningRequest

Body = dict[str, Any]
STORAGE_ENV = "INFERTUNE_TUNER_STORAGE"
WORKER_GPUS_ENV = "INFERTUNE_WORKER_GPUS"
POOL_ENV = "INFERTUNE_POOL"  # the one GPU pool a pool's tuner Job measures on


def storage_env(obj: InferenceDeployment, settings: Settings) -> Body | None:
    """The environment entry that gives a tuner pod its study storage (None: the journal)."""
    tuning = obj.spec.tuning
    if tuning.storage_secret_ref is not None:
        ref = tuning.storage_secret_ref
        return {
            "name": STORAGE_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    if tuning.storage:
        return {"name": STORAGE_ENV, "value": tuning.storage}
    if settings.tuner_storage_secret:
        ref_body = {"name": settings.tuner_storage_secret, "key": settings.tuner_storage_secret_key}
        return {"name": STORAGE_ENV, "valueFrom": {"secretKeyRef": ref_body}}
    if settings.tuner_storage:
        return {"name": STORAGE_ENV, "value": settings.tuner_storage}
    return None


def pool_jobs(obj: InferenceDeployment, settings: Settings) -> bool:
    """Whether this spec tunes with a Job per GPU pool: several pools measured on real GPUs
    (each pool's trials run on its own nodes). A simulated tuning simulates every pool in one
    Job."""
    return len(obj.spec.gpu.products) > 1 and not settings.simulated(obj)


def parallel_problem(obj: InferenceDeployment, settings: Settings) -> str | None:
    """Why this spec cannot tune in parallel (None when it can, or does not ask to): several
    workers (spec.tuning.parallelism, or a tuner Job per GPU pool) share one study, which
    lives in a database."""
    if storage_env(obj, settings) is not None:
        return None
    fix = (
        "set spec.tuning.storageSecretRef (a Secret holding a postgresql:// URL) or "
        "spec.tuning.storage, or give the operator a default storage (Helm value tuner.storage)"
    )
    n = obj.spec.tuning.parallelism
    if n > 1:
        return (
            f"spec.tuning.parallelism: {n} workers must share one study in a database, and none "
            f"is configured: {fix}, or set parallelism to 1"
        )
    if pool_jobs(obj, settings):
        return (
            f"spec.gpu.pools: {len(obj.spec.gpu.products)} pools tune as one study, a tuner Job "
            f"on each pool's nodes, and the study lives in a database: none is configured: {fix}"
        )
    return None


def make_indexed(job_spec: Body, workers: int, backoff_limit: int) -> None:
    """Turn a tuner Job's spec into `workers` indexed worker pods (nothing for one worker)."""
    if workers <= 1:
        return
    job_spec.update(
        completionMode="Indexed",
        completions=workers,
        parallelism=workers,
        # Each worker may be retried as often as a lone tuner pod would be.
        backoffLimit=backoff_limit * workers,
    )


def worker_request(
    request: TuningRequest, env: Mapping[str, str]
) -> tuple[TuningRequest, int | None]:
    """The request as one worker pod runs it, and the GPUs it packs trials into.

    Args:
        request: The request from the ConfigMap (no storage URL in it).
        env: The pod's environment (the storage URL, the worker's GPU count).

    Returns:
        The request with the storage URL from the environment and one worker per pod (the
        other workers are the other pods; GPU packing adds threads inside the pod), and the
        worker's GPU count (None: not given).
    """
    tuning: dict[str, object] = {}
    if url := env.get(STORAGE_ENV, "").strip():
        tuning.update(storage=url, parallelism=1)
    gpus = positive_int(env, WORKER_GPUS_ENV, "GPUs")
    if tuning:
        request = request.model_copy(update={"tuning": request.tuning.model_copy(update=tuning)})
    return request, gpus
