"""The load generator and `infertune bench` against a real `tritonserver` (the nvidia-pytriton
wheel) serving infertune's rendered repository with the simulated model body.

What the hand-written simserver and the client could get wrong the same way — the final-response
flag, the cumulative text of the LLM-API model, Triton's errors for an unknown model or an
undeclared input, health and model config — is read here from the real server. These tests
never skip: when the server cannot start they fail naming what is missing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc.aio import InferenceServerClient
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.engine import modelled_steady_state
from infertune_tuner.harness.loadgen import LoadSpec, run_load
from infertune_tuner.harness.runner import ServerProcess, free_ports, wait_ready
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import Ports
from infertune_tuner.runtime.local_triton import LocalTritonRuntime
from infertune_tuner.runtime.triton import liveness_argv

MAX_BATCH = 4
# llama-3-8b fp8 on an H100 at batch 4: a decode step of ~5.6 ms at scale 1; at scale 2 the
# server streams < 400 responses/s at concurrency 4, far below what two cores can send.
SCALE = 2.0
CONFIG = TrialConfig(1, MAX_BATCH, "fp8", "auto")


@dataclass(frozen=True)
class RealTriton:
    grpc: int
    http: int
    metrics: int
    request: TuningRequest

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc}"


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory, trial_request: Any) -> Iterator[RealTriton]:
    """One real tritonserver for the module, launched exactly as a trial launches it."""
    folder = tmp_path_factory.mktemp("real-triton")
    request = trial_request(input_tokens=128, output_tokens=24)
    runtime = LocalTritonRuntime(time_scale=SCALE)
    repo = folder / "model_repo"
    for rel, text in runtime.model_files(request, CONFIG).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text, encoding="utf-8")
    runtime.assemble(repo)
    ports = Ports(*free_ports(3))
    argv = runtime.launch_argv(request, CONFIG, repo_dir=str(repo), ports=ports, host="127.0.0.1")
    server = ServerProcess.start(argv, folder / "server.log")
    try:
        failure = asyncio.run(wait_ready(server, f"127.0.0.1:{ports.grpc}", "llm", 90))
        assert failure is None, f"{failure}\n{server.log_text()[-3000:]}"
        yield RealTriton(ports.grpc, ports.http, ports.metrics, request)
    finally:
        server.stop()


def spec(server: RealTriton, **kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "url": server.url, "model": "llm", "concurrency": MAX_BATCH, "requests": 16,
        "input_tokens": 128, "output_tokens": 24, "warmup": MAX_BATCH, "connect_timeout_s": 5.0,
    }  # fmt: skip
    base.update(kw)
    return LoadSpec(**base)  # type: ignore[arg-type]


def test_closed_loop_measures_the_model_bodys_itl(triton: RealTriton) -> None:
    result = asyncio.run(run_load(spec(triton)))
    assert (result.requests, result.errors) == (16, 0), result.error_samples
    assert result.output_tokens == 16 * 24  # one token per response, cumulative text or not
    assert result.short_output is None
    req = triton.request
    model = modelled_steady_state(
        req.resolve_model(), req.resolve_gpu(), CONFIG, Workload(128, 24),
        concurrency=MAX_BATCH, requests=16, warmup=MAX_BATCH,
    )  # fmt: skip
    assert result.itl_ms is not None and model.itl_ms is not None
    known = model.itl_ms.p50 * SCALE
    # The stub's shared-memory hops and a loaded 2-core machine add a little, never take away.
    assert known * 0.95 <= result.itl_ms.p50 <= known * 1.3
    assert result.ttft_ms is not None and result.e2e_ms is not None
    assert result.ttft_ms.p50 < result.e2e_ms.p50


def test_queueing_beyond_max_batch_is_served(triton: RealTriton) -> None:
    result = asyncio.run(run_load(spec(triton, concurrency=3 * MAX_BATCH, requests=12,
                                       output_tokens=4, warmup=0)))  # fmt: skip
    assert (result.requests, result.errors) == (12, 0), result.error_samples


def test_request_rate_mode_completes_every_request(triton: RealTriton) -> None:
    load = spec(triton, request_rate=50.0, concurrency=None, requests=8, warmup=0, output_tokens=4)
    result = asyncio.run(run_load(load))
    assert (result.requests, result.errors) == (8, 0), result.error_samples


def test_health_and_the_model_config_triton_loaded(triton: RealTriton) -> None:
    async def check() -> None:
        async with InferenceServerClient(triton.url) as client:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("llm")
            assert not await client.is_model_ready("other")
            meta = await client.get_model_metadata("llm")
            assert {"text_input", "sampling_param_max_tokens", "streaming"} <= {
                i.name for i in meta.inputs
            }
            assert "text_output" in {o.name for o in meta.outputs}
            cfg = (await client.get_model_config("llm")).config
            assert cfg.model_transaction_policy.decoupled
            assert cfg.backend == "python"

    asyncio.run(check())


def test_streams_one_response_per_token_and_triton_flags_the_last(
    triton: RealTriton, infer_input: Any, one: Any
) -> None:
    text = infer_input("text_input", "BYTES", np.array([b"a b c d"], dtype=np.object_))
    max_tokens = infer_input("sampling_param_max_tokens", "INT32", np.array([3], dtype=np.int32))
    streaming = infer_input("streaming", "BOOL", np.array([True], dtype=bool))
    request: dict[str, Any] = {
        "model_name": "llm",
        "inputs": [text, max_tokens, streaming],
        "request_id": "r1",
    }
    finals: list[bool] = []
    texts: list[bytes] = []

    async def read() -> None:
        async with InferenceServerClient(triton.url) as client:
            async for result, error in client.stream_infer(one(request)):
                assert error is None, error
                response = result.get_response()
                assert response.id == "r1"
                texts.append(result.as_numpy("text_output")[0])
                finals.append(response.parameters["triton_final_response"].bool_param)
                if finals[-1]:
                    break

    asyncio.run(read())
    assert finals == [False, False, True]  # the flag as Triton itself sets it
    # The text so far in every response, as the LLM-API model sends `output.text`.
    assert [len(t.split()) for t in texts] == [1, 2, 3]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))


def test_undeclared_input_is_rejected_by_triton(
    triton: RealTriton, infer_input: Any, one: Any
) -> None:
    text = infer_input("text_input", "BYTES", np.array([b"hello"], dtype=np.object_))
    bogus = infer_input("bogus", "INT32", np.array([1], dtype=np.int32))

    async def send() -> object:
        async with InferenceServerClient(triton.url) as client:
            stream = client.stream_infer(one({"model_name": "llm", "inputs": [text, bogus]}))
            _, error = await anext(aiter(stream))
            stream.cancel()
            return error

    error = asyncio.run(send())
    assert error is not None and "bogus" in str(error)


def test_wrong_model_name_counts_every_request_as_an_error(triton: RealTriton) -> None:
    result = asyncio.run(run_load(spec(triton, model="no-such-model", warmup=0, requests=5)))
    assert (result.requests, result.errors) == (0, 5)
    assert result.error_samples and "no-such-model" in result.error_samples[0]
    assert result.ttft_ms is None


def bench(server: RealTriton, *extra: str) -> list[str]:
    return [
        "bench", "--url", server.url, "--model", "llm", "--concurrency", str(MAX_BATCH),
        "--requests", "8", "--input-tokens", "32", "--output-tokens", "6", *extra,
    ]  # fmt: skip


def test_bench_json_against_the_real_server(cli: CliRunner, triton: RealTriton) -> None:
    result = cli.invoke(app, bench(triton, "--warmup", str(MAX_BATCH), "--json"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["requests"], data["errors"]) == (8, 0)
    assert data["output_tokens"] == 8 * 6
    assert data["itl_ms"]["count"] == 8 and data["token_gap_ms"]["count"] == 8 * 5
    assert data["output_tokens_per_s"] > 0


def test_bench_names_a_model_the_real_server_does_not_serve(
    cli: CliRunner, triton: RealTriton
) -> None:
    args = bench(triton)
    args[args.index("llm")] = "nope"
    result = cli.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: --model 'nope': not served at")


def test_the_liveness_probe_gets_a_token_from_the_real_server(triton: RealTriton) -> None:
    """The serving pod's liveness command (runtime/triton.py, liveness_argv) against Triton's
    generate endpoint: exit 0 while the model can generate."""
    argv = liveness_argv(triton.http, timeout_s=30)
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
