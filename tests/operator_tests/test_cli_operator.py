"""`infertune report`, `infertune tune-job` and `infertune operator` (argument errors)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import webbrowser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from infertune_operator.cli import app
from infertune_operator.objects import tuner_job
from infertune_operator.policy.tuning import validate
from infertune_operator.reports.store import report_configmap
from infertune_tuner.result import Report

from .apiserver import NS, SETTINGS, FakeApiServer, get, manifest, post


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(app, args)


async def _invoke_async(args: list[str]) -> Result:
    # The emulator serves on this event loop: the (blocking) command runs in a thread.
    return await asyncio.to_thread(_invoke, args)


def _report(tmp_path: Path, *, feasible: bool = True) -> Report:
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.run import tune

    body = manifest("llm", slo={"e2eLatencyMs": {"p95": 20000 if feasible else 10}})
    obj, problems = validate(body)
    assert obj is not None, problems
    return tune(to_request(obj), backend="simulated", out_dir=tmp_path / "study")


def _report_cm(report: Report) -> dict[str, Any]:
    return report_configmap(name="llm", namespace=NS, report=report, th="abcd1234", owner_uid=None)


def _raw_cm(data: dict[str, str] | None, binary: dict[str, str] | None = None) -> dict[str, Any]:
    """A report ConfigMap as something else wrote it (an earlier version, a person)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "llm-tuning-report", "namespace": NS},
            "data": data, "binaryData": binary}  # fmt: skip


# ------------------------------------------------------------------ infertune report


async def test_report_writes_json_markdown_and_html(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _report(tmp_path)
    await post(api, "configmaps", _report_cm(report))
    opened: list[str] = []

    def fake_open(url: str) -> bool:
        opened.append(url)
        return True

    monkeypatch.setattr(webbrowser, "open", fake_open)

    out = tmp_path / "out"
    result = await _invoke_async(["report", "llm", "-n", NS, "--out", str(out), "--open"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html"}
    assert Report.model_validate_json((out / "report.json").read_text()) == report
    assert opened == [(out / "report.html").resolve().as_uri()]


async def test_report_reads_a_gzipped_report_and_defaults_the_namespace(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    report = _report(tmp_path)
    data = json.loads(report.to_json())
    data["request"]["model"]["checkpoints"] = {"fp8": "x" * 1_100_000}  # big -> gzipped
    cm = _report_cm(Report.model_validate(data))
    assert "report.json.gz" in cm["binaryData"] and cm["data"] is None
    await post(api, "configmaps", cm)

    out = tmp_path / "gz"
    result = await _invoke_async(["report", "llm", "--out", str(out)])  # namespace: kubeconfig's
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["request"]["model"]["checkpoints"]


async def test_report_reads_what_earlier_versions_wrote(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    report = _report(tmp_path)  # indented JSON, gzipped alone into binaryData
    packed = base64.b64encode(gzip.compress(report.to_json().encode())).decode()
    await post(api, "configmaps", _raw_cm(None, {"report.json.gz": packed}))
    result = await _invoke_async(["report", "llm", "--out", str(tmp_path / "old")])
    assert result.exit_code == 0, result.output
    assert Report.model_validate_json((tmp_path / "old" / "report.json").read_text()) == report


async def test_report_not_found_is_a_one_line_error(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    result = await _invoke_async(["report", "nope", "-n", NS, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert result.output.startswith("error: no tuning report for 'nope'")
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


async def test_report_rejects_a_configmap_that_is_not_a_report(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    await post(api, "configmaps", _raw_cm({"report.json": '{"schema": "something-else"}'}))
    result = await _invoke_async(["report", "llm", "-n", NS, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "not a valid infertune report" in result.output and "Traceback" not in result.output


def test_report_without_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = _invoke(["report", "llm"])
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach a cluster")


# ------------------------------------------------------------------ infertune tune-job


async def test_tune_job_writes_the_report_configmap_and_overwrites_it(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    body = manifest("llm", slo={"e2eLatencyMs": {"p95": 10}})  # infeasible: still exit 0
    body["metadata"]["uid"] = "uid-1"
    await post(api, "inferencedeployments", body)  # the tuner writes only for a live object
    obj, _ = validate(body)
    assert obj is not None
    request = tmp_path / "request.json"
    cm = tuner_job.request_configmap(obj, body, "h1", SETTINGS)
    request.write_text(cm["data"]["request.json"])
    args = ["tune-job", "--request", str(request), "--report-configmap", "llm-tuning-report",
            "--namespace", NS, "--owner-uid", "uid-1", "--tuning-hash", "h1"]  # fmt: skip

    result = await _invoke_async(args)
    assert result.exit_code == 0, result.output
    assert "No configuration met the SLO" in result.output
    written = get(api, "configmaps", "llm-tuning-report")
    assert written is not None
    assert written["metadata"]["annotations"]["infertune.io/tuning-hash"] == "h1"
    assert written["metadata"]["labels"]["infertune.io/tuning-hash"] == "h1"
    assert written["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert Report.model_validate_json(written["data"]["report.json"]).best is None

    args[args.index("h1")] = "h2"
    result = await _invoke_async(args)  # the ConfigMap exists: replaced, not duplicated
    assert result.exit_code == 0, result.output
    rewritten = get(api, "configmaps", "llm-tuning-report")
    assert rewritten is not None
    assert rewritten["metadata"]["annotations"]["infertune.io/tuning-hash"] == "h2"


def test_tune_job_checks_its_arguments(tmp_path: Path) -> None:
    missing = _invoke(["tune-job", "--request", str(tmp_path / "none.json"),
                       "--report-configmap", "x", "--namespace", NS])  # fmt: skip
    assert missing.exit_code == 2 and "no such file" in missing.output

    request = tmp_path / "request.json"
    request.write_text('{"name": "llm"}')
    bad = _invoke(["tune-job", "--request", str(request), "--report-configmap", "x",
                   "--namespace", NS])  # fmt: skip
    assert bad.exit_code == 2 and "not a valid TuningRequest" in bad.output
    assert "Traceback" not in bad.output


# ------------------------------------------------------------------ infertune operator


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give --namespace NS (repeatable) or --all-namespaces"),
        (["-n", "a", "--all-namespaces"], "not both"),
    ],
)
def test_operator_needs_a_scope(args: list[str], message: str) -> None:
    result = _invoke(["operator", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_operator_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERTUNE_DEFAULT_BACKEND", "tpu")
    result = _invoke(["operator", "-A"])
    assert result.exit_code == 2
    assert "INFERTUNE_DEFAULT_BACKEND" in result.output


async def test_operator_command_runs_with_liveness_and_stops_on_sigterm(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    """`infertune operator -A` as a process: kubeconfig login, liveness, SIGTERM exits.

    (Cluster-wide: kmock 0.8 cannot parse `GET /api/v1/namespaces`, which Kopf's namespaced
    mode lists; `--namespace` only changes what is passed to Kopf.)
    """
    import os
    import signal
    import socket
    import sys

    import aiohttp

    from .apiserver import create, jobs_of, wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = str(Path(sys.executable).with_name("infertune"))
    proc = await asyncio.create_subprocess_exec(
        exe, "operator", "--all-namespaces", "--liveness", f"http://127.0.0.1:{port}/healthz",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "INFERTUNE_OPERATOR_IMAGE": "op:cli"},
    )  # fmt: skip
    try:
        await create(api, manifest("cli"))
        jobs = await wait_for(lambda: jobs_of(api, "cli"), timeout=20, what="the tuner Job")
        container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "op:cli"  # settings come from the environment

        async def healthy() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/healthz") as resp,
                ):
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        for _ in range(100):
            if await healthy():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the liveness endpoint never answered 200")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode == 0, out.decode()[-3000:]
