"""Whose report is it: a stale tuner never replaces a newer tuning's report, the operator checks a
report's own request, and an object created again under the same name starts its own tuning.

The superseded tuner pod is played as a kubelet would leave it: its Job and request ConfigMap are
deleted by the operator when the spec changes, but the pod, which mounted the request, may still
finish and run its `infertune tune-job` write.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from infertune_operator import naming
from infertune_operator.objects import tuner_job
from infertune_operator.policy.tuning import tuning_hash, validate
from infertune_operator.reports.owner import (
    WriteAction,
    foreign_reason,
    plan_write,
    request_difference,
)
from infertune_operator.reports.store import configmap_hash, parse_report, writer_job_uid
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Report

from .apiserver import (
    NS,
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    delete,
    events_for,
    finish_job,
    get,
    idf,
    jobs_of,
    make_available,
    manifest,
    patch,
    phase,
    post,
    run_tuner,
    seed_report,
    start_job,
    start_operator,
    wait_for,
)

TIGHTER = {"e2eLatencyMs": {"p95": 15000}}


def _report_of(api: FakeApiServer, name: str) -> Report:
    cm = get(api, "configmaps", f"{name}-tuning-report")
    assert cm is not None
    return parse_report(cm)


def _slo_p95(report: Report) -> float:
    return next(b["max_ms"] for b in report.request["slo"] if b["percentile"] == "p95")


async def _job_with_hash(api: FakeApiServer, name: str, th: str) -> dict[str, Any]:
    job: dict[str, Any] = await wait_for(
        lambda: next(
            (j for j in jobs_of(api, name) if j["metadata"]["labels"]["infertune.io/tuning-hash"]
             == th), None),
        what=f"the tuner Job of tuning {th}",
    )  # fmt: skip
    return job


def _mounted(api: FakeApiServer, name: str, th: str) -> str:
    """The request a tuner pod of tuning ``th`` mounted (its request ConfigMap's request.json)."""
    request_cm = get(api, "configmaps", f"{name}-tune-{th}-request")
    assert request_cm is not None, f"no request ConfigMap for tuning {th}"
    return str(request_cm["data"]["request.json"])


async def _first_then_changed(
    api: FakeApiServer, name: str
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Create, wait for Job A, keep what its pod mounted; change the SLO; wait for Job B."""
    body = await create(api, manifest(name))
    th_a = tuning_hash(body["spec"], SETTINGS)
    job_a = await _job_with_hash(api, name, th_a)
    mounted = _mounted(api, name, th_a)
    changed = await patch(api, "inferencedeployments", name, {"spec": {"slo": TIGHTER}})
    th_b = tuning_hash(changed["spec"], SETTINGS)
    job_b = await _job_with_hash(api, name, th_b)
    # The superseded Job goes (its pod may not, yet).
    await wait_for(lambda: len(jobs_of(api, name)) == 1, what="Job A deleted")
    return copy.deepcopy(job_a), mounted, job_b


async def test_a_stale_tuner_loses_while_the_operator_runs(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    job_a, mounted_a, job_b = await _first_then_changed(api, "live")
    th_b = job_b["metadata"]["labels"]["infertune.io/tuning-hash"]
    await run_tuner(api, job_b, tmp_path)
    await finish_job(api, job_b["metadata"]["name"])
    await wait_for(lambda: phase(api, "live") == "Deploying", what="phase Deploying")
    before = get(api, "configmaps", "live-tuning-report")
    assert before is not None

    # The superseded tuner pod finishes after the new tuning wrote its report.
    out = await run_tuner(api, job_a, tmp_path, request=mounted_a)
    assert "report not written: the spec of team-a/live changed since this tuning started" in out
    assert "slo" in out
    after = get(api, "configmaps", "live-tuning-report")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert configmap_hash(after) == th_b
    assert _slo_p95(_report_of(api, "live")) == 15000  # `infertune report` shows the new one
    await make_available(api, "live", 1)
    await wait_for(lambda: phase(api, "live") == "Ready", what="phase Ready")
    assert idf(api, "live")["status"]["tuningHash"] == th_b


async def test_a_stale_tuner_loses_while_the_operator_is_down(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    runner = await start_operator(api)
    try:
        job_a, mounted_a, job_b = await _first_then_changed(api, "down")
        await wait_for(lambda: phase(api, "down") == "Pending", what="phase Pending (tuning B)")
    finally:
        await runner.stop()
    th_b = job_b["metadata"]["labels"]["infertune.io/tuning-hash"]

    # With no operator watching: the stale tuner before the new one, the new one, and the stale
    # one again (a retried pod) after it. Neither stale write lands.
    out = await run_tuner(api, job_a, tmp_path, request=mounted_a)
    assert "report not written" in out
    assert get(api, "configmaps", "down-tuning-report") is None
    await run_tuner(api, job_b, tmp_path)
    await finish_job(api, job_b["metadata"]["name"])
    out = await run_tuner(api, job_a, tmp_path, request=mounted_a)
    assert "report not written" in out
    assert configmap_hash(get(api, "configmaps", "down-tuning-report")) == th_b

    runner = await start_operator(api)
    try:
        # The new tuning's result is served; it is not "succeeded but left no report".
        await wait_for(lambda: phase(api, "down") == "Deploying", what="phase Deploying")
        tuned = condition(idf(api, "down"), "Tuned")
        assert tuned["status"] == "True" and tuned["reason"] == "TuningSucceeded"
        assert idf(api, "down")["status"]["tuningHash"] == th_b
        assert len(jobs_of(api, "down")) == 1  # nothing tuned again
    finally:
        await runner.stop()


async def test_a_serving_only_edit_while_the_tuner_runs_keeps_its_finished_tuning(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("served"))
    th = tuning_hash(body["spec"], SETTINGS)
    job = await _job_with_hash(api, "served", th)
    await start_job(api, job["metadata"]["name"])
    await wait_for(lambda: phase(api, "served") == "Tuning", what="phase Tuning")

    # spec.serving is not what a tuning answers: the same tuning, finished as it started.
    serving = {"startupTimeoutMinutes": 90, "replicas": 2}
    changed = await patch(api, "inferencedeployments", "served", {"spec": {"serving": serving}})
    assert tuning_hash(changed["spec"], SETTINGS) == th
    out = await run_tuner(api, job, tmp_path)
    assert "report not written" not in out
    await finish_job(api, job["metadata"]["name"])

    await wait_for(lambda: phase(api, "served") == "Deploying", what="phase Deploying")
    tuned = condition(idf(api, "served"), "Tuned")
    assert tuned["status"] == "True" and tuned["reason"] == "TuningSucceeded"
    assert len(jobs_of(api, "served")) == 1  # nothing tuned again
    deployment = get(api, "deployments", "served")
    assert deployment is not None and deployment["spec"]["replicas"] == 2  # the edit is served


async def test_a_tuner_superseded_by_an_edit_outside_its_request_never_replaces_the_new_report(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("moved"))
    th_a = tuning_hash(body["spec"], SETTINGS)
    job_a = copy.deepcopy(await _job_with_hash(api, "moved", th_a))
    mounted_a = _mounted(api, "moved", th_a)
    # Trials move to other nodes: another tuning (the hash), the same request.
    gpu = {**body["spec"]["gpu"], "nodeSelector": {"pool": "h100-b"}}
    changed = await patch(api, "inferencedeployments", "moved", {"spec": {"gpu": gpu}})
    th_b = tuning_hash(changed["spec"], SETTINGS)
    assert th_b != th_a
    job_b = await _job_with_hash(api, "moved", th_b)
    assert _mounted(api, "moved", th_b) == mounted_a
    await wait_for(lambda: len(jobs_of(api, "moved")) == 1, what="Job A deleted")
    await wait_for(lambda: idf(api, "moved")["status"].get("tuningHash") == th_b,
                   what="the status names tuning B")  # fmt: skip

    # The superseded pod finishes first: its report would only be ignored, it is not written.
    out = await run_tuner(api, job_a, tmp_path, request=mounted_a)
    assert f"asks for tuning {th_b} now" in out
    assert get(api, "configmaps", "moved-tuning-report") is None

    await run_tuner(api, job_b, tmp_path)
    await finish_job(api, job_b["metadata"]["name"])
    await wait_for(lambda: phase(api, "moved") == "Deploying", what="phase Deploying")
    before = get(api, "configmaps", "moved-tuning-report")
    assert before is not None and configmap_hash(before) == th_b

    # ... and once more after B's report (a retried pod): B's report stays.
    out = await run_tuner(api, job_a, tmp_path, request=mounted_a)
    assert "report not written" in out
    after = get(api, "configmaps", "moved-tuning-report")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    await make_available(api, "moved", 1)
    await wait_for(lambda: phase(api, "moved") == "Ready", what="phase Ready")
    tuned = condition(idf(api, "moved"), "Tuned")
    assert tuned["status"] == "True" and idf(api, "moved")["status"]["tuningHash"] == th_b


async def test_a_tuner_job_deleted_by_hand_and_created_again_tunes_once(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("twice"))
    th = tuning_hash(body["spec"], SETTINGS)
    first = copy.deepcopy(await _job_with_hash(api, "twice", th))
    job_name, first_uid = first["metadata"]["name"], first["metadata"]["uid"]
    await start_job(api, job_name)
    mounted = _mounted(api, "twice", th)

    # Someone deletes the Job (its pod goes on); the operator creates it again.
    await delete(api, "jobs", job_name)
    second = await wait_for(
        lambda: next((j for j in jobs_of(api, "twice") if j["metadata"]["uid"] != first_uid),
                     None),
        what="the tuner Job created again",
    )  # fmt: skip
    assert second["metadata"]["name"] == job_name
    await start_job(api, job_name)

    # The first pod answers: the second Job is stopped, the tuning served once.
    await run_tuner(api, first, tmp_path, request=mounted,
                    env={naming.TUNER_JOB_UID_ENV: first_uid})  # fmt: skip
    report = get(api, "configmaps", "twice-tuning-report")
    assert report is not None and writer_job_uid(report) == first_uid
    await wait_for(lambda: jobs_of(api, "twice") == [], what="the second tuner Job deleted")
    await wait_for(lambda: phase(api, "twice") == "Deploying", what="phase Deploying")
    [stopped] = [e for e in events_for(api, "twice") if e["reason"] == "DuplicateTunerStopped"]
    assert first_uid in stopped["message"] and job_name in stopped["message"]


async def test_the_tuner_job_that_answers_is_left_alone(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("once"))
    job = await _job_with_hash(api, "once", tuning_hash(body["spec"], SETTINGS))
    await start_job(api, job["metadata"]["name"])
    await run_tuner(api, job, tmp_path, env={naming.TUNER_JOB_UID_ENV: job["metadata"]["uid"]})
    await wait_for(lambda: phase(api, "once") == "Deploying", what="phase Deploying")
    assert [j["metadata"]["uid"] for j in jobs_of(api, "once")] == [job["metadata"]["uid"]]
    # The Job's env tells its pod its Job's uid (the Job controller's pod label).
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    [uid_env] = [e for e in env if e["name"] == naming.TUNER_JOB_UID_ENV]
    assert uid_env["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"
    )


async def test_a_report_labelled_for_this_tuning_that_answers_another_request_is_not_served(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    old = manifest("forged")
    await seed_report(api, old, tmp_path)  # the old spec's result ...
    new = copy.deepcopy(old)
    new["spec"]["slo"] = TIGHTER
    th = tuning_hash(new["spec"], SETTINGS)
    cm = get(api, "configmaps", "forged-tuning-report")
    assert cm is not None
    relabel = {"metadata": {"annotations": {"infertune.io/tuning-hash": th},
                            "labels": {"infertune.io/tuning-hash": th}}}  # fmt: skip
    await patch(api, "configmaps", "forged-tuning-report", relabel)  # ... labelled as the new one

    await create(api, new)
    job = await _job_with_hash(api, "forged", th)  # tuned for real, not served from it
    assert job["metadata"]["name"] == f"forged-tune-{th}"
    await wait_for(lambda: phase(api, "forged") == "Pending", what="phase Pending")
    assert get(api, "deployments", "forged") is None


async def test_an_object_created_again_under_the_same_name_starts_its_own_tuning(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    first = await create(api, manifest("again"))
    uid1 = first["metadata"]["uid"]
    th = tuning_hash(first["spec"], SETTINGS)
    job1 = await _job_with_hash(api, "again", th)
    await run_tuner(api, job1, tmp_path)
    await wait_for(lambda: phase(api, "again") == "Deploying", what="phase Deploying")

    # Deleted and created again before the garbage collector removed the first one's Job,
    # request, report and serving objects (the emulator has no garbage collector).
    await delete(api, "inferencedeployments", "again")
    second = await create(api, manifest("again"))
    uid2 = second["metadata"]["uid"]
    assert uid2 != uid1

    job2 = await wait_for(
        lambda: next((j for j in jobs_of(api, "again")
                      if j["metadata"]["ownerReferences"][0]["uid"] == uid2), None),
        what="a tuner Job of the new object",
    )  # fmt: skip
    assert job2["metadata"]["name"] == job1["metadata"]["name"]  # same spec, same name
    assert len(jobs_of(api, "again")) == 1  # the old uid's Job is gone, not adopted
    request = get(api, "configmaps", f"again-tune-{th}-request")
    assert request is not None and request["metadata"]["ownerReferences"][0]["uid"] == uid2
    await wait_for(lambda: phase(api, "again") == "Pending", what="phase Pending")
    assert condition(idf(api, "again"), "Tuned")["reason"] == "TuningPending"

    # The first object's tuner, late, does not write for the second one.
    out = await run_tuner(api, job1, tmp_path, request=str(request["data"]["request.json"]))
    assert "was deleted and created again" in out
    assert get(api, "configmaps", "again-tuning-report")["metadata"]["ownerReferences"][0][
        "uid"
    ] == uid1  # fmt: skip

    await run_tuner(api, job2, tmp_path)
    report_cm = get(api, "configmaps", "again-tuning-report")
    assert report_cm is not None and report_cm["metadata"]["ownerReferences"][0]["uid"] == uid2
    await wait_for(lambda: phase(api, "again") == "Deploying", what="phase Deploying")
    deployment = get(api, "deployments", "again")
    assert deployment is not None
    assert [r["uid"] for r in deployment["metadata"]["ownerReferences"]] == [uid2]


# ------------------------------------------------------------------ the decisions, alone


def _request(body: dict[str, Any]) -> TuningRequest:
    obj, problems = validate(body)
    assert obj is not None, problems
    return tuner_job.tuning_request(obj, SETTINGS)


def test_a_tuner_writes_only_while_its_object_asks_for_its_request() -> None:
    body = manifest("w")
    body["metadata"]["uid"] = "u1"
    mine = _request(body)
    existing = {"metadata": {"resourceVersion": "42"}}

    plan = plan_write(owner=body, owner_known=True, uid="u1", mine=mine,
                                   existing=None)  # fmt: skip
    assert plan.action is WriteAction.CREATE
    plan = plan_write(owner=body, owner_known=True, uid="u1", mine=mine,
                                   existing=existing)  # fmt: skip
    assert plan.action is WriteAction.REPLACE and plan.resource_version == "42"

    changed = copy.deepcopy(body)
    changed["spec"]["search"]["maxBatchSize"] = [4, 8]
    plan = plan_write(owner=changed, owner_known=True, uid="u1", mine=mine,
                                   existing=existing)  # fmt: skip
    assert plan.action is WriteAction.SKIP and "search.max_batch_size" in plan.reason
    # Where the request ran differs (storage, workers): still the same question answered.
    wider = mine.model_copy(update={"tuning": mine.tuning.model_copy(update={"parallelism": 1,
                                                                             "storage": "x"})})  # fmt: skip
    assert request_difference(wider.dump(), mine) is None

    reborn = copy.deepcopy(body)
    reborn["metadata"]["uid"] = "u2"
    plan = plan_write(owner=reborn, owner_known=True, uid="u1", mine=mine,
                                   existing=existing)  # fmt: skip
    assert plan.action is WriteAction.SKIP and "created again" in plan.reason
    plan = plan_write(owner=None, owner_known=True, uid="u1", mine=mine,
                                   existing=existing)  # fmt: skip
    assert plan.action is WriteAction.SKIP and "no longer exists" in plan.reason
    # A tuner that may not read its object (an older role) writes as before.
    plan = plan_write(owner=None, owner_known=False, uid="u1", mine=mine,
                                   existing=existing)  # fmt: skip
    assert plan.action is WriteAction.REPLACE


def test_no_serving_edit_changes_what_a_tuning_answers() -> None:
    body = manifest("s")
    mine = _request(body)
    edits: list[dict[str, Any]] = [
        {"startupTimeoutMinutes": 5},
        {"replicas": 3},
        {"image": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"},
        {"resources": {"requests": {"cpu": "8", "memory": "64Gi"}}},
    ]
    for edit in edits:
        changed = copy.deepcopy(body)
        changed["spec"]["serving"] = edit
        assert tuning_hash(changed["spec"], SETTINGS) == tuning_hash(body["spec"], SETTINGS)
        assert request_difference(mine.dump(), _request(changed)) is None, edit


def test_a_tuner_may_not_write_over_the_tuning_its_object_asks_for_now() -> None:
    body = manifest("w")
    body["metadata"].update(uid="u1", generation=2)
    mine = _request(body)
    report_b = {"metadata": {"resourceVersion": "7", "annotations":
                             {"infertune.io/tuning-hash": "bbbbbbbb"}}}  # fmt: skip
    report_a = {"metadata": {"resourceVersion": "6", "annotations":
                             {"infertune.io/tuning-hash": "aaaaaaaa"}}}  # fmt: skip

    def plan(status: dict[str, Any], existing: dict[str, Any] | None) -> WriteAction:
        owner = {**body, "status": status}
        return plan_write(owner=owner, owner_known=True, uid="u1", mine=mine,
                          existing=existing, th="aaaaaaaa").action  # fmt: skip

    # The operator has seen generation 2 and tunes B for it: A's report is not wanted.
    seen_b = {"tuningHash": "bbbbbbbb", "observedGeneration": 2}
    assert plan(seen_b, None) is WriteAction.SKIP
    assert plan(seen_b, report_a) is WriteAction.SKIP
    # Not seen yet: A may write (the operator will tell the hashes apart) ...
    unseen_b = {"tuningHash": "bbbbbbbb", "observedGeneration": 1}
    assert plan(unseen_b, None) is WriteAction.CREATE
    # ... but never over the report of the tuning the status names.
    assert plan(unseen_b, report_b) is WriteAction.SKIP
    # Its own tuning: written as before (a retried pod replaces its own report).
    assert plan({"tuningHash": "aaaaaaaa", "observedGeneration": 2}, report_a) is (
        WriteAction.REPLACE
    )
    assert plan({}, None) is WriteAction.CREATE  # no status yet: a brand-new object


def test_a_report_is_foreign_when_its_hash_or_owner_differ() -> None:
    cm = {"metadata": {"annotations": {"infertune.io/tuning-hash": "h1"},
                       "ownerReferences": [{"apiVersion": "infertune.io/v1alpha1",
                                            "kind": "InferenceDeployment", "uid": "u1"}]}}  # fmt: skip
    assert foreign_reason(cm, uid="u1", th="h1") is None
    assert "tuning h1" in str(foreign_reason(cm, uid="u1", th="h2"))
    assert "earlier InferenceDeployment" in str(foreign_reason(cm, uid="u2", th="h1"))
    seeded = {"metadata": {"annotations": {"infertune.io/tuning-hash": "h1"}}}
    assert foreign_reason(seeded, uid="u2", th="h1") is None  # nobody's: accepted
    assert foreign_reason(None, uid="u1", th="h1") == "there is no report"


async def test_a_replace_with_a_stale_resource_version_is_a_conflict(
    api: FakeApiServer,
) -> None:
    import asyncio

    import pytest

    from infertune_operator.kube.client import Kube
    from infertune_operator.kube.errors import Conflict

    from .apiserver import api_url

    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "race", "namespace": NS}, "data": {"a": "1"}}  # fmt: skip
    created = await post(api, "configmaps", cm)
    kube = Kube.for_url(api_url(api))
    first = copy.deepcopy(created)
    first["data"] = {"a": "2"}
    written = await asyncio.to_thread(kube.replace, first)
    assert written["data"] == {"a": "2"}
    assert written["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    late = copy.deepcopy(created)  # read before the write above
    late["data"] = {"a": "3"}
    with pytest.raises(Conflict, match="the object has been modified"):
        await asyncio.to_thread(kube.replace, late)
    assert (get(api, "configmaps", "race") or {})["data"] == {"a": "2"}


def test_an_object_created_again_is_claimed_even_when_its_deletion_event_was_merged_away() -> None:
    from infertune_operator.engine.context import Context

    from .apiserver import SETTINGS as settings

    ctx = Context(kube=None, settings=settings)  # type: ignore[arg-type]
    assert ctx.claim(NS, "x", 1, "u1") and ctx.first_sync(NS, "x")
    assert not ctx.claim(NS, "x", 1, "u1")  # our own status write: nothing to do
    assert ctx.claim(NS, "x", 2, "u1")  # a spec change
    # Deleted and created again: Kopf may hand over only the new object's event (generation 1).
    assert ctx.claim(NS, "x", 1, "u2")
    assert ctx.first_sync(NS, "x")  # and it takes the create path of a new object
