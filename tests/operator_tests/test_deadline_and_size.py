"""Nothing runs forever (every tuner Job has a deadline, and the status says when it ended on it)
and the report ConfigMap of the largest study the CRD allows fits the API server's 1 MiB."""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import random
from pathlib import Path

from infertune_operator.kube.client import Kube
from infertune_operator.kube.errors import ClientError
from infertune_operator.objects import tuner_job
from infertune_operator.policy.tuning import tuning_hash, validate
from infertune_operator.reports.owner import WriteAction
from infertune_operator.reports.store import (
    REPORT_BUDGET,
    parse_report,
    report_configmap,
    stored_bytes,
    trials_total,
)
from infertune_operator.reports.writer import write_report
from infertune_tuner.result import Report

from . import faults
from .apiserver import (
    NS,
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    api_url,
    condition,
    create,
    finish_job,
    get,
    idf,
    jobs_of,
    manifest,
    phase,
    wait_for,
    warning_events,
)
from .largest_study import largest_manifest, largest_report
from .test_cli_operator import _invoke_async


async def test_a_job_without_timeout_has_a_deadline_and_the_status_says_it_ended_on_it(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    body = manifest("bounded")  # spec.tuning: maxTrials 6, no timeoutMinutes
    assert "timeoutMinutes" not in body["spec"]["tuning"]
    await create(api, body)
    job = await wait_for(lambda: jobs_of(api, "bounded"), what="the tuner Job")
    job = job[0]
    # 6 trials x (60 min server start-up + 30 min benchmark) + 10 min for the report.
    assert job["spec"]["activeDeadlineSeconds"] == 6 * 90 * 60 + 600
    assert job["metadata"]["annotations"]["infertune.io/deadline"].startswith(
        "6 trials x 90 min per trial"
    )

    # The Job controller stops it at the deadline.
    await finish_job(api, job["metadata"]["name"], succeeded=False, reason="DeadlineExceeded",
                     message="Job was active longer than specified deadline")  # fmt: skip
    await wait_for(lambda: phase(api, "bounded") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "bounded"), "Tuned")
    assert tuned["status"] == "False" and tuned["reason"] == "TuningDeadlineExceeded"
    assert (
        "ran into its deadline of 9 h 10 min (activeDeadlineSeconds 33000 = 6 trials"
        in (tuned["message"])
    )
    assert "spec.tuning.timeoutMinutes is unset" in tuned["message"]
    assert "Set spec.tuning.timeoutMinutes" in tuned["message"]  # what to do about it
    [event] = await warning_events(api, "bounded", "TuningDeadlineExceeded")
    assert "deadline" in event["message"]


async def test_the_emulator_refuses_a_configmap_over_1_mib_as_the_api_server_does(
    api: FakeApiServer,
) -> None:
    kube = Kube.for_url(api_url(api))
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "big", "namespace": NS},
            "data": {"a": "x" * (faults.CONFIGMAP_LIMIT - 10), "b": "y" * 11}}  # fmt: skip
    try:
        await asyncio.to_thread(kube.create, body)
    except ClientError as exc:
        assert exc.status == 422 and exc.reason == "Invalid"
        assert 'ConfigMap "big" is invalid: []: Too long: may not be more than 1048576 bytes' in (
            str(exc)
        )
    else:
        raise AssertionError("a ConfigMap over 1 MiB was accepted")
    body["data"]["b"] = "y" * 10  # exactly 1 MiB: accepted
    assert (await asyncio.to_thread(kube.create, body))[1]


async def test_the_largest_study_the_crd_allows_is_reported_within_1_mib(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = largest_manifest("huge")
    created = await create(api, body)
    obj, problems = validate(created)
    assert obj is not None, problems
    th = tuning_hash(created["spec"], SETTINGS)
    await wait_for(lambda: jobs_of(api, "huge"), what="the tuner Job")
    report = await asyncio.to_thread(largest_report, created)
    assert report.space_size == 4480 and report.executed_trials == 1000
    whole = report.to_json()
    print(f"largest study: {len(whole.encode())} bytes of JSON (indented, as written before)")

    # What the tuner Job writes, through the emulator's 1 MiB check.
    kube = Kube.for_url(api_url(api))
    request = tuner_job.tuning_request(obj, SETTINGS)
    outcome = await asyncio.to_thread(
        write_report, kube, request=request, report=report, namespace=NS, th=th,
        uid=created["metadata"]["uid"],
    )  # fmt: skip
    assert outcome.action is WriteAction.CREATE and outcome.complete
    stored = get(api, "configmaps", "huge-tuning-report")
    assert stored is not None
    size = stored_bytes(stored)
    print(f"stored: {size} bytes ({size / faults.CONFIGMAP_LIMIT:.0%} of 1 MiB)")
    assert size <= REPORT_BUDGET
    assert parse_report(stored) == report  # every trial, in the compressed form

    # The operator serves from it, and the status counts every configuration considered.
    await wait_for(lambda: phase(api, "huge") == "Deploying", timeout=30, what="phase Deploying")
    trials = idf(api, "huge")["status"]["trials"]
    assert trials == {"executed": 1000, "total": 4480}


async def test_a_largest_study_gzip_cannot_shrink_is_stored_as_its_summary(
    api: FakeApiServer,
) -> None:
    body = largest_manifest("noisy")
    created = await create(api, body)
    obj, problems = validate(created)
    assert obj is not None, problems
    report = await asyncio.to_thread(largest_report, created, incompressible=True)
    kube = Kube.for_url(api_url(api))

    # What earlier versions stored (the report gzipped whole) is over the limit: refused.
    old = copy.deepcopy(report_configmap(
        name="noisy", namespace=NS, report=report.model_copy(update={"trials": []}),
        th="x", owner_uid=None))  # fmt: skip
    packed = gzip.compress(report.to_json().encode(), compresslevel=9, mtime=0)
    print(f"incompressible study: {len(packed)} bytes gzipped (the earlier codec's form)")
    old["data"], old["binaryData"] = None, {"report.json.gz": base64.b64encode(packed).decode()}
    try:
        await asyncio.to_thread(kube.create, old)
    except ClientError as exc:
        assert exc.status == 422 and "Too long" in str(exc)
    else:
        raise AssertionError("the emulator took a ConfigMap over 1 MiB")

    request = tuner_job.tuning_request(obj, SETTINGS)
    outcome = await asyncio.to_thread(
        write_report, kube, request=request, report=report, namespace=NS, th="x",
        uid=created["metadata"]["uid"],
    )  # fmt: skip
    assert outcome.action is WriteAction.CREATE and not outcome.complete
    stored = get(api, "configmaps", "noisy-tuning-report")
    assert stored is not None
    size = stored_bytes(stored)
    print(f"stored summary: {size} bytes ({size / faults.CONFIGMAP_LIMIT:.0%} of 1 MiB)")
    assert size <= REPORT_BUDGET
    summary = parse_report(stored)
    assert summary.best == report.best and len(summary.trials) == 1000
    assert trials_total(stored, summary) == 4480


async def test_infertune_report_renders_what_a_summary_keeps(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.run import tune

    body = manifest("brief")
    created = await create(api, body)
    obj, problems = validate(created)
    assert obj is not None, problems
    report = tune(to_request(obj), backend="simulated", out_dir=tmp_path / "study")
    rng = random.Random(5)
    loud = [  # failure text gzip cannot shrink: only the summary fits
        t.model_copy(update={"reason": base64.b64encode(rng.randbytes(600_000)).decode()})
        for t in report.trials
    ]
    noisy = report.model_copy(update={"trials": loud})
    kube = Kube.for_url(api_url(api))
    outcome = await asyncio.to_thread(
        write_report, kube, request=tuner_job.tuning_request(obj, SETTINGS), report=noisy,
        namespace=NS, th="x", uid=created["metadata"]["uid"],
    )  # fmt: skip
    assert not outcome.complete

    out = tmp_path / "out"
    result = await _invoke_async(["report", "brief", "-n", NS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    executed = len([t for t in report.trials if t.executed])
    assert f"holds a summary of the report: the {executed} executed trials of " in result.output
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html"}
    rendered = Report.model_validate_json((out / "report.json").read_text())
    assert rendered.best == report.best
    assert "Best" in (out / "report.md").read_text()  # the verdict, rendered from the summary
