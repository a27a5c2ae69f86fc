"""`infertune tune | export-replay | predict`: the tuner and the performance model, no cluster.

`tune` reads a manifest the tuner cannot read: an InferenceDeployment is the operator's API,
and the tuner knows nothing of the operator (the import contracts say so). So the command is
built around a :class:`SpecReader` that its program supplies (:func:`tune_command`);
``infertune`` passes the operator's (load, check as ``validate`` does, translate to a
TuningRequest). Injected, not imported: the tuner stays whole without the operator, and the one
translation of the API into a request stays where the API lives.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from infertune_tuner import defaults
from infertune_tuner.backends import BACKEND_HELP
from infertune_tuner.cli.support import KvDtypeOption, QuantOption, exit_on_sigterm, one_of
from infertune_tuner.errors import InputError
from infertune_tuner.interrupt import by_ctrl_c, settle, settling
from infertune_tuner.request import SEED_MAX, Sampler, TuningRequest

if TYPE_CHECKING:
    from infertune_tuner.result import Report

EXIT_NO_FEASIBLE = 3
EXIT_TRIALS_FAILED = 4
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for Ctrl-C (SIGINT); the report is written
INTERRUPTED_EARLY = "Interrupted (Ctrl-C) while the search was set up: no trial ran, no report."
START_AGAIN = "Re-run the same command to tune."


class SpecReader(Protocol):
    """Reads the manifest `infertune tune SPEC` names into the request to tune.

    ``backend`` is the kind of backend the run uses (``simulated``, ``replay``, ``triton``): what
    can be tuned, and the request's default backend, depend on it. Bad input (no such file, an
    invalid manifest, nothing to tune on that backend) is an
    :class:`~infertune_tuner.errors.InputError` that says why.
    """

    def __call__(self, spec: Path, backend: str) -> TuningRequest: ...


def tune_command(read_spec: SpecReader) -> Callable[..., None]:
    """The `tune` command, reading its SPEC with ``read_spec``."""

    def tune(
        ctx: typer.Context,
        spec: Annotated[Path, typer.Argument(help="InferenceDeployment manifest (YAML or JSON).")],
        backend: Annotated[
            str, typer.Option(help=f"{BACKEND_HELP}.", metavar="BACKEND")
        ] = defaults.LOCAL_BACKEND,
        out: Annotated[
            Path | None, typer.Option(help="Output directory (default infertune-out/NAME).")
        ] = None,
        seed: Annotated[int | None, typer.Option(help="Override spec.tuning.seed.")] = None,
        max_trials: Annotated[
            int | None, typer.Option(help="Override spec.tuning.maxTrials.")
        ] = None,
        sampler: Annotated[
            str | None,
            typer.Option(
                help="Override spec.tuning.sampler.", **one_of(Sampler, "--sampler", "sampler")
            ),
        ] = None,
        confidence: Annotated[
            float | None,
            typer.Option(
                help=f"Override spec.tuning.confidence: how sure `auto` must be before it stops "
                f"(default {defaults.CONFIDENCE})."
            ),
        ] = None,
        server_command: Annotated[
            str | None,
            typer.Option(
                help="triton backend: command template that starts the server instead of "
                "tritonserver."
            ),
        ] = None,
        progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
        retry_failed: Annotated[
            bool,
            typer.Option(
                help="Try afresh what failed in earlier runs of this study (after fixing the "
                "set-up the tuner cannot see: a node, a driver). By default a resumed study keeps "
                "structures that could not run excluded, unless the backend, server command or "
                "infertune version changed."
            ),
        ] = False,
        pool: Annotated[
            str | None,
            typer.Option(
                help="Measure only this pool of spec.gpu.pools: one worker per pool, each on "
                "that pool's machines, sharing the study in spec.tuning.storage.",
                metavar="PRODUCT",
            ),
        ] = None,
    ) -> None:
        """Tune a deployment locally and write report.json/md/html.

        Exit 0 with a feasible best, 3 when nothing meets the SLO, 4 when the trials themselves
        keep failing (server does not start, no checkpoint), 2 on bad input.

        Locally the default backend is the simulated GPU pool; `--backend triton` runs real
        trials (on a machine with GPUs and Triton), `--backend replay:table.csv` replays
        recorded measurements. Re-running with the same output directory resumes the study.
        """
        with settling(until_exit=_the_program(ctx)):
            _tune(
                read_spec, spec, backend=backend, out=out, seed=seed, max_trials=max_trials,
                sampler=sampler, confidence=confidence, server_command=server_command,
                progress=progress, retry_failed=retry_failed, pool=pool,
            )  # fmt: skip

    return tune


def _the_program(ctx: typer.Context) -> bool:
    """Whether the command runs as the process's program (`infertune tune ...`: the program's
    name is the command line's), not inside another one (a test's CliRunner): then a Ctrl-C
    that may no longer stop the run is ignored until the process exits."""
    return ctx.find_root().info_name == Path(sys.argv[0]).name


def _tune(
    read_spec: SpecReader,
    spec: Path,
    *,
    backend: str,
    out: Path | None,
    seed: int | None,
    max_trials: int | None,
    sampler: str | None,
    confidence: float | None,
    server_command: str | None,
    progress: bool,
    retry_failed: bool,
    pool: str | None = None,
) -> None:
    """`tune`, its exit status decided here: by the report's outcome (:func:`_summary`), or
    130 for a Ctrl-C before the search began."""
    exit_on_sigterm()
    try:
        from sqlalchemy.exc import SQLAlchemyError

        from infertune_tuner.cli.progress import TuneProgress
        from infertune_tuner.run import tune as run_tune
        from infertune_tuner.run import write_report
        from infertune_tuner.storage import mask_url

        request = read_spec(spec, backend.split(":")[0])
        if backend == defaults.LOCAL_BACKEND and request.tuning.backend != backend:
            typer.echo(
                f"Tuning on the simulated GPU pool (the manifest's {request.tuning.backend} "
                f"backend needs GPUs; --backend {request.tuning.backend} to run it).",
                err=True,  # context, with the progress: stdout is the result
            )
        overrides: dict[str, object] = {"backend": backend}
        if seed is not None:
            if not 0 <= seed <= SEED_MAX:
                raise InputError(f"--seed must be between 0 and {SEED_MAX}, not {seed}")
            overrides["seed"] = seed
        if max_trials is not None:
            if not 1 <= max_trials <= defaults.MAX_TRIALS_LIMIT:
                raise InputError(
                    f"--max-trials must be between 1 and {defaults.MAX_TRIALS_LIMIT} (the limit "
                    f"of spec.tuning.maxTrials), not {max_trials}"
                )
            overrides["max_trials"] = max_trials
        if sampler is not None:
            overrides["sampler"] = sampler
        if confidence is not None:
            low, high = defaults.CONFIDENCE_RANGE
            if not low <= confidence <= high:
                raise InputError(f"--confidence must be between {low} and {high}, not {confidence}")
            overrides["confidence"] = confidence
        request = request.model_copy(update={"tuning": request.tuning.model_copy(update=overrides)})
        out_dir = out or Path("infertune-out") / request.name
        shown = TuneProgress(out_dir, bar=progress)
        try:
            # Returns settled (interrupt.py): from the study's opening on, a Ctrl-C ends the
            # search with the report of the trials done.
            report = run_tune(
                request, backend=backend, out_dir=out_dir, server_command=server_command,
                on_start=shown.start, on_phase=shown.phase, on_trial=shown.trial,
                retry_failed=retry_failed, pool=pool,
            )  # fmt: skip
            shown.finish()
            if report is not None:
                paths = write_report(report, out_dir)
        except BaseException as exc:
            settle()
            shown.finish()
            if by_ctrl_c(exc):
                raise
            if isinstance(exc, OSError):  # a full disk, a folder gone read-only mid-run
                where = exc.filename or out_dir
                raise InputError(f"{where}: cannot write: {exc.strerror or exc}") from None
            if isinstance(exc, SQLAlchemyError) and request.tuning.storage:  # the RDB study storage
                url = mask_url(request.tuning.storage)
                reason = getattr(exc, "orig", None) or exc
                raise InputError(f"spec.tuning.storage {url}: cannot use it: {reason}") from None
            raise
    except BaseException as exc:
        if not by_ctrl_c(exc):
            raise
        settle()  # before the study opened: no trial ran, no report is written
        typer.echo(INTERRUPTED_EARLY)
        typer.echo(f"Next: {START_AGAIN}")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if report is None:  # a worker of a shared study: the last worker writes the report
        typer.echo("worker done; the last worker of the shared study writes the report")
        return
    _summary(report, paths)


def _summary(report: Report, paths: list[Path]) -> None:
    """The result on stdout, once: the headline, the next step, what ran and why it stopped,
    where the report is; then the exit status the outcome calls for."""
    from infertune_tuner.report.view import Outcome, build_view, confidence_gap

    view = build_view(report)
    typer.echo(view.headline.text)
    if view.headline.next_step:
        typer.echo(f"Next: {view.headline.next_step}")
    if view.pool:
        typer.echo(view.pool)
    resumed = (
        f", {report.resumed_trials} of them by an earlier run" if report.resumed_trials else ""
    )
    gap = confidence_gap(report, short=True)
    typer.echo(
        f"{report.executed_trials} trials executed{resumed}"
        f"{f' ({view.plan})' if view.plan else ''}; stopped: {report.stopped_reason}"
        f"{f' ({gap})' if gap else ''}"
    )
    if view.headroom_warn and view.headroom:
        typer.echo(view.headroom)
    for line in view.pools:
        typer.echo(f"  pool {line}")
    for line in view.failures:
        typer.echo(f"  could not run: {line}")
    for nm in report.nearest_misses:
        typer.echo(f"  nearest miss {nm.config.label()}: {'; '.join(nm.violations)}")
    typer.echo(f"report: {', '.join(str(p) for p in paths)}")
    code = {
        Outcome.FOUND: 0,
        Outcome.FOUND_SO_FAR: EXIT_INTERRUPTED,
        Outcome.INTERRUPTED: EXIT_INTERRUPTED,
        Outcome.ABORTED: EXIT_TRIALS_FAILED,
        Outcome.NOT_FOUND: EXIT_NO_FEASIBLE,
    }[view.headline.outcome]
    if code:
        raise typer.Exit(code)


def export_replay(
    source: Annotated[
        Path,
        typer.Argument(
            help="A report.json, an output folder of `infertune tune`, or its study.journal.",
            metavar="REPORT_OR_STUDY",
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="The table to write (default: replay.csv beside it)."),
    ] = None,
) -> None:
    """Write a study's measurements as a replay table, to re-tune offline.

    One row per measured configuration (repeats combined as the search combined them); a
    configuration whose every trial failed is an `error` row with its last failure's reason and
    phase, unless the failure was transient. Transient, invalid and interrupted trials are left
    out. Then `infertune tune SPEC --backend replay:TABLE` answers every configuration the study
    measured without a GPU, under the SLO, budget or sampler SPEC gives now (a configuration the
    study never measured is a failed trial: "not in table").
    """
    from infertune_tuner.replay_export import export

    folder = source if source.is_dir() else source.parent
    table = out or folder / "replay.csv"
    found, tables = export(source, table)
    typer.echo(f"exported {found.summary()}", err=True)
    for written in tables:  # several GPU pools: a table each
        typer.echo(str(written))


def predict(
    model: Annotated[str, typer.Option(help="Catalog key, Hugging Face id, or config.json path.")],
    gpu: Annotated[str, typer.Option(help="GPU catalog key (see `infertune gpus`).")],
    tp: Annotated[int, typer.Option(help="Tensor parallel size.")] = 1,
    batch: Annotated[int, typer.Option(help="Max batch size (= concurrency).")] = 1,
    quant: QuantOption = "bf16",
    kv_dtype: KvDtypeOption = "auto",
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 1024,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 256,
    stack: Annotated[
        str | None,
        typer.Option(help="Serving stack to predict for (default: the one infertune deploys)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict memory fit, latency and throughput of one configuration (no GPU needed)."""
    from infertune_tuner.catalog.gpus import get_gpu
    from infertune_tuner.catalog.llms import resolve_model
    from infertune_tuner.config import TrialConfig, Workload
    from infertune_tuner.metrics import LATENCY_METRICS
    from infertune_tuner.perfmodel import predict as run_predict
    from infertune_tuner.perfmodel.factors import DEFAULT_STACK, STACKS
    from infertune_tuner.servable import config_problems

    arch, g = resolve_model(model), get_gpu(gpu)
    stack = stack or DEFAULT_STACK
    problems = []
    if tp < 1 or batch < 1 or isl < 1 or osl < 1:
        problems.append("--tp, --batch, --isl and --osl must be positive")
    else:
        problems += config_problems(arch, g, TrialConfig(tp, batch, quant, kv_dtype))
    if stack not in STACKS:
        problems.append(f"unknown stack {stack!r}; known: {', '.join(STACKS)}")
    if problems:
        raise InputError("cannot predict", problems)
    cfg = TrialConfig(tp, batch, quant, kv_dtype)
    p = run_predict(arch, g, cfg, Workload(isl, osl), stack=stack)
    mem = p.memory
    result = {
        "model": arch.key, "gpu": g.key, "stack": stack, **cfg.as_dict(), "isl": isl,
        "osl": osl, "max_context": arch.max_context,
        "fits": mem.fits, "reason": mem.reason,
        "weights_gib_per_gpu": round(mem.weights_gib_per_gpu, 3),
        "activations_gib_per_gpu": round(mem.activations_gib_per_gpu, 3),
        "reserve_gib_per_gpu": round(mem.reserve_gib_per_gpu, 3),
        "usable_kv_gib_per_gpu": round(mem.usable_kv_gib_per_gpu, 3),
        "kv_cache_gib_per_gpu": round(mem.kv_cache_gib_per_gpu, 3),
        "kv_bytes_per_token_per_gpu": round(mem.kv_bytes_per_token_per_gpu, 1),
        "max_concurrent_sequences": mem.max_concurrent_sequences,
        **{m.key: round(m.of(p).p50, 3) for m in LATENCY_METRICS},
        **{f"{m.key}_percentiles": m.of(p).as_dict() for m in LATENCY_METRICS},
        "token_gap_ms_percentiles": p.token_gap_ms.as_dict(),
        "output_tokens_per_s": round(p.output_tokens_per_s, 3),
        "output_tokens_per_s_per_gpu": round(p.output_tokens_per_s_per_gpu, 3),
    }  # fmt: skip
    if as_json:
        typer.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{arch.key} on {g.key}: {cfg.label()}, {isl} in / {osl} out ({stack})",
        show_header=False,
    )
    t.add_column(style="bold")
    t.add_column(justify="right")
    rows = [
        ("fits", "yes" if mem.fits else f"NO: {mem.reason}"),
        ("weights / GPU", f"{mem.weights_gib_per_gpu:.2f} GiB"),
        ("activations / GPU", f"{mem.activations_gib_per_gpu:.2f} GiB"),
        ("runtime reserve / GPU", f"{mem.reserve_gib_per_gpu:.2f} GiB"),
        ("usable KV cache / GPU", f"{mem.usable_kv_gib_per_gpu:.2f} GiB"),
        ("KV needed for the batch / GPU", f"{mem.kv_cache_gib_per_gpu:.2f} GiB"),
        ("KV per token / GPU", f"{mem.kv_bytes_per_token_per_gpu / 1024:.1f} KiB"),
        ("max concurrent sequences", str(mem.max_concurrent_sequences)),
        *(
            (
                f"{m.label} p50 / p95 / p99",
                " / ".join(m.format(v) for v in m.of(p).as_dict().values()) + f" {m.unit}",
            )
            for m in LATENCY_METRICS
        ),
        (
            "token gaps p50 / p95 / p99",
            " / ".join(f"{v:.1f}" for v in p.token_gap_ms.as_dict().values()) + " ms",
        ),
        ("output tok/s", f"{p.output_tokens_per_s:.0f}"),
        ("output tok/s per GPU", f"{p.output_tokens_per_s_per_gpu:.0f}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)
