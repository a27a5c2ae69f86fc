"""Parallel tuning through the real operator (kmock emulator) and a real PostgreSQL: the
operator refuses workers without a shared storage, runs them as an Indexed Job otherwise, and
its flow is unchanged: the workers' one report reaches the status and the serving Deployment."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import optuna

from .apiserver import (
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    finish_job,
    get,
    jobs_of,
    make_available,
    manifest,
    patch,
    phase,
    run_tuner,
    wait_for,
    warning_events,
)

SECRET = {"name": "optuna-db", "key": "url"}


def _tuning(**extra: Any) -> dict[str, Any]:
    return {"backend": "simulated", "maxTrials": 6, "seed": 1, "parallelism": 2, **extra}


async def test_workers_without_storage_are_refused_then_run_as_an_indexed_job(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path,
    postgres_url: str,
) -> None:  # fmt: skip
    await create(api, manifest("par", tuning=_tuning()))
    await wait_for(lambda: phase(api, "par") == "Failed", what="phase Failed")
    tuned = condition(get(api, "inferencedeployments", "par") or {}, "Tuned")
    assert tuned["reason"] == "InvalidSpec"
    assert "parallelism: 2" in tuned["message"] and "storageSecretRef" in tuned["message"]
    await warning_events(api, "par", "InvalidSpec")
    assert jobs_of(api, "par") == []

    # With the Secret named, the operator starts one Indexed Job of two workers.
    await patch(api, "inferencedeployments", "par",
                {"spec": {"tuning": _tuning(storageSecretRef=SECRET)}})  # fmt: skip
    [job] = await wait_for(lambda: jobs_of(api, "par"), what="the tuner Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    # Play the kubelet for both workers: each pod gets the Secret's content in its environment.
    env = {"INFERTUNE_TUNER_STORAGE": postgres_url}
    outputs = await asyncio.gather(*(run_tuner(api, job, tmp_path, env) for _ in range(2)))
    assert sum("the last worker writes the report" in out for out in outputs) == 1
    assert all(postgres_url not in out for out in outputs)
    await finish_job(api, job["metadata"]["name"])
    await wait_for(lambda: get(api, "deployments", "par"), what="the serving Deployment")
    await make_available(api, "par", 1)
    await wait_for(lambda: phase(api, "par") == "Ready", what="phase Ready")
    status = (get(api, "inferencedeployments", "par") or {})["status"]
    [name] = optuna.get_all_study_names(postgres_url)
    study = optuna.load_study(study_name=name, storage=postgres_url)
    measured = [t for t in study.get_trials() if "measurement" in t.user_attrs]
    assert status["trials"]["executed"] == len(measured) <= 6
    assert postgres_url not in str(status)
