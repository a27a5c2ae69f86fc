"""`infertune tune-job`: what the tuner Job runs (``objects.tuner_job`` renders the Job).

The request comes as a file (the Job's request ConfigMap), the report goes to the report
ConfigMap through the guarded write (``reports.writer``). The Kubernetes client is imported
inside the command, so `infertune tune` never pays for it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from infertune_tuner.errors import InputError
from infertune_tuner.report.view import headline


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
    from infertune_operator import naming
    from infertune_operator.kube.client import connect
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.objects.tuner_workers import POOL_ENV, worker_request
    from infertune_operator.reports.owner import WriteAction
    from infertune_operator.reports.writer import write_report
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
    kube = connect()
    run_req, gpus = worker_request(req, os.environ)
    with tempfile.TemporaryDirectory(prefix="infertune-tune-") as tmp:
        report = tune(
            run_req, backend=run_req.tuning.backend, out_dir=Path(tmp), gpus=gpus,
            pool=os.environ.get(POOL_ENV) or None,  # a pool's tuner Job: its pool's trials only
        )  # fmt: skip
    if report is None:  # one worker of a parallel tuning: the last one writes the report
        typer.echo(f"{req.name}: worker done; the last worker writes the report")
        return
    try:
        outcome = write_report(
            kube, request=req, report=report, namespace=namespace, th=tuning_hash, uid=owner_uid,
            retune_hash=retune_hash, job_uid=os.environ.get(naming.TUNER_JOB_UID_ENV) or None,
        )  # fmt: skip
    except KubeError as exc:
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
