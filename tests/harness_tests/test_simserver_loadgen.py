"""The load generator against the simulated Triton server, end to end over real gRPC on 127.0.0.1.

Only ITL is checked against bounds: the client's ITL against the server's own timestamps (5 %:
the harness must measure what the server did, however busy the machine), and the server's
against the model it runs on (20 %: a loaded machine oversleeps its steps). Nothing else depends
on wall-clock speed.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from tritonclient.grpc.aio import InferenceServerClient

from infertune_tuner.config import Workload
from infertune_tuner.errors import InputError
from infertune_tuner.harness.engine import modelled_steady_state
from infertune_tuner.harness.loadgen import LoadSpec, ServerUnreachable, run_load
from infertune_tuner.harness.runner import free_port
from infertune_tuner.harness.simserver import SimServer, SimServerConfig, build_config

SCALE = 1.0  # llama-3-8b fp8 on H100 at batch 8: ~11 ms per decode step


def config(max_batch: int = 8, scale: float = SCALE, served: str = "llm") -> SimServerConfig:
    """llama-3-8b fp8 on H100 (time scale `scale`), on free ports of 127.0.0.1."""
    return build_config(
        model="llama-3-8b", gpu="H100-SXM-80GB", tp=1, max_batch=max_batch, quant="fp8",
        time_scale=scale, host="127.0.0.1", port=0, http_port=0, served_model=served,
    )  # fmt: skip


@pytest.fixture
async def server() -> AsyncIterator[SimServer]:
    async with SimServer(config()) as srv:
        yield srv


def spec(srv: SimServer, **kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "url": f"127.0.0.1:{srv.port}", "model": "llm", "concurrency": 8, "requests": 16,
        "input_tokens": 128, "output_tokens": 24, "warmup": 2, "connect_timeout_s": 5.0,
    }  # fmt: skip
    base.update(kw)
    return LoadSpec(**base)  # type: ignore[arg-type]


async def test_closed_loop_measures_the_modelled_itl(server: SimServer) -> None:
    result = await run_load(spec(server))
    cfg = server.cfg
    model = modelled_steady_state(
        cfg.model, cfg.gpu, cfg.config, Workload(128, 24), concurrency=8, requests=16
    )
    assert result.errors == 0, result.error_samples
    assert result.requests == 16  # exactly the measured requests; warm-up left out
    assert result.output_tokens == 16 * 24
    assert result.itl_ms is not None and model.itl_ms is not None
    assert result.server_e2e_ms is not None and result.server_ttft_ms is not None
    served_itl = (result.server_e2e_ms.p50 - result.server_ttft_ms.p50) / (24 - 1)
    assert result.itl_ms.p50 == pytest.approx(served_itl, rel=0.05)
    assert served_itl == pytest.approx(model.itl_ms.p50 * SCALE, rel=0.20)
    assert result.ttft_ms is not None and result.e2e_ms is not None
    assert result.ttft_ms.p50 < result.e2e_ms.p50
    assert result.output_tokens_per_s > 0 and result.duration_s > 0


async def test_wrong_model_name_counts_every_request_as_an_error(server: SimServer) -> None:
    result = await run_load(spec(server, model="no-such-model", warmup=0, requests=5))
    assert result.requests == 0
    assert result.errors == 5
    assert any("unknown model" in e for e in result.error_samples)
    assert result.ttft_ms is None


async def test_request_rate_mode_completes_every_request(server: SimServer) -> None:
    result = await run_load(
        spec(server, request_rate=400.0, concurrency=None, requests=12, warmup=0)
    )
    assert (result.requests, result.errors) == (12, 0)


async def test_queueing_beyond_max_batch_is_served() -> None:
    async with SimServer(config(max_batch=2, scale=0.1)) as srv:
        result = await run_load(spec(srv, concurrency=6, requests=12, output_tokens=4))
    assert (result.requests, result.errors) == (12, 0)


async def test_unreachable_server_raises_before_sending() -> None:
    port = free_port()
    with pytest.raises(ServerUnreachable, match="cannot reach"):
        await run_load(LoadSpec(url=f"127.0.0.1:{port}", model="llm", connect_timeout_s=1.0))


def test_invalid_spec_is_an_input_error() -> None:
    with pytest.raises(InputError):
        LoadSpec(url="x:1", model="llm", requests=0).validate()


async def test_health_metadata_and_config(server: SimServer) -> None:
    async with InferenceServerClient(f"127.0.0.1:{server.port}") as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready("llm")
        assert not await client.is_model_ready("other")
        meta = await client.get_model_metadata("llm")
        assert {"text_input", "input_ids", "sampling_param_max_tokens"} <= {
            i.name for i in meta.inputs
        }
        cfg = await client.get_model_config("llm")
        assert cfg.config.model_transaction_policy.decoupled
        assert cfg.config.max_batch_size == 0
        assert cfg.config.parameters["max_batch_size"].string_value == "8"
    async with aiohttp.ClientSession() as http:
        for path in ("/v2/health/live", "/v2/health/ready"):
            async with http.get(f"http://127.0.0.1:{server.http_port}{path}") as resp:
                assert resp.status == 200


async def test_streams_one_response_per_token_and_flags_the_last(
    server: SimServer, infer_input: Any, one: Any
) -> None:
    text = infer_input("text_input", "BYTES", np.array([b"a b c d"], dtype=np.object_))
    max_tokens = infer_input("sampling_param_max_tokens", "INT32", np.array([3], dtype=np.int32))
    request = {"model_name": "llm", "inputs": [text, max_tokens], "request_id": "r1"}

    finals, texts = [], []
    async with InferenceServerClient(f"127.0.0.1:{server.port}") as client:
        async for result, error in client.stream_infer(one(request)):
            assert error is None
            response = result.get_response()
            assert response.id == "r1"
            texts.append(result.as_numpy("text_output")[0])
            finals.append(response.parameters["triton_final_response"].bool_param)
    assert finals == [False, False, True]
    # Cumulative text, as NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/
    # model.py sends it (`output.text` of each streamed RequestOutput): each response repeats the
    # text so far and adds the new token.
    assert [len(t.split()) for t in texts] == [1, 2, 3]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))


async def test_output_tokens_are_responses_not_words_of_a_cumulative_text(
    server: SimServer,
) -> None:
    """A client that tokenized every response of the cumulative stream would count
    1 + 2 + ... + 24 = 300 tokens per request; it is 24."""
    result = await run_load(spec(server, requests=4, concurrency=4, warmup=0))
    assert result.output_tokens == 4 * 24
    assert result.short_output is None


async def test_a_frozen_server_costs_one_timeout_and_the_run_says_why() -> None:
    # A step of ~1e4 s: requests are admitted and never answered, as a hung engine's would be.
    async with SimServer(config(scale=1e6)) as frozen:
        result = await run_load(spec(frozen, concurrency=4, requests=40, warmup=0,
                                     request_timeout_s=0.5))  # fmt: skip
    assert result.requests == 0 and result.errors == 4  # the first wave only, no further waves
    assert "timed out" in result.settings["stopped"]
    async with SimServer(config(scale=1e6)) as frozen:
        result = await run_load(spec(frozen, concurrency=4, requests=40, warmup=0,
                                     request_timeout_s=60, deadline_s=0.5))  # fmt: skip
    assert (result.requests, result.errors) == (0, 4)  # in flight at the deadline, not 60 s
    assert "deadline" in result.settings["stopped"]
    assert result.error_samples and all("deadline" in e for e in result.error_samples)


async def test_undeclared_inputs_are_rejected_like_triton(
    server: SimServer, infer_input: Any, one: Any
) -> None:
    text = infer_input("text_input", "BYTES", np.array([b"hello"], dtype=np.object_))
    bogus = infer_input("bogus", "INT32", np.array([1], dtype=np.int32))

    async with InferenceServerClient(f"127.0.0.1:{server.port}") as client:
        stream = client.stream_infer(one({"model_name": "llm", "inputs": [text, bogus]}))
        _, error = await anext(aiter(stream))
        stream.cancel()
    assert error is not None and "unexpected inference input 'bogus'" in str(error)


def test_bad_simserver_input_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown model"):
        build_config(model="gpt-17", gpu="H100-SXM-80GB", tp=1, max_batch=8, quant="fp8")
    with pytest.raises(InputError, match="unknown GPU"):
        build_config(model="llama-3-8b", gpu="Z9000", tp=1, max_batch=8, quant="fp8")
    with pytest.raises(InputError, match="does not support fp8"):
        build_config(model="llama-3-8b", gpu="A100-SXM-80GB", tp=1, max_batch=8, quant="fp8")
    with pytest.raises(InputError, match="tensor parallel"):
        build_config(model="llama-3-8b", gpu="H100-SXM-80GB", tp=3, max_batch=8, quant="fp8")
