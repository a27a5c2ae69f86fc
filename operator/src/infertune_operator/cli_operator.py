"""The commands that run inside the operator's Jobs: `infertune tune-job`, `infertune verify-job`.

The Kubernetes client is imported inside the commands, so `infertune tune` never pays for it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from infertune_tuner.errors import InputError
from infertune_tuner.report.view import headline

if TYPE_CHECKING:
    from infertune_operator.naming import Body


def tune_job(
    request: Annotated[Path, typer.Option("--request", help="TuningRequest JSON file.")],
    report_configmap: Annotated[
        str, typer.Option("--report-configmap", help="ConfigMap to write report.json into.")
    ],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Its namespace.")],
    owner_uid: Annotated[
        str | None, typer.Option("--owner-uid", help="UID of the owning InferenceDeployment.")
    ] = None,
    tuning_hash: Annotated[
        str | None, typer.Option("--tuning-hash", help="The spec hash this tuning is for.")
    ] = None,
    retune_hash: Annotated[
        str | None,
        typer.Option(
            "--retune-hash", help="A retune's hash: the report goes to NAME-retune-report."
        ),
    ] = None,
) -> None:
    """Run inside the tuner Job: tune the request and store the report in a ConfigMap.

    Exits 0 whether or not a configuration met the SLO (the report says which); only a crash
    fails the Job.
    """
    from infertune_operator import k8s, naming
    from infertune_operator.report_owner import WriteAction
    from infertune_operator.report_writer import write_report
    from infertune_operator.tuner_workers import worker_request
    from infertune_tuner.cli.support import exit_on_sigterm
    from infertune_tuner.request import TuningRequest
    from infertune_tuner.run import tune

    exit_on_sigterm()
    try:
        req = TuningRequest.model_validate_json(request.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{request}: no such file") from None
    except ValueError as exc:
        raise InputError(f"{request}: not a valid TuningRequest: {exc}") from None
    expected = (
        naming.report_configmap_name(req.name)
        if retune_hash is None
        else naming.retune_report_name(req.name)
    )
    if report_configmap != expected:
        raise InputError(f"--report-configmap must be {expected!r} for request {req.name!r}")
    kube = k8s.connect()
    run_req, gpus = worker_request(req, os.environ)
    with tempfile.TemporaryDirectory(prefix="infertune-tune-") as tmp:
        report = tune(run_req, backend=run_req.tuning.backend, out_dir=Path(tmp), gpus=gpus)
    if report is None:  # one worker of a parallel tuning: the last one writes the report
        typer.echo(f"{req.name}: worker done; the last worker writes the report")
        return
    try:
        outcome = write_report(
            kube, request=req, report=report, namespace=namespace, th=tuning_hash, uid=owner_uid,
            retune_hash=retune_hash,
        )  # fmt: skip
    except k8s.KubeError as exc:
        raise InputError(f"cannot write the report ConfigMap: {exc}", exit_code=1) from None
    verdict = headline(report).text  # the report's own first sentence: found, aborted, none
    if outcome.action is WriteAction.SKIP:  # a newer tuning owns the report: exit 0, quietly
        typer.echo(f"{req.name}: {report.executed_trials} trials, {verdict}; report not "
                   f"written: {outcome.reason}")  # fmt: skip
        return
    kept = "" if outcome.complete else " (its summary: the complete report does not fit)"
    typer.echo(
        f"{req.name}: {report.executed_trials} trials, {verdict}; report in ConfigMap "
        f"{namespace}/{report_configmap}{kept}"
    )


def verify_job(
    deployment: Annotated[str, typer.Option("--deployment", help="InferenceDeployment name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Its namespace.")],
    verification_hash: Annotated[
        str, typer.Option("--verification-hash", help="The deployed configuration's hash.")
    ],
    url: Annotated[str, typer.Option("--url", help="The Service's gRPC address, HOST:PORT.")],
    config: Annotated[str, typer.Option("--config", help="The configuration verified.")],
    tp: Annotated[
        int,
        typer.Option("--tp", min=1, help="Its tensor parallel size: the GPUs a replica uses."),
    ],
    concurrency: Annotated[int, typer.Option("--concurrency", help="Requests in flight.")],
    requests: Annotated[int, typer.Option("--requests", help="Measured requests.")],
    input_tokens: Annotated[int, typer.Option("--input-tokens", help="Prompt tokens.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output tokens.")],
    model: Annotated[str, typer.Option("--model", help="The served model's name.")] = "llm",
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up requests.")] = 0,
    deadline: Annotated[
        float, typer.Option("--deadline", help="Seconds the whole run may take.")
    ] = 600.0,
    owner_uid: Annotated[
        str | None, typer.Option("--owner-uid", help="UID of the owning InferenceDeployment.")
    ] = None,
) -> None:
    """Run inside the verification Job: measure the Service once, as a tuning trial measured the
    configuration, and store the result in the ConfigMap NAME-verification.

    Exits 0 whenever the result is stored, a failed measurement included (the result says
    why); only a failed write fails the Job.
    """
    from datetime import UTC, datetime

    from infertune_operator import k8s, report_owner, verification
    from infertune_operator.report_writer import write_guarded
    from infertune_tuner.cli.support import exit_on_sigterm
    from infertune_tuner.harness.load_spec import LoadSpec
    from infertune_tuner.harness.loadgen import run_load_sync
    from infertune_tuner.result import Metrics, PercentilesOut

    exit_on_sigterm()
    spec = LoadSpec(
        url=url, model=model, concurrency=concurrency, requests=requests, warmup=warmup,
        input_tokens=input_tokens, output_tokens=output_tokens, deadline_s=deadline,
    )  # fmt: skip
    fields: dict[str, object] = {"hash": verification_hash, "config": config}
    try:
        spec.validate()
        bench = run_load_sync(spec)
    except InputError as exc:  # unreachable, model not served: a result that says so
        fields["problem"] = str(exc)
    else:
        latency = bench.workload_latency()
        if bench.requests and all(latency.values()):
            fields["metrics"] = Metrics(
                **{k: PercentilesOut.of(v.percentiles()) for k, v in latency.items() if v},
                output_tokens_per_s_per_gpu=round(bench.output_tokens_per_s / tp, 3),
            )
        stopped = bench.settings.get("stopped")
        fields.update(requests=bench.requests, errors=bench.errors, stalled=bench.stalled,
                      duration_s=round(bench.duration_s, 3),
                      problem=f"the run stopped early: {stopped}" if stopped else None)  # fmt: skip
    fields["finished_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = verification.VerificationResult.model_validate(fields)
    body = verification.result_configmap(
        name=deployment, namespace=namespace, uid=owner_uid, result=result
    )

    def plan(owner: Body | None, known: bool, existing: Body | None) -> report_owner.WritePlan:
        return report_owner.plan_owned_write(
            owner=owner, owner_known=known, uid=owner_uid, existing=existing, what="verification"
        )

    kube = k8s.connect()
    try:
        outcome = write_guarded(
            kube, body=body, owner_name=deployment, namespace=namespace, plan=plan
        )
    except k8s.KubeError as exc:
        raise InputError(f"cannot write the verification result: {exc}", exit_code=1) from None
    measured = (
        f"{result.metrics.output_tokens_per_s_per_gpu:.0f} tok/s/GPU"
        if result.metrics is not None else f"nothing usable ({result.problem})"
    )  # fmt: skip
    where = body["metadata"]["name"]
    if outcome.action is report_owner.WriteAction.SKIP:
        typer.echo(f"{deployment}: {config} measured {measured}; not stored: {outcome.reason}")
        return
    typer.echo(f"{deployment}: {config} measured {measured}; result in ConfigMap "
               f"{namespace}/{where}")  # fmt: skip
