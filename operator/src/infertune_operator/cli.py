"""The `infertune` command line.

Every command turns bad input into a one-line (or one-line-per-problem) message on stderr and
exit code 2 -- never a traceback. Heavy imports happen inside the commands so that `infertune tune`
does not load Kopf or the Kubernetes client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from infertune_operator.cli_errors import EXIT_INVALID, user_errors

app = typer.Typer(
    name="infertune",
    help="Autotune LLM inference deployments (Triton + TensorRT-LLM) against latency SLOs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def crd() -> None:
    """Print the InferenceDeployment CustomResourceDefinition (generated from the API models)."""
    from infertune_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
@user_errors
def validate(
    file: Annotated[Path, typer.Argument(help="InferenceDeployment manifest, YAML or JSON.")],
) -> None:
    """Check a manifest; report every problem with its field path (exit 2 when invalid)."""
    from infertune_operator.api.manifest import find_deployment_document, validate_document

    obj, problems = validate_document(find_deployment_document(file))
    if obj is None:
        typer.echo(
            f"{file}: invalid ({len(problems)} problem{'s' * (len(problems) != 1)})", err=True
        )
        for p in problems:
            typer.echo(f"  - {p}", err=True)
        raise typer.Exit(EXIT_INVALID)
    s = obj.spec
    typer.echo(
        f"{file}: valid {obj.kind} {obj.metadata.name!r}: {s.model.name} on {s.gpu.product}, "
        f"{s.workload.input_tokens} in / {s.workload.output_tokens} out, "
        f"backend {s.tuning.effective_backend()}"
    )


def _register_commands() -> None:
    """Command groups live in their own modules; each adds its commands to `app`."""
    from infertune_operator import cli_harness, cli_operator, cli_tuner

    for module in (cli_tuner, cli_harness, cli_operator):
        module.register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
