"""Replay backend: recorded measurements from a CSV table (offline re-tuning, reproducible
reports, tests). Header (extra columns are ignored; one column per percentile of each latency
metric of ``metrics.LATENCY_METRICS``):

    tp,max_batch_size,quantization,kv_cache_dtype,status,ttft_p50_ms,ttft_p95_ms,ttft_p99_ms,
    itl_p50_ms,itl_p95_ms,itl_p99_ms,e2e_p50_ms,e2e_p95_ms,e2e_p99_ms,output_tokens_per_s_per_gpu

`status` is ok, oom or error. A configuration absent from the table is a failed trial
("not in table"). Every replayed row counts as an executed trial. An optional `concurrency`
column holds the most requests seen decoding at once (below max_batch_size when the KV cache
capped it).
"""

from __future__ import annotations

import csv
from pathlib import Path

from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, PERCENTILES, LatencyMetric
from infertune_tuner.perfmodel.latency import Percentiles

METRIC_COLUMNS = (
    *(m.column(p) for m in LATENCY_METRICS for p in PERCENTILES),
    OBJECTIVE.key,
)
COLUMNS = ("tp", "max_batch_size", "quantization", "kv_cache_dtype", "status", *METRIC_COLUMNS)


def _percentiles(row: dict[str, str], metric: LatencyMetric, where: str) -> Percentiles:
    vals = [float(row[metric.column(p)]) for p in PERCENTILES]
    if min(vals) < 0:
        raise InputError(f"{where}: negative {metric.prefix} latency")
    return Percentiles(*vals)


def load_table(path: Path) -> dict[TrialConfig, Measurement]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"replay table {path}: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(f"replay table {path}: missing columns {', '.join(missing)}")
    table: dict[TrialConfig, Measurement] = {}
    for line, row in enumerate(reader, start=2):
        where = f"{path}:{line}"
        try:
            cfg = TrialConfig(
                int(row["tp"]), int(row["max_batch_size"]),
                row["quantization"].strip(), row["kv_cache_dtype"].strip(),
            )  # fmt: skip
            status = row["status"].strip()
            if status == "ok":
                m = Measurement.ok(
                    {x.key: _percentiles(row, x, where) for x in LATENCY_METRICS},
                    output_tokens_per_s_per_gpu=float(row[OBJECTIVE.key]),
                    concurrency=float(row["concurrency"]) if row.get("concurrency") else None,
                )
            elif status in ("oom", "error"):
                m = Measurement.failed(status, f"recorded as {status} in {path.name}")  # type: ignore[arg-type]
            else:
                raise InputError(f"{where}: status must be ok, oom or error, not {status!r}")
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None
        if cfg in table:
            raise InputError(f"{where}: {cfg.label()} appears twice")
        table[cfg] = m
    return table


class ReplayBackend:
    name = "replay"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = load_table(path)

    def run(self, config: TrialConfig) -> Measurement:
        found = self.table.get(config)
        if found is None:
            return Measurement.failed("error", f"not in table {self.path.name}")
        return found

    def close(self) -> None:
        return None


def write_table(path: Path, rows: dict[TrialConfig, Measurement]) -> None:
    """Write measurements in the replay format (used to record simulated or real runs)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*COLUMNS, "concurrency"])
        for cfg, m in rows.items():
            base = [cfg.tp, cfg.max_batch_size, cfg.quantization, cfg.kv_cache_dtype, m.status]
            measured = [m.percentiles(x.key) for x in LATENCY_METRICS]
            if m.status == "ok" and all(measured):
                vals = [round(pct.get(p), 3) for pct in measured if pct for p in PERCENTILES]
                tps = round(m.output_tokens_per_s_per_gpu or 0.0, 3)
                w.writerow([*base, *vals, tps, "" if m.concurrency is None else m.concurrency])
            else:
                w.writerow(base + [""] * (len(METRIC_COLUMNS) + 1))
