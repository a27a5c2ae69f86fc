"""What real servers do, against a real `tritonserver` (the nvidia-pytriton wheel): infertune's
Python-backend model told by body.json and model.yaml to behave as other servers do.

One server holds five models: `llm` (the model as trials run it, for the request-rate soak),
`eos` (every request stops after 4 tokens and ends with the final flag alone: Triton's empty
final response), `stuck` (stops after 3 tokens and never completes the request), `chunky`
(three tokens per response, `stream_interval: 3`, with the engine model's `num_output_tokens`
declared) and `chunky_uncounted` (the same without a count). These tests never skip.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tritonclient.grpc.aio import InferenceServerClient

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.engine import modelled_steady_state
from infertune_tuner.harness.loadgen import LoadSpec, run_load
from infertune_tuner.harness.prompts import RequestTemplate
from infertune_tuner.harness.protocol import EMPTY_FINAL, Stream, is_final, open_channel
from infertune_tuner.harness.runner import ServerProcess, free_ports, wait_ready
from infertune_tuner.harness.tokens import TokenSource
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import SERVED_MODEL, Ports
from infertune_tuner.runtime.local_triton import MODEL_PY, LocalTritonRuntime
from infertune_tuner.search.evidence import judge
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.triton_model.responses import ResponsePlan

BATCH = 4
CONFIG = TrialConfig(1, BATCH, "fp8", "auto")
SOAK_CONFIG = TrialConfig(1, 8, "fp8", "auto")
OUTPUT = 24
# llama-3-8b fp8 on an H100 at batch 4: a decode step of ~5.6 ms at scale 1. The stuck model's
# steps are ~40x longer, so the stall bound's 1 s floor is a few of its steps.
STUCK_SCALE = 40.0
BEHAVIOURS: dict[str, dict[str, Any]] = {
    "eos": {"time_scale": 2.0, "stop_after": 4, "stop_signal": "empty"},
    "stuck": {"time_scale": STUCK_SCALE, "stop_after": 3, "stop_signal": "none"},
    "chunky": {"time_scale": 2.0},
    "chunky_uncounted": {"time_scale": 2.0},
}
COUNT_INPUT = '  {\n    name: "return_num_output_tokens"\n    data_type: TYPE_BOOL\n' + (
    "    dims: [ 1 ]\n    optional: true\n  }"
)
COUNT_OUTPUT = '  {\n    name: "num_output_tokens"\n    data_type: TYPE_INT32\n    dims: [ 1 ]\n  }'


@dataclass(frozen=True)
class Server:
    url: str
    metrics: int
    request: TuningRequest


def _model(repo: Path, name: str, files: dict[str, str], **behaviour: Any) -> None:
    """Model `name` in `repo` from the runtime's files of `llm`, with body.json's `behaviour`."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    config = files[f"{SERVED_MODEL}/config.pbtxt"].replace(
        f'name: "{SERVED_MODEL}"', f'name: "{name}"'
    )
    llm = yaml.safe_load(files[f"{SERVED_MODEL}/1/model.yaml"])
    if name.startswith("chunky"):
        llm["stream_interval"] = 3
    if name == "chunky":  # the engine model's count, as upstream's config.pbtxt declares it
        head, outputs = config.split("\n]\noutput [\n")
        config = f"{head},\n{COUNT_INPUT}\n]\noutput [\n{outputs.rstrip().removesuffix(']')}"
        config = config.rstrip() + f",\n{COUNT_OUTPUT}\n]\n"
    body = json.loads(files[f"{SERVED_MODEL}/1/body.json"])
    body.update(behaviour)
    (repo / name / "config.pbtxt").write_text(config, encoding="utf-8")
    (version / "model.yaml").write_text(yaml.safe_dump(llm), encoding="utf-8")
    (version / "body.json").write_text(json.dumps(body), encoding="utf-8")
    shutil.copy2(MODEL_PY, version / "model.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, trial_request: Any) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("behaviours")
    request = trial_request(input_tokens=32, output_tokens=OUTPUT)
    runtime = LocalTritonRuntime()
    repo = folder / "model_repo"
    _model(repo, SERVED_MODEL, runtime.model_files(request, SOAK_CONFIG))
    files = runtime.model_files(request, CONFIG)
    for name, behaviour in BEHAVIOURS.items():
        _model(repo, name, files, **behaviour)
    runtime.assemble(repo)
    ports = Ports(*free_ports(3))
    argv = runtime.launch_argv(request, CONFIG, repo_dir=str(repo), ports=ports, host="127.0.0.1")
    proc = ServerProcess.start(argv, folder / "server.log")
    url = f"127.0.0.1:{ports.grpc}"
    try:
        for name in (SERVED_MODEL, *BEHAVIOURS):
            failure = asyncio.run(wait_ready(proc, url, name, 120))
            assert failure is None, f"{name}: {failure}\n{proc.log_text()[-3000:]}"
        yield Server(url, ports.metrics, request)
    finally:
        proc.stop()


def load(server: Server, model: str, **kw: Any) -> LoadSpec:
    base: dict[str, Any] = {
        "url": server.url, "model": model, "concurrency": BATCH, "requests": 8,
        "input_tokens": 32, "output_tokens": OUTPUT, "warmup": BATCH, "connect_timeout_s": 5.0,
    }  # fmt: skip
    return LoadSpec(**{**base, **kw})


def modelled_itl_ms(server: Server, scale: float) -> float:
    req = server.request
    known = modelled_steady_state(
        req.resolve_model(), req.resolve_gpu(), CONFIG, Workload(32, OUTPUT),
        concurrency=BATCH, requests=8, warmup=BATCH,
    )  # fmt: skip
    assert known.itl_ms is not None
    return known.itl_ms.p50 * scale


# ------------------------------------------------------------------ the end of a request


def _first_request(server: Server, model: str, opt_in: bool) -> Any:
    async def build() -> Any:
        async with InferenceServerClient(server.url) as client:
            meta = await client.get_model_metadata(model)
        request = RequestTemplate.from_metadata(meta, 0).build(0, 0, 8, OUTPUT, model)
        if not opt_in:
            del request.parameters[EMPTY_FINAL]
        return request

    return asyncio.run(build())


@pytest.mark.parametrize("opt_in", [True, False])
def test_triton_sends_the_empty_final_response_only_to_a_request_that_opts_in(
    server: Server, opt_in: bool
) -> None:
    request = _first_request(server, "eos", opt_in)

    async def read() -> tuple[int, bool]:
        channel = open_channel(server.url)
        stream = Stream(channel)
        try:
            await stream.send(request)
            tokens = 0
            while True:
                try:  # nothing more within ~180 of the model's steps: Triton sent nothing
                    message = await asyncio.wait_for(stream.receive(), 2.0)
                except TimeoutError:
                    return tokens, False
                response = message.infer_response
                tokens += 1 if response.outputs else 0
                if is_final(response):
                    assert not response.outputs  # the flag alone: an empty final response
                    return tokens, True
        finally:
            stream.cancel()
            await channel.close()

    tokens, ended = asyncio.run(read())
    assert tokens == 4  # the model stopped early (stop_after), its last token unflagged
    assert ended is opt_in


def test_an_early_stop_ends_each_request_on_its_empty_final_response(server: Server) -> None:
    result = asyncio.run(run_load(load(server, "eos")))
    assert (result.requests, result.errors, result.stalled) == (8, 0, 0), result.error_samples
    assert result.output_tokens_mean == 4
    assert result.short_output == pytest.approx(1 - 4 / OUTPUT)
    assert "stopped" not in result.settings


def test_a_model_that_never_completes_a_request_stalls_it_short_within_a_few_steps(
    server: Server,
) -> None:
    result = asyncio.run(run_load(load(server, "stuck")))
    assert (result.requests, result.errors, result.stalled) == (0, 0, 8)
    assert result.stalled_tokens == (3, 3)
    assert "stopped" not in result.settings  # the 600 s request timeout never came into it
    note = result.stall_note()
    assert note is not None and "8 of 8 requests stalled" in note and "not a valid" in note
    # The bound comes from the run's own pace: a few of the model's steps, not the timeout.
    bound_ms = result.stream.stall_bound_s * 1e3 if result.stream.stall_bound_s else 0.0
    assert 0 < bound_ms < 12 * modelled_itl_ms(server, STUCK_SCALE)
    assert result.to_json()["stalled"] == 8


# ------------------------------------------------------------------ tokens per response


def test_responses_of_several_tokens_are_counted_from_num_output_tokens(server: Server) -> None:
    counted = asyncio.run(run_load(load(server, "chunky")))
    assert (counted.requests, counted.errors) == (8, 0), counted.error_samples
    assert counted.stream.token_source is TokenSource.NUM_OUTPUT_TOKENS
    assert not counted.stream.one_per_response and counted.token_note() is None
    assert counted.output_tokens == 8 * OUTPUT and counted.short_output is None
    assert counted.token_gap_ms is not None and counted.token_gap_ms.count == 8 * (OUTPUT - 1)

    uncounted = asyncio.run(run_load(load(server, "chunky_uncounted")))
    plan = ResponsePlan(interval=3)
    responses = sum(1 for n in range(1, OUTPUT + 1) for s in plan.on_token(n, n == OUTPUT))
    assert uncounted.stream.token_source is TokenSource.RESPONSES
    assert uncounted.output_tokens == 8 * responses  # undercounted, and the run says so
    assert uncounted.stream.one_per_response
    assert uncounted.to_json()["one_token_per_response_assumed"] is True
    assert "one per response" in (uncounted.token_note() or "")
    # The same streams: counted per response, ITL comes out (tokens - 1) / (responses - 1) high.
    assert counted.itl_ms is not None and uncounted.itl_ms is not None
    ratio = uncounted.itl_ms.p50 / counted.itl_ms.p50
    assert ratio == pytest.approx((OUTPUT - 1) / (responses - 1), rel=0.25)


# ------------------------------------------------------------------ request-rate soak


def test_request_rate_soak_500_requests_no_stuck_stream(server: Server) -> None:
    spec = load(
        server, SERVED_MODEL, request_rate=40.0, concurrency=None, requests=500, warmup=10,
        input_tokens=32, output_tokens=8,
    )  # fmt: skip
    result = asyncio.run(run_load(spec))
    assert (result.requests, result.errors, result.stalled) == (500, 0, 0), result.error_samples
    assert result.stream.streams_cancelled == 0  # every stream ended after its final response
    assert "stopped" not in result.settings
    url = f"http://127.0.0.1:{server.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counters = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    model = f'model="{SERVED_MODEL}",version="1"'
    assert counters[f"nv_inference_request_success{{{model}}}"] == 510
    assert counters.get(f"nv_inference_pending_request_count{{{model}}}", 0) == 0


# ------------------------------------------------------------------ the trial


@dataclass(frozen=True)
class Behaving(LocalTritonRuntime):
    """The local runtime with body.json keys of its own (spec.py: other servers' behaviours)."""

    behaviour: tuple[tuple[str, Any], ...] = ()

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        files = super().model_files(request, config)
        key = f"{SERVED_MODEL}/1/body.json"
        files[key] = json.dumps({**json.loads(files[key]), **dict(self.behaviour)})
        return files


def trial(tmp_path: Path, request: TuningRequest, **behaviour: Any) -> Any:
    scale = behaviour.pop("time_scale")
    runtime = Behaving(time_scale=scale, behaviour=tuple(behaviour.items()))
    backend = TritonBackend(
        request, runtime=runtime, workdir=tmp_path, startup_timeout_s=90, requests_per_trial=8,
        warmup=BATCH,
    )  # fmt: skip
    return backend.run(CONFIG), backend


def test_a_trial_whose_streams_stall_is_invalid(tmp_path: Path, trial_request: Any) -> None:
    m, _ = trial(tmp_path, trial_request(output_tokens=OUTPUT), **BEHAVIOURS["stuck"])
    assert m.status == "invalid"
    assert "stalled" in str(m.reason) and "without a final response" in str(m.reason)


def test_a_trial_that_stops_early_is_judged_invalid(tmp_path: Path, trial_request: Any) -> None:
    request = trial_request(output_tokens=OUTPUT)
    m, backend = trial(tmp_path, request, **BEHAVIOURS["eos"])
    assert m.status == "ok" and m.output_tokens_mean == 4
    s = SearchSettings()
    verdict = judge(
        m, CONFIG, model=request.resolve_model(), gpu=request.resolve_gpu(),
        output_tokens=OUTPUT, margin=s.plausible_margin, short_output=s.short_output,
        speedup=backend.speedup,
    )  # fmt: skip
    assert verdict.status == "invalid" and "stopped early" in str(verdict.reason)


def test_inputs_are_sent_in_the_types_the_model_declares(server: Server) -> None:
    request = _first_request(server, "chunky", opt_in=True)
    names = [t.name for t in request.inputs]
    assert "return_num_output_tokens" in names
    raw = request.raw_input_contents[names.index("sampling_param_max_tokens")]
    assert np.frombuffer(raw, dtype="<i4").tolist() == [OUTPUT]
