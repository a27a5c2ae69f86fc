"""Contract of `render_serving`: the objects the operator applies to serve a configuration."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.objects.serving import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.runtime import SimulatedRuntime, TritonRuntime

SETTINGS = Settings(operator_image="infertune/operator:test", model_storage_pvc=None)
CFG = TrialConfig(2, 128, "fp8", "auto")
TRITON, SIMULATED = TritonRuntime(), SimulatedRuntime()


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


HF_MODEL = {
    "name": "llama-2-70b",
    "source": {"uri": "hf://meta-llama/Llama-2-70b-hf", "tokenSecretRef": {"name": "hf"}},
}


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment", "Service"]
    return {o["kind"]: o for o in objects}


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    return spec


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = pod_of(objects)["containers"]
    return c  # type: ignore[no-any-return]


def volumes_by_mount(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in pod_of(objects)["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container(objects)["volumeMounts"]}


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


def node_affinity_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return required["nodeSelectorTerms"]  # type: ignore[no-any-return]


def test_gpu_product_affinity_takes_every_label_of_the_product() -> None:
    """GPU feature discovery labels one product several ways (GH200: 480GB and 96GB HBM3): a
    node with any of them is the product's."""
    obj = manifest(gpu={
        "product": "GH200-96GB",
        "nodeSelector": {"pool": "inference"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm",
                         "effect": "NoSchedule"}],
    })  # fmt: skip
    objs = render_serving(obj, TrialConfig(1, 64, "bf16", "auto"), SETTINGS)
    pod = pod_of(objs)
    assert node_affinity_terms(pod) == [{"matchExpressions": [{
        "key": "nvidia.com/gpu.product", "operator": "In",
        "values": ["NVIDIA-GH200-480GB", "NVIDIA-GH200-96GB-HBM3"],
    }]}]  # fmt: skip
    assert pod["nodeSelector"] == {"pool": "inference"}  # the user's, unchanged
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    c = container(objs)
    assert c["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"  # = TP


def test_a_user_selected_product_label_replaces_the_affinity() -> None:
    obj = manifest(gpu={"product": "H100-SXM-80GB",
                        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})  # fmt: skip
    pod = pod_of(render_serving(obj, CFG, SETTINGS))
    assert "affinity" not in pod
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_probes_ports_service_and_a_configurable_startup_window() -> None:
    objs = render_serving(manifest(), CFG, SETTINGS)
    c = container(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    # Liveness: one token through Triton's generate endpoint (a dead engine keeps the model
    # READY: upstream model.py, "TODO: [JIRA-4040] Add health check here"), a generous timeout
    live = c["livenessProbe"]
    assert live["exec"]["command"][:2] == ["python3", "-c"]
    assert live["exec"]["command"][3:] == ["http://127.0.0.1:8000/v2/models/llm/generate", "60"]
    assert live["timeoutSeconds"] > 60 and live["periodSeconds"] * live["failureThreshold"] >= 180
    # No mpirun CPU binding: Open MPI 4 and 5 spell it differently
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OMPI_MCA_hwloc_base_binding_policy"] == "none"
    assert env["PRTE_MCA_hwloc_default_binding_policy"] == "none"
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] == 60 * 60  # the default hour
    svc = by_kind(objs)["Service"]["spec"]
    assert svc["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in svc["ports"]} == ports
    # first download of 140 GB + load can exceed the default: the window is the user's
    longer = render_serving(manifest(serving={"startupTimeoutMinutes": 150}), CFG, SETTINGS)
    startup = container(longer)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 150 * 60


def test_requests_always_set_and_the_users_on_top() -> None:
    for runtime in (TRITON, SIMULATED):
        res = container(render_serving(manifest(), CFG, SETTINGS, runtime=runtime))["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"]  # never BestEffort
    triton = container(render_serving(manifest(), CFG, SETTINGS))["resources"]
    assert triton["requests"] == {"cpu": "6", "memory": "48Gi", "nvidia.com/gpu": "2"}
    obj = manifest(serving={
        "replicas": 3, "image": "registry.local/triton:custom",
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"},
                      "limits": {"memory": "128Gi", "nvidia.com/gpu": 7}},
    })  # fmt: skip
    objs = render_serving(obj, CFG, SETTINGS)
    assert by_kind(objs)["Deployment"]["spec"]["replicas"] == 3
    c = container(objs)
    assert c["image"] == "registry.local/triton:custom"
    assert c["resources"]["requests"]["cpu"] == "8"
    assert c["resources"]["limits"]["memory"] == "128Gi"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"  # always TP


def test_security_context() -> None:
    """Triton runs as root (the NGC image is built so; its launcher passes mpirun
    --allow-run-as-root): no privilege escalation, the runtime's seccomp profile. The simulated
    server runs as the operator image's non-root user with nothing more."""
    objs = render_serving(manifest(), CFG, SETTINGS)
    assert pod_of(objs)["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container(objs)["securityContext"] == {"allowPrivilegeEscalation": False}
    sim = render_serving(manifest(), CFG, SETTINGS, runtime=SIMULATED)
    pod = pod_of(sim)["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(sim)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def test_shm_model_repo_and_pvc_mounts() -> None:
    objs = render_serving(manifest(), CFG, SETTINGS)
    mounts = volumes_by_mount(objs)
    shm = mounts["/dev/shm"]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"] == "16Gi"
    assert mounts["/models"]["persistentVolumeClaim"] == {
        "claimName": "model-store",
        "readOnly": True,
    }
    assert "/model-cache" not in mounts  # nothing is downloaded
    assert "initContainers" not in by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    assert mounts["/etc/infertune/model-repo"]["configMap"]["name"] == "llama-model-repo"
    # model.yaml points at the fp8 checkpoint's path inside the claim
    doc = yaml.safe_load(by_kind(objs)["ConfigMap"]["data"]["model.yaml"])
    assert doc["model"] == "/models/llama-2-70b-fp8"
    assert (doc["tensor_parallel_size"], doc["max_batch_size"]) == (2, 128)
    assert "config.pbtxt" in by_kind(objs)["ConfigMap"]["data"]


def test_downloaded_weights_use_a_sized_cache_and_the_token_secret() -> None:
    objs = render_serving(manifest(model=HF_MODEL), TrialConfig(4, 64, "bf16", "auto"), SETTINGS)
    c = container(objs)
    cache = volumes_by_mount(objs)["/model-cache"]
    size = int(cache["emptyDir"]["sizeLimit"].removesuffix("Gi"))
    assert 140 < size < 200  # 69B parameters at 2 bytes, plus headroom
    assert c["resources"]["requests"]["ephemeral-storage"] == f"{size + 1}Gi"
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HOME"] == {"name": "HF_HOME", "value": "/model-cache/huggingface"}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}},
    }
    # model.yaml names the folder the init container downloads the runtime's files to (the LLM
    # API then downloads nothing: its own download would take the whole repository, .bin too)
    doc = yaml.safe_load(by_kind(objs)["ConfigMap"]["data"]["model.yaml"])
    assert doc["model"] == "/model-cache/weights/meta-llama/Llama-2-70b-hf"
    pod = by_kind(objs)["Deployment"]["spec"]["template"]["spec"]
    [fetch] = pod["initContainers"]
    assert fetch["image"] == c["image"] and fetch["env"] == c["env"]
    assert fetch["command"][0] == "python3" and "snapshot_download" in fetch["command"][2]
    assert fetch["command"][3:] == ["meta-llama/Llama-2-70b-hf", doc["model"]]
    assert fetch["volumeMounts"] == [{"name": "model-cache", "mountPath": "/model-cache"}]
    # the operator's model-storage PVC holds the cache instead (ReadWriteMany for replicas)
    shared = Settings(model_storage_pvc="model-cache")
    objs = render_serving(manifest(model=HF_MODEL), TrialConfig(4, 64, "bf16", "auto"), shared)
    assert volumes_by_mount(objs)["/model-cache"]["persistentVolumeClaim"] == {
        "claimName": "model-cache"
    }
    assert "ephemeral-storage" not in container(objs)["resources"]["requests"]


def test_a_pvc_checkpoint_beside_downloaded_weights_mounts_both() -> None:
    model = {**HF_MODEL, "checkpoints": {"fp8": "pvc://store/llama-fp8"}}
    fp8 = render_serving(manifest(model=model), CFG, SETTINGS)
    assert "/models" in volumes_by_mount(fp8) and "/model-cache" not in volumes_by_mount(fp8)
    bf16 = render_serving(manifest(model=model), TrialConfig(2, 8, "bf16", "auto"), SETTINGS)
    assert "/model-cache" in volumes_by_mount(bf16) and "/models" not in volumes_by_mount(bf16)


def test_pvc_uris_must_share_one_claim() -> None:
    with pytest.raises(ValueError, match="same claim"):
        manifest(model={"name": "llama-2-70b", "source": {"uri": "pvc://a/base"},
                        "checkpoints": {"fp8": "pvc://b/fp8"}})  # fmt: skip


@pytest.mark.parametrize(("tp", "mode"), [(1, "--no-mpi"), (4, "--trtllm_llmapi_launch")])
def test_command_launches_triton_as_the_trials_do(tp: int, mode: str) -> None:
    c = container(render_serving(manifest(), TrialConfig(tp, 64, "fp8", "auto"), SETTINGS))
    script = c["command"][2]
    assert c["command"][:2] == ["/bin/bash", "-c"]
    assert f"python3 /app/scripts/launch_triton_server.py --world_size={tp} {mode}" in script
    assert "--model_repo=/model-repo" in script
    assert "cp /app/all_models/llmapi/tensorrt_llm/1/*.py /model-repo/llm/1/" in script


def test_simulated_variant_has_no_gpu() -> None:
    obj = manifest(tuning={"backend": "simulated"})
    objs = render_serving(obj, CFG, SETTINGS)  # default: spec.tuning.backend == simulated
    c = container(objs)
    pod = pod_of(objs)
    assert c["image"] == "infertune/operator:test"
    assert c["command"][:2] == ["infertune", "simserver"]
    cmd = c["command"]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert flags == {
        "--host": "0.0.0.0", "--port": "8001", "--http-port": "8000", "--metrics-port": "8002",
        "--model": "llama-2-70b", "--gpu": "H100-SXM-80GB", "--tp": "2", "--max-batch": "128",
        "--quant": "fp8",
        "--kv-dtype": "auto", "--served-model": "llm",
    }  # fmt: skip
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert "nodeSelector" not in pod and "tolerations" not in pod and "affinity" not in pod
    # the same ports and health probes as Triton; liveness on the live endpoint (simserver's
    # HTTP port serves KServe v2 health, not generate)
    real = container(render_serving(obj, CFG, SETTINGS, runtime=TRITON))
    for key in ("ports", "startupProbe", "readinessProbe"):
        assert c[key] == real[key]
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8000}


def test_quantization_without_checkpoint() -> None:
    obj = manifest(model=HF_MODEL)
    with pytest.raises(InputError, match=r"checkpoints\.fp8"):
        render_serving(obj, CFG, SETTINGS, runtime=TRITON)
    # the simulated server loads no weights
    assert render_serving(obj, CFG, SETTINGS, runtime=SIMULATED)


def test_unknown_gpu_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown GPU"):
        render_serving(manifest(gpu={"product": "Z9000"}), CFG, SETTINGS)


def test_render_is_deterministic() -> None:
    assert render_serving(manifest(), CFG, SETTINGS) == render_serving(manifest(), CFG, SETTINGS)


@pytest.mark.parametrize("runtime", [TRITON, SIMULATED], ids=["triton", "simulated"])
@pytest.mark.parametrize(
    ("model", "config"),
    [
        (None, TrialConfig(2, 128, "fp8", "auto")),
        (HF_MODEL, TrialConfig(8, 256, "bf16", "fp8")),
        (HF_MODEL, TrialConfig(1, 1, "fp16", "auto")),
    ],
)
def test_every_rendered_object_passes_strict_kubernetes_validation(
    strictly_valid: Any, runtime: Any, model: dict[str, Any] | None, config: TrialConfig
) -> None:
    spec: dict[str, Any] = {"serving": {"resources": {"limits": {"memory": "200Gi"}}}}
    if model is not None:
        spec["model"] = model
    strictly_valid(render_serving(manifest(**spec), config, SETTINGS, runtime=runtime))
