"""`infertune gpus | models`: the catalogs, as tables that never cut a value, or as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Annotated, Any

import typer


def _public_fields(obj: object) -> dict[str, Any]:
    """A catalog dataclass as JSON-ready data (sets sorted, tuples as lists)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        v = getattr(obj, f.name)
        out[f.name] = (
            sorted(v) if isinstance(v, frozenset) else list(v) if isinstance(v, tuple) else v
        )
    return out


def column_widths(columns: list[str], rows: list[list[str]], available: int) -> list[int]:
    """Each column's width: the whole of every line of its cells where `available` (the sum of
    the widths, without borders and padding) allows;
    short of that, the columns of lists ("a, b, c") give way, widest first, down to their
    longest item. No column gets narrower than its longest item: nothing is ever cut, and one
    value ("pcie 25 GB/s") is never split across lines."""
    cells = [[col, *(row[i] for row in rows)] for i, col in enumerate(columns)]
    natural = [max(len(line) for c in col for line in c.splitlines() or [""]) for col in cells]
    floor = [max((len(w) for c in col for w in c.split(", ")), default=0) for col in cells]
    widths = list(natural)
    while sum(widths) > available:
        shrinkable = [i for i, w in enumerate(widths) if w > floor[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _listing(
    as_json: bool, data: list[dict[str, Any]], title: str, columns: list[str], rows: list[list[str]]
) -> None:
    """Print a catalog as JSON or as a table whose first column is the key a user copies.

    No value is ever cut (column_widths): lists wrap between their items, and a terminal too
    narrow even for that gets the table at the width it needs; the terminal wraps the lines. A
    pipe gets one line per row (what grep and awk read) unless COLUMNS gives it a width.
    """
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    def table_of(widths: list[int]) -> Table:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for col, width in zip(columns, widths, strict=True):
            table.add_column(col, width=width, overflow="fold")
        for row in rows:
            table.add_row(*row)
        return table

    console = Console()
    wide = console.options.update_width(10_000)
    chrome = Measurement.get(console, wide, table_of([1] * len(columns))).maximum - len(columns)
    piped = not console.is_terminal and "COLUMNS" not in os.environ
    available = 10_000 if piped else console.width - chrome
    table = table_of(column_widths(columns, rows, available))
    needed = Measurement.get(console, wide, table).maximum
    if needed > console.width:
        console = Console(width=needed)
    console.print(table)


def gpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the GPU catalog."""
    from infertune_tuner.catalog.gpus import GPUS

    def tf(v: float | None) -> str:
        return f"{v:.0f}" if v else "-"

    _listing(
        as_json,
        [_public_fields(g) for g in GPUS.values()],
        "GPU catalog (dense tensor TFLOPS)",
        ["key", "arch", "GiB", "GB/s", "bf16", "fp8", "fp4", "link", "quantizations", "node label"],
        [
            [g.key, g.architecture, f"{g.memory_gib:.0f}", f"{g.hbm_bandwidth_gbs:.0f}",
             tf(g.bf16_tflops), tf(g.fp8_tflops), tf(g.fp4_tflops),
             f"{g.link} {g.link_bandwidth_gbs:.0f} GB/s", ", ".join(sorted(g.quantizations)),
             ", ".join(g.product_labels)]
            for g in GPUS.values()
        ],
    )  # fmt: skip


def models(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the model catalog (Hugging Face ids map to these keys)."""
    from infertune_tuner.catalog.llms import MODELS

    _listing(
        as_json,
        [
            {**_public_fields(m), "params_b": round(m.params / 1e9, 2),
             "active_params_b": round(m.active_params / 1e9, 2)}
            for m in MODELS.values()
        ],
        "Model catalog",
        ["key", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "MoE", "Hugging Face ids"],
        [
            [m.key, f"{m.params / 1e9:.1f}B", str(m.layers), str(m.hidden_size),
             f"{m.heads}/{m.kv_heads}", str(m.ffn_size), str(m.vocab_size),
             f"{m.experts}x, {m.experts_active} active" if m.experts > 1 else "-",
             "\n".join(m.hf_ids)]
            for m in MODELS.values()
        ],
    )  # fmt: skip
