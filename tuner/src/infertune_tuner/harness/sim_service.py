"""The simulated server's KServe v2 gRPC service: Triton's protocol, the engine's timing.

One decoupled model shaped like TensorRT-LLM's LLM-API Triton model (`text_input` in,
`text_output` out, `streaming`, `sampling_param_max_tokens`, plus `input_ids` and `max_tokens`);
requests are decoded as Triton would validate them, scheduled by `engine.Engine` in ONE asyncio
loop, and answered one response per token, the last flagged `triton_final_response`. Each
response's `text_output` holds the text generated so far, as upstream's model.py sends it
(`output.text` of the LLM API's streamed RequestOutput is cumulative).
`simserver` runs it (see there for the server around it).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from infertune_tuner.harness.engine import Emitted, Engine
from infertune_tuner.harness.engine import Sequence as EngineSeq

if TYPE_CHECKING:
    from infertune_tuner.harness.simserver import SimServerConfig

DEFAULT_MAX_TOKENS = 128
SERVER_NAME = "triton"
SERVER_VERSION = "2.60.0-infertune-simserver"
RESYNC_S = 0.05  # a step that wakes this late restarts the clock instead of catching up
TOKEN = b" tok"  # the text of one generated token

# (name, KServe datatype, model-config type, dims, optional)
_INPUTS: tuple[tuple[str, str, int, tuple[int, ...], bool], ...] = (
    ("text_input", "BYTES", mc.TYPE_STRING, (-1,), False),
    ("input_ids", "INT32", mc.TYPE_INT32, (-1,), True),
    ("streaming", "BOOL", mc.TYPE_BOOL, (1,), True),
    ("sampling_param_max_tokens", "INT32", mc.TYPE_INT32, (1,), True),
    ("max_tokens", "INT32", mc.TYPE_INT32, (1,), True),
    ("sampling_param_exclude_input_from_output", "BOOL", mc.TYPE_BOOL, (1,), True),
)
_OUTPUTS: tuple[tuple[str, str, int, tuple[int, ...]], ...] = (
    ("text_output", "BYTES", mc.TYPE_STRING, (-1,)),
)
_INPUT_NAMES = {i[0] for i in _INPUTS}
_MAX_TOKEN_INPUTS = ("sampling_param_max_tokens", "max_tokens")


# ------------------------------------------------------------------------------ request decoding


class _BadRequest(Exception):
    pass


def _bytes_elements(raw: bytes) -> list[bytes]:
    out: list[bytes] = []
    i = 0
    while i + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, i)
        out.append(raw[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def _decode(request: pb.ModelInferRequest, served: str) -> tuple[int, int]:
    """(input tokens, max output tokens) of one request, as Triton would validate it."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise _BadRequest("raw_input_contents must be given for every input or for none")
    input_tokens: int | None = None
    text_tokens: int | None = None
    max_tokens: int | None = None
    for i, tensor in enumerate(request.inputs):
        if tensor.name not in _INPUT_NAMES:
            raise _BadRequest(f"unexpected inference input '{tensor.name}' for model '{served}'")
        count = 1
        for d in tensor.shape:
            count *= int(d)
        data = raw[i] if raw else None
        if tensor.name == "input_ids":
            input_tokens = count
        elif tensor.name == "text_input":
            if data is not None:
                texts = _bytes_elements(data)
            else:
                texts = list(tensor.contents.bytes_contents)
            text_tokens = sum(len(t.split()) for t in texts)
        elif tensor.name in _MAX_TOKEN_INPUTS:
            if data is not None:
                if len(data) < 4:
                    raise _BadRequest(f"input '{tensor.name}' holds no INT32 value")
                (value,) = struct.unpack_from("<i", data, 0)
            elif tensor.contents.int_contents:
                value = int(tensor.contents.int_contents[0])
            else:
                raise _BadRequest(f"input '{tensor.name}' holds no value")
            max_tokens = int(value)
    if text_tokens is None:
        raise _BadRequest(f"expected input 'text_input' for model '{served}'")
    tokens = input_tokens if input_tokens is not None else max(text_tokens, 1)
    return tokens, max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS


# ------------------------------------------------------------------------------ the gRPC service

_FINAL = object()


class _Stream:
    """Outgoing responses of one ModelStreamInfer call."""

    __slots__ = ("outstanding", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.outstanding = 0


@dataclass(eq=False, slots=True)
class _Handle:
    stream: _Stream
    token: pb.ModelStreamInferResponse
    request_id: str


def _unknown_model(name: str) -> str:
    return f"Request for unknown model: '{name}' is not found"


def _text_bytes(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


class SimTritonService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, cfg: SimServerConfig) -> None:
        self.cfg = cfg
        self.engine = Engine.for_config(cfg.model, cfg.gpu, cfg.config, cfg.time_scale)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    # -------------------------------------------------------------------- health and metadata
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    def _known(self, name: str, version: str) -> bool:
        return name == self.cfg.served_model and version in ("", "1")

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._known(request.name, request.version))

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        """The one model it serves, ready (what `infertune bench` lists for a wrong --model)."""
        index = pb.RepositoryIndexResponse.ModelIndex
        model = index(name=self.cfg.served_model, version="1", state="READY")
        return pb.RepositoryIndexResponse(models=[model])

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=["model_configuration"]
        )

    async def _require_known(
        self, name: str, version: str, context: grpc.aio.ServicerContext
    ) -> None:
        """Abort the call with NOT_FOUND, as Triton does, unless it names the served model."""
        if not self._known(name, version):
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown_model(name))

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        await self._require_known(request.name, request.version, context)
        tm = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.cfg.served_model,
            versions=["1"],
            platform="python",
            inputs=[tm(name=n, datatype=dt, shape=list(dims)) for n, dt, _, dims, _ in _INPUTS],
            outputs=[tm(name=n, datatype=dt, shape=list(dims)) for n, dt, _, dims in _OUTPUTS],
        )

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        await self._require_known(request.name, request.version, context)
        c = self.cfg.config
        config = mc.ModelConfig(
            name=self.cfg.served_model,
            backend="python",
            max_batch_size=0,  # the LLM-API model batches in the engine, not in Triton
            input=[
                mc.ModelInput(name=n, data_type=t, dims=list(d), optional=o)
                for n, _, t, d, o in _INPUTS
            ],
            output=[mc.ModelOutput(name=n, data_type=t, dims=list(d)) for n, _, t, d in _OUTPUTS],
            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
            instance_group=[mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)],
        )
        params = {
            "tensor_parallel_size": str(c.tp),
            "max_batch_size": str(c.max_batch_size),
            "quantization": c.quantization,
            "kv_cache_dtype": c.kv_cache_dtype,
            "model": self.cfg.model.key,
            "gpu": self.cfg.gpu.key,
        }
        for k, v in params.items():
            config.parameters[k].string_value = v
        return pb.ModelConfigResponse(config=config)

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        await self._require_known(request.model_name, request.model_version, context)
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            "ModelInfer RPC doesn't support models with decoupled transaction policy",
        )
        raise AssertionError("unreachable")  # abort raises

    # -------------------------------------------------------------------- streaming inference
    def _error(self, request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
        return pb.ModelStreamInferResponse(
            error_message=message,
            infer_response=pb.ModelInferResponse(
                model_name=request.model_name, model_version=request.model_version, id=request.id
            ),
        )

    def _token_response(self, request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        resp = pb.ModelInferResponse(model_name=self.cfg.served_model, model_version="1")
        resp.id = request.id
        out = resp.outputs.add()
        out.name = "text_output"
        out.datatype = "BYTES"
        out.shape.append(1)
        resp.raw_output_contents.append(_text_bytes(b""))
        resp.parameters["triton_final_response"].bool_param = False
        return pb.ModelStreamInferResponse(infer_response=resp)

    def _submit(self, request: pb.ModelInferRequest, stream: _Stream) -> None:
        received = time.monotonic()
        if not self._known(request.model_name, request.model_version):
            stream.queue.put_nowait(self._error(request, _unknown_model(request.model_name)))
            return
        try:
            input_tokens, max_tokens = _decode(request, self.cfg.served_model)
        except _BadRequest as exc:
            stream.queue.put_nowait(self._error(request, str(exc)))
            return
        handle = _Handle(stream, self._token_response(request), request.id)
        seq = EngineSeq(input_tokens, max_tokens, handle=handle, received_s=received)
        err = self.engine.submit(seq)
        if err is not None:
            stream.queue.put_nowait(self._error(request, err))
            return
        stream.outstanding += 1
        self._wake.set()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        stream = _Stream()
        reading = True

        async def read() -> None:
            nonlocal reading
            try:
                async for request in request_iterator:
                    self._submit(request, stream)
            finally:
                reading = False
                stream.queue.put_nowait(None)  # wake the writer

        reader = asyncio.create_task(read())
        try:
            while True:
                if not reading and stream.outstanding == 0 and stream.queue.empty():
                    break
                item = await stream.queue.get()
                if item is None:
                    continue
                if isinstance(item, tuple):  # (response, final)
                    response, final = item
                    if final:
                        stream.outstanding -= 1
                    yield response
                else:
                    yield item
        finally:
            reader.cancel()
            self._cancel_stream(stream)

    def _cancel_stream(self, stream: _Stream) -> None:
        for seq in (*self.engine.waiting, *self.engine.active):
            if isinstance(seq.handle, _Handle) and seq.handle.stream is stream:
                seq.cancelled = True

    # -------------------------------------------------------------------- the scheduler loop
    def _emit(self, emitted: list[Emitted], now_ns: int) -> None:
        for em in emitted:
            h = em.seq.handle
            if not isinstance(h, _Handle):
                continue
            response = pb.ModelStreamInferResponse()
            response.CopyFrom(h.token)
            response.infer_response.raw_output_contents[0] = _text_bytes(TOKEN * em.seq.generated)
            if em.final:
                params = response.infer_response.parameters
                params["triton_final_response"].bool_param = True
                params["infertune_received_ns"].int64_param = int(em.seq.received_s * 1e9)
                first = em.seq.first_token_s
                params["infertune_first_token_ns"].int64_param = int((first or 0.0) * 1e9)
                params["infertune_last_token_ns"].int64_param = now_ns
            h.stream.queue.put_nowait((response, em.final))

    async def run_scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        next_start: float | None = None
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                next_start = None
            now = loop.time()
            start = now if next_start is None or now - next_start > RESYNC_S else next_start
            duration, _ = self.engine.begin_step()
            end = start + duration
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            now_ns = time.monotonic_ns()
            self._emit(self.engine.end_step(now_ns / 1e9), now_ns)
            next_start = end

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self.run_scheduler())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
