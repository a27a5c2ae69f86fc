"""Parallel tuning on Kubernetes: an Indexed Job of workers on one shared study, the storage URL
from a Secret (never in the request ConfigMap), each worker packing trials into its GPU set."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.objects import tuner_job, tuner_workers
from infertune_operator.policy import tuner_outcome
from infertune_operator.settings import Settings
from infertune_tuner.errors import InputError
from infertune_tuner.request import TuningRequest

from .test_tuner_job_pod import SETTINGS, TH, body

URL = "postgresql://tuner:s3cret@optuna-db.db:5432/optuna"
SECRET = {"name": "optuna-db", "key": "dsn"}


def parallel(backend: str = "triton", workers: int = 3, **tuning: Any) -> dict[str, Any]:
    b = body(backend)
    b["spec"]["tuning"].update({"parallelism": workers, **tuning})
    return b


def render(
    b: dict[str, Any], settings: Settings = SETTINGS
) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = InferenceDeployment.model_validate(b)
    return (tuner_job.request_configmap(obj, b, TH, settings),
            tuner_job.tuner_job(obj, b, TH, settings))  # fmt: skip


def env_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("backend", ["triton", "simulated"])
def test_workers_are_an_indexed_job_sharing_the_secret_storage(
    strictly_valid: Any, backend: str
) -> None:
    b = parallel(backend, storageSecretRef=SECRET)
    cm, job = render(b)
    strictly_valid([cm, job])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["parallelism"] == spec["completions"] == 3
    assert spec["backoffLimit"] == 3 * SETTINGS.job_backoff_limit
    storage = env_of(job)["INFERTUNE_TUNER_STORAGE"]
    assert storage == {"name": "INFERTUNE_TUNER_STORAGE",
                       "valueFrom": {"secretKeyRef": SECRET}}  # fmt: skip
    request = json.loads(cm["data"]["request.json"])
    assert request["tuning"]["storage"] is None and request["tuning"]["parallelism"] == 3


def test_each_worker_holds_the_gpus_of_the_largest_tp_and_packs_trials_into_them(
    strictly_valid: Any,
) -> None:
    cm, job = render(parallel(storageSecretRef=SECRET))
    strictly_valid([job])
    container = job["spec"]["template"]["spec"]["containers"][0]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == 8  # the space's largest TP within maxGpusPerReplica
    assert env_of(job)["INFERTUNE_WORKER_GPUS"]["value"] == "8"
    # The worker pod reads both back: the URL and its GPU set; one worker thread per pod.
    request = TuningRequest.model_validate_json(cm["data"]["request.json"])
    env = {"INFERTUNE_TUNER_STORAGE": URL, "INFERTUNE_WORKER_GPUS": "8"}
    worker, worker_gpus = tuner_workers.worker_request(request, env)
    assert worker.tuning.storage == URL and worker.tuning.parallelism == 1 and worker_gpus == 8


def test_the_operators_default_storage_secret_serves_every_deployment(strictly_valid: Any) -> None:
    settings = Settings(tuner_image="tuner:1", tuner_storage_secret="optuna-db",
                        tuner_storage_secret_key="dsn")  # fmt: skip
    obj = InferenceDeployment.model_validate(parallel())
    assert tuner_workers.parallel_problem(obj, settings) is None
    cm, job = render(parallel(), settings)
    strictly_valid([cm, job])
    assert env_of(job)["INFERTUNE_TUNER_STORAGE"]["valueFrom"] == {"secretKeyRef": SECRET}


def test_a_plain_url_never_lands_in_the_request_configmap() -> None:
    cm, job = render(parallel(storage=URL))
    assert URL not in json.dumps(cm) and "s3cret" not in json.dumps(cm)
    assert env_of(job)["INFERTUNE_TUNER_STORAGE"]["value"] == URL  # the user put it in the spec


def test_parallel_workers_without_a_storage_are_refused_with_the_reason() -> None:
    obj = InferenceDeployment.model_validate(parallel(workers=4))
    problem = tuner_workers.parallel_problem(obj, SETTINGS)
    assert problem is not None
    assert "parallelism: 4" in problem and "storageSecretRef" in problem
    one = InferenceDeployment.model_validate(parallel(workers=1))
    assert tuner_workers.parallel_problem(one, SETTINGS) is None
    _, job = render(parallel(workers=1))
    assert "completionMode" not in job["spec"] and "INFERTUNE_TUNER_STORAGE" not in env_of(job)


def test_storage_and_its_secret_are_exclusive() -> None:
    with pytest.raises(ValueError, match="storage or storageSecretRef"):
        InferenceDeployment.model_validate(parallel(storage=URL, storageSecretRef=SECRET))


def test_bad_worker_gpu_counts_are_input_errors() -> None:
    request = TuningRequest.model_validate_json(
        render(parallel(storage=URL))[0]["data"]["request.json"]
    )
    for raw in ("eight", "0"):
        with pytest.raises(InputError, match="INFERTUNE_WORKER_GPUS"):
            tuner_workers.worker_request(request, {"INFERTUNE_WORKER_GPUS": raw})


def test_an_indexed_job_succeeds_when_every_worker_has() -> None:
    job = {"spec": {"completions": 3, "completionMode": "Indexed"},
           "status": {"succeeded": 1, "active": 2, "ready": 2}}  # fmt: skip
    assert tuner_outcome.job_outcome(job).state == "running"  # the last workers still run
    job["status"] = {"succeeded": 3}
    assert tuner_outcome.job_outcome(job).state == "succeeded"
