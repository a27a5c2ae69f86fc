"""The `infertune` command line: the tuner's commands, mounted, and the cluster commands.

The tuner owns its commands (``infertune_tuner.cli``: tune, export-replay, predict, gpus, models,
bench, simserver) and mounts them here with :func:`read_spec`, the operator's reading of an
InferenceDeployment manifest; this module adds the commands of the InferenceDeployment API and
the cluster (crd, validate, render, operator, report) and registers those that run inside the
operator's Jobs (``jobs``: tune-job, verify-job). Help lists the two sets under their own
headings. Bad input is an ``InputError`` raised anywhere in a command: the app's
:class:`~infertune_tuner.cli.support.Group` prints ``error: ...`` and exits with the error's code
(2 unless it says otherwise), never a traceback. Heavy imports happen inside the commands, so
that `infertune tune` does not load Kopf or the Kubernetes client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from infertune_operator import __version__
from infertune_operator.jobs.tune_job import tune_job
from infertune_operator.jobs.verify_job import verify_job
from infertune_tuner import defaults
from infertune_tuner.cli.commands import mount
from infertune_tuner.cli.support import Group, command
from infertune_tuner.config import (
    CONFIG_KEYS,
    GPU_KEY,
    KV_CACHE_DTYPE_VALUES,
    PARAM_KEYS,
    QUANTIZATION_VALUES,
    TrialConfig,
)
from infertune_tuner.errors import EXIT_INVALID, InputError

if TYPE_CHECKING:
    from infertune_operator.kube.client import Kube
    from infertune_tuner.request import TuningRequest

CLUSTER_COMMANDS = "Cluster commands"
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"

app = typer.Typer(
    name="infertune",
    help="Autotune LLM inference deployments (Triton + TensorRT-LLM) against latency SLOs.",
    cls=Group,
    # Click's plain help: it wraps every column and never cuts a word (Typer's rich panels cut
    # words wider than their help column: "spec.tuning.maxTri…" at 80 columns).
    rich_markup_mode=None,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"infertune {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Autotune LLM inference deployments (Triton + TensorRT-LLM) against latency SLOs."""


def read_spec(spec: Path, backend: str) -> TuningRequest:
    """`infertune tune SPEC`: the InferenceDeployment manifest, checked exactly as `validate`
    checks it for this kind of backend (memory included: what `validate` refuses, `tune`
    refuses with the same words), as the request to tune (the
    :class:`~infertune_tuner.cli.tuning.SpecReader` the tuner's commands are mounted with)."""
    from infertune_operator.api.feasibility import feasibility_problems
    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.api.to_request import to_request

    obj = load_deployment(spec)
    problems = feasibility_problems(obj, backend=backend)
    if problems:
        raise InputError(f"{spec}: cannot be tuned", [str(p) for p in problems])
    return to_request(obj, default_backend=backend)


def crd() -> None:
    """Print the InferenceDeployment CustomResourceDefinition (generated from the API models)."""
    from infertune_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


def validate(
    file: Annotated[Path, typer.Argument(help="InferenceDeployment manifest, YAML or JSON.")],
) -> None:
    """Check a manifest; report every problem with its field path (exit 2 when invalid)."""
    from infertune_operator.api.advisories import advisories
    from infertune_operator.api.feasibility import feasibility_problems
    from infertune_operator.api.manifest import find_deployment_document, validate_document

    obj, problems = validate_document(find_deployment_document(file))
    if obj is not None:
        problems = feasibility_problems(obj)
    if obj is None or problems:
        typer.echo(
            f"{file}: invalid ({len(problems)} problem{'s' * (len(problems) != 1)})", err=True
        )
        for p in problems:
            typer.echo(f"  - {p}", err=True)
        raise typer.Exit(EXIT_INVALID)
    s = obj.spec
    backend = s.tuning.backend or f"{defaults.CLUSTER_BACKEND} (the operator's default)"
    typer.echo(
        f"{file}: valid {obj.kind} {obj.metadata.name!r}: {s.model.name} on {', '.join(s.gpu.products)}, "
        f"{s.workload.input_tokens} in / {s.workload.output_tokens} out, backend {backend}"
    )
    _show_space(obj)
    for advisory in advisories(obj):  # valid, but likely to fail on a cluster: say so
        typer.echo(f"{file}: warning ({advisory.reason}): {advisory.message}", err=True)


def _show_space(obj: Any) -> None:
    """The search space the backend will search, and what left it and why."""
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.space import search_space

    request = to_request(obj)
    space = search_space(request, request.resolve_model())
    typer.echo(
        f"  search space on the {request.tuning.backend} backend: {len(space)} configurations"
    )
    for e in space.excluded:
        typer.echo(f"  excluded {e.field}={e.value}: {e.reason}")


CONFIG_METAVAR = "tp=N,max_batch_size=N,quantization=Q[,kv_cache_dtype=D][,gpu=PRODUCT]"


def parse_config(text: str) -> TrialConfig:
    """`tp=2,max_batch_size=128,quantization=fp8,kv_cache_dtype=auto` -> TrialConfig
    (kv_cache_dtype defaults to auto; `gpu`, the pool of spec.gpu.pools to serve on, to the
    first). The `--config` option's parameter type."""
    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise InputError(f"--config: {part!r} is not KEY=VALUE")
        if key not in PARAM_KEYS:
            raise InputError(f"--config: unknown key {key!r}; keys: {', '.join(PARAM_KEYS)}")
        values[key] = value.strip()
    values.setdefault("kv_cache_dtype", "auto")
    missing = [k for k in CONFIG_KEYS if k not in values]
    if missing:
        raise InputError(f"--config: missing {', '.join(missing)}")
    ints: dict[str, int] = {}
    for key in ("tp", "max_batch_size"):
        try:
            ints[key] = int(values[key])
        except ValueError:
            raise InputError(f"--config: {key} must be an integer, not {values[key]!r}") from None
        if ints[key] < 1:
            raise InputError(f"--config: {key} must be at least 1")
    if values["quantization"] not in QUANTIZATION_VALUES:
        raise InputError(f"--config: quantization must be one of {', '.join(QUANTIZATION_VALUES)}")
    if values["kv_cache_dtype"] not in KV_CACHE_DTYPE_VALUES:
        raise InputError(
            f"--config: kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_VALUES)}"
        )
    return TrialConfig(
        ints["tp"], ints["max_batch_size"], values["quantization"], values["kv_cache_dtype"],
        values.get(GPU_KEY, ""),
    )  # fmt: skip


def render(
    spec: Annotated[Path, typer.Argument(help="InferenceDeployment manifest, YAML or JSON.")],
    config: Annotated[
        TrialConfig,
        typer.Option(
            help="The configuration to serve.", parser=parse_config, metavar=CONFIG_METAVAR
        ),
    ],
    simulated: Annotated[
        bool | None,
        typer.Option(
            "--simulated/--no-simulated",
            help="Render the simulated server (default: as the operator resolves the backend: "
            "spec.tuning.backend, else INFERTUNE_DEFAULT_BACKEND, else triton).",
        ),
    ] = None,
) -> None:
    """Print the Kubernetes objects (YAML) that would serve one configuration."""
    import yaml

    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.objects.serving import render_serving
    from infertune_operator.settings import Settings
    from infertune_tuner.runtime import SimulatedRuntime, TritonRuntime

    obj = load_deployment(spec)
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise InputError(str(exc)) from None
    runtime = None if simulated is None else SimulatedRuntime() if simulated else TritonRuntime()
    _check_servable(obj, config, weights=simulated is not True)
    objects = render_serving(obj, config, settings, runtime=runtime)
    sys.stdout.write(yaml.dump_all(objects, Dumper=_block_dumper(), sort_keys=False))


def _check_servable(obj: Any, config: TrialConfig, *, weights: bool) -> None:
    """What `predict` would say against this configuration: render nothing that cannot run
    (`weights`: the rendered server loads real weights, unless the spec says simulated)."""
    from infertune_operator.api.feasibility import weights_problem
    from infertune_operator.api.to_request import to_request
    from infertune_tuner import pools
    from infertune_tuner.servable import config_problems, fit_problem

    request = to_request(obj)
    known = config.gpu == request.gpu.product or config.gpu in pools.products(request)
    if config.gpu and not known:
        listed = ", ".join(pools.products(request)) or request.gpu.product
        raise InputError(f"--config gpu={config.gpu}: not a pool of this spec ({listed})")
    if config.gpu:
        request = pools.single(request, config.gpu)
    arch, gpu = request.resolve_model(), request.resolve_gpu()
    problems = config_problems(arch, gpu, config, max_gpus=request.gpu.max_gpus_per_replica)
    if weights and (missing := weights_problem(request, "triton")) is not None:
        problems.append(str(missing))
    if not problems:
        too_long = arch.context_problem(request.work.input_tokens, request.work.output_tokens)
        fit = too_long or fit_problem(arch, gpu, config, request.work)
        problems += [fit] if fit else []
    if problems:
        raise InputError(f"--config {config.label()} cannot be served", problems)


def _block_dumper() -> Any:
    import yaml

    class BlockDumper(yaml.SafeDumper):
        """yaml.safe_dump, with multi-line strings (model.yaml, scripts) as literal blocks."""

    def text(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, text)
    return BlockDumper


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
    from infertune_operator.engine.handlers import serve
    from infertune_operator.kube.client import connect
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
    kube = connect()
    _check_reachable(kube)
    serve(
        kube=kube,
        settings=settings,
        namespaces=namespaces,
        clusterwide=all_namespaces,
        liveness=liveness or None,
        verbose=verbose,
    )


def _check_reachable(kube: Kube) -> None:
    """One quick call before Kopf starts: a dead API server, or one that refuses our
    credentials, is one line and exit 2, not Kopf's retries ending in a long traceback."""
    from infertune_operator.api.types import GROUP, PLURAL
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.kube.resources import Resource

    crds = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
    try:
        kube.get(crds, None, f"{PLURAL}.{GROUP}")
    except KubeError as exc:
        if exc.status == 0:  # no HTTP answer at all: refused, unresolvable, TLS, timeout
            raise InputError(f"cannot reach the Kubernetes API server: {exc}") from None
        if exc.status == 401:
            raise InputError(f"the Kubernetes API server refuses our credentials: {exc}") from None
        # Any other answer means it is there; what this account may read is Kopf's business.


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

    from infertune_operator import naming
    from infertune_operator.kube.client import connect
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.kube.resources import CONFIGMAPS
    from infertune_operator.reports.store import is_complete, parse_report, trials_total
    from infertune_tuner.run import write_report

    kube = connect()
    ns = namespace or kube.default_namespace
    cm_name = naming.report_configmap_name(name)
    try:
        cm = kube.get(CONFIGMAPS, ns, cm_name)
    except KubeError as exc:
        raise InputError(f"cannot read ConfigMap {ns}/{cm_name}: {exc}") from None
    if cm is None:
        raise InputError(
            f"no tuning report for {name!r} in namespace {ns!r} (ConfigMap {cm_name} not found); "
            f"is tuning finished? see `kubectl get infd {name} -n {ns}`"
        )
    try:
        parsed = parse_report(cm)
    except ValueError as exc:
        raise InputError(f"ConfigMap {ns}/{cm_name}: {exc}") from None
    if not is_complete(cm):
        typer.echo(
            f"note: ConfigMap {ns}/{cm_name} holds a summary of the report: the "
            f"{len(parsed.trials)} executed trials of {trials_total(cm, parsed)}, "
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
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.kube.resources import INFERENCEDEPLOYMENTS
    from infertune_operator.reports.live import deployed_view
    from infertune_tuner.report import deployed

    try:
        body = kube.get(INFERENCEDEPLOYMENTS, namespace, name)
    except KubeError:  # `infertune report` needs only the ConfigMap: the rest is a bonus
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


mount(app, read_spec)  # the tuner's commands first, under their own heading
for _command in (
    crd,
    validate,
    render,
    operator,
    tune_job,
    verify_job,
    report,
):
    command(app, _command, panel=CLUSTER_COMMANDS)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
