"""Trials against a real `tritonserver` (the nvidia-pytriton wheel) serving infertune's rendered
repository with its Python-backend model (runtime/local_triton.py, triton_model/).

These tests never skip: when the server cannot start here they fail with what is missing (the
dev extra installs the wheel; the stub needs the system's shared libpython3.X).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.engine import modelled_steady_state
from infertune_tuner.harness.loadgen import run_load
from infertune_tuner.harness.runner import ServerProcess, wait_ready
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.local_triton import LocalTritonRuntime, TritonInstall
from infertune_tuner.runtime.triton import liveness_argv


@pytest.fixture(scope="module", autouse=True)
def triton_installed() -> None:
    TritonInstall.find()  # raises TritonUnavailable naming what is missing: a failure, not a skip


def request(output_tokens: int = 8) -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "t", "model": {"name": "llama-3-8b"}, "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": 64, "output_tokens": output_tokens},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
    })  # fmt: skip


def backend(tmp_path: Path, runtime: Any, **kw: Any) -> TritonBackend:
    kw.setdefault("requests_per_trial", 24)
    kw.setdefault("warmup", 8)
    return TritonBackend(request(), runtime=runtime, workdir=tmp_path, startup_timeout_s=90, **kw)


def tritonservers_under(folder: Path) -> list[int]:
    """Live tritonserver processes whose command line names `folder`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"tritonserver") and str(folder).encode() in b" ".join(argv):
            pids.append(int(entry.name))
    return pids


def test_a_trial_on_real_triton_measures_the_model_bodys_timing(tmp_path: Path) -> None:
    config = TrialConfig(1, 8, "bf16", "auto")
    m = backend(tmp_path, LocalTritonRuntime()).run(config)
    assert m.status == "ok", m.reason
    assert (m.requests, m.errors) == (24, 0)
    assert m.output_tokens_mean == 8  # every response counted, the requested length reached
    req = request()
    expected = modelled_steady_state(
        req.resolve_model(), req.resolve_gpu(), config, Workload(64, 8), concurrency=8,
        requests=24, warmup=8,
    )  # fmt: skip
    itl = expected.itl_ms.p50 if expected.itl_ms else 0.0
    assert m.itl_ms is not None and itl > 0
    # Triton's stub, its shared-memory hops and Python's thread switches add a little per token
    assert itl * 0.9 <= m.itl_ms.p50 <= itl * 1.5 + 1.0
    assert not tritonservers_under(tmp_path), "a tritonserver outlived its trial"
    log = next(tmp_path.glob("trial-*/server.log")).read_text()
    assert "Started GRPCInferenceService" in log  # the real server, not a stand-in


def test_the_served_repository_is_the_rendered_one(tmp_path: Path) -> None:
    """config.pbtxt and model.yaml are exactly what the Triton + TensorRT-LLM runtime renders;
    model.py and body.json are the local runtime's own."""
    from infertune_tuner.runtime.triton import TritonRuntime

    config = TrialConfig(1, 8, "bf16", "fp8")
    req = request()
    b = backend(tmp_path, LocalTritonRuntime())
    b.plan(config, tmp_path / "t")
    repo = tmp_path / "t" / "model_repo" / "llm"
    rendered = TritonRuntime().model_files(req, config)
    assert (repo / "config.pbtxt").read_text() == rendered["llm/config.pbtxt"]
    assert (repo / "1" / "model.yaml").read_text() == rendered["llm/1/model.yaml"]
    assert sorted(p.name for p in (repo / "1").iterdir()) == ["body.json", "model.py", "model.yaml"]
    body = json.loads((repo / "1" / "body.json").read_text())
    assert body["body"] == "simulated" and body["max_context"] == 72
    assert (
        yaml.safe_load((repo / "1" / "model.yaml").read_text())["kv_cache_config"]["dtype"] == "fp8"
    )


@dataclass(frozen=True)
class RenamedOutput(LocalTritonRuntime):
    """The rendered config.pbtxt with its output misnamed, as a rendering bug would leave it."""

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        files = super().model_files(request, config)
        key = "llm/config.pbtxt"
        files[key] = files[key].replace('name: "text_output"', 'name: "text_out"')
        return files


@dataclass(frozen=True)
class WrongInputType(LocalTritonRuntime):
    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        files = super().model_files(request, config)
        key = "llm/config.pbtxt"
        text = files[key].replace(
            'name: "text_input"\n    data_type: TYPE_STRING',
            'name: "text_input"\n    data_type: TYPE_INT32',
        )
        assert text != files[key]
        files[key] = text
        return files


def test_a_config_the_real_server_cannot_serve_fails_the_trial(tmp_path: Path) -> None:
    """Triton drops an output its config does not declare, so no token ever arrives; a wrong
    input type is what the real server's metadata then says."""
    m = backend(tmp_path / "a", RenamedOutput()).run(TrialConfig(1, 4, "bf16", "auto"))
    assert m.status == "error" and "without output" in str(m.reason)
    m = backend(tmp_path / "b", WrongInputType()).run(TrialConfig(1, 4, "bf16", "auto"))
    assert m.status == "error" and "declares input 'text_input' as INT32" in str(m.reason)


def test_metrics_port_serves_tritons_own_counters(tmp_path: Path) -> None:
    b = backend(tmp_path, LocalTritonRuntime(), requests_per_trial=12, warmup=0)
    plan = b.plan(TrialConfig(1, 4, "bf16", "auto"), tmp_path / "t")
    metrics_port = int(
        next(a for a in plan.command if a.startswith("--metrics-port=")).split("=")[1]
    )
    server = ServerProcess.start(plan.command, plan.log_path)
    try:
        ready = asyncio.run(wait_ready(server, plan.load.url, plan.load.model, 90))
        assert ready is None, server.log_text()[-2000:]
        result = asyncio.run(run_load(plan.load))
        assert result.requests == 12 and result.errors == 0
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.stop()
    counters = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert counters['nv_inference_request_success{model="llm",version="1"}'] == 12
    assert counters['nv_inference_request_failure{model="llm",reason="BACKEND",version="1"}'] == 0
    assert 'nv_inference_exec_count{model="llm",version="1"}' in counters


def test_no_tritonserver_outlives_a_killed_tuner(tmp_path: Path) -> None:
    """SIGKILL the process that runs a trial mid-load: its guard ends the server."""
    script = tmp_path / "trial.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from infertune_tuner.backends.triton import TritonBackend\n"
        "from infertune_tuner.config import TrialConfig\n"
        "from infertune_tuner.request import TuningRequest\n"
        "from infertune_tuner.runtime.local_triton import LocalTritonRuntime\n"
        f"req = TuningRequest.model_validate_json({request(output_tokens=4000).to_json()!r})\n"
        "b = TritonBackend(req, runtime=LocalTritonRuntime(), workdir=Path(sys.argv[1]),\n"
        "                  requests_per_trial=64, warmup=0, startup_timeout_s=90)\n"
        "b.run(TrialConfig(1, 4, 'bf16', 'auto'))\n"
    )
    work = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, str(script), str(work)], env=os.environ.copy())
    try:
        for _ in range(900):  # until the server is up and serving
            logs = list(work.glob("trial-*/server.log"))
            if logs and "Started GRPCInferenceService" in logs[0].read_text(errors="replace"):
                break
            assert proc.poll() is None, "the trial ended before its server started"
            asyncio.run(asyncio.sleep(0.1))
        assert tritonservers_under(work), "no tritonserver started"
        proc.kill()
        proc.wait(10)
        for _ in range(300):
            if not tritonservers_under(work):
                break
            asyncio.run(asyncio.sleep(0.1))
        assert not tritonservers_under(work), "tritonserver outlived the killed tuner"
    finally:
        if proc.poll() is None:
            proc.kill()


SPEC = """\
apiVersion: infertune.io/v1alpha1
kind: InferenceDeployment
metadata: {name: local-triton}
spec:
  model: {name: llama-3-8b}
  gpu: {product: H100-SXM-80GB, maxGpusPerReplica: 1}
  workload: {inputTokens: 64, outputTokens: 8}
  slo: {itlMs: {p95: 50}}
  search: {tensorParallel: [1], maxBatchSize: [1, 4, 8], quantization: [bf16],
           kvCacheDtype: [auto]}
  tuning: {maxTrials: 3, sampler: grid}
"""


def infertune(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, its simulated body's clock 5x faster than the modelled H100's."""
    exe = Path(sys.executable).with_name("infertune")
    env = {**os.environ, "INFERTUNE_SIMULATED_TIME_SCALE": "0.2"}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, env=env)


def test_tune_with_the_triton_backend_runs_every_trial_on_real_servers(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    done = infertune("tune", str(spec), "--backend", "triton:simulated", "--out",
                     str(tmp_path / "out"), "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["backend"] == "triton:simulated"
    trials = report["trials"]
    assert len(trials) == 3 and all(t["state"] == "complete" for t in trials), trials
    assert report["best"]["config"]["max_batch_size"] in (1, 4, 8)
    assert not tritonservers_under(tmp_path)


def test_an_unknown_model_body_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    done = infertune("tune", str(spec), "--backend", "triton:vllm", "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert "unknown model body 'vllm'" in done.stderr and "Traceback" not in done.stderr


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _serving(out: Path, shown: Path) -> bool:
    """Whether the run's trial server runs and serves its requests (the progress line shows
    the trial's load: warm-up, then measuring)."""
    return (
        bool(tritonservers_under(out)) and re.search("warm-up|measuring", _text(shown)) is not None
    )


def _until(
    done: Callable[[], bool], what: str, within_s: float, tuner: subprocess.Popen[str] | None = None
) -> None:
    """Wait for an event (`done()`), failing if `tuner` ends first; `within_s` only bounds a
    hang."""
    deadline = time.monotonic() + within_s
    while not done():
        assert tuner is None or tuner.poll() is None, f"the tuner ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {within_s:g} s"
        time.sleep(0.1)


def test_ctrl_c_mid_trial_stops_the_real_server_and_keeps_the_report(
    tmp_path: Path, ctrl_c_reaches: Callable[[list[str]], list[str]]
) -> None:
    """SIGINT to the tuner alone (the server not in its process group's reach) while its server
    serves the trial's requests: exit 130, the report written, no tritonserver left."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("outputTokens: 8", "outputTokens: 4000"))
    exe = Path(sys.executable).with_name("infertune")
    out = tmp_path / "out"
    shown = tmp_path / "progress"  # the progress line, drawn as at a terminal
    with shown.open("wb") as progress:
        tuner = subprocess.Popen(
            ctrl_c_reaches([str(exe), "tune", str(spec), "--backend", "triton:simulated",
                            "--out", str(out)]),
            env={**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
            stdout=subprocess.PIPE, stderr=progress, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        # Mid-load, by the run's own events (not a time after the server's start, which a busy
        # machine moves): the trial's tritonserver runs and the progress line says its requests
        # are in flight (the warm-up's: 4000 tokens each, they last a minute).
        _until(lambda: _serving(out, shown), "trial serving its requests", 600, tuner)
        tuner.send_signal(signal.SIGINT)
        # A server with requests in flight does not stop on SIGTERM: its guard kills it after
        # its grace period (harness/guard.py), so this bound is that and then some.
        stdout, _ = tuner.communicate(timeout=180)
        assert tuner.returncode == 130, stdout + _text(shown)[-2000:]
        assert "Traceback" not in stdout + _text(shown)
        assert stdout.startswith("Interrupted (Ctrl-C) after 0 trials"), stdout
        _until(lambda: not tritonservers_under(out), "the end of the trial's tritonserver", 60)
        assert (out / "report.json").exists()
    finally:
        if tuner.poll() is None:
            tuner.kill()
        for pid in tritonservers_under(out):
            os.kill(pid, signal.SIGKILL)


def _http_status(url: str, within_s: float = 30.0) -> int:
    """The status of GET `url`, waiting for the endpoint to listen: a server `wait_ready` calls
    ready over gRPC may refuse HTTP connections for a moment longer (this test failed so now
    and then, `Connection refused` right after readiness)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return int(response.status)
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_liveness_fails_on_a_server_that_is_ready_but_cannot_generate(tmp_path: Path) -> None:
    """A hung engine behind a READY model (upstream's model.py has no health check: its
    `# TODO: [JIRA-4040] Add health check here`): /v2/health/ready stays 200, the liveness
    command (one token through the generate endpoint) fails within its timeout."""
    frozen = LocalTritonRuntime(time_scale=1e6)  # a step takes ~10^4 s: nothing ever finishes
    b = backend(tmp_path, frozen, requests_per_trial=1, warmup=0)
    plan = b.plan(TrialConfig(1, 4, "bf16", "auto"), tmp_path / "t")
    http = int(next(a for a in plan.command if a.startswith("--http-port=")).split("=")[1])
    server = ServerProcess.start(plan.command, plan.log_path)
    try:
        ready = asyncio.run(wait_ready(server, plan.load.url, plan.load.model, 90))
        assert ready is None, server.log_text()[-2000:]
        url = f"http://127.0.0.1:{http}/v2/health/ready"
        assert _http_status(url) == 200  # Triton calls it ready
        argv = liveness_argv(http, timeout_s=3)
        done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode != 0
        assert "no token within 3 s" in done.stderr
    finally:
        server.stop()
