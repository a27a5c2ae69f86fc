"""Fixtures for the operator tests: the API emulator, the running operator, a kubeconfig."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
import pytest_asyncio

from .apiserver import (
    NS,
    ApiServerHttp,
    FakeApiServer,
    OperatorRunner,
    api_url,
    declare_resources,
    start_operator,
)


@pytest_asyncio.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as handler, kmock.Server(handler, server_cls=ApiServerHttp):
        declare_resources(handler)
        yield handler


@pytest_asyncio.fixture
async def operator(api: FakeApiServer) -> AsyncIterator[OperatorRunner]:
    runner = await start_operator(api)
    try:
        yield runner
    finally:
        await runner.stop()


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig pointing at the emulator (for the CLI commands: tune-job, report)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: kmock
  cluster: {{server: "{api_url(api)}"}}
users:
- name: tester
  user: {{token: test-token}}
contexts:
- name: kmock
  context: {{cluster: kmock, user: tester, namespace: {NS}}}
current-context: kmock
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path
