"""A report ConfigMap anyone in the namespace can write cannot sink the operator.

Who may create ConfigMaps in one namespace may label one as an InferenceDeployment's report. A
gzip bomb there (1 MiB that inflates to a gigabyte) used to be decompressed whole by the
operator: OOM-killed, restarted, read again, crash-looping, every namespace stalled. Now it is
refused unread and the status says why.
"""

from __future__ import annotations

import base64
import functools
import tracemalloc
import zlib
from pathlib import Path

import pytest

from infertune_operator.policy.tuning import tuning_hash
from infertune_operator.reports.store import REPORT_GZ_KEY, REPORT_JSON_LIMIT, parse_report

from .apiserver import (
    NS,
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    idf,
    jobs_of,
    manifest,
    phase,
    post,
    wait_for,
    warning_events,
)
from .test_cli_operator import _invoke_async

MIB = 1024 * 1024


@functools.cache
def gzip_bomb(packed_bytes: int = MIB) -> bytes:
    """A valid gzip stream of about ``packed_bytes`` holding one JSON string of spaces, about a
    thousand times as large (deflate's best ratio)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b" " * MIB
    out = [deflate.compress(b'{"generated_at":"')]
    while sum(map(len, out)) < packed_bytes - 2048:
        out.append(deflate.compress(chunk))
    out += [deflate.compress(b'"}'), deflate.flush()]
    return b"".join(out)


def bomb_configmap(name: str, th: str) -> dict[str, object]:
    """``name``'s report ConfigMap as a hostile writer would leave it: labelled for the current
    tuning, its report.json.gz a bomb (it fits the API server's 1 MiB)."""
    labels = {
        "app.kubernetes.io/managed-by": "infertune",
        "app.kubernetes.io/component": "report",
        "infertune.io/deployment": name,
        "infertune.io/tuning-hash": th,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{name}-tuning-report",
            "namespace": NS,
            "labels": labels,
            "annotations": {"infertune.io/tuning-hash": th},
        },
        "binaryData": {REPORT_GZ_KEY: base64.b64encode(gzip_bomb()).decode("ascii")},
    }


def test_a_bomb_is_refused_without_inflating_it() -> None:
    cm = bomb_configmap("boom", "0000beef")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="expands past 16 MiB") as refused:
            parse_report(cm)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "refused unread" in str(refused.value)
    # Unbounded, this held the whole gigabyte; bounded, the limit and the packed value.
    assert peak < REPORT_JSON_LIMIT + 8 * MIB, f"{peak / MIB:.0f} MiB held"


async def test_the_operator_refuses_a_bomb_says_so_and_keeps_reconciling(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = manifest("boom")
    th = tuning_hash(body["spec"], SETTINGS)
    await post(api, "configmaps", bomb_configmap("boom", th))
    await create(api, body)

    await wait_for(lambda: phase(api, "boom") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "boom"), "Tuned")
    assert tuned["status"] == "False"
    assert f"report ConfigMap boom-tuning-report for tuning {th} is unreadable" in tuned["message"]
    assert "expands past 16 MiB" in tuned["message"]
    assert await warning_events(api, "boom", tuned["reason"])
    assert jobs_of(api, "boom") == []  # nothing tuned on the bomb's word either

    # The operator is alive and serves the others.
    await create(api, manifest("next"))
    await wait_for(lambda: jobs_of(api, "next"), what="the next object's tuner Job")

    # `infertune report` refuses it the same way: one line, exit 2, no traceback.
    result = await _invoke_async(["report", "boom", "-n", NS, "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "expands past 16 MiB" in result.output
    assert "Traceback" not in result.output
