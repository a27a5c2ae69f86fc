"""The whole flow on a kind cluster without GPUs: InferenceDeployment -> simulated tuner Job ->
simulated serving endpoint (KServe v2 gRPC) -> Ready; benchmark it, fetch the report, delete it.

Run with scripts/kind-e2e.sh; skipped (with the reason) where Docker or kind is missing.
Tests run in file order and share one InferenceDeployment; the last one deletes it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "llama3-70b-h100-simulated.yaml"
CRD = REPO_ROOT / "crds" / "inferencedeployments.infertune.io.yaml"
NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
READY_TIMEOUT_S = float(os.environ.get("INFERTUNE_E2E_TIMEOUT", "600"))
GRPC_PORT = 8001


def _phase(kube, namespace: str) -> tuple[str, dict[str, Any]]:
    obj = kube.json("get", "inferencedeployment", NAME, "-n", namespace)
    status = obj.get("status") or {}
    return status.get("phase") or "", status


@pytest.fixture(scope="module")
def deployed(kube, namespace) -> str:
    """The example applied in a fresh namespace and walked to Ready."""
    kube.run("apply", "-n", namespace, "-f", str(EXAMPLE))
    deadline = time.monotonic() + READY_TIMEOUT_S
    phase, status, seen = "", {}, []
    while time.monotonic() < deadline:
        phase, status = _phase(kube, namespace)
        if not seen or seen[-1] != phase:
            seen.append(phase)
        if phase == "Ready":
            return namespace
        if phase == "Failed":
            pytest.fail(
                f"{NAME} Failed: {status.get('message')}\n{kube.diagnostics(namespace)}",
                pytrace=False,
            )
        time.sleep(5)
    pytest.fail(
        f"{NAME} not Ready after {READY_TIMEOUT_S:.0f}s (phases seen: {seen}, last status "
        f"{json.dumps(status)})\n{kube.diagnostics(namespace)}",
        pytrace=False,
    )


def _printer_columns(wide: bool) -> list[str]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    cols = version["additionalPrinterColumns"]
    return ["NAME"] + [c["name"].upper() for c in cols if wide or not c.get("priority")]


def test_reaches_ready_with_a_best_config(kube, deployed):
    phase, status = _phase(kube, deployed)
    assert phase == "Ready"
    best = status["bestConfig"]
    assert best["tp"] in (1, 2, 4, 8)
    assert best["maxBatchSize"] in (8, 16, 32, 64, 128)
    assert best["quantization"] in ("bf16", "fp8")
    assert status["bestMetrics"]["outputTokensPerSecondPerGpu"] > 0
    assert 0 < status["trials"]["executed"] <= 20


@pytest.mark.parametrize("wide", [False, True], ids=["default", "wide"])
def test_kubectl_get_infd_shows_the_columns(kube, deployed, wide):
    args = ["get", "infd", NAME, "-n", deployed] + (["-o", "wide"] if wide else [])
    lines = kube.run(*args).stdout.strip().splitlines()
    header, row = re.split(r"\s{2,}", lines[0].strip()), re.split(r"\s{2,}", lines[1].strip())
    assert header == _printer_columns(wide)
    values = dict(zip(header, row, strict=True))
    assert values["NAME"] == NAME
    assert values["PHASE"] == "Ready"
    assert values["TP"].isdigit() and values["BATCH"].isdigit()
    assert values["QUANT"] in ("bf16", "fp8")
    assert float(values["TOK/S/GPU"]) > 0
    assert values["SLO"] in ("true", "false")
    if wide:
        assert values["MODEL"] == "llama-3-70b"
        assert values["GPU"] == "H100-SXM-80GB"


@contextmanager
def port_forward(kube, namespace: str, target: str, port: int) -> Iterator[int]:
    proc = subprocess.Popen(
        [
            str(kube.kubectl),
            "port-forward",
            "-n",
            namespace,
            target,
            f":{port}",
            "--address",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kube.env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:41234 -> 8001"
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            proc.kill()
            raise AssertionError(
                f"port-forward did not start: {line}{proc.stderr.read() if proc.stderr else ''}"
            )
        yield int(m.group(1))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _count(value: Any, *keys: str) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict):
        for key in keys:
            if key in value:
                return _count(value[key], *keys)
    return None


def test_bench_through_the_service(kube, deployed):
    service = kube.json("get", "service", NAME, "-n", deployed)
    ports = [p["port"] for p in service["spec"]["ports"]]
    assert GRPC_PORT in ports, f"Service {NAME} has ports {ports}, not gRPC {GRPC_PORT}"
    with port_forward(kube, deployed, f"service/{NAME}", GRPC_PORT) as local:
        proc = kube.infertune(
            "bench",
            "--url",
            f"127.0.0.1:{local}",
            "--model",
            "llm",
            "--concurrency",
            "8",
            "--requests",
            "32",
            "--input-tokens",
            "1024",
            "--output-tokens",
            "256",
            "--json",
        )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    result = json.loads(out[out.index("{") :])
    assert _count(result.get("requests"), "completed", "count", "total") == 32, result
    assert _count(result.get("errors"), "count", "total") == 0, result


def test_report_can_be_fetched(kube, deployed, tmp_path):
    proc = kube.infertune("report", NAME, "-n", deployed, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    reports = sorted(tmp_path.rglob("report.json"))
    assert reports, f"no report.json under {tmp_path}: {proc.stdout}{proc.stderr}"
    report = json.loads(reports[0].read_text())
    assert report["schema"] == "infertune.report/v1"


def _named_after(kube, namespace: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for kind in ("jobs", "configmaps", "deployments", "services"):
        items = kube.json("get", kind, "-n", namespace)["items"]
        names = [
            i["metadata"]["name"]
            for i in items
            if i["metadata"]["name"] == NAME or i["metadata"]["name"].startswith(f"{NAME}-")
        ]
        if names:
            found[kind] = names
    return found


def test_delete_removes_everything_named_after_it(kube, deployed):
    before = _named_after(kube, deployed)
    assert before.get("deployments") and before.get("services"), before
    assert before.get("configmaps"), before
    kube.run("delete", "inferencedeployment", NAME, "-n", deployed, "--wait=true", "--timeout=180s")
    deadline = time.monotonic() + 180
    left = before
    while time.monotonic() < deadline:
        left = _named_after(kube, deployed)
        if not left:
            break
        time.sleep(3)
    assert not left, f"still there after deleting {NAME}: {left}\n{kube.diagnostics(deployed)}"
    assert kube.run("get", "inferencedeployment", NAME, "-n", deployed, check=False).returncode != 0
