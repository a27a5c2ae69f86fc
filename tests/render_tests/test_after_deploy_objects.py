"""The objects of the loop after deploy (verification Job, its result, a retune's request and
Job) pass strict Kubernetes validation, fit Kubernetes' name limits, and say what they do."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infertune_operator.api.types import BestMetrics, InferenceDeployment
from infertune_operator.policy import retune, verification
from infertune_tuner.config import TrialConfig

from .test_tuner_job_pod import SETTINGS, TH, body

LONGEST = "a" * 48  # names are capped at 48 characters


def _ref(obj: InferenceDeployment) -> verification.Reference:
    tuned = BestMetrics(output_tokens_per_second_per_gpu=1200.0, e2e_p95_ms=20000.0)
    return verification.Reference(TrialConfig(4, 64, "fp8", "auto"), 1024, 512, tuned, "tuning")


@pytest.mark.parametrize("backend", ["triton", "simulated"])
def test_the_verification_job_and_its_result(strictly_valid: Any, backend: str) -> None:
    b = body(backend)
    b["metadata"]["name"] = LONGEST
    obj = InferenceDeployment.model_validate(b)
    ref = _ref(obj)
    vhash = verification.verification_hash(obj, ref, SETTINGS)
    job = verification.verification_job(obj, b, ref, vhash, TH, SETTINGS)
    result = verification.VerificationResult(hash=vhash, config=ref.config.label(), problem="x")
    cm = verification.result_configmap(name=LONGEST, namespace="ml", uid="0000-uid", result=result)
    strictly_valid([job, cm])
    assert len(job["metadata"]["name"]) <= 63  # the job-name label on its pods
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SETTINGS.tuner_service_account
    assert "nvidia.com/gpu" not in json.dumps(pod)  # the load generator needs no GPU
    image = pod["containers"][0]["image"]
    assert image == (SETTINGS.tuner_image if backend == "triton" else SETTINGS.operator_image)
    argv = pod["containers"][0]["command"]  # the per-GPU divisor travels as a number
    assert argv[argv.index("--tp") + 1] == "4"
    assert argv[argv.index("--config") + 1] == "tp4/bs64/fp8/kv-auto"  # a label, never parsed
    assert verification.read_result(cm, vhash, "0000-uid") == result
    assert verification.read_result(cm, vhash, "another-uid") is None  # an earlier object's
    assert verification.read_result(cm, "0000000", "0000-uid") is None  # another rollout's


def test_the_verification_hash_follows_the_deployed_configuration_not_the_replicas() -> None:
    b = body()
    obj = InferenceDeployment.model_validate(b)
    ref = _ref(obj)
    first = verification.verification_hash(obj, ref, SETTINGS)
    scaled = InferenceDeployment.model_validate(body(serving={"replicas": 4}))
    assert verification.verification_hash(scaled, ref, SETTINGS) == first
    image = InferenceDeployment.model_validate(body(serving={"image": "registry.example/t:2"}))
    assert verification.verification_hash(image, ref, SETTINGS) != first
    other = verification.Reference(TrialConfig(8, 64, "fp8", "auto"), 1024, 512, ref.tuned, "x")
    assert verification.verification_hash(obj, other, SETTINGS) != first


@pytest.mark.parametrize("backend", ["triton", "simulated"])
def test_a_retunes_request_and_job(strictly_valid: Any, backend: str) -> None:
    b = body(backend)
    b["metadata"]["name"] = LONGEST
    obj = InferenceDeployment.model_validate(b)
    w = retune.Workload(4100, 130)
    cm, job = retune.retune_objects(obj, b, TH, w, SETTINGS)
    strictly_valid([cm, job])
    assert len(job["metadata"]["name"]) <= 63
    request = json.loads(cm["data"]["request.json"])
    assert request["workload"] == {"input_tokens": 4100, "output_tokens": 130,
                                   "input_tokens_stddev": None, "output_tokens_stddev": None}  # fmt: skip
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--report-configmap") + 1] == f"{LONGEST}-retune-report"
    assert argv[argv.index("--retune-hash") + 1] == retune.retune_hash(TH, w)
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": cm["metadata"]["name"]} in [v.get("configMap") for v in volumes]
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "retune"
