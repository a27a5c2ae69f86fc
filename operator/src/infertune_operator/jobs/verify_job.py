"""`infertune verify-job`: what the verification Job runs (``policy.verification`` decides
what to measure and renders the Job).

It measures the Service with the tuner's load generator and stores the result in the
ConfigMap NAME-verification through the guarded write (``reports.writer``). The Kubernetes
client is imported inside the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from infertune_tuner.errors import InputError

if TYPE_CHECKING:
    from infertune_operator.naming import Body


def verify_job(
    deployment: Annotated[str, typer.Option("--deployment", help="InferenceDeployment name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Its namespace.")],
    verification_hash: Annotated[
        str, typer.Option("--verification-hash", help="The deployed configuration's hash.")
    ],
    url: Annotated[str, typer.Option("--url", help="The Service's gRPC address, HOST:PORT.")],
    config: Annotated[
        str, typer.Option("--config", help="The configuration verified (its label, as stored).")
    ],
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

    from infertune_operator.kube.client import connect
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.policy import verification
    from infertune_operator.reports.owner import WriteAction, WritePlan, plan_owned_write
    from infertune_operator.reports.writer import write_guarded
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

    def plan(owner: Body | None, known: bool, existing: Body | None) -> WritePlan:
        return plan_owned_write(
            owner=owner, owner_known=known, uid=owner_uid, existing=existing, what="verification"
        )

    kube = connect()
    try:
        outcome = write_guarded(
            kube, body=body, owner_name=deployment, namespace=namespace, plan=plan
        )
    except KubeError as exc:
        raise InputError(f"cannot write the verification result: {exc}", exit_code=1) from None
    measured = (
        f"{result.metrics.output_tokens_per_s_per_gpu:.0f} tok/s/GPU"
        if result.metrics is not None else f"nothing usable ({result.problem})"
    )  # fmt: skip
    where = body["metadata"]["name"]
    if outcome.action is WriteAction.SKIP:
        typer.echo(f"{deployment}: {config} measured {measured}; not stored: {outcome.reason}")
        return
    typer.echo(f"{deployment}: {config} measured {measured}; result in ConfigMap "
               f"{namespace}/{where}")  # fmt: skip
