"""The real operator (kopf.operator in a thread) against the kmock API emulator, end to end.

The tests play the controllers that kmock does not run: the kubelet (running the tuner Job's own
`infertune tune-job` command in-process, which tunes on the simulated backend and writes the
report ConfigMap), the Job controller (patching Job status) and the Deployment controller
(patching Deployment status).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infertune_operator.policy.tuning import tuning_hash
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
    objects,
    patch,
    phase,
    post,
    run_tuner,
    seed_report,
    start_job,
    start_operator,
    tuner_jobs_created,
    wait_for,
    warning_events,
)


async def _wait_job(api: FakeApiServer, name: str, count: int = 1) -> dict[str, Any]:
    jobs = await wait_for(
        lambda: len(jobs_of(api, name)) == count and jobs_of(api, name),
        what=f"{count} tuner Job(s) of {name}",
    )
    latest: dict[str, Any] = sorted(jobs, key=lambda j: j["metadata"]["creationTimestamp"])[-1]
    return latest


async def _to_ready(api: FakeApiServer, name: str, tmp_path: Path) -> dict[str, Any]:
    """create -> Job -> tuner runs -> Job Complete -> Deployment -> available -> Ready."""
    job = await _wait_job(api, name)
    await run_tuner(api, job, tmp_path)
    await finish_job(api, job["metadata"]["name"])
    await wait_for(lambda: get(api, "deployments", name), what="the serving Deployment")
    await wait_for(lambda: phase(api, name) == "Deploying", what="phase Deploying")
    await make_available(api, name, 1)
    await wait_for(lambda: phase(api, name) == "Ready", what="phase Ready")
    return job


async def test_create_tunes_deploys_and_becomes_ready(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    body = await create(api, manifest("llm"))
    uid = body["metadata"]["uid"]
    th = tuning_hash(body["spec"], SETTINGS)

    job = await _wait_job(api, "llm")
    assert job["metadata"]["name"] == f"llm-tune-{th}"
    assert job["metadata"]["labels"]["infertune.io/deployment"] == "llm"
    assert job["metadata"]["labels"]["infertune.io/tuning-hash"] == th
    assert job["metadata"]["ownerReferences"][0]["uid"] == uid
    request_cm = get(api, "configmaps", f"llm-tune-{th}-request")
    assert request_cm is not None and request_cm["metadata"]["ownerReferences"][0]["uid"] == uid
    assert '"backend": "simulated"' in request_cm["data"]["request.json"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == SETTINGS.operator_image  # simulated: the operator image
    assert "nvidia.com/gpu" not in str(container.get("resources"))
    assert get(api, "serviceaccounts", SETTINGS.tuner_service_account) is not None
    binding = get(api, "rolebindings", SETTINGS.tuner_service_account)
    assert binding is not None and binding["roleRef"]["name"] == SETTINGS.tuner_clusterrole

    await wait_for(lambda: phase(api, "llm") == "Pending", what="phase Pending (no pod yet)")
    assert condition(idf(api, "llm"), "Tuned")["reason"] == "TuningPending"
    await start_job(api, job["metadata"]["name"])  # the tuner pod runs
    await wait_for(lambda: phase(api, "llm") == "Tuning", what="phase Tuning")
    assert condition(idf(api, "llm"), "Tuned")["reason"] == "TuningStarted"

    # The kubelet runs the tuner; the Job controller marks the Job complete.
    await run_tuner(api, job, tmp_path)
    report_cm = get(api, "configmaps", "llm-tuning-report")
    assert report_cm is not None
    assert report_cm["metadata"]["annotations"]["infertune.io/tuning-hash"] == th
    assert report_cm["metadata"]["ownerReferences"][0]["uid"] == uid
    report = Report.model_validate_json(report_cm["data"]["report.json"])
    assert report.best is not None
    # The report's watch event alone moves on (the tuner exits right after writing it) ...
    deployment = await wait_for(lambda: get(api, "deployments", "llm"), what="Deployment")
    # ... and the Job's completion, a moment later, changes nothing.
    await finish_job(api, job["metadata"]["name"])

    service = await wait_for(lambda: get(api, "services", "llm"), what="Service")
    model_repo = await wait_for(lambda: get(api, "configmaps", "llm-model-repo"), what="model repo")
    for obj in (deployment, service, model_repo):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        assert obj["metadata"]["labels"]["infertune.io/deployment"] == "llm"
    # GPU-less mode: `infertune simserver` on the operator image, no GPU, no GPU node selector.
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["image"] == SETTINGS.operator_image
    assert server["command"][:2] == ["infertune", "simserver"]
    assert "nvidia.com/gpu" not in str(server.get("resources")) and "nodeSelector" not in pod
    assert 8001 in [p["port"] for p in service["spec"]["ports"]]
    await wait_for(lambda: phase(api, "llm") == "Deploying", what="phase Deploying")
    status = idf(api, "llm")["status"]
    assert status["bestConfig"] == {
        "tp": report.best.config.tp,
        "maxBatchSize": report.best.config.max_batch_size,
        "quantization": report.best.config.quantization,
        "kvCacheDtype": report.best.config.kv_cache_dtype,
    }
    assert status["bestMetrics"]["sloMet"] is True
    assert status["bestMetrics"]["outputTokensPerSecondPerGpu"] > 0
    assert status["trials"]["executed"] == report.executed_trials
    assert status["reportConfigMap"] == "llm-tuning-report"
    assert status["tuningHash"] == th
    assert condition(idf(api, "llm"), "Tuned")["reason"] == "TuningSucceeded"

    # The Deployment controller reports the replica available.
    await make_available(api, "llm", 1)
    await wait_for(lambda: phase(api, "llm") == "Ready", what="phase Ready")
    final = idf(api, "llm")
    assert final["status"]["endpoint"] == f"llm.{NS}.svc:8001"
    ready = condition(final, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "DeploymentAvailable"
    assert ready["observedGeneration"] == final["metadata"]["generation"]
    assert final["status"]["observedGeneration"] == final["metadata"]["generation"]
    for c in final["status"]["conditions"]:
        assert set(c) >= {"type", "status", "reason", "message", "lastTransitionTime"}

    reasons = await wait_for(
        lambda: {e["reason"] for e in events_for(api, "llm")} >= {
            "TuningPending", "TuningStarted", "TuningSucceeded", "ServingApplied",
            "DeploymentAvailable",
        } and {e["reason"] for e in events_for(api, "llm")},
        what="transition events",
    )  # fmt: skip
    assert "InvalidSpec" not in reasons
    assert tuner_jobs_created(api) == 1


async def test_serving_only_change_patches_deployment_without_retuning(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("svc"))
    await _to_ready(api, "svc", tmp_path)
    hash_before = idf(api, "svc")["status"]["tuningHash"]

    await patch(api, "inferencedeployments", "svc", {"spec": {"serving": {"replicas": 3}}})
    await wait_for(
        lambda: (get(api, "deployments", "svc") or {}).get("spec", {}).get("replicas") == 3,
        what="the Deployment scaled to 3",
    )
    await wait_for(lambda: phase(api, "svc") == "Deploying", what="phase Deploying (1/3)")
    await make_available(api, "svc", 3)
    await wait_for(lambda: phase(api, "svc") == "Ready", what="phase Ready (3/3)")
    assert len(jobs_of(api, "svc")) == 1
    assert tuner_jobs_created(api) == 1
    assert idf(api, "svc")["status"]["tuningHash"] == hash_before


async def test_tuning_relevant_change_starts_a_new_job(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("retune"))
    first = await _to_ready(api, "retune", tmp_path)
    first_hash = first["metadata"]["labels"]["infertune.io/tuning-hash"]

    await patch(api, "inferencedeployments", "retune",
                {"spec": {"slo": {"e2eLatencyMs": {"p95": 15000}}}})  # fmt: skip
    second = await wait_for(
        lambda: next(
            (j for j in jobs_of(api, "retune")
             if j["metadata"]["labels"]["infertune.io/tuning-hash"] != first_hash),
            None,
        ),
        what="a second tuner Job with a new hash",
    )  # fmt: skip
    second_hash = second["metadata"]["labels"]["infertune.io/tuning-hash"]
    assert second["metadata"]["name"] == f"retune-tune-{second_hash}"
    await wait_for(lambda: phase(api, "retune") == "Pending", what="phase Pending")
    await start_job(api, second["metadata"]["name"])
    await wait_for(lambda: phase(api, "retune") == "Tuning", what="phase Tuning")
    assert idf(api, "retune")["status"]["tuningHash"] == second_hash
    # The superseded Job (and its request) is deleted; the old serving stays until the new result.
    await wait_for(lambda: len(jobs_of(api, "retune")) == 1, what="the old Job deleted")
    assert get(api, "configmaps", f"retune-tune-{first_hash}-request") is None
    assert get(api, "deployments", "retune") is not None

    await run_tuner(api, second, tmp_path)
    await finish_job(api, second["metadata"]["name"])
    await wait_for(lambda: phase(api, "retune") == "Ready", what="Ready again (still available)")
    assert condition(idf(api, "retune"), "Tuned")["reason"] == "TuningSucceeded"


async def test_job_failure_reports_the_pod_reason(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    await create(api, manifest("oom"))
    job = await _wait_job(api, "oom")
    job_name = job["metadata"]["name"]
    await post(api, "pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job_name}-x7k2p", "namespace": NS,
                     "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name}},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "tuner",
            "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                     "finishedAt": "2026-01-01T00:00:00Z"}},
        }]},
    })  # fmt: skip
    await finish_job(api, job_name, succeeded=False)

    await wait_for(lambda: phase(api, "oom") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "oom"), "Tuned")
    assert tuned["status"] == "False" and tuned["reason"] == "TuningJobFailed"
    assert "OOMKilled" in tuned["message"] and "exit code 137" in tuned["message"]
    assert "memory" in tuned["message"]  # what to do about it
    warnings = await warning_events(api, "oom", "TuningJobFailed")
    assert "OOMKilled" in warnings[0]["message"]
    assert get(api, "deployments", "oom") is None
    assert tuner_jobs_created(api) == 1  # a failed tuning is not retried endlessly

    # To retry the same spec, delete the failed Job: the operator starts it again.
    await delete(api, "jobs", job_name)
    await wait_for(lambda: tuner_jobs_created(api) == 2 and jobs_of(api, "oom"), what="a new Job")
    await wait_for(lambda: phase(api, "oom") == "Pending", what="phase Pending again")


async def test_resync_catches_a_missed_job_completion(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    runner = await start_operator(api, resync_interval=0.3)
    try:
        await create(api, manifest("missed"))
        job = await _wait_job(api, "missed")
        await wait_for(lambda: phase(api, "missed") == "Pending", what="phase Pending")
        # The tuner pod cannot be scheduled: no event reaches the operator, the resync explains.
        await post(api, "pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job['metadata']['name']}-abcde", "namespace": NS,
                         "labels": {"job-name": job["metadata"]["name"]}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }]},
        })  # fmt: skip
        await wait_for(
            lambda: "Insufficient nvidia.com/gpu" in idf(api, "missed")["status"]["message"],
            what="the scheduling problem in status.message",
        )
        await run_tuner(api, job, tmp_path)
        # Complete the Job behind the watch's back (no event is sent): only a resync sees it.
        api.objects["batch/v1/jobs", NS, job["metadata"]["name"]].patch(
            {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
        )
        await wait_for(lambda: phase(api, "missed") == "Deploying", what="phase Deploying")
        # Events from the resync are posted like any other.
        await wait_for(
            lambda: [e for e in events_for(api, "missed") if e["reason"] == "TuningSucceeded"],
            what="a TuningSucceeded event posted by the resync",
        )
    finally:
        await runner.stop()


async def test_operator_restart_mid_tuning_adopts_the_job(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    first = await start_operator(api)
    try:
        await create(api, manifest("restart"))
        job = await _wait_job(api, "restart")
        await start_job(api, job["metadata"]["name"])
        await wait_for(lambda: phase(api, "restart") == "Tuning", what="phase Tuning")
    finally:
        await first.stop()

    seen = len(list(api))
    second = await start_operator(api)
    try:
        # The resumed object is reconciled: the new operator looks its Job up, creates none.
        await wait_for(
            lambda: any(
                r.method == "GET" and r.name == job["metadata"]["name"] for r in list(api)[seen:]
            ),
            timeout=5,
            what="the restarted operator to look up the running Job",
        )
        assert tuner_jobs_created(api) == 1
        assert [j["metadata"]["name"] for j in jobs_of(api, "restart")] == [job["metadata"]["name"]]
        await run_tuner(api, job, tmp_path)
        await finish_job(api, job["metadata"]["name"])
        await wait_for(lambda: phase(api, "restart") == "Deploying", what="phase Deploying")
        assert tuner_jobs_created(api) == 1
    finally:
        await second.stop()


async def test_invalid_spec_sets_condition_and_warns_without_retrying(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    bad = manifest("bad", gpu={"product": "Z100-1TB", "maxGpusPerReplica": 2})
    await create(api, bad)
    await wait_for(lambda: phase(api, "bad") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "bad"), "Tuned")
    assert tuned["reason"] == "InvalidSpec"
    assert "spec.gpu.product" in tuned["message"] and "Z100-1TB" in tuned["message"]
    await warning_events(api, "bad", "InvalidSpec")
    assert jobs_of(api, "bad") == []

    # A source the runtime cannot open (s3://): refused with the reason, never rendered.
    await patch(api, "inferencedeployments", "bad", {"spec": {
        "gpu": {"product": "L4-24GB"},
        "model": {"source": {"uri": "s3://bucket/llama"}},
    }})  # fmt: skip
    await wait_for(
        lambda: "s3:// is not a source" in condition(idf(api, "bad"), "Tuned").get("message", ""),
        what="the s3:// problem in the condition",
    )
    assert jobs_of(api, "bad") == []

    # A field the CRD schema lets through but the models reject: every problem is listed. (One
    # patch with the source dropped: a valid spec in between would rightly start a Job.)
    await patch(api, "inferencedeployments", "bad", {"spec": {
        "gpu": {"product": "L4-24GB"},
        "model": {"source": None},
        "search": {"maxBatchSize": [8, 8]},
    }})  # fmt: skip
    await wait_for(
        lambda: "maxBatchSize" in condition(idf(api, "bad"), "Tuned").get("message", ""),
        what="the new problems in the condition",
    )
    message = condition(idf(api, "bad"), "Tuned")["message"]
    assert "listed twice" in message
    assert jobs_of(api, "bad") == []

    # Fixing the spec recovers: a Job is created.
    await patch(api, "inferencedeployments", "bad", {"spec": {"search": {"maxBatchSize": [4, 8]}}})
    await _wait_job(api, "bad")
    await wait_for(lambda: phase(api, "bad") == "Pending", what="phase Pending after the fix")
    status_writes = sum(1 for r in api if r.subresource == "status" and r.name == "bad")
    assert status_writes <= 4  # no endless retry loop on a bad spec


async def test_name_too_long_for_derived_names_is_invalid(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    name = "n" * 50  # the CRD cannot limit metadata.name; the models cap it at 48
    await create(api, manifest(name))
    await wait_for(lambda: phase(api, name) == "Failed", what="phase Failed")
    tuned = condition(idf(api, name), "Tuned")
    assert tuned["reason"] == "InvalidSpec" and "metadata.name" in tuned["message"]
    assert jobs_of(api, name) == []


async def test_no_feasible_config_lists_nearest_misses(
    api: FakeApiServer, operator: OperatorRunner, kubeconfig: Path, tmp_path: Path
) -> None:
    await create(api, manifest("tight", slo={"e2eLatencyMs": {"p95": 10}}))
    job = await _wait_job(api, "tight")
    await run_tuner(api, job, tmp_path)
    await finish_job(api, job["metadata"]["name"])

    await wait_for(lambda: phase(api, "tight") == "Failed", what="phase Failed")
    tuned = condition(idf(api, "tight"), "Tuned")
    assert tuned["reason"] == "NoFeasibleConfig"
    assert "nearest misses" in tuned["message"]
    assert "E2E p95" in tuned["message"]
    assert "raise spec.slo.e2eLatencyMs" in tuned["message"]
    assert idf(api, "tight")["status"]["reportConfigMap"] == "tight-tuning-report"
    assert get(api, "deployments", "tight") is None
    await wait_for(
        lambda: [e for e in events_for(api, "tight") if e["reason"] == "NoFeasibleConfig"],
        what="a NoFeasibleConfig event",
    )


async def test_existing_report_for_the_same_hash_is_reused_without_a_job(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    body = manifest("reuse")
    await seed_report(api, body, tmp_path)

    await create(api, body)
    await wait_for(lambda: phase(api, "reuse") == "Deploying", what="phase Deploying")
    assert jobs_of(api, "reuse") == []
    assert tuner_jobs_created(api) == 0
    assert objects(api, "deployments")


async def test_a_winner_that_cannot_be_served_fails_with_the_reason(
    api: FakeApiServer, operator: OperatorRunner, tmp_path: Path
) -> None:
    # Real GPUs (triton) and fp8 without a pre-quantized checkpoint: tuning succeeded, serving
    # cannot load the weights. The user is told what to add; nothing is retried.
    body = manifest("nockpt", tuning={"backend": "triton", "maxTrials": 6, "seed": 1})
    report = await seed_report(api, body, tmp_path)
    assert report.best is not None and report.best.config.quantization == "fp8"

    await create(api, body)
    await wait_for(lambda: phase(api, "nockpt") == "Failed", what="phase Failed")
    obj = idf(api, "nockpt")
    assert condition(obj, "Tuned")["reason"] == "TuningSucceeded"
    deployed = condition(obj, "Deployed")
    assert deployed["status"] == "False" and deployed["reason"] == "CannotServe"
    assert "spec.model.checkpoints.fp8" in deployed["message"]
    assert obj["status"]["bestConfig"]["quantization"] == "fp8"
    assert get(api, "deployments", "nockpt") is None
    assert jobs_of(api, "nockpt") == []
    await wait_for(
        lambda: [e for e in events_for(api, "nockpt") if e["reason"] == "CannotServe"],
        what="a CannotServe warning event",
    )


async def test_a_deleted_service_of_a_ready_deployment_comes_back(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    runner = await start_operator(api, resync_interval=0.1)  # full resync every 10 ticks: 1 s
    try:
        await create(api, manifest("heal"))
        await _to_ready(api, "heal", tmp_path)
        uid = get(api, "services", "heal")["metadata"]["uid"]  # type: ignore[index]
        await delete(api, "services", "heal")
        await wait_for(
            lambda: (
                (get(api, "services", "heal") or {}).get("metadata", {}).get("uid")
                not in (None, uid)
            ),
            what="the Service recreated",
        )
        assert phase(api, "heal") == "Ready"
    finally:
        await runner.stop()


async def test_a_gated_model_without_a_token_is_warned_once_when_tuning_starts(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    gated = {"name": "llama-3-8b", "source": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}}
    search = {"tensorParallel": [1], "maxBatchSize": [4, 8], "quantization": ["bf16"],
              "kvCacheDtype": ["auto"]}  # fmt: skip
    tuning = {"backend": "triton", "maxTrials": 4, "seed": 1}
    await create(api, manifest("gated", model=gated, search=search, tuning=tuning))
    await _wait_job(api, "gated")
    [event] = await warning_events(api, "gated", "TokenMissing")
    assert "meta-llama/Meta-Llama-3-8B-Instruct is gated" in event["message"]
    assert "tokenSecretRef" in event["message"]

    with_token = {**gated, "source": {**gated["source"], "tokenSecretRef": {"name": "hf-token"}}}
    await create(api, manifest("tokened", model=with_token, search=search, tuning=tuning))
    await _wait_job(api, "tokened")
    await wait_for(lambda: phase(api, "tokened") in ("Pending", "Tuning"), what="tuning")
    assert not [e for e in events_for(api, "tokened") if e["reason"] == "TokenMissing"]
    assert len([e for e in events_for(api, "gated") if e["reason"] == "TokenMissing"]) == 1
