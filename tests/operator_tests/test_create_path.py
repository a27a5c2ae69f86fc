"""The create path: what a brand-new InferenceDeployment costs in API calls, and its safety nets.

A brand-new object (Kopf's create event, no status, first sync in this process) starts tuning
without re-reading itself and without looking up a Job that cannot exist yet; the report
ConfigMap is always read. Whatever exists after all (a Job left by an operator that died before
writing the status) sends it down the full sync, which reads everything.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kmock._internal import enums

from infertune_operator import naming
from infertune_operator.engine import controller, handlers
from infertune_operator.engine.context import Context
from infertune_operator.kube.client import CONNECTION_POOL_MAXSIZE, Kube
from infertune_operator.objects import tuner_job
from infertune_operator.policy.tuning import tuning_hash, validate

from .apiserver import (
    NS,
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    api_url,
    condition,
    create,
    get,
    jobs_of,
    manifest,
    phase,
    post,
    start_operator,
    wait_for,
)


def _reads(api: FakeApiServer, plural: str, name: str, since: int = 0) -> int:
    """GETs of one named object (not Kopf's lists and watches)."""
    return sum(
        1
        for r in list(api)[since:]
        if r.action == enums.action.FETCH
        and r.resource is not None
        and r.resource.plural == plural
        and r.name == name
    )


def _creates(api: FakeApiServer, plural: str, since: int = 0) -> int:
    return sum(
        1
        for r in list(api)[since:]
        if r.action == enums.action.CREATE
        and r.resource is not None
        and r.resource.plural == plural
    )


def _job_for(body: dict[str, Any]) -> dict[str, Any]:
    obj, problems = validate(body)
    assert obj is not None, problems
    th = tuning_hash(body["spec"], SETTINGS)
    return tuner_job.tuner_job(obj, body, th, SETTINGS)


async def test_a_new_object_reads_only_its_report_before_starting_tuning(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    body = await create(api, manifest("fresh"))
    th = tuning_hash(body["spec"], SETTINGS)
    job_name = naming.job_name("fresh", th)

    await wait_for(lambda: phase(api, "fresh") == "Pending", what="phase Pending")
    assert [j["metadata"]["name"] for j in jobs_of(api, "fresh")] == [job_name]
    assert _reads(api, "inferencedeployments", "fresh") == 0  # Kopf's event body stands in
    assert _reads(api, "jobs", job_name) == 0  # created straight away
    assert _reads(api, "configmaps", naming.report_configmap_name("fresh")) == 1
    assert _creates(api, "jobs") == 1
    tuned = condition(get(api, "inferencedeployments", "fresh"), "Tuned")
    assert tuned["reason"] == "TuningPending"
    assert (get(api, "inferencedeployments", "fresh") or {})["status"]["tuningHash"] == th


async def test_a_create_that_finds_its_job_already_there_adopts_it(api: FakeApiServer) -> None:
    # An operator created the Job and died before it wrote the status (or Kopf its annotation):
    # the next operator sees a create of an object without status, whose Job exists.
    body = await create(api, manifest("orphan"))
    seeded = await post(api, "jobs", _job_for(body))
    seen = len(list(api))

    runner = await start_operator(api)
    try:
        await wait_for(lambda: phase(api, "orphan") == "Pending", what="phase Pending")
    finally:
        await runner.stop()
    assert [j["metadata"]["uid"] for j in jobs_of(api, "orphan")] == [seeded["metadata"]["uid"]]
    assert _creates(api, "jobs", since=seen) == 1  # answered 409 AlreadyExists: adopted
    # ... and then the full sync: the object and the Job were read, not assumed (the Job twice:
    # the adoption after the 409, then the full sync's own lookup).
    assert _reads(api, "inferencedeployments", "orphan", since=seen) == 1
    assert _reads(api, "jobs", seeded["metadata"]["name"], since=seen) == 2


async def test_only_the_first_sync_of_an_object_takes_the_create_shortcut(
    api: FakeApiServer,
) -> None:
    body = await create(api, manifest("twice"))
    ctx = Context(kube=Kube.for_url(api_url(api)), settings=SETTINGS, post_event=lambda *_: None)

    assert (
        await asyncio.to_thread(controller.sync, ctx, NS, "twice", created_body=body) == "Pending"
    )
    assert _reads(api, "inferencedeployments", "twice") == 0
    # Any later call, a create retried with the same event body included, reads what is.
    assert (
        await asyncio.to_thread(controller.sync, ctx, NS, "twice", created_body=body) == "Pending"
    )
    assert _reads(api, "inferencedeployments", "twice") == 1
    assert _creates(api, "jobs") == 1
    assert len(jobs_of(api, "twice")) == 1


async def test_an_object_with_status_never_takes_the_create_shortcut(api: FakeApiServer) -> None:
    body = await create(api, manifest("known"))
    body["status"] = {"phase": "Pending"}
    ctx = Context(kube=Kube.for_url(api_url(api)), settings=SETTINGS, post_event=lambda *_: None)
    await asyncio.to_thread(controller.sync, ctx, NS, "known", created_body=body)
    assert _reads(api, "inferencedeployments", "known") == 1


def test_only_job_events_with_news_reach_the_handler_threads() -> None:
    pending: dict[str, Any] = {"metadata": {"name": "j"}, "status": {}}
    running = {**pending, "status": {"active": 1, "ready": 1}}
    done = {**pending, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert not handlers.job_has_news(body=pending, type="ADDED")
    assert handlers.job_has_news(body=pending, type="DELETED")
    assert handlers.job_has_news(body=running, type="MODIFIED")
    assert handlers.job_has_news(body=done, type="MODIFIED")


def test_every_handler_thread_keeps_its_api_connection() -> None:
    settings = handlers.operator_settings()
    assert settings.execution.max_workers == handlers.HANDLER_THREADS
    assert CONNECTION_POOL_MAXSIZE > handlers.HANDLER_THREADS  # + the resync's thread
    assert Kube.for_url("http://localhost:1")._api.configuration.connection_pool_maxsize == (
        CONNECTION_POOL_MAXSIZE
    )
