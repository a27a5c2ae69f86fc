"""Replay backend: recorded measurements from a CSV table (offline re-tuning, reproducible
reports, tests). Header (extra columns are ignored; one column per percentile of each latency
metric of ``metrics.LATENCY_METRICS``):

    tp,max_batch_size,quantization,kv_cache_dtype,status,ttft_p50_ms,ttft_p95_ms,ttft_p99_ms,
    itl_p50_ms,itl_p95_ms,itl_p99_ms,e2e_p50_ms,e2e_p95_ms,e2e_p99_ms,output_tokens_per_s_per_gpu

`status` is ok, oom or error. A configuration absent from the table is a failed trial
("not in table"). Every replayed row counts as an executed trial. An optional `concurrency`
column holds the most requests seen decoding at once (below max_batch_size when the KV cache
capped it); an optional `output_tokens_mean` column the mean output length of the responses (a
row well short of the requested length is judged invalid by the search: see
search/evidence.py, judge).

Why a failed row failed: an optional `reason` column (free text, the server's error line or log
tail; CSV-quoted where it holds commas, quotes or line breaks) and an optional `phase` column
(the trial phase it died in: downloading weights, starting server, loading model, warm-up or
measuring). An `oom` or `error` row with a reason replays as that failure, reason and phase,
which is what a failure's signature is made of; without one it replays as "recorded as error
in FILE". Both are empty on `ok` rows.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import math
from pathlib import Path
from typing import get_args

from infertune_tuner.config import KV_CACHE_DTYPE_VALUES, QUANTIZATION_VALUES, TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement, TrialPhase
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, PERCENTILES, LatencyMetric
from infertune_tuner.perfmodel.latency import Percentiles

METRIC_COLUMNS = (
    *(m.column(p) for m in LATENCY_METRICS for p in PERCENTILES),
    OBJECTIVE.key,
)
COLUMNS = ("tp", "max_batch_size", "quantization", "kv_cache_dtype", "status", *METRIC_COLUMNS)
OUTPUT_MEAN = "output_tokens_mean"  # optional, as "concurrency"
REASON, PHASE = "reason", "phase"  # optional: why a failed row failed, and in which phase
PHASES: tuple[str, ...] = get_args(TrialPhase)


def _cell_starts(raw: str) -> list[tuple[int, int]]:
    """Where each cell of one CSV record begins: (lines after the record's first, column),
    columns counting characters from 1 as editors do; quoted cells may hold commas and line
    breaks."""
    starts, line, col, quoted = [(0, 1)], 0, 1, False
    for i, ch in enumerate(raw):
        if ch == '"':
            quoted = not quoted  # an escaped quote ("") toggles twice
        elif ch == "," and not quoted:
            starts.append((line, col + 1))
        if ch == "\n" or (ch == "\r" and raw[i + 1 : i + 2] != "\n"):
            line, col = line + 1, 1
        elif ch != "\r":
            col += 1
    return starts


class _Cells:
    """One data row of the table, read cell by cell; a bad cell is an InputError naming
    ``file:line:column`` (the column counts characters, as editors do)."""

    def __init__(self, path: Path, line: int, raw: str, header: list[str], cells: list[str]):
        self.path, self.line = path, line
        self.values = dict(zip(header, cells, strict=False))
        self.offsets: dict[str, tuple[int, int]] = {}
        for name, start in zip(header, _cell_starts(raw), strict=False):
            self.offsets.setdefault(name, start)

    def where(self, column: str | None = None) -> str:
        lines, col = self.offsets.get(column, (0, 1)) if column else (0, 1)
        return f"{self.path}:{self.line + lines}:{col}"

    def fail(self, column: str, message: str) -> InputError:
        return InputError(f"{self.where(column)}: {column}: {message}")

    def text(self, column: str) -> str:
        return (self.values.get(column) or "").strip()

    def integer(self, column: str) -> int:
        value = self.text(column)
        try:
            number = int(value)
        except ValueError:
            raise self.fail(column, f"must be a whole number, not {value!r}") from None
        if number < 1:
            raise self.fail(column, f"must be at least 1, not {number}")
        return number

    def number(self, column: str) -> float:
        """A finite number >= 0 (no nan, no inf, no negative latency or throughput)."""
        value = self.text(column)
        try:
            number = float(value)
        except ValueError:
            raise self.fail(column, f"must be a number, not {value!r}") from None
        if not math.isfinite(number):
            raise self.fail(column, f"must be a finite number, not {value!r}")
        if number < 0:
            raise self.fail(column, f"must not be negative ({value})")
        return number

    def choice(self, column: str, known: tuple[str, ...]) -> str:
        value = self.text(column)
        if value not in known:
            raise self.fail(column, f"{value!r} is not one of {', '.join(known)}")
        return value

    def percentiles(self, metric: LatencyMetric) -> Percentiles:
        vals = [self.number(metric.column(p)) for p in PERCENTILES]
        for (lo, a), (hi, b) in itertools.pairwise(zip(PERCENTILES, vals, strict=True)):
            if a > b:
                raise self.fail(
                    metric.column(hi), f"{metric.prefix} {hi} ({b:g}) is below {lo} ({a:g})"
                )
        return Percentiles(*vals)


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(f"replay table {path}: is a directory, not a CSV file") from None
    except OSError as exc:
        raise InputError(f"replay table {path}: {exc.strerror or exc}") from None
    if data.startswith(codecs.BOM_UTF8):
        raise InputError(
            f"{path}:1:1: a byte-order mark (BOM) before the header; save the table as UTF-8 "
            "without BOM"
        )
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise InputError(f"{path}:{line}: binary content (a NUL byte); not a CSV table")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def load_table(path: Path) -> dict[TrialConfig, Measurement]:
    # Lines as the csv module splits them, ends kept: a quoted cell may span several.
    lines = io.StringIO(_text(path), newline="").readlines()
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise InputError(f"{path}:1: missing columns {', '.join(missing)}")
        table: dict[TrialConfig, Measurement] = {}
        first = reader.line_num + 1  # the line the next record starts on
        for cells in reader:
            line, first = first, reader.line_num + 1
            if not any(c.strip() for c in cells):
                continue  # a blank line
            raw = "".join(lines[line - 1 : reader.line_num])
            row = _Cells(path, line, raw, header, cells)
            cfg, m = _row(row)
            if cfg in table:
                raise InputError(f"{row.where()}: {cfg.label()} appears twice")
            table[cfg] = m
    except csv.Error as exc:
        raise InputError(f"{path}:{reader.line_num}: not a CSV table: {exc}") from None
    return table


def _row(row: _Cells) -> tuple[TrialConfig, Measurement]:
    cfg = TrialConfig(
        row.integer("tp"), row.integer("max_batch_size"),
        row.choice("quantization", QUANTIZATION_VALUES),
        row.choice("kv_cache_dtype", KV_CACHE_DTYPE_VALUES),
    )  # fmt: skip
    status = row.choice("status", ("ok", "oom", "error"))
    phase = row.choice(PHASE, PHASES) if row.text(PHASE) else None
    if status != "ok":
        reason = row.values.get(REASON) or ""  # as recorded: a log tail keeps its line breaks
        if not reason.strip():
            reason = f"recorded as {status} in {row.path.name}"
        return cfg, Measurement.failed(status, reason, phase)  # type: ignore[arg-type]
    concurrency = row.number("concurrency") if row.text("concurrency") else None
    mean = row.number(OUTPUT_MEAN) if row.text(OUTPUT_MEAN) else None
    return cfg, Measurement.ok(
        {x.key: row.percentiles(x) for x in LATENCY_METRICS},
        output_tokens_per_s_per_gpu=row.number(OBJECTIVE.key),
        concurrency=concurrency,
        output_tokens_mean=mean,
    )


class ReplayBackend:
    name = "replay"
    speedup = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = load_table(path)

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        """The recorded row (a table holds one run per configuration: every repeat is it)."""
        found = self.table.get(config)
        if found is None:
            return Measurement.failed("error", f"not in table {self.path.name}")
        return found

    def close(self) -> None:
        return None


def write_table(path: Path, rows: dict[TrialConfig, Measurement]) -> None:
    """Write measurements in the replay format (used to record simulated or real runs); a failed
    row keeps its reason and phase."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*COLUMNS, "concurrency", OUTPUT_MEAN, REASON, PHASE])
        for cfg, m in rows.items():
            base = [cfg.tp, cfg.max_batch_size, cfg.quantization, cfg.kv_cache_dtype, m.status]
            measured = [m.percentiles(x.key) for x in LATENCY_METRICS]
            if m.status == "ok" and all(measured):
                vals = [round(pct.get(p), 3) for pct in measured if pct for p in PERCENTILES]
                tps = round(m.output_tokens_per_s_per_gpu or 0.0, 3)
                optional = [m.concurrency, m.output_tokens_mean]
                w.writerow([*base, *vals, tps, *("" if v is None else v for v in optional), "", ""])
            else:
                why = [m.reason or "", m.phase or ""]
                w.writerow(base + [""] * (len(METRIC_COLUMNS) + 2) + why)
