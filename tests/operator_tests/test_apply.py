"""Server-side apply and the classification of API errors (kube/client.py against the emulator)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from infertune_operator import naming
from infertune_operator.api.formats import QUANTITY_PATTERN
from infertune_operator.kube import managed_fields
from infertune_operator.kube.client import MERGE_PATCH, Kube
from infertune_operator.kube.errors import (
    ClientError,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    ServerError,
    Unreachable,
    from_response,
)
from infertune_operator.kube.resources import DEPLOYMENTS
from infertune_operator.policy import conditions
from infertune_operator.policy.serving import apply_failed
from infertune_tuner.config import TrialConfig

from . import apply_emulation
from .apiserver import NS, FakeApiServer, api_url, get, path_of


def _deployment(
    selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "containers": [{"name": "triton", "image": "triton:1",
                        "resources": {"limits": limits or {"cpu": "2"}}}],
    }  # fmt: skip
    if selector is not None:
        pod["nodeSelector"] = selector
    if tolerations is not None:
        pod["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": NS, "labels": {"app": "llm"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {"metadata": {"labels": {"app": "llm"}}, "spec": pod},
        },
    }


def _pod(api: FakeApiServer) -> dict[str, Any]:
    live = get(api, "deployments", "llm")
    assert live is not None
    pod: dict[str, Any] = live["spec"]["template"]["spec"]
    return pod


async def _patch_as(api: FakeApiServer, manager: str, body: dict[str, Any]) -> None:
    """Another client (kubectl, an autoscaler) changes the Deployment with a merge patch."""
    path = path_of("deployments", "llm")
    async with api.patch(path, json=body, params={"fieldManager": manager}) as resp:
        assert resp.status == 200, await resp.text()


async def test_apply_removes_what_the_new_render_leaves_out(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))
    toleration = {"key": "pool-a", "operator": "Exists"}
    first = _deployment({"pool": "a", "zone": "z1"}, [toleration])
    created = await asyncio.to_thread(kube.apply, first)
    assert created["metadata"]["uid"]
    assert _pod(api)["nodeSelector"] == {"pool": "a", "zone": "z1"}

    # A JSON merge patch of the new render would keep zone and the toleration.
    second = await asyncio.to_thread(kube.apply, _deployment({"pool": "a"}))
    assert second["metadata"]["uid"] == created["metadata"]["uid"]
    assert _pod(api)["nodeSelector"] == {"pool": "a"}
    assert "tolerations" not in _pod(api)

    await asyncio.to_thread(kube.apply, _deployment())
    assert "nodeSelector" not in _pod(api)
    live = get(api, "deployments", "llm") or {}
    (entry,) = live["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == (naming.MANAGER, "Apply")


async def test_apply_keeps_what_other_managers_set_and_takes_back_its_own(
    api: FakeApiServer,
) -> None:
    kube = Kube.for_url(api_url(api))
    first = _deployment({"pool": "a"})
    first["spec"]["template"]["metadata"]["labels"]["config"] = "tp2"
    await asyncio.to_thread(kube.apply, first)
    await _patch_as(api, "kubectl-annotate", {"metadata": {"annotations": {"owner": "team-ml"}}})
    await _patch_as(api, "kubectl-edit", {"spec": {"template": {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"priorityClassName": "high", "nodeSelector": {"zone": "z2"}},
    }}})  # fmt: skip

    await asyncio.to_thread(kube.apply, _deployment({"pool": "b"}))
    live = get(api, "deployments", "llm") or {}
    assert live["metadata"]["annotations"] == {"owner": "team-ml"}
    # A label infertune applied before and not now is removed; another manager's label stays.
    assert live["spec"]["template"]["metadata"]["labels"] == {"app": "llm", "team": "ml"}
    assert _pod(api)["priorityClassName"] == "high"
    # nodeSelector is one field (an atomic map in the Kubernetes schema): the applied value
    # replaces the edited one (force), zone included.
    assert _pod(api)["nodeSelector"] == {"pool": "b"}

    # A field infertune applies is infertune's again (force): edited replicas are put back.
    await _patch_as(api, "kubectl-edit", {"spec": {"replicas": 5}})
    await asyncio.to_thread(kube.apply, _deployment({"pool": "b"}))
    assert (get(api, "deployments", "llm") or {})["spec"]["replicas"] == 1


async def test_the_render_hash_skips_an_unchanged_object(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))
    owner = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
             "metadata": {"name": "llm", "namespace": NS, "uid": "u-1"}}  # fmt: skip
    desired = naming.owned(_deployment({"pool": "a"}), owner)
    await asyncio.to_thread(kube.apply, desired, changed=naming.needs_apply)
    await asyncio.to_thread(kube.apply, desired, changed=naming.needs_apply)
    patches = [r for r in api if r.method == "PATCH" and r.resource and r.name == "llm"]
    assert len(patches) == 1


async def test_apply_without_force_meets_the_conflict_the_server_reports(
    api: FakeApiServer,
) -> None:
    """The emulator holds to the semantics the operator's ``force=true`` answers."""
    kube = Kube.for_url(api_url(api))
    await asyncio.to_thread(kube.apply, _deployment())
    await _patch_as(api, "kubectl-edit", {"spec": {"replicas": 3}})
    headers = {"Content-Type": apply_emulation.APPLY_CONTENT_TYPE}
    path = path_of("deployments", "llm")
    async with api.patch(path, json=_deployment(), headers=headers,
                         params={"fieldManager": naming.MANAGER}) as resp:  # fmt: skip
        assert resp.status == 409
        assert 'conflict with "kubectl-edit"' in (await resp.json())["message"]


async def test_a_malformed_quantity_is_a_400_client_error_with_the_servers_message(
    api: FakeApiServer,
) -> None:
    kube = Kube.for_url(api_url(api))
    with pytest.raises(ClientError) as caught:
        await asyncio.to_thread(kube.apply, _deployment(limits={"cpu": "lots"}))
    err = caught.value
    assert (err.status, err.reason, err.retryable) == (400, "BadRequest", False)
    assert str(err).startswith('apply deployments/llm: Deployment in version "v1" cannot be')
    assert "quantities must match the regular expression" in str(err)
    assert isinstance(err.__cause__, ApiException)  # the client's own error, chained
    assert get(api, "deployments", "llm") is None


async def test_a_negative_quantity_is_a_422_with_the_field(api: FakeApiServer) -> None:
    kube = Kube.for_url(api_url(api))
    await asyncio.to_thread(kube.apply, _deployment())
    with pytest.raises(ClientError) as caught:
        await asyncio.to_thread(kube.apply, _deployment(limits={"cpu": "-1"}))
    assert (caught.value.status, caught.value.reason) == (422, "Invalid")
    assert "spec.template.spec.containers[0].resources.limits.cpu" in str(caught.value)
    assert "must be greater than or equal to 0" in str(caught.value)
    assert _pod(api)["containers"][0]["resources"]["limits"] == {"cpu": "2"}  # unchanged


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [
        (400, ClientError, False),
        (403, Forbidden, False),
        (404, NotFound, False),
        (409, Conflict, True),
        (422, ClientError, False),
        (429, ClientError, True),
        (500, ServerError, True),
        (503, ServerError, True),
    ],
)
def test_errors_are_classified_by_status(
    status: int, cls: type[KubeError], retryable: bool
) -> None:
    body = '{"kind": "Status", "reason": "Why", "message": "the server says no"}'
    err = from_response(status, "HTTP reason", body, "apply deployments/x")
    assert type(err) is cls and err.status == status and err.retryable is retryable
    assert str(err) == "apply deployments/x: the server says no" and err.reason == "Why"
    bare = from_response(status, "Bad Gateway", "<html>", "get x")
    assert str(bare) == f"get x: HTTP {status} Bad Gateway" and bare.reason == "Bad Gateway"


def test_a_dead_server_is_unreachable_with_the_cause_chained() -> None:
    kube = Kube.for_url("http://127.0.0.1:9")  # discard port: connection refused
    kube.timeout = (0.5, 0.5)
    with pytest.raises(Unreachable) as caught:
        kube.get(DEPLOYMENTS, NS, "x")
    assert caught.value.retryable and caught.value.__cause__ is not None


QUANTITIES = ["2", "500m", "1.5", ".5", "1.", "16Gi", "1Ki", "2k", "1e3", "1E-2", "100n",
              "5u", "1E", "+1", "-1", "lots", "", ".", "1K", "1Ki5", "1.2.3", "1e", "1e1.5",
              "2 Gi", "1mi", "0x10"]  # fmt: skip


@pytest.mark.parametrize("value", QUANTITIES)
def test_the_crd_pattern_accepts_exactly_what_the_api_server_parses(value: str) -> None:
    """The models' (and CRD's) pattern agrees with apimachinery's ParseQuantity as the
    emulator reproduces it: what admission lets through, the Deployment can carry."""
    parses = (apply_emulation.quantity_problem(value) or (0, ""))[0] != 400
    assert bool(re.fullmatch(QUANTITY_PATTERN, value)) is parses


def test_apply_failed_keeps_a_previous_ready_configuration_serving() -> None:
    config = TrialConfig(1, 8, "bf16", "auto")
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "DeploymentAvailable"}]}
    t = apply_failed(config, "422 says no", None, ready)
    assert t.phase == "Failed" and "keeps serving" in t.message
    assert set(t.conditions) == {conditions.DEPLOYED}
    assert t.conditions[conditions.DEPLOYED].reason == conditions.APPLY_FAILED
    fresh = apply_failed(config, "422 says no", None, None)
    assert fresh.conditions[conditions.READY].status == "False"
    events = conditions.transition_events(
        None, conditions.next_status(None, fresh, generation=1, now="t", tuning_hash="h")
    )
    assert ("Warning", "ApplyFailed") in [(e.type, e.reason) for e in events]


def test_the_crd_rejects_a_malformed_quantity_at_admission() -> None:
    import jsonschema

    from infertune_operator.api.crd import crd

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    serving = schema["properties"]["spec"]["properties"]["serving"]
    limits = serving["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"]["pattern"] == QUANTITY_PATTERN
    # The API server checks a pattern against strings only, as JSON Schema does.
    jsonschema.validate({"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": "1"}, limits)
    with pytest.raises(jsonschema.ValidationError, match="lots"):
        jsonschema.validate({"cpu": "lots"}, limits)


async def test_a_deployment_an_earlier_version_merge_patched_is_cleaned_on_upgrade(
    api: FakeApiServer,
) -> None:
    """Earlier versions created and merge-patched: the client's default manager owns it all."""
    kube = Kube.for_url(api_url(api))
    owner = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
             "metadata": {"name": "llm", "namespace": NS, "uid": "u-1"}}  # fmt: skip
    old = naming.owned(_deployment({"pool": "a", "zone": "z1"}), owner)
    current = naming.owned(_deployment({"pool": "a"}), owner)
    # Their calls: no fieldManager, so the server names the manager after the User-Agent.
    await asyncio.to_thread(
        kube._call, "POST", DEPLOYMENTS.path(NS), body=old, what="the old create"
    )
    await asyncio.to_thread(
        kube._call, "PATCH", DEPLOYMENTS.path(NS, "llm"), body=current,
        content_type=MERGE_PATCH, what="the old apply",
    )  # fmt: skip
    assert _pod(api)["nodeSelector"] == {"pool": "a", "zone": "z1"}  # the stale key
    legacy = (get(api, "deployments", "llm") or {})["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"]) for e in legacy] == [("OpenAPI-Generator", "Update")]

    # The render did not change, but the object is handed over and applied once.
    await asyncio.to_thread(kube.apply, current, changed=naming.needs_apply)
    assert _pod(api)["nodeSelector"] == {"pool": "a"}
    live = get(api, "deployments", "llm") or {}
    owners = [(e["manager"], e["operation"]) for e in live["metadata"]["managedFields"]]
    assert owners == [(naming.MANAGER, "Apply")]
    writes = sum(1 for r in api if r.method == "PATCH" and r.name == "llm")
    await asyncio.to_thread(kube.apply, current, changed=naming.needs_apply)
    assert sum(1 for r in api if r.method == "PATCH" and r.name == "llm") == writes  # once


def test_only_objects_this_operator_wrote_are_handed_over() -> None:
    entry = {"manager": "OpenAPI-Generator", "operation": "Update",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}}  # fmt: skip
    ours = {"metadata": {"annotations": {naming.ANNOTATION_RENDER_HASH: "h"},
                         "resourceVersion": "7", "managedFields": [entry]}}  # fmt: skip
    patch = managed_fields.adopt_legacy_fields(ours, "infertune")
    assert patch is not None
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    (adopted,) = patch[1]["value"]
    assert (adopted["manager"], adopted["operation"]) == ("infertune", "Apply")
    assert adopted["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    theirs = {"metadata": {"resourceVersion": "7", "managedFields": [entry]}}
    assert managed_fields.adopt_legacy_fields(theirs, "infertune") is None
    applied = {**entry, "manager": "infertune", "operation": "Apply"}
    ours["metadata"]["managedFields"] = [entry, applied]
    assert managed_fields.adopt_legacy_fields(ours, "infertune") is None
