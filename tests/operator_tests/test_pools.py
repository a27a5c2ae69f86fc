"""spec.gpu.pools on the operator (kmock emulator): a tuner Job per pool, each on its pool's
nodes and a worker of one shared study; the winner serves on its pool's nodes, and the status
says which pool and what a million output tokens cost there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest_asyncio

from .apiserver import (
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    finish_job,
    get,
    idf,
    jobs_of,
    manifest,
    phase,
    seed_report,
    start_operator,
    wait_for,
    warning_events,
)

WITH_STORAGE = replace(SETTINGS, tuner_storage="postgresql://tuner:secret@db:5432/infertune")
TAINT = {"key": "pool", "operator": "Equal", "value": "l40s", "effect": "NoSchedule"}
POOLS = {
    "pools": [
        {"product": "L4-24GB", "pricePerGpuHour": 0.79, "nodeSelector": {"pool": "l4"}},
        {"product": "L40S-48GB", "pricePerGpuHour": 1.49, "nodeSelector": {"pool": "l40s"},
         "tolerations": [TAINT], "maxGpusPerReplica": 1},
    ],
    "maxGpusPerReplica": 2,
}  # fmt: skip
# Real trials (the operator's default backend, triton): a Job per pool.
TUNING = {"maxTrials": 6, "seed": 1}


@pytest_asyncio.fixture
async def stored(api: FakeApiServer) -> AsyncIterator[OperatorRunner]:
    runner = await start_operator(api, WITH_STORAGE)
    try:
        yield runner
    finally:
        await runner.stop()


def _pod(job_or_deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(job_or_deployment["spec"]["template"]["spec"])


def _products(pod: dict[str, Any]) -> list[str]:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"])


async def test_each_pool_tunes_on_its_own_nodes_and_the_cheapest_serves_on_its_pool(
    api: FakeApiServer, stored: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("pools", gpu=POOLS, tuning=TUNING, search={
        "tensorParallel": [1, 2], "maxBatchSize": [4, 8, 16], "quantization": ["bf16"],
        "kvCacheDtype": ["auto"]})  # fmt: skip
    await create(api, body)
    jobs = await wait_for(lambda: len(jobs_of(api, "pools")) == 2 and jobs_of(api, "pools"),
                          what="a tuner Job per pool")  # fmt: skip
    by_pool = {j["metadata"]["labels"]["infertune.io/gpu-pool"]: j for j in jobs}
    assert set(by_pool) == {"L4-24GB", "L40S-48GB"}
    for product, pool_spec, gpus in (("L4-24GB", POOLS["pools"][0], "2"),
                                     ("L40S-48GB", POOLS["pools"][1], "1")):  # fmt: skip
        job = by_pool[product]
        pod = _pod(job)
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["INFERTUNE_POOL"] == product  # the worker measures this pool only
        assert env["INFERTUNE_WORKER_GPUS"] == gpus  # the pool's own maxGpusPerReplica
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert pod["nodeSelector"] == pool_spec["nodeSelector"]
        assert any(product.split("-")[0] in v for v in _products(pod))
        assert all(t in pod["tolerations"] for t in pool_spec.get("tolerations", []))
        assert "INFERTUNE_TUNER_STORAGE" in env  # workers of one shared study
    assert TAINT not in _pod(by_pool["L4-24GB"])["tolerations"]
    await wait_for(lambda: phase(api, "pools") == "Pending", what="phase Pending")
    waiting = condition(idf(api, "pools"), "Tuned")["message"]
    assert "tuner Jobs pools-tune0-" in waiting and "are waiting for their pods" in waiting

    # The last worker's report: the operator serves its best on that pool's nodes.
    report = await seed_report(api, body, tmp_path, WITH_STORAGE)
    assert report.best is not None and report.best.gpu in by_pool
    chosen = next(p for p in POOLS["pools"] if p["product"] == report.best.gpu)
    for job in jobs:  # the workers end: the operator reads the report
        await finish_job(api, job["metadata"]["name"])
    deployment = await wait_for(lambda: get(api, "deployments", "pools"), what="the Deployment")
    served = _pod(deployment)
    assert served["nodeSelector"] == chosen["nodeSelector"]
    assert any(report.best.gpu.split("-")[0] in v for v in _products(served))
    status = idf(api, "pools")["status"]
    assert status["bestConfig"]["gpu"] == report.best.gpu
    cost = status["bestMetrics"]["costPerMillionOutputTokens"]
    assert cost == report.best.cost_per_million_output_tokens and cost > 0


async def test_pools_without_a_shared_study_are_refused_before_any_job(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    await create(api, manifest("nodb", gpu=POOLS, tuning=TUNING))
    await wait_for(lambda: phase(api, "nodb") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "nodb"), "Tuned")
    assert tuned["reason"] == "InvalidSpec"
    assert "2 pools tune as one study" in tuned["message"]
    assert "spec.tuning.storageSecretRef" in tuned["message"]
    await warning_events(api, "nodb", "InvalidSpec")
    assert jobs_of(api, "nodb") == []


async def test_a_simulated_tuning_simulates_every_pool_in_one_job(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    await create(api, manifest("sim", gpu=POOLS, tuning={**TUNING, "backend": "simulated"}))
    [job] = await wait_for(lambda: jobs_of(api, "sim"), what="one tuner Job")
    env = {e["name"] for e in _pod(job)["containers"][0]["env"]}
    assert "INFERTUNE_POOL" not in env and "nodeSelector" not in _pod(job)


def test_the_job_names_the_controller_looks_up_are_the_jobs_it_creates() -> None:
    from infertune_operator.objects.tuner_job import tuner_job_names, tuner_jobs
    from infertune_operator.policy.tuning import validate

    for settings, backend in ((WITH_STORAGE, {}), (SETTINGS, {"backend": "simulated"})):
        body = manifest("names", gpu=POOLS, tuning={**TUNING, **backend})
        obj, problems = validate(body)
        assert obj is not None, problems
        rendered = [j["metadata"]["name"] for j in tuner_jobs(obj, body, "abc12345", settings)]
        assert rendered == tuner_job_names(obj, "names", "abc12345", settings)
        assert len(rendered) == (2 if not backend else 1)
        assert all(len(n) <= 63 for n in rendered)
