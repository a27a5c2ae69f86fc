"""`infertune simserver`: one command, two entry points.

``infertune`` mounts :func:`simserver` with the tuner's other commands, and
``python -m infertune_tuner.cli.simserver`` runs it alone (the tuner's tests and benchmarks
start servers that way: no console script on PATH needed). Loading this module loads no gRPC.
"""

from __future__ import annotations

from typing import Annotated

import typer

from infertune_tuner.cli.support import KvDtypeOption, QuantOption, command


def simserver(
    model: Annotated[str, typer.Option(help="Catalog key or Hugging Face id.")],
    gpu: Annotated[str, typer.Option(help="GPU catalog key or product label.")],
    max_batch: Annotated[int, typer.Option("--max-batch", help="Engine max batch size.")],
    port: Annotated[int, typer.Option(help="gRPC port.")] = 8001,
    http_port: Annotated[
        int | None,
        typer.Option(
            help="HTTP health port (default: the gRPC port - 1, as Triton's 8000 beside 8001; "
            "0: any free port; -1: none)."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Triton's metrics endpoint, GET /metrics (default: none; -1: none)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "0.0.0.0",
    tp: Annotated[int, typer.Option(help="Tensor parallel size.")] = 1,
    quant: QuantOption = "bf16",
    kv_dtype: KvDtypeOption = "auto",
    served_model: Annotated[str, typer.Option(help="Model name clients use.")] = "llm",
    time_scale: Annotated[
        float, typer.Option(help="Multiply all modelled times (0.1 = 10x faster).")
    ] = 1.0,
    architecture: Annotated[
        str | None, typer.Option(help="JSON transformer shape for a model not in the catalog.")
    ] = None,
) -> None:
    """Serve a simulated Triton (KServe v2 gRPC, decoupled streaming) timed by the model.

    Exits 1 with a CUDA-OOM-like message when the weights do not fit, as a real server dies.
    """
    from infertune_tuner.harness import simserver as sim

    cfg = sim.build_config(
        model=model, gpu=gpu, tp=tp, max_batch=max_batch, quant=quant, kv_dtype=kv_dtype,
        served_model=served_model, time_scale=time_scale, host=host, port=port,
        http_port=sim.default_http_port(port) if http_port is None else http_port,
        architecture=sim.parse_architecture(architecture), metrics_port=metrics_port,
    )  # fmt: skip
    code = sim.run(cfg)
    if code:
        raise typer.Exit(code)


def main() -> None:
    """Run :func:`simserver` as a program of its own."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    command(app, simserver)
    app(prog_name="simserver")


if __name__ == "__main__":  # `python -m infertune_tuner.cli.simserver`: `infertune simserver`
    main()
