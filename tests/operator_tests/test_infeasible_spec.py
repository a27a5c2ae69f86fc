"""A spec that passes the schema but leaves nothing to tune (FP8 on an Ampere pool, a tensor
parallelism that divides none of the model's heads) is refused at once, as `infertune validate`
refuses it: InvalidSpec with every problem, one Warning, no tuner Job and no request ConfigMap.
A spec already tuned and serving keeps serving whatever a newer operator thinks of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_operator.policy.tuning import tuning_hash

from .apiserver import (
    SETTINGS,
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    creations,
    events_for,
    get,
    idf,
    jobs_of,
    manifest,
    patch,
    phase,
    start_operator,
    wait_for,
    warning_events,
)

# FP8 only, on a GPU without FP8 kernels; the model's checkpoint for it is there (real trials).
FP8_ON_AMPERE: dict[str, Any] = {
    "gpu": {"product": "A100-SXM-80GB", "maxGpusPerReplica": 2},
    "model": {"name": "llama-3-8b", "checkpoints": {"fp8": "hf://org/llama-3-8b-fp8"}},
    "search": {"tensorParallel": [1, 2], "maxBatchSize": [8, 16], "quantization": ["fp8"],
               "kvCacheDtype": ["auto"]},
    "tuning": {"backend": "triton", "maxTrials": 6},
}  # fmt: skip
# Tensor parallelism 64 only, for a model with 32 attention heads.
TP_64: dict[str, Any] = {
    "gpu": {"product": "H100-SXM-80GB", "maxGpusPerReplica": 64},
    "search": {"tensorParallel": [64], "maxBatchSize": [8], "quantization": ["bf16"],
               "kvCacheDtype": ["auto"]},
}  # fmt: skip


def _validate_problems(body: dict[str, Any], tmp_path: Path) -> list[str]:
    """What `infertune validate` prints for the same manifest: one problem a line."""
    path = tmp_path / f"{body['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    return [line[4:] for line in result.output.splitlines() if line.startswith("  - ")]


async def _refused(api: FakeApiServer, name: str, problems: list[str]) -> None:
    """Failed, Tuned=False/InvalidSpec naming each problem, one Warning, nothing created."""
    await wait_for(lambda: phase(api, name), what="a status")
    obj = idf(api, name)
    assert obj["status"]["phase"] == "Failed", obj["status"]["message"]
    tuned = condition(obj, "Tuned")
    assert (tuned["status"], tuned["reason"]) == ("False", "InvalidSpec"), tuned
    assert problems
    for problem in problems:
        assert problem in tuned["message"]
        assert problem in obj["status"]["message"]
    warnings = await warning_events(api, name, "InvalidSpec")
    assert len(warnings) == 1
    assert jobs_of(api, name) == []
    assert creations(api, "jobs") == 0
    assert creations(api, "configmaps", "request") == 0


async def test_fp8_only_on_an_ampere_pool_is_refused_as_validate_refuses_it(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("fp8", **FP8_ON_AMPERE)
    problems = _validate_problems(body, tmp_path)
    assert any("quantization=fp8: A100-SXM-80GB (ampere) has no kernels" in p for p in problems)
    await create(api, body)
    await _refused(api, "fp8", problems)

    # A quantization the GPU runs: the same object starts tuning.
    await patch(
        api, "inferencedeployments", "fp8", {"spec": {"search": {"quantization": ["bf16"]}}}
    )
    job = await wait_for(lambda: jobs_of(api, "fp8"), what="a tuner Job")
    th = tuning_hash(idf(api, "fp8")["spec"], SETTINGS)
    assert job[0]["metadata"]["name"] == f"fp8-tune-{th}"
    assert get(api, "configmaps", f"fp8-tune-{th}-request") is not None
    await wait_for(lambda: phase(api, "fp8") == "Pending", what="phase Pending")
    assert condition(idf(api, "fp8"), "Tuned")["reason"] == "TuningPending"


async def test_a_tensor_parallelism_too_large_for_the_model_is_refused(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("tp64", **TP_64)
    problems = _validate_problems(body, tmp_path)
    assert any("tensor_parallel=64: does not divide the model's 32 attention heads" in p
               for p in problems)  # fmt: skip
    await create(api, body)
    await _refused(api, "tp64", problems)

    await patch(api, "inferencedeployments", "tp64", {"spec": {"search": {"tensorParallel": [2]}}})
    await wait_for(lambda: jobs_of(api, "tp64"), what="a tuner Job")
    await wait_for(lambda: phase(api, "tp64") == "Pending", what="phase Pending")


async def test_every_problem_is_listed_together(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    # Four workers with no study database, and FP8 on Ampere: both in one condition.
    spec = {**FP8_ON_AMPERE, "tuning": {**FP8_ON_AMPERE["tuning"], "parallelism": 4}}
    body = manifest("both", **spec)
    problems = _validate_problems(body, tmp_path)
    await create(api, body)
    await _refused(api, "both", [*problems, "spec.tuning.parallelism: 4 workers"])


async def test_a_deployment_tuned_before_an_upgrade_keeps_serving(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A spec tuned by an earlier operator that a newer one would refuse: nothing is torn
    down and no InvalidSpec is set; only a new tuning would be refused."""
    body = await create(
        api, manifest("old", **{**FP8_ON_AMPERE, "tuning": {"backend": "simulated"}})
    )
    assert _validate_problems(body, tmp_path)
    th = tuning_hash(body["spec"], SETTINGS)
    tuned = {"type": "Tuned", "status": "True", "reason": "TuningSucceeded", "message": "tuned",
             "lastTransitionTime": "2024-01-01T00:00:00Z"}  # fmt: skip
    best = {"tp": 1, "maxBatchSize": 8, "quantization": "fp8", "kvCacheDtype": "auto"}
    status = {"phase": "Ready", "tuningHash": th, "bestConfig": best, "conditions": [tuned]}
    await patch(api, "inferencedeployments", "old", {"status": status}, sub="status")

    runner = await start_operator(api)
    try:
        await wait_for(lambda: get(api, "deployments", "old"), what="the serving Deployment")
        await wait_for(lambda: phase(api, "old") == "Deploying", what="phase Deploying")
        assert condition(idf(api, "old"), "Tuned")["status"] == "True"
        assert not [e for e in events_for(api, "old") if e["reason"] == "InvalidSpec"]
        assert creations(api, "jobs") == 0
    finally:
        await runner.stop()
