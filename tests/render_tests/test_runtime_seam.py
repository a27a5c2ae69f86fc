"""One serving runtime for the trial and the deployment: what a tuning trial measured is what the
operator serves, file for file and flag for flag (item 9 of the real path)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.objects.serving import render_serving
from infertune_operator.settings import Settings
from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.runtime import ServingRuntime, SimulatedRuntime, TritonRuntime
from infertune_tuner.runtime.base import REPO_DIR

SETTINGS = Settings(operator_image="op:1")


def deployment(checkpoints: dict[str, str]) -> InferenceDeployment:
    return InferenceDeployment.model_validate({
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "model": {"name": "llama-3-8b", "source": {"uri": "pvc://store/llama-3-8b"},
                      "checkpoints": checkpoints},
            "gpu": {"product": "H100-SXM-80GB"},
            "workload": {"inputTokens": 9000, "outputTokens": 256},
            "slo": {"ttftMs": {"p95": 2000}},
            "tuning": {"backend": "triton"},
        },
    })  # fmt: skip


def trial(runtime: ServingRuntime, obj: InferenceDeployment, config: TrialConfig, tmp: Path):  # type: ignore[no-untyped-def]
    backend = TritonBackend(to_request(obj), runtime=runtime, workdir=tmp / "work")
    return backend.plan(config, tmp / "trial")


def served(runtime: ServingRuntime, obj: InferenceDeployment, config: TrialConfig) -> Any:
    objs = render_serving(obj, config, SETTINGS, runtime=runtime)
    files = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    (container,) = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    return files, container["command"]


def pod_view(argv: list[str], repo: str, ports: dict[str, str]) -> list[str]:
    """A trial's argv as the pod runs it: the repository and ports where the pod has them."""
    out = " ".join(argv).replace(repo, REPO_DIR)
    for trial_port, pod_port in ports.items():
        out = out.replace(f"_port={trial_port}", f"_port={pod_port}")
    return out.split()


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(1, 48, "bf16", "auto"),
        TrialConfig(4, 256, "fp8", "auto"),
        TrialConfig(2, 96, "fp16", "fp8"),
    ],
)
def test_the_trial_and_the_deployment_run_the_same_triton(
    tmp_path: Path, config: TrialConfig
) -> None:
    llmapi = tmp_path / "llmapi"
    llmapi.mkdir()
    (llmapi / "model.py").write_text("# the image's LLM-API model\n")
    runtime = TritonRuntime(llmapi_model_dir=str(llmapi))
    obj = deployment({"fp8": "pvc://store/llama-3-8b-fp8"})
    plan = trial(runtime, obj, config, tmp_path)
    files, command = served(runtime, obj, config)
    repo = tmp_path / "trial" / "model_repo"
    # the same files: model.yaml (weights, TP, batch, dtype, CUDA graphs, KV) and config.pbtxt
    assert (repo / "llm/1/model.yaml").read_text() == files["model.yaml"]
    assert (repo / "llm/config.pbtxt").read_text() == files["config.pbtxt"]
    assert (repo / "llm/1/model.py").is_file()  # the image's model, as the pod copies it
    # the same launch, up to where the repository is and which ports are free
    script = command[2]
    launch = next(line for line in script.splitlines() if "launch_triton_server.py" in line)
    load_port = plan.load.url.rsplit(":", 1)[1]
    argv = list(plan.command)
    http = next(a.split("=")[1] for a in argv if a.startswith("--http_port="))
    metrics = next(a.split("=")[1] for a in argv if a.startswith("--metrics_port="))
    expected = pod_view(argv, str(repo), {load_port: "8001", http: "8000", metrics: "8002"})
    assert shlex.split(launch) == expected


def test_the_trial_and_the_deployment_run_the_same_simulated_server(tmp_path: Path) -> None:
    runtime = SimulatedRuntime()
    obj = deployment({})
    config = TrialConfig(2, 64, "bf16", "auto")
    plan = trial(runtime, obj, config, tmp_path)
    _, command = served(runtime, obj, config)

    def flags(argv: list[str]) -> dict[str, str]:
        pairs = dict(zip(argv[2::2], argv[3::2], strict=True))
        ports = ("--host", "--port", "--http-port", "--metrics-port")
        return {k: v for k, v in pairs.items() if k not in ports}

    assert plan.command[:2] == command[:2] == ["infertune", "simserver"]
    assert flags(plan.command) == flags(command)
