"""kube/client.py, the only module that talks to the API, against the kmock emulator."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from infertune_operator.kube.client import Kube
from infertune_operator.kube.errors import KubeConfigError, KubeError, NotFound
from infertune_operator.kube.resources import (
    CONFIGMAPS,
    DEPLOYMENTS,
    INFERENCEDEPLOYMENTS,
    JOBS,
    resource_of,
)

from .apiserver import NS, FakeApiServer, api_url, get


def _cm(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "data": {"k": "v"},
    }


async def test_crud_on_plain_dicts(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))

    def scenario() -> None:
        assert kube.get(CONFIGMAPS, NS, "a") is None
        created, fresh = kube.create(_cm("a", {"app": "x"}))
        assert fresh and created["metadata"]["uid"]
        adopted, fresh = kube.create(_cm("a", {"app": "x"}))  # 409 AlreadyExists -> adoption
        assert not fresh and adopted["metadata"]["uid"] == created["metadata"]["uid"]
        kube.create(_cm("b", {"app": "y"}))
        assert [c["metadata"]["name"] for c in kube.list(CONFIGMAPS, NS, {"app": "x"})] == ["a"]
        assert len(kube.list(CONFIGMAPS, NS)) == 2
        patched = kube.patch(CONFIGMAPS, NS, "a", {"data": {"k2": "v2"}})
        assert patched["data"] == {"k": "v", "k2": "v2"}
        assert kube.delete(CONFIGMAPS, NS, "a") is True
        assert kube.delete(CONFIGMAPS, NS, "a") is False
        with pytest.raises(NotFound):
            kube.patch(CONFIGMAPS, NS, "a", {"data": {}})
        assert kube.ensure(_cm("c")) is True
        assert kube.ensure(_cm("c")) is False

    await asyncio.to_thread(scenario)
    assert get(api, "configmaps", "a") is None
    assert get(api, "configmaps", "c") is not None


async def test_apply_creates_then_patches(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))
    first = await asyncio.to_thread(kube.apply, _cm("svc"))
    changed = _cm("svc")
    changed["data"] = {"k": "w"}
    second = await asyncio.to_thread(kube.apply, changed)
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert second["data"] == {"k": "w"}


async def test_status_patch_goes_to_the_subresource(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))
    body = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
            "metadata": {"name": "x", "namespace": NS}, "spec": {}}  # fmt: skip
    await asyncio.to_thread(kube.create, body)
    await asyncio.to_thread(
        kube.patch, INFERENCEDEPLOYMENTS, NS, "x", {"status": {"phase": "Tuning"}},
        subresource="status",
    )  # fmt: skip
    assert any(r.subresource == "status" and r.method == "PATCH" for r in api)
    assert (get(api, "inferencedeployments", "x") or {})["status"] == {"phase": "Tuning"}


async def test_pod_log_tail(api: FakeApiServer) -> None:
    api[f"get /api/v1/namespaces/{NS}/pods/p1/log"] << b"one\ntwo\nthree\n"
    kube = Kube.for_url(api_url(api))
    text = await asyncio.to_thread(kube.pod_log_tail, NS, "p1", "tuner", 2)
    assert "three" in text


def test_unreachable_server_is_a_kube_error() -> None:
    kube = Kube.for_url("http://127.0.0.1:9")  # discard port: connection refused
    kube.timeout = (0.5, 0.5)
    with pytest.raises(KubeError, match="get configmaps/x"):
        kube.get(CONFIGMAPS, NS, "x")


def test_paths() -> None:
    assert JOBS.path("ns", "j") == "/apis/batch/v1/namespaces/ns/jobs/j"
    assert CONFIGMAPS.path("ns") == "/api/v1/namespaces/ns/configmaps"
    assert (
        INFERENCEDEPLOYMENTS.path("ns", "x", "status")
        == "/apis/infertune.io/v1alpha1/namespaces/ns/inferencedeployments/x/status"
    )
    assert resource_of({"kind": "Deployment"}) is DEPLOYMENTS
    with pytest.raises(KubeError):
        resource_of({"kind": "Secret"})


async def test_from_environment_reads_the_kubeconfig_and_its_namespace(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    kube = Kube.from_environment()
    assert kube.default_namespace == NS
    assert await asyncio.to_thread(kube.get, CONFIGMAPS, NS, "nothing") is None


def test_from_environment_without_any_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError):
        Kube.from_environment()
