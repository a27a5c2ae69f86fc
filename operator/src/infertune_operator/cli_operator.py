"""The cluster-facing commands: `infertune operator`, `infertune tune-job`, `infertune report`.

Kopf and the Kubernetes client are imported inside the commands, so `infertune tune` and
friends never pay for them.
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
    from infertune_operator.k8s import Kube
    from infertune_operator.naming import Body

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def _kube() -> Kube:
    import yaml

    from infertune_operator import k8s

    try:
        return k8s.Kube.from_environment()
    except k8s.KubeConfigError as exc:
        raise InputError(f"cannot reach a cluster: {exc}") from None
    except yaml.YAMLError as exc:  # the client parses the kubeconfig and lets this through
        raise InputError(f"cannot reach a cluster: the kubeconfig is not YAML: {exc}") from None


def _check_reachable(kube: Kube) -> None:
    """One quick call before Kopf starts: a dead API server, or one that refuses our
    credentials, is one line and exit 2, not Kopf's retries ending in a long traceback."""
    from infertune_operator import k8s
    from infertune_operator.api.models import GROUP, PLURAL

    crds = k8s.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
    try:
        kube.get(crds, None, f"{PLURAL}.{GROUP}")
    except k8s.KubeError as exc:
        if exc.status == 0:  # no HTTP answer at all: refused, unresolvable, TLS, timeout
            raise InputError(f"cannot reach the Kubernetes API server: {exc}") from None
        if exc.status == 401:
            raise InputError(f"the Kubernetes API server refuses our credentials: {exc}") from None
        # Any other answer means it is there; what this account may read is Kopf's business.


def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Namespace to watch (repeatable)."),
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Watch every namespace.")
    ] = False,
    liveness: Annotated[
        str, typer.Option("--liveness", help="Liveness endpoint URL ('' to disable).")
    ] = DEFAULT_LIVENESS,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the operator: reconcile InferenceDeployments (tune, then deploy the winner)."""
    import asyncio

    import kopf

    from infertune_operator.handlers import run_operator
    from infertune_operator.settings import Settings

    namespaces = [n for n in namespace or [] if n]
    if all_namespaces and namespaces:
        raise InputError("give either --namespace (repeatable) or --all-namespaces, not both")
    if not all_namespaces and not namespaces:
        raise InputError("give --namespace NS (repeatable) or --all-namespaces")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise InputError(f"operator settings: {exc}") from None
    kube = _kube()
    _check_reachable(kube)
    kopf.configure(verbose=verbose)
    asyncio.run(
        run_operator(
            kube=kube,
            settings=settings,
            namespaces=namespaces,
            clusterwide=all_namespaces,
            liveness=liveness or None,
        )
    )


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
    from infertune_tuner.cli_support import exit_on_sigterm
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
    kube = _kube()
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
    from infertune_tuner.cli_support import exit_on_sigterm
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

    kube = _kube()
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


def report(
    name: Annotated[str, typer.Argument(help="InferenceDeployment name.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Namespace (default: kubeconfig's).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output folder (default ./NAME-report).")
    ] = None,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the HTML report in a browser.")
    ] = False,
) -> None:
    """Fetch an InferenceDeployment's tuning report from the cluster; write JSON/Markdown/HTML."""
    import webbrowser

    from infertune_operator import k8s, naming, report_store
    from infertune_tuner.run import write_report

    kube = _kube()
    ns = namespace or kube.default_namespace
    cm_name = naming.report_configmap_name(name)
    try:
        cm = kube.get(k8s.CONFIGMAPS, ns, cm_name)
    except k8s.KubeError as exc:
        raise InputError(f"cannot read ConfigMap {ns}/{cm_name}: {exc}") from None
    if cm is None:
        raise InputError(
            f"no tuning report for {name!r} in namespace {ns!r} (ConfigMap {cm_name} not found); "
            f"is tuning finished? see `kubectl get infd {name} -n {ns}`"
        )
    try:
        parsed = report_store.parse_report(cm)
    except ValueError as exc:
        raise InputError(f"ConfigMap {ns}/{cm_name}: {exc}") from None
    if not report_store.is_complete(cm):
        typer.echo(
            f"note: ConfigMap {ns}/{cm_name} holds a summary of the report: the "
            f"{len(parsed.trials)} executed trials of {report_store.trials_total(cm, parsed)}, "
            "their failure reasons cut short (the complete report did not fit in a ConfigMap; "
            "the study storage, spec.tuning.storage, keeps every trial)",
            err=True,
        )
    paths = write_report(parsed, out or Path(f"{name}-report"))
    _after_deploy(kube, ns, name, paths)
    for p in paths:
        typer.echo(str(p))
    if open_browser:
        html = paths[-1].resolve()
        if not webbrowser.open(html.as_uri()):
            typer.echo(f"could not open a browser; open {html}", err=True)


def _after_deploy(kube: Kube, namespace: str, name: str, paths: list[Path]) -> None:
    """Append the verification and the observed workload, beside the tuned numbers, to
    report.md and report.html (and say them on stdout), when the InferenceDeployment can be
    read and serves something."""
    from infertune_operator import k8s
    from infertune_operator.report_live import deployed_view
    from infertune_tuner.report import deployed

    try:
        body = kube.get(k8s.INFERENCEDEPLOYMENTS, namespace, name)
    except k8s.KubeError:  # `infertune report` needs only the ConfigMap: the rest is a bonus
        return
    view = deployed_view(body) if body is not None else None
    if view is None:
        return
    text = deployed.markdown(view)
    md = next(p for p in paths if p.suffix == ".md")
    md.write_text(md.read_text(encoding="utf-8").rstrip() + "\n\n" + text, encoding="utf-8")
    page = next(p for p in paths if p.suffix == ".html")
    html = page.read_text(encoding="utf-8")
    page.write_text(html.replace("</body>", deployed.html(view) + "</body>", 1), encoding="utf-8")
    typer.echo(text)
