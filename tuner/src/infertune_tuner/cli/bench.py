"""`infertune bench`: drive a Triton server with the tuner's load generator and report what it
measured.

`bench` exits 0 when every request completed, 1 when some failed, stalled or the run stopped
early (the report is still printed; `errors`, `error_samples`, `stalled` and `settings.stopped`
say why), 2 when the server cannot be reached or the arguments are invalid. It warms up with one
full wave of requests unless told otherwise (`bench_warmup`).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Any

import typer

from infertune_tuner.config import MAX_BATCH_SIZE_LIMIT
from infertune_tuner.errors import InputError
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.request import SEED_MAX

EXIT_SOME_FAILED = 1
DEFAULT_DEADLINE_S = 3600.0


def _print_table(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = result.settings
    mode = (
        f"request rate {s.get('request_rate')}/s" if s.get("request_rate") else
        f"concurrency {s.get('concurrency')}"
    )  # fmt: skip
    table = Table(title=f"{s.get('model')} @ {s.get('url')} ({mode})")
    table.add_column("metric (ms)")
    for col in ("p50", "p95", "p99", "mean", "min", "max"):
        table.add_column(col, justify="right")
    rows = [(m.label, m.of(result)) for m in LATENCY_METRICS]
    rows.append(("token gaps", result.token_gap_ms))
    for label, summary in rows:
        if summary is None:
            table.add_row(label, *["-"] * 6)
        else:
            d = summary.as_dict()
            table.add_row(
                label, *(f"{d[c]:.2f}" for c in ("p50", "p95", "p99", "mean", "min", "max"))
            )
    console.print(table)
    stalled = f"  stalled {result.stalled}" if result.stalled else ""
    console.print(
        f"requests {result.requests}  errors {result.errors}{stalled}  output tokens "
        f"{result.output_tokens}  duration {result.duration_s:.2f} s  output "
        f"{result.output_tokens_per_s:.1f} tok/s"
    )
    for warning in _warnings(result):
        console.print(f"[yellow]warning:[/yellow] {warning}", markup=True, highlight=False)
    for sample in result.error_samples:
        console.print(f"[red]error:[/red] {sample}", markup=True, highlight=False)


def _warnings(result: Any) -> list[str]:
    out = [str(result.settings[k]) for k in ("warning", "stopped") if k in result.settings]
    note = result.short_output_note()
    if note is not None:
        out.append(note.replace("E2E is each", "e2e_at_requested_ms holds each"))
    out += [n for n in (result.stall_note(), result.token_note()) if n is not None]
    return out


def bench(
    url: Annotated[str, typer.Option("--url", help="Triton gRPC endpoint, HOST:PORT.")],
    model: Annotated[str, typer.Option("--model", help="Served model name.")],
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Requests in flight (closed loop; default 1). With --request-rate: a cap."
        ),
    ] = None,
    requests: Annotated[int, typer.Option(help="Measured requests.")] = 100,
    input_tokens: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 128,
    output_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 128,
    warmup: Annotated[
        int | None,
        typer.Option(
            help="Warm-up requests, not measured. Default: one full wave (--concurrency "
            "requests; with --request-rate, the --concurrency cap or one second of arrivals), "
            "so the cold first wave, which queues behind its own prefills, is not measured. "
            "0: none."
        ),
    ] = None,
    request_rate: Annotated[
        float | None, typer.Option(help="Poisson arrivals per second instead of a closed loop.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of prompts and arrivals.")] = 0,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600.0,
    deadline: Annotated[
        float, typer.Option(help="Deadline of the whole run (warm-up included), seconds.")
    ] = DEFAULT_DEADLINE_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Drive a Triton server with streaming requests; report TTFT, ITL, E2E and throughput."""
    from infertune_tuner.harness.loadgen import LoadSpec, run_load_sync

    _check_bench_numbers(request_rate=request_rate, timeout=timeout, deadline=deadline, seed=seed)
    for option, tokens in (("--input-tokens", input_tokens), ("--output-tokens", output_tokens)):
        if tokens > MAX_BENCH_TOKENS:
            raise InputError(f"{option} must be at most {MAX_BENCH_TOKENS}, not {tokens}")
    if concurrency is not None and concurrency > MAX_BATCH_SIZE_LIMIT:
        raise InputError(f"--concurrency must be at most {MAX_BATCH_SIZE_LIMIT}, not {concurrency}")
    spec = LoadSpec(
        url=url, model=model,
        concurrency=concurrency if concurrency is not None or request_rate else 1,
        requests=requests, input_tokens=input_tokens, output_tokens=output_tokens,
        warmup=warmup if warmup is not None else bench_warmup(concurrency, request_rate),
        request_rate=request_rate, seed=seed, request_timeout_s=timeout, deadline_s=deadline,
    )  # fmt: skip
    spec.validate()
    _check_served(url, model, connect_timeout_s=spec.connect_timeout_s)
    result = run_load_sync(spec)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _print_table(result)
    if result.errors or result.stalled or "stopped" in result.settings:
        raise typer.Exit(EXIT_SOME_FAILED)


def bench_warmup(concurrency: int | None, request_rate: float | None) -> int:
    """One full wave: the requests in flight at once (closed loop: the concurrency; request rate:
    the concurrency cap, or without one the arrivals of one second). As the tuner's trials warm
    up with one full batch (backends/triton.py `default_warmup`): the first wave arrives at once
    and queues behind its own prefills, which says nothing of the steady state."""
    if request_rate is None:
        return concurrency if concurrency is not None else 1
    if concurrency is not None:
        return concurrency
    return max(1, math.ceil(request_rate))


MAX_BENCH_TOKENS = 2**20  # longer than any model's context: a typo, and a prompt too big to build


def _check_bench_numbers(
    *, request_rate: float | None, timeout: float, deadline: float, seed: int
) -> None:
    """Numbers the load generator cannot use: nan / inf, non-positive times, a 33-bit seed."""
    for option, value in (("--request-rate", request_rate), ("--timeout", timeout),
                          ("--deadline", deadline)):  # fmt: skip
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError(f"{option} must be a positive number, not {value}")
    if not 0 <= seed <= SEED_MAX:
        raise InputError(f"--seed must be between 0 and {SEED_MAX}, not {seed}")


def _served_models(client: Any, timeout_s: float) -> list[str]:
    """The models a Triton server has ready (its repository index; [] when it will not say)."""
    from tritonclient.utils import InferenceServerException

    try:
        index = client.get_model_repository_index(as_json=True, client_timeout=timeout_s)
    except InferenceServerException:
        return []
    models = index.get("models") or []
    return sorted({str(m["name"]) for m in models if m.get("name") and
                   m.get("state", "READY") == "READY"})  # fmt: skip


def _check_served(url: str, model: str, *, connect_timeout_s: float) -> None:
    """The server answers and serves ``model``: checked before any request, so that a wrong
    --model is one error line, not a table of failed requests."""
    from tritonclient.grpc import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    try:
        client = InferenceServerClient(url)
    except Exception as exc:  # tritonclient raises bare exceptions for a malformed URL
        raise InputError(f"--url {url!r}: {exc}") from None
    try:
        try:
            client.is_server_live(client_timeout=connect_timeout_s)
        except InferenceServerException as exc:
            raise InputError(f"cannot reach Triton at {url}: {exc.message()}") from None
        try:
            client.get_model_metadata(model, client_timeout=connect_timeout_s)
        except InferenceServerException as exc:
            served = _served_models(client, connect_timeout_s)
            listing = f"; it serves {', '.join(served)}" if served else ""
            raise InputError(
                f"--model {model!r}: not served at {url}: {exc.message()}{listing}"
            ) from None
    finally:
        client.close()
