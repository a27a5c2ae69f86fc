"""Unit tests of the pure reconcile decisions (no API server, no Kopf)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from infertune_operator import naming
from infertune_operator.objects import tuner_deadline, tuner_job
from infertune_operator.policy import conditions, tuner_outcome
from infertune_operator.policy.serving import (
    Availability,
    deployment_availability,
    serving,
    tuned_fields,
)
from infertune_operator.policy.tuning import (
    best_config,
    config_from_status,
    invalid_spec,
    is_brand_new,
    no_feasible_config,
    tuning_hash,
    tuning_job_failed,
    tuning_pending,
    tuning_started,
    validate,
)
from infertune_operator.reports.store import (
    REPORT_BUDGET,
    configmap_hash,
    is_complete,
    parse_report,
    report_configmap,
    stored_bytes,
    trials_total,
)
from infertune_operator.reports.summary import REASON_CHARS, size, summarize
from infertune_operator.settings import Settings
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Report
from infertune_tuner.runtime import TritonRuntime

from .apiserver import NS, manifest

SETTINGS = Settings(operator_image="op:1", tuner_image="tuner:1", default_backend="triton")
TRITON = TritonRuntime()


def _body(name: str = "llm", **spec: Any) -> dict[str, Any]:
    body = manifest(name, **spec)
    body["metadata"]["uid"] = "0000-uid"
    return body


def _obj(body: dict[str, Any]) -> Any:
    obj, problems = validate(body)
    assert obj is not None, problems
    return obj


def _gpu_body(**overrides: Any) -> dict[str, Any]:
    tuning = {"backend": "triton", "maxTrials": 10}
    return _body(
        gpu={"product": "H100-SXM-80GB", "maxGpusPerReplica": 4},
        search={"tensorParallel": [1, 2, 4, 8], "maxBatchSize": [8, 16]},
        tuning=tuning,
        **overrides,
    )


# ------------------------------------------------------------------ the tuning hash


def test_hash_is_stable_short_and_ignores_key_order() -> None:
    spec = _body()["spec"]
    reordered = json.loads(json.dumps(spec, sort_keys=True))
    reordered = dict(reversed(list(reordered.items())))
    h = tuning_hash(spec, SETTINGS)
    assert len(h) == 8 and all(c in "0123456789abcdef" for c in h)
    assert tuning_hash(reordered, SETTINGS) == h
    assert tuning_hash(copy.deepcopy(spec), SETTINGS) == h


@pytest.mark.parametrize(
    "section, change",
    [
        ("model", {"name": "llama-3-70b"}),
        ("gpu", {"product": "H100-SXM-80GB", "maxGpusPerReplica": 2}),
        ("gpu", {"product": "L4-24GB", "maxGpusPerReplica": 2, "nodeSelector": {"pool": "b"}}),
        ("workload", {"inputTokens": 1024, "outputTokens": 128}),
        ("slo", {"e2eLatencyMs": {"p95": 15000}}),
        ("search", {"tensorParallel": [1]}),
        ("tuning", {"backend": "simulated", "maxTrials": 7, "seed": 1}),
    ],
)
def test_tuning_relevant_sections_change_the_hash(section: str, change: dict[str, Any]) -> None:
    spec = _body()["spec"]
    changed = {**spec, section: change}
    assert tuning_hash(changed, SETTINGS) != tuning_hash(spec, SETTINGS)


def test_serving_changes_do_not_change_the_hash() -> None:
    spec = _body()["spec"]
    served = {**spec, "serving": {"replicas": 5, "image": "my/triton:1", "resources": {}}}
    assert tuning_hash(served, SETTINGS) == tuning_hash(spec, SETTINGS)


def test_operator_defaults_count_only_when_the_spec_leaves_them_unset() -> None:
    spec = _body()["spec"]
    unset = {**spec, "tuning": {}}
    other_default = Settings(default_backend="simulated", default_max_trials=40)
    assert tuning_hash(unset, SETTINGS) != tuning_hash(unset, other_default)
    # spec.tuning sets backend and maxTrials: the defaults do not matter (storage still does)
    assert tuning_hash(spec, SETTINGS) == tuning_hash(
        spec, Settings(default_backend="simulated", default_max_trials=3)
    )
    with_storage = Settings(tuner_storage="postgresql://db/optuna")
    assert tuning_hash(spec, SETTINGS) != tuning_hash(spec, with_storage)


# ------------------------------------------------------------------ names


def test_derived_names_fit_kubernetes_limits_for_the_longest_valid_name() -> None:
    name = "a" * 48  # the models' cap
    body = _body(name)
    obj = _obj(body)
    th = tuning_hash(body["spec"], SETTINGS)
    job = tuner_job.tuner_job(obj, body, th, SETTINGS)
    assert len(job["metadata"]["name"]) <= 63
    for value in job["metadata"]["labels"].values():
        assert len(value) <= 63
    assert len(naming.report_configmap_name(name)) <= 63
    assert len(naming.request_configmap_name(name, th)) <= 253


# ------------------------------------------------------------------ validation


def test_validation_reports_every_schema_problem_with_its_path() -> None:
    body = _body(workload={"inputTokens": 0, "outputTokens": -1})
    obj, problems = validate(body)
    assert obj is None
    assert any(p.startswith("spec.workload.inputTokens") for p in problems)
    assert any(p.startswith("spec.workload.outputTokens") for p in problems)


def test_validation_checks_the_catalogs_and_ignores_server_metadata() -> None:
    body = _body(gpu={"product": "Z100"})
    body["metadata"].update(
        {"managedFields": [{"manager": "kubectl"}], "finalizers": ["x"], "annotations": {}}
    )
    body["status"] = {"phase": "Weird", "kopf": {"progress": {}}}
    obj, problems = validate(body)
    assert obj is None
    assert problems and problems[0].startswith("spec.gpu.product")


# ------------------------------------------------------------------ the tuner Job


def test_gpu_job_requests_the_largest_tp_that_fits_one_node() -> None:
    body = _gpu_body()
    obj = _obj(body)
    assert tuner_job.tuner_gpus(obj) == 4  # 8 is in the space but maxGpusPerReplica is 4
    job = tuner_job.tuner_job(obj, body, "abcd1234", SETTINGS)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == SETTINGS.tuner_image
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["serviceAccountName"] == SETTINGS.tuner_service_account
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == SETTINGS.job_backoff_limit
    # No spec.tuning.timeoutMinutes: still a deadline, the trial budget times the per-trial
    # bound (60 min server start-up + 30 min benchmark), plus 10 min for the report.
    assert job["spec"]["activeDeadlineSeconds"] == 10 * (60 + 30) * 60 + 600
    derivation = job["metadata"]["annotations"]["infertune.io/deadline"]
    assert derivation.startswith("10 trials x 90 min per trial (60 min server start-up")
    assert "spec.tuning.timeoutMinutes is unset" in derivation


def test_gpu_job_keeps_the_users_node_selector_and_tolerations() -> None:
    body = _gpu_body()
    body["spec"]["gpu"]["nodeSelector"] = {"pool": "inference"}
    body["spec"]["gpu"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    pod = tuner_job.tuner_job(_obj(body), body, "abcd1234", SETTINGS)["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["pool"] == "inference"
    assert {"key": "dedicated", "operator": "Exists"} in pod["tolerations"]


def test_gpu_job_runs_where_the_winner_will_serve() -> None:
    from infertune_operator.objects.serving import render_serving

    body = _gpu_body()
    body["spec"]["gpu"]["nodeSelector"] = {"pool": "inference"}
    body["spec"]["gpu"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    obj = _obj(body)
    job_pod = tuner_job.tuner_job(obj, body, "abcd1234", SETTINGS)["spec"]["template"]["spec"]
    served = render_serving(obj, TrialConfig(4, 8, "bf16", "auto"), SETTINGS, runtime=TRITON)
    deployment = next(o for o in served if o["kind"] == "Deployment")
    serving_pod = deployment["spec"]["template"]["spec"]
    for key in ("nodeSelector", "affinity", "tolerations", "securityContext"):
        assert job_pod[key] == serving_pod[key], key


def test_simulated_job_runs_on_the_operator_image_without_gpus() -> None:
    body = _body()
    body["spec"]["gpu"]["nodeSelector"] = {"pool": "gpu"}
    job = tuner_job.tuner_job(_obj(body), body, "abcd1234", SETTINGS)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == SETTINGS.operator_image
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_simulated_by_operator_default_when_the_spec_leaves_backend_unset() -> None:
    body = _body(tuning={"maxTrials": 5})
    simulated = Settings(operator_image="op:1", default_backend="simulated")
    job = tuner_job.tuner_job(_obj(body), body, "abcd1234", simulated)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "op:1"


def test_job_command_labels_owner_and_deadline() -> None:
    body = _body(tuning={"backend": "simulated", "timeoutMinutes": 30})
    job = tuner_job.tuner_job(_obj(body), body, "abcd1234", SETTINGS)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "infertune", "tune-job", "--request", "/config/request.json",
        "--report-configmap", "llm-tuning-report", "--namespace", NS,
        "--owner-uid", "0000-uid", "--tuning-hash", "abcd1234",
    ]  # fmt: skip
    assert job["metadata"]["labels"]["infertune.io/deployment"] == "llm"
    assert job["metadata"]["labels"]["infertune.io/tuning-hash"] == "abcd1234"
    assert job["spec"]["template"]["metadata"]["labels"]["infertune.io/tuning-hash"] == "abcd1234"
    owner = job["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment", "name": "llm",
        "uid": "0000-uid", "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    assert job["spec"]["activeDeadlineSeconds"] == 30 * 60 + tuner_deadline.REPORT_GRACE_S
    assert job["metadata"]["annotations"]["infertune.io/deadline"] == (
        "spec.tuning.timeoutMinutes 30 min + 10 min to write the report"
    )


def test_the_derived_deadline_follows_the_startup_timeout_and_the_operator_setting() -> None:
    body = _body(tuning={"backend": "simulated", "maxTrials": 4},
                 serving={"startupTimeoutMinutes": 15})  # fmt: skip
    settings = Settings(trial_benchmark_minutes=5)
    deadline = tuner_deadline.job_deadline(_obj(body), settings)
    assert deadline.seconds == 4 * (15 + 5) * 60 + 600
    assert tuner_deadline.human(deadline.seconds) == "1 h 30 min"
    # Unset maxTrials: the operator's default budget.
    body = _body(tuning={"backend": "simulated"})
    assert tuner_deadline.job_deadline(_obj(body), Settings(default_max_trials=3)).seconds == (
        3 * (60 + 30) * 60 + 600
    )


def test_request_configmap_holds_the_tuning_request_with_operator_defaults() -> None:
    body = _body(tuning={})
    cm = tuner_job.request_configmap(_obj(body), body, "abcd1234", SETTINGS)
    request = TuningRequest.model_validate_json(cm["data"]["request.json"])
    assert request.tuning.backend == "triton" and request.tuning.max_trials == 40
    assert cm["metadata"]["name"] == "llm-tune-abcd1234-request"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "0000-uid"


def test_superseded_objects_are_the_other_hashes() -> None:
    objs = [
        {"metadata": {"name": "a", "labels": {naming.LABEL_HASH: "old"}}},
        {"metadata": {"name": "b", "labels": {naming.LABEL_HASH: "new"}}},
        {"metadata": {"name": "c", "labels": {}}},
    ]
    assert tuner_job.superseded(objs, "new") == ["a"]


# ------------------------------------------------------------------ Job and pod outcome


@pytest.mark.parametrize(
    "status, state",
    [
        ({}, "pending"),
        ({"active": 1, "ready": 0}, "pending"),  # the pod waits (scheduling, image pull)
        ({"active": 1, "ready": 1}, "running"),
        ({"active": 1}, "running"),  # clusters without .status.ready
        ({"succeeded": 1}, "succeeded"),
        ({"conditions": [{"type": "Complete", "status": "True"}]}, "succeeded"),
        ({"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
         "failed"),
        ({"failed": 3}, "failed"),  # backoffLimit 2: three failed pods
        ({"failed": 2, "active": 1}, "running"),
    ],
)  # fmt: skip
def test_job_outcome(status: dict[str, Any], state: str) -> None:
    job = {"spec": {"backoffLimit": 2}, "status": status}
    assert tuner_outcome.job_outcome(job).state == state


def test_pod_failure_picks_the_latest_failed_container() -> None:
    pods = [
        {"metadata": {"name": "p1"}, "status": {"containerStatuses": [{"name": "tuner", "state": {
            "terminated": {"reason": "Error", "exitCode": 1, "finishedAt": "2026-01-01T00:00:00Z"}
        }}]}},
        {"metadata": {"name": "p2"}, "status": {"containerStatuses": [{"name": "tuner", "state": {
            "terminated": {"reason": "OOMKilled", "exitCode": 137,
                           "finishedAt": "2026-01-01T00:05:00Z"}
        }}]}},
    ]  # fmt: skip
    failure = tuner_outcome.pod_failure(pods)
    assert failure is not None and failure.pod == "p2" and failure.reason == "OOMKilled"
    message = tuner_outcome.job_failure_message(
        "j", tuner_outcome.JobOutcome("failed", "BackoffLimitExceeded"), failure, ""
    )
    assert "OOMKilled" in message and "exit code 137" in message and "memory" in message
    assert "kubectl logs job/j" in message


def test_job_failure_message_without_pods_uses_the_job_reason_and_logs() -> None:
    outcome = tuner_outcome.JobOutcome("failed", "DeadlineExceeded", "Job was active longer")
    message = tuner_outcome.job_failure_message("j", outcome, None, "a\nb\nTraceback: boom\n")
    assert "DeadlineExceeded" in message and "timeoutMinutes" in message
    assert "Traceback: boom" in message


def test_pod_waiting_reason_explains_a_pending_tuner() -> None:
    unschedulable = {
        "metadata": {"name": "p1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        }]},
    }  # fmt: skip
    pulling = {
        "metadata": {"name": "p2", "creationTimestamp": "2026-01-01T00:01:00Z"},
        "status": {"containerStatuses": [{"name": "tuner", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image tuner:1",
        }}}]},
    }  # fmt: skip
    assert "Insufficient nvidia.com/gpu" in (
        tuner_outcome.pod_waiting_reason([unschedulable]) or ""
    )
    assert tuner_outcome.pod_waiting_reason([unschedulable, pulling]) == (
        "pod p2: ImagePullBackOff: Back-off pulling image tuner:1"
    )
    assert tuner_outcome.pod_waiting_reason([]) is None
    t = tuning_pending("j", "pod p1 cannot be scheduled: x", None)
    assert t.phase == "Pending" and t.conditions["Tuned"].reason == "TuningPending"
    assert "cannot be scheduled" in t.message


def test_evicted_pods_count_as_failures() -> None:
    pods = [{"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted",
                                                    "message": "low on memory"}}]  # fmt: skip
    failure = tuner_outcome.pod_failure(pods)
    assert failure is not None and failure.reason == "Evicted"


# ------------------------------------------------------------------ the report ConfigMap


def _report(feasible: bool = True) -> Report:
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.run import tune

    body = _body(slo={"e2eLatencyMs": {"p95": 20000 if feasible else 10}})
    return tune(to_request(_obj(body)), backend="simulated", out_dir=_tmp())


def _tmp() -> Any:
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="infertune-test-"))


def test_report_configmap_round_trips_plain_and_gzipped() -> None:
    report = _report()
    small = report_configmap(name="llm", namespace=NS, report=report, th="abcd1234", owner_uid="u")
    assert "report.json" in small["data"] and small["binaryData"] is None
    assert configmap_hash(small) == "abcd1234"
    assert parse_report(small) == report
    assert is_complete(small)
    assert small["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert "blockOwnerDeletion" not in small["metadata"]["ownerReferences"][0]

    # Over the budget as JSON, well under it gzipped: the complete report, gzipped.
    padded = report.model_copy(update={"request": {**report.request, "pad": "x" * 1_100_000}})
    big = report_configmap(name="llm", namespace=NS, report=padded, th="abcd1234", owner_uid=None)
    assert big["data"] is None and "report.json.gz" in big["binaryData"]
    assert stored_bytes(big) < 100_000
    assert parse_report(big) == padded


def test_a_report_gzip_cannot_shrink_enough_is_stored_as_its_bounded_summary() -> None:
    import base64
    import random

    report = _report()
    rng = random.Random(3)
    executed = [t for t in report.trials if t.executed]
    assert len(executed) >= 2

    def noise() -> str:  # random text: gzip cannot shrink it below 3/4
        return base64.b64encode(rng.randbytes(600_000)).decode()

    loud = [t.model_copy(update={"reason": noise()}) for t in report.trials]
    huge = report.model_copy(update={"trials": loud})
    cm = report_configmap(name="llm", namespace=NS, report=huge, th="abcd1234", owner_uid=None)
    assert cm["binaryData"] is None and stored_bytes(cm) <= REPORT_BUDGET
    summary = parse_report(cm)
    assert not is_complete(cm)
    assert trials_total(cm, summary) == len(report.trials)
    assert [t.number for t in summary.trials] == [t.number for t in executed]  # executed only
    assert all(len(t.reason or "") <= REASON_CHARS for t in summary.trials)
    assert all(t.predicted is None for t in summary.trials)
    assert summary.best == report.best  # what the operator serves is untouched


def test_the_summary_drops_trials_to_fit_keeping_the_best() -> None:
    report = _report()
    assert report.best is not None
    executed = [t for t in report.trials if t.executed]
    assert len(executed) >= 3
    bare = size(summarize(report.model_copy(update={"trials": []}), 10**7))
    tight = bare + 800  # room for a trial or two, not all of them
    text = summarize(report, tight)
    assert size(text) <= tight
    kept = Report.model_validate_json(text)
    assert report.best.trial in {t.number for t in kept.trials}
    assert len(kept.trials) < len(executed)
    with pytest.raises(ValueError, match="even without its trials"):
        summarize(report, 100)


def test_parse_report_rejects_what_is_not_a_report() -> None:
    with pytest.raises(ValueError, match="neither"):
        parse_report({"metadata": {"name": "x"}, "data": {}})
    with pytest.raises(ValueError, match="not a valid infertune report"):
        parse_report({"data": {"report.json": '{"schema": "nope"}'}})


# ------------------------------------------------------------------ status and conditions


def test_conditions_keep_their_transition_time_while_the_status_holds() -> None:
    first = conditions.set_conditions(
        None, {"Tuned": conditions.Cond("False", "TuningStarted", "a")}, generation=1, now="t1"
    )
    same = conditions.set_conditions(
        first, {"Tuned": conditions.Cond("False", "TuningStarted", "b")}, generation=2, now="t2"
    )
    moved = conditions.set_conditions(
        same, {"Tuned": conditions.Cond("True", "TuningSucceeded", "c")}, generation=2, now="t3"
    )
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["observedGeneration"] == 2
    assert moved[0]["lastTransitionTime"] == "t3"


def test_status_patch_is_none_when_nothing_changed() -> None:
    t = invalid_spec(["spec.gpu.product: unknown"])
    new = conditions.next_status(None, t, generation=1, now="t", tuning_hash=None)
    assert conditions.status_patch(None, new) == new
    assert conditions.status_patch(new, new) is None
    again = conditions.next_status(new, t, generation=1, now="later", tuning_hash=None)
    assert conditions.status_patch(new, again) is None  # no churn, no events
    assert conditions.transition_events(new, again) == []


def test_transitions_emit_one_event_per_changed_condition() -> None:
    started = conditions.next_status(
        None, tuning_started("j", old_status=None),
        generation=1, now="t", tuning_hash="h",
    )  # fmt: skip
    events = conditions.transition_events(None, started)
    assert [(e.type, e.reason) for e in events] == [("Normal", "TuningStarted")]
    failed = conditions.next_status(
        started, tuning_job_failed("boom"), generation=1, now="t", tuning_hash="h"
    )
    assert [(e.type, e.reason) for e in conditions.transition_events(started, failed)] == [
        ("Warning", "TuningJobFailed")
    ]
    assert failed["phase"] == "Failed" and failed["tuningHash"] == "h"


def test_tuned_status_fields_match_the_crd() -> None:
    report = _report()
    fields = tuned_fields(report, "llm-tuning-report")
    assert set(fields["bestConfig"]) == {"tp", "maxBatchSize", "quantization", "kvCacheDtype"}
    assert set(fields["bestMetrics"]) == {
        "ttftP50Ms", "ttftP95Ms", "ttftP99Ms", "itlP50Ms", "itlP95Ms", "itlP99Ms",
        "e2eP50Ms", "e2eP95Ms", "e2eP99Ms", "outputTokensPerSecondPerGpu", "sloMet",
    }  # fmt: skip
    assert fields["bestMetrics"]["sloMet"] is True
    assert fields["trials"] == {"executed": report.executed_trials, "total": len(report.trials)}
    crd = _crd_status_properties()
    assert set(fields) <= set(crd)
    assert set(fields["bestMetrics"]) <= set(crd["bestMetrics"]["properties"])
    assert set(fields["bestConfig"]) <= set(crd["bestConfig"]["properties"])
    status = conditions.next_status(
        None,
        serving(
            name="llm", namespace=NS, config=best_config(report),
            availability=Availability(1, 1, True),
            tuned=(report, "llm-tuning-report"),
        ),
        generation=3, now="t", tuning_hash="h",
    )  # fmt: skip
    assert set(status) <= set(crd)
    assert status["phase"] == "Ready" and status["endpoint"] == f"llm.{NS}.svc:8001"


def _crd_status_properties() -> dict[str, Any]:
    from pathlib import Path

    import yaml

    crd = yaml.safe_load(
        (
            Path(__file__).resolve().parents[2] / "crds" / "inferencedeployments.infertune.io.yaml"
        ).read_text(encoding="utf-8")
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["status"]["properties"]
    return props


def test_no_feasible_message_names_misses_and_what_to_relax() -> None:
    report = _report(feasible=False)
    assert report.best is None
    t = no_feasible_config(report, "llm-tuning-report")
    assert t.phase == "Failed"
    assert t.conditions["Tuned"].reason == "NoFeasibleConfig"
    assert "nearest misses" in t.message and report.nearest_misses[0].config.label() in t.message
    assert "raise spec.slo.e2eLatencyMs" in t.message
    assert "raise spec.slo.ttftMs" not in t.message  # only what was missed
    # A report of an earlier version recorded no typed misses: their trials name the bounds.
    misses = [m.model_copy(update={"missed": []}) for m in report.nearest_misses]
    legacy = report.model_copy(update={"nearest_misses": misses})
    assert "raise spec.slo.e2eLatencyMs" in no_feasible_config(legacy, "llm-tuning-report").message


@pytest.mark.parametrize(
    "deployment, wanted, ready",
    [
        (None, 1, False),
        ({"metadata": {"generation": 2}, "status": {"observedGeneration": 1,
          "availableReplicas": 1, "updatedReplicas": 1}}, 1, False),  # stale status
        ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2,
          "availableReplicas": 1, "updatedReplicas": 1}}, 1, True),
        ({"status": {"availableReplicas": 2, "updatedReplicas": 1}}, 2, False),  # rolling out
        ({"status": {"availableReplicas": 3, "updatedReplicas": 3}}, 2, True),
        ({"status": {"availableReplicas": 0}}, 0, False),  # scaled to zero is never Ready
    ],
)  # fmt: skip
def test_readiness(deployment: dict[str, Any] | None, wanted: int, ready: bool) -> None:
    assert deployment_availability(deployment, wanted).ready is ready


def test_config_from_status_only_for_the_same_hash_and_tuned() -> None:
    status = {
        "tuningHash": "h1",
        "bestConfig": {"tp": 2, "maxBatchSize": 8, "quantization": "fp8", "kvCacheDtype": "auto"},
        "conditions": [{"type": "Tuned", "status": "True", "reason": "TuningSucceeded"}],
    }
    assert config_from_status(status, "h1") == TrialConfig(2, 8, "fp8", "auto")
    assert config_from_status(status, "h2") is None
    retuning = {**status, "conditions": [{"type": "Tuned", "status": "False"}]}
    assert config_from_status(retuning, "h1") is None


def test_owned_objects_carry_owner_labels_and_a_render_hash() -> None:
    body = _body()
    rendered: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm"},
                "spec": {"ports": [{"port": 8001}]}}  # fmt: skip
    desired = naming.owned(rendered, body)
    assert desired["metadata"]["namespace"] == NS
    assert desired["metadata"]["labels"]["infertune.io/deployment"] == "llm"
    assert desired["metadata"]["ownerReferences"][0]["uid"] == "0000-uid"
    assert "ownerReferences" not in rendered["metadata"]  # the input is not mutated
    assert naming.needs_apply(None, desired)
    assert not naming.needs_apply(desired, naming.owned(rendered, body))
    changed = copy.deepcopy(rendered)
    changed["spec"]["ports"][0]["port"] = 9000
    assert naming.needs_apply(desired, naming.owned(changed, body))


def test_brand_new_means_no_status_and_not_being_deleted() -> None:
    body = _body()
    assert is_brand_new(body)
    assert not is_brand_new({**body, "status": {"phase": "Pending"}})
    deleting = copy.deepcopy(body)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not is_brand_new(deleting)
    no_uid = copy.deepcopy(body)
    del no_uid["metadata"]["uid"]
    assert not is_brand_new(no_uid)  # owner references need it


def test_a_quantization_that_could_not_run_at_all_is_said_in_the_tuned_condition() -> None:
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.backends.simulated import SimulatedBackend
    from infertune_tuner.measurement import Measurement
    from infertune_tuner.report.view import failure_line
    from infertune_tuner.run import tune

    class NoFp8Kernels(SimulatedBackend):
        def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
            if config.quantization == "fp8":
                return Measurement.failed(
                    "error", "[TensorRT-LLM][ERROR] Assertion failed: no FP8 GEMM tactic",
                    "loading model",
                )  # fmt: skip
            return super().run(config, repeat=repeat)

    search = {"tensorParallel": [1, 2], "maxBatchSize": [4, 8, 16, 32],
              "quantization": ["bf16", "fp8"], "kvCacheDtype": ["auto"]}  # fmt: skip
    body = _body(search=search, tuning={"backend": "simulated", "maxTrials": 20, "seed": 1})
    req = to_request(_obj(body))
    report = tune(req, backend=NoFp8Kernels(req, seed=0), out_dir=_tmp())
    assert report is not None and report.best is not None
    (row,) = [f for f in report.could_not_run if f.kind == "structure"]
    t = serving(
        name="llm", namespace=NS, config=best_config(report),
        availability=Availability(1, 1, True), tuned=(report, "llm-tuning-report"),
    )  # fmt: skip
    message = t.conditions["Tuned"].message
    assert t.conditions["Tuned"].reason == "TuningSucceeded"
    assert f"could not run: {failure_line(row)}" in message
    assert "none of quantization=fp8 ran" in message and "no FP8 GEMM tactic" in message
