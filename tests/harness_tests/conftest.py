"""Fixtures of the harness tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput

from infertune_tuner.harness.simserver import SimServer, build_config


@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    """A simulated server on its own event loop in a thread (the CLI runs asyncio.run itself)."""
    cfg = build_config(
        model="llama-3-8b", gpu="H100-SXM-80GB", tp=1, max_batch=4, quant="fp8",
        time_scale=0.05, host="127.0.0.1", port=0, http_port=None,
    )  # fmt: skip
    started = threading.Event()
    holder: dict[str, object] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        holder["stop"], holder["loop"] = stop, asyncio.get_running_loop()
        async with SimServer(cfg) as srv:
            holder["port"] = srv.port
            started.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield int(holder["port"])  # type: ignore[call-overload]
    loop: asyncio.AbstractEventLoop = holder["loop"]  # type: ignore[assignment]
    loop.call_soon_threadsafe(holder["stop"].set)  # type: ignore[attr-defined]
    thread.join(10)


InferInputOf = Callable[[str, str, np.ndarray], InferInput]
OneRequest = Callable[[dict[str, Any]], AsyncIterator[dict[str, Any]]]


def _infer_input(name: str, datatype: str, value: np.ndarray) -> InferInput:
    inp = InferInput(name, list(value.shape), datatype)
    inp.set_data_from_numpy(value)
    return inp


async def _one(request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield request


@pytest.fixture(scope="session")
def infer_input() -> InferInputOf:
    """A KServe v2 input tensor holding `value`, for tests that speak to a server directly."""
    return _infer_input


@pytest.fixture(scope="session")
def one() -> OneRequest:
    """A request stream that sends one request and nothing else."""
    return _one
