"""A simulated Triton Inference Server speaking the real KServe v2 gRPC protocol.

It serves one decoupled model (default name `llm`) shaped like TensorRT-LLM's LLM-API Triton model
(`text_input` in, `text_output` out, `streaming`, `sampling_param_max_tokens`), plus `input_ids`
and `max_tokens` for clients that send token ids or use the ensemble's name. Token timing comes
from the performance model through `engine.Engine` under continuous batching, in ONE asyncio
scheduler loop; responses stream one per token, the last one flagged with the
`triton_final_response` parameter exactly as Triton does for a decoupled model.

The final response also carries `infertune_received_ns`, `infertune_first_token_ns` and
`infertune_last_token_ns` (CLOCK_MONOTONIC) so a client on the same host can compare what it
measured with what the server did.

Minimal HTTP health endpoints (`/v2/health/live`, `/v2/health/ready`) answer on `http_port`, so
Kubernetes probes work as they do for Triton. When the memory model says the weights do not fit,
the server prints a CUDA-OOM-like message on stderr and exits 1 (as a real server would die).

The gRPC service itself is `sim_service`. Run it with `infertune simserver ...` or
`python -m infertune_tuner.cli.simserver ...` (the same command, `infertune_tuner.cli.simserver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, cast

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.catalog.llms import ModelArch, get_model
from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import MAX_BATCH_SIZE_LIMIT, TrialConfig
from infertune_tuner.errors import EXIT_INVALID, InputError
from infertune_tuner.harness.engine import oom_message
from infertune_tuner.harness.sim_metrics import MeteredSimService
from infertune_tuner.harness.sim_service import SimTritonService

MAX_PORT = 65535

DEFAULT_SERVED_MODEL = "llm"


@dataclass(frozen=True)
class SimServerConfig:
    model: ModelArch
    gpu: Gpu
    config: TrialConfig
    served_model: str = DEFAULT_SERVED_MODEL
    time_scale: float = 1.0
    host: str = "0.0.0.0"
    port: int = 8001
    http_port: int | None = 8000
    metrics_port: int | None = None  # Triton's metrics endpoint (GET /metrics); None: none


def build_config(
    *,
    model: str,
    gpu: str,
    tp: int,
    max_batch: int,
    quant: str,
    kv_dtype: str = "auto",
    served_model: str = DEFAULT_SERVED_MODEL,
    time_scale: float = 1.0,
    host: str = "0.0.0.0",
    port: int = 8001,
    http_port: int | None = 8000,
    architecture: dict[str, int] | None = None,
    metrics_port: int | None = None,
) -> SimServerConfig:
    """Validate the command-line values; InputError (exit 2) for anything unknown or impossible.

    ``http_port`` -1 (or None) serves no HTTP; ``port`` / ``http_port`` 0 bind any free port."""
    if not 0 <= port <= MAX_PORT:
        raise InputError(f"--port must be between 0 and {MAX_PORT}, not {port}")
    if http_port is not None and not -1 <= http_port <= MAX_PORT:
        raise InputError(f"--http-port must be between -1 and {MAX_PORT}, not {http_port}")
    if http_port == -1:
        http_port = None
    if metrics_port is not None and not -1 <= metrics_port <= MAX_PORT:
        raise InputError(f"--metrics-port must be between -1 and {MAX_PORT}, not {metrics_port}")
    if metrics_port == -1:
        metrics_port = None
    if http_port is not None and http_port == port != 0:
        raise InputError(f"--http-port {http_port} is the gRPC --port too; give another")
    _check_host(host)
    if architecture is not None:
        try:
            arch = ModelArch(key=model, **cast(dict[str, Any], architecture))
        except TypeError as exc:
            raise InputError(f"--architecture: {exc}") from None
    else:
        arch = get_model(model)
    g = get_gpu(gpu)
    if quant not in QUANTIZATIONS:
        raise InputError(f"unknown quantization {quant!r}; known: {', '.join(QUANTIZATIONS)}")
    if quant not in g.quantizations:
        raise InputError(f"{g.key} does not support {quant}; it supports {sorted(g.quantizations)}")
    if kv_dtype not in KV_DTYPE_BYTES:
        raise InputError(f"unknown KV-cache dtype {kv_dtype!r}; known: {', '.join(KV_DTYPE_BYTES)}")
    if kv_dtype not in g.kv_dtypes:
        raise InputError(f"{g.key} does not support a {kv_dtype} KV cache")
    if tp < 1 or not arch.valid_tp(tp):
        raise InputError(f"tensor parallel size {tp} must divide the {arch.heads} attention heads")
    if not 1 <= max_batch <= MAX_BATCH_SIZE_LIMIT:
        raise InputError(f"--max-batch must be between 1 and {MAX_BATCH_SIZE_LIMIT}")
    if not math.isfinite(time_scale) or time_scale <= 0:
        raise InputError(f"--time-scale must be a positive number, not {time_scale}")
    if not served_model:
        raise InputError("--served-model must not be empty")
    return SimServerConfig(
        model=arch, gpu=g, config=TrialConfig(tp, max_batch, quant, kv_dtype),
        served_model=served_model, time_scale=time_scale, host=host, port=port,
        http_port=http_port, metrics_port=metrics_port,
    )  # fmt: skip


def default_http_port(port: int) -> int:
    """The HTTP port beside gRPC ``port`` when none is given: Triton's layout (8000 beside
    8001), so that servers on different gRPC ports do not collide on a hidden HTTP default."""
    return port - 1 if port > 1 else 0


def _check_host(host: str) -> None:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise InputError(f"--host {host!r} is not an address to bind: {reason}") from None


# ------------------------------------------------------------------------------ the servers


class SimServer:
    """The gRPC server (and the HTTP health endpoints) in the running event loop.

    `port=0` binds a free port; `.port` holds the bound one after `start()`.
    """

    def __init__(self, cfg: SimServerConfig) -> None:
        self.cfg = cfg
        self.port = cfg.port
        self.http_port = cfg.http_port
        self.metrics_port = cfg.metrics_port
        self.service: SimTritonService | None = None
        self._server: grpc.aio.Server | None = None
        self._http: Any = None
        self._metrics: Any = None

    async def start(self) -> None:
        metered = MeteredSimService(self.cfg) if self.cfg.metrics_port is not None else None
        self.service = metered or SimTritonService(self.cfg)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.service, server)
        where = f"{self.cfg.host}:{self.cfg.port}"
        if (busy := _bind_problem(self.cfg.host, self.cfg.port)) is not None:
            # Said before gRPC tries: its core logs its own raw bind error to stderr first.
            raise OSError(f"cannot bind the gRPC port {where}: {busy} (give --port)")
        try:
            bound = server.add_insecure_port(f"{_grpc_host(self.cfg.host)}:{self.cfg.port}")
        except RuntimeError:  # grpc says "Failed to bind": in use, or not an address of ours
            bound = 0
        if bound == 0:
            raise OSError(f"cannot bind the gRPC port {where}: in use, or not a local address")
        self.port = bound
        await server.start()
        self._server = server
        self.service.start()
        if self.cfg.http_port is not None:
            try:
                self._http, self.http_port = await _start_http(self.cfg.host, self.cfg.http_port)
            except OSError as exc:
                await self.stop()  # the gRPC server must not outlive a failed start
                raise OSError(
                    f"cannot bind the HTTP port {self.cfg.host}:{self.cfg.http_port}: "
                    f"{exc.strerror or exc} (give --http-port)"
                ) from None
        if metered is not None and self.cfg.metrics_port is not None:
            try:
                self._metrics, self.metrics_port = await _start_http(
                    self.cfg.host, self.cfg.metrics_port, metrics=metered
                )
            except OSError as exc:
                await self.stop()
                raise OSError(
                    f"cannot bind the metrics port {self.cfg.host}:{self.cfg.metrics_port}: "
                    f"{exc.strerror or exc} (give --metrics-port)"
                ) from None

    async def stop(self, grace: float = 0.5) -> None:
        if self.service is not None:
            await self.service.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        if self._metrics is not None:
            await self._metrics.cleanup()
            self._metrics = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def _start_http(
    host: str, port: int, *, metrics: MeteredSimService | None = None
) -> tuple[Any, int]:
    """The health endpoints; with ``metrics``, Triton's metrics endpoint instead."""
    from aiohttp import web

    async def ok(_: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    if metrics is not None:

        async def scrape(_: web.Request) -> web.Response:
            return web.Response(text=metrics.metrics_text(), content_type="text/plain")

        app.router.add_get("/metrics", scrape)
    else:
        app.router.add_get("/v2/health/live", ok)
        app.router.add_get("/v2/health/ready", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=False)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


def _bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (e.g. "Address already in use"), None when it can
    or cannot be told (port 0, an unresolvable host: gRPC's own bind says so)."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(address)
            except OSError as exc:
                return str(exc.strerror or exc)
    return None


async def serve(cfg: SimServerConfig, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or SIGTERM/SIGINT when none is given)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    server = SimServer(cfg)
    await server.start()
    print(
        f"simserver: serving {cfg.served_model!r} ({cfg.model.key} on {cfg.gpu.key}, "
        f"{cfg.config.label()}, time scale {cfg.time_scale:g}) on gRPC {cfg.host}:{server.port}"
        + (f", HTTP {cfg.host}:{server.http_port}" if server.http_port is not None else "")
        + (
            f", metrics {cfg.host}:{server.metrics_port}" if server.metrics_port is not None else ""
        ),
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await server.stop()


def run(cfg: SimServerConfig) -> int:
    """Blocking entry point: exit code 1 (with a CUDA-OOM-like message) when nothing fits."""
    oom = oom_message(cfg.model, cfg.gpu, cfg.config)
    if oom is not None:
        print(f"[TensorRT-LLM][ERROR] {oom}", file=sys.stderr, flush=True)
        print("error: failed to load all models", file=sys.stderr, flush=True)
        return 1
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:  # a port in use: the user picks another (exit 2, as for bad input)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_INVALID
    return 0


def parse_architecture(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--architecture is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError("--architecture must be a JSON object")
    allowed = {"layers", "hidden_size", "heads", "kv_heads", "ffn_size", "vocab_size", "experts",
               "experts_active", "max_context", "head_dim"}  # fmt: skip
    unknown = set(value) - allowed
    if unknown:
        raise InputError(f"--architecture: unknown keys {sorted(unknown)}")
    bad = [k for k, v in value.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise InputError(f"--architecture: {', '.join(sorted(bad))} must be whole numbers >= 1")
    if value.get("experts_active", 1) > value.get("experts", 1):
        raise InputError("--architecture: experts_active must not exceed experts")
    return dict(value)
