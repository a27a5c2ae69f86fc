"""The `triton` backend's trial orchestration, with the simulated server standing in for Triton."""

from __future__ import annotations

import shutil
import socket
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune_tuner.backends import triton as triton_backend
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.backends.triton import TritonBackend, default_requests, default_warmup
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.harness.runner import classify_failure, run_trial
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import SimulatedRuntime
from infertune_tuner.runtime.triton import MODEL_YAML_KEYS

PROGRAM = (sys.executable, "-m", "infertune_tuner.cli.simserver")
SIM_RUNTIME = SimulatedRuntime(program=PROGRAM, time_scale=0.05)
SIM = f"{sys.executable} -m infertune_tuner.cli.simserver --host 127.0.0.1"
TEMPLATE = (
    SIM + " --port {port} --http-port {http_port} --model {model} --gpu {gpu} --tp {tp}"
    " --max-batch {max_batch_size} --quant {quantization} --kv-dtype {kv_cache_dtype}"
    " --served-model {served_model} --time-scale 0.05"
)


def request(model: str = "llama-3-8b", **model_fields: Any) -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "t",
        "model": {"name": model, **model_fields},
        "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": 64, "output_tokens": 8},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
    })  # fmt: skip


def backend(req: TuningRequest, tmp_path: Path, **kw: Any) -> TritonBackend:
    if "server_command" not in kw:
        kw.setdefault("runtime", SIM_RUNTIME)
    kw.setdefault("requests_per_trial", 16)
    kw.setdefault("warmup", 2)
    kw.setdefault("startup_timeout_s", 30)
    return TritonBackend(req, workdir=tmp_path, **kw)


def refused(url: str) -> bool:
    host, port = url.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) != 0


def test_is_a_benchmark_backend(tmp_path: Path) -> None:
    b = backend(request(), tmp_path)
    assert isinstance(b, BenchmarkBackend) and b.name == "triton"


def test_ok_trial_with_simserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes: list[Any] = []

    def spy(plan: Any) -> Any:
        outcomes.append(run_trial(plan))
        return outcomes[-1]

    monkeypatch.setattr(triton_backend, "run_trial", spy)
    b = backend(request(uri="hf://meta-llama/Meta-Llama-3-8B"), tmp_path)
    m = b.run(TrialConfig(2, 8, "bf16", "auto"))
    assert m.status == "ok", m.reason
    assert m.ttft_ms is not None and m.itl_ms is not None and m.e2e_ms is not None
    assert 0 < m.ttft_ms.p50 <= m.e2e_ms.p50
    assert (m.requests, m.errors) == (16, 0)
    bench = outcomes[0].result
    assert m.output_tokens_per_s_per_gpu == pytest.approx(bench.output_tokens_per_s / 2)
    assert refused(bench.settings["url"])  # the server is gone
    # the rendered repository sits in the trial directory
    (trial,) = tmp_path.glob("trial-001-*")
    doc = yaml.safe_load((trial / "model_repo/llm/1/model.yaml").read_text())
    assert set(MODEL_YAML_KEYS) <= set(doc)
    # the folder the serving pod's init container (and a real trial) downloads the weights to
    assert doc["model"] == "/model-cache/weights/meta-llama/Meta-Llama-3-8B"
    assert (doc["tensor_parallel_size"], doc["max_batch_size"]) == (2, 8)
    assert (trial / "model_repo/llm/config.pbtxt").is_file()


def test_weights_that_do_not_fit_are_oom(tmp_path: Path) -> None:
    m = backend(request("llama-2-70b"), tmp_path).run(TrialConfig(1, 8, "bf16", "auto"))
    assert m.status == "oom"
    assert m.reason is not None and "CUDA out of memory" in m.reason


def test_quantization_without_checkpoint_fails_before_launching(tmp_path: Path) -> None:
    b = backend(request(), tmp_path, server_command="false")
    m = b.run(TrialConfig(1, 8, "fp8", "auto"))
    assert m.status == "error" and m.reason is not None and "checkpoints.fp8" in m.reason
    assert b.weights_for(TrialConfig(1, 8, "bf16", "auto")) == "meta-llama/Meta-Llama-3-8B"
    q = request(uri="pvc://models/llama3", checkpoints={"fp8": "pvc://models/llama3-fp8"})
    b = backend(q, tmp_path)
    assert b.weights_for(TrialConfig(1, 8, "fp8", "auto")) == "/models/llama3-fp8"
    assert b.weights_for(TrialConfig(1, 8, "bf16", "auto")) == "/models/llama3"


def test_a_server_that_dies_at_startup_is_an_error_with_its_log(tmp_path: Path) -> None:
    bad = TEMPLATE.replace("--gpu {gpu}", "--gpu NO-SUCH-GPU")
    m = backend(request(), tmp_path, server_command=bad).run(TrialConfig(1, 8, "bf16", "auto"))
    assert m.status == "error"
    assert m.reason is not None
    assert "exited before it was ready (exit code 2)" in m.reason
    assert "unknown GPU" in m.reason


def test_startup_timeout_is_an_error_and_the_process_is_stopped(tmp_path: Path) -> None:
    b = backend(request(), tmp_path, server_command="sleep 60", startup_timeout_s=0.5)
    t0 = time.monotonic()
    m = b.run(TrialConfig(1, 8, "bf16", "auto"))
    assert m.status == "error" and m.reason is not None and "not ready after 0.5 s" in m.reason
    assert time.monotonic() - t0 < 20


def test_unknown_placeholder_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown placeholder"):
        backend(request(), tmp_path, server_command="serve --port {prot}")


def test_requests_and_warmup_defaults() -> None:
    assert [default_requests(b) for b in (1, 16, 64, 256, 1024)] == [64, 64, 256, 1024, 1024]
    assert [default_warmup(b) for b in (1, 8, 64, 512)] == [1, 8, 64, 256]


def test_failure_classification() -> None:
    status, reason = classify_failure("loading\nRuntimeError: CUDA out of memory. Tried 2 GiB\nbye")
    assert status == "oom" and reason.startswith("RuntimeError: CUDA out of memory")
    assert classify_failure("x\ncudaErrorMemoryAllocation: fail")[0] == "oom"
    assert classify_failure("torch.OutOfMemoryError: boom")[0] == "oom"
    log = "\n".join(f"line {i}" for i in range(100))
    status, reason = classify_failure(log, "it died")
    lines = reason.splitlines()
    assert status == "error" and lines[0] == "it died" and len(lines) == 41
    assert lines[-1] == "line 99"


def test_host_pinned_memory_warning_is_not_the_oom() -> None:
    """Lines as a real tritonserver 2.51 on an H100 printed them (benchmarks/real-worlds)."""
    pinned = (
        'W1125 14:08:10.811602 7963 pinned_memory_manager.cc:273] "Unable to allocate pinned '
        'system memory, pinned memory pool will not be available: out of memory"'
    )
    cuda = (
        'I1125 14:08:12.880727 7963 pb_stub.cc:366] "Failed to initialize Python stub: '
        "AcceleratorError: CUDA error: out of memory"
    )
    status, reason = classify_failure(f"{pinned}\n{cuda}")
    assert status == "oom" and "AcceleratorError: CUDA error: out of memory" in reason
    status, reason = classify_failure(f"{pinned}\nmodel.py: ValueError: bad input")
    assert status == "error" and "ValueError: bad input" in reason


FAKE_LAUNCHER = textwrap.dedent(
    """
    # Like launch_triton_server.py: start the server in the background and return at once.
    import argparse, os, re, subprocess
    p = argparse.ArgumentParser()
    for flag in ("--world_size", "--model_repo", "--tensorrt_llm_model_name", "--grpc_port",
                 "--http_port", "--metrics_port"):
        p.add_argument(flag)
    for flag in ("--no-mpi", "--trtllm_llmapi_launch", "--oversubscribe", "--force"):
        p.add_argument(flag, action="store_true")
    a = p.parse_args()
    assert a.force  # upstream refuses while another tritonserver runs (pgrep -r R) without it
    assert a.no_mpi == (a.world_size == "1") and a.trtllm_llmapi_launch == (a.world_size != "1")
    version = os.path.join(a.model_repo, a.tensorrt_llm_model_name, "1")
    assert os.path.isfile(os.path.join(version, "model.py"))
    text = open(os.path.join(version, "model.yaml")).read()
    top = lambda key: re.search(rf"^{key}: (\\S+)$", text, re.M).group(1)
    assert top("tensor_parallel_size") == a.world_size
    subprocess.Popen([
        os.environ["INFERTUNE_TEST_PYTHON"], "-m", "infertune_tuner.cli.simserver",
        "--host", "127.0.0.1", "--port", a.grpc_port, "--http-port", a.http_port,
        "--model", "llama-3-8b", "--gpu", "H100-SXM-80GB", "--tp", a.world_size,
        "--max-batch", top("max_batch_size"), "--quant", "bf16",
        "--served-model", a.tensorrt_llm_model_name, "--time-scale", "0.05",
    ])
    print("launched")
    """
)


@pytest.mark.skipif(shutil.which("python3") is None, reason="the launcher runs under python3")
def test_default_launcher_path_detaches_and_is_torn_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real launcher returns while mpirun keeps running: liveness and teardown must follow
    the process group, not the child."""
    launcher = tmp_path / "launch_triton_server.py"
    launcher.write_text(FAKE_LAUNCHER)
    llmapi = tmp_path / "llmapi"
    llmapi.mkdir()
    (llmapi / "model.py").write_text("# stand-in\n")
    (llmapi / "helpers.py").write_text("# stand-in\n")
    monkeypatch.setenv("INFERTUNE_TRITON_LAUNCHER", str(launcher))
    monkeypatch.setenv("INFERTUNE_LLMAPI_MODEL_DIR", str(llmapi))
    monkeypatch.setenv("INFERTUNE_TEST_PYTHON", sys.executable)
    b = TritonBackend(request(), workdir=tmp_path / "work", requests_per_trial=8, warmup=0)
    plan = b.plan(TrialConfig(2, 4, "bf16", "auto"), tmp_path / "trial")
    assert plan.command[:4] == [
        "python3",
        str(launcher),
        "--world_size=2",
        "--trtllm_llmapi_launch",
    ]
    assert (tmp_path / "trial/model_repo/llm/1/helpers.py").is_file()
    outcome = run_trial(plan)
    assert outcome.status == "ok", outcome.reason
    assert outcome.result is not None and outcome.result.requests == 8
    assert "launched" in plan.log_path.read_text()
    assert refused(plan.load.url)


def test_default_launcher_without_the_llmapi_model_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERTUNE_LLMAPI_MODEL_DIR", str(tmp_path / "missing"))
    m = TritonBackend(request(), workdir=tmp_path).run(TrialConfig(1, 8, "bf16", "auto"))
    assert m.status == "error" and m.reason is not None and "model.py" in m.reason


def test_the_token_reaches_the_server_and_nothing_infertune_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_TOKEN (from the tuner pod's secretKeyRef, or the user's shell) flows to the trial's
    server through the environment; no log line, reason or report of infertune carries it."""
    token = "hf_" + "s3cr3t" * 4
    monkeypatch.setenv("HF_TOKEN", token)
    probe = f'sh -c \'test "$HF_TOKEN" = {token} && echo token-received; exec "$@"\' sh {TEMPLATE}'
    b = backend(request(), tmp_path, server_command=probe)
    m = b.run(TrialConfig(1, 4, "bf16", "auto"))
    assert m.status == "ok", m.reason
    (log,) = tmp_path.glob("trial-001-*/server.log")
    text = log.read_text()
    assert "token-received" in text and token not in text
    assert token not in repr(m)
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert token not in f.read_text(errors="replace"), f
