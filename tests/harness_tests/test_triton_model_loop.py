"""The Python-backend model's batching loop, without Triton: what a client of the model sees."""

from __future__ import annotations

import threading
from typing import Any

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import get_model
from infertune_tuner.config import TrialConfig
from infertune_tuner.harness.engine import Engine, Sequence
from infertune_tuner.triton_model.loop import ServingLoop, SimulatedBody


class Client:
    def __init__(self) -> None:
        self.tokens: dict[Any, list[tuple[int, bool]]] = {}
        self.errors: dict[Any, str] = {}
        self.done = threading.Semaphore(0)

    def token(self, seq: Sequence, final: bool) -> None:
        self.tokens.setdefault(seq.handle, []).append((seq.generated, final))
        assert seq.first_token_s is not None and seq.first_token_s >= seq.received_s
        if final:
            self.done.release()

    def error(self, handle: Any, message: str) -> None:
        self.errors[handle] = message
        self.done.release()


def loop(max_batch: int = 4, time_scale: float = 0.01) -> tuple[ServingLoop, Client]:
    cfg = TrialConfig(1, max_batch, "bf16", "auto")
    engine = Engine.for_config(get_model("llama-3-8b"), get_gpu("H100-SXM-80GB"), cfg, time_scale)
    client = Client()
    return ServingLoop(engine, SimulatedBody(), client.token, client.error).start(), client


def test_every_request_gets_its_tokens_one_per_step_and_one_final() -> None:
    serving, client = loop(max_batch=4)
    try:
        for i in range(10):  # more requests than the batch holds: the rest wait their turn
            serving.submit(i, 32, 5 + i % 3)
        for _ in range(10):
            assert client.done.acquire(timeout=30)
    finally:
        serving.stop()
    assert not client.errors
    for i in range(10):
        want = 5 + i % 3
        assert client.tokens[i] == [(n, n == want) for n in range(1, want + 1)]
    assert serving.engine.steps_run > 0 and serving.failure is None


def test_a_request_the_cache_can_never_hold_is_an_error_not_a_hang() -> None:
    serving, client = loop()
    try:
        serving.submit("huge", 10_000_000, 8)
        serving.submit("fine", 16, 2)
        for _ in range(2):
            assert client.done.acquire(timeout=30)
    finally:
        serving.stop()
    assert "more than the cache holds" in client.errors["huge"]
    assert client.tokens["fine"][-1] == (2, True)


class BrokenBody(SimulatedBody):
    def step(self, engine: Engine, admitted: list[Any]) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_body_that_breaks_fails_every_request_in_flight_with_its_reason(
    capfd: Any,
) -> None:
    cfg = TrialConfig(1, 2, "bf16", "auto")
    engine = Engine.for_config(get_model("llama-3-8b"), get_gpu("H100-SXM-80GB"), cfg)
    client = Client()
    serving = ServingLoop(engine, BrokenBody(), client.token, client.error)
    for i in range(3):
        serving.submit(i, 16, 4)
    serving.start()
    for _ in range(3):
        assert client.done.acquire(timeout=30)
    serving.submit("late", 16, 4)  # after the failure: answered at once, never left waiting
    assert client.done.acquire(timeout=5)
    serving.stop()
    assert set(client.errors) == {0, 1, 2, "late"}
    assert all("illegal memory access" in m for m in client.errors.values())
    assert "RuntimeError: CUDA error" in capfd.readouterr().err  # the traceback, for the log


def test_a_request_whose_answer_cannot_be_sent_still_gets_an_error() -> None:
    """The failure that hung a real trial: sending the final response raised in the loop."""
    cfg = TrialConfig(1, 2, "bf16", "auto")
    engine = Engine.for_config(get_model("llama-3-8b"), get_gpu("H100-SXM-80GB"), cfg, 0.01)
    client = Client()

    def token(seq: Sequence, final: bool) -> None:
        if final:
            raise TypeError("incompatible constructor arguments")
        client.token(seq, final)

    serving = ServingLoop(engine, SimulatedBody(), token, client.error).start()
    for i in range(3):
        serving.submit(i, 16, 3)
    for _ in range(3):
        assert client.done.acquire(timeout=30)
    serving.stop()
    assert set(client.errors) == {0, 1, 2}
    assert all("incompatible constructor" in m for m in client.errors.values())


def test_the_model_reads_its_stream_interval_and_behaviour_and_refuses_unknown_ones(
    tmp_path: Any, trial_request: Any
) -> None:
    import json

    import pytest
    import yaml

    from infertune_tuner.runtime.local_triton import LocalTritonRuntime
    from infertune_tuner.triton_model.spec import read

    files = LocalTritonRuntime().model_files(trial_request(), TrialConfig(1, 4, "fp8", "auto"))
    version = tmp_path / "1"
    version.mkdir()
    llm = yaml.safe_load(files["llm/1/model.yaml"])
    body = json.loads(files["llm/1/body.json"])
    (version / "model.yaml").write_text(yaml.safe_dump(llm))
    (version / "body.json").write_text(json.dumps(body))
    served = read(version)  # as rendered for TensorRT-LLM: one response per token, flagged
    assert (served.stream_interval, served.spec.stop_signal, served.spec.stop_after) == (
        1, "flagged", None,
    )  # fmt: skip
    (version / "model.yaml").write_text(yaml.safe_dump({**llm, "stream_interval": 4}))
    (version / "body.json").write_text(json.dumps({**body, "stop_after": 2, "text_mode": "delta"}))
    served = read(version)
    assert (served.stream_interval, served.spec.stop_after, served.spec.text_mode) == (
        4, 2, "delta",
    )  # fmt: skip
    (version / "body.json").write_text(json.dumps({**body, "stop_signal": "sometimes"}))
    with pytest.raises(ValueError, match="stop_signal must be one of flagged, empty, none"):
        read(version)
