"""Counting the tokens a streamed response carries, and which responses infertune's model sends
(pure: KServe v2 protobufs built here, no server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from infertune_tuner.harness.tokens import TokenSource, count
from infertune_tuner.triton_model.responses import ResponsePlan, Send

Tensor = service_pb2.ModelInferResponse.InferOutputTensor


def response(**outputs: np.ndarray[Any, Any]) -> Any:
    """A ModelInferResponse with `text_output` and the given INT32 outputs, as raw contents."""
    r = service_pb2.ModelInferResponse(model_name="llm", id="1")
    r.outputs.append(Tensor(name="text_output", datatype="BYTES", shape=[1]))
    r.raw_output_contents.append(b"\x04\x00\x00\x00 tok")
    for name, value in outputs.items():
        r.outputs.append(Tensor(name=name, datatype="INT32", shape=list(value.shape)))
        r.raw_output_contents.append(value.astype("<i4").tobytes())
    return r


def test_the_model_metadata_decides_where_counts_come_from() -> None:
    negotiate = TokenSource.negotiate
    assert negotiate({"return_num_output_tokens"}, {"num_output_tokens", "output_ids"}) is (
        TokenSource.NUM_OUTPUT_TOKENS
    )
    # the count without the input that asks for it: the ids
    assert negotiate(set(), {"num_output_tokens", "output_ids"}) is TokenSource.OUTPUT_IDS
    # TensorRT-LLM's LLM-API model: text and reasons only
    llmapi = {"text_output", "finish_reason", "stop_reason", "cumulative_logprob"}
    assert negotiate({"text_input"}, llmapi) is TokenSource.RESPONSES


def test_counts_come_from_what_each_response_says() -> None:
    counted = response(num_output_tokens=np.array([3]))
    assert count(counted, TokenSource.NUM_OUTPUT_TOKENS) == 3
    # output_ids [1, beams, tokens], shorter beams padded with -1: the first beam's tokens
    ids = np.array([[[11, 12, -1], [21, 22, 23]]])
    assert count(response(output_ids=ids), TokenSource.OUTPUT_IDS) == 2
    assert count(response(output_ids=np.array([[5, 6, 7, 8]])), TokenSource.OUTPUT_IDS) == 4
    assert count(response(), TokenSource.RESPONSES) == 1
    # declared but left out: the caller counts one and says so
    assert count(response(), TokenSource.NUM_OUTPUT_TOKENS) is None


def test_an_empty_final_response_carries_no_token() -> None:
    empty = service_pb2.ModelInferResponse(model_name="llm", id="1")
    empty.parameters["triton_final_response"].bool_param = True
    for source in TokenSource:
        assert count(empty, source) == 0


def sends(plan: ResponsePlan, tokens: int) -> list[Send]:
    return [s for n in range(1, tokens + 1) for s in plan.on_token(n, n == tokens)]


def test_a_stream_interval_sends_the_first_token_then_every_kth_then_the_rest() -> None:
    out = sends(ResponsePlan(interval=3), 8)
    assert [s.tokens for s in out] == [1, 3, 3, 1]
    assert [s.final for s in out] == [False, False, False, True]
    assert [(s.text_from, s.text_to) for s in out] == [(0, 1), (0, 4), (0, 7), (0, 8)]  # cumul.
    delta = sends(ResponsePlan(interval=3, text="delta"), 8)
    assert [(s.text_from, s.text_to) for s in delta] == [(0, 1), (1, 4), (4, 7), (7, 8)]


@pytest.mark.parametrize(
    ("signal", "finals"),
    [("flagged", [False, True]), ("empty", [False, False, True]), ("none", [False, False])],
)
def test_how_a_model_ends_a_request(signal: Any, finals: list[bool]) -> None:
    plan = ResponsePlan(signal=signal)
    out = sends(plan, 2)
    assert [s.final for s in out] == finals
    assert sum(s.tokens for s in out) == 2
    if signal == "empty":
        assert out[-1].tokens == 0  # the final flag alone
    assert plan.holds_open is (signal == "none")


def test_without_streaming_one_final_response_carries_everything() -> None:
    out = sends(ResponsePlan(streaming=False, signal="none"), 5)
    assert out == [Send(5, 0, 5, True)]
