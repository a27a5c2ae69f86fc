"""The KServe v2 gRPC stream (`ModelStreamInfer`) spoken with the protobuf stubs tritonclient
ships (`tritonclient.grpc.service_pb2`, `service_pb2_grpc`).

Why not `tritonclient.grpc.aio.InferenceServerClient.stream_infer`: every request must opt in to
Triton's empty final response (`triton_enable_empty_final_response`), and tritonclient refuses
`triton_`-prefixed request parameters (tritonclient/grpc/_utils.py `_get_inference_request`:
"is a reserved parameter and cannot be specified"); only the synchronous client's
`async_stream_infer(..., enable_empty_final_response=True)` sets it, straight on the protobuf
(tritonclient/grpc/_client.py). Triton's own documentation: triton-inference-server/server
docs/user_guide/decoupled_models.md, "Knowing When a Decoupled Inference Request is Complete".
Without the opt-in, a decoupled model that ends a request with the final flag alone
(`TRITONSERVER_RESPONSE_COMPLETE_FINAL` and no response: a model that finds out it is done after
sending its last token) sends the client nothing at all (server src/grpc/stream_infer_handler.cc:
`empty_final && enable_empty_final`), and the client waits for a final response that never comes.

A `Stream` is one gRPC call in the reader/writer style of `grpc.aio`: `send` writes a request,
`receive` reads the next response. `close` half-closes the call and reads it to its end, so the
server finishes the stream itself (Triton finishes a stream once the client is done writing and
no request on it is in flight: stream_infer_handler.cc `Finish`); only a stream whose end does
not come within the bound is cancelled. A request the client gives up on (timeout, stall) is
abandoned with `cancel`, which Triton passes on to the model as request cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

FINAL_FLAG = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
# As tritonclient's channel: messages up to the gRPC maximum (a long prompt is one message).
_MAX_MESSAGE = 2**31 - 1
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
)

ModelInferRequest = service_pb2.ModelInferRequest
ModelStreamInferResponse = service_pb2.ModelStreamInferResponse


def open_channel(url: str) -> grpc.aio.Channel:
    """An insecure gRPC channel to HOST:PORT (the load generator's streams share it)."""
    return grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)


def is_final(infer_response: Any) -> bool:
    """Whether Triton flagged this response the last of its request."""
    params = infer_response.parameters
    return FINAL_FLAG in params and bool(params[FINAL_FLAG].bool_param)


class Stream:
    """One `ModelStreamInfer` call: requests written, responses read, closed gracefully."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call: Any = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
        self.cancelled = False

    async def send(self, request: Any) -> None:
        await self._call.write(request)

    async def receive(self) -> Any | None:
        """The next `ModelStreamInferResponse`; None when the server ended the stream."""
        response = await self._call.read()
        return None if response is grpc.aio.EOF else response

    async def close(self, wait_s: float) -> bool:
        """Half-close and read the stream to its end (responses still due are dropped); cancel
        it when the end does not come within `wait_s`. True when it ended by itself."""
        try:
            async with asyncio.timeout(wait_s):
                await self._call.done_writing()
                while await self.receive() is not None:
                    pass
            return True
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            self.cancel()
            return False

    def cancel(self) -> None:
        """Abandon the stream and every request on it."""
        self.cancelled = True
        with contextlib.suppress(Exception):
            self._call.cancel()
