"""Contract of `render_serving`: the objects the operator applies to serve a configuration."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infertune_operator.api.models import InferenceDeployment
from infertune_operator.render import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError

SETTINGS = Settings(operator_image="infertune/operator:test", model_storage_pvc=None)
CFG = TrialConfig(2, 128, "fp8", "auto")


def manifest(**spec: Any) -> InferenceDeployment:
    base: dict[str, Any] = {
        "model": {
            "name": "llama-2-70b",
            "source": {"uri": "pvc://model-store/llama-2-70b"},
            "checkpoints": {"fp8": "pvc://model-store/llama-2-70b-fp8"},
        },
        "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"inputTokens": 1024, "outputTokens": 512},
        "slo": {"e2eLatencyMs": {"p95": 25600}},
    }
    base.update(spec)
    return InferenceDeployment.model_validate({
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "llama", "namespace": "ml"}, "spec": base,
    })  # fmt: skip


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment", "Service"]
    return {o["kind"]: o for o in objects}


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


def test_names_labels_and_no_owner_references() -> None:
    objs = render_serving(manifest(), CFG, SETTINGS)
    k = by_kind(objs)
    assert k["ConfigMap"]["metadata"]["name"] == "llama-model-repo"
    assert k["Deployment"]["metadata"]["name"] == "llama"
    assert k["Service"]["metadata"]["name"] == "llama"
    for o in objs:
        meta = o["metadata"]
        assert meta["namespace"] == "ml"
        assert "ownerReferences" not in meta
        assert meta["labels"]["app.kubernetes.io/name"] == "infertune-serving"
        assert meta["labels"]["app.kubernetes.io/instance"] == "llama"
        assert meta["labels"]["infertune.io/deployment"] == "llama"
    dep = k["Deployment"]
    assert dep["metadata"]["annotations"]["infertune.io/config"] == CFG.label()
    tmpl = dep["spec"]["template"]
    assert tmpl["metadata"]["annotations"]["infertune.io/config"] == CFG.label()
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= tmpl["metadata"]["labels"].items()
    assert k["Service"]["spec"]["selector"] == selector
    yaml.safe_dump_all(objs)  # plain data all the way down


def test_gpus_node_selector_and_tolerations() -> None:
    obj = manifest(gpu={
        "product": "H100-SXM-80GB",
        "nodeSelector": {"pool": "inference"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm",
                         "effect": "NoSchedule"}],
    })  # fmt: skip
    objs = render_serving(obj, CFG, SETTINGS)
    c = container(objs)
    assert c["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2  # = TP
    pod = by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "pool": "inference",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_probes_ports_and_service() -> None:
    objs = render_serving(manifest(), CFG, SETTINGS)
    c = container(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8000}
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60  # model loads
    svc = by_kind(objs)["Service"]["spec"]
    assert svc["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in svc["ports"]} == ports


def test_shm_model_repo_and_pvc_mounts() -> None:
    objs = render_serving(manifest(), CFG, SETTINGS)
    pod = by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(objs)["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"]
    models = volumes[mounts["/models"]["name"]]
    assert models["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert mounts["/models"]["readOnly"] is True
    repo_cm = [v for v in pod["volumes"] if "configMap" in v]
    assert repo_cm[0]["configMap"]["name"] == "llama-model-repo"
    # model.yaml points at the fp8 checkpoint's path inside the claim
    doc = yaml.safe_load(by_kind(objs)["ConfigMap"]["data"]["model.yaml"])
    assert doc["model"] == "/models/llama-2-70b-fp8"
    assert (doc["tensor_parallel_size"], doc["max_batch_size"]) == (2, 128)
    assert doc["kv_cache_config"]["dtype"] == "auto"
    assert "config.pbtxt" in by_kind(objs)["ConfigMap"]["data"]


def test_command_launches_triton_with_world_size_tp() -> None:
    c = container(render_serving(manifest(), CFG, SETTINGS))
    script = " ".join(c["command"])
    assert "launch_triton_server.py" in script
    assert "--world_size=2" in script
    assert "--model_repo=/model-repo" in script


def test_hf_weights_use_a_cache_and_hf_home() -> None:
    obj = manifest(
        model={"name": "llama-2-70b", "source": {"uri": "hf://meta-llama/Llama-2-70b-hf"}}
    )
    objs = render_serving(obj, TrialConfig(4, 64, "bf16", "auto"), SETTINGS)
    c = container(objs)
    pod = by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models == {"name": "models", "emptyDir": {}}
    assert {"name": "HF_HOME", "value": "/models/hf-cache"} in c["env"]
    doc = yaml.safe_load(by_kind(objs)["ConfigMap"]["data"]["model.yaml"])
    assert doc["model"] == "meta-llama/Llama-2-70b-hf"


def test_serving_overrides() -> None:
    obj = manifest(serving={
        "replicas": 3, "image": "registry.local/triton:custom",
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"},
                      "limits": {"memory": "128Gi", "nvidia.com/gpu": 7}},
    })  # fmt: skip
    objs = render_serving(obj, CFG, SETTINGS)
    dep = by_kind(objs)["Deployment"]
    assert dep["spec"]["replicas"] == 3
    c = container(objs)
    assert c["image"] == "registry.local/triton:custom"
    assert c["resources"]["requests"]["cpu"] == "8"
    assert c["resources"]["limits"]["memory"] == "128Gi"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2  # always TP


def test_simulated_variant_has_no_gpu() -> None:
    obj = manifest(tuning={"backend": "simulated"})
    objs = render_serving(obj, CFG, SETTINGS)  # default: spec.tuning.backend == simulated
    c = container(objs)
    pod = by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    assert c["image"] == "infertune/operator:test"
    assert c["command"][:2] == ["infertune", "simserver"]
    cmd = c["command"]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert flags == {
        "--port": "8001", "--http-port": "8000", "--model": "llama-2-70b",
        "--gpu": "H100-SXM-80GB", "--tp": "2", "--max-batch": "128", "--quant": "fp8",
        "--kv-dtype": "auto", "--served-model": "llm",
    }  # fmt: skip
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert c["resources"]["requests"]["cpu"]
    # the same probes and ports as Triton
    real = container(render_serving(obj, CFG, SETTINGS, simulated=False))
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        assert c[key] == real[key]


def test_quantization_without_checkpoint() -> None:
    obj = manifest(
        model={"name": "llama-2-70b", "source": {"uri": "hf://meta-llama/Llama-2-70b-hf"}}
    )
    with pytest.raises(InputError, match=r"checkpoints\.fp8"):
        render_serving(obj, CFG, SETTINGS, simulated=False)
    # the simulated server loads no weights
    assert render_serving(obj, CFG, SETTINGS, simulated=True)


def test_unknown_gpu_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown GPU"):
        render_serving(manifest(gpu={"product": "Z9000"}), CFG, SETTINGS)


def test_render_is_deterministic() -> None:
    assert render_serving(manifest(), CFG, SETTINGS) == render_serving(manifest(), CFG, SETTINGS)
