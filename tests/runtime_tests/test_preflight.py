"""`--backend triton` checks the machine before the first trial: what is missing is said once,
in one error, instead of three failed trials and an aborted search (runtime/triton.py,
preflight_problems)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.triton import TritonRuntime


def request(tps: list[int], uri: str | None = None) -> TuningRequest:
    model: dict[str, object] = {"name": "llama-3-8b"}
    if uri is not None:
        model["uri"] = uri
    return TuningRequest.model_validate({
        "name": "t", "model": model, "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": 64, "output_tokens": 8},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
        "search": {"tensor_parallel": tps, "max_batch_size": [8], "quantization": ["bf16"],
                   "kv_cache_dtype": ["auto"]},
    })  # fmt: skip


def executable(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TritonRuntime:
    """What the Triton TRT-LLM image provides, laid out in a folder: the launcher, the LLM-API
    model, tritonserver, mpirun and a driver that lists two GPUs (PATH holds only these)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tritonserver", "mpirun"):
        executable(bin_dir, name)
    executable(bin_dir, "nvidia-smi", "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)'\n"
               "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)'")  # fmt: skip
    monkeypatch.setenv("PATH", str(bin_dir))
    (tmp_path / "app" / "scripts").mkdir(parents=True)
    (tmp_path / "app" / "scripts" / "launch_triton_server.py").write_text("")
    model = tmp_path / "app" / "llmapi" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("")
    return TritonRuntime(
        launcher=str(tmp_path / "app" / "scripts" / "launch_triton_server.py"),
        llmapi_model_dir=str(model), cache_root=str(tmp_path / "cache"),
    )  # fmt: skip


def test_a_complete_image_has_no_problems(image: TritonRuntime) -> None:
    assert image.problems(request([1, 2])) == []


def test_every_missing_piece_is_named(image: TritonRuntime, tmp_path: Path) -> None:
    bare = TritonRuntime(launcher=str(tmp_path / "nope.py"),
                         llmapi_model_dir=str(tmp_path / "none"))  # fmt: skip
    for name in ("tritonserver", "mpirun", "nvidia-smi"):
        (tmp_path / "bin" / name).unlink()
    problems = bare.problems(request([1, 2]))
    assert len(problems) == 5, problems
    for fragment in ("nope.py is missing", "LLM-API Triton model (model.py)",
                     "tritonserver is not on PATH", "mpirun is not on PATH",
                     "no GPU is visible"):  # fmt: skip
        assert any(fragment in p for p in problems), (fragment, problems)


def test_tp1_needs_no_mpirun_and_more_gpus_than_visible_is_a_problem(
    image: TritonRuntime, tmp_path: Path
) -> None:
    (tmp_path / "bin" / "mpirun").unlink()
    assert image.problems(request([1])) == []
    [problem] = image.problems(request([1, 4]))[-1:]
    assert "2 GPU(s) visible, fewer than the largest tensorParallel searched (4)" in problem


def test_mounted_weights_must_be_there(image: TritonRuntime, tmp_path: Path) -> None:
    (problem,) = image.problems(request([1], uri="file:///nowhere/llama"))
    assert "the weights of file:///nowhere/llama are not at /nowhere/llama" in problem
    (tmp_path / "llama").mkdir()
    assert image.problems(request([1], uri=f"file://{tmp_path / 'llama'}")) == []


SPEC = """\
apiVersion: infertune.io/v1alpha1
kind: InferenceDeployment
metadata: {name: preflight}
spec:
  model: {name: llama-3-8b, source: {uri: "pvc://models/llama"}}
  gpu: {product: H100-SXM-80GB, maxGpusPerReplica: 2}
  workload: {inputTokens: 64, outputTokens: 8}
  slo: {itlMs: {p50: 100}}
  search: {tensorParallel: [1, 2], maxBatchSize: [8], quantization: [bf16], kvCacheDtype: [auto]}
"""


def test_tune_on_a_machine_without_the_image_says_so_before_any_trial(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    exe = Path(sys.executable).with_name("infertune")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERTUNE_")}
    done = subprocess.run(
        [str(exe), "tune", str(spec), "--backend", "triton", "--out", str(tmp_path / "out"),
         "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "backend triton cannot run trials here" in done.stderr
    assert "tritonserver is not on PATH" in done.stderr
    assert "the weights of pvc://models/llama are not at /models/llama" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()  # no trial, no study


def test_a_trial_server_starts_without_mpi_cpu_binding(
    image: TritonRuntime, tmp_path: Path
) -> None:
    """Open MPI binds each rank to one core when it starts <= 2 processes and upstream's
    launcher passes no --bind-to (launch_triton_server.py L181-189): a TP-2 trial's
    tritonserver, Python stub and proxy would share one core. The trial's environment says
    none, for Open MPI 4 and 5."""
    backend = TritonBackend(request([2]), runtime=image, workdir=tmp_path / "w")
    plan = backend.plan(TrialConfig(2, 8, "bf16", "auto"), tmp_path / "w" / "t")
    assert plan.env is not None
    assert plan.env["OMPI_MCA_hwloc_base_binding_policy"] == "none"
    assert plan.env["PRTE_MCA_hwloc_default_binding_policy"] == "none"
    assert plan.command[plan.command.index("--world_size=2") + 1] == "--trtllm_llmapi_launch"
    assert plan.launch_lock is not None  # TP 2 starts one at a time (test_launch_race.py)
