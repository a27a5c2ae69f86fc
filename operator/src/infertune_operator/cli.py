"""The `infertune` command line.

Every command is a plain function in a ``cli_*`` module (``simserver`` is the tuner's own) and
is registered in one place, :data:`COMMANDS`. Bad input is an ``InputError`` raised anywhere in a
command: the app's :class:`~infertune_tuner.cli_support.Group` prints ``error: ...`` and exits
with the error's code (2 unless it says otherwise), never a traceback. Heavy imports happen
inside the commands, so that `infertune tune` does not load Kopf or the Kubernetes client.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from infertune_operator import __version__, cli_catalog, cli_harness, cli_operator, cli_tuner
from infertune_tuner import defaults
from infertune_tuner.cli_support import Group, command
from infertune_tuner.errors import EXIT_INVALID
from infertune_tuner.harness.simserver_cli import simserver

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
        f"{file}: valid {obj.kind} {obj.metadata.name!r}: {s.model.name} on {s.gpu.product}, "
        f"{s.workload.input_tokens} in / {s.workload.output_tokens} out, backend {backend}"
    )
    _show_space(obj)
    for advisory in advisories(obj):  # valid, but likely to fail on a cluster: say so
        typer.echo(f"{file}: warning ({advisory.reason}): {advisory.message}", err=True)


def _show_space(obj: Any) -> None:
    """The search space the backend will search, and what left it and why."""
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.space import build_space

    request = to_request(obj)
    space = build_space(request, request.resolve_model(), request.resolve_gpu())
    typer.echo(
        f"  search space on the {request.tuning.backend} backend: {len(space)} configurations"
    )
    for e in space.excluded:
        typer.echo(f"  excluded {e.field}={e.value}: {e.reason}")


COMMANDS: tuple[Callable[..., Any], ...] = (
    crd,
    validate,
    cli_tuner.tune,
    cli_tuner.export_replay,
    cli_tuner.predict,
    cli_catalog.gpus,
    cli_catalog.models,
    cli_harness.bench,
    simserver,
    cli_harness.render,
    cli_operator.operator,
    cli_operator.tune_job,
    cli_operator.verify_job,
    cli_operator.report,
)
for _command in COMMANDS:
    command(app, _command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
