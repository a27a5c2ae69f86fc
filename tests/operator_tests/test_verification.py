"""Verification after rollout, end to end on the emulator with the simulated server.

The serving pod is the Deployment's own `infertune simserver` command; the verification Job is
its own `infertune verify-job` command against that pod, writing its result through the
emulator as it would on a cluster (see serving.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from infertune_operator.policy import noise
from infertune_tuner.metrics import OBJECTIVE

from .apiserver import (
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    creations,
    events_for,
    finish_job,
    idf,
    jobs_of,
    make_available,
    manifest,
    patch,
    phase,
    start_operator,
    wait_for,
)
from .serving import INFERTUNE, remove_serving_pod, run_verifier, start_serving_pod, to_ready

WORKLOAD = {"inputTokens": 256, "outputTokens": 32}
# A trial measures hundreds of requests at this batch; 32 keep the test to seconds.
SERVING = {"verification": {"requests": 32, "durationSeconds": 120}}


async def _report(out: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        INFERTUNE, "report", "vfy", "--out", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    text, _ = await proc.communicate()
    assert proc.returncode == 0, text.decode()
    return text.decode()


def _events(api: FakeApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(api, name) if e["reason"] == reason]


async def test_rollout_is_verified_then_a_slower_pod_is_below_tuned(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("vfy", workload=WORKLOAD, serving=SERVING))
    uid = body["metadata"]["uid"]
    await to_ready(api, "vfy", tmp_path)
    best = idf(api, "vfy")["status"]["bestConfig"]

    # Ready: one verification Job, owned by the object, at the tuned concurrency and workload.
    job = (await wait_for(lambda: jobs_of(api, "vfy", "verification"), what="a verification Job"))[
        0
    ]
    assert job["metadata"]["ownerReferences"][0]["uid"] == uid
    assert job["metadata"]["name"].startswith("vfy-verify-")
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    flag = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1, 2)}
    assert flag["--concurrency"] == str(best["maxBatchSize"])
    assert (flag["--input-tokens"], flag["--output-tokens"]) == ("256", "32")
    assert flag["--requests"] == "32" and flag["--url"] == "vfy.team-a.svc:8001"
    assert job["spec"]["activeDeadlineSeconds"] >= 120
    running = await wait_for(lambda: condition(idf(api, "vfy"), "Verified"), what="Verified")
    assert (running["status"], running["reason"]) == ("Unknown", "VerificationRunning")

    # The kubelet runs the pod and the Job; the Job controller marks it complete.
    pod = await start_serving_pod(api, "vfy")
    out = await run_verifier(job, pod)
    assert "result in ConfigMap team-a/vfy-verification" in out
    await finish_job(api, job["metadata"]["name"])
    verified = await wait_for(
        lambda: (
            condition(idf(api, "vfy"), "Verified").get("status") == "True"
            and condition(idf(api, "vfy"), "Verified")
        ),
        what="Verified=True",
    )
    assert verified["reason"] == "MatchesTuned"
    v = idf(api, "vfy")["status"]["verification"]
    tuned = idf(api, "vfy")["status"]["bestMetrics"]["outputTokensPerSecondPerGpu"]
    assert v["state"] == "Passed" and v["tuned"]["outputTokensPerSecondPerGpu"] == tuned
    measured = v["measured"]["outputTokensPerSecondPerGpu"]
    assert measured >= tuned * (1 - noise.shortfall_tolerance())
    assert v["tolerancePercent"] == 8.1 and v["requests"] == 32 and v["errors"] == 0
    assert v["measured"]["e2eP95Ms"] > 0 and v["sloMissed"] == []
    assert f"{measured:.0f} tok/s/GPU against {tuned:.0f} tuned" in verified["message"]
    await wait_for(lambda: len(_events(api, "vfy", "MatchesTuned")) == 1, what="one event")
    # `infertune report` shows the verification beside the tuned numbers.
    shown = await _report(tmp_path / "vfy-report")
    md = (tmp_path / "vfy-report" / "report.md").read_text()
    row = f"| {OBJECTIVE.label} | {tuned:.0f} | {measured:.0f} | - |"
    assert "## After deploy" in md and row in md and row in shown
    assert "Verified=True (MatchesTuned)" in md
    assert 'id="after-deploy"' in (tmp_path / "vfy-report" / "report.html").read_text()
    assert _events(api, "vfy", "VerificationRunning") == []  # bookkeeping posts nothing

    # An operator restart finds the result: no second Job, nothing written again.
    await operator.stop()
    again = await start_operator(api)
    try:
        await wait_for(lambda: creations(api, "jobs", "tuner") == 1, what="the initial listing")
        assert creations(api, "jobs", "verification") == 1
        assert condition(idf(api, "vfy"), "Verified")["reason"] == "MatchesTuned"

        # A new rollout (CPU limits) lands on a slower pod: verified again, BelowTuned.
        limits = {"resources": {"limits": {"cpu": "3"}}}
        await patch(api, "inferencedeployments", "vfy", {"spec": {"serving": limits}})
        pending = await wait_for(
            lambda: (
                condition(idf(api, "vfy"), "Verified").get("reason") == "VerificationPending"
                and condition(idf(api, "vfy"), "Verified")
            ),
            what="Verified=Unknown while the new rollout is not available",
        )
        assert pending["status"] == "Unknown"
        await make_available(api, "vfy", 1)
        await wait_for(lambda: phase(api, "vfy") == "Ready", what="Ready again")
        second = await wait_for(
            lambda: [j for j in jobs_of(api, "vfy", "verification") if j["metadata"]["name"]
                     != job["metadata"]["name"]],
            what="a second verification Job",
        )  # fmt: skip
        await wait_for(lambda: len(jobs_of(api, "vfy", "verification")) == 1,
                       what="the first rollout's Job deleted")  # fmt: skip
        await remove_serving_pod(api, pod)
        pod = await start_serving_pod(api, "vfy", time_scale=1.3)
        await run_verifier(second[0], pod)
        await finish_job(api, second[0]["metadata"]["name"])
        below = await wait_for(
            lambda: (
                condition(idf(api, "vfy"), "Verified").get("status") == "False"
                and condition(idf(api, "vfy"), "Verified")
            ),
            what="Verified=False",
        )
        assert below["reason"] == "BelowTuned", below
        v = idf(api, "vfy")["status"]["verification"]
        assert v["state"] == "BelowTuned" and v["shortfallPercent"] > v["tolerancePercent"]
        assert "more than the noise below the tuning's measurement" in below["message"]
        warning = await wait_for(lambda: _events(api, "vfy", "BelowTuned"), what="the event")
        assert len(warning) == 1 and warning[0]["type"] == "Warning"
    finally:
        await pod.stop()
        await again.stop()


async def test_a_verification_that_measures_nothing_fails_and_one_turned_off_never_runs(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("nopod", workload=WORKLOAD, serving=SERVING))
    off = {**SERVING, "verification": {"enabled": False}}
    await create(api, manifest("quiet", workload=WORKLOAD, serving=off))
    await to_ready(api, "nopod", tmp_path)
    await to_ready(api, "quiet", tmp_path)

    # No serving pod answers: the Job stores a result that says so, and exits 0.
    job = (await wait_for(lambda: jobs_of(api, "nopod", "verification"), what="the Job"))[0]
    closed = await start_serving_pod(api, "nopod")
    await closed.stop()  # its port is closed now
    out = await run_verifier(job, closed)
    assert "measured nothing usable (cannot reach" in out
    await finish_job(api, job["metadata"]["name"])
    failed = await wait_for(
        lambda: (
            condition(idf(api, "nopod"), "Verified").get("status") == "False"
            and condition(idf(api, "nopod"), "Verified")
        ),
        what="Verified=False",
    )
    assert failed["reason"] == "VerificationFailed" and "cannot reach" in failed["message"]
    assert idf(api, "nopod")["status"]["verification"]["state"] == "Failed"

    # Turned off: no Job, and the condition says why.
    quiet = await wait_for(lambda: condition(idf(api, "quiet"), "Verified"), what="Verified")
    assert (quiet["status"], quiet["reason"]) == ("Unknown", "VerificationDisabled")
    assert jobs_of(api, "quiet", "verification") == []
    assert "verification" not in idf(api, "quiet")["status"]
