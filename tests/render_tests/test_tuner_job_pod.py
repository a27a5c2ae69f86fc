"""The tuner Job's pod runs the same server its winner will be served with (`pods`), plus the
load generator: strict Kubernetes objects, the same placement, storage, token and security as
the serving Deployment, and requests that cover both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.objects import tuner_job
from infertune_operator.objects.serving import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest

SETTINGS = Settings(operator_image="op:1", tuner_image="tuner:1", default_backend="triton")
TH = "abcd1234"


def body(backend: str = "triton", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {
            "name": "llama-2-70b",
            "source": {"uri": "hf://meta-llama/Llama-2-70b-chat-hf",
                       "tokenSecretRef": {"name": "hf-token", "key": "token"}},
            "checkpoints": {"fp8": "hf://nvidia/Llama-2-70b-chat-hf-FP8"},
        },
        "gpu": {"product": "H100-SXM-80GB", "maxGpusPerReplica": 8,
                "nodeSelector": {"pool": "llm"}},
        "workload": {"inputTokens": 1024, "outputTokens": 512},
        "slo": {"e2eLatencyMs": {"p95": 25600}},
        "search": {"tensorParallel": [2, 4, 8], "maxBatchSize": [16, 64],
                   "quantization": ["bf16", "fp8"]},
        "tuning": {"backend": backend, "maxTrials": 10},
        "serving": {"startupTimeoutMinutes": 90},
    }  # fmt: skip
    base.update(spec)
    return {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "0000-uid"}, "spec": base,
    }  # fmt: skip


def objects(b: dict[str, Any]) -> list[dict[str, Any]]:
    obj = InferenceDeployment.model_validate(b)
    return [
        tuner_job.request_configmap(obj, b, TH, SETTINGS),
        tuner_job.tuner_job(obj, b, TH, SETTINGS),
        tuner_job.tuner_service_account("ml", SETTINGS),
        tuner_job.tuner_role_binding("ml", SETTINGS),
    ]


def pod(b: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = objects(b)[1]["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("backend", ["triton", "simulated"])
def test_the_tuner_jobs_objects_pass_strict_kubernetes_validation(
    strictly_valid: Any, backend: str
) -> None:
    strictly_valid(objects(body(backend)))


def test_the_gpu_tuner_pod_is_the_serving_pod_plus_the_load_generator() -> None:
    b = body()
    p = pod(b)
    (c,) = p["containers"]
    served = render_serving(
        InferenceDeployment.model_validate(b), TrialConfig(8, 64, "bf16", "auto"), SETTINGS
    )
    serving = next(o for o in served if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    (s,) = serving["containers"]
    for key in ("nodeSelector", "affinity", "tolerations", "securityContext"):
        assert p[key] == serving[key], key
    assert c["securityContext"] == s["securityContext"]
    # the largest TP's server (8 GPUs: 18 cores, 144 GiB) and one core, 2 GiB for the client
    assert (
        s["resources"]["requests"]["cpu"] == "18"
        and s["resources"]["requests"]["memory"] == "144Gi"
    )
    assert c["resources"]["requests"]["cpu"] == "19"
    assert c["resources"]["requests"]["memory"] == "146Gi"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    volumes = {v["name"]: v for v in p["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    assert mounts["/dev/shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    # the cache holds what the trials download: the bf16 model and the fp8 checkpoint
    serving_cache = int(
        {v["name"]: v for v in serving["volumes"]}["model-cache"]["emptyDir"]["sizeLimit"][:-2]
    )
    tuner_cache = int(mounts["/model-cache"]["emptyDir"]["sizeLimit"][:-2])
    assert tuner_cache > serving_cache * 1.4
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["HF_HOME"]["value"] == "/model-cache/huggingface"
    # trial servers inherit the tuner's environment: no mpirun CPU binding there either
    assert env["OMPI_MCA_hwloc_base_binding_policy"]["value"] == "none"
    assert env["PRTE_MCA_hwloc_default_binding_policy"]["value"] == "none"


def test_pvc_weights_are_mounted_read_only_in_the_tuner_too() -> None:
    model = {"name": "llama-2-70b", "source": {"uri": "pvc://store/llama"},
             "checkpoints": {"fp8": "pvc://store/llama-fp8"}}  # fmt: skip
    p = pod(body(model=model))
    volumes = {v["name"]: v for v in p["volumes"]}
    (c,) = p["containers"]
    mounts = {m["mountPath"]: (m, volumes[m["name"]]) for m in c["volumeMounts"]}
    mount, volume = mounts["/models"]
    assert mount["readOnly"] is True
    assert volume["persistentVolumeClaim"] == {"claimName": "store", "readOnly": True}
    assert "/model-cache" not in mounts  # nothing to download
    assert "HF_TOKEN" not in {e["name"] for e in c["env"]}  # no token was given


def test_the_token_stays_a_secret_reference() -> None:
    """The request the tuner reads (and so its reports) carries no token and no reference to
    one: HF_TOKEN reaches the tuner only as an environment variable from the Secret."""
    cm = objects(body())[0]
    text = cm["data"]["request.json"]
    assert "hf-token" not in text and "secret" not in text.lower() and "HF_TOKEN" not in text
    req = TuningRequest.model_validate_json(text)
    assert req.tuning.startup_timeout_minutes == 90  # spec.serving.startupTimeoutMinutes


def test_the_confidence_target_reaches_the_tuner() -> None:
    tuning = {"backend": "triton", "maxTrials": 10, "confidence": 0.9}
    text = objects(body(tuning=tuning))[0]["data"]["request.json"]
    assert TuningRequest.model_validate_json(text).tuning.confidence == 0.9
    unset = objects(body())[0]["data"]["request.json"]  # the tuner's default applies
    assert TuningRequest.model_validate_json(unset).tuning.confidence is None


def test_the_simulated_tuner_runs_unprivileged_with_a_writable_tmp() -> None:
    p = pod(body("simulated"))
    (c,) = p["containers"]
    assert p["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert "env" in c and not any(e["name"] == "HF_TOKEN" for e in c["env"])
    assert json.dumps(p).count("nvidia.com/gpu") == 0
