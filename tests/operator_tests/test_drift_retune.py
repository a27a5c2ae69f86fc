"""The live workload, drift and retune, end to end on the emulator with the simulated server.

The serving pod is the Deployment's own `infertune simserver` command (ten times faster than
real time, so a window holds enough requests); load is `infertune bench` against it with the
workload each test wants the pod to see; the operator reads the pod's metrics endpoint through
the API server's pod proxy. The operator's clocks run 100 times faster (`Backoff.time_scale`):
a 30 s observation interval takes 0.3 s, a one-minute window 0.6 s, the 360-minute retune
interval 3.6 minutes (longer than any test).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest_asyncio

from infertune_operator.policy.backoff import Backoff

from .apiserver import (
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    creations,
    events_for,
    finish_job,
    get,
    idf,
    jobs_of,
    make_available,
    manifest,
    phase,
    run_tuner,
    start_operator,
    wait_for,
)
from .serving import Load, ServingPod, remove_serving_pod, start_load, start_serving_pod, to_ready

SCALE = 0.01
FAST = Backoff(time_scale=SCALE)
OBSERVING = replace(SETTINGS, observe_interval_s=30.0)
# Tuned at 256 in / 32 out: TP1, batch 16. Under 770 in, that configuration misses this SLO and
# TP2, batch 16 meets it; under 128 in it stays the best (checked with `infertune tune`).
SLO = {"e2eLatencyMs": {"p95": 3000}}
SERVING = {"verification": {"enabled": False}, "observe": {"windowMinutes": 1}}
TUNING = {"backend": "simulated", "maxTrials": 6, "seed": 1, "retune": "OnDrift"}


def _spec() -> dict[str, Any]:
    return {"workload": {"inputTokens": 256, "outputTokens": 32}, "slo": SLO,
            "serving": SERVING, "tuning": TUNING}  # fmt: skip


@pytest_asyncio.fixture
async def fast_operator(api: FakeApiServer) -> AsyncIterator[OperatorRunner]:
    runner = await start_operator(api, OBSERVING, backoff=FAST)
    try:
        yield runner
    finally:
        await runner.stop()


def _retune(api: FakeApiServer, name: str) -> dict[str, Any]:
    return dict(idf(api, name)["status"].get("retune") or {})


def _request_of(api: FakeApiServer, job: dict[str, Any]) -> dict[str, Any]:
    volumes = job["spec"]["template"]["spec"]["volumes"]
    cm = get(api, "configmaps", next(v["configMap"]["name"] for v in volumes if "configMap" in v))
    assert cm is not None
    request: dict[str, Any] = json.loads(cm["data"]["request.json"])
    return request


async def _serve(api: FakeApiServer, name: str, tokens: tuple[int, int]) -> tuple[ServingPod, Load]:
    pod = await start_serving_pod(api, name, time_scale=0.1)
    return pod, await start_load(pod, input_tokens=tokens[0], output_tokens=tokens[1])


async def test_observed_workload_and_a_retune_that_keeps_the_current_configuration(
    api: FakeApiServer, fast_operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("obs", **_spec()))
    await to_ready(api, "obs", tmp_path)
    pod, load = await _serve(api, "obs", (256, 32))
    try:
        # As tuned: the summary is published, nothing drifts.
        observed = await wait_for(
            lambda: condition(idf(api, "obs"), "WorkloadDrifted").get("status") == "False"
            and idf(api, "obs")["status"].get("observedWorkload"),
            timeout=30, what="the observed workload, as tuned",
        )  # fmt: skip
        assert observed["inputTokensMean"] == 256 and observed["outputTokensMean"] == 32
        assert observed["requestsPerSecond"] > 0 and observed["source"] == "pods 1/1"
        assert 0 < observed["concurrency"] <= 16 and observed["ttftP95Ms"] > 0
        assert observed["notExposed"] == [] and observed["tunedInputTokens"] == 256
        assert condition(idf(api, "obs"), "SloAtRisk")["status"] == "False"

        # Prompts get half as long: WorkloadDrifted once it lasts a window, and a retune with
        # the observed workload, the current configuration serving meanwhile.
        await load.stop()
        load = await start_load(pod, input_tokens=128, output_tokens=32)
        drifted = await wait_for(
            lambda: condition(idf(api, "obs"), "WorkloadDrifted").get("status") == "True"
            and condition(idf(api, "obs"), "WorkloadDrifted"),
            timeout=30, what="WorkloadDrifted=True",
        )  # fmt: skip
        assert drifted["reason"] == "WorkloadChanged"
        assert "mean input tokens 128 vs 256 tuned" in drifted["message"], drifted
        job = (await wait_for(lambda: jobs_of(api, "obs", "retune"), what="a retune Job"))[0]
        assert _request_of(api, job)["workload"]["input_tokens"] == 130  # two digits
        assert _request_of(api, job)["workload"]["output_tokens"] == 32
        assert "--retune-hash" in job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert _retune(api, "obs")["state"] == "Running" and phase(api, "obs") == "Ready"
        await wait_for(lambda: [e for e in events_for(api, "obs") if e["reason"] ==
                                "RetuneStarted"], what="RetuneStarted")  # fmt: skip

        # An operator restart while the retune runs duplicates nothing.
        await fast_operator.stop()
        again = await start_operator(api, OBSERVING, backoff=FAST)
        try:
            await wait_for(
                lambda: "is running" in condition(idf(api, "obs"), "WorkloadDrifted")["message"],
                timeout=30, what="the restarted observer seeing the running retune",
            )  # fmt: skip
            assert creations(api, "jobs", "retune") == 1

            # The retune finds the current configuration still the best: it keeps serving.
            best = idf(api, "obs")["status"]["bestConfig"]
            deployment = get(api, "deployments", "obs")
            await run_tuner(api, job, tmp_path)
            await finish_job(api, job["metadata"]["name"])
            done = await wait_for(lambda: _retune(api, "obs").get("state") not in (None, "Running")
                                  and _retune(api, "obs"), what="the retune's verdict")  # fmt: skip
            assert done["state"] == "KeptCurrent", done
            assert "is still the best at 130 in / 32 out" in done["message"]
            assert idf(api, "obs")["status"]["bestConfig"] == best
            assert get(api, "deployments", "obs") == deployment  # not rolled
            report = get(api, "configmaps", "obs-retune-report")
            assert report is not None and get(api, "configmaps", "obs-tuning-report") is not None

            # The drift lasts, then changes: no second retune within the interval.
            await wait_for(lambda: "already ran (KeptCurrent): not again" in condition(
                idf(api, "obs"), "WorkloadDrifted")["message"], timeout=30,
                what="the same drift not retuned again")  # fmt: skip
            await load.stop()
            load = await start_load(pod, input_tokens=600, output_tokens=32)
            await wait_for(lambda: "at most one per 360 min" in condition(
                idf(api, "obs"), "WorkloadDrifted")["message"], timeout=30,
                what="another drift held back by the interval")  # fmt: skip
            assert creations(api, "jobs", "retune") == 1
            assert len([e for e in events_for(api, "obs") if e["reason"] == "RetuneStarted"]) == 1
        finally:
            await again.stop()
    finally:
        await load.stop()
        await pod.stop()


async def test_drift_retunes_and_rolls_out_a_configuration_that_is_better(
    api: FakeApiServer, fast_operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("roll", **_spec()))
    await to_ready(api, "roll", tmp_path)
    before = dict(idf(api, "roll")["status"]["bestConfig"])
    pod, load = await _serve(api, "roll", (770, 32))
    try:
        job = (await wait_for(lambda: jobs_of(api, "roll", "retune"), timeout=30,
                              what="a retune Job"))[0]  # fmt: skip
        assert _request_of(api, job)["workload"]["input_tokens"] == 770
        await run_tuner(api, job, tmp_path)
        await finish_job(api, job["metadata"]["name"])
        done = await wait_for(lambda: _retune(api, "roll").get("state") not in (None, "Running")
                              and _retune(api, "roll"), what="the retune's verdict")  # fmt: skip
        assert done["state"] == "RolledOut", done
        assert "misses the SLO at 770 in / 32 out" in done["message"]
        after = idf(api, "roll")["status"]["bestConfig"]
        assert after != before and after["tp"] == 2
        assert done["bestConfig"] == after
        rolled = await wait_for(
            lambda: (get(api, "deployments", "roll") or {}).get("metadata", {})
            .get("annotations", {}).get("infertune.io/config", "").startswith("tp2"),
            what="the Deployment rolled to the retune's best",
        )  # fmt: skip
        assert rolled
        # Events follow the status write that carries the verdict: wait for it, not past it.
        await wait_for(lambda: [e for e in events_for(api, "roll")
                                if e["reason"] == "RetuneRolledOut"],
                       what="the RetuneRolledOut event")  # fmt: skip

        # The new pods serve the observed workload: tuned for it, nothing drifts any more.
        await load.stop()
        await remove_serving_pod(api, pod)
        await make_available(api, "roll", 1)
        await wait_for(lambda: phase(api, "roll") == "Ready", what="Ready with the new config")
        pod, load = await _serve(api, "roll", (770, 32))
        calm = await wait_for(
            lambda: condition(idf(api, "roll"), "WorkloadDrifted").get("status") == "False"
            and idf(api, "roll")["status"]["observedWorkload"],
            timeout=30, what="WorkloadDrifted=False against the retune's workload",
        )  # fmt: skip
        assert calm["tunedInputTokens"] == 770 and calm["tunedConcurrency"] == after["maxBatchSize"]
        assert creations(api, "jobs", "retune") == 1
        assert creations(api, "jobs", "tuner") == 1
    finally:
        await load.stop()
        await pod.stop()
