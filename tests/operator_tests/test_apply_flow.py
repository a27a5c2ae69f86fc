"""The operator end to end (Kopf against the emulator): what a changed spec does to the serving
Deployment (server-side apply), and what the user sees when the API server refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infertune_operator.engine.context import IN_FLIGHT

from .apiserver import (
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    events_for,
    get,
    idf,
    make_available,
    manifest,
    patch,
    path_of,
    phase,
    seed_report,
    wait_for,
)

BF16 = {"tensorParallel": [1, 2], "maxBatchSize": [4, 8, 16], "quantization": ["bf16"],
        "kvCacheDtype": ["auto"]}  # fmt: skip
TRITON = {"backend": "triton", "maxTrials": 6, "seed": 1}


def _pod(api: FakeApiServer, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = (
        ((get(api, "deployments", name) or {}).get("spec") or {})
        .get("template", {})
        .get("spec", {})
    )
    return pod


async def _respec(
    api: FakeApiServer, name: str, change: dict[str, Any], tmp_path: Path
) -> dict[str, Any]:
    """Change the spec with a merge patch, the tuning for the new spec already done."""
    body = idf(api, name)
    from kmock._internal.dicts import patch_dict

    future = {**body, "spec": dict(patch_dict(body["spec"], change))}
    await seed_report(api, future, tmp_path)
    return await patch(api, "inferencedeployments", name, {"spec": change})


async def test_placement_the_spec_drops_leaves_the_deployment(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    gpu = {"product": "L4-24GB", "maxGpusPerReplica": 2,
           "nodeSelector": {"pool": "l4", "zone": "a"},
           "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}]}  # fmt: skip
    body = manifest("place", gpu=gpu, search=BF16, tuning=TRITON)
    await seed_report(api, body, tmp_path)
    await create(api, body)
    await wait_for(lambda: _pod(api, "place").get("nodeSelector"), what="the Deployment")
    assert _pod(api, "place")["nodeSelector"] == {"pool": "l4", "zone": "a"}
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml"}
    assert toleration in _pod(api, "place")["tolerations"]
    # Another field manager annotates the Deployment: none of the operator's business.
    async with api.patch(
        path_of("deployments", "place"),
        params={"fieldManager": "kubectl"},
        json={"metadata": {"annotations": {"team.example/owner": "ml"}}},
    ) as r:
        assert r.status == 200  # fmt: skip

    # Drop a nodeSelector key: gone from the Deployment (a merge patch would have kept it).
    await _respec(api, "place", {"gpu": {"nodeSelector": {"zone": None}}}, tmp_path)
    await wait_for(
        lambda: _pod(api, "place").get("nodeSelector") == {"pool": "l4"},
        what="nodeSelector without zone",
    )

    # Switch to the simulated backend: no GPU placement at all any more.
    await _respec(api, "place", {"tuning": {"backend": "simulated"}}, tmp_path)
    await wait_for(
        lambda: _pod(api, "place").get("containers", [{}])[0].get("name") == "simserver",
        what="the simulated server",
    )
    pod = _pod(api, "place")
    assert "nodeSelector" not in pod and "tolerations" not in pod and "affinity" not in pod
    live = get(api, "deployments", "place") or {}
    assert live["metadata"]["annotations"]["team.example/owner"] == "ml"
    assert condition(idf(api, "place"), "Deployed")["reason"] == "ServingApplied"


async def test_a_refused_apply_is_reported_once_and_not_retried(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("refuse")
    await seed_report(api, body, tmp_path)
    await create(api, body)
    await wait_for(lambda: phase(api, "refuse") == "Deploying", what="phase Deploying")
    await make_available(api, "refuse", 1)
    await wait_for(lambda: phase(api, "refuse") == "Ready", what="phase Ready")

    # A quantity the grammar allows and the API server's validation refuses (422).
    limits = {"limits": {"cpu": "-1"}}
    await patch(api, "inferencedeployments", "refuse", {"spec": {"serving": {"resources": limits}}})
    await wait_for(
        lambda: condition(idf(api, "refuse"), "Deployed").get("reason") == "ApplyFailed",
        what="Deployed=False/ApplyFailed",
    )
    obj = idf(api, "refuse")
    deployed = condition(obj, "Deployed")
    assert deployed["status"] == "False"
    assert "spec.template.spec.containers[0].resources.limits.cpu" in deployed["message"]
    assert "must be greater than or equal to 0" in deployed["message"]
    # The running configuration is untouched and keeps serving; the object waits for the user.
    assert obj["status"]["phase"] == "Failed" and "Failed" not in IN_FLIGHT
    assert condition(obj, "Ready")["status"] == "True"
    assert "keeps serving" in obj["status"]["message"]
    assert _pod(api, "refuse")["containers"][0]["resources"]["limits"].get("cpu") != "-1"
    warnings = await wait_for(
        lambda: [e for e in events_for(api, "refuse") if e["reason"] == "ApplyFailed"],
        what="an ApplyFailed event",
    )
    assert [e["type"] for e in warnings] == ["Warning"]
    assert "must be greater than or equal to 0" in warnings[0]["message"]

    # Fixing the spec applies it.
    limits = {"limits": {"cpu": "3"}}
    await patch(api, "inferencedeployments", "refuse", {"spec": {"serving": {"resources": limits}}})
    await wait_for(
        lambda: condition(idf(api, "refuse"), "Deployed").get("reason") == "ServingApplied",
        what="Deployed=True again",
    )
    assert _pod(api, "refuse")["containers"][0]["resources"]["limits"]["cpu"] == "3"
    await make_available(api, "refuse", 1)
    await wait_for(lambda: phase(api, "refuse") == "Ready", what="Ready again")


async def test_a_malformed_quantity_is_an_invalid_spec_before_any_apply(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("lots", serving={"resources": {"limits": {"cpu": "lots"}}})
    await create(api, body)
    await wait_for(lambda: phase(api, "lots") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "lots"), "Tuned")
    assert tuned["reason"] == "InvalidSpec"
    assert (
        "spec.serving.resources.limits.cpu: 'lots' is not a Kubernetes quantity" in tuned["message"]
    )
    assert get(api, "deployments", "lots") is None


async def test_a_refused_tuner_job_is_reported_in_the_status(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    # On real GPUs the tuner pod carries spec.serving.resources too: the Job is refused (422).
    serving = {"resources": {"limits": {"cpu": "-1"}}}
    await create(api, manifest("nojob", search=BF16, tuning=TRITON, serving=serving))
    await wait_for(lambda: phase(api, "nojob") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "nojob"), "Tuned")
    assert tuned["status"] == "False" and tuned["reason"] == "ApplyFailed"
    assert tuned["message"].startswith("cannot start tuning: create jobs/nojob-tune-")
    assert "must be greater than or equal to 0" in tuned["message"]
    assert get(api, "jobs", f"nojob-tune-{idf(api, 'nojob')['status']['tuningHash']}") is None
    await wait_for(
        lambda: [e for e in events_for(api, "nojob") if e["reason"] == "ApplyFailed"],
        what="an ApplyFailed event",
    )
