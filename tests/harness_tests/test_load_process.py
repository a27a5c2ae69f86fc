"""A trial's load generator runs in a process of its own (harness/load_process.py): trials side
by side in one tuner pod do not share an interpreter lock, and each one's client CPU is its own."""

from __future__ import annotations

import asyncio
import os

import pytest

from infertune_tuner.harness.load_process import run_load_isolated
from infertune_tuner.harness.loadgen import LoadSpec, ServerUnreachable
from infertune_tuner.harness.runner import free_port


def test_the_load_runs_in_another_process_and_reports_its_phases(server_port: int) -> None:
    spec = LoadSpec(url=f"127.0.0.1:{server_port}", model="llm", concurrency=4, requests=8,
                    warmup=4, input_tokens=32, output_tokens=4)  # fmt: skip
    phases: list[str] = []
    result = asyncio.run(run_load_isolated(spec, on_phase=phases.append))
    assert (result.requests, result.errors) == (8, 0)
    assert phases == ["warm-up", "measuring"]
    assert result.settings["client_pid"] != os.getpid()


def test_what_the_generator_raises_reaches_the_trial() -> None:
    spec = LoadSpec(url=f"127.0.0.1:{free_port()}", model="llm", connect_timeout_s=1.0)
    with pytest.raises(ServerUnreachable, match="cannot reach"):
        asyncio.run(run_load_isolated(spec))
